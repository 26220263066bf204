//! `stela backup` and `stela restore` against a real daemon.
//!
//! - Under load: four clients commit at `disk` to two logs (one of them truncated behind its
//!   writer all along, so the backup's hold is what keeps its segments) while a backup is
//!   taken; the daemon keeps acknowledging during the backup, and the backup, restored and
//!   served by a second daemon, holds every record acknowledged before the backup began, with
//!   its bytes, at its LSN.
//! - A damaged backup is refused (exit 1, naming the file) before anything is written; a
//!   directory without a manifest is not a backup (exit 4); a log is never overwritten; a
//!   backup is not written into a non-empty directory; the backup's holds are gone after it.

mod common;

use common::{stela, text, Daemon};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stela_client::{Durability, Wal, WalOptions};
use stela_wal::Lsn;

/// Every acknowledged record of one log: LSN -> (text, when its acknowledgement returned).
type Acked = Arc<Mutex<BTreeMap<u64, (String, Instant)>>>;

/// A client committing records at `level` to `log` until `stop`; with `truncate`, it also
/// truncates the log behind itself every 200 records (a checkpointing database), raising
/// `truncate` to the LSN it truncates before *before* it asks (so at any moment it is at or
/// above every truncation that has happened).
fn writer(
    socket: std::path::PathBuf,
    (log, level): (&'static str, Durability),
    id: u32,
    truncate: Option<Arc<AtomicU64>>,
    stop: Arc<AtomicBool>,
    acked: Acked,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let options = WalOptions::default().durability(level);
        let wal: Wal<String> = Wal::open(socket.as_path(), log, options).unwrap();
        let mut seq = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let record = format!("{log} writer {id} record {seq} {}", "x".repeat(200));
            let lsn = wal.append_durable(&record).unwrap();
            acked
                .lock()
                .unwrap()
                .insert(lsn.get(), (record, Instant::now()));
            seq += 1;
            if let Some(cut) = truncate.as_ref().filter(|_| seq.is_multiple_of(200)) {
                let before = lsn.get().saturating_sub(2000).max(1);
                cut.fetch_max(before, Ordering::SeqCst);
                wal.truncate_before(Lsn::new(before)).unwrap();
            }
        }
    })
}

/// `stela backup --dir DIR --to TO`, then `more` flags.
fn backup(dir: &str, to: &Path, more: &[&str]) -> Output {
    let to = to.to_str().unwrap();
    stela(&[&["backup", "--dir", dir, "--to", to][..], more].concat())
}

/// `stela restore --from FROM`, then `how` (`--check`, or `--to DIR`).
fn restore(from: &Path, how: &[&str]) -> Output {
    stela(&[&["restore", "--from", from.to_str().unwrap()][..], how].concat())
}

/// `stela restore --from FROM --to TO`.
fn restore_to(from: &Path, to: &Path) -> Output {
    restore(from, &["--to", to.to_str().unwrap()])
}

/// The command exited with `code`, saying each of `saying`.
fn answered(output: &Output, code: i32, saying: &[&str]) {
    let said = text(output);
    assert_eq!(output.status.code(), Some(code), "{said}");
    for words in saying {
        assert!(said.contains(words), "{said}");
    }
}

fn at_disk() -> WalOptions {
    WalOptions::default().durability(Durability::Disk)
}

fn records_through(socket: &Path, log: &str) -> BTreeMap<u64, String> {
    let wal: Wal<String> = Wal::open(socket, log, WalOptions::default()).unwrap();
    let first = wal.positions().unwrap().first_lsn.max(1);
    let records = wal.iter_from(Lsn::new(first)).unwrap();
    records
        .map(|entry| {
            let (lsn, record) = entry.unwrap();
            (lsn.get(), record)
        })
        .collect()
}

#[test]
fn a_backup_under_load_restored_holds_every_record_acknowledged_at_disk_before_it_began() {
    let base = tempfile::tempdir().unwrap();
    // Small segments: the backup copies several, and the truncating writer removes some.
    let daemon = Daemon::start(&base.path().join("d"), &["--segment-size", "1MiB"]);
    let from = ["--dir", daemon.dir_arg()];
    backed_up_under_load(base.path(), &daemon, (&daemon, &from), Durability::Disk);
    daemon.terminate();
}

