//! What every system of `stela-bench tpcb` shares: the arguments and a run's result, the
//! database's keys and rows, the transaction's random choices, and the driver that runs one
//! client per branch and times each transaction. The runs themselves are in [`crate::tpcb`]
//! (stela-store, SQLite) and [`crate::tpcb_rocksdb`]; the chart in [`crate::tpcb_chart`].

use anyhow::{bail, Context};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub(crate) const TELLERS_PER_BRANCH: u32 = 10;
pub(crate) const ROW_BYTES: usize = 100;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    Classical,
    Decoupled,
}

/// Which service's interval `--interval-ms` sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Varied {
    /// Checkpoints and cleaning rounds together.
    Both,
    /// Checkpoints only (the paper's Figure 4); cleaning rounds at `--fixed-interval-ms`.
    Checkpoints,
    /// Cleaning rounds only; checkpoints at `--fixed-interval-ms`.
    Cleaner,
}

impl Varied {
    /// The checkpoint and cleaning intervals of a run at `interval`.
    pub fn intervals(self, interval: u64, fixed: u64) -> (u64, u64) {
        match self {
            Varied::Both => (interval, interval),
            Varied::Checkpoints => (interval, fixed),
            Varied::Cleaner => (fixed, interval),
        }
    }

    /// What the interval of a run is, in words (the header of a table, a chart's caption).
    pub fn pacing(self, fixed: u64) -> String {
        match self {
            Varied::Both => "checkpoint and cleaning interval".to_string(),
            Varied::Checkpoints => format!("checkpoint interval (cleaning every {fixed} ms)"),
            Varied::Cleaner => format!("cleaning interval (checkpoints every {fixed} ms)"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DurabilityArg {
    Disk,
    Buffered,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SystemArg {
    #[value(name = "stela-store")]
    StelaStore,
    /// The same store logging through a `stela serve` daemon started in this process (its
    /// shared-memory ring), at `--durability`: what leaving the process costs the store.
    #[value(name = "stela-store-daemon")]
    StelaStoreDaemon,
    /// SQLite in WAL mode (`synchronous=FULL` for disk, `NORMAL` for buffered), its own
    /// automatic checkpoints; needs the `sqlite` feature.
    Sqlite,
    /// RocksDB's TransactionDB (pessimistic locking; `sync` writes for disk, unsynced for
    /// buffered), its own flushes and compactions; needs the `rocksdb` feature.
    Rocksdb,
}

#[derive(clap::Args, Debug, Clone)]
pub struct TpcbArgs {
    /// Systems to run, on the same transactions. SQLite and RocksDB have their own checkpoints
    /// (flushes) and no cleaner: each runs once per repeat, whatever `--checkpoints`,
    /// `--cleaner` and `--interval-ms` say.
    #[arg(long, value_delimiter = ',', default_value = "stela-store")]
    pub systems: Vec<SystemArg>,
    /// Clients, each on a branch of its own (the number of branches).
    #[arg(long, default_value_t = 2)]
    pub clients: u32,
    /// Seconds per run.
    #[arg(long, default_value_t = 5.0)]
    pub duration: f64,
    /// Checkpoint kinds to run.
    #[arg(long, value_delimiter = ',', default_value = "classical,decoupled")]
    pub checkpoints: Vec<Kind>,
    /// Page cleaners to run.
    #[arg(long, value_delimiter = ',', default_value = "classical,decoupled")]
    pub cleaner: Vec<Kind>,
    /// Intervals between checkpoints, and between cleaning rounds, in milliseconds: the pause
    /// after one before the next starts, so a service that takes longer (a classical checkpoint
    /// at 1 ms) runs less often than one that is quick.
    #[arg(
        long = "interval-ms",
        value_delimiter = ',',
        default_value = "1,10,100,1000,10000"
    )]
    pub interval_ms: Vec<u64>,
    /// Which service `--interval-ms` paces: both (the default), or one of them, the other
    /// then running every `--fixed-interval-ms`. Varying one at a time tells the two
    /// services' costs apart: with both varied, a checkpoint line carries the cleaner's cost
    /// at the same interval.
    #[arg(long, default_value = "both")]
    pub vary: Varied,
    /// The interval of the service `--vary` leaves alone, in milliseconds.
    #[arg(long = "fixed-interval-ms", default_value_t = 1000)]
    pub fixed_interval_ms: u64,
    /// Commit durability.
    #[arg(long, default_value = "disk")]
    pub durability: DurabilityArg,
    /// Percent of transactions whose account is at another client's branch (TPC-B's remote
    /// accounts: 15). 0, the default, is the paper's setting: every client on its own branch,
    /// so transactions never wait for each other's locks. With remote accounts, a transaction
    /// that loses a deadlock or a lock wait is rolled back and run again with new values.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub remote: u32,
    /// Accounts per branch (TPC-B: 100,000).
    #[arg(long, default_value_t = 100_000)]
    pub accounts: u32,
    /// Buffer pool size in MiB (default: room for the whole database after a run, its history
    /// grown at up to 150,000 transactions per second).
    #[arg(long)]
    pub pool_mb: Option<usize>,
    /// Directory for the databases (default: a temporary folder in the current directory).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Runs per configuration; the configurations take turns (every other repeat in reverse
    /// order), so a disturbance or drift of the machine spreads over all of them, and the
    /// summary gives each one's median.
    #[arg(long, default_value_t = 1)]
    pub repeats: usize,
    /// One JSON object per run instead of a table.
    #[arg(long)]
    pub json: bool,
    /// A diagnostic, not how the must-reach lines are measured: client N runs on the N-th CPU
    /// the process may use, and every other thread (loading, the store's services, the peers'
    /// background threads) on the CPUs after the clients'. It takes from a line what the
    /// services cost the clients by sharing their CPUs, leaving what they cost otherwise
    /// (latches, memory, the disk). Needs more CPUs than clients.
    #[arg(long)]
    pub pin_clients: bool,
    /// A diagnostic: every stela-store configuration also runs beside a neighbour, a thread
    /// that shares nothing with the store and keeps a CPU busy `--neighbour-busy-percent` of
    /// each 10 ms, streaming through memory or computing in registers
    /// ([`crate::neighbour`]). Those runs are labelled `stela-store+memory-neighbour` (or
    /// `+compute-neighbour`), take turns with the runs without it, and are compared with
    /// them interval by interval. Their `cpu s` includes the neighbour's.
    #[arg(long)]
    pub neighbour: Option<crate::neighbour::NeighbourKind>,
    /// The share of each 10 ms the neighbour is busy, in percent (the default is about what
    /// the decoupled cleaner's thread takes at 1 ms rounds with one client).
    #[arg(long, default_value_t = 55, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub neighbour_busy_percent: u32,
    /// Save an SVG chart at PATH: tps by interval, one line per checkpoint kind and cleaner,
    /// the peers flat beside them (the paper's Figure 4).
    #[arg(long, value_name = "PATH")]
    pub chart: Option<PathBuf>,
}

/// One run's result.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TpcbRun {
    pub system: String,
    pub checkpoints: String,
    pub cleaner: String,
    /// The interval `--vary` names (checkpoints, cleaning rounds, or both).
    pub interval_ms: u64,
    /// Which service's interval `interval_ms` is: "both", "checkpoints" or "cleaner" (the
    /// other then ran every `fixed_interval_ms`).
    pub varied: Varied,
    pub fixed_interval_ms: u64,
    pub clients: u32,
    pub durability: String,
    /// Which of the `--repeats` runs of this configuration (from 1).
    pub repeat: usize,
    pub tps: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    /// CPU time of the whole process (clients and services) during the run.
    pub cpu_s: f64,
}

/// The fastest the history is assumed to grow, in transactions per second over all clients:
/// above every rate this benchmark has seen on any system (about 60,000 at one client).
pub(crate) const HISTORY_ROOM_TPS: f64 = 150_000.0;

/// The cache every system gets, in MiB: stela-store's buffer pool, SQLite's page cache (per
/// connection) and RocksDB's block cache, so that no system reads rows through the OS's page
/// cache while another has them in its own memory.
pub(crate) fn pool_mb(args: &TpcbArgs) -> usize {
    args.pool_mb.unwrap_or_else(|| default_pool_mb(args))
}

/// A buffer pool with room for the whole database after a run, as in the paper's in-memory
/// setting: the accounts (about 125 bytes each in the leaves, twice over for half-full leaves
/// and the inner nodes) and the history a run can append at [`HISTORY_ROOM_TPS`] (as many bytes
/// per transaction, twice over too: a branch's history ends in a leaf that also holds the keys
/// after it, the next branch's history or the tellers, so the store splits those leaves in
/// half rather than filling them; with the history counted once, runs at ~100,000 tps evicted
/// ~65,000 pages each), plus a margin. The pool takes frames only as pages come in, so room that
/// a run does not use costs nothing. A pool sized for the accounts alone filled up in runs of
/// more than a few seconds: then every new history page evicted a dirty one, and with the
/// services paused for 10 s that eviction wrote pages on the transactions' path, which made
/// the longest interval read 25 % slow for a reason that is not the services'.
fn default_pool_mb(args: &TpcbArgs) -> usize {
    let accounts_mb = (args.clients as usize * args.accounts as usize * 125) >> 20;
    let history_mb = (args.duration.max(0.0) * HISTORY_ROOM_TPS * 125.0 * 2.0) as usize >> 20;
    accounts_mb * 2 + history_mb + 64
}

pub(crate) fn branch_key(b: u32) -> Vec<u8> {
    format!("b{b:04}").into_bytes()
}

pub(crate) fn teller_key(b: u32, t: u32) -> Vec<u8> {
    format!("t{b:04}{t:02}").into_bytes()
}

pub(crate) fn account_key(b: u32, a: u32) -> Vec<u8> {
    format!("a{b:04}{a:06}").into_bytes()
}

pub(crate) fn history_key(b: u32, seq: u64) -> Vec<u8> {
    format!("h{b:04}{seq:012}").into_bytes()
}

/// A row: the balance, then filler to `ROW_BYTES`.
pub(crate) fn row(balance: i64) -> Vec<u8> {
    let mut row = vec![b' '; ROW_BYTES];
    row[..8].copy_from_slice(&balance.to_le_bytes());
    row
}

pub(crate) fn balance(row: &[u8]) -> anyhow::Result<i64> {
    let bytes: [u8; 8] = row
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .context("a row shorter than its balance")?;
    Ok(i64::from_le_bytes(bytes))
}

/// CPU time (user + system) of this process so far, from `/proc/self/stat`, whose fields 14
/// and 15 count clock ticks of `USER_HZ`, which is 100 on every Linux architecture we run on.
fn process_cpu_seconds() -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let after = stat.rsplit_once(')').context("/proc/self/stat")?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| -> anyhow::Result<f64> {
        Ok(fields.get(i).context("/proc/self/stat")?.parse::<u64>()? as f64)
    };
    // After the name, field 3 is at index 0: utime (14) at 11, stime (15) at 12.
    Ok((ticks(11)? + ticks(12)?) / 100.0)
}

/// A small, fast generator (xorshift64*), seeded per client: the benchmark needs no more.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        // xorshift never leaves zero.
        Rng(seed.max(1))
    }

    pub(crate) fn below(&mut self, n: u32) -> u32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        ((self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) % u64::from(n)) as u32
    }
}

