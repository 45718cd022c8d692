//! A self-made SVG line chart: throughput against I/O size (or against streams when
//! only one I/O size ran), one line per transfer type (and I/O pattern).

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::cli::format_size;
use crate::report::Row;

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 540.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 300.0;
const TOP: f64 = 60.0;
const BOTTOM: f64 = 70.0;

fn color(xfer: &str) -> &'static str {
    match xfer {
        "ASYNC" => "#d62728",
        "SYNC" => "#ff7f0e",
        "CPUONLY" => "#7f7f7f",
        "CPU_GPU" => "#1f77b4",
        "GPU_COPY" => "#2ca02c",
        "CUFILE_ASYNC" => "#9467bd",
        "CUFILE_SYNC" => "#8c564b",
        _ => "#17becf",
    }
}

fn dash(io_type: &str) -> &'static str {
    match io_type {
        "WRITE" => "8,4",
        "RANDREAD" => "2,3",
        "RANDWRITE" => "8,3,2,3",
        _ => "none",
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A tick step of 1, 2 or 5 × 10^k giving about 5 ticks up to `max`.
fn tick_step(max: f64) -> f64 {
    let raw = (max / 5.0).max(1e-9);
    let magnitude = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * magnitude)
}

const IO_ORDER: &[&str] = &["READ", "WRITE", "RANDREAD", "RANDWRITE"];
const XFER_ORDER: &[&str] =
    &["ASYNC", "SYNC", "CPUONLY", "CPU_GPU", "GPU_COPY", "CUFILE_ASYNC", "CUFILE_SYNC"];

fn rank(order: &[&str], name: &str) -> usize {
    order.iter().position(|&n| n == name).unwrap_or(order.len())
}

/// A series: legend label, color, dash, and (x index, GiB/s) points.
struct Series {
    label: String,
    color: &'static str,
    dash: &'static str,
    points: Vec<(usize, f64)>,
}

/// X categories and series from the rows that hold a speed.
fn layout(rows: &[Row]) -> (String, Vec<String>, Vec<Series>) {
    let ok: Vec<&Row> = rows.iter().filter(|r| r.is_ok()).collect();
    let mut sizes: Vec<u64> = ok.iter().map(|r| r.io_size).collect();
    let mut streams: Vec<usize> = ok.iter().map(|r| r.streams).collect();
    sizes.sort_unstable();
    sizes.dedup();
    streams.sort_unstable();
    streams.dedup();
    let by_size = sizes.len() > 1 || streams.len() <= 1;
    let (axis, labels) = if by_size {
        ("I/O size", sizes.iter().map(|&s| format_size(s)).collect())
    } else {
        ("streams", streams.iter().map(ToString::to_string).collect())
    };
    let mut series: BTreeMap<(usize, usize, usize, String), Series> = BTreeMap::new();
    for row in ok {
        let mut label = format!("{} {}", row.io_type, row.xfer);
        if by_size && streams.len() > 1 {
            label.push_str(&format!(" S={}", row.streams));
        }
        let x = if by_size {
            sizes.iter().position(|&s| s == row.io_size)
        } else {
            streams.iter().position(|&s| s == row.streams)
        };
        let key =
            (rank(IO_ORDER, row.io_type), rank(XFER_ORDER, row.xfer), row.streams, label.clone());
        let entry = series.entry(key).or_insert_with(|| Series {
            label,
            color: color(row.xfer),
            dash: dash(row.io_type),
            points: Vec::new(),
        });
        entry.points.extend(x.zip(row.gib_per_s));
    }
    (axis.into(), labels, series.into_values().collect())
}

/// The chart as an SVG document; `None` when no row holds a speed.
pub fn render(rows: &[Row], title: &str) -> Option<String> {
    let (axis, labels, series) = layout(rows);
    let max = series.iter().flat_map(|s| s.points.iter().map(|p| p.1)).fold(0.0, f64::max);
    if series.is_empty() || labels.is_empty() {
        return None;
    }
    let (plot_w, plot_h) = (WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM);
    let step = tick_step(max);
    let y_max = (max / step).ceil().max(1.0) * step;
    let x_at = |i: usize| LEFT + (i as f64 + 0.5) * plot_w / labels.len() as f64;
    let y_at = |v: f64| TOP + plot_h * (1.0 - v / y_max);
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
         viewBox=\"0 0 {WIDTH} {HEIGHT}\" font-family=\"sans-serif\" font-size=\"12\">"
    );
    let _ = writeln!(svg, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>");
    let _ = writeln!(
        svg,
        "<text x=\"{}\" y=\"30\" font-size=\"16\" text-anchor=\"middle\">{}</text>",
        LEFT + plot_w / 2.0,
        escape(title)
    );
    axes(&mut svg, &axis, &labels, step, y_max, &x_at, &y_at);
    for (index, s) in series.iter().enumerate() {
        line(&mut svg, s, &x_at, &y_at);
        legend(&mut svg, s, index);
    }
    not_plotted(&mut svg, rows, series.len());
    svg.push_str("</svg>\n");
    Some(svg)
}

