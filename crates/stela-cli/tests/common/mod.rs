//! What the black-box tests of the `stela` binary share: running it, reading its output, and
//! a `stela serve` daemon process to start, signal and kill.
#![allow(dead_code)] // each test binary uses its own part

pub mod cluster;
pub mod postgres;
pub mod raw;

pub mod records;

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const STELA: &str = env!("CARGO_BIN_EXE_stela");

/// Runs a `stela` tool command; fails the test if it takes over a minute (a daemon that never
/// answers must fail the test, not hang it).
pub fn stela(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_stela"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run stela");
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stdout.read_to_end(&mut bytes);
        bytes
    });
    let err = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stderr.read_to_end(&mut bytes);
        bytes
    });
    let Some(status) = exit_within(&mut child, Duration::from_secs(60)) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("`stela {}` did not finish within a minute", args.join(" "));
    };
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// Waits up to `limit` for `child` to exit; `None` if it is still running then (the caller
/// decides what to kill and clean up before failing the test).
pub fn exit_within(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A `stela serve` process; killed if still running when dropped.
pub struct Daemon {
    pub child: Child,
    dir: PathBuf,
    log: PathBuf,
}

impl Daemon {
    /// Starts `stela serve --dir DIR ARGS...` and waits until it answers on its socket.
    pub fn start(dir: &Path, args: &[&str]) -> Daemon {
        Daemon::start_with_file_limit(dir, args, None)
    }

    /// Like [`Daemon::start`], with the daemon's file limit (soft and hard) set to `limit`, so
    /// it cannot raise it.
    pub fn start_with_file_limit(dir: &Path, args: &[&str], limit: Option<u64>) -> Daemon {
        Daemon::spawn(dir, args, limit, true)
    }

    /// Like [`Daemon::start`], but the daemon measures the disk at start as it does by default
    /// (no `--assume-write-rate`).
    pub fn start_measuring(dir: &Path, args: &[&str]) -> Daemon {
        Daemon::spawn(dir, args, None, false)
    }

    fn spawn(dir: &Path, args: &[&str], limit: Option<u64>, assume_rate: bool) -> Daemon {
        static STARTS: AtomicU64 = AtomicU64::new(0);
        let n = STARTS.fetch_add(1, Ordering::SeqCst);
        // Next to the daemon's directory, in the test's temporary directory.
        let log = dir.with_file_name(format!("daemon-{n}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let mut command = Command::new(STELA);
        command.arg("serve").arg("--dir").arg(dir);
        if assume_rate && !args.contains(&"--assume-write-rate") {
            // No disk measurement at start: every start is quick.
            command.args(["--assume-write-rate", "500000000"]);
        }
        if let Some(limit) = limit {
            use std::os::unix::process::CommandExt;
            // SAFETY: runs in the forked child before exec; setrlimit is async-signal-safe and
            // touches no memory of the parent's.
            unsafe {
                command.pre_exec(move || {
                    let rlimit = libc::rlimit {
                        rlim_cur: limit,
                        rlim_max: limit,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &rlimit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = command
            .args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("spawn stela serve");
        let mut daemon = Daemon {
            child,
            dir: dir.to_owned(),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = daemon.child.try_wait().unwrap() {
                panic!(
                    "stela serve exited at start ({status}):\n{}",
                    daemon.output()
                );
            }
            if daemon.output().contains("listening on")
                && UnixStream::connect(daemon.socket()).is_ok()
            {
                return daemon;
            }
            assert!(
                Instant::now() < deadline,
                "stela serve did not start:\n{}",
                daemon.output()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("stela.sock")
    }

    pub fn dir_arg(&self) -> &str {
        self.dir.to_str().unwrap()
    }

    /// What the daemon printed (stdout and stderr).
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn assert_alive(&mut self, when: &str) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!("the daemon died {when} ({status}):\n{}", self.output());
        }
    }

    pub fn pid(&self) -> String {
        self.child.id().to_string()
    }

    /// SIGKILL; returns once the process is gone.
    pub fn kill(mut self) {
        self.assert_alive("before its SIGKILL");
        self.child.kill().expect("SIGKILL the daemon");
        let status = self.child.wait().unwrap();
        assert_eq!(status.signal(), Some(9), "{status}");
    }

    /// Sends `signal` with kill(1) and waits (at most 30 s) for the daemon to exit.
    pub fn signal_and_wait(&mut self, signal: &str) -> ExitStatus {
        let sent = Command::new("kill")
            .args([&format!("-{signal}"), &self.pid()])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -{signal} failed");
        match exit_within(&mut self.child, Duration::from_secs(30)) {
            Some(status) => status,
            None => panic!(
                "the daemon did not exit after SIG{signal}:\n{}",
                self.output()
            ),
        }
    }

    /// SIGTERM: the daemon must flush, say so and exit 0.
    pub fn terminate(mut self) {
        let status = self.signal_and_wait("TERM");
        let output = self.output();
        assert_eq!(
            status.code(),
            Some(0),
            "exit after SIGTERM: {status}\n{output}"
        );
        assert!(
            output.contains("every buffer written and synced; stopped"),
            "{output}"
        );
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Runs `promtool check metrics` on a scrape's body (the text after the HTTP headers); fails the
/// test on any complaint, and fails it if promtool cannot run (the README's `./test` installs it).
pub fn promtool_check(scrape: &str) {
    use std::io::Write;
    let body = scrape
        .split_once("\r\n\r\n")
        .map_or(scrape, |(_, body)| body);
    match Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(mut child) => {
            child
                .stdin
                .take()
                .unwrap()
                .write_all(body.as_bytes())
                .unwrap();
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "promtool check metrics: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Err(error) => panic!(
            "promtool cannot run ({error}): install Debian's prometheus package (./test does) \
             so that the scrape is linted"
        ),
    }
}
