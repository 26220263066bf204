//! What `stela run` tells the preload library, through the environment of the program it
//! starts (inherited by every process the program forks or executes).
//!
//! Owns the variables' names and encoding. Invariant: [`Settings::from_env`] of what
//! [`Settings::to_env`] wrote gives the same settings; a process without them (not started
//! by `stela run`, or whose environment was cleared) gets `None`, and the library then does
//! nothing at all.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;
use stela_client::Durability;

pub const ENV_SOCKET: &str = "STELA_RUN_SOCKET";
pub const ENV_LOG: &str = "STELA_RUN_LOG";
pub const ENV_LEVEL: &str = "STELA_RUN_LEVEL";
/// The durable directories, absolute and canonical, separated by NEWLINE.
pub const ENV_DIRS: &str = "STELA_RUN_DIRS";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// The daemon's Unix socket (the shared-memory ring needs one).
    pub socket: PathBuf,
    /// The log in the daemon.
    pub log: String,
    /// What an fsync of a durable file waits for.
    pub level: Durability,
    /// Canonical absolute paths; a file is durable if its canonical path lies under one.
    pub dirs: Vec<PathBuf>,
}

impl Settings {
    pub fn to_env(&self) -> Vec<(&'static str, OsString)> {
        let mut dirs = Vec::new();
        for (i, dir) in self.dirs.iter().enumerate() {
            if i > 0 {
                dirs.push(b'\n');
            }
            dirs.extend_from_slice(dir.as_os_str().as_bytes());
        }
        vec![
            (ENV_SOCKET, self.socket.clone().into_os_string()),
            (ENV_LOG, self.log.clone().into()),
            (ENV_LEVEL, self.level.name().into()),
            (ENV_DIRS, OsString::from_vec(dirs)),
        ]
    }

    /// Reads the settings from `get` (the environment); `None` if any is missing or unreadable.
    pub fn from_env(get: impl Fn(&str) -> Option<OsString>) -> Option<Settings> {
        let socket = PathBuf::from(get(ENV_SOCKET)?);
        let log = get(ENV_LOG)?.into_string().ok()?;
        let level = Durability::from_name(get(ENV_LEVEL)?.to_str()?)?;
        let dirs: Vec<PathBuf> = get(ENV_DIRS)?
            .as_bytes()
            .split(|&b| b == b'\n')
            .filter(|d| d.starts_with(b"/"))
            .map(|d| PathBuf::from(OsString::from_vec(d.to_vec())))
            .collect();
        if dirs.is_empty() {
            return None;
        }
        Some(Settings {
            socket,
            log,
            level,
            dirs,
        })
    }

    /// Whether the canonical absolute `path` is one of the durable directories or lies below.
    pub fn covers(&self, path: &[u8]) -> bool {
        self.dirs.iter().any(|dir| {
            let dir = dir.as_os_str().as_bytes();
            path.starts_with(dir)
                && (path.len() == dir.len() || path[dir.len()] == b'/' || dir == b"/")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_round_trip_and_cover_only_their_directories() {
        let settings = Settings {
            socket: "/run/stela/stela.sock".into(),
            log: "run-pgwal".into(),
            level: Durability::Disk,
            dirs: vec!["/srv/pg/pg_wal".into(), "/tmp/x".into()],
        };
        let env: std::collections::HashMap<_, _> = settings.to_env().into_iter().collect();
        let back = Settings::from_env(|name| env.get(name).cloned()).unwrap();
        assert_eq!(back, settings);
        assert!(back.covers(b"/srv/pg/pg_wal/000000010000000000000001"));
        assert!(back.covers(b"/srv/pg/pg_wal"));
        assert!(!back.covers(b"/srv/pg/pg_wal2/x"));
        assert!(!back.covers(b"/srv/pg/base/1"));
        assert!(Settings::from_env(|_| None).is_none());
    }
}