fn axes(
    svg: &mut String,
    axis: &str,
    labels: &[String],
    step: f64,
    y_max: f64,
    x_at: &dyn Fn(usize) -> f64,
    y_at: &dyn Fn(f64) -> f64,
) {
    let (x0, x1, y0) = (LEFT, WIDTH - RIGHT, HEIGHT - BOTTOM);
    let decimals = if step >= 1.0 { 0 } else { (-step.log10().floor()) as usize };
    let mut value = 0.0;
    while value <= y_max + step / 2.0 {
        let y = y_at(value);
        let _ = writeln!(
            svg,
            "<line x1=\"{x0}\" y1=\"{y:.1}\" x2=\"{x1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>"
        );
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{value:.decimals$}</text>",
            x0 - 6.0,
            y + 4.0
        );
        value += step;
    }
    let _ =
        writeln!(svg, "<line x1=\"{x0}\" y1=\"{TOP}\" x2=\"{x0}\" y2=\"{y0}\" stroke=\"black\"/>");
    let _ =
        writeln!(svg, "<line x1=\"{x0}\" y1=\"{y0}\" x2=\"{x1}\" y2=\"{y0}\" stroke=\"black\"/>");
    for (i, label) in labels.iter().enumerate() {
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            x_at(i),
            y0 + 18.0,
            escape(label)
        );
    }
    let _ = writeln!(
        svg,
        "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
        (x0 + x1) / 2.0,
        y0 + 45.0,
        escape(axis)
    );
    let _ = writeln!(
        svg,
        "<text x=\"20\" y=\"{:.1}\" text-anchor=\"middle\" transform=\"rotate(-90 20 {:.1})\">GiB/s</text>",
        TOP + (y0 - TOP) / 2.0,
        TOP + (y0 - TOP) / 2.0
    );
}

fn line(svg: &mut String, s: &Series, x_at: &dyn Fn(usize) -> f64, y_at: &dyn Fn(f64) -> f64) {
    let mut points = s.points.clone();
    points.sort_by_key(|p| p.0);
    let coords: Vec<String> =
        points.iter().map(|&(x, v)| format!("{:.1},{:.1}", x_at(x), y_at(v))).collect();
    let width = if s.label.contains(" ASYNC") { 3 } else { 2 };
    let _ = writeln!(
        svg,
        "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"{width}\" stroke-dasharray=\"{}\" points=\"{}\"/>",
        s.color,
        s.dash,
        coords.join(" ")
    );
    for &(x, v) in &points {
        let _ = writeln!(
            svg,
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3.5\" fill=\"{}\"><title>{}: {v:.3} GiB/s</title></circle>",
            x_at(x),
            y_at(v),
            s.color,
            escape(&s.label)
        );
    }
}

fn legend(svg: &mut String, s: &Series, index: usize) {
    let (x, y) = (WIDTH - RIGHT + 20.0, TOP + 10.0 + 20.0 * index as f64);
    let _ = writeln!(
        svg,
        "<line x1=\"{x}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"{}\" stroke-width=\"3\" stroke-dasharray=\"{}\"/>",
        x + 30.0,
        s.color,
        s.dash
    );
    let _ = writeln!(svg, "<text x=\"{}\" y=\"{}\">{}</text>", x + 38.0, y + 4.0, escape(&s.label));
}

/// Lists, under the legend, the series with a WRONG or FAILED point (not drawn).
fn not_plotted(svg: &mut String, rows: &[Row], legend_lines: usize) {
    let mut seen: Vec<String> = Vec::new();
    for row in rows.iter().filter(|r| !r.is_ok()) {
        let text = format!(
            "{} {} S={} {}: {}",
            row.io_type,
            row.xfer,
            row.streams,
            format_size(row.io_size),
            row.status
        );
        if !seen.contains(&text) {
            seen.push(text);
        }
    }
    let x = WIDTH - RIGHT + 20.0;
    let top = TOP + 20.0 * legend_lines as f64 + 20.0;
    if !seen.is_empty() {
        let _ = writeln!(
            svg,
            "<text x=\"{x}\" y=\"{top}\" fill=\"#555\">Not plotted (no speed):</text>"
        );
    }
    for (i, text) in seen.iter().take(12).enumerate() {
        let y = top + 16.0 * (i as f64 + 1.0);
        let _ = writeln!(
            svg,
            "<text x=\"{x}\" y=\"{y}\" fill=\"#b00\" font-size=\"11\">{}</text>",
            escape(text)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::Sample;
    use crate::cli::Mode;
    use crate::report::Case;
    use crate::workload::Xfer;

    #[test]
    fn chart_has_one_line_per_transfer_type() {
        let sample = Sample { seconds: 1.0, bytes: 1 << 30, ops: 8, ..Sample::default() };
        let mut rows = Vec::new();
        for io_size in [1u64 << 20, 16 << 20] {
            for xfer in [Xfer::Async, Xfer::CpuGpu] {
                let case = Case { mode: Mode::Read, io_size, streams: 2, xfer };
                rows.push(Row::new(
                    &case,
                    2,
                    std::slice::from_ref(&sample),
                    None,
                    true,
                    "page cache",
                ));
            }
        }
        let svg = render(&rows, "t <&>").unwrap();
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("16M") && svg.contains("t &lt;&amp;&gt;"));
        assert_eq!(tick_step(10.0), 2.0);
    }
}
