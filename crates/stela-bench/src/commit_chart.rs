//! SVG charts of `stela-bench commit`: commits/s (log scale, since the modes span three orders
//! of magnitude) by concurrent clients, one line per mode (per mode, transport and idle
//! connections when several of those were run), one chart per record size.
//!
//! Text is written as SVG `<text>` elements, so no font files or system libraries are needed.

use crate::commit_bench::CommitRow;
use anyhow::anyhow;
use plotters::prelude::*;
use std::path::{Path, PathBuf};
use stela::drive::Mode;

/// One color per mode, in [`Mode::ALL`] order (embedded modes are drawn thinner than service ones).
const COLORS: [RGBColor; 6] = [
    RGBColor(214, 39, 40),
    RGBColor(255, 127, 14),
    RGBColor(140, 86, 75),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
];

/// Saves one chart per record size in `rows`: at `path` when there is one size, else at `path`
/// with `-<N>B` before the extension (`commit.svg` -> `commit-100B.svg`). Returns the paths.
///
/// # Errors
/// No rows, or a file cannot be written.
pub fn save_commit_charts(rows: &[CommitRow], path: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut sizes: Vec<usize> = rows.iter().map(|r| r.record_bytes).collect();
    sizes.sort_unstable();
    sizes.dedup();
    anyhow::ensure!(!sizes.is_empty(), "no results to chart");
    let mut saved = Vec::new();
    for &bytes in &sizes {
        let target = if sizes.len() == 1 {
            path.to_path_buf()
        } else {
            suffixed(path, &format!("-{bytes}B"))
        };
        let of_size: Vec<&CommitRow> = rows.iter().filter(|r| r.record_bytes == bytes).collect();
        draw(&of_size, bytes, &target).map_err(|e| anyhow!("chart {}: {e}", target.display()))?;
        saved.push(target);
    }
    Ok(saved)
}

fn suffixed(path: &Path, suffix: &str) -> PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = match path.extension() {
        Some(ext) => format!("{stem}{suffix}.{}", ext.to_string_lossy()),
        None => format!("{stem}{suffix}"),
    };
    path.with_file_name(name)
}

/// One line of a chart: a mode, and for the service modes how they ran.
struct Series {
    mode: Mode,
    label: String,
    /// 0 for the first transport and idle count of its mode, then 1, 2, ...: drawn thinner.
    variant: usize,
    points: Vec<(u32, f64)>,
}