/// A transaction's delta and account (branch, index within it) for the client of branch `b`:
/// the account is at another branch for `--remote` percent of the transactions.
pub(crate) fn delta_and_account(args: &TpcbArgs, b: u32, rng: &mut Rng) -> (i64, u32, u32) {
    let delta = i64::from(rng.below(1_999_999)) - 999_999;
    let branch = if args.clients > 1 && rng.below(100) < args.remote {
        (b + 1 + rng.below(args.clients - 1)) % args.clients
    } else {
        b
    };
    (delta, branch, rng.below(args.accounts))
}

/// Latencies in microseconds, sorted, to the run's percentiles.
fn percentiles(latencies: &mut [u32]) -> (u64, u64) {
    latencies.sort_unstable();
    let at = |p: f64| -> u64 {
        if latencies.is_empty() {
            return 0;
        }
        u64::from(latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)])
    };
    (at(0.50), at(0.99))
}

/// What the clients of one run did.
pub(crate) struct Driven {
    latencies: Vec<u32>,
    /// The sum of the deltas of every committed transaction: what the invariant checks.
    pub deltas: i64,
    elapsed: f64,
    cpu_s: f64,
}

impl Driven {
    pub(crate) fn into_run(
        mut self,
        system: &str,
        checkpoints: &str,
        cleaner: &str,
        interval_ms: u64,
        args: &TpcbArgs,
        repeat: usize,
    ) -> TpcbRun {
        let (p50_us, p99_us) = percentiles(&mut self.latencies);
        TpcbRun {
            system: system.into(),
            checkpoints: checkpoints.into(),
            cleaner: cleaner.into(),
            interval_ms,
            varied: args.vary,
            fixed_interval_ms: args.fixed_interval_ms,
            clients: args.clients,
            durability: format!("{:?}", args.durability).to_lowercase(),
            repeat,
            tps: self.latencies.len() as f64 / self.elapsed,
            p50_us,
            p99_us,
            cpu_s: self.cpu_s,
        }
    }
}

