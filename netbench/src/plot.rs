//! Percentile plots as hand-written SVG, in the style of HdrHistogram's
//! plotter: x = 1/(1-p) on a log scale (0%, 90%, 99%, 99.9%, ...), y =
//! latency. One panel per metric, side by side; every run is one line.

use std::fmt::Write as _;

use hdrhistogram::Histogram;

/// One run's histogram in one panel.
pub struct Series {
    /// Legend text.
    pub label: String,
    /// Latencies, ns.
    pub hist: Histogram<u64>,
}

/// One panel: a metric, all runs.
pub struct Panel {
    /// Panel title.
    pub title: String,
    /// The runs.
    pub series: Vec<Series>,
}

const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];
const PW: f64 = 560.0;
const PH: f64 = 420.0;
const ML: f64 = 78.0;
const MR: f64 = 44.0;
const MT: f64 = 46.0;
const MB: f64 = 62.0;
const STEPS: usize = 240;
const LEGEND_ROW: f64 = 30.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Label of x = log10(1/(1-p)): 0 -> "0%", 1 -> "90%", 3 -> "99.9%".
fn x_label(k: u32) -> String {
    match k {
        0 => "0%".to_string(),
        1 => "90%".to_string(),
        _ => format!("99.{}%", "9".repeat(k as usize - 2)).replace("99.%", "99%"),
    }
}

/// (x, latency us) points of a histogram's percentile curve.
fn curve(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    let n = h.len();
    if n == 0 {
        return Vec::new();
    }
    // The resolution of n samples ends at p = 1 - 1/n.
    let xmax = (n as f64).log10().max(0.0);
    (0..=STEPS)
        .map(|k| {
            let x = xmax * k as f64 / STEPS as f64;
            let q = 1.0 - 10f64.powf(-x);
            let q = if k == STEPS { 1.0 } else { q };
            (x, h.value_at_quantile(q) as f64 / 1000.0)
        })
        .collect()
}

fn nice_step(range: f64) -> f64 {
    let raw = range / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let nice = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

fn fmt_us(v: f64) -> String {
    if v >= 10.0 {
        format!("{:.0}", v)
    } else if v >= 1.0 {
        format!("{:.1}", v)
    } else {
        format!("{:.2}", v)
    }
}

/// The whole figure.
pub fn svg(title: &str, panels: &[Panel], log_y: bool) -> String {
    let width = PW * panels.len().max(1) as f64;
    let rows = panels.iter().map(|p| p.series.len()).max().unwrap_or(0) as f64;
    // The legend goes under each panel: labels can be long.
    let height = PH + 30.0 + LEGEND_ROW * rows + 6.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="20" text-anchor="middle" font-size="15" font-weight="bold">{}</text>"#,
        width / 2.0,
        esc(title)
    );
    for (pi, panel) in panels.iter().enumerate() {
        let ox = PW * pi as f64;
        let oy = 30.0;
        draw_panel(&mut s, panel, ox, oy, log_y);
    }
    s.push_str("</svg>\n");
    s
}

/// One panel's plot area: where it is and what its axes span.
struct Axes {
    ox: f64,
    oy: f64,
    pw: f64,
    ph: f64,
    xmax: f64,
    y0: f64,
    y1: f64,
    log_y: bool,
}

impl Axes {
    fn new(curves: &[Vec<(f64, f64)>], ox: f64, oy: f64, log_y: bool) -> Axes {
        let xmax = curves
            .iter()
            .filter_map(|c| c.last().map(|p| p.0))
            .fold(1.0f64, f64::max)
            .ceil()
            .clamp(1.0, 7.0);
        let (mut lo, mut hi) = (f64::INFINITY, 0.0f64);
        for c in curves {
            for &(_, v) in c {
                lo = lo.min(v);
                hi = hi.max(v);
            }
        }
        if !lo.is_finite() {
            lo = 1.0;
            hi = 10.0;
        }
        let (y0, y1) = if log_y {
            let a = lo.max(0.001).log10().floor();
            let b = hi.max(0.001).log10().ceil().max(a + 1.0);
            (a, b)
        } else {
            let step = nice_step(hi.max(1e-3));
            (0.0, (hi / step).ceil().max(1.0) * step)
        };
        Axes {
            ox,
            oy,
            pw: PW - ML - MR,
            ph: PH - MT - MB,
            xmax,
            y0,
            y1,
            log_y,
        }
    }

    fn px(&self, x: f64) -> f64 {
        self.ox + ML + x / self.xmax * self.pw
    }

    fn py(&self, v: f64) -> f64 {
        let t = if self.log_y {
            (v.max(1e-3).log10() - self.y0) / (self.y1 - self.y0)
        } else {
            (v - self.y0) / (self.y1 - self.y0)
        };
        self.oy + MT + self.ph * (1.0 - t.clamp(0.0, 1.0))
    }

