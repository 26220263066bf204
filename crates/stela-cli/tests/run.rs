//! `stela run` against a real daemon: the preload library logs an unmodified program's changes
//! to files under a durable directory; a start after a crash replays the log's tail onto the
//! files (a change whose page cache was lost is back, following the renames made after it); a
//! statically linked program is refused; PostgreSQL with `pg_wal` durable through `stela run`
//! keeps every acknowledged commit across SIGKILLs of itself (at `buffered`), of itself and the
//! daemon, and of the daemon alone (at `disk`), with its primary key index checked by amcheck.
//!
//! The preload library is a cdylib of the workspace, which `cargo test -p stela` does not build:
//! each test builds it first (`cargo build -p stela-preload`, quick when it is current).

mod common;

use common::Daemon;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
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

impl Drop for Postgres {
    /// A test that fails leaves no server running.
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.kill();
        }
    }
}

struct Postgres {
    bin: PathBuf,
    data: PathBuf,
    wal: PathBuf,
    sockets: PathBuf,
    port: u16,
}

fn as_postgres(program: &Path, args: &[&str]) -> std::process::Output {
    Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("runuser")
}

fn chown_postgres(path: &Path) {
    let status = Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success(), "chown postgres {}", path.display());
}

impl Postgres {
    fn new(base: &Path, port: u16) -> Postgres {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(
            unsafe { libc::geteuid() },
            0,
            "this test runs PostgreSQL as the postgres user and needs root"
        );
        let mut versions: Vec<u32> = fs::read_dir("/usr/lib/postgresql")
            .expect("this test needs PostgreSQL (Debian package postgresql)")
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        versions.sort_unstable();
        let bin = PathBuf::from(format!(
            "/usr/lib/postgresql/{}/bin",
            versions.last().expect("a PostgreSQL version")
        ));
        let sockets = base.join("sockets");
        fs::create_dir_all(&sockets).unwrap();
        chown_postgres(&sockets);
        Postgres {
            bin,
            data: base.join("pgdata"),
            wal: base.join("pgwal"),
            sockets,
            port,
        }
    }

    /// initdb with pg_wal in a directory of its own (the durable one), as the docs say.
    fn initdb(&self) {
        fs::create_dir_all(&self.data).unwrap();
        fs::create_dir_all(&self.wal).unwrap();
        chown_postgres(&self.data);
        chown_postgres(&self.wal);
        let out = as_postgres(
            &self.bin.join("initdb"),
            &[
                "-D",
                self.data.to_str().unwrap(),
                "--waldir",
                self.wal.to_str().unwrap(),
                "-A",
                "trust",
            ],
        );
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut conf = fs::OpenOptions::new()
            .append(true)
            .open(self.data.join("postgresql.conf"))
            .unwrap();
        writeln!(
            conf,
            "port = {}\nlisten_addresses = ''\nunix_socket_directories = '{}'\n\
             synchronous_commit = on\nfsync = on",
            self.port,
            self.sockets.display()
        )
        .unwrap();
    }

