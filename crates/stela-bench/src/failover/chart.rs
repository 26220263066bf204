//! The failover run as a chart, after the paper's Figures 5 to 7 (throughput over time, the
//! failure marked, the reprotection period shaded): acknowledged `replicated` commits per 100 ms
//! over the run, a vertical line at each fault's injection, labelled with its kind, and the
//! span from the restart of the old primary (or the end of the fault) to its reprotection
//! shaded.
//!
//! Text is written as SVG `<text>` elements, so no font files or system libraries are needed.

use super::events::Event;
use anyhow::anyhow;
use plotters::prelude::*;
use std::path::Path;

/// A fault as drawn: its label and times (ms on the run's clock).
pub struct Marker {
    pub label: String,
    pub inject_ms: f64,
    pub restore_ms: f64,
    pub recovered_ms: f64,
}

const BIN_MS: f64 = 100.0;

/// Acknowledgements per 100 ms bin from `t0_ms`: (bin start in seconds, count).
pub fn bins(events: &[Event], t0_ms: f64) -> Vec<(f64, u32)> {
    let mut counts: Vec<u32> = Vec::new();
    for event in events {
        if let Event::Ack { t_ms, .. } = event {
            if *t_ms < t0_ms {
                continue;
            }
            let bin = ((t_ms - t0_ms) / BIN_MS) as usize;
            if counts.len() <= bin {
                counts.resize(bin + 1, 0);
            }
            counts[bin] += 1;
        }
    }
    counts
        .into_iter()
        .enumerate()
        .map(|(i, n)| (i as f64 * BIN_MS / 1e3, n))
        .collect()
}

/// Writes the chart of `events` and `markers` (times from `t0_ms`) to `path`.
///
/// # Errors
/// No acknowledgement to draw, or the file cannot be written.
pub fn save(events: &[Event], markers: &[Marker], t0_ms: f64, path: &Path) -> anyhow::Result<()> {
    let points = bins(events, t0_ms);
    if points.is_empty() {
        anyhow::bail!("no acknowledged commit to chart");
    }
    let x_max = points.last().map_or(1.0, |p| p.0 + BIN_MS / 1e3).max(1.0);
    let y_max = f64::from(points.iter().map(|p| p.1).max().unwrap_or(1)).max(1.0) * 1.4;
    let secs = |ms: f64| (ms - t0_ms) / 1e3;
    let draw = || -> Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::new(path, (1200, 500)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "Acknowledged replicated commits per 100 ms, faults marked",
                ("sans-serif", 22),
            )
            .margin(20)
            .x_label_area_size(45)
            .y_label_area_size(80)
            .build_cartesian_2d(0f64..x_max, 0f64..y_max)?;
        chart
            .configure_mesh()
            .x_desc("seconds since the client started")
            .y_desc("commits acknowledged per 100 ms")
            .y_label_formatter(&|v| format!("{v:.0}"))
            .draw()?;
        let shade = RGBColor(44, 160, 44).mix(0.15);
        for m in markers {
            chart.draw_series(std::iter::once(Rectangle::new(
                [(secs(m.restore_ms), 0.0), (secs(m.recovered_ms), y_max)],
                shade.filled(),
            )))?;
        }
        let line = RGBColor(31, 119, 180);
        chart
            .draw_series(LineSeries::new(
                points.iter().map(|&(x, n)| (x, f64::from(n))),
                ShapeStyle {
                    color: line.to_rgba(),
                    filled: false,
                    stroke_width: 2,
                },
            ))?
            .label("acknowledged commits")
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], line));
        let red = RGBColor(214, 39, 40);
        for (i, m) in markers.iter().enumerate() {
            let x = secs(m.inject_ms);
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(x, 0.0), (x, y_max)],
                red.stroke_width(1),
            )))?;
            // Labels alternate between two heights so neighbours do not overlap; the top of the
            // chart is left to them and the legend.
            let y = y_max * if i % 2 == 0 { 0.80 } else { 0.74 };
            chart.draw_series(std::iter::once(Text::new(
                format!("{} {}", i + 1, m.label),
                (x, y),
                ("sans-serif", 13).into_font().color(&red),
            )))?;
        }
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(0.0, 0.0), (0.0, 0.0)],
                shade.filled(),
            )))?
            .label("restart (or end of the fault) to reprotected")
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 20, y + 5)], shade.filled()));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| anyhow!("chart {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(t_ms: f64) -> Event {
        Event::Ack {
            seq: 0,
            term: 1,
            lsn: 1,
            t_ms,
            wait_ms: 0.1,
        }
    }

    #[test]
    fn bins_count_acknowledgements_per_100_ms_and_the_svg_marks_faults() {
        let mut events: Vec<Event> = (0..50).map(|i| ack(1000.0 + f64::from(i) * 10.0)).collect();
        events.push(ack(1750.0));
        let b = bins(&events, 1000.0);
        assert_eq!(b.len(), 8);
        assert_eq!((b[0].1, b[4].1, b[5].1, b[7].1), (10, 10, 0, 1));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("failover.svg");
        let markers = [Marker {
            label: "kill-primary".into(),
            inject_ms: 1500.0,
            restore_ms: 1600.0,
            recovered_ms: 1700.0,
        }];
        save(&events, &markers, 1000.0, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.contains("1 kill-primary"),
            "{svg}"
        );
        assert!(save(&[], &markers, 0.0, &path).is_err());
    }
}
