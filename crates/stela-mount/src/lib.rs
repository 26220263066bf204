//! `stela mount`: a FUSE file system whose every mutation is a record in a log held by the
//! stela daemon, so an unmodified database on it gets the daemon's commits (fsync returns at
//! the log's level: `buffered`, `disk`, `replicated` or `all`).
//!
//! Modules: [`record`] (what is logged), [`tree`] (names and attributes, and the one replay
//! function), [`fs`] (the FUSE handlers: check, log, apply, answer), [`backing`] and
//! [`materialise`] (the files rebuilt from the log alone, in the background, with checkpoints
//! in the log). Starting a mount is log analysis only: read the backing snapshot, replay the
//! log's records after it into memory, and serve; file data not yet materialised is read from
//! those records. [`follow`] keeps a standby node's copy of the files current from the standby
//! daemon's copy of the log, so that the node mounts quickly after a promotion
//! ([`run_follower`]).

pub mod backing;
pub mod follow;
pub mod fs;
pub mod materialise;
pub mod mountpoint;
pub mod record;
pub mod tree;

use backing::Backing;
use fs::{MountHandle, MountSettings, StelaFs};
use materialise::{DaemonLog, Materialiser};
use record::FsRecord;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use stela_client::{Address, Durability, Lsn, Wal, WalOptions};

/// What a mount is of, and how it behaves.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// The daemon holding the log.
    pub address: Address,
    /// The log's name in the daemon (created if missing).
    pub log: String,
    /// Where the materialised files and the snapshot live.
    pub backing: PathBuf,
    /// What fsync waits for.
    pub level: Durability,
    /// Kernel request threads.
    pub threads: usize,
    /// Let every user reach the mount (PostgreSQL runs as its own user); needs root or
    /// `user_allow_other` in /etc/fuse.conf.
    pub allow_other: bool,
    /// Bytes of logged data not yet materialised above which writes wait.
    pub overlay_cap: u64,
    /// The kernel's writeback cache (see [`fs::MountSettings::writeback_cache`]).
    pub writeback_cache: bool,
}

impl MountOptions {
    pub fn new(address: Address, log: &str, backing: &Path) -> MountOptions {
        MountOptions {
            address,
            log: log.to_owned(),
            backing: backing.to_owned(),
            level: Durability::Disk,
            threads: 4,
            allow_other: false,
            overlay_cap: 256 << 20,
            writeback_cache: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("the log {log:?} in the daemon at {address}: {source}")]
    Log {
        log: String,
        address: String,
        source: Box<stela_client::Error>,
    },
    #[error("backing directory {dir}: {source}")]
    Backing {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "backing directory {dir} is at LSN {applied} but the log {log:?} {problem}; \
         the two do not belong together (wrong --backing, or the log was replaced)"
    )]
    Mismatch {
        dir: PathBuf,
        log: String,
        applied: u64,
        problem: String,
    },
    #[error("replaying the log: {0}")]
    Replay(#[source] fs::ReplayError),
    #[error("following the standby's copy of the log: {0}")]
    Follow(#[source] materialise::MaterialiseError),
    #[error("mounting {mountpoint}: {source}{hint}")]
    Fuse {
        mountpoint: PathBuf,
        source: std::io::Error,
        hint: &'static str,
    },
    #[error(transparent)]
    StaleMountPoint(mountpoint::StaleMount),
    #[error(
        "{mountpoint} is already a live {kind} mount; stop the process serving it (or \
         `fusermount3 -u {mountpoint}`) first"
    )]
    AlreadyMounted { mountpoint: PathBuf, kind: String },
}

/// A failure of fuser's mount, with a hint only where the cause is likely the set-up.
fn fuse_error(mountpoint: &Path, source: std::io::Error) -> MountError {
    let hint = if !Path::new("/dev/fuse").exists() {
        " (/dev/fuse is missing: load the fuse module, or give the container the device)"
    } else if matches!(
        source.kind(),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied
    ) {
        " (is fusermount3 installed (Debian: fuse3), and may this user mount?)"
    } else {
        ""
    };
    MountError::Fuse {
        mountpoint: mountpoint.to_owned(),
        source,
        hint,
    }
}

