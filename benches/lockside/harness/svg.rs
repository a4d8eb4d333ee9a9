//! Line charts as SVG, written by hand (a few shapes and text do not earn a plotting
//! crate): a title over a grid of panels, each with its own y axis from zero, the
//! shared x axis, and one line per series with its legend. The fleet phase draws its
//! curves with it (`docs/fleet.svg`).

use std::fmt::Write;

/// Panel size and margins, in px.
const PANEL_W: f64 = 460.0;
const PANEL_H: f64 = 280.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 34.0;
const BOTTOM: f64 = 44.0;
/// Panels per row.
const COLUMNS: usize = 2;
/// Room for the chart's title, subtitle and legend.
const HEADER: f64 = 80.0;
/// Series colours, in order (distinguishable for the common colour blindnesses).
const COLOURS: [&str; 6] = [
    "#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9",
];

/// A whole chart: panels side by side, [`COLUMNS`] per row.
pub(crate) struct Chart {
    pub(crate) title: String,
    /// A line under the title: what was measured, and how.
    pub(crate) subtitle: String,
    pub(crate) x_label: String,
    /// One legend for every panel, under the subtitle: a line's name, colour and dash
    /// mean the same in each panel (its points are not drawn).
    pub(crate) legend: Vec<Series>,
    pub(crate) panels: Vec<Panel>,
}

/// One plot: a title (the y quantity and unit) and its lines.
pub(crate) struct Panel {
    pub(crate) title: String,
    pub(crate) series: Vec<Series>,
}

/// One line: (x, y) points in x order; points that are not finite are left out.
pub(crate) struct Series {
    /// Its name in the legend.
    pub(crate) name: String,
    pub(crate) points: Vec<(f64, f64)>,
    /// Index into the colours: series of one family share it across panels.
    pub(crate) colour: usize,
    pub(crate) dashed: bool,
}

/// Maps a data interval onto a pixel interval (reversed for y: pixels grow downwards).
#[derive(Clone, Copy, Debug)]
struct Scale {
    from: (f64, f64),
    to: (f64, f64),
}

impl Scale {
    fn map(self, v: f64) -> f64 {
        let (d0, d1) = self.from;
        let (r0, r1) = self.to;
        r0 + (v - d0) / (d1 - d0) * (r1 - r0)
    }
}

/// Round tick values from zero (or below, for negative data) to at least `hi`, at most
/// about `max` of them: steps of 1, 2 or 5 times a power of ten.
fn ticks(lo: f64, hi: f64, max: usize) -> Vec<f64> {
    let lo = lo.min(0.0);
    let hi = if hi > lo { hi } else { lo + 1.0 };
    let raw = (hi - lo) / max.max(2) as f64;
    let power = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * power);
    // A hair under: a figure computed in floating point (3 × 0.1 is 0.30000000000000004)
    // must not get a tick of its own past the data.
    let (first, last) = ((lo / step).floor() as i64, (hi / step - 1e-9).ceil() as i64);
    (first..=last.max(first + 1))
        .map(|k| k as f64 * step)
        .collect()
}

/// A tick label: no trailing zeros, thousands as `k`.
fn label(v: f64) -> String {
    if v.abs() >= 10_000.0 {
        return format!("{}k", label(v / 1000.0));
    }
    let text = format!("{v:.3}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text == "-0" {
        "0".into()
    } else {
        text.into()
    }
}

/// Text for SVG: the five XML specials escaped.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&apos;")
}

/// The extent of every finite point of `series`: ((x min, x max), y max).
fn extent(series: &[Series]) -> ((f64, f64), f64) {
    let points = series.iter().flat_map(|s| &s.points);
    let finite = points.filter(|(x, y)| x.is_finite() && y.is_finite());
    finite.fold(
        ((f64::INFINITY, f64::NEG_INFINITY), 0.0f64),
        |((x0, x1), y1), (x, y)| ((x0.min(*x), x1.max(*x)), y1.max(*y)),
    )
}