/// Runs one client thread per branch for `--duration` seconds: each opens its connection with
/// `open(branch)` and repeats `transaction(connection, branch, rng)`, which commits one TPC-B
/// transaction and returns its delta. A client's error ends the run with that error.
pub(crate) fn drive_clients<C>(
    args: &TpcbArgs,
    open: impl Fn(u32) -> anyhow::Result<C> + Sync,
    transaction: impl Fn(&mut C, u32, &mut Rng) -> anyhow::Result<i64> + Sync,
) -> anyhow::Result<Driven> {
    let stop = AtomicBool::new(false);
    let pinned = args.pin_clients.then(ClientCpus::of_process).transpose()?;
    let started = Instant::now();
    let cpu_before = process_cpu_seconds()?;
    let results: Vec<anyhow::Result<(Vec<u32>, i64)>> = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..args.clients)
            .map(|b| {
                let (stop, open, transaction) = (&stop, &open, &transaction);
                scope.spawn(move || -> anyhow::Result<(Vec<u32>, i64)> {
                    if let Some(cpus) = pinned {
                        cpus.pin_client(b)?;
                    }
                    let mut connection = open(b)?;
                    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ ((u64::from(b) + 1) * 7919));
                    let (mut latencies, mut deltas) = (Vec::with_capacity(1 << 16), 0i64);
                    while !stop.load(Ordering::Relaxed) {
                        let at = Instant::now();
                        deltas += transaction(&mut connection, b, &mut rng)?;
                        latencies.push(at.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
                    }
                    Ok((latencies, deltas))
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs_f64(args.duration));
        stop.store(true, Ordering::Relaxed);
        clients
            .into_iter()
            .map(|c| c.join().unwrap_or_else(|_| bail!("a client panicked")))
            .collect()
    });
    let elapsed = started.elapsed().as_secs_f64();
    let cpu_s = process_cpu_seconds()? - cpu_before;
    let (mut latencies, mut deltas) = (Vec::new(), 0i64);
    for result in results {
        let (l, d) = result?;
        latencies.extend(l);
        deltas += d;
    }
    Ok(Driven {
        latencies,
        deltas,
        elapsed,
        cpu_s,
    })
}

