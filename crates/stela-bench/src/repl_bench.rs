//! `stela-bench replicated`: what commit protection costs. The same client load committed at
//! `buffered` and at `replicated` against a primary whose standby is across a veth link, with the
//! link's measured round trip, by number of clients.
//!
//! The benchmark builds its own network: a namespace `stela-rb-<pid>` holding the standby, joined
//! to this namespace by a veth pair with addresses of its own (10.250.<n>.1 here, .2 there); it
//! touches no other interface and removes both at the end, also on failure. The primary daemon
//! (`stela serve --standby`, the `stela` binary next to this one) runs in this namespace, the
//! standby (`stela serve --repl-listen`) in the new one; the clients are the commit benchmark's
//! (`stela-bench commit --socket`, over the shared-memory ring unless `--transport socket`), the
//! two levels taking turns, medians of `--repeats`.
//!
//! The round trip is measured by 2,000 TCP ping-pongs of 8 bytes between the two namespaces
//! (TCP_NODELAY), through a small echo server that this binary runs in the standby's namespace
//! (`stela-bench netecho`, hidden), pinned to one CPU, with the pinging thread pinned to another.
//! Two hosts' round trip always wakes a thread on another processor; on one machine that is a
//! wake-up across CPUs, which costs far more than one on the same CPU. Left unpinned, the two
//! ends of a ping-pong can settle on one CPU, where a round trip wakes nothing remote: on this
//! project's 2-vCPU VM that read 12 us, against 27-30 us across its two CPUs while they are
//! busy and about 52 us while they are idle (a halted vCPU takes that long to wake), which is
//! why earlier versions of this benchmark, which did not pin, saw the round trip "drift" between
//! about 14 and 57 us. The target's round trip is the shortest median across CPUs: before the
//! runs, after them, and while a spinning thread keeps each of the two CPUs busy (at normal
//! priority, as a one-client `replicated` run keeps them: its client spins for its answer, the
//! primary's loop for the standby's, so no CPU sits idle and the standby's wake-up must preempt
//! one). The round trip within one CPU is shown beside it (`rtt_same_cpu_us`), not used.
//! (Measuring under a `buffered` client instead, as an earlier version did, pinned the pinging
//! thread behind the primary's realtime loop whenever the loop ran on its CPU: 142 us.)
//!
//! Targets (issue 9): `replicated` p50 <= `buffered` p50 + one round trip + 10 %, and `replicated`
//! commits/s at 16 clients >= 0.8 x `buffered`. Needs root (network namespaces).
//!
//! With `--nodes 2` or `--nodes 3` the daemons are instead a failover cluster as
//! `stela-bench failover` builds it ([`crate::failover`]'s network and processes: a witness, node
//! `a` the primary and one or two standbys, each node in a namespace of its own on one bridge,
//! every node the others' `--peer`, `--replicas 1`, the stream over TLS); the clients reach the
//! primary through its Unix socket (a file, in no namespace), and the round trip is measured
//! from a thread in the primary's namespace to an echo in the first standby's. Run it once per
//! number of nodes, the numbers taking turns, to set three nodes beside two.

use crate::commit_bench::{self, CommitBenchConfig, CommitRow, TransportChoice};
use crate::netns::{ip, sibling, wait_for, Killed, Namespace};
use anyhow::Context;
use serde::Serialize;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use stela::drive::{Mode, Timing, WARMUP};

/// Arguments of `stela-bench replicated`.
#[derive(clap::Args, Debug, Clone)]
pub struct ReplBenchArgs {
    /// Numbers of concurrent clients, comma list.
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    pub clients: Vec<usize>,
    /// Size of each record as MessagePack, in bytes.
    #[arg(long, default_value_t = 100)]
    pub record_bytes: usize,
    /// Measured seconds of each run (after a 0.3 s warm-up).
    #[arg(long, default_value_t = 2.0)]
    pub duration: f64,
    /// Runs per (level, clients), taking turns; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// How the clients reach the primary.
    #[arg(long, value_enum, default_value_t = TransportChoice::Shm)]
    pub transport: TransportChoice,
    /// One JSON object per client count instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Keep the daemons' directories here instead of a temporary directory.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// More flags for the primary's `stela serve`, one string (e.g. "--spin-us 0").
    #[arg(long, value_name = "FLAGS", allow_hyphen_values = true)]
    pub primary_flags: Option<String>,
    /// Ship over TLS (a certificate made for the run; the primary authenticated by an admin
    /// token), as a deployment off loopback must; default: plain TCP in the private namespace.
    #[arg(long)]
    pub tls: bool,
    /// A failover cluster of this many nodes (2 or 3) instead of a primary and a static
    /// standby (see the module documentation); the stream is then always over TLS.
    #[arg(long, value_parser = clap::value_parser!(u8).range(2..=3), conflicts_with_all = ["tls", "primary_flags"])]
    pub nodes: Option<u8>,
}

