//! The daemon's commands: `stela serve`, and the tools that talk to a running daemon
//! (`stela status`, `stela power-fail`, `stela power-restore`).
//!
//! Which socket a tool talks to: `--socket PATH`, else `--dir DIR` (its `DIR/stela.sock`), else
//! `$STELA_SOCKET`, else `/run/stela/stela.sock` (where the shipped systemd unit puts it).

use anyhow::Context;
use clap::Args;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use stela_client::{Address, Connection};
use stela_proto::{RequestBody, ResponseBody, StatusReport};
use stela_server::{Server, ServerConfig};

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Directory of the daemon: its logs live in DIR/logs/NAME.
    #[arg(long)]
    pub dir: PathBuf,
    /// Unix socket to listen on (default DIR/stela.sock).
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Permission bits of the socket, in octal.
    #[arg(long, default_value = "600", value_parser = parse_octal)]
    pub socket_mode: u32,
    /// Also listen on TCP at this address (no authentication: bind to a trusted network).
    #[arg(long)]
    pub tcp: Option<SocketAddr>,
    /// Number of log buffers.
    #[arg(long, default_value_t = 6)]
    pub buffers: usize,
    /// Size of each buffer (bytes; suffixes K, KiB, M, MiB accepted).
    #[arg(long, default_value = "512KiB", value_parser = parse_size)]
    pub buffer_size: usize,
    /// A buffer is written once it holds this many bytes (one disk block by default).
    #[arg(long, default_value = "4096", value_parser = parse_size)]
    pub write_threshold: usize,
    /// Every buffer is written at least this often (milliseconds).
    #[arg(long, default_value_t = 1000)]
    pub flush_interval: u64,
    /// Hold-up time of the power supply after a power-failure notice (milliseconds). Dirty
    /// bytes are capped so that writing them takes at most half of it.
    #[arg(long, default_value_t = 50)]
    pub power_window: u64,
    /// Skip the start-up disk measurement and assume this write rate (bytes/s).
    #[arg(long)]
    pub assume_write_rate: Option<u64>,
    /// Microseconds a connection polls for its next request before sleeping (0: never).
    #[arg(long, default_value_t = 50)]
    pub spin_us: u64,
}

/// Which daemon a tool talks to.
#[derive(Args, Debug, Clone)]
pub struct TargetArgs {
    /// The daemon's Unix socket.
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// The daemon's directory (its socket is DIR/stela.sock).
    #[arg(long, conflicts_with = "socket")]
    pub dir: Option<PathBuf>,
}

impl TargetArgs {
    pub fn address(&self) -> Address {
        if let Some(socket) = &self.socket {
            return Address::Unix(socket.clone());
        }
        if let Some(dir) = &self.dir {
            return Address::Unix(dir.join("stela.sock"));
        }
        match std::env::var_os("STELA_SOCKET") {
            Some(path) => Address::Unix(path.into()),
            None => Address::Unix("/run/stela/stela.sock".into()),
        }
    }
}

fn parse_octal(text: &str) -> Result<u32, String> {
    u32::from_str_radix(text.trim_start_matches("0o"), 8)
        .map_err(|e| format!("not an octal mode: {e}"))
}

/// Parses "4096", "512K", "512KiB", "4M", "1MiB" (K and M are binary: 1024, 1024^2).
pub fn parse_size(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let digits = text.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &text[digits.len()..];
    let number: usize = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a size"))?;
    let scale = match unit {
        "" | "B" => 1,
        "K" | "KiB" | "k" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        _ => return Err(format!("unknown size unit {unit:?} (use K/KiB or M/MiB)")),
    };
    number
        .checked_mul(scale)
        .ok_or_else(|| format!("{text} is too large"))
}

pub fn serve(args: ServeArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut config = ServerConfig::new(&args.dir);
    config.socket = args.socket;
    config.socket_mode = args.socket_mode;
    config.tcp = args.tcp;
    config.buffers = args.buffers;
    config.buffer_bytes = args.buffer_size;
    config.write_threshold = args.write_threshold;
    config.flush_interval = Duration::from_millis(args.flush_interval.max(1));
    config.power_window = Duration::from_millis(args.power_window.max(1));
    config.assume_write_rate = args.assume_write_rate;
    config.spin = Duration::from_micros(args.spin_us);
    config.handle_signals = true;
    let server = Server::start(config).context("starting the daemon")?;
    let status = server.status();
    writeln!(
        out,
        "stela serve: listening on {}",
        server.socket_path().display()
    )?;
    if let Some(addr) = server.tcp_addr() {
        writeln!(out, "stela serve: listening on tcp://{addr}")?;
    }
    writeln!(out, "stela serve: {}", status.dirty_cap.derivation)?;
    writeln!(
        out,
        "stela serve: pid {}; SIGPWR flushes for a power failure, SIGTERM flushes and exits",
        status.pid
    )?;
    out.flush()?;
    server
        .run_until_stopped()
        .map_err(|failures| anyhow::anyhow!("stopped with failures: {failures}"))?;
    writeln!(out, "stela serve: every buffer written and synced; stopped")?;
    Ok(())
}

fn connect(target: &TargetArgs) -> anyhow::Result<Connection> {
    let address = target.address();
    Connection::connect_with(&address, Duration::ZERO)
        .with_context(|| format!("is `stela serve` running at {address}?"))
}

