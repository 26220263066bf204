//! The ways a client can commit a record ([`Mode`]): on an embedded log, or through the daemon
//! at one of its durability levels; each has a name the command lines take.

use stela_proto::Durability;

/// How a client commits one record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, clap::ValueEnum)]
pub enum Mode {
    /// Embedded log; append + commit under one lock, so every commit pays its own fdatasync.
    EmbeddedSync,
    /// Embedded log shared by all clients; concurrent commits share an fdatasync (group commit).
    EmbeddedGroup,
    /// Embedded log that never syncs: a commit hands the record to the OS.
    EmbeddedUnsafe,
    /// Through the daemon, acknowledged once fdatasync'ed (the daemon's group commit).
    ServiceDisk,
    /// Through the daemon, acknowledged once in its protected buffers.
    ServiceBuffered,
    /// Through the daemon, acknowledged on receipt (what the protection costs is measured
    /// against this).
    ServiceUnsafe,
    /// Through a daemon with a standby, acknowledged once the standby holds the record (not in
    /// the default set: it needs a daemon started with `--standby`).
    ServiceReplicated,
    /// Through a daemon with a standby: on its disk and in the standby's memory.
    ServiceAll,
}

impl Mode {
    pub const ALL: [Mode; 6] = [
        Mode::EmbeddedSync,
        Mode::EmbeddedGroup,
        Mode::EmbeddedUnsafe,
        Mode::ServiceDisk,
        Mode::ServiceBuffered,
        Mode::ServiceUnsafe,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mode::EmbeddedSync => "embedded-sync",
            Mode::EmbeddedGroup => "embedded-group",
            Mode::EmbeddedUnsafe => "embedded-unsafe",
            Mode::ServiceDisk => "service-disk",
            Mode::ServiceBuffered => "service-buffered",
            Mode::ServiceUnsafe => "service-unsafe",
            Mode::ServiceReplicated => "service-replicated",
            Mode::ServiceAll => "service-all",
        }
    }

    pub fn from_name(name: &str) -> Option<Mode> {
        Mode::ALL
            .into_iter()
            .chain([Mode::ServiceReplicated, Mode::ServiceAll])
            .find(|m| m.name() == name)
    }

    /// The daemon's durability level, for the service modes.
    pub fn durability(self) -> Option<Durability> {
        match self {
            Mode::ServiceDisk => Some(Durability::Disk),
            Mode::ServiceBuffered => Some(Durability::Buffered),
            Mode::ServiceUnsafe => Some(Durability::Unsafe),
            Mode::ServiceReplicated => Some(Durability::Replicated),
            Mode::ServiceAll => Some(Durability::All),
            _ => None,
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_round_trip_their_names() {
        for mode in Mode::ALL {
            assert_eq!(Mode::from_name(mode.name()), Some(mode));
            let value = clap::ValueEnum::to_possible_value(&mode).unwrap();
            assert_eq!(value.get_name(), mode.name());
        }
    }
}
