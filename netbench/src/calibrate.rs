//! `netbench calibrate`: the two numbers of the scheduler's network delay
//! bound `delay(b) = d_ctrl + d_data * b` (DESIGN.md, principle 4), written
//! in the TOML form `scheduler::netdelay::NetworkDelay::from_toml` reads.
//!
//! - `d_ctrl_us`: HALF the control message round trip at the percentile.
//!   A one-way delay cannot be measured without synchronised clocks, which
//!   this system never assumes; half the round trip is the usual estimate
//!   and is exact for a symmetric path.
//! - `d_data_us`: the least-squares slope of the percentile round time
//!   against the batch size b (rounds of b = 1, 2, 4, ... READs spread over
//!   the peers). The intercept (the fixed cost of a round) is reported in
//!   the file's comments and can be folded into `d_ctrl_us` with
//!   `--fold-intercept`.

use std::fmt::Write as _;

use crate::fail::{Fail, Res};

/// One batch size's measurement.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    /// READs per round.
    pub b: usize,
    /// Rounds measured.
    pub rounds: u64,
    /// Median round time, us.
    pub p50_us: f64,
    /// Round time at the calibration percentile, us.
    pub pct_us: f64,
}

/// Ordinary least squares `y = a + s x`; returns `(a, s)`.
pub fn fit(xy: &[(f64, f64)]) -> Res<(f64, f64)> {
    let n = xy.len() as f64;
    if xy.len() < 2 {
        return Err(Fail::usage(
            "the fit needs at least two batch sizes (--batches)",
        ));
    }
    let mx = xy.iter().map(|p| p.0).sum::<f64>() / n;
    let my = xy.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = xy.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
    let sxy: f64 = xy.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    if sxx <= 0.0 {
        return Err(Fail::usage(
            "the fit needs at least two different batch sizes (--batches)",
        ));
    }
    let s = sxy / sxx;
    Ok((my - s * mx, s))
}

/// Powers of two from 1 up to `max` (and `max` itself).
pub fn default_batches(max: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut b = 1;
    while b < max {
        v.push(b);
        b *= 2;
    }
    v.push(max.max(1));
    v
}

/// The calibration's numbers plus what to say about them.
#[derive(Clone, Debug)]
pub struct Calibration {
    /// Percentile used.
    pub percentile: f64,
    /// Control message round trip at the percentile, us.
    pub ctrl_rtt_us: f64,
    /// Control message size, bytes.
    pub ctrl_bytes: usize,
    /// Round points.
    pub points: Vec<Point>,
    /// Fabric description.
    pub fabric: String,
    /// Fold the fit's intercept into d_ctrl.
    pub fold_intercept: bool,
    /// Bytes per input.
    pub size: u32,
    /// Provenance lines (command, host, date).
    pub provenance: Vec<String>,
}

impl Calibration {
    /// `(d_ctrl_us, d_data_us, intercept_us)`.
    pub fn values(&self) -> Res<(f64, f64, f64)> {
        let xy: Vec<(f64, f64)> = self.points.iter().map(|p| (p.b as f64, p.pct_us)).collect();
        let (a, s) = fit(&xy)?;
        let d_data = s.max(0.0);
        let mut d_ctrl = self.ctrl_rtt_us / 2.0;
        if self.fold_intercept {
            d_ctrl += a.max(0.0);
        }
        for (name, v) in [("d_ctrl_us", d_ctrl), ("d_data_us", d_data)] {
            // The scheduler's own validation rule (scheduler::netdelay).
            if !(v.is_finite() && (0.0..=1e7).contains(&v)) {
                return Err(Fail::runtime(format!(
                    "{name} = {v}: outside 0..=1e7 microseconds"
                )));
            }
        }
        Ok((d_ctrl, d_data, a))
    }