/// Arguments of the hidden `stela-bench netecho`: echo every byte back on `listen`.
#[derive(clap::Args, Debug, Clone)]
pub struct NetEchoArgs {
    #[arg(long)]
    pub listen: SocketAddr,
    /// Run on this CPU only.
    #[arg(long)]
    pub cpu: Option<usize>,
}

/// One line of results.
#[derive(Debug, Clone, Serialize)]
pub struct ReplRow {
    pub clients: usize,
    pub buffered_p50_us: f64,
    pub replicated_p50_us: f64,
    /// The shortest of the three median round trips across CPUs below (the one the target
    /// uses; see the module documentation).
    pub rtt_us: f64,
    /// Across CPUs, before the runs.
    pub rtt_before_us: f64,
    /// Across CPUs, after the runs.
    pub rtt_after_us: f64,
    /// Across CPUs, while a spinning thread keeps each CPU busy (see the module documentation).
    pub rtt_busy_us: f64,
    /// A diagnostic, not the target's: both ends on one CPU, after the runs (no wake-up
    /// crosses CPUs, which no two hosts can do). `None` where this process may use one CPU
    /// only; then every round trip above is within that CPU.
    pub rtt_same_cpu_us: Option<f64>,
    pub buffered_commits_per_s: f64,
    pub replicated_commits_per_s: f64,
}

/// Runs the echo server until killed.
pub fn net_echo(args: &NetEchoArgs) -> anyhow::Result<()> {
    if let Some(cpu) = args.cpu {
        // Before any thread is started: the echoing threads inherit it.
        pin_to(cpu)?;
    }
    let listener =
        TcpListener::bind(args.listen).with_context(|| format!("bind {}", args.listen))?;
    echo_every_connection(listener)
}

/// Echoes every byte back on each connection `listener` takes, a thread per connection, until
/// the listener fails.
fn echo_every_connection(listener: TcpListener) -> anyhow::Result<()> {
    for stream in listener.incoming() {
        let mut stream = stream?;
        let _ = stream.set_nodelay(true);
        std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            while let Ok(n) = stream.read(&mut buf) {
                if n == 0 || stream.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        });
    }
    Ok(())
}

/// The namespace and the veth pair joining it to this one, removed when dropped.
pub(crate) struct Network {
    host_if: String,
    pub(crate) here: String,
    pub(crate) there: String,
    /// Dropped after `host_if` is deleted (fields drop in order, after `Drop::drop`).
    pub(crate) namespace: Namespace,
}

impl Network {
    pub(crate) fn create() -> anyhow::Result<Network> {
        let pid = std::process::id();
        let n = pid % 250 + 1;
        let namespace = Namespace::create(&format!("stela-rb-{pid}"))?;
        let host_if = format!("strb{}", pid % 100_000);
        // The veth is made with its peer already inside the namespace: nothing but `host_if`
        // ever exists in this one.
        ip(&[
            "link",
            "add",
            &host_if,
            "type",
            "veth",
            "peer",
            "name",
            "strb0",
            "netns",
            namespace.name(),
        ])?;
        let net = Network {
            host_if,
            here: format!("10.250.{n}.1"),
            there: format!("10.250.{n}.2"),
            namespace,
        };
        ip(&[
            "addr",
            "add",
            &format!("{}/30", net.here),
            "dev",
            &net.host_if,
        ])?;
        ip(&["link", "set", &net.host_if, "up"])?;
        net.namespace
            .ip(&["addr", "add", &format!("{}/30", net.there), "dev", "strb0"])?;
        net.namespace.ip(&["link", "set", "strb0", "up"])?;
        Ok(net)
    }

    /// `program args` inside the namespace.
    pub(crate) fn spawn(
        &self,
        program: &Path,
        args: &[String],
        log: &Path,
    ) -> anyhow::Result<Child> {
        self.namespace.spawn(program, args, log)
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &self.host_if]);
    }
}

