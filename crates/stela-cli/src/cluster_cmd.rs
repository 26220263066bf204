//! `stela cluster list|switchover`: one view of a failover pair (Patroni's `patronictl list`)
//! from the nodes' own status, and a planned switchover (`patronictl switchover`).
//!
//! Nodes are named by `--node`, once per node: a daemon directory (its socket is
//! DIR/stela.sock), a socket path, a plain `tcp://HOST:PORT`, or `tls://HOST:PORT` (TLS,
//! trusting `--tls-ca`, authenticated by `--token-file` or `--tls-cert`/`--tls-key`, the same
//! for every TLS node). Nothing here decides anything:
//! the switchover itself is the primary's ([`stela_server`]'s `Engine::switchover`) and the
//! coordinator's (`stela_coord::rules::hand_over`); this asks for it and watches it happen.

use anyhow::{bail, Context};
use clap::Subcommand;
use std::io::Write;
use std::time::{Duration, Instant};
use stela_client::{Address, Connection};
use stela_proto::{RequestBody, ResponseBody, StatusReport};

use crate::node_address::address_of;
pub use crate::node_address::NodeTls;

#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// Each node's name, role, epoch, health and lag, from the nodes' own status.
    List {
        /// A node: its directory, its socket, tcp://HOST:PORT or tls://HOST:PORT (once per
        /// node).
        #[arg(long = "node", value_name = "NODE", required = true)]
        nodes: Vec<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        tls: NodeTls,
    },
    /// Hand the primary's epoch to a standby: planned, nothing acknowledged lost.
    ///
    /// The primary refuses appends, waits until the chosen standby holds every record, hands
    /// the next epoch to it through the coordinator and steps down (exit 75: restarted, it
    /// rejoins as a standby); the standby takes the epoch at once, and any other standby
    /// follows it. A standby that is down does not hold the switchover up unless it is the one
    /// chosen. See docs/DAEMON.md, "Switchover".
    Switchover {
        /// A node: its directory, its socket, tcp://HOST:PORT or tls://HOST:PORT (once per
        /// node).
        #[arg(long = "node", value_name = "NODE", required = true)]
        nodes: Vec<String>,
        /// The node (its --node name) to hand the epoch to [default: the standby that answers
        /// holding the most records].
        #[arg(long, value_name = "NAME")]
        to: Option<String>,
        /// How long the primary waits for the standby to hold every record before it gives up
        /// (and takes appends again).
        #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = crate::units::parse_secs)]
        within: crate::units::Dur,
        #[command(flatten)]
        tls: NodeTls,
    },
}

/// One node as `--node` named it, with its status if it answered.
struct Seen {
    given: String,
    address: Address,
    status: anyhow::Result<StatusReport>,
}

impl Seen {
    fn name(&self) -> Option<&str> {
        self.status.as_ref().ok()?.node.as_deref()
    }

    fn role(&self) -> &str {
        match &self.status {
            Ok(report) => report
                .replication
                .as_ref()
                .map_or("no pair", |r| r.role.as_str()),
            Err(_) => "unreachable",
        }
    }

    fn epoch(&self) -> u64 {
        self.status
            .as_ref()
            .ok()
            .and_then(|r| r.replication.as_ref())
            .map_or(0, |r| r.epoch)
    }
}

fn status_of(address: &Address) -> anyhow::Result<StatusReport> {
    let answer = Connection::connect_admin(address)?.request(RequestBody::Status)?;
    match answer {
        ResponseBody::Status(report) => Ok(*report),
        other => bail!("unexpected answer to Status: {other:?}"),
    }
}

fn look(nodes: &[String], tls: &NodeTls) -> anyhow::Result<Vec<Seen>> {
    nodes
        .iter()
        .map(|given| {
            let address = address_of(given, tls)?;
            let status = status_of(&address);
            Ok(Seen {
                given: given.clone(),
                address,
                status,
            })
        })
        .collect()
}

pub fn run(command: ClusterCommand, out: &mut dyn Write) -> anyhow::Result<()> {
    match command {
        ClusterCommand::List { nodes, json, tls } => list(&look(&nodes, &tls)?, json, out),
        ClusterCommand::Switchover {
            nodes,
            to,
            within,
            tls,
        } => switchover(&look(&nodes, &tls)?, to.as_deref(), within.get(), out),
    }
}