    /// The calibration file.
    pub fn to_toml(&self) -> Res<String> {
        let (d_ctrl, d_data, a) = self.values()?;
        let mut t = String::new();
        let _ = writeln!(
            t,
            "# Network delay bound for the scheduler: delay(b) = d_ctrl + d_data * b"
        );
        for line in &self.provenance {
            let _ = writeln!(t, "# {line}");
        }
        let _ = writeln!(
            t,
            "# d_ctrl_us = half the {}-byte control message round trip at p{} ({:.3} us / 2){}",
            self.ctrl_bytes,
            self.percentile,
            self.ctrl_rtt_us,
            if self.fold_intercept {
                format!(" + fit intercept {a:.3} us (--fold-intercept)")
            } else {
                String::new()
            }
        );
        let _ = writeln!(
            t,
            "#   (one-way delay is not measurable without synchronised clocks; half the round trip is exact for a symmetric path)"
        );
        let _ = writeln!(
            t,
            "# d_data_us = least-squares slope of the p{} incast round time vs batch size b ({}-byte inputs)",
            self.percentile, self.size
        );
        let _ = writeln!(t, "# fit: round_p(b) = {a:.3} us + {d_data:.3} us * b; points (b, rounds, p50 us, p{} us):", self.percentile);
        for p in &self.points {
            let _ = writeln!(
                t,
                "#   b={:<4} rounds={:<7} p50={:<12.3} p{}={:.3}",
                p.b, p.rounds, p.p50_us, self.percentile, p.pct_us
            );
        }
        let _ = writeln!(t, "d_ctrl_us = {d_ctrl:.3}");
        let _ = writeln!(t, "d_data_us = {d_data:.3}");
        let _ = writeln!(t, "percentile = {}", fmt_float(self.percentile));
        let fabric =
            serde_json::to_string(&self.fabric)?;
        let _ = writeln!(t, "fabric = {fabric}");
        Ok(t)
    }
}

/// A float TOML reads as a float (always with a decimal point).
fn fmt_float(v: f64) -> String {
    let s = format!("{v}");
    if s.contains('.') || s.contains('e') || s.contains("inf") || s.contains("NaN") {
        s
    } else {
        format!("{s}.0")
    }
}

/// Checks a percentile argument.
pub fn check_percentile(p: f64) -> Res<()> {
    if p.is_finite() && p > 0.0 && p < 100.0 {
        Ok(())
    } else {
        Err(Fail::usage(format!(
            "--percentile {p}: must be above 0 and below 100"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn least_squares_recovers_a_line() {
        let xy: Vec<(f64, f64)> = [1.0, 2.0, 4.0, 8.0]
            .iter()
            .map(|&x| (x, 5.0 + 2.5 * x))
            .collect();
        let (a, s) = fit(&xy).unwrap();
        assert!((a - 5.0).abs() < 1e-9 && (s - 2.5).abs() < 1e-9);
        assert!(fit(&[(1.0, 1.0)]).is_err());
        assert!(fit(&[(2.0, 1.0), (2.0, 3.0)]).is_err());
    }

    #[test]
    fn batches_are_powers_of_two_then_max() {
        assert_eq!(default_batches(64), vec![1, 2, 4, 8, 16, 32, 64]);
        assert_eq!(default_batches(6), vec![1, 2, 4, 6]);
        assert_eq!(default_batches(1), vec![1]);
    }

    #[test]
    fn toml_has_the_four_keys() {
        let c = Calibration {
            percentile: 99.99,
            ctrl_rtt_us: 20.0,
            ctrl_bytes: 32,
            points: vec![
                Point {
                    b: 1,
                    rounds: 10,
                    p50_us: 1.0,
                    pct_us: 13.0,
                },
                Point {
                    b: 2,
                    rounds: 10,
                    p50_us: 2.0,
                    pct_us: 16.0,
                },
            ],
            fabric: "tcp \"loopback\"".into(),
            fold_intercept: false,
            size: 64,
            provenance: vec!["netbench calibrate ...".into()],
        };
        let t = c.to_toml().unwrap();
        assert!(t.contains("\nd_ctrl_us = 10.000\n"), "{t}");
        assert!(t.contains("\nd_data_us = 3.000\n"), "{t}");
        assert!(t.contains("\npercentile = 99.99\n"), "{t}");
        assert!(t.contains("\nfabric = \"tcp \\\"loopback\\\"\"\n"), "{t}");
        assert_eq!(fmt_float(99.0), "99.0");
    }
}
