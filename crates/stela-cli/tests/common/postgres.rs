//! A PostgreSQL test cluster from Debian's packages, run as the postgres user (the tests run
//! as root): initdb with `pg_wal` where the test puts it, start, SIGKILL, stop, psql, a client
//! inserting numbered rows, and the check after a crash that every acknowledged row is there
//! and the primary key index is sound. Shared by the `stela run` and `stela mount` tests,
//! which differ only in how the server is started and what is killed.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

/// One cluster: its binaries, data directory, socket directory and port.
pub struct Postgres {
    pub bin: PathBuf,
    pub data: PathBuf,
    /// The socket directory, owned by postgres; the server's log is written here too.
    pub sockets: PathBuf,
    pub port: u16,
}

impl Drop for Postgres {
    /// A test that fails leaves no server running.
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.kill();
        }
    }
}

/// Runs `program ARGS` as the postgres user, its output collected.
pub fn as_postgres(program: &Path, args: &[&str]) -> std::process::Output {
    Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("runuser")
}

pub fn chown_postgres(path: &Path) {
    let status = Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success(), "chown postgres {}", path.display());
}

impl Postgres {
    /// The newest installed PostgreSQL, its data directory at `base/pgdata`; fails the test
    /// (saying why) without root or without PostgreSQL.
    pub fn new(base: &Path, port: u16) -> Postgres {
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
            sockets,
            port,
        }
    }

    /// The server's log file (in a directory the postgres user owns).
    pub fn log(&self) -> PathBuf {
        self.sockets.join("postgres.log")
    }

    /// initdb with `pg_wal` at `waldir` (which initdb makes, or takes empty and owned by
    /// postgres), this cluster's port and socket directory, synchronous commits with fsync,
    /// and `settings` (lines of postgresql.conf) after them.
    pub fn initdb(&self, waldir: &Path, settings: &str) {
        fs::create_dir_all(&self.data).unwrap();
        chown_postgres(&self.data);
        let out = as_postgres(
            &self.bin.join("initdb"),
            &[
                "-D",
                self.data.to_str().unwrap(),
                "--waldir",
                waldir.to_str().unwrap(),
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
             synchronous_commit = on\nfsync = on\n{settings}",
            self.port,
            self.sockets.display()
        )
        .unwrap();
    }

    /// The arguments of `pg_ctl start` for this cluster (waiting up to `timeout_s`).
    pub fn start_args(&self, timeout_s: u32) -> Vec<String> {
        let data = self.data.to_str().unwrap().to_owned();
        let log = self.log().to_str().unwrap().to_owned();
        let timeout = timeout_s.to_string();
        ["-D", &data, "-l", &log, "-w", "-t", &timeout, "start"]
            .map(str::to_owned)
            .to_vec()
    }

    /// Starts the server with pg_ctl (crash recovery included), retrying while a killed
    /// one's last processes still hold its shared memory.
    pub fn start(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let args = self.start_args(30);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = as_postgres(&self.bin.join("pg_ctl"), &args);
            if out.status.success() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "PostgreSQL did not start: {}",
                fs::read_to_string(self.log()).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Whether the server accepts connections.
    pub fn answers(&self) -> bool {
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

    /// SIGKILL of the postmaster and every backend at once: the postmaster leads its own
    /// process group (it calls setsid at start), so the group is killed, as a crash would.
    pub fn kill(&self) {
        let pid = fs::read_to_string(self.data.join("postmaster.pid")).unwrap_or_default();
        if let Some(pid) = pid.lines().next() {
            let group = format!("-{pid}");
            let killed = Command::new("kill").args(["-KILL", "--", &group]).status();
            if !killed.is_ok_and(|s| s.success()) {
                let _ = Command::new("kill").args(["-KILL", pid]).status();
            }
        }
        std::thread::sleep(Duration::from_millis(300));
    }

    pub fn stop(&self) {
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

    /// One statement through psql; its output, trimmed. Fails the test if psql does.
    pub fn psql(&self, sql: &str) -> String {
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

    /// The table the crash rounds insert into, and amcheck for the check after each.
    pub fn create_table(&self) {
        self.psql("CREATE EXTENSION IF NOT EXISTS amcheck");
        self.psql("CREATE TABLE t (n bigint PRIMARY KEY, pad text)");
    }

    /// A psql session inserting numbered rows into `t` from `from`, one transaction each;
    /// the receiver gets each number once its commit returned.
    pub fn inserting(&self, from: u64) -> (Child, Receiver<u64>) {
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

    /// After a crash and restart: every row up to `committed` (the last acknowledged) is
    /// there with no gap, and `bt_index_check` passes on the primary key index (heapallindexed:
    /// every row is in it). Returns the highest row, the next round's acknowledged mark.
    pub fn assert_kept(&self, committed: u64, round: &str) -> u64 {
        let count: u64 = self.psql("SELECT count(*) FROM t").parse().unwrap();
        let max: u64 = self
            .psql("SELECT coalesce(max(n), 0) FROM t")
            .parse()
            .unwrap();
        assert!(
            max >= committed,
            "{round}: commit {committed} acknowledged, max is {max}"
        );
        assert_eq!(count, max, "{round}: rows missing below {max}");
        self.psql("SELECT bt_index_check('t_pkey', true)");
        max
    }
}

/// Waits for `acks` to reach `target`; fails the test if it takes over 90 s. Returns the
/// last number acknowledged.
pub fn commits_until(acks: &Receiver<u64>, mut committed: u64, target: u64, round: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(90);
    while committed < target {
        match acks.recv_timeout(Duration::from_millis(200)) {
            Ok(n) => committed = n,
            Err(_) => assert!(
                Instant::now() < deadline,
                "{round}: PostgreSQL stopped committing"
            ),
        }
    }
    committed
}