    /// The title, the frame, the x grid with its labels and the x axis name.
    fn frame(&self, s: &mut String, title: &str) {
        let (ox, oy, pw, ph) = (self.ox, self.oy, self.pw, self.ph);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle" font-size="13" font-weight="bold">{}</text>"#,
            ox + ML + pw / 2.0,
            oy + MT - 14.0,
            esc(title)
        );
        let _ = writeln!(
            s,
            r##"<rect x="{}" y="{}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>"##,
            ox + ML,
            oy + MT
        );
        for k in 0..=self.xmax as u32 {
            let x = self.px(f64::from(k));
            let _ = writeln!(
                s,
                r##"<line x1="{x}" y1="{}" x2="{x}" y2="{}" stroke="#ddd"/>"##,
                oy + MT,
                oy + MT + ph
            );
            let _ = writeln!(
                s,
                r#"<text x="{x}" y="{}" text-anchor="middle">{}</text>"#,
                oy + MT + ph + 16.0,
                x_label(k)
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">percentile (log scale of 1/(1-p))</text>"#,
            ox + ML + pw / 2.0,
            oy + MT + ph + 38.0
        );
    }

    /// One horizontal grid line at value `v`, with its label.
    fn y_tick(&self, s: &mut String, v: f64, stroke: &str) {
        let y = self.py(v);
        let _ = writeln!(
            s,
            r#"<line x1="{}" y1="{y}" x2="{}" y2="{y}" stroke="{stroke}"/>"#,
            self.ox + ML,
            self.ox + ML + self.pw
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
            self.ox + ML - 5.0,
            y + 4.0,
            fmt_us(v)
        );
    }

    /// The y grid (1-2-5 per decade on a log scale, round steps otherwise)
    /// and the y axis name.
    fn y_grid(&self, s: &mut String) {
        let (y0, y1) = (self.y0, self.y1);
        if self.log_y {
            let mut e = y0;
            while e <= y1 + 1e-9 {
                for m in [1.0, 2.0, 5.0] {
                    let v = m * 10f64.powf(e);
                    if v.log10() > y1 + 1e-9 {
                        break;
                    }
                    self.y_tick(s, v, if m == 1.0 { "#ccc" } else { "#eee" });
                }
                e += 1.0;
            }
        } else {
            let step = nice_step(y1);
            let mut v = 0.0;
            while v <= y1 + step * 1e-6 {
                self.y_tick(s, v, "#ddd");
                v += step;
            }
        }
        let (ox, oy, ph) = (self.ox, self.oy, self.ph);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle" transform="rotate(-90 {} {})">latency (µs{})</text>"#,
            ox + 16.0,
            oy + MT + ph / 2.0,
            ox + 16.0,
            oy + MT + ph / 2.0,
            if self.log_y { ", log scale" } else { "" }
        );
    }
}

fn draw_panel(s: &mut String, panel: &Panel, ox: f64, oy: f64, log_y: bool) {
    let curves: Vec<Vec<(f64, f64)>> = panel.series.iter().map(|se| curve(&se.hist)).collect();
    let axes = Axes::new(&curves, ox, oy, log_y);
    axes.frame(s, &panel.title);
    axes.y_grid(s);
    for (i, (c, se)) in curves.iter().zip(&panel.series).enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<String> = c
            .iter()
            .map(|&(x, v)| format!("{:.1},{:.1}", axes.px(x), axes.py(v)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="1.8" points="{}"/>"#,
            pts.join(" ")
        );
        legend(s, se, color, ox + ML - 40.0, oy + PH + 6.0 + LEGEND_ROW * i as f64);
    }
}

/// One series' legend entry at (`lx`, `ly`): its colour, label, median and p99.99.
fn legend(s: &mut String, se: &Series, color: &str, lx: f64, ly: f64) {
    let med = se.hist.value_at_quantile(0.5) as f64 / 1000.0;
    let p9999 = se.hist.value_at_quantile(0.9999) as f64 / 1000.0;
    let _ = writeln!(
        s,
        r#"<line x1="{lx}" y1="{}" x2="{}" y2="{}" stroke="{color}" stroke-width="3"/>"#,
        ly - 4.0,
        lx + 18.0,
        ly - 4.0
    );
    let mut label = se.label.clone();
    if label.chars().count() > 78 {
        label = label.chars().take(75).collect::<String>() + "...";
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{ly}" font-size="11">{}</text>"#,
        lx + 24.0,
        esc(&label)
    );
    let _ = writeln!(
        s,
        r##"<text x="{}" y="{}" font-size="11" fill="#555">p50 {} µs, p99.99 {} µs, n={}</text>"##,
        lx + 24.0,
        ly + 13.0,
        fmt_us(med),
        fmt_us(p9999),
        se.hist.len()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_a_well_formed_figure() {
        assert_eq!(x_label(0), "0%");
        assert_eq!(x_label(1), "90%");
        assert_eq!(x_label(2), "99%");
        assert_eq!(x_label(4), "99.99%");
        let mut h = Histogram::<u64>::new_with_bounds(1, 1 << 40, 3).unwrap();
        for v in 1..=1000u64 {
            h.record(v * 1000).unwrap();
        }
        let panel = Panel {
            title: "round".into(),
            series: vec![Series {
                label: "a<b".into(),
                hist: h,
            }],
        };
        for log_y in [true, false] {
            let svg = svg("t", std::slice::from_ref(&panel), log_y);
            assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
            assert!(svg.contains("a&lt;b"));
            assert!(svg.contains("99.9%"));
            assert_eq!(svg.matches("<polyline").count(), 1);
        }
    }
}