/// The CPUs the round trips are measured between: the echo server's, and the pinging
/// thread's for a round trip across CPUs (`None` on a process allowed one CPU only).
#[derive(Clone, Copy, Debug)]
struct RttCpus {
    echo: usize,
    across: Option<usize>,
}

impl RttCpus {
    /// The first two CPUs this process may run on.
    fn pick() -> anyhow::Result<RttCpus> {
        let mut cpus = crate::affinity::allowed_cpus()?.into_iter();
        let first = cpus.next().context("no CPU in this process's affinity")?;
        Ok(match cpus.next() {
            Some(second) => RttCpus {
                echo: second,
                across: Some(first),
            },
            None => RttCpus {
                echo: first,
                across: None,
            },
        })
    }

    /// The pinging thread's CPU for a round trip across CPUs (within one, if there is one only).
    fn across(&self) -> usize {
        self.across.unwrap_or(self.echo)
    }
}

/// Pins the calling thread to `cpu`.
fn pin_to(cpu: usize) -> anyhow::Result<()> {
    crate::affinity::run_on(&[cpu])
}

/// [`measure_rtt`] from a thread pinned to `cpu` (in the network namespace `from` if given,
/// else in this one); the median, in microseconds.
fn median_rtt_from(from: Option<&str>, addr: SocketAddr, cpu: usize) -> anyhow::Result<f64> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                if let Some(namespace) = from {
                    crate::netns::enter_on_this_thread(namespace)?;
                }
                pin_to(cpu)?;
                measure_rtt(addr)
            })
            .join()
            .map_err(|_| anyhow::anyhow!("the round-trip thread panicked"))?
    })
    .map(|samples| median_of_sorted(&samples))
}

/// 2,000 TCP round trips to `addr` (after 200 to warm up), in microseconds, sorted.
fn measure_rtt(addr: SocketAddr) -> anyhow::Result<Vec<f64>> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_nodelay(true)?;
    let mut buf = [0u8; 8];
    let mut samples = Vec::with_capacity(2000);
    for i in 0..2200u64 {
        let start = Instant::now();
        stream.write_all(&i.to_le_bytes())?;
        stream.read_exact(&mut buf)?;
        if i >= 200 {
            samples.push(start.elapsed().as_secs_f64() * 1e6);
        }
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples)
}

/// [`median_rtt_from`] `cpus.across()` while a thread spins on each of the two CPUs.
fn median_rtt_busy(from: Option<&str>, addr: SocketAddr, cpus: RttCpus) -> anyhow::Result<f64> {
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        let spinners: Vec<_> = [Some(cpus.echo), cpus.across]
            .into_iter()
            .flatten()
            .map(|cpu| {
                let stop = &stop;
                scope.spawn(move || {
                    pin_to(cpu)?;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                    anyhow::Ok(())
                })
            })
            .collect();
        // Let the spinners take their CPUs before the first ping.
        std::thread::sleep(Duration::from_millis(50));
        let median = median_rtt_from(from, addr, cpus.across());
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for spinner in spinners {
            spinner
                .join()
                .map_err(|_| anyhow::anyhow!("a spinning thread panicked"))??;
        }
        median
    })
}

fn median_of_sorted(samples: &[f64]) -> f64 {
    samples[samples.len() / 2]
}

