//! `stela-bench hostile`: issue 54's attacks on a real `stela serve`, each run for a while
//! beside honest `disk` committers, and the same run without the attack, sides taking turns.
//!
//! For each attack and side it reports: the honest clients' commits/s and their commit p99,
//! `stela status` p99 (a fresh administrator connection on the Unix socket every 100 ms: connect,
//! Hello, Status), the daemon's peak RSS and threads (from /proc), for `repl-flood` the
//! standby's, and the acknowledged records lost: after the run the daemon is SIGKILLed and
//! started again, and every record an honest client was answered `Ok` for at `disk` must read
//! back, with its contents.
//!
//! The attacks (issue 54's findings): `partial` (64 TCP connections each announcing the largest
//! frame and sending most of its body), `never-reading` (connections pipelining 16 MiB reads of
//! a 20 MB log with a small receive buffer and never reading), `handshake-flood` (connections
//! that send nothing, as fast as they can be made), `repl-flood` (a standby's replication port:
//! 30 connections announcing a 64 MiB frame and 300 idle ones; the measured daemon is then its
//! primary, shipping to it), `slow-metrics` (clients sending one byte of a `/metrics` request
//! every 1.5 s), and `buffered-writer` (one client appending at `buffered` at a set rate:
//! the disk-fairness line).

use crate::netns::{sibling, Killed};
use anyhow::{bail, Context};
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use stela_client::{Address, Connection, Durability, Wal, WalOptions};
use stela_proto::{Request, RequestBody, Role};

#[derive(clap::Args, Debug, Clone)]
pub struct HostileArgs {
    /// Attacks to run, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "partial,never-reading,handshake-flood,repl-flood,slow-metrics,buffered-writer"
    )]
    pub attacks: Vec<Attack>,
    /// Seconds each side of each attack runs.
    #[arg(long, default_value_t = 60)]
    pub duration: u64,
    /// Honest `disk` committers.
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// The `buffered-writer` attack's rate, MB/s.
    #[arg(long, default_value_t = 100)]
    pub writer_mb_per_s: u64,
    /// Work directory (default: a temporary one).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// First of the TCP ports used (client, metrics, replication).
    #[arg(long, default_value_t = 27400)]
    pub base_port: u16,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Attack {
    Partial,
    NeverReading,
    HandshakeFlood,
    ReplFlood,
    SlowMetrics,
    BufferedWriter,
}

impl Attack {
    fn name(self) -> &'static str {
        match self {
            Attack::Partial => "partial",
            Attack::NeverReading => "never-reading",
            Attack::HandshakeFlood => "handshake-flood",
            Attack::ReplFlood => "repl-flood",
            Attack::SlowMetrics => "slow-metrics",
            Attack::BufferedWriter => "buffered-writer",
        }
    }
}

/// One side of one attack, measured.
#[derive(Debug, Default)]
struct Side {
    commits: u64,
    seconds: f64,
    commit_p99_ms: f64,
    status_p99_ms: f64,
    status_max_ms: f64,
    status_failed: u64,
    rss_peak_mib: f64,
    threads_peak: u64,
    standby_rss_peak_mib: f64,
    standby_threads_peak: u64,
    lost: u64,
    acked: u64,
}

