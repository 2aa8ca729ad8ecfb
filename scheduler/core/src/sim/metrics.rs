//! What a run measured: per-model and overall outcomes, latency and
//! queueing percentiles, batch sizes, GPU idle time, autoscaling advice.

use crate::types::DropReason;
use serde::Serialize;
use std::collections::BTreeMap;

/// Latency histograms record microseconds up to 100 s, 3 significant
/// digits: [`RecordedCounts`] counts in its buckets (the tests check it
/// against the crate's).
#[cfg(test)]
fn new_hist() -> hdrhistogram::Histogram<u64> {
    hdrhistogram::Histogram::new_with_bounds(1, 100_000_000, 3).unwrap_or_else(|_| hdrhistogram::Histogram::new(3).unwrap_or_else(|_| unreachable!()))
}

/// A latency histogram of a run: `hdrhistogram`'s buckets for [`new_hist`]'s
/// bounds (microseconds from 1 to 100 s, 3 significant digits), counted
/// in a plain array. A record is one bucket index and one increment, where
/// `Histogram::record` also checks for resizing and keeps the minimum and
/// maximum on every call (two records per simulated request were about
/// 120 of its instructions, a twentieth of the simulator's). Percentiles
/// are read as `Histogram::value_at_quantile` reads them, so every figure
/// is the same as the crate's; the tests check buckets, sums and
/// percentiles against the crate value for value.
#[derive(Clone)]
pub(crate) struct RecordedCounts {
    counts: Vec<u64>,
    total: u64,
}

/// log2 of half of [`new_hist`]'s 2048 sub-buckets per bucket.
const SUB_BUCKET_HALF_MAGNITUDE: u32 = 10;
/// Values below 2048 are in bucket 0.
const SUB_BUCKET_MASK: u64 = (1 << (SUB_BUCKET_HALF_MAGNITUDE + 1)) - 1;
/// `64 - log2(2048)`: a value's bucket is this less its leading zeros.
const LEADING_ZERO_BASE: u32 = 64 - (SUB_BUCKET_HALF_MAGNITUDE + 1);
/// [`new_hist`]'s counts: 17 buckets cover 100 s (2048 << 16 > 10^8), plus
/// bucket 0's lower half.
const COUNTS: usize = 18 << SUB_BUCKET_HALF_MAGNITUDE;

impl RecordedCounts {
    pub fn new() -> Self {
        RecordedCounts { counts: vec![0; COUNTS], total: 0 }
    }

    /// The bucket of `value` (`hdrhistogram`'s `index_for`).
    #[inline]
    fn index_of(value: u64) -> usize {
        let bucket = LEADING_ZERO_BASE - (value | SUB_BUCKET_MASK).leading_zeros();
        let sub_bucket = (value >> bucket) as usize;
        ((bucket as usize + 1) << SUB_BUCKET_HALF_MAGNITUDE) + sub_bucket - (1 << SUB_BUCKET_HALF_MAGNITUDE)
    }

    /// The lowest value of bucket `index` (`hdrhistogram`'s `value_for`).
    fn value_of(index: usize) -> u64 {
        let half = 1usize << SUB_BUCKET_HALF_MAGNITUDE;
        let (bucket, sub_bucket) = match (index >> SUB_BUCKET_HALF_MAGNITUDE).checked_sub(1) {
            Some(b) => (b, (index & (half - 1)) + half),
            // The lower half of bucket 0.
            None => (0, index & (half - 1)),
        };
        (sub_bucket as u64) << bucket
    }

    /// Counts `value`; a value past the histogram's range is left out, as
    /// `Histogram::record` refuses it.
    #[inline]
    pub fn record(&mut self, value: u64) {
        if let Some(c) = self.counts.get_mut(Self::index_of(value)) {
            *c = c.saturating_add(1);
            self.total = self.total.saturating_add(1);
        }
    }

    /// Adds `other`'s counts (`Histogram::add`).
    pub fn add(&mut self, other: &RecordedCounts) {
        for (c, &o) in self.counts.iter_mut().zip(&other.counts) {
            *c = c.saturating_add(o);
        }
        self.total = self.total.saturating_add(other.total);
    }

