//! `stela demo`: what the log daemon buys, in about ten seconds and without setup. It owns the
//! TPC-B-like transaction record, the three modes shown side by side, and what each survives.
//!
//! Four client threads commit one transaction record each (~100 bytes of MessagePack, random
//! accounts) for two seconds per mode: embedded with an fdatasync per commit, through the daemon
//! (started in this process on a temporary directory) at `buffered`, and embedded without any
//! fsync. The measurement itself is [`crate::drive`]'s, the same as `stela-bench commit`.

use crate::drive::{run_mode, DaemonEnv, Mode, RecordSource, SplitMix64, Timing, WARMUP};
use anyhow::Context;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use stela_format::Codec;

/// Arguments of `stela demo`.
#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    /// Measured seconds per mode (for tests; the demo is meant to run as it is).
    #[arg(long, hide = true, default_value_t = 2.0)]
    pub seconds: f64,
}

/// Client threads committing at once.
pub const DEMO_CLIENTS: usize = 4;

/// TPC-B's scale: 10 tellers and 100,000 accounts per branch; 10 branches here.
const BRANCHES: u64 = 10;
const TELLERS: u64 = BRANCHES * 10;
const ACCOUNTS: u64 = BRANCHES * 100_000;

/// One TPC-B transaction as a log record: which account, teller and branch it touched, by how
/// much, and their balances after it (what a database would log to redo it).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Transaction {
    pub txn: u64,
    pub account: u32,
    pub teller: u32,
    pub branch: u32,
    pub delta: i32,
    pub account_balance: i64,
    pub teller_balance: i64,
    pub branch_balance: i64,
    pub at_unix_us: u64,
    /// TPC-B's history row carries filler; here it brings the record to about 100 bytes.
    pub filler: String,
}

/// One client's stream of transactions (seeded per client; the record is updated in place).
struct Tpcb {
    rng: SplitMix64,
    txn: Transaction,
}

impl Tpcb {
    fn new(client: usize) -> Tpcb {
        Tpcb {
            rng: SplitMix64::new(0x7bcb + client as u64),
            txn: Transaction {
                txn: (client as u64) << 40,
                account: 0,
                teller: 0,
                branch: 0,
                delta: 0,
                account_balance: 0,
                teller_balance: 0,
                branch_balance: 0,
                at_unix_us: 0,
                filler: "tpc-b history row filler, padding each record to ~100 bytes".into(),
            },
        }
    }
}

impl RecordSource for Tpcb {
    type Record = Transaction;

    fn next_record(&mut self) -> &Transaction {
        let rng = &mut self.rng;
        let txn = &mut self.txn;
        txn.txn += 1;
        txn.account = rng.between(0, ACCOUNTS - 1) as u32;
        txn.teller = rng.between(0, TELLERS - 1) as u32;
        txn.branch = txn.teller / 10;
        // TPC-B's delta is uniform in -999,999..=999,999.
        txn.delta = rng.between(0, 1_999_998) as i32 - 999_999;
        txn.account_balance = rng.between(0, 1 << 32) as i64 - (1 << 31);
        txn.teller_balance = txn.teller_balance.wrapping_add(i64::from(txn.delta));
        txn.branch_balance = txn.branch_balance.wrapping_add(i64::from(txn.delta));
        txn.at_unix_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        &self.txn
    }
}

/// The mean size of a transaction record as MessagePack (it varies with the numbers in it).
fn mean_encoded_bytes() -> f64 {
    let mut source = Tpcb::new(0);
    let n = 256;
    let total: usize = (0..n)
        .map(|_| {
            Codec::MessagePack
                .encode(source.next_record())
                .map_or(0, |b| b.len())
        })
        .sum();
    total as f64 / n as f64
}

/// A mode as the demo shows it.
struct Shown {
    mode: Mode,
    label: &'static str,
    survives: &'static str,
}

const SHOWN: [Shown; 3] = [
    Shown {
        mode: Mode::EmbeddedSync,
        label: "embedded, fdatasync per commit",
        survives: "everything here: a crash of the process or the OS, and power loss \
                   (each commit is on disk before it returns)",
    },
    Shown {
        mode: Mode::ServiceBuffered,
        label: "stela buffered (daemon)",
        survives: "a crash of the client (the database); power loss, with the emergency flush \
                   (SIGPWR or `stela power-fail` from the UPS); NOT a SIGKILL or crash of the \
                   daemon before its buffers are written",
    },
    Shown {
        mode: Mode::EmbeddedUnsafe,
        label: "embedded, no fsync",
        survives: "a crash of the process only; NOT an OS crash or power loss (commits are \
                   only in the page cache)",
    },
];

