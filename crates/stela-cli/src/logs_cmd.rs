//! `stela logs list|delete|release-hold` (and `tail`, in [`crate::tail_cmd`]): the logs a running daemon holds in its directory (with
//! the holds on its copies: warm followers' on a standby, the standby's on a primary), removing
//! one that no client has open, and releasing the hold of a follower or standby retired for good
//! (administrative requests: over TCP only an administrator may).

use crate::service::TargetArgs;
use anyhow::Context;
use clap::Subcommand;
use std::io::Write;
use stela_client::Connection;
use stela_proto::{LogListing, RequestBody, ResponseBody};

#[derive(Subcommand, Debug)]
pub enum LogsCommand {
    /// Every log in the daemon's directory.
    ///
    /// Name, handles open, segments, bytes on disk, first and last LSN, state.
    List {
        #[command(flatten)]
        target: TargetArgs,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete a log no client has open: its segments, then its directory (durably).
    Delete {
        /// The log's name.
        name: String,
        #[command(flatten)]
        target: TargetArgs,
    },
    /// Print a log's newest records as JSON lines; with -f, follow it.
    ///
    /// Reads DIR/logs/NAME's segment files (read only, no lock), so a record shows once the
    /// daemon has written it: at once for a `disk` commit, within the flush interval for
    /// `buffered`.
    Tail(crate::tail_cmd::TailArgs),
    /// Release a hold on this node's copy of a log (a retired follower's or standby's).
    ///
    /// A warm follower's (`stela mount-follow`, `stela store-follow`) on a standby, or, on a
    /// primary, the one it keeps for a standby (`standby at HOST:PORT`), once that follower or
    /// standby is retired for good: until then the copy is never cut below it. A follower
    /// still running, or a standby still connected, writes its hold again.
    ReleaseHold {
        /// The log's name.
        name: String,
        /// The holder as `stela logs list` shows it: the follower's directory, or `standby at
        /// HOST:PORT`.
        holder: String,
        #[command(flatten)]
        target: TargetArgs,
    },
}

fn connect(target: &TargetArgs) -> anyhow::Result<Connection> {
    let address = target.address()?;
    Connection::connect_admin(&address)
        .with_context(|| format!("is `stela serve` running at {address}?"))
}

pub fn run(command: LogsCommand, out: &mut dyn Write) -> anyhow::Result<()> {
    match command {
        LogsCommand::Tail(args) => crate::tail_cmd::run(&args, out)?,
        LogsCommand::List { target, json } => {
            let answer = connect(&target)?.request(RequestBody::ListLogs)?;
            let ResponseBody::Logs(logs) = answer else {
                anyhow::bail!("unexpected answer to ListLogs: {answer:?}");
            };
            if json {
                writeln!(
                    out,
                    "{}",
                    serde_json::to_string_pretty(&listing_json(&logs))?
                )?;
            } else {
                print_listing(&logs, out)?;
            }
        }
        LogsCommand::Delete { name, target } => {
            let answer = connect(&target)?.request(RequestBody::DeleteLog { log: name })?;
            let ResponseBody::Deleted {
                log,
                segments,
                bytes,
            } = answer
            else {
                anyhow::bail!("unexpected answer to DeleteLog: {answer:?}");
            };
            writeln!(
                out,
                "deleted log {log}: {segments} segment(s), {bytes} bytes"
            )?;
        }
        LogsCommand::ReleaseHold {
            name,
            holder,
            target,
        } => {
            let answer =
                connect(&target)?.request(RequestBody::ReleaseHold { log: name, holder })?;
            let ResponseBody::HoldReleased { log, holder, lsn } = answer else {
                anyhow::bail!("unexpected answer to ReleaseHold: {answer:?}");
            };
            writeln!(
                out,
                "released the hold of {holder} on log {log} (it kept the copy from LSN {lsn} on)"
            )?;
        }
    }
    Ok(())
}

fn print_listing(logs: &[LogListing], out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<24} {:>7} {:>8} {:>14} {:>10} {:>10}  state",
        "log", "handles", "segments", "bytes", "first LSN", "last LSN"
    )?;
    for log in logs {
        writeln!(
            out,
            "{:<24} {:>7} {:>8} {:>14} {:>10} {:>10}  {}",
            log.name,
            log.handles,
            log.segments,
            log.bytes_on_disk,
            log.first_lsn,
            log.last_lsn.map_or("-".to_owned(), |l| l.to_string()),
            log.state
        )?;
        for hold in &log.holds {
            let why = hold
                .unreadable
                .as_ref()
                .map_or(String::new(), |why| format!(" (unreadable: {why})"));
            writeln!(out, "  held from LSN {} by {}{why}", hold.lsn, hold.holder)?;
        }
    }
    Ok(())
}

fn listing_json(logs: &[LogListing]) -> serde_json::Value {
    serde_json::Value::Array(
        logs.iter()
            .map(|l| {
                serde_json::json!({
                    "name": l.name, "handles": l.handles, "segments": l.segments,
                    "bytes_on_disk": l.bytes_on_disk, "first_lsn": l.first_lsn,
                    "last_lsn": l.last_lsn, "state": l.state,
                    "holds": l.holds.iter().map(|h| serde_json::json!({
                        "lsn": h.lsn, "holder": h.holder, "unreadable": h.unreadable,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect(),
    )
}