pub fn status(target: TargetArgs, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let answer = connect(&target)?.request(RequestBody::Status)?;
    let ResponseBody::Status(report) = answer else {
        anyhow::bail!("unexpected answer to Status: {answer:?}");
    };
    if json {
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&status_json(&report))?
        )?;
    } else {
        print_status(&report, out)?;
    }
    Ok(())
}

pub fn power_fail(target: TargetArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let answer = connect(&target)?.request(RequestBody::PowerFail)?;
    let ResponseBody::PowerFailed(flush) = answer else {
        anyhow::bail!("unexpected answer to PowerFail: {answer:?}");
    };
    writeln!(
        out,
        "power-fail: wrote and synced {} bytes in {:.3} ms (budget {:.1} ms); writes refused until power-restore",
        flush.bytes,
        flush.micros as f64 / 1e3,
        flush.budget_micros as f64 / 1e3
    )?;
    for failure in &flush.failures {
        writeln!(out, "power-fail: NOT FLUSHED: {failure}")?;
    }
    if !flush.failures.is_empty() {
        anyhow::bail!("{} log(s) could not be flushed", flush.failures.len());
    }
    Ok(())
}

pub fn power_restore(target: TargetArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    match connect(&target)?.request(RequestBody::PowerRestore)? {
        ResponseBody::PowerRestored => {
            writeln!(out, "power-restore: writes admitted again")?;
            Ok(())
        }
        other => anyhow::bail!("unexpected answer to PowerRestore: {other:?}"),
    }
}

fn print_status(report: &StatusReport, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "{} (pid {}), dir {}, up {:.1} s, {} connection(s)",
        report.server,
        report.pid,
        report.dir,
        report.uptime_ms as f64 / 1e3,
        report.connections
    )?;
    writeln!(out, "power: {}", report.power)?;
    writeln!(
        out,
        "buffers: {} x {} B, {} free; flush interval {} ms",
        report.buffers, report.buffer_bytes, report.free_buffers, report.flush_interval_ms
    )?;
    writeln!(
        out,
        "dirty: {} B of a cap of {} B",
        report.dirty_bytes, report.dirty_cap.bytes
    )?;
    writeln!(out, "  {}", report.dirty_cap.derivation)?;
    writeln!(
        out,
        "appends that waited for space: {}; bytes written: {}",
        report.appends_waited, report.bytes_written
    )?;
    if let Some(flush) = &report.last_emergency_flush {
        writeln!(
            out,
            "last emergency flush: {} B in {:.3} ms (budget {:.1} ms){}",
            flush.bytes,
            flush.micros as f64 / 1e3,
            flush.budget_micros as f64 / 1e3,
            if flush.failures.is_empty() {
                String::new()
            } else {
                format!("; FAILED: {}", flush.failures.join("; "))
            }
        )?;
    }
    writeln!(out, "logs:")?;
    for log in &report.logs {
        let p = log.positions;
        writeln!(
            out,
            "  {:<20} {:<8} LSN {}..={}, durable {}, dirty {} B{}",
            log.name,
            log.codec,
            p.first_lsn,
            p.last_lsn,
            p.durable_lsn,
            log.dirty_bytes,
            log.failure
                .as_deref()
                .map(|f| format!(", STOPPED: {f}"))
                .unwrap_or_default()
        )?;
    }
    writeln!(out, "what an acknowledgement survives:")?;
    for line in &report.crash_semantics {
        writeln!(out, "  - {line}")?;
    }
    Ok(())
}

fn status_json(report: &StatusReport) -> serde_json::Value {
    serde_json::json!({
        "server": report.server, "pid": report.pid, "dir": report.dir, "uptime_ms": report.uptime_ms,
        "connections": report.connections, "power": report.power,
        "buffers": report.buffers, "buffer_bytes": report.buffer_bytes, "free_buffers": report.free_buffers,
        "flush_interval_ms": report.flush_interval_ms,
        "dirty_bytes": report.dirty_bytes,
        "dirty_cap": {
            "bytes": report.dirty_cap.bytes, "power_window_ms": report.dirty_cap.power_window_ms,
            "measured_write_bytes_per_s": report.dirty_cap.measured_write_bytes_per_s,
            "window_bytes": report.dirty_cap.window_bytes, "pool_bytes": report.dirty_cap.pool_bytes,
            "derivation": report.dirty_cap.derivation,
        },
        "appends_waited": report.appends_waited, "bytes_written": report.bytes_written,
        "last_emergency_flush": report.last_emergency_flush.as_ref().map(|f| serde_json::json!({
            "bytes": f.bytes, "micros": f.micros, "budget_micros": f.budget_micros,
            "at_unix_ms": f.at_unix_ms, "failures": f.failures,
        })),
        "logs": report.logs.iter().map(|l| serde_json::json!({
            "name": l.name, "codec": l.codec, "first_lsn": l.positions.first_lsn,
            "last_lsn": l.positions.last_lsn, "durable_lsn": l.positions.durable_lsn,
            "dirty_bytes": l.dirty_bytes, "failure": l.failure,
        })).collect::<Vec<_>>(),
        "crash_semantics": report.crash_semantics,
    })
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512KiB"), Ok(512 << 10));
        assert_eq!(parse_size("512K"), Ok(512 << 10));
        assert_eq!(parse_size("2M"), Ok(2 << 20));
        assert!(parse_size("12XB").unwrap_err().contains("unit"));
        assert!(parse_size("lots").is_err());
    }
}
