//! What a run measured: per-model and overall outcomes, latency and
//! queueing percentiles, batch sizes, GPU idle time, autoscaling advice.

use crate::types::DropReason;
use hdrhistogram::Histogram;
use serde::Serialize;
use std::collections::BTreeMap;

/// Latency histograms record microseconds up to 100 s, 3 significant digits.
pub(crate) fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000, 3).unwrap_or_else(|_| Histogram::new(3).unwrap_or_else(|_| unreachable!()))
}

/// Per-model accumulation during a run.
pub(crate) struct ModelAcc {
    pub offered: u64,
    pub good: u64,
    pub late: u64,
    pub dropped: u64,
    /// `dropped`, by [`DropReason::index`].
    pub drops_by_reason: [u64; DropReason::COUNT],
    pub latency_us: Histogram<u64>,
    pub queueing_us: Histogram<u64>,
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
            latency_us: new_hist(),
            queueing_us: new_hist(),
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

pub(crate) fn ms(h: &Histogram<u64>, q: f64) -> f64 {
    if h.is_empty() {
        0.0
    } else {
        h.value_at_quantile(q) as f64 / 1e3
    }
}