/// Refuses a mount point that is a live FUSE mount; detaches a dead one (left by a killed
/// mount) or says how to.
fn check_mountpoint(mountpoint: &Path) -> Result<(), MountError> {
    mountpoint::clear_stale(mountpoint).map_err(MountError::StaleMountPoint)?;
    match mountpoint::state(mountpoint) {
        mountpoint::PointState::Live(kind) => Err(MountError::AlreadyMounted {
            mountpoint: mountpoint.to_owned(),
            kind,
        }),
        _ => Ok(()),
    }
}

fn wal_options(level: Durability) -> WalOptions {
    WalOptions::default()
        .durability(level)
        .create_if_missing(true)
}

fn open_log(options: &MountOptions) -> Result<Wal<FsRecord>, MountError> {
    Wal::open(
        options.address.clone(),
        &options.log,
        wal_options(options.level),
    )
    .map_err(|source| MountError::Log {
        log: options.log.clone(),
        address: options.address.to_string(),
        source: Box::new(source),
    })
}

/// A file system ready to be mounted: log analysed, materialiser not yet started.
pub struct Prepared {
    fs: StelaFs,
    handle: MountHandle,
    materialiser: Materialiser<DaemonLog>,
    options: MountOptions,
}

/// Reads the backing snapshot and the log after it (log analysis) and builds the file
/// system's memory from them. Nothing is mounted yet.
pub fn prepare(options: &MountOptions) -> Result<Prepared, MountError> {
    let backing_error = |source| MountError::Backing {
        dir: options.backing.clone(),
        source,
    };
    // SAFETY: getuid/getgid cannot fail and touch no memory.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let (backing, tree) = Backing::open(&options.backing, uid, gid).map_err(backing_error)?;
    let backing = Arc::new(backing);
    let log = open_log(options)?;
    let log_error = |source| MountError::Log {
        log: options.log.clone(),
        address: options.address.to_string(),
        source: Box::new(source),
    };
    let positions = log.positions().map_err(log_error)?;
    let mismatch = |problem: String| MountError::Mismatch {
        dir: options.backing.clone(),
        log: options.log.clone(),
        applied: tree.applied,
        problem,
    };
    if positions.last_lsn < tree.applied {
        return Err(mismatch(format!("ends at LSN {}", positions.last_lsn)));
    }
    if positions.last_lsn > tree.applied && positions.first_lsn > tree.applied + 1 {
        return Err(mismatch(format!(
            "starts at LSN {} (records in between are gone)",
            positions.first_lsn
        )));
    }
    let mut replayed = Vec::new();
    if positions.last_lsn > tree.applied {
        for item in log
            .iter_from(Lsn::new(tree.applied + 1))
            .map_err(log_error)?
        {
            let (lsn, record) = item.map_err(log_error)?;
            replayed.push((lsn.get(), record));
        }
    }
    let materialiser = Materialiser::new(
        DaemonLog::new(
            open_log(options)?,
            options.level,
            &options.log,
            options.address.clone(),
        ),
        Arc::clone(&backing),
        tree.clone(),
    );
    let waiter_options = options.clone();
    let open_waiter = Box::new(move || {
        Wal::open(
            waiter_options.address.clone(),
            &waiter_options.log,
            wal_options(waiter_options.level),
        )
    });
    let settings = MountSettings {
        level: options.level,
        overlay_cap: options.overlay_cap,
        writeback_cache: options.writeback_cache,
    };
    let fs = StelaFs::new(tree, replayed, log, open_waiter, backing, settings)
        .map_err(MountError::Replay)?;
    let handle = fs.handle();
    Ok(Prepared {
        fs,
        handle,
        materialiser,
        options: options.clone(),
    })
}

fn fuse_config(options: &MountOptions) -> fuser::Config {
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName(format!("stela:{}", options.log)),
        fuser::MountOption::Subtype("stela".to_owned()),
        // The kernel checks permission bits against the attributes we report, as on a disk.
        fuser::MountOption::DefaultPermissions,
        fuser::MountOption::RW,
        fuser::MountOption::Dev,
        fuser::MountOption::Suid,
    ];
    if options.allow_other {
        config.acl = fuser::SessionACL::All;
    }
    config.n_threads = Some(options.threads.max(1));
    config.clone_fd = options.threads > 1;
    config
}

