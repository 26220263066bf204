//! The dirty-byte cap: how much acknowledged data the daemon may hold so that, told power is
//! failing, it can write and sync all of it within half the power supply's hold-up window.
//!
//! At start the daemon writes a scratch file in its directory in 1 MiB sequential writes and
//! fdatasyncs it, and takes bytes / elapsed as the disk's rate. The elapsed time includes one
//! sync, as the emergency flush does. Half the window, not all of it: the other half is margin
//! for the notice's own latency and for a disk slower than when measured.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stela_proto::DirtyCap;
use stela_wal::storage::{OpenMode, Storage};

/// Bytes written by the measurement.
pub const MEASURE_BYTES: usize = 16 << 20;

/// Measures the sequential write + sync rate of `dir`, in bytes per second.
pub fn measure_write_rate(storage: &Arc<dyn Storage>, dir: &Path) -> std::io::Result<u64> {
    let path = dir.join(format!(".stela-measure-{}", std::process::id()));
    let _ = storage.remove(&path);
    let file = storage.open(&path, OpenMode::CreateNew)?;
    let chunk = vec![0x5au8; 1 << 20];
    let started = Instant::now();
    let result = (|| {
        for i in 0..MEASURE_BYTES / chunk.len() {
            file.write_all_at(&chunk, (i * chunk.len()) as u64)?;
        }
        file.sync_data()
    })();
    let elapsed = started.elapsed();
    drop(file);
    let _ = storage.remove(&path);
    result?;
    Ok((MEASURE_BYTES as f64 / elapsed.as_secs_f64().max(1e-9)) as u64)
}

/// The cap: min(pool size, rate x window / 2).
pub fn dirty_cap(pool_bytes: u64, write_bytes_per_s: u64, power_window: Duration) -> DirtyCap {
    let budget = power_window / 2;
    let window_bytes = (write_bytes_per_s as f64 * budget.as_secs_f64()) as u64;
    let bytes = pool_bytes.min(window_bytes);
    let limited_by = if bytes == pool_bytes {
        "the buffers"
    } else {
        "the power window"
    };
    DirtyCap {
        bytes,
        power_window_ms: power_window.as_millis() as u64,
        measured_write_bytes_per_s: write_bytes_per_s,
        window_bytes,
        pool_bytes,
        derivation: format!(
            "cap = min(buffers {pool_bytes} B, disk {:.1} MB/s x half of the {} ms window = {window_bytes} B) \
             = {bytes} B, limited by {limited_by}",
            write_bytes_per_s as f64 / 1e6,
            power_window.as_millis()
        ),
    }
}
