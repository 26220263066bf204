//! An SVG chart of durable write throughput by number of writers: stela against its peers.
//!
//! Text is written as SVG `<text>` elements, so no font files or system libraries are needed.

use crate::wal_bench::ResultRow;
use anyhow::anyhow;
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// Draws records/s (y) by writers (x, log scale) of the durable (fdatasync) write rows, one line
/// per system and configuration. When the rows hold several codecs, only MessagePack is drawn
/// (or the first codec, without MessagePack rows).
///
/// # Errors
/// No durable write rows, or the file cannot be written.
pub fn save_chart(rows: &[ResultRow], path: &Path) -> anyhow::Result<()> {
    let durable: Vec<&ResultRow> = rows
        .iter()
        .filter(|r| r.op == "write" && r.sync == "fdatasync")
        .collect();
    let codec = if durable.iter().any(|r| r.codec == "msgpack") {
        "msgpack".to_string()
    } else {
        durable
            .first()
            .map(|r| r.codec.clone())
            .ok_or_else(|| anyhow!("no durable (--sync fdatasync) write results to chart"))?
    };
    // (system, config) -> [(writers, records/s)], systems in the order they first appear.
    let mut order: Vec<(String, String)> = Vec::new();
    let mut series: BTreeMap<(String, String), Vec<(u32, f64)>> = BTreeMap::new();
    for row in durable.iter().filter(|r| r.codec == codec) {
        let key = (row.system.clone(), row.config.clone());
        if !order.contains(&key) {
            order.push(key.clone());
        }
        series
            .entry(key)
            .or_default()
            .push((row.writers as u32, row.records_per_s));
    }
    let max_writers = series.values().flatten().map(|p| p.0).max().unwrap_or(1);
    let max_rate = series.values().flatten().map(|p| p.1).fold(0.0, f64::max);
    // A little room right of the last point; ticks exactly at the writer counts measured.
    let x_max = (max_writers + max_writers / 4).max(2);
    let mut ticks: Vec<u32> = series.values().flatten().map(|p| p.0).collect();
    ticks.sort_unstable();
    ticks.dedup();
    let systems: Vec<&String> = {
        let mut s: Vec<&String> = order.iter().map(|(system, _)| system).collect();
        s.dedup();
        s
    };

    let draw = || -> Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::new(path, (960, 600)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!("Durable writes (fdatasync), {codec}: records/s by concurrent writers"),
                ("sans-serif", 22),
            )
            .margin(20)
            .x_label_area_size(45)
            .y_label_area_size(90)
            .build_cartesian_2d(
                (1u32..x_max).log_scale().with_key_points(ticks.clone()),
                0f64..(max_rate * 1.1).max(1.0),
            )?;
        chart
            .configure_mesh()
            .x_desc("concurrent writers (log scale)")
            .x_label_formatter(&|v| v.to_string())
            .y_desc("records/s")
            .y_label_formatter(&|v| format!("{v:.0}"))
            .draw()?;
        for (system, config) in &order {
            let mut points = series[&(system.clone(), config.clone())].clone();
            points.sort_by_key(|p| p.0);
            let index = systems.iter().position(|s| *s == system).unwrap_or(0);
            let color = COLORS[index % COLORS.len()];
            let style = ShapeStyle {
                color: color.to_rgba(),
                filled: false,
                stroke_width: match config.as_str() {
                    "A" => 2,
                    "B" => 3,
                    _ => 4,
                },
            };
            chart
                .draw_series(LineSeries::new(points.clone(), style))?
                .label(format!("{system} (config {config})"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
            chart.draw_series(
                points
                    .iter()
                    .map(|&(x, y)| Circle::new((x, y), 4, color.filled())),
            )?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
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

    fn row(system: &str, writers: usize, rate: f64) -> ResultRow {
        ResultRow {
            system: system.into(),
            codec: "msgpack".into(),
            config: "A".into(),
            sync: "fdatasync".into(),
            writers,
            op: "write".into(),
            records: 1000,
            seconds: 1000.0 / rate,
            mb_per_s: 0.1,
            records_per_s: rate,
            p50_us: Some(1.0),
            p99_us: Some(2.0),
        }
    }

    #[test]
    fn writes_an_svg() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chart.svg");
        let mut rows = Vec::new();
        for (i, w) in [1, 4, 16, 64].into_iter().enumerate() {
            rows.push(row("stela", w, 5000.0 * (i + 1) as f64));
            rows.push(row("okaywal", w, 4000.0 * (i + 1) as f64));
            rows.push(row("raft-engine", w, 3000.0 * (i + 1) as f64));
        }
        save_chart(&rows, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("raft-engine (config A)"));
        assert!(save_chart(&[], &path).is_err());
    }
}
