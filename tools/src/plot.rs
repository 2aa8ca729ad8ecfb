//! Minimal SVG charts (line and bar), enough for the CLI's figures without
//! pulling a plotting stack into the build.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Why a figure could not be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot {action} {}: {source}", path.display())]
pub struct WriteError {
    /// "create" (the directory) or "write" (the file).
    pub action: &'static str,
    /// The directory or file.
    pub path: PathBuf,
    /// The I/O error.
    pub source: std::io::Error,
}

/// Writes `svg` to `dir/name`, creating `dir`, and logs the path.
pub fn write_svg(dir: &Path, name: &str, svg: &str) -> Result<(), WriteError> {
    std::fs::create_dir_all(dir).map_err(|source| WriteError { action: "create", path: dir.to_path_buf(), source })?;
    let path = dir.join(name);
    std::fs::write(&path, svg).map_err(|source| WriteError { action: "write", path: path.clone(), source })?;
    tracing::info!("wrote {}", path.display());
    Ok(())
}

/// The batch-size distribution of a simulated run (`[size, requests]`
/// pairs) as a bar chart of the fraction of requests per batch size.
pub fn batch_sizes(title: &str, histogram: &[[u64; 2]]) -> String {
    let total: u64 = histogram.iter().map(|b| b[1]).sum::<u64>().max(1);
    let data: Vec<(f64, f64)> = histogram.iter().map(|b| (b[0] as f64, b[1] as f64 / total as f64)).collect();
    bars(title, "batch size", "fraction of requests", &data)
}

/// One named series of `(x, y)` points.
pub struct Series {
    /// Legend label.
    pub label: String,
    /// Points, in x order.
    pub points: Vec<(f64, f64)>,
}

const W: f64 = 640.0;
const H: f64 = 400.0;
const ML: f64 = 70.0;
const MR: f64 = 20.0;
const MT: f64 = 40.0;
const MB: f64 = 55.0;
const COLORS: [&str; 8] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

fn nice_max(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let mag = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * mag >= v {
            return m * mag;
        }
    }
    10.0 * mag
}

fn frame(svg: &mut String, title: &str, xlabel: &str, ylabel: &str, xmax: f64, ymax: f64, xmin: f64) {
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/><text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
        W / 2.0,
        esc(title)
    );
    let (pw, ph) = (W - ML - MR, H - MT - MB);
    for i in 0..=5 {
        let f = f64::from(i) / 5.0;
        let y = MT + ph * (1.0 - f);
        let x = ML + pw * f;
        let _ = write!(
            svg,
            r##"<line x1="{ML}" y1="{y}" x2="{}" y2="{y}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{}</text><text x="{x}" y="{}" text-anchor="middle">{}</text>"##,
            W - MR,
            ML - 6.0,
            y + 4.0,
            fmt_num(ymax * f),
            H - MB + 18.0,
            fmt_num(xmin + (xmax - xmin) * f)
        );
    }
    let _ = write!(
        svg,
        r#"<rect x="{ML}" y="{MT}" width="{pw}" height="{ph}" fill="none" stroke="black"/><text x="{}" y="{}" text-anchor="middle">{}</text><text transform="translate(18,{}) rotate(-90)" text-anchor="middle">{}</text>"#,
        ML + pw / 2.0,
        H - 12.0,
        esc(xlabel),
        MT + ph / 2.0,
        esc(ylabel)
    );
}

fn fmt_num(v: f64) -> String {
    if v.abs() >= 10.0 {
        format!("{:.0}", v)
    } else {
        format!("{:.2}", v)
    }
}

/// A line chart of several series.
pub fn lines(title: &str, xlabel: &str, ylabel: &str, series: &[Series]) -> String {
    let all = series.iter().flat_map(|s| s.points.iter());
    let xmax = nice_max(all.clone().map(|p| p.0).fold(0.0, f64::max));
    let ymax = nice_max(all.map(|p| p.1).fold(0.0, f64::max));
    let mut svg = String::new();
    frame(&mut svg, title, xlabel, ylabel, xmax, ymax, 0.0);
    let (pw, ph) = (W - ML - MR, H - MT - MB);
    for (i, s) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let pts: Vec<String> =
            s.points.iter().map(|&(x, y)| format!("{:.1},{:.1}", ML + pw * x / xmax, MT + ph * (1.0 - y / ymax))).collect();
        let _ = write!(svg, r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#, pts.join(" "));
        for p in &pts {
            let (x, y) = p.split_once(',').unwrap_or(("0", "0"));
            let _ = write!(svg, r#"<circle cx="{x}" cy="{y}" r="3" fill="{c}"/>"#);
        }
        let ly = MT + 14.0 + 16.0 * i as f64;
        let _ = write!(
            svg,
            r#"<rect x="{}" y="{}" width="12" height="4" fill="{c}"/><text x="{}" y="{}">{}</text>"#,
            ML + 10.0,
            ly - 5.0,
            ML + 28.0,
            ly,
            esc(&s.label)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// A bar chart of `(x, y)` bars (x are categories such as batch sizes).
pub fn bars(title: &str, xlabel: &str, ylabel: &str, data: &[(f64, f64)]) -> String {
    let xmax = data.iter().map(|d| d.0).fold(1.0, f64::max) + 1.0;
    let ymax = nice_max(data.iter().map(|d| d.1).fold(0.0, f64::max));
    let mut svg = String::new();
    frame(&mut svg, title, xlabel, ylabel, xmax, ymax, 0.0);
    let (pw, ph) = (W - ML - MR, H - MT - MB);
    let bw = (pw / xmax * 0.8).max(1.0);
    for &(x, y) in data {
        let h = ph * y / ymax;
        let _ = write!(
            svg,
            r##"<rect x="{:.1}" y="{:.1}" width="{bw:.1}" height="{h:.1}" fill="#1f77b4"/>"##,
            ML + pw * x / xmax - bw / 2.0,
            MT + ph - h
        );
    }
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_well_formed_svg() {
        let s = lines("t<1>", "x", "y", &[Series { label: "a".into(), points: vec![(0.0, 1.0), (2.0, 3.0)] }]);
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>") && s.contains("t&lt;1&gt;"));
        let b = bars("b", "x", "y", &[(1.0, 2.0), (4.0, 8.0)]);
        assert_eq!(b.matches("<rect").count(), 4);
    }
}
