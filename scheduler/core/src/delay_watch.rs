//! The network delay bound, checked online.
//!
//! The scheduler charges `delay(b) = d_ctrl + d_data * b` before a batch
//! may start (`netdelay`); `d_data` is the bound on fetching one input,
//! from a calibration or a flag. Backends report each batch's slowest
//! input READ and how many READs it waited for; a [`DelayWatch`] (one per
//! transport) folds each batch's per-input fetch cost (`slowest READ /
//! READs`, so an incast of `b` inputs is held against `d_data * b`) into a
//! histogram, and at the end of every window of
//! [`DelayWatchConfig::window`] batches compares the window's high
//! percentile with the bound: above it, the alarm is raised (once, until
//! a window comes back within the bound); with
//! [`DelayWatchConfig::adopt`], the watch proposes the observed tail as
//! the bound ([`Verdict::Adopted`]).
//!
//! The watch does not keep the bound: each report is held against the
//! bound its owner charges at that moment (in the daemon, the control
//! plane's one delay owner), so there is one copy of it and one way it
//! changes.
//!
//! No allocation per report: the histogram is allocated once and reset
//! per window.

use dataplane::time::Duration;
use hdrhistogram::Histogram;

/// How the bound is watched.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DelayWatchConfig {
    /// The percentile of per-input fetch costs held against the bound.
    pub percentile: f64,
    /// Batches per verdict.
    pub window: u32,
    /// Raise the bound to the observed tail when it exceeds it (the bound
    /// is never lowered automatically).
    pub adopt: bool,
}

impl Default for DelayWatchConfig {
    fn default() -> Self {
        DelayWatchConfig { percentile: 99.0, window: 1000, adopt: false }
    }
}

/// The end of a window that changed something.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The observed tail exceeds the bound (the alarm is raised).
    Exceeded {
        /// The window's tail per input.
        observed: Duration,
        /// The bound in force.
        bound: Duration,
    },
    /// The tail is back within the bound (the alarm is cleared).
    Restored {
        /// The window's tail per input.
        observed: Duration,
        /// The bound in force.
        bound: Duration,
    },
    /// The bound was raised to the observed tail.
    Adopted {
        /// The previous bound.
        old: Duration,
        /// The new bound.
        new: Duration,
    },
}

/// One transport's online check (see the module docs).
#[derive(Debug)]
pub struct DelayWatch {
    cfg: DelayWatchConfig,
    hist: Histogram<u64>,
    in_window: u32,
    observed: Option<Duration>,
    exceeded: bool,
    alarms: u64,
    batches: u64,
}

impl DelayWatch {
    /// A watch of the per-input bound (`d_data`, given with each report).
    pub fn new(cfg: DelayWatchConfig) -> Self {
        // 1 ns to 100 s at 3 significant digits: allocated here, once.
        let hist = Histogram::new_with_bounds(1, 100_000_000_000, 3).unwrap_or_else(|_| unreachable!("constant, valid bounds"));
        DelayWatch { cfg, hist, in_window: 0, observed: None, exceeded: false, alarms: 0, batches: 0 }
    }

    /// The configuration.
    pub fn config(&self) -> &DelayWatchConfig {
        &self.cfg
    }

    /// Replaces the configuration; the current window starts over.
    pub fn set_config(&mut self, cfg: DelayWatchConfig) {
        self.cfg = cfg;
        self.hist.reset();
        self.in_window = 0;
    }

    /// A batch's slowest READ and the READs it waited for (none: ignored),
    /// held against `bound`, the per-input bound in force. With
    /// [`DelayWatchConfig::adopt`], [`Verdict::Adopted`] names the new
    /// bound, which the caller charges from then on.
    pub fn record(&mut self, slowest: Duration, reads: u32, bound: Duration) -> Option<Verdict> {
        if reads == 0 {
            return None;
        }
        self.batches += 1;
        let per_input = slowest.as_nanos() / u64::from(reads);
        self.hist.saturating_record(per_input.max(1));
        self.in_window += 1;
        if self.in_window < self.cfg.window.max(1) {
            return None;
        }
        let q = (self.cfg.percentile / 100.0).clamp(0.0, 1.0);
        let observed = Duration::from_nanos(self.hist.value_at_quantile(q));
        self.hist.reset();
        self.in_window = 0;
        self.observed = Some(observed);
        let over = observed > bound;
        if over && self.cfg.adopt {
            self.exceeded = false;
            return Some(Verdict::Adopted { old: bound, new: observed });
        }
        if over == self.exceeded {
            return None;
        }
        self.exceeded = over;
        Some(if over {
            self.alarms += 1;
            Verdict::Exceeded { observed, bound }
        } else {
            Verdict::Restored { observed, bound }
        })
    }

    /// The last full window's tail per input (`None` before the first).
    pub fn observed(&self) -> Option<Duration> {
        self.observed
    }

    /// Whether the alarm is raised.
    pub fn exceeded(&self) -> bool {
        self.exceeded
    }

    /// Times the alarm was raised.
    pub fn alarms(&self) -> u64 {
        self.alarms
    }

    /// Batches with READs folded in.
    pub fn batches(&self) -> u64 {
        self.batches
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(v: u64) -> Duration {
        Duration::from_micros(v)
    }

    #[test]
    fn the_alarm_rises_once_above_the_bound_and_clears_below_it() {
        let cfg = DelayWatchConfig { percentile: 99.0, window: 100, adopt: false };
        let mut w = DelayWatch::new(cfg);
        // 4 inputs in 30 us: 7.5 us each, within the bound.
        for _ in 0..99 {
            assert_eq!(w.record(us(30), 4, us(10)), None);
        }
        assert_eq!(w.record(us(30), 4, us(10)), None);
        assert!(!w.exceeded() && w.observed().is_some());
        // A tail of 2% at 50 us per input: above at p99.
        let mut verdicts = Vec::new();
        for i in 0..300 {
            let slow = if i % 50 == 0 { us(50) } else { us(30) };
            verdicts.extend(w.record(slow, if slow == us(50) { 1 } else { 4 }, us(10)));
        }
        assert_eq!(verdicts.len(), 1, "raised once: {verdicts:?}");
        assert!(matches!(verdicts[0], Verdict::Exceeded { bound, .. } if bound == us(10)));
        assert_eq!(w.alarms(), 1);
        for _ in 0..100 {
            verdicts.extend(w.record(us(30), 4, us(10)));
        }
        assert!(matches!(verdicts.last(), Some(Verdict::Restored { .. })));
        assert!(!w.exceeded());
        assert_eq!(w.record(us(1), 0, us(10)), None, "no READ, no sample");
    }

    #[test]
    fn adopting_raises_the_bound_to_the_tail() {
        let cfg = DelayWatchConfig { percentile: 99.0, window: 10, adopt: true };
        let mut w = DelayWatch::new(cfg);
        let mut v = None;
        for _ in 0..10 {
            v = w.record(us(20), 1, us(10)).or(v);
        }
        let Some(Verdict::Adopted { old, new }) = v else { panic!("{v:?}") };
        assert_eq!(old, us(10));
        assert!(new.as_nanos().abs_diff(20_000) <= 20, "{new:?}");
        assert!(!w.exceeded());
        // Held against the adopted bound, the same tail is within it.
        let mut v = None;
        for _ in 0..10 {
            v = w.record(us(20), 1, new).or(v);
        }
        assert_eq!(v, None);
        assert!(!w.exceeded());
    }
}