/// The chart as an SVG document.
pub(crate) fn render(chart: &Chart) -> String {
    let rows = chart.panels.len().div_ceil(COLUMNS).max(1);
    let (width, height) = (PANEL_W * COLUMNS as f64, HEADER + PANEL_H * rows as f64);
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        svg,
        r##"<rect width="{width}" height="{height}" fill="#ffffff"/>"##
    );
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="24" font-size="17" font-weight="bold" text-anchor="middle">{}</text>"#,
        width / 2.0,
        escape(&chart.title)
    );
    let _ = writeln!(
        svg,
        r##"<text x="{}" y="44" fill="#555555" text-anchor="middle">{}</text>"##,
        width / 2.0,
        escape(&chart.subtitle)
    );
    // The legend, centred: a 22 px line, a gap, then the name at about 7 px a letter.
    let widths: Vec<f64> = chart
        .legend
        .iter()
        .map(|s| 28.0 + 7.0 * s.name.chars().count() as f64 + 24.0)
        .collect();
    let mut x = (width - widths.iter().sum::<f64>()) / 2.0;
    for (entry, w) in chart.legend.iter().zip(widths) {
        legend_entry(&mut svg, entry, (x, 66.0));
        x += w;
    }
    for (i, panel) in chart.panels.iter().enumerate() {
        let x = PANEL_W * (i % COLUMNS) as f64;
        let y = HEADER + PANEL_H * (i / COLUMNS) as f64;
        draw_panel(&mut svg, panel, &chart.x_label, (x, y));
    }
    svg.push_str("</svg>\n");
    svg
}

/// One panel with its top-left corner at `origin`.
fn draw_panel(svg: &mut String, panel: &Panel, x_label: &str, origin: (f64, f64)) {
    let (ox, oy) = origin;
    let (left, right) = (ox + LEFT, ox + PANEL_W - RIGHT);
    let (top, bottom) = (oy + TOP, oy + PANEL_H - BOTTOM);
    let ((x0, x1), y1) = extent(&panel.series);
    let (x0, x1) = if x0 <= x1 { (x0, x1) } else { (0.0, 1.0) };
    let x_ticks = ticks(0.0, x1.max(x0), 6);
    let y_ticks = ticks(0.0, y1, 5);
    let sx = Scale {
        from: (x_ticks[0], x_ticks[x_ticks.len() - 1]),
        to: (left, right),
    };
    let sy = Scale {
        from: (y_ticks[0], y_ticks[y_ticks.len() - 1]),
        to: (bottom, top),
    };
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" font-size="13" font-weight="bold" text-anchor="middle">{}</text>"#,
        (left + right) / 2.0,
        oy + TOP - 12.0,
        escape(&panel.title)
    );
    for t in &y_ticks {
        let y = sy.map(*t);
        let _ = writeln!(
            svg,
            r##"<line x1="{left}" y1="{y:.1}" x2="{right}" y2="{y:.1}" stroke="#e5e5e5"/><text x="{}" y="{:.1}" text-anchor="end" fill="#333333">{}</text>"##,
            left - 6.0,
            y + 4.0,
            label(*t)
        );
    }
    for t in &x_ticks {
        let x = sx.map(*t);
        let _ = writeln!(
            svg,
            r##"<line x1="{x:.1}" y1="{bottom}" x2="{x:.1}" y2="{}" stroke="#333333"/><text x="{x:.1}" y="{}" text-anchor="middle" fill="#333333">{}</text>"##,
            bottom + 4.0,
            bottom + 17.0,
            label(*t)
        );
    }
    let _ = writeln!(
        svg,
        r##"<path d="M{left},{top} V{bottom} H{right}" fill="none" stroke="#333333"/><text x="{}" y="{}" text-anchor="middle">{}</text>"##,
        (left + right) / 2.0,
        bottom + 34.0,
        escape(x_label)
    );
    for series in &panel.series {
        draw_series(svg, series, sx, sy);
    }
}

/// The colour of a series and its dash attribute.
fn stroke(series: &Series) -> (&'static str, &'static str) {
    let colour = COLOURS[series.colour % COLOURS.len()];
    let dash = if series.dashed {
        r#" stroke-dasharray="6 4""#
    } else {
        ""
    };
    (colour, dash)
}

/// A legend entry, its line starting at `at`.
fn legend_entry(svg: &mut String, series: &Series, at: (f64, f64)) {
    let (colour, dash) = stroke(series);
    let (x, y) = at;
    let _ = writeln!(
        svg,
        r#"<line x1="{x}" y1="{y}" x2="{}" y2="{y}" stroke="{colour}" stroke-width="2"{dash}/><text x="{}" y="{}">{}</text>"#,
        x + 22.0,
        x + 28.0,
        y + 4.0,
        escape(&series.name)
    );
}

