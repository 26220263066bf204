//! Per-credential quotas (issue 54, finding 6: a TCP client could create logs until the disk
//! was full): how many logs a credential may create, and how many bytes of records its logs may
//! hold.
//!
//! A *credential* is what a client proved at its Hello ([`Credential`]): a Unix peer's uid, a
//! token (named by a fingerprint, never by the token), a client certificate (its fingerprint),
//! or `anonymous` on an insecure loopback listener. Administrators (the daemon's own user or
//! root on the Unix socket, an admin token or certificate) have none: what they create is
//! charged to no one and never refused.
//!
//! A log belongs to the credential that created it: the creation writes the credential's name
//! to the log directory's `OWNER` file (0600, synced with the directory), and the daemon reads
//! those files at start. Bytes are charged to the log's owner whoever appends: a log's usage is
//! the bytes its records take in its segments — the sealed segments' files whole, the newest up
//! to its write position when the log was opened — plus each record appended since (payload and
//! frame header). A log not opened since the daemon started is counted at its files' size (its
//! newest segment whole, as preallocated) until it is opened. Truncation and deletion give the
//! bytes of the removed segments back.
//!
//! Invariants:
//! - A credential's byte count is the sum of its logs' counts ([`Ledger::check`] in tests).
//! - An append is charged before it is placed and refunded if it is not placed, so two appends
//!   racing for the last bytes of a quota cannot both pass: a credential's bytes never exceed
//!   its limit by an append's own refusal.
//! - A refused creation makes nothing: the count is checked under the daemon's opening lock,
//!   before the directory is made.

use crate::error::{Error, Result};
use crate::pool::LogId;
use crate::sync::lock;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use stela_wal::storage::{OpenMode, Storage};

/// The file in a log directory that names the credential that created the log.
pub const OWNER_FILE: &str = "OWNER";

/// Longest credential name kept (a certificate or token fingerprint is far shorter).
const MAX_CREDENTIAL_BYTES: usize = 64;

/// Who a non-administrative client proved to be, as quotas count it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Credential(String);

impl Credential {
    /// A Unix-socket peer running as `uid`.
    pub fn uid(uid: u32) -> Credential {
        Credential(format!("uid:{uid}"))
    }

    /// A TCP peer that sent `token`: named by the first 8 bytes of its SHA-256, so that logs
    /// and `OWNER` files never hold the token itself.
    pub fn token(token: &str) -> Credential {
        Credential(format!("token:{}", fingerprint(token.as_bytes())))
    }

    /// A TCP peer that proved itself by the client certificate `der` (its fingerprint).
    pub fn certificate(der: &[u8]) -> Credential {
        Credential(format!("cert:{}", fingerprint(der)))
    }

    /// A peer of an insecure loopback listener without authentication.
    pub fn anonymous() -> Credential {
        Credential("anonymous".to_owned())
    }

    pub fn name(&self) -> &str {
        &self.0
    }

    /// A name read back from an `OWNER` file; `None` if it is not one this module writes.
    fn parse(text: &str) -> Option<Credential> {
        let name = text.trim_end_matches('\n');
        let plausible = !name.is_empty()
            && name.len() <= MAX_CREDENTIAL_BYTES
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b':' || b == b'-');
        plausible.then(|| Credential(name.to_owned()))
    }
}