pub fn run(args: &ReplBenchArgs, out: &mut dyn Write) -> anyhow::Result<Vec<ReplRow>> {
    if let Some(nodes) = args.nodes {
        return run_cluster(args, nodes.into(), out);
    }
    let stela = sibling("stela")?;
    let me = std::env::current_exe()?;
    let temp = tempfile::tempdir()?;
    let base = args
        .dir
        .clone()
        .unwrap_or_else(|| temp.path().to_path_buf());
    std::fs::create_dir_all(&base)?;
    let net = Network::create()?;
    let repl: SocketAddr = format!("{}:7601", net.there).parse()?;
    let echo: SocketAddr = format!("{}:7602", net.there).parse()?;
    let cpus = RttCpus::pick()?;
    let _echo = Killed(net.spawn(
        &me,
        &[
            "netecho".into(),
            "--listen".into(),
            echo.to_string(),
            "--cpu".into(),
            cpus.echo.to_string(),
        ],
        &base.join("echo.log"),
    )?);
    let standby_dir = base.join("standby");
    // TLS: a certificate for the run, and an admin token the primary proves itself with.
    let (standby_security, primary_security): (Vec<String>, Vec<String>) = if args.tls {
        let key = rcgen::KeyPair::generate()?;
        let cert =
            rcgen::CertificateParams::new(vec!["stela-standby".to_owned()])?.self_signed(&key)?;
        let (cert_path, key_path, token) = (
            base.join("standby.pem"),
            base.join("standby.key"),
            base.join("admin-token"),
        );
        std::fs::write(&cert_path, cert.pem())?;
        crate::harness::write_secret(&key_path, key.serialize_pem())?;
        crate::harness::write_secret(&token, "a-benchmark-admin-token\n")?;
        let path = |p: &PathBuf| p.display().to_string();
        (
            vec![
                "--tls-cert".into(),
                path(&cert_path),
                "--tls-key".into(),
                path(&key_path),
                "--admin-token-file".into(),
                path(&token),
            ],
            vec![
                "--standby-ca".into(),
                path(&cert_path),
                "--standby-name".into(),
                "stela-standby".into(),
                "--standby-token-file".into(),
                path(&token),
            ],
        )
    } else {
        (
            vec!["--repl-insecure".into()],
            vec!["--repl-insecure".into()],
        )
    };
    let mut standby_args: Vec<String> = vec![
        "serve".into(),
        "--dir".into(),
        standby_dir.display().to_string(),
        "--repl-listen".into(),
        repl.to_string(),
        "--assume-write-rate".into(),
        "500000000".into(),
        "--node".into(),
        "standby".into(),
    ];
    standby_args.extend(standby_security);
    let _standby = Killed(net.spawn(&stela, &standby_args, &base.join("standby.log"))?);
    wait_for("the standby", || {
        TcpStream::connect_timeout(&repl, Duration::from_millis(100)).is_ok()
    })?;
    wait_for("the echo server", || {
        TcpStream::connect_timeout(&echo, Duration::from_millis(100)).is_ok()
    })?;
    let primary_dir = base.join("primary");
    let socket = primary_dir.join("stela.sock");
    let primary_log = std::fs::File::create(base.join("primary.log"))?;
    let _primary = Killed(
        Command::new(&stela)
            .args(["serve", "--dir"])
            .arg(&primary_dir)
            .args(["--standby", &repl.to_string(), "--node", "primary"])
            .args(&primary_security)
            .args(
                args.primary_flags
                    .as_deref()
                    .unwrap_or("")
                    .split_whitespace(),
            )
            .stdout(Stdio::from(primary_log.try_clone()?))
            .stderr(Stdio::from(primary_log))
            .spawn()
            .context("start the primary")?,
    );
    wait_for("the primary", || {
        socket.exists() && std::os::unix::net::UnixStream::connect(&socket).is_ok()
    })?;
    let header = format!(
        "# stela-bench replicated: primary here, standby across a veth pair ({} -> {}); stream over {}",
        net.here,
        net.there,
        if args.tls { "TLS" } else { "plain TCP" }
    );
    let path = RttPath {
        from: None,
        echo,
        cpus,
    };
    measure(args, socket, &path, &header, out)
}

/// Where the round trip is measured: from the namespace `from` (this one if None) to `echo`.
struct RttPath<'a> {
    from: Option<&'a str>,
    echo: SocketAddr,
    cpus: RttCpus,
}