fn draw(rows: &[&CommitRow], bytes: usize, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    // How the service rows ran, in the order they first appear; named in the legend only when
    // there was more than one transport or idle count.
    let mut transports: Vec<Option<&str>> = Vec::new();
    let mut idles: Vec<Option<usize>> = Vec::new();
    for row in rows.iter().filter(|r| r.transport.is_some()) {
        if !transports.contains(&row.transport.as_deref()) {
            transports.push(row.transport.as_deref());
        }
        if !idles.contains(&row.idle_connections) {
            idles.push(row.idle_connections);
        }
    }
    // Modes in their canonical order, each with its points sorted by clients.
    let mut series: Vec<Series> = Vec::new();
    for mode in Mode::ALL {
        let ways: Vec<(Option<&str>, Option<usize>)> = if mode.durability().is_some() {
            transports
                .iter()
                .flat_map(|&t| idles.iter().map(move |&i| (t, i)))
                .collect()
        } else {
            vec![(None, None)]
        };
        for (variant, &(transport, idle)) in ways.iter().enumerate() {
            let mut points: Vec<(u32, f64)> = rows
                .iter()
                .filter(|r| {
                    r.mode == mode.name()
                        && r.transport.as_deref() == transport
                        && r.idle_connections == idle
                        && r.commits_per_s > 0.0
                })
                .map(|r| (r.clients as u32, r.commits_per_s))
                .collect();
            if points.is_empty() {
                continue;
            }
            points.sort_by_key(|p| p.0);
            let mut label = mode.name().to_string();
            if let (true, Some(transport)) = (transports.len() > 1, transport) {
                label.push_str(&format!(" {transport}"));
            }
            if let (true, Some(idle)) = (idles.len() > 1, idle) {
                label.push_str(&format!(" {idle} idle"));
            }
            series.push(Series {
                mode,
                label,
                variant,
                points,
            });
        }
    }
    let all = series.iter().flat_map(|s| s.points.iter());
    let (min_rate, max_rate) = all
        .clone()
        .fold((f64::MAX, 0f64), |(lo, hi), p| (lo.min(p.1), hi.max(p.1)));
    let max_clients = all.clone().map(|p| p.0).max().unwrap_or(1);
    let mut ticks: Vec<u32> = all.map(|p| p.0).collect();
    ticks.sort_unstable();
    ticks.dedup();
    let (y_lo, y_hi) = if max_rate > 0.0 {
        (min_rate / 2.0, max_rate * 2.0)
    } else {
        (1.0, 10.0)
    };
    // A little room right of the last point.
    let x_max = (max_clients + max_clients / 4).max(2);

    let root = SVGBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("Commits/s by concurrent clients, {bytes} B records (msgpack)"),
            ("sans-serif", 22),
        )
        .margin(20)
        .x_label_area_size(45)
        .y_label_area_size(90)
        .build_cartesian_2d(
            (1u32..x_max).log_scale().with_key_points(ticks),
            (y_lo..y_hi).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc("concurrent clients (log scale)")
        .x_label_formatter(&|v| v.to_string())
        .y_desc("commits/s (log scale)")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()?;
    for line in &series {
        let index = Mode::ALL.iter().position(|&m| m == line.mode).unwrap_or(0);
        let color = COLORS[index % COLORS.len()];
        let width = if line.mode.durability().is_some() {
            3
        } else {
            2
        };
        let style = ShapeStyle {
            color: color.to_rgba(),
            filled: false,
            stroke_width: if line.variant == 0 { width } else { 1 },
        };
        let points = &line.points;
        chart
            .draw_series(LineSeries::new(points.clone(), style))?
            .label(line.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        chart.draw_series(
            points
                .iter()
                .map(|&(x, y)| Circle::new((x, y), 4, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(mode: Mode, clients: usize, bytes: usize, rate: f64) -> CommitRow {
        let service = mode.durability().is_some();
        CommitRow {
            mode: mode.name().into(),
            transport: service.then(|| "shm".to_string()),
            idle_connections: service.then_some(0),
            clients,
            record_bytes: bytes,
            commits: rate as u64,
            seconds: 1.0,
            commits_per_s: rate,
            p50_us: Some(10.0),
            p99_us: Some(20.0),
            daemon_rss_kib: None,
            daemon_threads: None,
            daemon_connections: None,
        }
    }

    #[test]
    fn one_chart_per_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("commit.svg");
        let mut rows = Vec::new();
        for bytes in [100, 4096] {
            for (i, mode) in Mode::ALL.into_iter().enumerate() {
                for c in [1, 4, 16, 64] {
                    rows.push(row(mode, c, bytes, 1000.0 * (i + 1) as f64 * c as f64));
                }
            }
        }
        let saved = save_commit_charts(&rows, &path).unwrap();
        assert_eq!(
            saved,
            vec![
                dir.path().join("commit-100B.svg"),
                dir.path().join("commit-4096B.svg")
            ]
        );
        let svg = std::fs::read_to_string(&saved[0]).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("service-buffered"));

        // A second transport gets lines of its own, named in the legend.
        let mut socket: Vec<CommitRow> = rows
            .iter()
            .filter(|r| r.record_bytes == 100 && r.transport.is_some())
            .cloned()
            .collect();
        for row in &mut socket {
            row.transport = Some("socket".into());
            row.commits_per_s /= 2.0;
        }
        let both = dir.path().join("both.svg");
        let mut with_socket: Vec<CommitRow> = rows
            .iter()
            .filter(|r| r.record_bytes == 100)
            .cloned()
            .collect();
        with_socket.extend(socket);
        save_commit_charts(&with_socket, &both).unwrap();
        let svg = std::fs::read_to_string(&both).unwrap();
        assert!(svg.contains("service-buffered socket") && svg.contains("service-buffered shm"));
        assert!(
            svg.lines().any(|l| l.trim() == "embedded-unsafe"),
            "embedded lines keep their plain names"
        );

        let one: Vec<CommitRow> = rows.into_iter().filter(|r| r.record_bytes == 100).collect();
        assert_eq!(save_commit_charts(&one, &path).unwrap(), vec![path.clone()]);
        assert!(save_commit_charts(&[], &path).is_err());
    }
}
