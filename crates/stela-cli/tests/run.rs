//! `stela run` against a real daemon: the preload library logs an unmodified program's changes
//! to files under a durable directory; a start after a crash replays the log's tail onto the
//! files (a change whose page cache was lost is back, following the renames made after it); a
//! statically linked program is refused; PostgreSQL with `pg_wal` durable through `stela run`
//! keeps every acknowledged commit across SIGKILLs of itself (at `buffered`), of itself and the
//! daemon, and of the daemon alone (at `disk`), with its primary key index checked by amcheck;
//! so does the unmodified sqlite3 shell in WAL and rollback-journal modes. The 30
//! rounds of each (`thirty_rounds`) run with `--ignored`, and so do power cuts without notice:
//! the daemon's directory and PostgreSQL's on stela-testkit's power-cut layer, which loses
//! everything not fsynced; nothing lost at `disk`, losses counted and within the window at
//! `buffered`.
//!
//! The preload library is a cdylib of the workspace, which `cargo test -p stela` does not build:
//! each test builds it first (`cargo build -p stela-preload`, quick when it is current).

mod common;

use common::postgres::{chown_postgres, commits_until, Postgres};
use common::Daemon;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

const STELA: &str = env!("CARGO_BIN_EXE_stela");

/// Builds the preload library beside the `stela` binary (where `stela run` looks for it).
fn build_preload() {
    static BUILT: Once = Once::new();
    BUILT.call_once(|| {
        let mut cargo = Command::new(env!("CARGO"));
        cargo.args(["build", "-p", "stela-preload"]);
        if STELA.contains("/release/") {
            cargo.arg("--release");
        }
        let status = cargo
            .status()
            .expect("running cargo to build the preload library");
        assert!(status.success(), "cargo build -p stela-preload failed");
        let library = Path::new(STELA).with_file_name("libstela_preload.so");
        assert!(library.is_file(), "{} was not built", library.display());
    });
}

fn run_args<'a>(
    daemon: &'a Daemon,
    dir: &'a str,
    level: &'a str,
    sync_ms: &'a str,
) -> Vec<&'a str> {
    vec![
        "run",
        "--dir",
        daemon.dir_arg(),
        "--durable",
        dir,
        "--level",
        level,
        "--sync-every-ms",
        sync_ms,
        "--",
    ]
}