    /// True when nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// `Histogram::value_at_quantile`: the highest value equivalent to the
    /// bucket where the count reaches `quantile` of the total (the lowest
    /// for quantile 0); 0 when empty.
    pub fn value_at_quantile(&self, quantile: f64) -> u64 {
        let quantile = if quantile > 1.0 { 1.0 } else { quantile };
        let target = ((quantile * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= target {
                // The next bucket's lowest value less one is this one's
                // highest.
                return if quantile == 0.0 { Self::value_of(i) } else { Self::value_of(i + 1) - 1 };
            }
        }
        0
    }
}

/// Per-model accumulation during a run.
pub(crate) struct ModelAcc {
    pub offered: u64,
    pub good: u64,
    pub late: u64,
    pub dropped: u64,
    /// `dropped`, by [`DropReason::index`].
    pub drops_by_reason: [u64; DropReason::COUNT],
    pub latency_us: RecordedCounts,
    pub queueing_us: RecordedCounts,
    /// `batch_requests[b]` = measured requests served in batches of size `b`.
    pub batch_requests: Vec<u64>,
    pub batches: u64,
}

impl ModelAcc {
    pub fn new(max_batch: u32) -> Self {
        ModelAcc {
            offered: 0,
            good: 0,
            late: 0,
            dropped: 0,
            drops_by_reason: [0; DropReason::COUNT],
            latency_us: RecordedCounts::new(),
            queueing_us: RecordedCounts::new(),
            batch_requests: vec![0; max_batch as usize + 1],
            batches: 0,
        }
    }
}

/// Per priority class accumulation during a run.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ClassAcc {
    pub offered: u64,
    pub good: u64,
    pub late: u64,
    pub dropped: u64,
    pub refused: u64,
    pub timeouts: u64,
}

impl ClassAcc {
    pub fn report(&self, priority: u16) -> ClassReport {
        let bad = self.dropped + self.late;
        ClassReport {
            priority,
            offered: self.offered,
            good: self.good,
            dropped: self.dropped,
            late: self.late,
            refused: self.refused,
            timeouts: self.timeouts,
            bad_rate: if self.offered > 0 { bad as f64 / self.offered as f64 } else { 0.0 },
        }
    }
}

/// Outcome of one priority class (every model together).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ClassReport {
    /// Priority level (1 = highest).
    pub priority: u16,
    /// Requests of the class in the measurement window.
    pub offered: u64,
    /// Served within the SLO.
    pub good: u64,
    /// Dropped without running (any reason).
    pub dropped: u64,
    /// Ran but finished after the deadline.
    pub late: u64,
    /// Of `dropped`: refused or evicted by a full queue (`overloaded`).
    pub refused: u64,
    /// Of `dropped`: their own timeout ran out.
    pub timeouts: u64,
    /// `(dropped + late) / offered`.
    pub bad_rate: f64,
}

/// Outcome of one model.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ModelReport {
    /// Model name.
    pub name: String,
    /// Requests that arrived in the measurement window.
    pub offered: u64,
    /// Served within the SLO.
    pub good: u64,
    /// Dropped or late.
    pub bad: u64,
    /// Dropped without running.
    pub dropped: u64,
    /// `dropped` by reason (reasons that dropped none left out): a
    /// deferred policy's `early_drop` against its `deadline_unmeetable`
    /// tells heads given up for efficient batches from heads no GPU was
    /// found for in time.
    pub drops_by_reason: BTreeMap<&'static str, u64>,
    /// Ran but finished after the deadline.
    pub late: u64,
    /// `bad / offered`.
    pub bad_rate: f64,
    /// Median latency of served requests, ms.
    pub p50_ms: f64,
    /// 99th percentile latency of served requests, ms.
    pub p99_ms: f64,
    /// Median time from arrival to batch start, ms.
    pub queueing_p50_ms: f64,
    /// 99th percentile time from arrival to batch start, ms.
    pub queueing_p99_ms: f64,
    /// Median batch size seen by a served request.
    pub median_batch: u32,
    /// Mean batch size over batches.
    pub mean_batch: f64,
    /// Batches run.
    pub batches: u64,
}

/// Autoscaling advice from the run's signals (Symphony section 3.5).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct AutoscaleAdvice {
    /// GPUs to add: `N*r/(1-r)` when the bad rate `r` exceeds the threshold.
    pub add_gpus: f64,
    /// GPUs to release: `N*f` for idle fraction `f`.
    pub remove_gpus: f64,
    /// The bad-rate threshold used.
    pub bad_rate_threshold: f64,
}

impl AutoscaleAdvice {
    /// Advice for `gpus` GPUs given bad rate and idle fraction.
    pub fn new(gpus: u32, bad_rate: f64, idle_fraction: f64, threshold: f64) -> Self {
        let n = f64::from(gpus);
        let add = if bad_rate > threshold && bad_rate < 1.0 { n * bad_rate / (1.0 - bad_rate) } else { 0.0 };
        let remove = if bad_rate <= threshold { n * idle_fraction.clamp(0.0, 1.0) } else { 0.0 };
        AutoscaleAdvice { add_gpus: add, remove_gpus: remove, bad_rate_threshold: threshold }
    }
}