/// A running materialiser thread.
struct Background {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
    /// Closed when the thread ends.
    ended: mpsc::Receiver<()>,
}

fn start_materialiser(materialiser: Materialiser<DaemonLog>, handle: MountHandle) -> Background {
    let stop = Arc::new(AtomicBool::new(false));
    let stop_flag = Arc::clone(&stop);
    let (ended_tx, ended) = mpsc::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("stela-materialise".to_owned())
        .spawn(move || {
            let _ended = ended_tx;
            let progress_handle = handle.clone();
            let progress = move |applied| progress_handle.checkpointed(applied);
            if let Err(why) = materialiser.run(&stop_flag, &progress) {
                tracing::error!("stela mount: the materialiser stopped: {why}");
                handle.materialiser_failed(why.to_string());
            }
        })
        .expect("spawning the materialiser thread");
    Background {
        stop,
        thread,
        ended,
    }
}

/// How long a stopping mount lets the materialiser apply and checkpoint what is durable
/// before it exits without it (safe at any moment: the backing files are always a prefix of
/// the log, and the next mount replays the rest).
pub const MATERIALISER_GRACE: Duration = Duration::from_secs(5);
/// How long a stopping mount waits, after the mount point is detached, for the kernel to end
/// the session (it does once no file on the mount is open).
pub const SESSION_GRACE: Duration = Duration::from_secs(2);

impl Background {
    fn finish(self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.thread.join();
    }

    /// Like [`Background::finish`], but returns after `within` even if the thread is still
    /// applying (a large overlay on a slow disk); the process may then exit under it.
    fn finish_within(self, within: Duration) {
        self.stop.store(true, Ordering::Release);
        match self.ended.recv_timeout(within) {
            Err(mpsc::RecvTimeoutError::Timeout) => tracing::warn!(
                "stela mount: the materialiser had not finished within {within:?}; the next \
                 mount replays the rest of the log"
            ),
            _ => {
                let _ = self.thread.join();
            }
        }
    }
}

/// Asks a mount served by [`Prepared::run`] to stop (from a signal handler's thread).
#[derive(Clone)]
pub struct StopHandle(mpsc::Sender<Event>);

impl StopHandle {
    pub fn stop(&self) {
        let _ = self.0.send(Event::StopRequested);
    }
}

enum Event {
    SessionEnded(std::io::Result<()>),
    StopRequested,
}

impl Prepared {
    /// Mounts in the background; the returned handle unmounts.
    pub fn spawn(self, mountpoint: &Path) -> Result<Mounted, MountError> {
        check_mountpoint(mountpoint)?;
        let config = fuse_config(&self.options);
        let background = start_materialiser(self.materialiser, self.handle.clone());
        let session = fuser::Session::new(self.fs, mountpoint, &config)
            .and_then(fuser::Session::spawn)
            .map_err(|source| fuse_error(mountpoint, source));
        match session {
            Ok(session) => Ok(Mounted {
                session: Some(session),
                background: Some(background),
                handle: self.handle,
            }),
            Err(e) => {
                background.finish();
                Err(e)
            }
        }
    }

    /// Mounts and serves until the file system is unmounted from outside (`fusermount3 -u`)
    /// or `on_ready`'s [`StopHandle`] asks to stop. A stop ends within a bound, whatever
    /// holds the mount: the unmount is retried while busy for [`mountpoint::BUSY_RETRY`],
    /// then the file system is detached lazily; if files are still open on it after
    /// [`SESSION_GRACE`], this returns anyway (the process's exit then ends the session, and
    /// those files answer ENOTCONN, as after a killed mount: what they wrote is in the log).
    /// The materialiser gets [`MATERIALISER_GRACE`] for its last checkpoint.
    pub fn run(
        self,
        mountpoint: &Path,
        on_ready: impl FnOnce(StopHandle),
    ) -> Result<(), MountError> {
        check_mountpoint(mountpoint)?;
        let config = fuse_config(&self.options);
        let mut session = fuser::Session::new(self.fs, mountpoint, &config)
            .map_err(|source| fuse_error(mountpoint, source))?;
        let mut unmounter = session.unmount_callable();
        let (events, received) = mpsc::channel();
        let ended = events.clone();
        std::thread::Builder::new()
            .name("stela-session".to_owned())
            .spawn(move || {
                let _ = ended.send(Event::SessionEnded(session.run()));
            })
            .map_err(|source| fuse_error(mountpoint, source))?;
        on_ready(StopHandle(events));
        let background = start_materialiser(self.materialiser, self.handle.clone());
        let served = match received.recv() {
            Ok(Event::SessionEnded(served)) => served,
            Ok(Event::StopRequested) | Err(_) => {
                stop(mountpoint, &mut unmounter, &received, background);
                return Ok(());
            }
        };
        background.finish();
        served.map_err(|source| fuse_error(mountpoint, source))
    }
}