impl std::fmt::Display for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn fingerprint(bytes: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    digest.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Kept with the other settings (config.rs), so that the configuration does not import this
/// module, which imports the error type, which imports the configuration's.
pub use crate::config::QuotaLimits as Limits;

/// One credential's totals.
#[derive(Debug)]
struct Account {
    credential: Credential,
    logs: AtomicU64,
    bytes: AtomicU64,
}

/// One owned log's share of its owner's bytes.
#[derive(Debug)]
struct Usage {
    account: Arc<Account>,
    bytes: AtomicU64,
}

impl Usage {
    fn add(&self, bytes: u64) {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.account.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    fn sub(&self, bytes: u64) {
        let bytes = bytes.min(self.bytes.load(Ordering::Relaxed));
        self.bytes.fetch_sub(bytes, Ordering::Relaxed);
        self.account.bytes.fetch_sub(bytes, Ordering::Relaxed);
    }
}

#[derive(Debug, Default)]
struct Ledger {
    accounts: HashMap<Credential, Arc<Account>>,
    by_name: HashMap<String, Arc<Usage>>,
}

impl Ledger {
    fn account(&mut self, credential: &Credential) -> Arc<Account> {
        Arc::clone(self.accounts.entry(credential.clone()).or_insert_with(|| {
            Arc::new(Account {
                credential: credential.clone(),
                logs: AtomicU64::new(0),
                bytes: AtomicU64::new(0),
            })
        }))
    }

    fn add_log(&mut self, name: &str, owner: &Credential, bytes: u64) -> Arc<Usage> {
        let account = self.account(owner);
        account.logs.fetch_add(1, Ordering::Relaxed);
        let usage = Arc::new(Usage {
            account,
            bytes: AtomicU64::new(0),
        });
        usage.add(bytes);
        self.by_name.insert(name.to_owned(), Arc::clone(&usage));
        usage
    }

    /// Every account's totals equal the sum over its logs (the module's first invariant).
    /// Checked by the tests only: an append charges the account and then its log, so a check
    /// racing it would see them apart for a moment.
    #[cfg(test)]
    fn check(&self) {
        for account in self.accounts.values() {
            let logs = self
                .by_name
                .values()
                .filter(|u| Arc::ptr_eq(&u.account, account));
            let (count, bytes) = logs.fold((0, 0), |(n, b), u| {
                (n + 1, b + u.bytes.load(Ordering::Relaxed))
            });
            debug_assert_eq!(account.logs.load(Ordering::Relaxed), count);
            debug_assert_eq!(account.bytes.load(Ordering::Relaxed), bytes);
        }
    }
}

/// The daemon's quotas: who owns which log, and what each credential holds.
#[derive(Debug)]
pub struct Quotas {
    limits: Limits,
    ledger: Mutex<Ledger>,
    /// The open logs that have an owner, for the charge of each append (a read lock and two
    /// atomics; nothing when no limit is configured).
    open: RwLock<HashMap<LogId, Arc<Usage>>>,
}

impl Quotas {
    /// Reads the `OWNER` file and the files' sizes of every log directory under `logs_dir`.
    pub fn load(limits: Limits, storage: &dyn Storage, logs_dir: &Path) -> Quotas {
        let quotas = Quotas {
            limits,
            ledger: Mutex::new(Ledger::default()),
            open: RwLock::new(HashMap::new()),
        };
        let mut ledger = lock(&quotas.ledger);
        for name in storage.list(logs_dir).unwrap_or_default() {
            let dir = logs_dir.join(&name);
            if let Some(owner) = read_owner(storage, &dir) {
                ledger.add_log(&name, &owner, files_bytes(storage, &dir));
            }
        }
        drop(ledger);
        quotas
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Whether `owner` may create one more log. Called under the opening lock, before anything
    /// is made.
    pub fn may_create(&self, owner: &Credential) -> Result<()> {
        let Some(limit) = self.limits.logs else {
            return Ok(());
        };
        let held = lock(&self.ledger)
            .accounts
            .get(owner)
            .map_or(0, |a| a.logs.load(Ordering::Relaxed));
        if held >= limit {
            return Err(Error::QuotaExceeded {
                credential: owner.to_string(),
                what: format!("it owns {held} logs, its limit is {limit} (--quota-logs)"),
            });
        }
        Ok(())
    }

    /// Records `owner` as the owner of the log `name` just created in `dir`: the `OWNER` file,
    /// synced with the directory. On error the creation must be undone.
    pub fn record_owner(
        &self,
        storage: &dyn Storage,
        dir: &Path,
        name: &str,
        owner: &Credential,
    ) -> std::io::Result<()> {
        let path = dir.join(OWNER_FILE);
        let file = storage.open(&path, OpenMode::CreateNew)?;
        file.write_all_at(format!("{owner}\n").as_bytes(), 0)?;
        file.sync_data()?;
        storage.sync_dir(dir)?;
        let mut ledger = lock(&self.ledger);
        ledger.add_log(name, owner, 0);
        Ok(())
    }

    /// A log opened as `id`, whose records take `bytes` in its segments now: its usage is
    /// set to that (an estimate from the files' sizes before), and its appends are charged.
    pub fn opened(&self, id: LogId, name: &str, bytes: u64) {
        let usage = {
            let ledger = lock(&self.ledger);
            let Some(usage) = ledger.by_name.get(name) else {
                return;
            };
            let old = usage.bytes.load(Ordering::Relaxed);
            if bytes > old {
                usage.add(bytes - old);
            } else {
                usage.sub(old - bytes);
            }
            Arc::clone(usage)
        };
        self.open
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, usage);
    }

    /// The log `id` was closed: its appends are no longer charged through the open table.
    pub fn closed(&self, id: LogId) {
        self.open
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    }

    /// Charges `bytes` of an append to the owner of log `id`, or refuses them (nothing is
    /// charged then). The caller refunds ([`Quotas::refund`]) if the records are not placed.
    pub fn charge(&self, id: LogId, bytes: u64) -> Result<()> {
        if !self.limits.any() {
            return Ok(());
        }
        let open = self.open.read().unwrap_or_else(|e| e.into_inner());
        let Some(usage) = open.get(&id) else {
            return Ok(()); // no owner: an administrator's log, or one older than quotas
        };
        let account = &usage.account;
        if let Some(limit) = self.limits.bytes {
            let mut held = account.bytes.load(Ordering::Relaxed);
            loop {
                if held.saturating_add(bytes) > limit {
                    return Err(Error::QuotaExceeded {
                        credential: account.credential.to_string(),
                        what: format!(
                            "its logs hold {held} bytes, this append needs {bytes} more, its limit is {limit} (--quota-bytes)"
                        ),
                    });
                }
                match account.bytes.compare_exchange_weak(
                    held,
                    held + bytes,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => break,
                    Err(now) => held = now,
                }
            }
            usage.bytes.fetch_add(bytes, Ordering::Relaxed);
        } else {
            usage.add(bytes);
        }
        Ok(())
    }

    /// Gives back a charge whose records were not placed.
    pub fn refund(&self, id: LogId, bytes: u64) {
        if !self.limits.any() {
            return;
        }
        if let Some(usage) = self.open.read().unwrap_or_else(|e| e.into_inner()).get(&id) {
            usage.sub(bytes);
        }
    }

    /// Segments of `name` were removed (truncation, retention): `bytes` are given back.
    pub fn released(&self, name: &str, bytes: u64) {
        if let Some(usage) = lock(&self.ledger).by_name.get(name) {
            usage.sub(bytes);
        }
    }

    /// The log `name` was deleted: its owner holds one log and its bytes fewer.
    pub fn deleted(&self, name: &str) {
        let mut ledger = lock(&self.ledger);
        if let Some(usage) = ledger.by_name.remove(name) {
            usage.sub(usage.bytes.load(Ordering::Relaxed));
            usage.account.logs.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Every credential's (logs, bytes), by name, for `stela status` and tests.
    pub fn usage(&self) -> Vec<(String, u64, u64)> {
        let ledger = lock(&self.ledger);
        let mut all: Vec<_> = ledger
            .accounts
            .values()
            .map(|a| {
                (
                    a.credential.to_string(),
                    a.logs.load(Ordering::Relaxed),
                    a.bytes.load(Ordering::Relaxed),
                )
            })
            .filter(|(_, logs, _)| *logs > 0)
            .collect();
        all.sort();
        all
    }
}

/// The bytes a record of `payload` bytes takes in a segment (payload and frame header).
pub fn record_bytes(payload: usize) -> u64 {
    (payload + stela_format::frame::HEADER_BYTES) as u64
}

/// The owner named in `dir`'s `OWNER` file, if it has a readable one.
fn read_owner(storage: &dyn Storage, dir: &Path) -> Option<Credential> {
    let file = storage.open(&dir.join(OWNER_FILE), OpenMode::Read).ok()?;
    let mut buf = [0u8; MAX_CREDENTIAL_BYTES + 1];
    let n = file.read_at(&mut buf, 0).ok()?;
    let owner = std::str::from_utf8(&buf[..n])
        .ok()
        .and_then(Credential::parse);
    if owner.is_none() {
        tracing::warn!(dir = %dir.display(), "unreadable OWNER file: the log is charged to no one");
    }
    owner
}

/// The sizes of the segment files in `dir`.
pub fn files_bytes(storage: &dyn Storage, dir: &Path) -> u64 {
    storage
        .list(dir)
        .unwrap_or_default()
        .iter()
        .filter(|f| stela_format::segment_name::parse_segment_file_name(f).is_some())
        .filter_map(|f| storage.open(&dir.join(f), OpenMode::Read).ok())
        .map(|h| h.len().unwrap_or(0))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use stela_wal::storage::StdStorage;

    fn quotas(limits: Limits, dir: &Path) -> Quotas {
        Quotas::load(limits, &StdStorage, dir)
    }

    #[test]
    fn a_credential_is_refused_past_its_log_count_and_its_bytes_and_refunds_give_back() {
        let dir = tempfile::tempdir().unwrap();
        let limits = Limits {
            logs: Some(1),
            bytes: Some(100),
        };
        let q = quotas(limits, dir.path());
        let alice = Credential::uid(1000);
        q.may_create(&alice).unwrap();
        let log = dir.path().join("a");
        std::fs::create_dir(&log).unwrap();
        q.record_owner(&StdStorage, &log, "a", &alice).unwrap();
        assert!(matches!(
            q.may_create(&alice),
            Err(Error::QuotaExceeded { .. })
        ));
        q.may_create(&Credential::uid(1001)).unwrap();
        q.opened(7, "a", 40);
        q.charge(7, 60).unwrap();
        assert!(q.charge(7, 1).is_err(), "100 of 100 held");
        q.refund(7, 30);
        q.charge(7, 30).unwrap();
        q.released("a", 50);
        lock(&q.ledger).check();
        assert_eq!(q.usage(), vec![("uid:1000".to_owned(), 1, 50)]);
        // After a restart the owner is read back from the directory.
        let again = quotas(limits, dir.path());
        assert!(again.may_create(&alice).is_err());
        q.deleted("a");
        q.may_create(&alice).unwrap();
        assert!(q.usage().is_empty());
    }

    #[test]
    fn tokens_are_named_by_a_fingerprint_and_owner_files_are_checked() {
        let token = Credential::token("client-token-0123456789");
        assert!(token.name().starts_with("token:"));
        assert!(!token.name().contains("0123456789"));
        assert_eq!(token.name().len(), "token:".len() + 16);
        assert_eq!(Credential::parse("uid:5\n"), Some(Credential::uid(5)));
        assert_eq!(Credential::parse("../../etc\n"), None);
        assert_eq!(Credential::parse(""), None);
    }
}
