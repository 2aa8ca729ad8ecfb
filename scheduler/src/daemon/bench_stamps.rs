//! Benchmark-only lag measurement across processes of one host
//! (`symphony bench-cluster`): frontends precede a task with a
//! [`BenchStamp`] carrying its send moment; the scheduler records the
//! lag from there to the task's queueing, and precedes each plan with a
//! stamp of its planned dispatch moment and planned start, from which the
//! backend measures the dispatch lag. Readings are the host's
//! `CLOCK_MONOTONIC`, which every process of one machine shares; nothing
//! outside benchmarks compares clocks across processes, and a scheduler
//! without `--bench-stamps` neither reads nor sends stamps.

use node_shell::metrics::Histogram;
use dataplane::time::Instant;
use dataplane::wire::BenchStamp;

/// Lags below this many µs have a bucket of 1 µs each; above, one bucket
/// per power of two.
const LINEAR_US: u64 = 2048;
/// Upper bounds: 1 µs steps below [`LINEAR_US`], then `2^k - 1` for
/// k = 12..=63; `+Inf` follows.
const BOUNDS: usize = LINEAR_US as usize + 52;
static LAG_BOUNDS_US: [u64; BOUNDS] = lag_bounds();

const fn lag_bounds() -> [u64; BOUNDS] {
    let mut a = [0u64; BOUNDS];
    let mut i = 0;
    while i < BOUNDS {
        a[i] = if (i as u64) < LINEAR_US { i as u64 } else { (1u64 << (i - LINEAR_US as usize + 12)) - 1 };
        i += 1;
    }
    a
}

/// The bucket of a lag of `us` µs (`BOUNDS`: `+Inf`).
fn lag_index(us: u64) -> usize {
    if us < LINEAR_US {
        us as usize
    } else {
        // 2048..4095 -> LINEAR_US, 4096.. -> +1, ...
        LINEAR_US as usize + (63 - us.leading_zeros() as usize) - 11
    }
}

/// A lock-free lag histogram in the one metrics registry: 1 µs buckets up
/// to 2 ms, then powers of two (what a p99.9 of tens of µs needs, without
/// a lock per sample). Clones share the counts.
#[derive(Clone, Debug)]
pub struct LagBuckets(Histogram);

impl Default for LagBuckets {
    fn default() -> Self {
        LagBuckets(Histogram::with_index(&LAG_BOUNDS_US, lag_index))
    }
}

impl LagBuckets {
    /// Records one lag.
    pub fn record(&self, lag_ns: u64) {
        self.0.observe(lag_ns / 1000);
    }

    /// Samples so far.
    pub fn count(&self) -> u64 {
        self.0.count()
    }

    /// The histogram to register.
    pub fn histogram(&self) -> &Histogram {
        &self.0
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
    fn buckets_are_monotone_and_encode_cumulative() {
        let b = LagBuckets::default();
        for us in [0u64, 5, 5, 2047, 2048, 4095, 4096, 1 << 40] {
            b.record(us * 1000);
        }
        assert!(LAG_BOUNDS_US.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(lag_index(2048), 2048);
        assert_eq!(LAG_BOUNDS_US[2048], 4095);
        assert_eq!(lag_index(4096), 2049);
        assert_eq!(lag_index(u64::MAX), BOUNDS);
        let r = node_shell::metrics::MetricsRegistry::new();
        r.register("x", "h", b.histogram().clone());
        let s = r.encode();
        assert!(s.contains("x_bucket{le=\"5.0\"} 3"), "{s}");
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