/// One line of the demo's table.
#[derive(Clone, Debug, PartialEq)]
pub struct DemoRow {
    pub mode: String,
    pub commits_per_s: f64,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
}

/// `stela demo`: runs the three modes and prints the table and what each survives to `out`.
pub fn run_demo(args: &DemoArgs, out: &mut dyn Write) -> anyhow::Result<Vec<DemoRow>> {
    anyhow::ensure!(
        args.seconds.is_finite() && args.seconds > 0.0 && args.seconds <= 600.0,
        "--seconds must be above 0 (and at most 600), not {}",
        args.seconds
    );
    let timing = Timing {
        warmup: WARMUP,
        window: Duration::from_secs_f64(args.seconds),
    };
    let base = tempfile::Builder::new()
        .prefix("stela-demo-")
        .tempdir()
        .context("create a temporary directory for the demo")?;
    let daemon = DaemonEnv::measure(base.path())?;
    let size = mean_encoded_bytes();
    writeln!(
        out,
        "stela demo: TPC-B-like transactions, one msgpack record of ~{size:.0} bytes per commit, random \
         accounts; {DEMO_CLIENTS} client threads, {:.1} s per mode (after {:.1} s warm-up)",
        timing.window.as_secs_f64(),
        timing.warmup.as_secs_f64()
    )?;
    writeln!(
        out,
        "daemon: in this process on {}, {}",
        base.path().display(),
        daemon.describe()
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "{:<31} {:>11} {:>9} {:>9}",
        "mode", "commits/s", "p50 us", "p99 us"
    )?;
    out.flush()?;
    let mut rows = Vec::new();
    for shown in &SHOWN {
        let dir = base.path().join(shown.mode.name());
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        let sources = (0..DEMO_CLIENTS).map(Tpcb::new).collect();
        let outcome = run_mode(shown.mode, &dir, Some(&daemon), timing, sources)
            .with_context(|| format!("{}: run failed", shown.label))?;
        let row = DemoRow {
            mode: shown.label.to_string(),
            commits_per_s: outcome.commits_per_s(),
            p50_us: outcome.latency.percentile_us(50.0),
            p99_us: outcome.latency.percentile_us(99.0),
        };
        let latency = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.1}"));
        writeln!(
            out,
            "{:<31} {:>11.0} {:>9} {:>9}",
            row.mode,
            row.commits_per_s,
            latency(row.p50_us),
            latency(row.p99_us)
        )?;
        out.flush()?;
        rows.push(row);
    }
    writeln!(out)?;
    writeln!(out, "what an acknowledged commit survives:")?;
    for shown in &SHOWN {
        writeln!(out, "  {}: {}", shown.label, shown.survives)?;
    }
    if let [sync, buffered, unsafe_] = &rows[..] {
        if sync.commits_per_s > 0.0 && unsafe_.commits_per_s > 0.0 {
            writeln!(out)?;
            writeln!(
                out,
                "stela buffered: {:.1}x the commits/s of fdatasync per commit, {:.0} % of no fsync.",
                buffered.commits_per_s / sync.commits_per_s,
                100.0 * buffered.commits_per_s / unsafe_.commits_per_s
            )?;
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transaction_is_about_100_bytes() {
        let mut source = Tpcb::new(3);
        for _ in 0..1000 {
            let txn = source.next_record();
            assert!(txn.account < ACCOUNTS as u32 && txn.branch < BRANCHES as u32);
            assert!((-999_999..=999_999).contains(&txn.delta));
            let bytes = Codec::MessagePack.encode(txn).unwrap().len();
            assert!((90..=110).contains(&bytes), "{bytes}");
        }
    }

    #[test]
    fn prints_the_three_modes_and_what_they_survive() {
        // The modes that never wait for the disk commit within any window, once running; but
        // one fdatasync, or the daemon's start, can outlast a 0.1 s window right after a
        // build (the machine flushing gigabytes) or beside other tests: a longer window then.
        let mut last = Vec::new();
        let (rows, out) = [0.1, 1.0, 5.0]
            .into_iter()
            .map(|seconds| {
                let mut out = Vec::new();
                let rows = run_demo(&DemoArgs { seconds }, &mut out).unwrap();
                (rows, out)
            })
            .find(|(rows, _)| {
                last = rows.clone();
                rows[1..].iter().all(|r| r.commits_per_s > 0.0)
            })
            .unwrap_or_else(|| panic!("a mode never committed, even in 5 s: {last:?}"));
        assert_eq!(rows.len(), 3);
        let text = String::from_utf8(out).unwrap();
        for shown in &SHOWN {
            assert_eq!(text.matches(shown.label).count(), 2, "{text}");
        }
        assert!(run_demo(&DemoArgs { seconds: -1.0 }, &mut Vec::new()).is_err());
    }
}