/// `stela-bench replicated --nodes N`: a failover cluster of `nodes` (see the module
/// documentation), measured as [`run`] measures a primary and its static standby.
fn run_cluster(
    args: &ReplBenchArgs,
    nodes: usize,
    out: &mut dyn Write,
) -> anyhow::Result<Vec<ReplRow>> {
    use crate::failover::cluster::{self, Cluster, Role, Security};
    use crate::failover::topology::{Host, Topology};
    let stela = sibling("stela")?;
    let me = std::env::current_exe()?;
    let temp = tempfile::tempdir()?;
    let base = args
        .dir
        .clone()
        .unwrap_or_else(|| temp.path().to_path_buf());
    std::fs::create_dir_all(&base)?;
    let topology = Topology::create_for(nodes)?;
    let security = Security::create(&base.join("tls"))?;
    // A lease long enough that a loaded machine does not fail over in the middle of a run.
    let timing = cluster::Timing {
        heartbeat_ms: 50,
        suspect_after_ms: 1000,
        lease_ms: 1000,
        replicas: 1,
        coordinator: cluster::CoordinatorKind::Witness,
    };
    let mut cluster = Cluster::new(stela.clone(), &topology, &base, &timing, Some(&security));
    cluster.witness.start(&stela, &topology)?;
    cluster.nodes[0].start(&stela, &topology, Role::Primary)?;
    for i in 1..nodes {
        cluster.nodes[i].start(&stela, &topology, Role::Standby)?;
    }
    wait_for("node a to be the primary", || {
        cluster.nodes[0]
            .status()
            .is_some_and(|s| cluster::role(&s) == "primary")
    })
    .with_context(|| cluster::tail(cluster.nodes[0].log_path(), 15))?;
    let cpus = RttCpus::pick()?;
    let echo: SocketAddr = format!("{}:7602", topology.address(Host::Standby)).parse()?;
    let _echo = Killed(topology.namespace(Host::Standby).spawn(
        &me,
        &[
            "netecho".into(),
            "--listen".into(),
            echo.to_string(),
            "--cpu".into(),
            cpus.echo.to_string(),
        ],
        &base.join("echo.log"),
    )?);
    let from = topology.namespace(Host::Primary).name().to_owned();
    wait_for("the echo server", || connects_from(&from, echo).is_ok())?;
    let header = format!(
        "# stela-bench replicated --nodes {nodes}: a failover cluster (witness, node a the primary, {} standby{} in namespaces of their own on one bridge, each node the others' --peer, --replicas 1); stream over TLS; clients on the primary's Unix socket",
        nodes - 1,
        if nodes > 2 { "s" } else { "" }
    );
    let path = RttPath {
        from: Some(&from),
        echo,
        cpus,
    };
    let rows = measure(args, cluster.nodes[0].socket(), &path, &header, out);
    if rows.is_err() {
        eprintln!(
            "stela-bench replicated: node a's log ends:\n{}",
            cluster::tail(cluster.nodes[0].log_path(), 15)
        );
    }
    rows
}

/// Whether a TCP connection from the namespace `from` to `addr` opens within 100 ms.
fn connects_from(from: &str, addr: SocketAddr) -> anyhow::Result<()> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                crate::netns::enter_on_this_thread(from)?;
                TcpStream::connect_timeout(&addr, Duration::from_millis(100))?;
                anyhow::Ok(())
            })
            .join()
            .map_err(|_| anyhow::anyhow!("the probing thread panicked"))?
    })
}

