//! Benchmark-only lag measurement across processes of one host
//! (`symphony bench-cluster`): frontends precede a task with a
//! [`BenchStamp`] carrying its send moment; the scheduler records the
//! lag from there to the task's queueing, and precedes each plan with a
//! stamp of its planned dispatch moment and planned start, from which the
//! backend measures the dispatch lag. Readings are the host's
//! `CLOCK_MONOTONIC`, which every process of one machine shares; nothing
//! outside benchmarks compares clocks across processes, and a scheduler
//! without `--bench-stamps` neither reads nor sends stamps.

use std::sync::atomic::{AtomicU64, Ordering};

use dataplane::time::Instant;
use dataplane::wire::BenchStamp;

/// Lags below this many µs have a bucket of 1 µs each; above, one bucket
/// per power of two.
const LINEAR_US: u64 = 2048;
const BUCKETS: usize = LINEAR_US as usize + 64;

/// A lock-free lag histogram: 1 µs buckets up to 2 ms, then powers of two
/// (what a p99.9 of tens of µs needs, without a lock per sample).
pub struct LagBuckets {
    counts: Box<[AtomicU64]>,
}

impl std::fmt::Debug for LagBuckets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LagBuckets({} samples)", self.count())
    }
}

impl Default for LagBuckets {
    fn default() -> Self {
        LagBuckets { counts: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect() }
    }
}

impl LagBuckets {
    fn index(us: u64) -> usize {
        if us < LINEAR_US {
            us as usize
        } else {
            // 2048..4095 -> LINEAR_US, 4096.. -> +1, ...
            LINEAR_US as usize + (63 - us.leading_zeros() as usize) - 11
        }
    }

    /// Upper bound (µs, inclusive) of bucket `i`.
    fn upper_us(i: usize) -> u64 {
        if (i as u64) < LINEAR_US {
            i as u64
        } else {
            1u64.checked_shl((i - LINEAR_US as usize + 12) as u32).map_or(u64::MAX, |v| v - 1)
        }
    }

    /// Records one lag.
    pub fn record(&self, lag_ns: u64) {
        let i = Self::index(lag_ns / 1000).min(BUCKETS - 1);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Samples so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// Appends `NAME_bucket{le="US"} CUMULATIVE` for the buckets that hold
    /// samples, then `+Inf` and `NAME_count`; nothing when empty.
    pub fn render(&self, s: &mut String, name: &str, help: &str) {
        use std::fmt::Write as _;
        let total = self.count();
        if total == 0 {
            return;
        }
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut acc = 0;
        for (i, c) in self.counts.iter().enumerate() {
            let c = c.load(Ordering::Relaxed);
            if c > 0 {
                acc += c;
                let _ = writeln!(s, "{name}_bucket{{le=\"{}\"}} {acc}", Self::upper_us(i));
            }
        }
        let _ = writeln!(s, "{name}_bucket{{le=\"+Inf\"}} {acc}\n{name}_count {acc}");
    }
}

/// The scheduler's side of the stamps: its clock's origin on the host
/// clock, and the stamp awaiting its task.
#[derive(Clone, Copy, Debug, Default)]
pub struct BenchClock {
    origin_host_ns: u64,
    /// (frontend, send moment) of the last stamp, for that frontend's next task.
    pending: Option<(u32, u64)>,
}

impl BenchClock {
    /// Stamps on; `origin_host_ns` is the host clock at this process's
    /// clock origin ([`dataplane::time::MonotonicClock::origin_host_ns`]).
    pub fn new(origin_host_ns: u64) -> Self {
        BenchClock { origin_host_ns, pending: None }
    }

    /// `t` on the host clock.
    pub fn host_ns(&self, t: Instant) -> u64 {
        self.origin_host_ns.saturating_add(t.as_nanos())
    }

    /// A frontend's stamp for its next task.
    pub fn stamped(&mut self, from: u32, s: &BenchStamp) {
        self.pending = Some((from, s.at_ns));
    }

    /// The ingress lag of a task from `from` queued at host-clock moment
    /// `queued_host_ns`, if stamped.
    pub fn take_ingress_lag(&mut self, from: u32, queued_host_ns: u64) -> Option<u64> {
        match self.pending {
            Some((f, at)) if f == from => {
                self.pending = None;
                Some(queued_host_ns.saturating_sub(at))
            }
            _ => None,
        }
    }

    /// Whether a stamp from `from` awaits its task.
    pub fn awaits(&self, from: u32) -> bool {
        matches!(self.pending, Some((f, _)) if f == from)
    }

    /// The stamp that precedes a plan.
    pub fn plan_stamp(&self, planned_at: Instant, exec_at: Instant, deadline: Instant) -> BenchStamp {
        BenchStamp { at_ns: self.host_ns(planned_at), due_ns: self.host_ns(exec_at), deadline_ns: self.host_ns(deadline) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotone_and_render_cumulative() {
        let b = LagBuckets::default();
        for us in [0u64, 5, 5, 2047, 2048, 4095, 4096, 1 << 40] {
            b.record(us * 1000);
        }
        let mut prev = 0;
        for i in 0..BUCKETS - 1 {
            let u = LagBuckets::upper_us(i);
            assert!(u >= prev);
            prev = u;
        }
        assert_eq!(LagBuckets::index(2048), 2048);
        assert_eq!(LagBuckets::upper_us(2048), 4095);
        assert_eq!(LagBuckets::index(4096), 2049);
        let mut s = String::new();
        b.render(&mut s, "x", "h");
        assert!(s.contains("x_bucket{le=\"5\"} 3"), "{s}");
        assert!(s.contains("x_count 8"), "{s}");
    }

    #[test]
    fn a_stamp_pairs_with_its_frontends_next_task_only() {
        let mut c = BenchClock::new(1_000);
        c.stamped(3, &BenchStamp { at_ns: 1_500, ..Default::default() });
        assert!(c.awaits(3) && !c.awaits(4));
        assert_eq!(c.take_ingress_lag(4, 1_700), None);
        assert_eq!(c.take_ingress_lag(3, 1_700), Some(200));
        assert_eq!(c.take_ingress_lag(3, 1_800), None);
        assert_eq!(c.host_ns(Instant::from_nanos(5)), 1_005);
    }
}