/// `--pin-clients`: the CPUs this process may use, the first ones for the clients. Created on
/// the benchmark's main thread, which [`ClientCpus::keep_others_off`] moves to the rest, so
/// that every thread it starts afterwards (the store's services, a peer's background threads)
/// stays off the clients' CPUs.
pub(crate) struct ClientCpus {
    cpus: Vec<usize>,
}

impl ClientCpus {
    /// The CPUs the process could use before the first `keep_others_off` (read once: the
    /// main thread's own set is narrower after it).
    pub(crate) fn of_process() -> anyhow::Result<&'static ClientCpus> {
        static FIRST_READ: std::sync::OnceLock<ClientCpus> = std::sync::OnceLock::new();
        if let Some(cpus) = FIRST_READ.get() {
            return Ok(cpus);
        }
        let cpus = crate::affinity::allowed_cpus()?;
        Ok(FIRST_READ.get_or_init(|| ClientCpus { cpus }))
    }

    /// Moves the calling thread (and what it starts from now on) off the first `clients` CPUs.
    pub(crate) fn keep_others_off(&self, clients: u32) -> anyhow::Result<()> {
        let clients = clients as usize;
        if self.cpus.len() <= clients {
            bail!(
                "--pin-clients needs more CPUs than clients: {} CPUs, {clients} clients",
                self.cpus.len()
            );
        }
        crate::affinity::run_on(&self.cpus[clients..])
    }

    /// Moves the calling thread onto client `client`'s CPU alone.
    fn pin_client(&self, client: u32) -> anyhow::Result<()> {
        crate::affinity::run_on(&[self.cpus[client as usize]])
    }
}