/// The same load, the backup taken over the network (`--from tls://...`, authenticated with an
/// administrator's token): the daemon sends its files, and the copy, restored and served,
/// holds every record acknowledged at `disk` before the backup began.
#[test]
fn a_network_backup_under_load_restored_holds_every_record_acknowledged_at_disk_before_it_began() {
    let base = tempfile::tempdir().unwrap();
    let tls = Tls::new(base.path());
    let daemon = Daemon::start(
        &base.path().join("d"),
        &[&["--segment-size", "256KiB"][..], &tls.daemon_args()].concat(),
    );
    // Paced slower than the truncating writer cuts its log: without the backup's hold, a
    // truncation would remove segments listed but not copied yet.
    let mut from = tls.client_args(&tls.admin_token);
    from.extend(["--max-rate", "128KiB"]);
    backed_up_under_load(base.path(), &daemon, (&daemon, &from), Durability::Disk);
    daemon.terminate();
}

/// A daemon on TCP with TLS and two token files: what a network backup authenticates with.
struct Tls {
    addr: String,
    from: String,
    cert: String,
    key: String,
    client_token: String,
    admin_token: String,
}

impl Tls {
    fn new(base: &Path) -> Tls {
        let pki = base.join("pki");
        std::fs::create_dir(&pki).unwrap();
        let cert = stela_testkit::self_signed(&pki, "daemon");
        let (client, admin) = (pki.join("client.token"), pki.join("admin.token"));
        stela_testkit::write_secret(&client, "client-token-0b6e2d9f41a7c385\n");
        stela_testkit::write_secret(&admin, "admin-token-7c1f5a3e92d04b68\n");
        let s = |p: &Path| p.to_str().unwrap().to_owned();
        let addr = stela_testkit::free_addr().to_string();
        Tls {
            from: format!("tls://{addr}"),
            addr,
            cert: s(&cert.cert),
            key: s(&cert.key),
            client_token: s(&client),
            admin_token: s(&admin),
        }
    }

    fn daemon_args(&self) -> [&str; 10] {
        [
            "--tcp",
            &self.addr,
            "--tls-cert",
            &self.cert,
            "--tls-key",
            &self.key,
            "--token-file",
            &self.client_token,
            "--admin-token-file",
            &self.admin_token,
        ]
    }

    /// `--from tls://ADDR --tls-ca CERT`, and `--token-file TOKEN` unless it is empty.
    fn client_args<'a>(&'a self, token: &'a str) -> Vec<&'a str> {
        let mut args = vec!["--from", &self.from, "--tls-ca", &self.cert];
        if !token.is_empty() {
            args.extend(["--token-file", token]);
        }
        args
    }
}

/// A network backup is an administrator's: refused without a token, with a client's token, and
/// over a plain loopback listener (whose peers are clients); each refusal leaves no manifest
/// and no hold, and the daemon serves on.
#[test]
fn a_network_backup_is_refused_to_anyone_but_an_authenticated_administrator() {
    let base = tempfile::tempdir().unwrap();
    let tls = Tls::new(base.path());
    let daemon = Daemon::start(&base.path().join("d"), &tls.daemon_args());
    let wal: Wal<String> = Wal::open(daemon.socket(), "orders", at_disk()).unwrap();
    for i in 0..50 {
        wal.append_durable(&format!("order {i}")).unwrap();
    }
    let refused = |from: &[&str], why: &str, target: &str| {
        let to = base.path().join(target);
        let args = [&["backup", "--to", to.to_str().unwrap()][..], from].concat();
        let made = stela(&args);
        assert_ne!(made.status.code(), Some(0), "{}", text(&made));
        assert!(text(&made).contains(why), "{why:?} not in: {}", text(&made));
        assert!(
            !to.join("MANIFEST").exists(),
            "a refused backup wrote a manifest"
        );
        assert!(
            !to.join("logs/orders").exists(),
            "a refused backup copied a log"
        );
    };
    refused(&tls.client_args(""), "Unauthenticated", "anonymous");
    refused(&tls.client_args(&tls.client_token), "Forbidden", "client");
    daemon.terminate();
    let insecure_addr = stela_testkit::free_addr().to_string();
    let insecure = Daemon::start(
        &base.path().join("d"),
        &["--tcp", &insecure_addr, "--tcp-insecure"],
    );
    let plain = format!("tcp://{insecure_addr}");
    refused(&["--from", &plain], "Forbidden", "plain");
    let listed = stela(&["logs", "list", "--dir", insecure.dir_arg(), "--json"]);
    assert!(
        !text(&listed).contains("backup: "),
        "a refused backup left a hold: {}",
        text(&listed)
    );
    // An administrator on the daemon's own socket (`--from` a directory) is served.
    let to = base.path().join("local");
    let made = stela(&[
        "backup",
        "--to",
        to.to_str().unwrap(),
        "--from",
        insecure.dir_arg(),
    ]);
    assert_eq!(made.status.code(), Some(0), "{}", text(&made));
    drop(wal);
    insecure.terminate();
}

