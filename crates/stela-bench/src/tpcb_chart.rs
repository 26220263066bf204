//! The SVG chart of `stela-bench tpcb --chart PATH`: the decoupled-persistence paper's Figure 4
//! drawn from our runs. Transactions per second (the median of the repeats) by the interval
//! between checkpoints and cleaning rounds, on a log axis from the most frequent to the rarest;
//! one line per pairing of checkpoint kind and cleaner, decoupled ones solid and classical
//! ones dashed; the peers, which have no such interval, as flat lines across the whole axis.
//!
//! Text is written as SVG `<text>` elements, so no font files or system libraries are needed.
//!
//! [`readings`] says what the same lines show in words: each line's spread across the intervals
//! and, at the shortest interval, each decoupled service against its classical counterpart.

use crate::tpcb_schema::TpcbRun;
use anyhow::anyhow;
use plotters::prelude::*;
use std::path::Path;

/// Colors: the four pairings of stela-store, then the peers.
const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(214, 39, 40),
    RGBColor(120, 120, 120),
    RGBColor(148, 103, 189),
];

/// One line: a system and its configuration, with (interval, median tps) points.
struct Line {
    label: String,
    system: String,
    checkpoints: String,
    cleaner: String,
    /// A peer: drawn flat across the axis.
    peer: bool,
    /// Classical checkpoints or cleaner: dashed.
    classical: bool,
    points: Vec<(u64, f64)>,
}