/// The stop sequence of [`Prepared::run`].
fn stop(
    mountpoint: &Path,
    unmounter: &mut fuser::SessionUnmounter,
    events: &mpsc::Receiver<Event>,
    background: Background,
) {
    let ended = std::cell::Cell::new(false);
    let session_ended = || {
        if !ended.get() {
            ended.set(matches!(events.try_recv(), Ok(Event::SessionEnded(_))));
        }
        ended.get()
    };
    // fuser's unmounter first (it knows whether its device is still mounted); it is spent by
    // one attempt, so refusals are retried by path.
    if let Err(e) = unmounter.unmount() {
        tracing::info!("stela mount: unmounting: {e}; retrying");
        let lazy = mountpoint::unmount_for_stop(mountpoint, &session_ended);
        if lazy {
            tracing::warn!(
                "stela mount: {} stayed busy for {:?}; detached it lazily",
                mountpoint.display(),
                mountpoint::BUSY_RETRY
            );
        }
    }
    let deadline = std::time::Instant::now() + SESSION_GRACE;
    while !session_ended() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if !session_ended() {
        tracing::warn!(
            "stela mount: files are still open on the detached mount {}; stopping anyway (they \
             answer ENOTCONN from now on; what was written to them is in the log)",
            mountpoint.display()
        );
    }
    background.finish_within(MATERIALISER_GRACE);
}

/// A mount served in the background.
pub struct Mounted {
    session: Option<fuser::BackgroundSession>,
    background: Option<Background>,
    handle: MountHandle,
}

impl Mounted {
    /// Why the mount stopped answering (fail-stop), if it did.
    pub fn failure(&self) -> Option<String> {
        self.handle.failure()
    }

    /// Unmounts, then lets the materialiser apply and checkpoint what is durable.
    pub fn unmount(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(session) = self.session.take() {
            if let Err(e) = session.umount_and_join() {
                tracing::warn!("stela mount: unmounting: {e}");
            }
        }
        if let Some(background) = self.background.take() {
            background.finish();
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Analyses the log and mounts in the background.
pub fn mount(mountpoint: &Path, options: &MountOptions) -> Result<Mounted, MountError> {
    prepare(options)?.spawn(mountpoint)
}

/// Keeps `backing` current from a standby daemon's copy of a mount's log (`log_dir`, the
/// standby's `DIR/logs/NAME`; `daemon` is that daemon, asked how far the copy agrees with its
/// primary) until `stop` is set; then applies what is readable, checkpoints
/// (the snapshot) and returns. `progress` is told each checkpoint's LSN. See [`follow`].
///
/// # Errors
/// The backing directory cannot be opened; a step of the materialiser fails (the message).
pub fn run_follower(
    log_dir: &Path,
    daemon: Address,
    backing: &Path,
    stop: &AtomicBool,
    progress: &dyn Fn(u64),
) -> Result<(), MountError> {
    // SAFETY: geteuid/getegid cannot fail and touch no memory.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let (opened, tree) =
        Backing::open(backing, uid, gid).map_err(|source| MountError::Backing {
            dir: backing.to_owned(),
            source,
        })?;
    let log = follow::MirroredLog::new(log_dir, daemon, backing);
    // Held before anything is read: from here on the standby never truncates its copy past
    // what this follower still needs.
    log.hold(tree.applied).map_err(MountError::Follow)?;
    let materialiser = Materialiser::new(log, Arc::new(opened), tree);
    materialiser.run(stop, progress).map_err(MountError::Follow)
}
