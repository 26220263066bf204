//! Why a replication stream ends, on either side: one enum for every reason, so that the
//! shipper's retry log, the standby's `stela status` (`stopped`) and a metric labelled by
//! [`SessionEnd::kind`] can tell a network fault from a fence or a full disk.
//!
//! Invariants:
//! - Each variant keeps the whole message the stream ended with (what the log, the peer's
//!   `Refuse` and `stela status` have always shown); the variant only adds what kind of end it
//!   was, so a change of kind never changes a message.

/// Why a replication session (one stream of one log) ended, or could not begin.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionEnd {
    /// The connection failed: connecting, a read or a write, a deadline that cut it, a peer
    /// that closed it.
    #[error("{0}")]
    Link(String),
    /// TLS could not be set up on the connection.
    #[error("{0}")]
    Tls(String),
    /// The peer sent what the protocol does not allow here: a frame that cannot be read, a
    /// message out of turn, a chunk that does not continue the copy.
    #[error("{0}")]
    Protocol(String),
    /// The peer refused the stream, at its term (`Refuse`).
    #[error("{message}")]
    Refused { term: u64, message: String },
    /// This side refused what the peer asked: a name or codec it does not know, a log another
    /// stream already mirrors, a peer that did not prove itself, a limit.
    #[error("{0}")]
    Rejected(String),
    /// Terms or epochs end the stream: a stale term, an epoch that is over, a copy that
    /// diverged in a way only an operator may settle.
    #[error("{0}")]
    Fenced(String),
    /// This node's copy or its terms could not be read or written.
    #[error("{0}")]
    Storage(String),
    /// This node stopped the stream (a shutdown, a promotion, the stream taken over).
    #[error("{0}")]
    Stopped(String),
}

impl SessionEnd {
    /// A short name of the kind of end, for a metric's label or a status field.
    pub fn kind(&self) -> &'static str {
        match self {
            SessionEnd::Link(_) => "link",
            SessionEnd::Tls(_) => "tls",
            SessionEnd::Protocol(_) => "protocol",
            SessionEnd::Refused { .. } => "refused",
            SessionEnd::Rejected(_) => "rejected",
            SessionEnd::Fenced(_) => "fenced",
            SessionEnd::Storage(_) => "storage",
            SessionEnd::Stopped(_) => "stopped",
        }
    }

    /// A failure of this node's files (its copy, its terms).
    pub(crate) fn storage(error: impl std::fmt::Display) -> SessionEnd {
        SessionEnd::Storage(error.to_string())
    }

    /// A failure of the connection.
    pub(crate) fn link(error: impl std::fmt::Display) -> SessionEnd {
        SessionEnd::Link(error.to_string())
    }

    /// A frame or message the protocol does not allow.
    pub(crate) fn protocol(error: impl std::fmt::Display) -> SessionEnd {
        SessionEnd::Protocol(error.to_string())
    }
}

impl From<std::io::Error> for SessionEnd {
    fn from(error: std::io::Error) -> SessionEnd {
        SessionEnd::link(error)
    }
}

impl From<stela_wal::Error> for SessionEnd {
    fn from(error: stela_wal::Error) -> SessionEnd {
        SessionEnd::storage(error)
    }
}

impl From<stela_wal::mirror::MirrorError> for SessionEnd {
    /// A chunk that does not continue the copy is the peer's fault; a failed write is this
    /// node's.
    fn from(error: stela_wal::mirror::MirrorError) -> SessionEnd {
        match error {
            stela_wal::mirror::MirrorError::Refused(_) => SessionEnd::protocol(error),
            stela_wal::mirror::MirrorError::Wal(_) => SessionEnd::storage(error),
        }
    }
}

impl From<stela_proto::frame::FrameError> for SessionEnd {
    fn from(error: stela_proto::frame::FrameError) -> SessionEnd {
        SessionEnd::protocol(error)
    }
}

#[cfg(test)]
mod tests {
    use super::SessionEnd;

    #[test]
    fn the_kind_adds_to_the_message_and_changes_nothing_of_it() {
        let ends = [
            SessionEnd::Link("connect 10.0.0.1:7: refused".into()),
            SessionEnd::Refused {
                term: 9,
                message: "stale term 3".into(),
            },
            SessionEnd::Fenced("epoch 2 is over".into()),
        ];
        let shown: Vec<(String, &str)> = ends.iter().map(|e| (e.to_string(), e.kind())).collect();
        assert_eq!(
            shown,
            [
                ("connect 10.0.0.1:7: refused".to_owned(), "link"),
                ("stale term 3".to_owned(), "refused"),
                ("epoch 2 is over".to_owned(), "fenced"),
            ]
        );
    }
}
