//! What the benchmarks that build their own network share (`stela-bench replicated`,
//! `stela-bench failover`): running `ip` and `tc`, a network namespace deleted when dropped,
//! child processes started inside one and killed when dropped, the `stela` binary next to this
//! one, and waiting for something to come up. Everything here needs root.
//!
//! Ownership: a [`Namespace`] deletes only the namespace it created (deleting it also deletes
//! every interface inside, and the veth peers of those interfaces wherever they are), so a run
//! never touches an interface or address it did not make.

use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Runs `program args` to completion; an error carries its stderr.
pub fn run(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let output = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("run {program}"))?;
    if !output.status.success() {
        bail!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// Runs `ip args` (in this namespace).
pub fn ip(args: &[&str]) -> anyhow::Result<()> {
    run("ip", args)
}

/// The standard output of `ip args`, as text.
pub fn ip_output(args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new("ip").args(args).output().context("run ip")?;
    if !output.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// A network namespace made by this process, deleted when dropped. Processes still inside keep
/// it alive until they exit, so drop their [`Killed`] guards first.
pub struct Namespace {
    name: String,
}

impl Namespace {
    /// `ip netns add name`, with its loopback up.
    ///
    /// # Errors
    /// Not root, or the name is taken (another run of the same pid, left behind).
    pub fn create(name: &str) -> anyhow::Result<Namespace> {
        ip(&["netns", "add", name])
            .with_context(|| format!("creating the network namespace {name} (needs root)"))?;
        // From here on the namespace is deleted on failure.
        let namespace = Namespace {
            name: name.to_owned(),
        };
        namespace.ip(&["link", "set", "lo", "up"])?;
        Ok(namespace)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ip args` inside the namespace.
    pub fn ip(&self, args: &[&str]) -> anyhow::Result<()> {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// `tc args` inside the namespace.
    pub fn tc(&self, args: &[&str]) -> anyhow::Result<()> {
        let mut all = vec!["netns", "exec", self.name.as_str(), "tc"];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// A command running `program args` inside the namespace. `ip netns exec` execs the program
    /// in place (no fork), so the child's pid is the program's own and signals reach it.
    pub fn command(&self, program: &Path, args: &[String]) -> Command {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.name])
            .arg(program)
            .args(args);
        command
    }

    /// Starts `program args` inside the namespace, its stdout and stderr appended to `log` (a
    /// restarted process keeps adding to the same file).
    pub fn spawn(&self, program: &Path, args: &[String], log: &Path) -> anyhow::Result<Child> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("open {}", log.display()))?;
        self.command(program, args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(out.try_clone()?))
            .stderr(Stdio::from(out))
            .spawn()
            .context("ip netns exec")
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// Moves the calling thread (only it) into the network namespace `name`, made by `ip netns
/// add`: sockets it opens from then on are the namespace's.
///
/// # Errors
/// No such namespace, or not root.
pub fn enter_on_this_thread(name: &str) -> anyhow::Result<()> {
    let path = format!("/run/netns/{name}");
    let file = std::fs::File::open(&path).with_context(|| format!("open {path}"))?;
    rustix::thread::move_into_link_name_space(
        std::os::fd::AsFd::as_fd(&file),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )
    .with_context(|| format!("enter the network namespace {name} (needs root)"))
}

/// A child process killed (SIGKILL) and reaped when dropped.
pub struct Killed(pub Child);

impl Killed {
    pub fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The binary `name` next to this one (`stela` beside `stela-bench` in `target/release`).
pub fn sibling(name: &str) -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe()?;
    let path = me.with_file_name(name);
    if !path.exists() {
        bail!(
            "{} not found next to {} (build it: cargo build -p stela, with --release for a release stela-bench)",
            path.display(),
            me.display()
        );
    }
    Ok(path)
}

/// Set by SIGINT or SIGTERM once [`stop_on_signals`] ran: the waits here then fail, so a run
/// unwinds and its guards remove what it built.
fn interrupted_flag() -> &'static Arc<AtomicBool> {
    static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();
    FLAG.get_or_init(|| Arc::new(AtomicBool::new(false)))
}

/// Makes SIGINT and SIGTERM set a flag instead of ending the process, so that a run that builds
/// namespaces is interrupted at its next wait and removes them on the way out (a signal's
/// default action would skip every destructor).
pub fn stop_on_signals() -> anyhow::Result<()> {
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(interrupted_flag()))
            .context("install a signal handler")?;
    }
    Ok(())
}

/// Fails if the run was interrupted (see [`stop_on_signals`]).
pub fn check_interrupted() -> anyhow::Result<()> {
    if interrupted_flag().load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(())
}

/// Sleeps `duration`, in short steps so an interruption is noticed.
pub fn pause(duration: Duration) -> anyhow::Result<()> {
    let end = Instant::now() + duration;
    loop {
        check_interrupted()?;
        let now = Instant::now();
        if now >= end {
            return Ok(());
        }
        std::thread::sleep((end - now).min(Duration::from_millis(20)));
    }
}

/// Waits up to 30 s for `ready`, checking every 20 ms.
pub fn wait_for(what: &str, ready: impl FnMut() -> bool) -> anyhow::Result<()> {
    wait_within(what, Duration::from_secs(30), ready)
}

/// Waits up to `within` for `ready`, checking every 20 ms.
///
/// # Errors
/// `ready` never held, or the run was interrupted.
pub fn wait_within(
    what: &str,
    within: Duration,
    ready: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    if !poll_within(within, ready)? {
        bail!("gave up waiting for {what} after {within:?}");
    }
    Ok(())
}

/// Polls `ready` every 20 ms for up to `within`: whether it held.
///
/// # Errors
/// Only an interruption.
pub fn poll_within(within: Duration, mut ready: impl FnMut() -> bool) -> anyhow::Result<bool> {
    let deadline = Instant::now() + within;
    loop {
        if ready() {
            return Ok(true);
        }
        check_interrupted()?;
        if Instant::now() > deadline {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