/// Outcome of one simulated run.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct SimReport {
    /// Policy name.
    pub policy: String,
    /// GPUs in the cluster.
    pub gpus: u32,
    /// Configured total rate, requests/s.
    pub offered_rps: f64,
    /// Arrivals in the measurement window divided by its length.
    pub measured_offered_rps: f64,
    /// Good requests per second in the measurement window.
    pub good_rps: f64,
    /// Requests in the measurement window.
    pub offered: u64,
    /// Served within SLO.
    pub good: u64,
    /// Dropped.
    pub dropped: u64,
    /// Late.
    pub late: u64,
    /// `(dropped + late) / offered`.
    pub bad_rate: f64,
    /// The worst model's bad rate.
    pub max_model_bad_rate: f64,
    /// Median batch size seen by a served request.
    pub median_batch: u32,
    /// Mean batch size over batches.
    pub mean_batch: f64,
    /// Fraction of GPU time idle in the measurement window.
    pub gpu_idle_fraction: f64,
    /// Median latency, ms.
    pub p50_ms: f64,
    /// 99th percentile latency, ms.
    pub p99_ms: f64,
    /// Median queueing delay, ms.
    pub queueing_p50_ms: f64,
    /// 99th percentile queueing delay, ms.
    pub queueing_p99_ms: f64,
    /// `[batch size, requests served in batches of that size]`, non-zero rows.
    pub batch_size_histogram: Vec<[u64; 2]>,
    /// Busy fraction of each GPU in the measurement window.
    pub gpu_busy_fraction: Vec<f64>,
    /// Autoscaling advice.
    pub autoscale: AutoscaleAdvice,
    /// Requests simulated (whole run, warm-up included).
    pub simulated_requests: u64,
    /// Batches dispatched (whole run).
    pub simulated_batches: u64,
    /// Per-model outcomes.
    pub models: Vec<ModelReport>,
    /// Per priority class, when the run had priorities or queue bounds
    /// (absent otherwise, so such reports are unchanged).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub classes: Option<Vec<ClassReport>>,
}

/// The median index of a histogram given as counts per index.
pub fn median_from_counts(counts: &[u64]) -> u32 {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return 0;
    }
    let mut seen = 0;
    for (b, &c) in counts.iter().enumerate() {
        seen += c;
        if seen * 2 >= total {
            return b as u32;
        }
    }
    0
}

pub(crate) fn ms(h: &RecordedCounts, q: f64) -> f64 {
    if h.is_empty() {
        0.0
    } else {
        h.value_at_quantile(q) as f64 / 1e3
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_xoshiro::Xoshiro256PlusPlus;

    /// Every value lands in `hdrhistogram`'s bucket for it, and sums and
    /// percentiles read from the counts are the crate's: every value up
    /// to 20000, random values over the whole range and past it, the
    /// edges of every bucket; several histograms added together.
    #[test]
    fn recorded_counts_read_as_hdrhistogram_reads() {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(49);
        let mut edges = Vec::new();
        for b in 0..40 {
            let edge = 1u64 << (b + 11);
            edges.extend([edge - 1, edge, edge + 1]);
        }
        edges.extend([0, 1, 100_000_000, 100_000_001, 104_857_599, 104_857_600, u64::MAX]);
        let sets: Vec<Vec<u64>> = vec![
            (0..20_000).collect(),
            (0..50_000).map(|_| rng.random_range(1..200_000_000u64)).collect(),
            (0..5_000).map(|_| 1u64 << rng.random_range(0..40u32)).collect(),
            (0..30_000).map(|_| rng.random_range(15_000..40_000u64)).collect(),
            edges,
            vec![7],
            vec![],
        ];
        let (mut all_direct, mut all_counts) = (new_hist(), RecordedCounts::new());
        assert_eq!(all_counts.counts.len(), all_direct.distinct_values());
        for values in &sets {
            let (mut direct, mut counts) = (new_hist(), RecordedCounts::new());
            for &v in values {
                let _ = direct.record(v);
                counts.record(v);
            }
            same_reads(&counts, &direct);
            all_counts.add(&counts);
            let _ = all_direct.add(&direct);
            same_reads(&all_counts, &all_direct);
        }
        for i in 0..COUNTS {
            let v = RecordedCounts::value_of(i);
            assert_eq!(RecordedCounts::index_of(v), i, "bucket {i}");
            assert_eq!(all_direct.lowest_equivalent(v), v, "bucket {i}");
            assert_eq!(all_direct.highest_equivalent(v), RecordedCounts::value_of(i + 1) - 1, "bucket {i}");
        }
    }

    fn same_reads(counts: &RecordedCounts, direct: &hdrhistogram::Histogram<u64>) {
        assert_eq!(counts.total, direct.len());
        assert_eq!(counts.is_empty(), direct.is_empty());
        for (i, &c) in counts.counts.iter().enumerate() {
            assert_eq!(c, direct.count_at(RecordedCounts::value_of(i)), "bucket {i}");
        }
        for q in [0.0, 1e-9, 0.01, 0.5, 0.9, 0.99, 0.999, 1.0, 1.5] {
            assert_eq!(counts.value_at_quantile(q), direct.value_at_quantile(q), "quantile {q}");
        }
    }
}