/// A series' line and its points.
fn draw_series(svg: &mut String, series: &Series, sx: Scale, sy: Scale) {
    let (colour, dash) = stroke(series);
    let points: Vec<(f64, f64)> = series
        .points
        .iter()
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .map(|(x, y)| (sx.map(*x), sy.map(*y)))
        .collect();
    let path: Vec<String> = points
        .iter()
        .map(|(x, y)| format!("{x:.1},{y:.1}"))
        .collect();
    let _ = writeln!(
        svg,
        r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>"#,
        path.join(" ")
    );
    for (x, y) in &points {
        let _ = writeln!(
            svg,
            r#"<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="{colour}"/>"#
        );
    }
}

#[cfg(test)]
mod tests {
    // Run by tests/bench_units.rs; the bench target itself has no harness, so there
    // the tests below are compiled out and this import goes unused.
    #[allow(unused_imports)]
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_data() {
        // Each rounded to a millionth: 0.6000000000000001 is 0.6.
        let rounded = |lo, hi, max| -> Vec<f64> {
            let round = |t: f64| (t * 1e6).round() / 1e6;
            ticks(lo, hi, max).into_iter().map(round).collect()
        };
        assert_eq!(rounded(0.0, 47.0, 6), [0.0, 10.0, 20.0, 30.0, 40.0, 50.0]);
        assert_eq!(rounded(0.0, 0.8, 5), [0.0, 0.2, 0.4, 0.6, 0.8]);
        assert_eq!(rounded(0.0, 50.0, 6), [0.0, 10.0, 20.0, 30.0, 40.0, 50.0]);
        assert_eq!(rounded(0.0, 0.0, 5), [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]);
        assert_eq!(rounded(0.0, 1234.0, 5), [0.0, 500.0, 1000.0, 1500.0]);
        assert_eq!(rounded(0.0, 3.0 * 0.1, 5), [0.0, 0.1, 0.2, 0.3]);
        let negative = ticks(-3.0, 7.0, 5);
        assert!(negative[0] <= -3.0 && *negative.last().unwrap() >= 7.0);
    }

    #[test]
    fn scales_map_ends_and_flip_y() {
        let x = Scale {
            from: (0.0, 50.0),
            to: (64.0, 444.0),
        };
        assert_eq!(x.map(0.0), 64.0);
        assert_eq!(x.map(50.0), 444.0);
        assert_eq!(x.map(25.0), 254.0);
        let y = Scale {
            from: (0.0, 10.0),
            to: (236.0, 34.0),
        };
        assert_eq!(y.map(0.0), 236.0);
        assert_eq!(y.map(10.0), 34.0);
    }

    #[test]
    fn labels_are_short() {
        assert_eq!(label(0.0), "0");
        assert_eq!(label(0.2), "0.2");
        assert_eq!(label(0.6000000000000001), "0.6");
        assert_eq!(label(1500.0), "1500");
        assert_eq!(label(20_000.0), "20k");
    }

    #[test]
    fn a_chart_draws_every_series_and_escapes_text() {
        let series = |name: &str, points: Vec<(f64, f64)>| Series {
            name: name.into(),
            points,
            colour: 0,
            dashed: false,
        };
        let chart = Chart {
            title: "Fleet <1>".into(),
            subtitle: "a & b".into(),
            x_label: "sidecars".into(),
            legend: vec![series("100 locks", vec![]), series("1000 & more", vec![])],
            panels: vec![
                Panel {
                    title: "Redis CPU".into(),
                    series: vec![series(
                        "100 locks",
                        vec![(5.0, 1.0), (10.0, 2.0), (50.0, f64::NAN)],
                    )],
                },
                Panel {
                    title: "memory".into(),
                    series: vec![series("a", vec![(5.0, 1.0)]), series("b", vec![(5.0, 2.0)])],
                },
                Panel {
                    title: "empty".into(),
                    series: vec![],
                },
            ],
        };
        let svg = render(&chart);
        assert!(svg.starts_with("<svg ") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<polyline").count(), 3);
        assert_eq!(
            svg.matches("<circle").count(),
            4,
            "the NaN point is left out"
        );
        assert!(svg.contains("Fleet &lt;1&gt;") && svg.contains("a &amp; b"));
        assert!(svg.contains(">100 locks</text>") && svg.contains(">1000 &amp; more</text>"));
        // Three panels: two rows.
        assert!(svg.contains(&format!("height=\"{}\"", HEADER + 2.0 * PANEL_H)));
    }
}
