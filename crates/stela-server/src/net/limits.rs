//! How many connections the daemon can hold, from its settings and the file limit.
//!
//! At start the soft file limit is raised to the hard one (systemd's default soft limit of
//! 1,024 would otherwise cap the daemon at a few hundred clients). Each connection may use two
//! descriptors (its socket and, with a shared-memory ring, the ring's doorbell), and a reserve
//! is kept for everything else (log files, the listeners, the event loop, a spare descriptor
//! for refusing connections when the table is full). The limits never promise a connection a
//! descriptor the process cannot open: past them a connection is refused with an answer that
//! says why, not dropped. A SIGHUP reload computes them again from the new maxima and the
//! file limit found at start.

/// Descriptors kept for everything that is not a connection.
pub const RESERVED_FDS: u64 = 128;
/// Descriptors a connection may use.
pub const FDS_PER_CONNECTION: u64 = 2;
/// Connections accepted but not yet through their Hello: an eighth of the connections the file
/// limit allows, within these bounds. When more arrive, the oldest that has sent nothing is
/// closed (with a `Timeout` answer), so idle connection attempts cannot crowd out the ones that
/// speak, an administrator's `stela status` among them. Many slots make a flood turn them over
/// slowly: a real client has sent its first bytes long before its slot would be its turn.
pub const MIN_HANDSHAKE_SLOTS: usize = 64;
pub const MAX_HANDSHAKE_SLOTS: usize = 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The file limit in force after raising it.
    pub file_limit: u64,
    /// Clients served at once.
    pub clients: usize,
    /// Administrators served beyond `clients`.
    pub admins: usize,
    pub handshakes: usize,
}

/// Raises the soft file limit to the hard one; returns the limit in force.
pub fn raise_file_limit() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let limit = getrlimit(Resource::Nofile);
    let (current, maximum) = (limit.current, limit.maximum);
    if let (Some(soft), Some(hard)) = (current, maximum) {
        if soft < hard {
            let raised = rustix::process::Rlimit {
                current: Some(hard),
                maximum: Some(hard),
            };
            match setrlimit(Resource::Nofile, raised) {
                Ok(()) => {
                    tracing::info!(from = soft, to = hard, "raised the file limit");
                    return hard;
                }
                Err(error) => {
                    tracing::warn!(%error, soft, hard, "could not raise the file limit");
                }
            }
        }
        return soft;
    }
    // Unlimited (None) soft limit: plenty.
    current.unwrap_or(u64::MAX)
}

/// The limits for a file limit and the configured maxima.
pub fn limits(file_limit: u64, max_connections: usize, admin_connections: usize) -> Limits {
    let admins = admin_connections.max(1);
    let for_connections = file_limit.saturating_sub(RESERVED_FDS) / FDS_PER_CONNECTION;
    let handshakes = usize::try_from(for_connections / 8)
        .unwrap_or(usize::MAX)
        .clamp(MIN_HANDSHAKE_SLOTS, MAX_HANDSHAKE_SLOTS);
    let clients = (for_connections.saturating_sub((admins + handshakes) as u64) as usize)
        .min(max_connections)
        .max(1);
    Limits {
        file_limit,
        clients,
        admins,
        handshakes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_file_limit_lowers_the_connection_limit_with_room_for_the_rest() {
        let l = limits(1024, 10_000, 8);
        assert_eq!(l.clients, (1024 - 128) / 2 - 8 - 64);
        let worst_fds = (l.clients + l.admins + l.handshakes) as u64 * FDS_PER_CONNECTION;
        assert!(worst_fds + RESERVED_FDS <= 1024);
        assert_eq!(limits(1 << 20, 10_000, 8).clients, 10_000);
        assert_eq!(limits(10, 10_000, 8).clients, 1, "never zero");
        assert_eq!(limits(1 << 20, 10_000, 8).handshakes, MAX_HANDSHAKE_SLOTS);
        assert_eq!(limits(8192, 10_000, 8).handshakes, (8192 - 128) / 2 / 8);
    }
}
