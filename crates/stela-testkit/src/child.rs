//! Crash tests' child processes: the test binary re-run as one of its own tests
//! (`--exact NAME`), so that a test has a real process to SIGKILL and sees every line it printed
//! before it died (its acknowledgements). The parent reads the child's stdout line by line on a
//! thread, keeps its stderr for the failure message, and checks that the child really died of
//! the SIGKILL rather than ending on its own.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The command that re-runs this test binary as its test `test` alone, printing what the test
/// prints (stdin null, stdout and stderr piped). Add the child's environment, then
/// [`SelfChild::spawn`].
pub fn self_command(test: &str) -> Command {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut command = Command::new(exe);
    command
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// A running child whose stdout lines the parent reads as they come.
pub struct SelfChild {
    what: String,
    child: Child,
    lines: mpsc::Receiver<String>,
    reader: JoinHandle<()>,
    errors: JoinHandle<String>,
    seen: Vec<String>,
}

impl SelfChild {
    /// Starts `command` (from [`self_command`]); `what` names the child in failure messages.
    ///
    /// # Panics
    /// The child cannot be started.
    pub fn spawn(what: impl Into<String>, mut command: Command) -> SelfChild {
        let what = what.into();
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("spawn the {what}: {e}"));
        let (lines_tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().expect("the child's stdout is piped");
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if lines_tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut stderr = child.stderr.take().expect("the child's stderr is piped");
        let errors = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        SelfChild {
            what,
            child,
            lines,
            reader,
            errors,
            seen: Vec::new(),
        }
    }

    /// Waits for a line containing `marker` (the test harness's own words may precede it on
    /// that line).
    ///
    /// # Panics
    /// The child ends, or `within` passes, first: the child is killed and the panic shows what
    /// it printed.
    pub fn wait_for(&mut self, marker: &str, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let found = line.contains(marker);
                    self.seen.push(line);
                    if found {
                        return;
                    }
                }
                Err(_) => {
                    let _ = self.child.kill();
                    let status = self.child.wait().expect("reap the child");
                    let errors =
                        std::mem::replace(&mut self.errors, std::thread::spawn(String::new));
                    panic!(
                        "the {} never said {marker} ({status})\nstdout:\n{}\nstderr:\n{}",
                        self.what,
                        self.seen.join("\n"),
                        errors.join().unwrap_or_default()
                    );
                }
            }
        }
    }

    /// SIGKILLs the child and returns every line it printed.
    ///
    /// # Panics
    /// The child had already ended on its own (its lines and stderr are shown).
    pub fn kill(mut self) -> Vec<String> {
        // Fails only if the child was already reaped, which only `kill` and `wait_for` do.
        self.child.kill().expect("SIGKILL the child");
        let status = self.child.wait().expect("reap the child");
        self.reader.join().expect("the stdout reader");
        self.seen.extend(self.lines.try_iter());
        let errors = self.errors.join().unwrap_or_default();
        assert_eq!(
            status.signal(),
            Some(9),
            "the {} ended on its own ({status}) instead of being killed\nstdout:\n{}\n\
             stderr:\n{errors}",
            self.what,
            self.seen.join("\n")
        );
        self.seen
    }
}

/// The numbers after `tag` on each line that has it (`"ACK 5 0 1 7"` -> `[5, 0, 1, 7]`): the
/// acknowledgements a child printed, for the test to turn into its own keys.
///
/// # Panics
/// A number does not parse (the child printed something the test did not mean).
pub fn tagged_numbers(lines: &[String], tag: &str) -> Vec<Vec<u64>> {
    lines
        .iter()
        .filter_map(|line| Some(&line[line.find(tag)? + tag.len()..]))
        .map(|rest| {
            rest.split_whitespace()
                .map(|x| {
                    x.parse()
                        .unwrap_or_else(|e| panic!("{tag:?} line {rest:?}: {e}"))
                })
                .collect()
        })
        .collect()
}