/// Runs every attack's two sides and prints a table.
pub fn run(args: &HostileArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let stela = sibling("stela")?;
    let temp = tempfile::tempdir()?;
    let base = args.dir.clone().unwrap_or_else(|| temp.path().to_owned());
    writeln!(
        out,
        "# stela-bench hostile: {} s a side, {} honest disk clients (100 B records); load {}",
        args.duration,
        args.clients,
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    )?;
    writeln!(
        out,
        "{:<16} {:<8} {:>9} {:>10} {:>10} {:>10} {:>8} {:>8} {:>9} {:>8} {:>6} {:>8}",
        "attack",
        "side",
        "commits/s",
        "commit_p99",
        "status_p99",
        "status_max",
        "rss_MiB",
        "threads",
        "sb_rss_MiB",
        "sb_thr",
        "lost",
        "acked"
    )?;
    for &attack in &args.attacks {
        for attacked in [false, true] {
            let dir = base.join(format!("{}-{}", attack.name(), attacked));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir)?;
            let side = run_side(args, &stela, &dir, attack, attacked).with_context(|| {
                format!(
                    "{} ({})",
                    attack.name(),
                    if attacked { "attack" } else { "alone" }
                )
            })?;
            writeln!(out, "{:<16} {:<8} {:>9.0} {:>10.2} {:>10.2} {:>10.2} {:>8.1} {:>8} {:>9.1} {:>8} {:>6} {:>8}",
                attack.name(), if attacked { "attack" } else { "alone" },
                side.commits as f64 / side.seconds, side.commit_p99_ms, side.status_p99_ms, side.status_max_ms,
                side.rss_peak_mib, side.threads_peak, side.standby_rss_peak_mib, side.standby_threads_peak,
                side.lost, side.acked)?;
            if side.status_failed > 0 {
                writeln!(out, "  ({} status requests failed)", side.status_failed)?;
            }
            out.flush()?;
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    Ok(())
}

struct Ports {
    tcp: SocketAddr,
    metrics: SocketAddr,
    repl: SocketAddr,
}

fn spawn(stela: &Path, args: &[String], log: &Path) -> anyhow::Result<Killed> {
    let file = std::fs::File::create(log)?;
    let child = Command::new(stela)
        .args(args)
        .stdout(Stdio::from(file.try_clone()?))
        .stderr(Stdio::from(file))
        .spawn()
        .context("starting stela serve")?;
    Ok(Killed(child))
}

fn wait_until(what: &str, mut ready: impl FnMut() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready() {
        if Instant::now() > deadline {
            bail!("{what} not ready within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn primary_args(dir: &Path, ports: &Ports, standby: bool) -> Vec<String> {
    let mut args: Vec<String> = ["serve", "--dir"].iter().map(|s| s.to_string()).collect();
    args.push(dir.join("primary").display().to_string());
    args.extend([
        "--tcp".to_owned(),
        ports.tcp.to_string(),
        "--tcp-insecure".to_owned(),
        "--metrics".to_owned(),
        ports.metrics.to_string(),
        "--assume-write-rate".to_owned(),
        "500MB".to_owned(),
    ]);
    if standby {
        args.extend(["--standby".to_owned(), ports.repl.to_string()]);
    }
    args
}

fn run_side(
    args: &HostileArgs,
    stela: &Path,
    dir: &Path,
    attack: Attack,
    attacked: bool,
) -> anyhow::Result<Side> {
    let p = args.base_port;
    let ports = Ports {
        tcp: SocketAddr::from(([127, 0, 0, 1], p)),
        metrics: SocketAddr::from(([127, 0, 0, 1], p + 1)),
        repl: SocketAddr::from(([127, 0, 0, 1], p + 2)),
    };
    let with_standby = attack == Attack::ReplFlood;
    let standby = if with_standby {
        let standby = spawn(
            stela,
            &[
                "serve".into(),
                "--dir".into(),
                dir.join("standby").display().to_string(),
                "--repl-listen".into(),
                ports.repl.to_string(),
                "--assume-write-rate".into(),
                "500MB".into(),
                "--node".into(),
                "standby".into(),
            ],
            &dir.join("standby.log"),
        )?;
        wait_until("the standby", || TcpStream::connect(ports.repl).is_ok())?;
        Some(standby)
    } else {
        None
    };
    let socket = dir.join("primary").join("stela.sock");
    let primary_argv = primary_args(dir, &ports, with_standby);
    let primary = spawn(stela, &primary_argv, &dir.join("primary.log"))?;
    wait_until("the primary", || {
        std::os::unix::net::UnixStream::connect(&socket).is_ok()
    })?;
    if attack == Attack::NeverReading {
        preload(&socket, "big", 20 << 20)?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let attackers: Vec<JoinHandle<()>> = if attacked {
        start_attack(attack, args, &ports, &socket, &stop)
    } else {
        Vec::new()
    };
    // Let the attack take hold before the honest side is measured.
    if attacked {
        std::thread::sleep(Duration::from_secs(2));
    }
    let honest = Honest::start(&socket, args.clients, &stop);
    let prober = Prober::start(&socket, &stop);
    let started = Instant::now();
    let (mut rss, mut threads, mut sb_rss, mut sb_threads) = (0u64, 0u64, 0u64, 0u64);
    while started.elapsed() < Duration::from_secs(args.duration) {
        let (r, t) = proc_usage(primary.id());
        rss = rss.max(r);
        threads = threads.max(t);
        if let Some(standby) = &standby {
            let (r, t) = proc_usage(standby.id());
            sb_rss = sb_rss.max(r);
            sb_threads = sb_threads.max(t);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let seconds = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::SeqCst);
    let (acked, commit_latencies) = honest.finish();
    let status = prober.finish();
    for attacker in attackers {
        let _ = attacker.join();
    }
    // Every record answered Ok at disk must survive a SIGKILL of the daemon.
    drop(primary);
    std::thread::sleep(Duration::from_millis(200));
    let primary = spawn(stela, &primary_argv, &dir.join("primary-again.log"))?;
    wait_until("the restarted primary", || {
        std::os::unix::net::UnixStream::connect(&socket).is_ok()
    })?;
    let lost = count_lost(&socket, &acked)?;
    drop(primary);
    drop(standby);
    Ok(Side {
        commits: commit_latencies.len() as u64,
        seconds,
        commit_p99_ms: percentile(commit_latencies, 0.99),
        status_p99_ms: percentile(status.latencies.clone(), 0.99),
        status_max_ms: percentile(status.latencies, 1.0),
        status_failed: status.failed,
        rss_peak_mib: rss as f64 / 1024.0,
        threads_peak: threads,
        standby_rss_peak_mib: sb_rss as f64 / 1024.0,
        standby_threads_peak: sb_threads,
        lost,
        acked: acked.iter().map(|(_, n)| n).sum(),
    })
}

/// (VmRSS in KiB, threads) of process `pid`.
fn proc_usage(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("Threads:"))
}

fn percentile(mut values: Vec<f64>, q: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let index = ((values.len() as f64 * q).ceil() as usize).clamp(1, values.len()) - 1;
    values[index]
}

fn payload(client: usize, lsn: u64) -> Vec<u8> {
    let mut record = format!("honest {client} record {lsn} ").into_bytes();
    record.resize(100, b'.');
    record
}

/// Writes `bytes` of 256 KiB records to `log`.
fn preload(socket: &Path, log: &str, bytes: usize) -> anyhow::Result<()> {
    let wal: Wal<Vec<u8>> = Wal::open(socket, log, WalOptions::default())?;
    let record = vec![7u8; 256 << 10];
    for _ in 0..bytes / record.len() {
        let lsn = wal.append(&record)?;
        wal.commit_at(lsn, Durability::Buffered)?;
    }
    let last = wal.last_lsn()?;
    wal.commit_at(last, Durability::Disk)?;
    Ok(())
}

/// The honest `disk` committers: each appends a 100-byte record and commits it at `disk`.
struct Honest {
    threads: Vec<JoinHandle<(String, u64, Vec<f64>)>>,
}

impl Honest {
    fn start(socket: &Path, clients: usize, stop: &Arc<AtomicBool>) -> Honest {
        let threads = (0..clients)
            .map(|client| {
                let (socket, stop) = (socket.to_owned(), Arc::clone(stop));
                std::thread::spawn(move || {
                    let log = format!("honest-{client}");
                    let mut latencies = Vec::new();
                    let mut acked = 0;
                    let wal = match Wal::<Vec<u8>>::open(
                        socket.as_path(),
                        &log,
                        WalOptions::default().durability(Durability::Disk),
                    ) {
                        Ok(wal) => wal,
                        Err(error) => {
                            eprintln!("honest {client}: open: {error}");
                            return (log, 0, latencies);
                        }
                    };
                    while !stop.load(Ordering::Relaxed) {
                        let began = Instant::now();
                        let next = acked + 1;
                        match wal.append(&payload(client, next)).and_then(|lsn| {
                            wal.commit(lsn)?;
                            Ok(lsn)
                        }) {
                            Ok(lsn) if lsn.get() == next => {
                                acked = next;
                                latencies.push(began.elapsed().as_secs_f64() * 1e3);
                            }
                            Ok(lsn) => {
                                eprintln!(
                                    "honest {client}: LSN {} where {next} was expected",
                                    lsn.get()
                                );
                                break;
                            }
                            Err(error) => {
                                eprintln!("honest {client}: {error}");
                                break;
                            }
                        }
                    }
                    (log, acked, latencies)
                })
            })
            .collect();
        Honest { threads }
    }

    /// (log, last LSN acknowledged) of each client, and every commit's latency in ms.
    fn finish(self) -> (Vec<(String, u64)>, Vec<f64>) {
        let mut acked = Vec::new();
        let mut all = Vec::new();
        for thread in self.threads {
            if let Ok((log, last, latencies)) = thread.join() {
                acked.push((log, last));
                all.extend(latencies);
            }
        }
        (acked, all)
    }
}

/// Records of the honest logs acknowledged but missing or different after the restart.
fn count_lost(socket: &Path, acked: &[(String, u64)]) -> anyhow::Result<u64> {
    let mut lost = 0;
    for (client, (log, last)) in acked.iter().enumerate() {
        if *last == 0 {
            continue;
        }
        let wal: Wal<Vec<u8>> = Wal::open(socket, log, WalOptions::default())?;
        let mut found = 0;
        for record in wal.iter()? {
            let (lsn, bytes) = record?;
            if lsn.get() > *last {
                break;
            }
            if bytes == payload(client, lsn.get()) {
                found += 1;
            }
        }
        lost += last - found;
    }
    Ok(lost)
}

struct Status {
    latencies: Vec<f64>,
    failed: u64,
}

/// `stela status` as an operator's script runs it: every 100 ms, a fresh administrator
/// connection on the Unix socket asks Status.
struct Prober {
    thread: JoinHandle<Status>,
}

impl Prober {
    fn start(socket: &Path, stop: &Arc<AtomicBool>) -> Prober {
        let (address, stop) = (Address::Unix(socket.to_owned()), Arc::clone(stop));
        let thread = std::thread::spawn(move || {
            let mut status = Status {
                latencies: Vec::new(),
                failed: 0,
            };
            while !stop.load(Ordering::Relaxed) {
                let began = Instant::now();
                let answered = Connection::connect_admin(&address)
                    .and_then(|mut c| c.request(RequestBody::Status));
                let ms = began.elapsed().as_secs_f64() * 1e3;
                match answered {
                    Ok(_) => status.latencies.push(ms),
                    Err(_) => {
                        status.failed += 1;
                        status.latencies.push(ms.max(1e4));
                    }
                }
                std::thread::sleep(Duration::from_millis(100).saturating_sub(began.elapsed()));
            }
            status
        });
        Prober { thread }
    }

    fn finish(self) -> Status {
        self.thread.join().unwrap_or(Status {
            latencies: Vec::new(),
            failed: u64::MAX,
        })
    }
}

fn frame(body: &RequestBody, id: u64) -> Vec<u8> {
    let mut out = Vec::new();
    stela_proto::frame::encode(
        &Request {
            id,
            body: body.clone(),
        },
        &mut out,
    )
    .expect("a request encodes");
    out
}

fn hello() -> Vec<u8> {
    frame(
        &RequestBody::Hello {
            version: stela_proto::PROTOCOL_VERSION,
            client: "hostile".into(),
            role: Role::Client,
            token: None,
        },
        1,
    )
}

/// The attack's threads; each runs until `stop`.
fn start_attack(
    attack: Attack,
    args: &HostileArgs,
    ports: &Ports,
    socket: &Path,
    stop: &Arc<AtomicBool>,
) -> Vec<JoinHandle<()>> {
    let stop = Arc::clone(stop);
    let (tcp, metrics, repl, socket) = (ports.tcp, ports.metrics, ports.repl, socket.to_owned());
    let rate = args.writer_mb_per_s;
    let one = move |body: Box<dyn FnOnce(Arc<AtomicBool>) + Send>| {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || body(stop))
    };
    match attack {
        Attack::Partial => vec![one(Box::new(move |stop| partial_frames(tcp, 64, &stop)))],
        Attack::NeverReading => vec![one(Box::new(move |stop| never_reading(&socket, 64, &stop)))],
        Attack::HandshakeFlood => (0..4)
            .map(|_| one(Box::new(move |stop| silent_flood(tcp, 1000, &stop))))
            .collect(),
        Attack::ReplFlood => vec![
            one(Box::new(move |stop| big_announcements(repl, 30, &stop))),
            one(Box::new(move |stop| silent_flood(repl, 300, &stop))),
        ],
        Attack::SlowMetrics => vec![one(Box::new(move |stop| slow_metrics(metrics, 8, &stop)))],
        Attack::BufferedWriter => vec![one(Box::new(move |stop| {
            buffered_writer(&socket, rate, &stop)
        }))],
    }
}

/// Connections that say Hello, then announce the largest frame and send most of its body.
fn partial_frames(tcp: SocketAddr, connections: usize, stop: &AtomicBool) {
    let body = vec![0u8; 1 << 20];
    let mut held = Vec::new();
    for _ in 0..connections {
        let Ok(mut stream) = TcpStream::connect(tcp) else {
            continue;
        };
        let _ = stream.set_write_timeout(Some(Duration::from_millis(200)));
        let max = stela_proto::frame::MAX_FRAME_BYTES as u32;
        let mut bytes = hello();
        bytes.extend_from_slice(&max.to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes());
        if stream.write_all(&bytes).is_ok() {
            held.push((stream, 0usize));
        }
    }
    let almost = stela_proto::frame::MAX_FRAME_BYTES - 4096;
    while !stop.load(Ordering::Relaxed) {
        for (stream, sent) in &mut held {
            if *sent < almost {
                let n = body.len().min(almost - *sent);
                if stream.write_all(&body[..n]).is_ok() {
                    *sent += n;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Unix-socket clients that open the 20 MB log and pipeline 16 MiB reads, never reading.
fn never_reading(socket: &Path, connections: usize, stop: &AtomicBool) {
    use std::os::fd::AsRawFd;
    let mut held = Vec::new();
    for _ in 0..connections {
        let Ok(mut stream) = std::os::unix::net::UnixStream::connect(socket) else {
            continue;
        };
        let small: libc::c_int = 4096;
        // SAFETY: setsockopt on a socket we own, with a c_int option value of the right size.
        unsafe {
            libc::setsockopt(
                stream.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                (&small as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
        let _ = stream.set_write_timeout(Some(Duration::from_millis(500)));
        let mut bytes = hello();
        bytes.extend(frame(
            &RequestBody::Open {
                log: "big".into(),
                codec: WalOptions::default().codec.name().to_owned(),
                type_tag: stela_format::default_type_tag::<Vec<u8>>(),
                create: false,
                durability: None,
                schema: None,
            },
            2,
        ));
        for id in 3..67 {
            bytes.extend(frame(
                &RequestBody::Read {
                    handle: 0,
                    from: 1,
                    max_records: 1 << 20,
                    max_bytes: 16 << 20,
                },
                id,
            ));
        }
        let _ = stream.write_all(&bytes);
        held.push(stream);
    }
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Connections that send nothing, made as fast as they can be, `hold` kept at a time.
fn silent_flood(addr: SocketAddr, hold: usize, stop: &AtomicBool) {
    let mut held = std::collections::VecDeque::new();
    while !stop.load(Ordering::Relaxed) {
        match TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            Ok(stream) => {
                held.push_back(stream);
                if held.len() > hold {
                    held.pop_front();
                }
            }
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}

/// Connections to a replication port announcing a 64 MiB first frame, sent slowly.
fn big_announcements(addr: SocketAddr, connections: usize, stop: &AtomicBool) {
    let chunk = vec![0u8; 64 << 10];
    let mut held = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        held.retain(|s: &TcpStream| s.peer_addr().is_ok());
        while held.len() < connections {
            let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200))
            else {
                break;
            };
            let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
            let mut header = (64u32 << 20).to_le_bytes().to_vec();
            header.extend_from_slice(&0u32.to_le_bytes());
            let _ = stream.write_all(&header);
            held.push(stream);
        }
        for stream in &mut held {
            let _ = (&*stream).write_all(&chunk);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `/metrics` clients that send one byte of a request every 1.5 s.
fn slow_metrics(addr: SocketAddr, connections: usize, stop: &AtomicBool) {
    let request = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ".to_vec();
    let mut held: Vec<(TcpStream, usize)> = (0..connections)
        .filter_map(|_| TcpStream::connect(addr).ok().map(|s| (s, 0)))
        .collect();
    while !stop.load(Ordering::Relaxed) {
        for (stream, sent) in &mut held {
            let byte = request.get(*sent).copied().unwrap_or(b'a');
            let _ = stream.write_all(&[byte]);
            *sent += 1;
        }
        for _ in 0..15 {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// One client appending 256 KiB records at `buffered`, at `mb_per_s`.
fn buffered_writer(socket: &Path, mb_per_s: u64, stop: &AtomicBool) {
    let Ok(wal) = Wal::<Vec<u8>>::open(
        socket,
        "heavy",
        WalOptions::default().durability(Durability::Buffered),
    ) else {
        return;
    };
    let record = vec![9u8; 256 << 10];
    let per_record = Duration::from_secs_f64(record.len() as f64 / (mb_per_s.max(1) as f64 * 1e6));
    let started = Instant::now();
    let mut n = 0u32;
    while !stop.load(Ordering::Relaxed) {
        if wal.append(&record).is_err() {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        n += 1;
        let due = per_record * n;
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            std::thread::sleep(wait);
        }
    }
}