/// A crash that loses the page cache of a durable file (here: its bytes are thrown away by
/// hand after the program and `stela run` were killed, before any background sync) is undone
/// by the next `stela run`, which replays the log's tail onto the file: the write lands on the
/// name the file was renamed to after it, and a file removed after its writes stays removed.
/// Without the replay the file would stay empty.
#[test]
fn a_start_after_a_crash_replays_lost_writes_onto_the_renamed_file() {
    build_preload();
    let tmp = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(&tmp.path().join("daemon"), &[]);
    let data = tmp.path().join("data");
    fs::create_dir(&data).unwrap();
    let done = tmp.path().join("done");
    let d = data.to_str().unwrap();
    // The program kills `stela run` first (no sync behind it), then writes, appends,
    // renames, writes a file and removes it, and fsyncs through a descriptor opened O_DSYNC.
    let script = format!(
        "kill -9 $PPID; printf hello > {d}/a; printf ' world' >> {d}/a; mv {d}/a {d}/b; \
         printf gone > {d}/c; rm {d}/c; dd if=/dev/urandom of={d}/big bs=3000000 count=1 iflag=fullblock status=none; \
         touch {done}",
        done = done.display()
    );
    let mut args = run_args(&daemon, d, "disk", "3600000");
    args.extend(["sh", "-c", &script]);
    let _ = Command::new(STELA)
        .args(&args)
        .stderr(Stdio::null())
        .status()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done.exists() {
        assert!(Instant::now() < deadline, "the program did not finish");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(fs::read_to_string(data.join("b")).unwrap(), "hello world");
    // A write of megabytes at once (logged as several appends).
    let big = fs::read(data.join("big")).unwrap();
    assert_eq!(big.len(), 3_000_000);
    // The page cache lost: the files are there (names are durable before they are logged),
    // their bytes are not.
    fs::write(data.join("b"), "").unwrap();
    fs::write(data.join("big"), "").unwrap();
    let out = Command::new(STELA)
        .args(run_args(&daemon, d, "disk", "3600000"))
        .args(["cat", data.join("b").to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello world");
    assert!(
        fs::read(data.join("big")).unwrap() == big,
        "the large write was not replayed"
    );
    assert!(!data.join("a").exists() && !data.join("c").exists());
}

/// A statically linked program would ignore the preload library: refused, saying why, and not
/// run.
#[test]
fn a_statically_linked_program_is_refused() {
    build_preload();
    let tmp = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(&tmp.path().join("daemon"), &[]);
    let program = tmp.path().join("static");
    // ELF64 header, one PT_LOAD program header, no PT_INTERP (what a static link gives).
    let mut elf = vec![0u8; 64 + 56];
    elf[..4].copy_from_slice(b"\x7fELF");
    elf[4] = 2;
    elf[5] = 1;
    elf[32] = 64;
    elf[54] = 56;
    elf[56] = 1;
    elf[64] = 1;
    fs::write(&program, &elf).unwrap();
    fs::set_permissions(&program, fs::Permissions::from_mode(0o755)).unwrap();
    let d = tmp.path().to_str().unwrap();
    for program in [program.to_str().unwrap(), "/sbin/ldconfig"] {
        if !Path::new(program).exists() {
            continue;
        }
        let out = Command::new(STELA)
            .args(run_args(&daemon, d, "disk", "1000"))
            .arg(program)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{program} was run");
        assert!(stderr.contains("statically linked"), "{program}: {stderr}");
    }
}

// ---- PostgreSQL ----

/// `stela run --durable WAL --level LEVEL -- runuser -u postgres -- pg_ctl start -w`, in the
/// background (`stela run` stays until the server exits); returns once PostgreSQL answers,
/// retrying while a killed server's last processes still hold its memory.
fn start_under_stela_run(pg: &Postgres, wal: &Path, daemon: &Daemon, level: &str) -> Child {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let mut run = Command::new(STELA)
            .args(run_args(daemon, wal.to_str().unwrap(), level, "1000"))
            .args(["runuser", "-u", "postgres", "--"])
            .arg(pg.bin.join("pg_ctl"))
            .args(pg.start_args(60))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        loop {
            if pg.answers() {
                return run;
            }
            if let Some(status) = run.try_wait().unwrap() {
                assert!(
                    Instant::now() < deadline,
                    "PostgreSQL did not start under stela run ({status}): {}",
                    fs::read_to_string(pg.log()).unwrap_or_default()
                );
                break;
            }
            assert!(
                Instant::now() < deadline,
                "PostgreSQL did not answer in time"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The log `stela run` uses for `dir` by default, if it exists.
fn run_log(daemon: &Daemon, dir: &Path) -> Option<stela_client::Wal<stela_run::RunRecord>> {
    let name: String = fs::canonicalize(dir)
        .unwrap()
        .to_string_lossy()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let options = stela_client::WalOptions::default()
        .type_tag(stela_run::record::TYPE_TAG)
        .create_if_missing(false);
    stela_client::Wal::open(daemon.socket(), &format!("run-{name}"), options).ok()
}

/// The last LSN of the log `stela run` uses for `dir` by default (0 if it has none yet).
fn log_end(daemon: &Daemon, dir: &Path) -> u64 {
    run_log(daemon, dir).map_or(0, |log| log.positions().unwrap().last_lsn)
}

/// A power cut's worst case for the files under `dir`: every byte the log's tail says was
/// written is overwritten with garbage, within each file's length, in the file that now has
/// the name (renames followed as replay follows them). The log is truncated only behind a sync
/// of the files, so this spoils at least every byte not yet synced (and, as truncation drops
/// whole segments, usually much more). Returns how many bytes were spoiled.
fn lose_unsynced_bytes(daemon: &Daemon, dir: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::FileExt;
    use stela_run::RunRecord;
    let log = run_log(daemon, dir).expect("the durable directory's log");
    let positions = log.positions().unwrap();
    let mut tail = Vec::new();
    if positions.last_lsn >= positions.first_lsn.max(1) {
        let from = stela_client::Lsn::new(positions.first_lsn.max(1));
        for item in log.iter_from(from).unwrap() {
            let (lsn, record) = item.unwrap();
            if lsn.get() > positions.last_lsn {
                break;
            }
            tail.push(record);
        }
    }
    let mut spoiled = 0;
    for (index, record) in tail.iter().enumerate() {
        let (path, offset, len) = match record {
            RunRecord::Write { path, offset, data } => (path, *offset, data.len() as u64),
            RunRecord::Zeros { path, offset, len } => (path, *offset, *len),
            _ => continue,
        };
        let Some(name) = stela_run::replay::final_name(&tail, index, path) else {
            continue;
        };
        let name = Path::new(std::ffi::OsStr::from_bytes(&name));
        let Ok(file) = fs::OpenOptions::new().write(true).open(name) else {
            continue;
        };
        let size = file.metadata().unwrap().len();
        let end = (offset + len).min(size);
        if end > offset {
            let garbage = vec![0xa5u8; (end - offset) as usize];
            file.write_all_at(&garbage, offset).unwrap();
            file.sync_data().unwrap();
            spoiled += end - offset;
        }
    }
    spoiled
}

/// What one crash round kills.
#[derive(Clone, Copy, Debug)]
enum Crash {
    /// SIGKILL of the program alone (every process of PostgreSQL; the sqlite3 shell with its
    /// `stela run`).
    Program,
    /// SIGKILL of the program and the daemon.
    ProgramAndDaemon,
    /// SIGKILL of the daemon alone: the program's next durable write or fsync fails (PostgreSQL
    /// PANICs and restarts itself, or stops; the shell stops); the daemon is restarted at once,
    /// the program killed and started as after a crash.
    Daemon,
    /// A power cut with notice: `stela power-fail` (the daemon writes and syncs everything it
    /// acknowledged, then refuses writes), SIGKILL of the program and the daemon, and the
    /// durable directory's unsynced bytes lost ([`lose_unsynced_bytes`]). Not modelled: the
    /// page cache of the program's other files (PostgreSQL's data directory).
    PowerCut,
}

/// Ten rounds of each crash, taking turns: the 30.
fn thirty_rounds() -> Vec<Crash> {
    [Crash::Program, Crash::Daemon, Crash::ProgramAndDaemon].repeat(10)
}

/// PostgreSQL with pg_wal durable through `stela run` at `level`, a client inserting numbered
/// rows, one crash per element of `crashes`; after each, every commit PostgreSQL acknowledged
/// is there after its crash recovery, with no gap, and the primary key index checks.
fn postgres_survives(level: &str, crashes: &[Crash], port: u16) {
    build_preload();
    let tmp = tempfile::tempdir().unwrap();
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let daemon_dir = tmp.path().join("daemon");
    // PostgreSQL's processes reach the daemon themselves: its socket open to them.
    let daemon_args = ["--socket-mode", "666"];
    let mut daemon = Some(Daemon::start(&daemon_dir, &daemon_args));
    let pg = Postgres::new(tmp.path(), port);
    // pg_wal in a directory of its own (the durable one), as the docs say.
    let wal = tmp.path().join("pgwal");
    fs::create_dir(&wal).unwrap();
    chown_postgres(&wal);
    pg.initdb(&wal, "");
    let mut run = start_under_stela_run(&pg, &wal, daemon.as_ref().unwrap(), level);
    pg.create_table();
    let before = log_end(daemon.as_ref().unwrap(), &wal);
    let (mut committed, mut acknowledged) = (0u64, 0u64);
    for (round, &crash) in crashes.iter().enumerate() {
        let name = format!("round {round} ({crash:?})");
        let (mut psql, acks) = pg.inserting(committed + 1);
        let started = committed;
        committed = commits_until(&acks, committed, committed + 300, &name);
        if round == 0 {
            assert!(
                log_end(daemon.as_ref().unwrap(), &wal) > before,
                "PostgreSQL's WAL writes did not reach the daemon (is the preload library \
                 loaded? readable by the postgres user?)"
            );
        }
        match crash {
            Crash::Program => pg.kill(),
            Crash::ProgramAndDaemon => {
                pg.kill();
                daemon.take().unwrap().kill();
            }
            Crash::Daemon => daemon.take().unwrap().kill(),
            Crash::PowerCut => {
                power_fail_notice(daemon.as_ref().unwrap());
                pg.kill();
                daemon.take().unwrap().kill();
            }
        }
        if daemon.is_none() {
            daemon = Some(Daemon::start(&daemon_dir, &daemon_args));
        }
        let _ = psql.kill();
        let _ = psql.wait();
        while let Ok(n) = acks.try_recv() {
            committed = n;
        }
        if matches!(crash, Crash::Daemon) {
            // PostgreSQL PANICs at its next failed WAL fsync and its postmaster restarts it
            // (or gives up): either way it is killed now and started as after a crash.
            std::thread::sleep(Duration::from_millis(500));
            pg.kill();
        }
        let _ = run.wait();
        if matches!(crash, Crash::PowerCut) {
            let spoiled = lose_unsynced_bytes(daemon.as_ref().unwrap(), &wal);
            eprintln!("{name}: {spoiled} bytes of pg_wal spoiled");
        }
        run = start_under_stela_run(&pg, &wal, daemon.as_ref().unwrap(), level);
        let max = pg.assert_kept(committed, &name);
        acknowledged += committed - started;
        eprintln!("{name}: acknowledged up to {committed}, recovered up to {max}, lost 0");
        committed = max;
    }
    eprintln!(
        "stela run at {level}: {} rounds, {acknowledged} commits acknowledged, 0 lost, \
         bt_index_check passed after each",
        crashes.len()
    );
    pg.stop();
    let _ = run.wait();
}

/// At `buffered`: PostgreSQL killed alone, twice.
#[test]
fn postgres_under_stela_run_at_buffered_keeps_every_commit_across_its_kills() {
    postgres_survives("buffered", &[Crash::Program, Crash::Program], 55_881);
}

/// At `disk`: PostgreSQL killed with the daemon, then the daemon alone.
#[test]
fn postgres_under_stela_run_at_disk_keeps_every_commit_across_kills_of_the_daemon() {
    postgres_survives("disk", &[Crash::ProgramAndDaemon, Crash::Daemon], 55_882);
}

/// `stela power-fail` to the daemon: it writes and syncs every buffer, then refuses writes.
fn power_fail_notice(daemon: &Daemon) {
    let notice = Command::new(STELA)
        .args(["power-fail", "--dir", daemon.dir_arg()])
        .output()
        .unwrap();
    assert!(
        notice.status.success(),
        "stela power-fail: {}",
        String::from_utf8_lossy(&notice.stderr)
    );
}

/// Power cuts with notice at `buffered` (RapiLog's case): ten rounds, each losing the
/// unsynced bytes of pg_wal, which replay must bring back.
#[test]
#[ignore = "10 PostgreSQL power-cut rounds, a few minutes"]
fn postgres_under_stela_run_at_buffered_survives_10_power_cuts_with_notice() {
    postgres_survives("buffered", &[Crash::PowerCut; 10], 55_884);
}

/// The rounds: SIGKILL of PostgreSQL, of the daemon, of both, ten times each.
#[test]
#[ignore = "30 PostgreSQL crash rounds, several minutes"]
fn postgres_under_stela_run_survives_30_kills() {
    postgres_survives("disk", &thirty_rounds(), 55_883);
}

// ---- SQLite ----

/// `stela run -- sqlite3 DB` in a process group of its own, inserting numbered rows in
/// `journal` mode with synchronous=FULL, one transaction each; the receiver gets each number
/// once its commit returned.
fn sqlite_inserting(
    daemon: &Daemon,
    db: &Path,
    journal: &str,
    from: u64,
) -> (Child, std::sync::mpsc::Receiver<u64>) {
    use std::os::unix::process::CommandExt;
    let dir = db.parent().unwrap().to_str().unwrap();
    let mut child = Command::new(STELA)
        .args(run_args(daemon, dir, "disk", "1000"))
        .arg("sqlite3")
        .arg(db)
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    // `.bail on`: the shell stops at its first error (a failed fsync once the daemon died),
    // so no later statement prints a commit that did not happen.
    let setup = format!(
        ".bail on\nPRAGMA journal_mode={journal}; PRAGMA synchronous=FULL; \
         CREATE TABLE IF NOT EXISTS t (n INTEGER PRIMARY KEY, pad BLOB);"
    );
    std::thread::spawn(move || {
        let _ = writeln!(stdin, "{setup}");
        for n in from.. {
            // The SELECT prints only once the INSERT's transaction committed (fsync'ed).
            let sql =
                format!("INSERT INTO t VALUES ({n}, randomblob(300)); SELECT 'committed', {n};");
            if writeln!(stdin, "{sql}").is_err() {
                break;
            }
        }
    });
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(n) = line.strip_prefix("committed|") {
                if tx.send(n.trim().parse::<u64>().unwrap()).is_err() {
                    break;
                }
            }
        }
    });
    (child, rx)
}

/// An unmodified sqlite3 shell under `stela run` in WAL mode: SIGKILL of the shell with `stela
/// run`, then of them and the daemon; after each, `stela run` replays and every acknowledged row
/// is there, with no gap, and the database checks.
#[test]
fn sqlite_under_stela_run_keeps_every_commit_across_kills() {
    sqlite_kill_rounds("WAL", &[Crash::Program, Crash::ProgramAndDaemon]);
}

/// The same in rollback-journal (DELETE) mode, whose journal is removed at each commit (the
/// commit point) and made again by the next transaction. It once lost an acknowledged `disk`
/// commit after a kill of the shell and the daemon ("DELETE round 1: commit 401
/// acknowledged, max is 400", 3 runs in 12): the removal's record was taken at `buffered`
/// and lost with the daemon while the next journal was already on disk, so replay wrote the
/// committed transaction's journal into it and SQLite rolled that transaction back. A change
/// of names now returns only once its record is at the level (the rule replay's property
/// tests in stela-run check).
#[test]
fn sqlite_in_rollback_journal_mode_under_stela_run_keeps_every_commit_across_kills() {
    sqlite_kill_rounds("DELETE", &[Crash::Program, Crash::ProgramAndDaemon]);
}

/// The rounds for SQLite in WAL mode: SIGKILL of the shell, of the daemon, of both, ten
/// times each.
#[test]
#[ignore = "30 SQLite crash rounds, a few minutes"]
fn sqlite_in_wal_mode_under_stela_run_survives_30_kills() {
    sqlite_kill_rounds("WAL", &thirty_rounds());
}

/// The same in rollback-journal (DELETE) mode.
#[test]
#[ignore = "30 SQLite crash rounds, a few minutes"]
fn sqlite_in_rollback_journal_mode_under_stela_run_survives_30_kills() {
    sqlite_kill_rounds("DELETE", &thirty_rounds());
}

/// Power cuts with notice for SQLite, whose every file is under the durable directory: after
/// `stela power-fail` and SIGKILL of the shell and the daemon, every byte written since the
/// last background sync is spoiled; replay must bring each back. Ten rounds in each mode.
#[test]
#[ignore = "20 SQLite power-cut rounds, a few minutes"]
fn sqlite_under_stela_run_survives_10_power_cuts_with_notice_in_each_mode() {
    sqlite_kill_rounds("WAL", &[Crash::PowerCut; 10]);
    sqlite_kill_rounds("DELETE", &[Crash::PowerCut; 10]);
}

/// The sqlite3 shell under `stela run` at `disk` in `journal` mode, inserting numbered rows,
/// one crash per element of `crashes`; after each, `stela run` replays, the database checks,
/// and every acknowledged row is there with no gap.
fn sqlite_kill_rounds(journal: &str, crashes: &[Crash]) {
    build_preload();
    let tmp = tempfile::tempdir().unwrap();
    let daemon_dir = tmp.path().join("daemon");
    let mut daemon = Some(Daemon::start(&daemon_dir, &[]));
    let data = tmp.path().join("data");
    fs::create_dir(&data).unwrap();
    let db = data.join("test.db");
    let (mut committed, mut acknowledged) = (0, 0);
    for (round, &crash) in crashes.iter().enumerate() {
        let name = format!("{journal} round {round} ({crash:?})");
        let (mut shell, acks) =
            sqlite_inserting(daemon.as_ref().unwrap(), &db, journal, committed + 1);
        let (started, deadline) = (committed, Instant::now() + Duration::from_secs(60));
        while committed < started + 200 {
            match acks.recv_timeout(Duration::from_millis(200)) {
                Ok(n) => committed = n,
                Err(_) => assert!(
                    Instant::now() < deadline,
                    "{name}: sqlite3 stopped committing"
                ),
            }
        }
        let kill_shell = || {
            let group = format!("-{}", shell.id());
            Command::new("kill")
                .args(["-KILL", "--", &group])
                .status()
                .unwrap();
        };
        match crash {
            Crash::Program => kill_shell(),
            Crash::ProgramAndDaemon => {
                kill_shell();
                daemon.take().unwrap().kill();
            }
            Crash::Daemon => {
                // The shell's next fsync fails (EIO) and it stops (`.bail on`); then it is
                // killed and started as after a crash.
                daemon.take().unwrap().kill();
                std::thread::sleep(Duration::from_millis(500));
                kill_shell();
            }
            Crash::PowerCut => {
                power_fail_notice(daemon.as_ref().unwrap());
                kill_shell();
                daemon.take().unwrap().kill();
            }
        }
        if daemon.is_none() {
            daemon = Some(Daemon::start(&daemon_dir, &[]));
        }
        let _ = shell.wait();
        while let Ok(n) = acks.try_recv() {
            committed = n;
        }
        if matches!(crash, Crash::PowerCut) {
            let spoiled = lose_unsynced_bytes(daemon.as_ref().unwrap(), &data);
            eprintln!("{name}: {spoiled} bytes spoiled");
        }
        let out = Command::new(STELA)
            .args(run_args(
                daemon.as_ref().unwrap(),
                data.to_str().unwrap(),
                "disk",
                "1000",
            ))
            .arg("sqlite3")
            .arg(&db)
            .arg("PRAGMA integrity_check; SELECT count(*), coalesce(max(n), 0) FROM t;")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some("ok"), "{name}: {text}");
        let (count, max) = lines.next().unwrap().split_once('|').unwrap();
        let (count, max): (u64, u64) = (count.parse().unwrap(), max.parse().unwrap());
        assert!(
            max >= committed,
            "{name}: commit {committed} acknowledged, max is {max}"
        );
        assert_eq!(count, max, "{name}: rows missing below {max}");
        acknowledged += committed - started;
        eprintln!("{name}: acknowledged up to {committed}, recovered up to {max}, lost 0");
        committed = max;
    }
    eprintln!(
        "sqlite3 under stela run, {journal} mode: {} rounds, {acknowledged} commits \
         acknowledged, 0 lost, integrity_check ok after each",
        crashes.len()
    );
}

// ---- Power cuts without notice ----

/// Both "disks" of a power-cut round: the daemon's directory on a layer that keeps names only
/// by their directory's fsync (POSIX's letter: stela must make its own names durable), and
/// PostgreSQL's data directory and pg_wal on a layer with a journaling file system's rule (any
/// fsync also keeps earlier changes of names, which PostgreSQL relies on for the relation files
/// it creates without an fsync of their directory, as on ext4 or XFS).
struct Disks {
    daemon: stela_testkit::powercut::PowerCutLayer,
    postgres: stela_testkit::powercut::PowerCutLayer,
}

impl Disks {
    fn mount(base: &Path) -> Disks {
        use stela_testkit::powercut::{Namespace, PowerCutLayer};
        let (daemon, postgres) = (base.join("daemon-disk"), base.join("postgres-disk"));
        fs::create_dir(&daemon).unwrap();
        fs::create_dir(&postgres).unwrap();
        Disks {
            daemon: PowerCutLayer::mount(&daemon, Namespace::Strict),
            postgres: PowerCutLayer::mount(&postgres, Namespace::Journaled),
        }
    }
}

/// SIGKILL at one instant of everything the machine ran (PostgreSQL's process group, the
/// daemon, `stela run`, the client), each reaped or gone; then both layers lose what was not
/// fsynced and are mounted again. Returns the instant of the kill.
fn cut_power(
    pg: &Postgres,
    daemon: Daemon,
    run: &mut Child,
    psql: &mut Child,
    disks: &mut Disks,
) -> Instant {
    let postmaster: i32 = fs::read_to_string(pg.data.join("postmaster.pid"))
        .ok()
        .and_then(|pid| pid.lines().next()?.trim().parse().ok())
        .expect("the running postmaster's pid");
    let mut daemon = daemon;
    let pids = [
        -postmaster,
        daemon.child.id() as i32,
        run.id() as i32,
        psql.id() as i32,
    ];
    let at = Instant::now();
    for pid in pids {
        // SAFETY: kill(2) with a pid or process group this test started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let _ = daemon.child.wait();
    let _ = run.wait();
    let _ = psql.wait();
    let deadline = Instant::now() + Duration::from_secs(30);
    // SAFETY: signal 0 only asks whether the group still has a process.
    while unsafe { libc::kill(-postmaster, 0) } == 0 {
        assert!(
            Instant::now() < deadline,
            "PostgreSQL's processes outlived SIGKILL by 30 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(daemon);
    let lost_daemon = disks.daemon.cut();
    let lost_postgres = disks.postgres.cut();
    eprintln!(
        "  cut: unsynced bytes dropped: daemon's directory {} in {} files, PostgreSQL's {} in {} files",
        lost_daemon.unsynced_bytes,
        lost_daemon.unsynced_files,
        lost_postgres.unsynced_bytes,
        lost_postgres.unsynced_files
    );
    at
}

/// After a restart: no gap below the highest row, the primary key index checks; returns the
/// highest row.
fn rows_without_gap(pg: &Postgres, round: &str) -> u64 {
    let count: u64 = pg.psql("SELECT count(*) FROM t").parse().unwrap();
    let max: u64 = pg
        .psql("SELECT coalesce(max(n), 0) FROM t")
        .parse()
        .unwrap();
    assert_eq!(count, max, "{round}: rows missing below {max}");
    pg.psql("SELECT bt_index_check('t_pkey', true)");
    max
}

/// The documented window of a `buffered` acknowledgement at a power cut without notice
/// (docs/DURABILITY.md: lost unless already written; docs/DAEMON.md: a buffer is written once
/// older than `--flush-interval`, 1 s by default), plus time for that write and its fdatasync on
/// a loaded machine.
const BUFFERED_WINDOW: Duration = Duration::from_millis(2000);

/// What PostgreSQL does just before a power cut, besides committing.
#[derive(Clone, Copy, PartialEq, Eq)]
enum BeforeCut {
    Nothing,
    /// A `CHECKPOINT`: its data files and `pg_control` are fsynced by PostgreSQL itself (they
    /// are not under `--durable`), its checkpoint record only at the level.
    Checkpoint,
}

/// PostgreSQL under `stela run --durable PGWAL --level LEVEL`, its data directory, pg_wal and
/// the daemon's directory on power-cut layers; a client inserting numbered rows; `rounds` power
/// cuts without notice, each after at least 300 commits and a random further 0-1.5 s of them.
/// After each, started as docs/POSTGRES.md says: the database starts, no gap, the index checks,
/// and the acknowledged commits lost are counted: none at `disk`; at `buffered` only commits
/// acknowledged within [`BUFFERED_WINDOW`] before the cut.
fn postgres_survives_power_cuts_without_notice(
    level: &str,
    rounds: usize,
    before_cut: BeforeCut,
    port: u16,
) {
    build_preload();
    let tmp = tempfile::tempdir().unwrap();
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let mut disks = Disks::mount(tmp.path());
    let daemon_dir = disks.daemon.path().join("stela");
    let daemon_args = ["--socket-mode", "666"];
    let mut daemon = Daemon::start(&daemon_dir, &daemon_args);
    // Sockets and the server's log off the layers (a test's diagnostics, not the database).
    let mut pg = Postgres::new(tmp.path(), port);
    pg.data = disks.postgres.path().join("pgdata");
    let wal = disks.postgres.path().join("pgwal");
    fs::create_dir(&wal).unwrap();
    chown_postgres(&wal);
    pg.initdb(&wal, "");
    // The settings the test appended (port, socket directory) are on the layer too: an
    // administrator's editor fsyncs them; unsynced, the first cut would drop them.
    fs::File::open(pg.data.join("postgresql.conf"))
        .unwrap()
        .sync_all()
        .unwrap();
    let mut run = start_under_stela_run(&pg, &wal, &daemon, level);
    pg.create_table();
    let (mut committed, mut acknowledged, mut lost_total) = (0u64, 0u64, 0u64);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(port);
    for round in 0..rounds {
        let name = format!("{level} power cut {round}");
        let (mut psql, acks) = pg.inserting(committed + 1);
        let started = committed;
        committed = commits_until(&acks, committed, committed + 300, &name);
        let mut acked_at = std::collections::BTreeMap::new();
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let until = Instant::now() + Duration::from_millis(seed % 1500);
        while Instant::now() < until {
            if let Ok(n) = acks.recv_timeout(Duration::from_millis(5)) {
                acked_at.insert(n, Instant::now());
                committed = n;
            }
        }
        if before_cut == BeforeCut::Checkpoint {
            pg.psql("CHECKPOINT");
        }
        let cut = cut_power(&pg, daemon, &mut run, &mut psql, &mut disks);
        // Answers read before the kill but not yet taken from the channel were acknowledged
        // before the cut (at the latest at it).
        while let Ok(n) = acks.try_recv() {
            acked_at.insert(n, cut);
            committed = n;
        }
        daemon = Daemon::start(&daemon_dir, &daemon_args);
        run = start_under_stela_run(&pg, &wal, &daemon, level);
        let max = rows_without_gap(&pg, &name);
        let lost = committed.saturating_sub(max);
        acknowledged += committed - started;
        lost_total += lost;
        let oldest_lost = acked_at.get(&(max + 1)).map(|t| cut.duration_since(*t));
        eprintln!(
            "{name}: acknowledged up to {committed}, recovered up to {max}, lost {lost} \
             (the oldest acknowledged {oldest_lost:?} before the cut)"
        );
        if level == "disk" {
            assert_eq!(lost, 0, "{name}: {lost} commits acknowledged at disk lost");
        } else if lost > 0 {
            let age = oldest_lost.unwrap_or_else(|| {
                panic!(
                    "{name}: commit {} lost, acknowledged before the last 300",
                    max + 1
                )
            });
            assert!(
                age <= BUFFERED_WINDOW,
                "{name}: a commit acknowledged {age:?} before the cut was lost (window {BUFFERED_WINDOW:?})"
            );
        }
        committed = max;
    }
    eprintln!(
        "stela run at {level}, power cuts without notice: {rounds} rounds, {acknowledged} commits \
         acknowledged, {lost_total} lost, bt_index_check passed after each"
    );
    pg.stop();
    let _ = run.wait();
    daemon.terminate();
}

/// Three power cuts without notice at `disk`: nothing acknowledged may be lost.
#[test]
#[ignore = "3 PostgreSQL power-cut rounds on FUSE layers, about a minute or more"]
fn postgres_under_stela_run_at_disk_survives_3_power_cuts_without_notice() {
    postgres_survives_power_cuts_without_notice("disk", 3, BeforeCut::Nothing, 55_885);
}

/// Three power cuts without notice at `buffered`: only commits within the window may be lost,
/// and they are counted.
#[test]
#[ignore = "3 PostgreSQL power-cut rounds on FUSE layers, about a minute or more"]
fn postgres_under_stela_run_at_buffered_loses_only_its_window_at_3_power_cuts_without_notice() {
    postgres_survives_power_cuts_without_notice("buffered", 3, BeforeCut::Nothing, 55_886);
}

/// At `disk` a checkpoint just before the cut changes nothing: its record was fdatasync'ed by
/// the daemon before `pg_control` named it.
#[test]
#[ignore = "3 PostgreSQL power-cut rounds on FUSE layers, about a minute or more"]
fn postgres_under_stela_run_at_disk_survives_3_power_cuts_without_notice_just_after_checkpoints() {
    postgres_survives_power_cuts_without_notice("disk", 3, BeforeCut::Checkpoint, 55_887);
}

/// At `buffered` a checkpoint's record is acknowledged from the daemon's memory, while
/// PostgreSQL fsyncs `pg_control` (naming that record) and the data files itself: `stela run`
/// makes the log durable before it lets such a file be fsynced (`conn::barrier` in
/// stela-preload). Without that barrier 2 of the first 4 such cuts left a cluster that did not
/// start ("PANIC: could not locate a valid checkpoint record").
#[test]
#[ignore = "3 PostgreSQL power-cut rounds on FUSE layers, about a minute or more"]
fn postgres_under_stela_run_at_buffered_starts_after_power_cuts_without_notice_just_after_checkpoints(
) {
    postgres_survives_power_cuts_without_notice("buffered", 3, BeforeCut::Checkpoint, 55_888);
}