/// A backup of a standby (a plain pair, no coordinator) while its primary takes commits at
/// `all` (each synced on both nodes before it is acknowledged): the standby's copy of every
/// log, truncated behind one writer by the primary's truncations (the backup's hold keeps the
/// standby's segments as it does the primary's), restored and served, holds every record
/// acknowledged before the backup began.
#[test]
fn a_backup_of_a_standby_holds_every_record_acknowledged_at_all_before_it_began() {
    let base = tempfile::tempdir().unwrap();
    let peer = stela_testkit::free_addr().to_string();
    let standby = Daemon::start(
        &base.path().join("s"),
        &["--repl-listen", &peer, "--segment-size", "1MiB"],
    );
    let primary = Daemon::start(
        &base.path().join("p"),
        &["--standby", &peer, "--segment-size", "1MiB"],
    );
    let from = ["--dir", standby.dir_arg()];
    backed_up_under_load(base.path(), &primary, (&standby, &from), Durability::All);
    primary.terminate();
    standby.terminate();
}

/// Two logs under load at `level` on `primary` (two writers each, one log truncated behind its
/// writers), a `stela backup` of `source` (reached with `from`: `--dir DIR` or `--from ...`)
/// taken meanwhile, restored under `base` and served: it holds every record acknowledged
/// before the backup began, with its bytes, and the backup's hold is gone from `source`.
fn backed_up_under_load(
    base: &Path,
    primary: &Daemon,
    (source, from): (&Daemon, &[&str]),
    level: Durability,
) {
    let (backup, restored) = (base.join("backup"), base.join("r"));
    let daemon = primary;
    // Small segments: the backup copies several, and the truncating writer removes some.
    let stop = Arc::new(AtomicBool::new(false));
    let logs: [(&str, Option<Arc<AtomicU64>>, Acked); 2] = [
        ("orders", None, Acked::default()),
        ("events", Some(Arc::default()), Acked::default()),
    ];
    let mut writers = Vec::new();
    for (log, truncate, acked) in &logs {
        for id in 0..2 {
            let (stop, acked) = (stop.clone(), acked.clone());
            let log = (*log, level);
            let truncate = truncate.clone();
            writers.push(writer(daemon.socket(), log, id, truncate, stop, acked));
        }
    }
    let busy = |acked: &Acked| acked.lock().unwrap().len();
    testkit_eventually("8,000 records acknowledged before the backup", || {
        logs.iter().map(|(_, _, a)| busy(a)).sum::<usize>() > 8000
    });

    let cuts = || -> Vec<u64> {
        let cut = |c: &Option<Arc<AtomicU64>>| c.as_ref().map_or(0, |c| c.load(Ordering::SeqCst));
        logs.iter().map(|(_, c, _)| cut(c)).collect()
    };
    let began = Instant::now();
    let before: usize = logs.iter().map(|(_, _, a)| busy(a)).sum();
    // A truncation that began before the backup's hold on the truncated log was recorded may
    // remove what it asked for: the records it releases are not required. Its LSN is read
    // when the hold is first seen, or, if it never was (a backup quicker than the watcher),
    // after the backup: fewer records are then checked, never a false failure.
    let watched = source.dir_arg().to_owned();
    let holder = backup.to_str().unwrap().to_owned();
    let (cuts_at_hold, done) = (Arc::new(Mutex::new(None)), Arc::new(AtomicBool::new(false)));
    let watcher = {
        let (cuts_at_hold, done, cut) = (cuts_at_hold.clone(), done.clone(), logs[1].1.clone());
        std::thread::spawn(move || {
            let dir = Path::new(&watched).join("logs/events");
            while !done.load(Ordering::SeqCst) {
                let holds = stela_wal::holds::list(&stela_wal::storage::StdStorage, &dir);
                let held = holds
                    .unwrap_or_default()
                    .into_iter()
                    .any(|hold| hold.holder.is_some_and(|h| h.contains(&holder)));
                if held {
                    let at = cut.as_ref().unwrap().load(Ordering::SeqCst);
                    *cuts_at_hold.lock().unwrap() = Some(vec![0, at]);
                    return;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let made = stela(&[&["backup", "--to", backup.to_str().unwrap()][..], from].concat());
    let ended = Instant::now();
    done.store(true, Ordering::SeqCst);
    watcher.join().unwrap();
    let seen = cuts_at_hold.lock().unwrap().clone();
    if from.contains(&"--max-rate") {
        assert!(seen.is_some(), "a paced backup's hold was never seen");
    }
    let cut_before_backup = seen.unwrap_or_else(cuts);
    let during = logs.iter().map(|(_, _, a)| busy(a)).sum::<usize>() - before;
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.join().unwrap();
    }
    answered(&made, 0, &[]);
    assert!(
        during > 0,
        "the daemon acknowledged nothing during the backup ({:?})",
        ended - began
    );
    let listed = stela(&["logs", "list", "--dir", source.dir_arg(), "--json"]);
    assert!(
        !text(&listed).contains(backup.file_name().unwrap().to_str().unwrap()),
        "the backup's hold was left behind: {}",
        text(&listed)
    );

    answered(&restore_to(&backup, &restored), 0, &[]);
    let second = Daemon::start(&restored, &[]);
    for ((log, truncate, acked), cut) in logs.iter().zip(cut_before_backup) {
        let present = records_through(&second.socket(), log);
        let acked = acked.lock().unwrap();
        let first = *present.keys().next().expect("the restored log has records");
        let mut required = 0;
        for (lsn, (record, at)) in acked.iter() {
            if let Some(found) = present.get(lsn) {
                assert_eq!(found, record, "{log}: LSN {lsn} holds another record");
            }
            // Not required: acknowledged after the backup began, or released by a truncation
            // before its hold (which keeps everything else, also from a truncation meanwhile).
            if *at >= began || *lsn < cut {
                continue;
            }
            required += 1;
            assert!(
                present.contains_key(lsn),
                "{log}: LSN {lsn} was acknowledged at {level:?} before the backup began and is not in it"
            );
        }
        assert!(required > 1000, "{log}: only {required} records checked");
        assert!(
            present.keys().next_back() >= acked.keys().rfind(|l| acked[l].1 < began),
            "{log}: the restored log ends before the last record acknowledged before the backup"
        );
        if truncate.is_none() {
            assert_eq!(first, 1, "{log}: never truncated, yet it starts at {first}");
        }
    }
    second.terminate();
}

fn testkit_eventually(what: &str, condition: impl FnMut() -> bool) {
    stela_testkit::eventually(what, Duration::from_secs(60), condition);
}

/// A small daemon with one log of `records` records, backed up into `backup`.
fn backed_up(base: &Path, records: u64) -> std::path::PathBuf {
    let dir = base.join("d");
    let daemon = Daemon::start(&dir, &[]);
    let wal: Wal<String> = Wal::open(daemon.socket(), "orders", at_disk()).unwrap();
    for i in 0..records {
        wal.append_durable(&format!("order {i}")).unwrap();
    }
    let copy = base.join("backup");
    answered(&backup(daemon.dir_arg(), &copy, &[]), 0, &[]);
    answered(&backup(daemon.dir_arg(), &copy, &[]), 2, &["not empty"]);
    drop(wal);
    daemon.terminate();
    copy
}

#[test]
fn a_damaged_backup_is_refused_before_anything_is_written() {
    let base = tempfile::tempdir().unwrap();
    let backup = backed_up(base.path(), 100);
    answered(&restore(&backup, &["--check"]), 0, &[]);

    // One bit of one record in the copied segment.
    let segment = backup.join("logs/orders/00000000000000000001.wal");
    let mut bytes = std::fs::read(&segment).unwrap();
    let at = stela_format::header::HEADER_BYTES + 40;
    bytes[at] ^= 0x10;
    std::fs::write(&segment, &bytes).unwrap();
    let target = base.path().join("r");
    for refused in [restore(&backup, &["--check"]), restore_to(&backup, &target)] {
        answered(&refused, 1, &["damaged backup", ".wal"]);
    }
    assert!(
        !target.join("logs/orders").exists(),
        "a damaged log was laid out"
    );
    bytes[at] ^= 0x10;
    std::fs::write(&segment, &bytes).unwrap();

    // The manifest itself: edited, then gone.
    let manifest = backup.join("MANIFEST");
    let original = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(&manifest, original.replace("\"orders\"", "\"orderz\"")).unwrap();
    answered(&restore(&backup, &["--check"]), 1, &["checksum"]);
    std::fs::remove_file(&manifest).unwrap();
    answered(&restore(&backup, &["--check"]), 4, &["not a stela backup"]);
    std::fs::write(&manifest, original).unwrap();

    // Restored once; a second restore into the same directory does not overwrite the log.
    answered(&restore_to(&backup, &target), 0, &[]);
    answered(&restore_to(&backup, &target), 2, &["already there"]);
    let daemon = Daemon::start(&target, &[]);
    let present = records_through(&daemon.socket(), "orders");
    assert_eq!(present.len(), 100);
    assert_eq!(present[&100], "order 99");
    daemon.terminate();
}

/// `--max-rate` (a size per second, bytesize's syntax): the backup reads the daemon's files no
/// faster than the limit on average (its time is at least what it read over the rate; the limit
/// holds by sleeping, so a slow machine cannot make this fail) and is complete and verified. A
/// rate that is not a size is refused as a usage error.
#[test]
fn a_rate_limited_backup_reads_no_faster_than_its_limit_and_is_whole() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("d");
    let daemon = Daemon::start(&dir, &["--segment-size", "1MiB"]);
    let wal: Wal<String> = Wal::open(daemon.socket(), "orders", WalOptions::default()).unwrap();
    let mut last = Lsn::new(0);
    for i in 0..3000 {
        last = wal
            .append(&format!("order {i} {}", "o".repeat(1000)))
            .unwrap();
    }
    wal.commit_at(last, Durability::Disk).unwrap();
    let copy = base.path().join("backup");
    const RATE: u64 = 8 << 20;
    let made = backup(daemon.dir_arg(), &copy, &["--max-rate", "8MiB/s", "--json"]);
    answered(&made, 0, &[]);
    let totals: serde_json::Value = serde_json::from_slice(&made.stdout).unwrap();
    let (read, seconds) = (
        totals["read_bytes"].as_u64().unwrap(),
        totals["seconds"].as_f64().unwrap(),
    );
    assert!(read > 3_000_000, "read only {read} bytes");
    assert!(
        seconds >= read as f64 / RATE as f64 * 0.999,
        "{read} bytes read in {seconds} s: faster than 8 MiB/s"
    );
    let logs = totals["manifest"]["logs"].as_array().unwrap();
    assert_eq!(logs[0]["last_lsn"].as_u64(), Some(last.get()), "{totals}");
    answered(&restore(&copy, &["--check"]), 0, &[]);

    let other = base.path().join("other");
    answered(
        &backup(daemon.dir_arg(), &other, &["--max-rate", "fast"]),
        2,
        &[],
    );
    drop(wal);
    daemon.terminate();
}