/// The records a standby says it holds, over its logs (how a switchover without `--to` picks
/// the most caught-up one; the primary still waits until it holds every record).
fn received_records(seen: &Seen) -> u64 {
    let logs = seen
        .status
        .as_ref()
        .ok()
        .and_then(|r| r.replication.as_ref())
        .map(|r| r.logs.as_slice())
        .unwrap_or_default();
    logs.iter().map(|l| l.received_lsn).sum()
}

/// The most records any standby of this primary lacks, over its logs.
fn lag_records(report: &StatusReport) -> Option<u64> {
    let replication = report.replication.as_ref()?;
    let standbys = replication.standbys.iter().flat_map(|s| s.logs.iter());
    standbys
        .chain(replication.logs.iter())
        .map(|l| l.lag_records)
        .max()
}

fn health(seen: &Seen) -> String {
    match &seen.status {
        Err(error) => format!("unreachable: {}", crate::exit::render(error)),
        Ok(report) => {
            let mut problems = crate::service::health_problems(report);
            problems.extend(crate::service::standby_unreachable(report));
            if problems.is_empty() {
                "ok".to_owned()
            } else {
                problems.join("; ")
            }
        }
    }
}

fn list(seen: &[Seen], json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let rows: Vec<serde_json::Value> = seen
        .iter()
        .map(|node| {
            let report = node.status.as_ref().ok();
            let coordinator = report
                .and_then(|r| r.replication.as_ref())
                .and_then(|r| r.coordinator.as_ref());
            serde_json::json!({
                "node": node.name(),
                "address": node.address.to_string(),
                "role": node.role(),
                "epoch": node.epoch(),
                "health": health(node),
                "lag_records": report.and_then(lag_records),
                "coordinator_holder": coordinator.and_then(|c| c.holder.clone()),
                "coordinator_epoch": coordinator.map(|c| c.epoch),
            })
        })
        .collect();
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&rows)?)?;
        return Ok(());
    }
    writeln!(
        out,
        "{:<12} {:<14} {:>6} {:>11}  {:<32} health",
        "node", "role", "epoch", "lag (recs)", "address"
    )?;
    for (row, node) in rows.iter().zip(seen) {
        writeln!(
            out,
            "{:<12} {:<14} {:>6} {:>11}  {:<32} {}",
            node.name().unwrap_or("-"),
            node.role(),
            node.epoch(),
            row["lag_records"]
                .as_u64()
                .map_or("-".to_owned(), |l| l.to_string()),
            node.given,
            row["health"].as_str().unwrap_or_default()
        )?;
    }
    Ok(())
}

fn switchover(
    seen: &[Seen],
    to: Option<&str>,
    within: Duration,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let primary = seen
        .iter()
        .find(|node| node.role() == "primary")
        .context("no node named by --node says it is the primary")?;
    let from = primary.name().unwrap_or("the primary").to_owned();
    let standbys: Vec<&Seen> = seen.iter().filter(|n| n.role() == "standby").collect();
    let target = match to {
        Some(name) => standbys
            .iter()
            .find(|n| n.name() == Some(name))
            .with_context(|| format!("--to {name}: no standby of that name among the nodes"))?,
        None => standbys
            .iter()
            .max_by_key(|n| received_records(n))
            .context("no standby answers: start one, or name one with --to")?,
    };
    let to = target
        .name()
        .context("the standby does not say its --node name")?;
    let started = Instant::now();
    let request = RequestBody::Switchover {
        to: to.to_owned(),
        within_ms: within.as_millis() as u64,
    };
    let answer = Connection::connect_admin(&primary.address)?.request(request);
    let epoch = match answer {
        Ok(ResponseBody::SwitchedOver { epoch, .. }) => Some(epoch),
        Ok(other) => bail!("unexpected answer to Switchover: {other:?}"),
        // The primary steps down as soon as the coordinator recorded the handover: its answer
        // may not get out. The new primary says whether it happened.
        Err(stela_client::Error::Io(_)) => None,
        Err(error) => return Err(error).context(format!("{from} refused the switchover")),
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(report) = status_of(&target.address) {
            let replication = report.replication.as_ref();
            let now = replication.map_or(0, |r| r.epoch);
            if replication.is_some_and(|r| r.role == "primary") && epoch.is_none_or(|e| now >= e) {
                writeln!(
                    out,
                    "switched over: {to} is the primary of epoch {now} ({} ms); {from} stepped down \
                     (exit 75: restarted, it rejoins as {to}'s standby)",
                    started.elapsed().as_millis()
                )?;
                return Ok(());
            }
        }
        if Instant::now() >= deadline {
            bail!("{to} did not become the primary within 30 s (epoch handed over: {epoch:?})");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
