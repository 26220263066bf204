//! The `stela` command's exit codes, one per thing a script can act on, and how an error is
//! printed: once, with the path or address it concerns, each cause said once.
//!
//! The codes are part of the command line's contract (listed in `stela --help` and the README);
//! they never change meaning.

use std::process::ExitCode;

/// Success; for `wal verify` the log is clean, for `status` the daemon is healthy.
pub const OK: u8 = 0;
/// The log is damaged (`wal verify`, `wal dump`), or a backup is (`backup`, `restore`).
pub const DAMAGED: u8 = 1;
/// Bad arguments, or a failure with no code of its own below.
pub const USAGE_OR_FAILURE: u8 = 2;
/// `status`: the daemon answers but does not take writes (power failing, a log stopped or
/// waiting for disk space).
pub const UNHEALTHY: u8 = 3;
/// The path holds no log (missing, a file, or a directory without segment files); for
/// `restore`, no backup (no MANIFEST).
pub const NOT_A_LOG: u8 = 4;
/// The log is open in another process (a running daemon, or an application's `Wal`), or, for
/// `logs delete`, by a client of the daemon; for `serve`, another daemon already serves on the
/// directory's socket.
pub const LOCKED: u8 = 5;
/// No daemon answers at the address.
pub const DAEMON_UNREACHABLE: u8 = 6;
/// `wal verify`: no damage, but the log ends in a torn write that holds records whose
/// checksums are good (never synced, so never acknowledged at `disk`): opening or repairing
/// the log would remove them. The output says how many; `wal repair` keeps a copy.
pub const WOULD_CUT_RECORDS: u8 = 7;

/// The text `stela --help` shows under the commands.
pub const HELP: &str = "Exit codes: 0 ok (verify: clean; status: healthy), 1 the log (or a backup) is damaged, \
2 bad arguments or another failure, 3 status: the daemon is unhealthy, 4 not a log (restore: not a backup), \
5 the log is locked by another process, 6 no daemon answers at the address, 7 verify: not \
damaged, but opening the log would cut records whose checksums are good (it says how many).";

/// The exit code for a failed command.
pub fn code_of(error: &anyhow::Error) -> ExitCode {
    ExitCode::from(code_number(error))
}

/// The exit code for a failed command, as a number.
pub fn code_number(error: &anyhow::Error) -> u8 {
    for cause in error.chain() {
        if let Some(stela_server::StartError::SocketInUse(_)) = cause.downcast_ref() {
            return LOCKED;
        }
        if let Some(wal) = cause.downcast_ref::<stela_wal::Error>() {
            match wal {
                stela_wal::Error::NotALog { .. } | stela_wal::Error::NotFound { .. } => {
                    return NOT_A_LOG
                }
                stela_wal::Error::Locked { .. } => return LOCKED,
                stela_wal::Error::Corruption(_) | stela_wal::Error::BadHeader { .. } => {
                    return DAMAGED
                }
                _ => {}
            }
        }
        if let Some(backup) = cause.downcast_ref::<crate::backup::BackupError>() {
            if backup.is_damage() {
                return DAMAGED;
            }
            if let crate::backup::BackupError::NoManifest(_) = backup {
                return NOT_A_LOG;
            }
        }
        match cause.downcast_ref::<stela_client::Error>() {
            Some(stela_client::Error::Connect { .. }) => return DAEMON_UNREACHABLE,
            Some(stela_client::Error::Server {
                code: stela_client::ErrorCode::LogInUse,
                ..
            }) => return LOCKED,
            _ => {}
        }
    }
    USAGE_OR_FAILURE
}

/// The error and its causes on one line, each cause once: the crates' errors already include
/// their source in their own message (`open /x: No such file or directory (os error 2)`), so a
/// cause whose text is already there is not repeated.
pub fn render(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let said = cause.to_string();
        if text.contains(&said) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&said);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        let io = std::io::Error::from_raw_os_error(2);
        let wal = stela_wal::Error::NotALog {
            path: "/nowhere".into(),
            reason: "no such file or directory",
        };
        let error = anyhow::Error::new(wal).context("verifying /nowhere");
        assert_eq!(
            render(&error),
            "verifying /nowhere: /nowhere: not a log: no such file or directory"
        );
        assert_eq!(code_of(&error), ExitCode::from(NOT_A_LOG));
        // thiserror's `{source}` in the message plus the chain would say the OS error twice.
        #[derive(Debug, thiserror::Error)]
        #[error("open /x: {source}")]
        struct Open {
            #[source]
            source: std::io::Error,
        }
        let error = anyhow::Error::new(Open { source: io });
        let text = render(&error);
        assert_eq!(text.matches("os error 2").count(), 1, "{text}");
        assert_eq!(code_of(&error), ExitCode::from(USAGE_OR_FAILURE));
    }
}