/// The median tps of each configuration, as lines.
fn lines(runs: &[TpcbRun]) -> Vec<Line> {
    let mut lines: Vec<Line> = Vec::new();
    let mut keys: Vec<(String, String, String)> = Vec::new();
    for run in runs {
        let key = (
            run.system.clone(),
            run.checkpoints.clone(),
            run.cleaner.clone(),
        );
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    // stela-store's pairings first (they take the first colors), the peers after.
    keys.sort_by_key(|(system, _, _)| system != "stela-store");
    for (system, checkpoints, cleaner) in keys {
        let mine: Vec<&TpcbRun> = runs
            .iter()
            .filter(|r| {
                (&r.system, &r.checkpoints, &r.cleaner) == (&system, &checkpoints, &cleaner)
            })
            .collect();
        let mut intervals: Vec<u64> = mine.iter().map(|r| r.interval_ms).collect();
        intervals.sort_unstable();
        intervals.dedup();
        let points = intervals
            .into_iter()
            .map(|interval| {
                let mut tps: Vec<f64> = mine
                    .iter()
                    .filter(|r| r.interval_ms == interval)
                    .map(|r| r.tps)
                    .collect();
                tps.sort_by(f64::total_cmp);
                (interval, tps[tps.len() / 2])
            })
            .collect();
        // stela-store on its embedded log or on a daemon's: both have the services' interval.
        let peer = !system.starts_with("stela-store");
        lines.push(Line {
            label: if peer {
                system.clone()
            } else if system == "stela-store" {
                format!("checkpoints {checkpoints}, cleaner {cleaner}")
            } else {
                format!("{system}, checkpoints {checkpoints}, cleaner {cleaner}")
            },
            system: system.clone(),
            peer,
            classical: checkpoints == "classical" || cleaner == "classical",
            checkpoints,
            cleaner,
            points,
        });
    }
    lines
}

/// What the lines of `runs` show, a sentence each: for every stela-store pairing run at more
/// than one interval, its spread (highest median less lowest, as a share of the highest: the
/// flatness the paper's Figure 4 is about); and for every classical pairing, the pairing that
/// differs from it only by being decoupled, against it at the shortest interval both ran.
pub fn readings(runs: &[TpcbRun]) -> Vec<String> {
    let lines = lines(runs);
    let mut said = Vec::new();
    for line in lines.iter().filter(|l| !l.peer && l.points.len() > 1) {
        let by_tps = |a: &&(u64, f64), b: &&(u64, f64)| a.1.total_cmp(&b.1);
        let (Some(low), Some(high)) = (
            line.points.iter().min_by(by_tps),
            line.points.iter().max_by(by_tps),
        ) else {
            continue;
        };
        if high.1 <= 0.0 {
            said.push(format!("{}: no transactions at any interval", line.label));
            continue;
        }
        said.push(format!(
            "{}: spread {:.1} % (lowest {:.0} tps at {} ms, highest {:.0} at {} ms)",
            line.label,
            (high.1 - low.1) / high.1 * 100.0,
            low.1,
            low.0,
            high.1,
            high.0
        ));
    }
    for classical in lines.iter().filter(|l| !l.peer && l.classical) {
        let Some(decoupled) = lines.iter().find(|l| {
            !l.peer
                && !l.classical
                && l.system == classical.system
                && l.checkpoints == decoupled_of(&classical.checkpoints)
                && l.cleaner == decoupled_of(&classical.cleaner)
        }) else {
            continue;
        };
        let shortest = classical
            .points
            .iter()
            .filter_map(|&(interval, tps)| {
                let theirs = decoupled.points.iter().find(|p| p.0 == interval)?;
                Some((interval, theirs.1 / tps))
            })
            .next();
        if let Some((interval, ratio)) = shortest {
            said.push(format!(
                "at {interval} ms: {} against {}: {ratio:.2}x",
                decoupled.label, classical.label
            ));
        }
    }
    for beside in lines.iter().filter(|l| !l.peer && l.system.contains('+')) {
        let alone_system = beside.system.split('+').next().unwrap_or_default();
        let Some(alone) = lines.iter().find(|l| {
            l.system == alone_system
                && l.checkpoints == beside.checkpoints
                && l.cleaner == beside.cleaner
        }) else {
            continue;
        };
        let ratios: Vec<String> = beside
            .points
            .iter()
            .filter_map(|&(interval, tps)| {
                let theirs = alone.points.iter().find(|p| p.0 == interval)?;
                Some(format!("{:.2}x at {interval} ms", tps / theirs.1))
            })
            .collect();
        if !ratios.is_empty() {
            said.push(format!(
                "{} against {alone_system}: {}",
                beside.label,
                ratios.join(", ")
            ));
        }
    }
    said
}

/// The kind a decoupled pairing has where `kind` is classical (any other kind stays).
fn decoupled_of(kind: &str) -> &str {
    if kind == "classical" {
        "decoupled"
    } else {
        kind
    }
}

/// Saves the chart of `runs` at `path`.
///
/// # Errors
/// No stela-store runs (the axis is their intervals), or the file cannot be written.
pub fn save_tpcb_chart(runs: &[TpcbRun], path: &Path) -> anyhow::Result<()> {
    let lines = lines(runs);
    let mut intervals: Vec<u64> = lines
        .iter()
        .filter(|l| !l.peer)
        .flat_map(|l| l.points.iter().map(|p| p.0))
        .collect();
    intervals.sort_unstable();
    intervals.dedup();
    let (Some(&first), Some(&last)) = (intervals.first(), intervals.last()) else {
        anyhow::bail!("no stela-store runs to chart (the chart's axis is their intervals)");
    };
    let run = &runs[0];
    let paced = run.varied.pacing(run.fixed_interval_ms);
    let caption = format!(
        "TPC-B, {} clients, {} durability: tps by {paced}",
        run.clients, run.durability
    );
    draw(&lines, &intervals, (first, last), &caption, path)
        .map_err(|e| anyhow!("chart {}: {e}", path.display()))
}

fn draw(
    lines: &[Line],
    intervals: &[u64],
    (first, last): (u64, u64),
    caption: &str,
    path: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let max_tps = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .fold(0f64, f64::max);
    // A log axis needs room on both sides of the points (and a positive start).
    let (x_lo, x_hi) = ((first as f64 / 2.0).max(0.5), last as f64 * 2.0);
    let root = SVGBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 20))
        .margin(20)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .build_cartesian_2d(
            (x_lo..x_hi)
                .log_scale()
                .with_key_points(intervals.iter().map(|&i| i as f64).collect::<Vec<_>>()),
            0f64..(max_tps * 1.25).max(1.0),
        )?;
    chart
        .configure_mesh()
        .x_desc("interval, ms (log scale)")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_desc("transactions/s (median of repeats)")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()?;
    for (index, line) in lines.iter().enumerate() {
        let color = COLORS[index % COLORS.len()];
        let style = ShapeStyle {
            color: color.to_rgba(),
            filled: false,
            stroke_width: if line.peer { 1 } else { 3 },
        };
        let points: Vec<(f64, f64)> = if line.peer {
            let tps = line.points.first().map_or(0.0, |p| p.1);
            vec![(x_lo, tps), (x_hi, tps)]
        } else {
            line.points.iter().map(|&(i, t)| (i as f64, t)).collect()
        };
        let drawn = if line.classical {
            chart.draw_series(DashedLineSeries::new(points.clone(), 8, 5, style))?
        } else {
            chart.draw_series(LineSeries::new(points.clone(), style))?
        };
        drawn
            .label(line.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        if !line.peer {
            chart.draw_series(
                points
                    .iter()
                    .map(|&(x, y)| Circle::new((x, y), 4, color.filled())),
            )?;
        }
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

    fn run(system: &str, checkpoints: &str, cleaner: &str, interval_ms: u64, tps: f64) -> TpcbRun {
        TpcbRun {
            system: system.into(),
            checkpoints: checkpoints.into(),
            cleaner: cleaner.into(),
            interval_ms,
            varied: crate::tpcb_schema::Varied::Both,
            fixed_interval_ms: 1000,
            clients: 2,
            durability: "disk".into(),
            repeat: 1,
            tps,
            p50_us: 1,
            p99_us: 2,
            cpu_s: 0.0,
        }
    }

    #[test]
    fn lines_take_the_median_of_the_repeats_per_interval() {
        let runs = [
            run("sqlite", "wal-autocheckpoint", "none", 0, 70.0),
            run("stela-store", "decoupled", "decoupled", 1, 100.0),
            run("stela-store", "decoupled", "decoupled", 1, 300.0),
            run("stela-store", "decoupled", "decoupled", 1, 200.0),
            run("stela-store", "decoupled", "decoupled", 10, 50.0),
        ];
        let lines = lines(&runs);
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].points, vec![(1, 200.0), (10, 50.0)]);
        assert!(!lines[0].peer && !lines[0].classical);
        assert!(lines[1].peer);
    }

    #[test]
    fn readings_give_each_lines_spread_and_decoupled_against_classical_at_the_shortest() {
        let runs = [
            run("stela-store", "classical", "decoupled", 1, 80.0),
            run("stela-store", "classical", "decoupled", 1000, 100.0),
            run("stela-store", "decoupled", "decoupled", 1, 96.0),
            run("stela-store", "decoupled", "decoupled", 1, 90.0),
            run("stela-store", "decoupled", "decoupled", 1, 99.0),
            run("stela-store", "decoupled", "decoupled", 1000, 100.0),
            run("rocksdb", "rocksdb-flush", "none", 0, 120.0),
        ];
        assert_eq!(
            readings(&runs),
            vec![
                "checkpoints classical, cleaner decoupled: spread 20.0 % (lowest 80 tps at 1 ms, \
                 highest 100 at 1000 ms)",
                "checkpoints decoupled, cleaner decoupled: spread 4.0 % (lowest 96 tps at 1 ms, \
                 highest 100 at 1000 ms)",
                "at 1 ms: checkpoints decoupled, cleaner decoupled against checkpoints classical, \
                 cleaner decoupled: 1.20x",
            ]
        );
    }

    #[test]
    fn a_neighbours_runs_are_a_line_of_their_own_compared_with_the_runs_alone() {
        let runs = [
            run("stela-store", "decoupled", "decoupled", 1, 90.0),
            run("stela-store", "decoupled", "decoupled", 10, 100.0),
            run(
                "stela-store+memory-neighbour",
                "decoupled",
                "decoupled",
                1,
                81.0,
            ),
            run(
                "stela-store+memory-neighbour",
                "decoupled",
                "decoupled",
                10,
                95.0,
            ),
        ];
        assert_eq!(
            readings(&runs),
            vec![
                "checkpoints decoupled, cleaner decoupled: spread 10.0 % (lowest 90 tps at 1 ms, \
                 highest 100 at 10 ms)",
                "stela-store+memory-neighbour, checkpoints decoupled, cleaner decoupled: spread \
                 14.7 % (lowest 81 tps at 1 ms, highest 95 at 10 ms)",
                "stela-store+memory-neighbour, checkpoints decoupled, cleaner decoupled against \
                 stela-store: 0.90x at 1 ms, 0.95x at 10 ms",
            ]
        );
    }

    #[test]
    fn the_store_on_a_daemon_has_lines_and_readings_of_its_own() {
        let runs = [
            run("stela-store", "classical", "decoupled", 1, 80.0),
            run("stela-store", "decoupled", "decoupled", 1, 100.0),
            run("stela-store-daemon", "classical", "decoupled", 1, 50.0),
            run("stela-store-daemon", "classical", "decoupled", 10, 0.0),
            run("stela-store-daemon", "decoupled", "decoupled", 1, 60.0),
        ];
        let lines = lines(&runs);
        assert!(lines.iter().all(|l| !l.peer));
        assert_eq!(
            readings(&runs),
            vec![
                "stela-store-daemon, checkpoints classical, cleaner decoupled: spread 100.0 % \
                 (lowest 0 tps at 10 ms, highest 50 at 1 ms)",
                "at 1 ms: checkpoints decoupled, cleaner decoupled against checkpoints \
                 classical, cleaner decoupled: 1.25x",
                "at 1 ms: stela-store-daemon, checkpoints decoupled, cleaner decoupled against \
                 stela-store-daemon, checkpoints classical, cleaner decoupled: 1.20x",
            ]
        );
        let idle = [
            run("stela-store", "decoupled", "decoupled", 1, 0.0),
            run("stela-store", "decoupled", "decoupled", 10, 0.0),
        ];
        assert_eq!(
            readings(&idle),
            vec!["checkpoints decoupled, cleaner decoupled: no transactions at any interval"]
        );
    }

    #[test]
    fn the_chart_is_an_svg_naming_each_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tpcb.svg");
        let runs = [
            run("stela-store", "classical", "decoupled", 1, 100.0),
            run("stela-store", "classical", "decoupled", 1000, 180.0),
            run("stela-store", "decoupled", "decoupled", 1, 170.0),
            run("stela-store", "decoupled", "decoupled", 1000, 175.0),
            run("rocksdb", "rocksdb-flush", "none", 0, 120.0),
        ];
        save_tpcb_chart(&runs, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"));
        for label in [
            "checkpoints classical, cleaner decoupled",
            "checkpoints decoupled, cleaner decoupled",
            "rocksdb",
        ] {
            assert!(svg.contains(label), "{label} missing");
        }
    }

    #[test]
    fn a_chart_without_stela_store_runs_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let runs = [run("sqlite", "wal-autocheckpoint", "none", 0, 70.0)];
        assert!(save_tpcb_chart(&runs, &dir.path().join("x.svg")).is_err());
    }
}