/// Both levels by number of clients against the daemon at `socket`, the round trip along
/// `path` before, after and while both CPUs are busy; the table (after `header`) or JSON.
fn measure(
    args: &ReplBenchArgs,
    socket: PathBuf,
    path: &RttPath,
    header: &str,
    out: &mut dyn Write,
) -> anyhow::Result<Vec<ReplRow>> {
    let (from, echo, cpus) = (path.from, path.echo, path.cpus);
    let rtt_before_us = median_rtt_from(from, echo, cpus.across())?;
    let cfg = CommitBenchConfig {
        modes: vec![Mode::ServiceBuffered, Mode::ServiceReplicated],
        clients: args.clients.clone(),
        record_bytes: vec![args.record_bytes],
        timing: Timing {
            warmup: WARMUP,
            window: Duration::from_secs_f64(args.duration),
        },
        dir: None,
        socket: Some(socket),
        transports: vec![args.transport],
        idle_connections: vec![0],
        json: true,
        progress: false,
        repeats: args.repeats.max(1),
    };
    let rows = commit_bench::run(&cfg, &mut std::io::sink())?;
    let rtt_after_us = median_rtt_from(from, echo, cpus.across())?;
    let rtt_busy_us = median_rtt_busy(from, echo, cpus)?;
    let rtt_same_cpu_us = match cpus.across {
        Some(_) => Some(median_rtt_from(from, echo, cpus.echo)?),
        None => None,
    };
    let rtt_us = rtt_before_us.min(rtt_after_us).min(rtt_busy_us);
    let pick = |mode: &str, clients: usize| -> anyhow::Result<&CommitRow> {
        rows.iter()
            .find(|r| r.mode == mode && r.clients == clients)
            .with_context(|| format!("no {mode} row for {clients} clients"))
    };
    let mut out_rows = Vec::new();
    if !args.json {
        writeln!(out, "{header}")?;
        match cpus.across {
            Some(across) => writeln!(out, "# round trip {rtt_us:.1} us: the shortest median of 2000 TCP ping-pongs from CPU {across} to an echo on CPU {} before the runs ({rtt_before_us:.1} us), after them ({rtt_after_us:.1} us) and with both CPUs kept busy by spinning threads ({rtt_busy_us:.1} us)", cpus.echo)?,
            None => writeln!(out, "# round trip {rtt_us:.1} us: the shortest median of 2000 TCP ping-pongs before the runs ({rtt_before_us:.1} us), after them ({rtt_after_us:.1} us) and with the CPU kept busy by a spinning thread ({rtt_busy_us:.1} us), all within CPU {}: this process may use no other, so no round trip crosses CPUs as two hosts' would", cpus.echo)?,
        }
        if let Some(same) = rtt_same_cpu_us {
            writeln!(out, "# diagnostic, not the target's: with both ends on CPU {} (no wake-up crosses CPUs, which no two hosts can do) the median is {same:.1} us", cpus.echo)?;
        }
        writeln!(
            out,
            "# {} B records, {} transport, {:.1} s runs, median of {} with the levels taking turns",
            args.record_bytes, args.transport, args.duration, args.repeats
        )?;
        writeln!(
            out,
            "{:>7} {:>14} {:>16} {:>8} {:>18} {:>20}  targets",
            "clients",
            "buffered p50",
            "replicated p50",
            "rtt",
            "buffered commits/s",
            "replicated commits/s"
        )?;
    }
    for &clients in &args.clients {
        let (b, r) = (
            pick("service-buffered", clients)?,
            pick("service-replicated", clients)?,
        );
        let row = ReplRow {
            clients,
            buffered_p50_us: b.p50_us.unwrap_or(f64::NAN),
            replicated_p50_us: r.p50_us.unwrap_or(f64::NAN),
            rtt_us,
            rtt_before_us,
            rtt_after_us,
            rtt_busy_us,
            rtt_same_cpu_us,
            buffered_commits_per_s: b.commits_per_s,
            replicated_commits_per_s: r.commits_per_s,
        };
        if args.json {
            writeln!(out, "{}", serde_json::to_string(&row)?)?;
        } else {
            let latency_ok = row.replicated_p50_us <= (row.buffered_p50_us + rtt_us) * 1.1;
            let mut verdict = format!(
                "p50 <= (buffered + rtt) x 1.1 = {:.1} us: {}",
                (row.buffered_p50_us + rtt_us) * 1.1,
                if latency_ok { "met" } else { "NOT met" }
            );
            if clients == 16 {
                let ratio = row.replicated_commits_per_s / row.buffered_commits_per_s;
                verdict += &format!(
                    "; commits/s ratio {ratio:.2} (>= 0.8: {})",
                    if ratio >= 0.8 { "met" } else { "NOT met" }
                );
            }
            writeln!(
                out,
                "{:>7} {:>11.1} us {:>13.1} us {:>5.1} us {:>18.0} {:>20.0}  {verdict}",
                clients,
                row.buffered_p50_us,
                row.replicated_p50_us,
                rtt_us,
                row.buffered_commits_per_s,
                row.replicated_commits_per_s
            )?;
        }
        out_rows.push(row);
    }
    Ok(out_rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_round_trip_is_measured_between_two_cpus_when_there_are_two() {
        let cpus = RttCpus::pick().unwrap();
        let allowed = rustix::thread::sched_getaffinity(None).unwrap();
        assert!(allowed.is_set(cpus.echo));
        match cpus.across {
            Some(across) => {
                assert_ne!(across, cpus.echo);
                assert!(allowed.is_set(across));
            }
            None => assert_eq!(allowed.count(), 1),
        }
        // A pinned thread runs on its CPU only.
        std::thread::spawn(move || {
            pin_to(cpus.echo).unwrap();
            let now = rustix::thread::sched_getaffinity(None).unwrap();
            assert_eq!(now.count(), 1);
            assert!(now.is_set(cpus.echo));
        })
        .join()
        .unwrap();
        // Ping-pongs over loopback, from the other CPU and with both kept busy: each a median
        // of real round trips.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            pin_to(cpus.echo).unwrap();
            echo_every_connection(listener).unwrap();
        });
        let idle = median_rtt_from(None, addr, cpus.across()).unwrap();
        let busy = median_rtt_busy(None, addr, cpus).unwrap();
        assert!(idle > 0.0 && idle.is_finite(), "{idle}");
        assert!(busy > 0.0 && busy.is_finite(), "{busy}");
    }
}