    /// `stela run --durable PGWAL --level LEVEL -- runuser -u postgres -- pg_ctl start -w`, in
    /// the background (`stela run` stays until the server exits); returns once PostgreSQL
    /// answers, retrying while a killed server's last processes still hold its memory.
    fn start(&self, daemon: &Daemon, level: &str) -> Child {
        let log = self.sockets.join("postgres.log");
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let mut run = Command::new(STELA)
                .args(run_args(daemon, self.wal.to_str().unwrap(), level, "1000"))
                .args(["runuser", "-u", "postgres", "--"])
                .arg(self.bin.join("pg_ctl"))
                .args([
                    "-D",
                    self.data.to_str().unwrap(),
                    "-l",
                    log.to_str().unwrap(),
                ])
                .args(["-w", "-t", "60", "start"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .unwrap();
            loop {
                if self.answers() {
                    return run;
                }
                if let Some(status) = run.try_wait().unwrap() {
                    assert!(
                        Instant::now() < deadline,
                        "PostgreSQL did not start under stela run ({status}): {}",
                        fs::read_to_string(&log).unwrap_or_default()
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

    fn answers(&self) -> bool {
        as_postgres(
            &self.bin.join("pg_isready"),
            &[
                "-h",
                self.sockets.to_str().unwrap(),
                "-p",
                &self.port.to_string(),
            ],
        )
        .status
        .success()
    }

    /// SIGKILL of the postmaster's process group (every backend at once), as a crash would.
    fn kill(&self) {
        let pid = fs::read_to_string(self.data.join("postmaster.pid")).unwrap_or_default();
        if let Some(pid) = pid.lines().next() {
            let group = format!("-{pid}");
            let killed = Command::new("kill").args(["-KILL", "--", &group]).status();
            if !killed.is_ok_and(|s| s.success()) {
                let _ = Command::new("kill").args(["-KILL", pid]).status();
            }
        }
    }

    fn stop(&self) {
        let _ = as_postgres(
            &self.bin.join("pg_ctl"),
            &[
                "-D",
                self.data.to_str().unwrap(),
                "-m",
                "fast",
                "-w",
                "stop",
            ],
        );
    }

    fn psql(&self, sql: &str) -> String {
        let out = as_postgres(
            &self.bin.join("psql"),
            &[
                "-h",
                self.sockets.to_str().unwrap(),
                "-p",
                &self.port.to_string(),
                "-d",
                "postgres",
                "-tAc",
                sql,
            ],
        );
        assert!(
            out.status.success(),
            "psql {sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// A psql session inserting numbered rows, one transaction each; the receiver gets each
    /// number once its commit returned.
    fn inserting(&self, from: u64) -> (Child, std::sync::mpsc::Receiver<u64>) {
        let mut child = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join("psql"))
            .args([
                "-h",
                self.sockets.to_str().unwrap(),
                "-p",
                &self.port.to_string(),
            ])
            .args(["-d", "postgres", "-tA", "-v", "ON_ERROR_STOP=1"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for n in from.. {
                let sql = format!("INSERT INTO t VALUES ({n}, repeat('x', 200)) RETURNING n;");
                if writeln!(stdin, "{sql}").is_err() {
                    break;
                }
            }
        });
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Ok(n) = line.trim().parse::<u64>() {
                    if tx.send(n).is_err() {
                        break;
                    }
                }
            }
        });
        (child, rx)
    }
}

/// The last LSN of the log `stela run` uses for `dir` by default (0 if it has none yet).
fn log_end(daemon: &Daemon, dir: &Path) -> u64 {
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
    match stela_client::Wal::<stela_run::RunRecord>::open(
        daemon.socket(),
        &format!("run-{name}"),
        options,
    ) {
        Ok(log) => log.positions().unwrap().last_lsn,
        Err(_) => 0,
    }
}

/// What one crash round kills.
#[derive(Clone, Copy, Debug)]
enum Crash {
    /// SIGKILL of PostgreSQL alone.
    Postgres,
    /// SIGKILL of PostgreSQL and the daemon.
    PostgresAndDaemon,
    /// SIGKILL of the daemon alone: PostgreSQL's next WAL write or fsync fails (it PANICs and
    /// restarts itself, or stops); the daemon is restarted at once.
    Daemon,
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
    pg.initdb();
    let mut run = pg.start(daemon.as_ref().unwrap(), level);
    pg.psql("CREATE EXTENSION IF NOT EXISTS amcheck");
    pg.psql("CREATE TABLE t (n bigint PRIMARY KEY, pad text)");
    let before = log_end(daemon.as_ref().unwrap(), &pg.wal);
    let mut committed = 0u64;
    for (round, &crash) in crashes.iter().enumerate() {
        let (mut psql, acks) = pg.inserting(committed + 1);
        let target = committed + 300;
        let deadline = Instant::now() + Duration::from_secs(90);
        while committed < target {
            match acks.recv_timeout(Duration::from_millis(200)) {
                Ok(n) => committed = n,
                Err(_) => assert!(
                    Instant::now() < deadline,
                    "round {round} ({crash:?}): PostgreSQL stopped committing"
                ),
            }
        }
        if round == 0 {
            assert!(
                log_end(daemon.as_ref().unwrap(), &pg.wal) > before,
                "PostgreSQL's WAL writes did not reach the daemon (is the preload library \
                 loaded? readable by the postgres user?)"
            );
        }
        match crash {
            Crash::Postgres => pg.kill(),
            Crash::PostgresAndDaemon => {
                pg.kill();
                daemon.take().unwrap().kill();
            }
            Crash::Daemon => daemon.take().unwrap().kill(),
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
        run = pg.start(daemon.as_ref().unwrap(), level);
        let count: u64 = pg.psql("SELECT count(*) FROM t").parse().unwrap();
        let max: u64 = pg
            .psql("SELECT coalesce(max(n), 0) FROM t")
            .parse()
            .unwrap();
        assert!(
            max >= committed,
            "round {round} ({crash:?}): commit {committed} acknowledged, max is {max}"
        );
        assert_eq!(
            count, max,
            "round {round} ({crash:?}): rows missing below {max}"
        );
        pg.psql("SELECT bt_index_check('t_pkey', true)");
        committed = max;
    }
    pg.stop();
    let _ = run.wait();
}

/// At `buffered`: PostgreSQL killed alone, twice.
#[test]
fn postgres_under_stela_run_at_buffered_keeps_every_commit_across_its_kills() {
    postgres_survives("buffered", &[Crash::Postgres, Crash::Postgres], 55_881);
}

/// At `disk`: PostgreSQL killed with the daemon, then the daemon alone.
#[test]
fn postgres_under_stela_run_at_disk_keeps_every_commit_across_kills_of_the_daemon() {
    postgres_survives("disk", &[Crash::PostgresAndDaemon, Crash::Daemon], 55_882);
}

/// The rounds: SIGKILL of PostgreSQL, of the daemon, of both, ten times each.
#[test]
#[ignore = "30 PostgreSQL crash rounds, several minutes"]
fn postgres_under_stela_run_survives_30_kills() {
    let mut crashes = Vec::new();
    for _ in 0..10 {
        crashes.extend([Crash::Postgres, Crash::Daemon, Crash::PostgresAndDaemon]);
    }
    postgres_survives("disk", &crashes, 55_883);
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
    let setup = format!(
        "PRAGMA journal_mode={journal}; PRAGMA synchronous=FULL; \
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
    sqlite_kill_rounds("WAL");
}

/// The same in rollback-journal (DELETE) mode. Known to fail: a clean-clone CI run lost one
/// acknowledged `disk` commit after a kill of the shell and the daemon ("DELETE round 1: commit
/// 401 acknowledged, max is 400"; it passed in other runs). Suspected: the replay brings back
/// the deleted journal's data, so SQLite finds a hot journal and rolls the last commit back.
/// docs/POSTGRES.md says rollback-journal mode is not supported under `stela run` until this
/// passes.
#[test]
#[ignore = "known bug: an acknowledged commit lost in rollback-journal mode (see the doc comment)"]
fn sqlite_in_rollback_journal_mode_under_stela_run_keeps_every_commit_across_kills() {
    sqlite_kill_rounds("DELETE");
}

fn sqlite_kill_rounds(journal: &str) {
    build_preload();
    {
        let tmp = tempfile::tempdir().unwrap();
        let daemon_dir = tmp.path().join("daemon");
        let mut daemon = Some(Daemon::start(&daemon_dir, &[]));
        let data = tmp.path().join("data");
        fs::create_dir(&data).unwrap();
        let db = data.join("test.db");
        let mut committed = 0;
        for (round, kill_daemon) in [false, true].into_iter().enumerate() {
            let (mut shell, acks) =
                sqlite_inserting(daemon.as_ref().unwrap(), &db, journal, committed + 1);
            let deadline = Instant::now() + Duration::from_secs(60);
            while committed < (round as u64 + 1) * 200 {
                match acks.recv_timeout(Duration::from_millis(200)) {
                    Ok(n) => committed = n,
                    Err(_) => assert!(
                        Instant::now() < deadline,
                        "{journal}: sqlite3 stopped committing"
                    ),
                }
            }
            let group = format!("-{}", shell.id());
            Command::new("kill")
                .args(["-KILL", "--", &group])
                .status()
                .unwrap();
            if kill_daemon {
                daemon.take().unwrap().kill();
                daemon = Some(Daemon::start(&daemon_dir, &[]));
            }
            let _ = shell.wait();
            while let Ok(n) = acks.try_recv() {
                committed = n;
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
            assert_eq!(lines.next(), Some("ok"), "{journal} round {round}: {text}");
            let (count, max) = lines.next().unwrap().split_once('|').unwrap();
            let (count, max): (u64, u64) = (count.parse().unwrap(), max.parse().unwrap());
            assert!(
                max >= committed,
                "{journal} round {round}: commit {committed} acknowledged, max is {max}"
            );
            assert_eq!(
                count, max,
                "{journal} round {round}: rows missing below {max}"
            );
            committed = max;
        }
    }
}
