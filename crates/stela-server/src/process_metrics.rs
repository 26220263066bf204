//! The `process_*` metrics every Prometheus exporter serves (the names and types of the
//! client libraries' process collector), read from `/proc/self` at scrape time: CPU seconds,
//! resident and virtual memory, open and allowed file descriptors, threads, start time.
//!
//! Owns nothing the daemon uses: a scrape reads the kernel's accounting and sets these, so the
//! hot paths pay nothing. A value that cannot be read (no /proc) is left at its last value and
//! logged at debug: a scrape never fails for it.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicU64, Ordering};

/// The process's metrics, registered without the `stela_` prefix.
pub struct ProcessMetrics {
    cpu_seconds: Counter<f64, AtomicU64>,
    resident_memory_bytes: Gauge<u64, AtomicU64>,
    virtual_memory_bytes: Gauge<u64, AtomicU64>,
    open_fds: Gauge<u64, AtomicU64>,
    max_fds: Gauge<u64, AtomicU64>,
    threads: Gauge<u64, AtomicU64>,
    start_time_seconds: Gauge<f64, AtomicU64>,
}

/// What `/proc/self/stat` says, in the units the metrics use.
#[derive(Debug, PartialEq)]
struct Stat {
    cpu_seconds: f64,
    threads: u64,
    start_after_boot_seconds: f64,
    virtual_bytes: u64,
    resident_bytes: u64,
}

impl ProcessMetrics {
    pub fn register(registry: &mut Registry) -> ProcessMetrics {
        let metrics = ProcessMetrics {
            cpu_seconds: Counter::default(),
            resident_memory_bytes: Gauge::default(),
            virtual_memory_bytes: Gauge::default(),
            open_fds: Gauge::default(),
            max_fds: Gauge::default(),
            threads: Gauge::default(),
            start_time_seconds: Gauge::default(),
        };
        registry.register(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            metrics.cpu_seconds.clone(),
        );
        let gauges: [(&str, &str, &Gauge<u64, AtomicU64>); 5] = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                &metrics.resident_memory_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                &metrics.virtual_memory_bytes,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                &metrics.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors (the soft limit)",
                &metrics.max_fds,
            ),
            ("process_threads", "Number of OS threads", &metrics.threads),
        ];
        for (name, help, gauge) in gauges {
            registry.register(name, help, gauge.clone());
        }
        registry.register(
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch in seconds",
            metrics.start_time_seconds.clone(),
        );
        metrics
    }

    /// Reads `/proc/self` and sets every metric it could read.
    pub fn update(&self) {
        match std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|text| parse_stat(&text, clock_ticks(), page_size()))
        {
            Some(stat) => {
                // A counter set to the kernel's running total: it only grows.
                self.cpu_seconds
                    .inner()
                    .store(stat.cpu_seconds.to_bits(), Ordering::Relaxed);
                self.threads.set(stat.threads);
                self.virtual_memory_bytes.set(stat.virtual_bytes);
                self.resident_memory_bytes.set(stat.resident_bytes);
                if let Some(boot) = boot_time_seconds() {
                    self.start_time_seconds
                        .set(boot as f64 + stat.start_after_boot_seconds);
                }
            }
            None => tracing::debug!("metrics: /proc/self/stat unreadable"),
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            self.open_fds.set(fds.count() as u64);
        }
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
        if let Some(soft) = limit.current {
            self.max_fds.set(soft);
        }
    }
}

/// Parses `/proc/PID/stat` (proc(5)): the fields after the command's closing parenthesis, so a
/// command name with spaces or parentheses cannot shift them.
fn parse_stat(text: &str, ticks_per_second: u64, page_bytes: u64) -> Option<Stat> {
    let after_name = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // fields[0] is field 3 of proc(5) (state); field N is fields[N - 3].
    let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
    let ticks = ticks_per_second.max(1) as f64;
    Some(Stat {
        cpu_seconds: (field(14)? + field(15)?) as f64 / ticks,
        threads: field(20)?,
        start_after_boot_seconds: field(22)? as f64 / ticks,
        virtual_bytes: field(23)?,
        resident_bytes: field(24)? * page_bytes,
    })
}

/// The boot time, Unix seconds (`btime` in /proc/stat).
fn boot_time_seconds() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    stat.lines()
        .find_map(|line| line.strip_prefix("btime ")?.trim().parse().ok())
}

fn clock_ticks() -> u64 {
    // SAFETY: sysconf reads a constant of the C library; it has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks).unwrap_or(100)
}

fn page_size() -> u64 {
    // SAFETY: as above.
    let bytes = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(bytes).unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stat_line_is_read_after_the_command_name() {
        // A command name with a space and a parenthesis, as proc(5) allows.
        let line = "4242 (stela (x) y) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 50 0 0 20 0 \
                    7 0 12345 104857600 2560 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 \
                    1 0 0 0 0 0";
        let stat = parse_stat(line, 100, 4096).unwrap();
        assert_eq!(
            stat,
            Stat {
                cpu_seconds: 3.0,
                threads: 7,
                start_after_boot_seconds: 123.45,
                virtual_bytes: 104_857_600,
                resident_bytes: 2560 * 4096,
            }
        );
        assert_eq!(parse_stat("garbage", 100, 4096), None);
    }

    #[test]
    fn this_process_reads_as_running_with_memory_and_descriptors() {
        let mut registry = Registry::default();
        let metrics = ProcessMetrics::register(&mut registry);
        metrics.update();
        assert!(metrics.threads.get() >= 1);
        assert!(metrics.resident_memory_bytes.get() > 0);
        assert!(metrics.open_fds.get() >= 3);
        assert!(metrics.max_fds.get() >= metrics.open_fds.get());
        assert!(metrics.start_time_seconds.get() > 1.0e9);
    }
}
