//! Prometheus metrics in the text exposition format (version 0.0.4),
//! hand-written over preallocated atomics: recording is a few relaxed
//! atomic adds, rendering happens only when `/metrics` is scraped.
//!
//! Names follow Triton where a Triton metric means the same thing
//! (`nv_inference_*`, label `model` and `version`); the rest are
//! `symphony_*`.

use crate::models::ModelCatalog;
use crate::staging::CounterSnapshot;
use dataplane::wire::DropReason;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds of the batch-size histogram buckets (`+Inf` is implied).
pub const BATCH_BUCKETS: [u32; 10] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512];

#[derive(Default)]
struct ModelMetrics {
    success: AtomicU64,
    failure: AtomicU64,
    exec_count: AtomicU64,
    request_us: AtomicU64,
    /// The part of `request_us` spent by failed requests.
    failure_us: AtomicU64,
    /// When the last request succeeded, milliseconds since the Unix epoch.
    last_success_ms: AtomicU64,
    queue_us: AtomicU64,
    compute_us: AtomicU64,
    dropped: [AtomicU64; DropReason::COUNT],
    batch_buckets: [AtomicU64; BATCH_BUCKETS.len() + 1],
    batch_sum: AtomicU64,
}

/// One model's counters at one moment (see [`Metrics::model_counters`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModelCounters {
    /// Successful requests (`nv_inference_request_success`).
    pub success: u64,
    /// Failed requests (`nv_inference_request_failure`).
    pub failure: u64,
    /// Batches executed (`nv_inference_exec_count`).
    pub exec_count: u64,
    /// End-to-end duration of all requests, µs (`nv_inference_request_duration_us`).
    pub request_us: u64,
    /// The part of `request_us` spent by failed requests.
    pub failure_us: u64,
    /// Queueing time summed over requests, µs (`nv_inference_queue_duration_us`).
    pub queue_us: u64,
    /// Compute time summed over requests, µs (`nv_inference_compute_infer_duration_us`).
    pub compute_us: u64,
    /// Executions per [`BATCH_BUCKETS`] bucket (the last: larger).
    pub batch_buckets: [u64; BATCH_BUCKETS.len() + 1],
    /// Requests executed, summed over batches.
    pub batch_sum: u64,
    /// The last success, milliseconds since the Unix epoch (0: none).
    pub last_success_ms: u64,
}

/// Per-model metrics of one frontend (and of the in-process cluster, which
/// reports batches and their timing here).
pub struct Metrics {
    names: Vec<(String, String)>,
    models: Box<[ModelMetrics]>,
    /// More samples appended to every rendering (the daemon's own gauges
    /// and counters), set once.
    extra: std::sync::OnceLock<Box<ExtraFn>>,
}

/// Appends samples (with their HELP/TYPE lines) to a rendering.
pub type ExtraFn = dyn Fn(&mut String) + Send + Sync;

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("models", &self.names.len())
            .finish()
    }
}

impl Metrics {
    /// Metrics for every model of `catalog`.
    pub fn new(catalog: &ModelCatalog) -> Self {
        Metrics {
            names: catalog
                .entries()
                .iter()
                .map(|e| (e.spec.name.clone(), e.version.clone()))
                .collect(),
            models: catalog
                .entries()
                .iter()
                .map(|_| ModelMetrics::default())
                .collect(),
            extra: std::sync::OnceLock::new(),
        }
    }

    /// Makes every [`render`](Self::render) end with what `f` appends.
    /// Only the first call takes effect.
    pub fn set_extra(&self, f: Box<ExtraFn>) {
        let _ = self.extra.set(f);
    }

    fn model(&self, id: u32) -> Option<&ModelMetrics> {
        self.models.get(id as usize)
    }

    /// A request of model `id` succeeded after `request_us` end to end.
    pub fn record_success(&self, id: u32, request_us: u64) {
        if let Some(m) = self.model(id) {
            m.success.fetch_add(1, Ordering::Relaxed);
            m.request_us.fetch_add(request_us, Ordering::Relaxed);
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            m.last_success_ms.fetch_max(now_ms, Ordering::Relaxed);
        }
    }
    /// A request of model `id` failed (error, timeout, or drop).
    pub fn record_failure(&self, id: u32, request_us: u64) {
        if let Some(m) = self.model(id) {
            m.failure.fetch_add(1, Ordering::Relaxed);
            m.request_us.fetch_add(request_us, Ordering::Relaxed);
            m.failure_us.fetch_add(request_us, Ordering::Relaxed);
        }
    }
    /// A request of model `id` was dropped for `reason` (also a failure in
    /// Triton's terms; call [`Metrics::record_failure`] as well).
    pub fn record_drop(&self, id: u32, reason: DropReason) {
        if let Some(m) = self.model(id) {
            m.dropped[reason.index()].fetch_add(1, Ordering::Relaxed);
        }
    }
    /// A batch of `size` requests of model `id` executed in `compute_us`,
    /// its requests having queued `queue_us` in total.
    pub fn record_batch(&self, id: u32, size: u32, compute_us: u64, queue_us: u64) {
        if let Some(m) = self.model(id) {
            m.exec_count.fetch_add(1, Ordering::Relaxed);
            m.compute_us.fetch_add(
                compute_us.saturating_mul(u64::from(size)),
                Ordering::Relaxed,
            );
            m.queue_us.fetch_add(queue_us, Ordering::Relaxed);
            let b = BATCH_BUCKETS
                .iter()
                .position(|&ub| size <= ub)
                .unwrap_or(BATCH_BUCKETS.len());
            m.batch_buckets[b].fetch_add(1, Ordering::Relaxed);
            m.batch_sum.fetch_add(u64::from(size), Ordering::Relaxed);
        }
    }

    /// Successful requests of model `id` so far.
    pub fn successes(&self, id: u32) -> u64 {
        self.model(id)
            .map_or(0, |m| m.success.load(Ordering::Relaxed))
    }
    /// Batches of model `id` executed so far.
    pub fn exec_count(&self, id: u32) -> u64 {
        self.model(id)
            .map_or(0, |m| m.exec_count.load(Ordering::Relaxed))
    }

    /// Model `id`'s counters, each read once (the statistics extension
    /// reports these, so `/stats` and `/metrics` agree).
    pub fn model_counters(&self, id: u32) -> ModelCounters {
        let Some(m) = self.model(id) else {
            return ModelCounters::default();
        };
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ModelCounters {
            success: ld(&m.success),
            failure: ld(&m.failure),
            exec_count: ld(&m.exec_count),
            request_us: ld(&m.request_us),
            failure_us: ld(&m.failure_us),
            queue_us: ld(&m.queue_us),
            compute_us: ld(&m.compute_us),
            batch_buckets: std::array::from_fn(|i| ld(&m.batch_buckets[i])),
            batch_sum: ld(&m.batch_sum),
            last_success_ms: ld(&m.last_success_ms),
        }
    }

    /// Renders every metric, plus the global outcome counters `c`.
    pub fn render(&self, c: &CounterSnapshot) -> String {
        let mut o = String::with_capacity(4096);
        let per_model = |o: &mut String,
                         name: &str,
                         help: &str,
                         kind: &str,
                         f: &dyn Fn(&ModelMetrics) -> u64| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for ((model, version), m) in self.names.iter().zip(self.models.iter()) {
                let _ = writeln!(
                    o,
                    "{name}{{model=\"{}\",version=\"{}\"}} {}",
                    esc(model),
                    esc(version),
                    f(m)
                );
            }
        };
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        per_model(
            &mut o,
            "nv_inference_request_success",
            "Number of successful inference requests, all batch sizes",
            "counter",
            &|m| ld(&m.success),
        );
        per_model(
            &mut o,
            "nv_inference_request_failure",
            "Number of failed inference requests (errors and drops), all batch sizes",
            "counter",
            &|m| ld(&m.failure),
        );
        per_model(
            &mut o,
            "nv_inference_count",
            "Number of inferences performed (requests of batch 1 each)",
            "counter",
            &|m| ld(&m.success),
        );
        per_model(
            &mut o,
            "nv_inference_exec_count",
            "Number of model executions performed (batches)",
            "counter",
            &|m| ld(&m.exec_count),
        );
        per_model(
            &mut o,
            "nv_inference_request_duration_us",
            "Cumulative end-to-end inference request duration in microseconds",
            "counter",
            &|m| ld(&m.request_us),
        );
        per_model(
            &mut o,
            "nv_inference_queue_duration_us",
            "Cumulative inference queuing duration in microseconds",
            "counter",
            &|m| ld(&m.queue_us),
        );
        per_model(
            &mut o,
            "nv_inference_compute_infer_duration_us",
            "Cumulative compute inference duration in microseconds",
            "counter",
            &|m| ld(&m.compute_us),
        );

        let _ = writeln!(o, "# HELP symphony_dropped_total Requests dropped by the cluster, by reason\n# TYPE symphony_dropped_total counter");
        for ((model, _), m) in self.names.iter().zip(self.models.iter()) {
            for r in DropReason::ALL {
                let _ = writeln!(
                    o,
                    "symphony_dropped_total{{model=\"{}\",reason=\"{}\"}} {}",
                    esc(model),
                    r.as_str(),
                    ld(&m.dropped[r.index()])
                );
            }
        }
        let _ = writeln!(o, "# HELP symphony_batch_size Sizes of executed batches\n# TYPE symphony_batch_size histogram");
        for ((model, _), m) in self.names.iter().zip(self.models.iter()) {
            let mut cum = 0;
            for (i, ub) in BATCH_BUCKETS.iter().enumerate() {
                cum += ld(&m.batch_buckets[i]);
                let _ = writeln!(
                    o,
                    "symphony_batch_size_bucket{{model=\"{}\",le=\"{ub}\"}} {cum}",
                    esc(model)
                );
            }
            cum += ld(&m.batch_buckets[BATCH_BUCKETS.len()]);
            let _ = writeln!(
                o,
                "symphony_batch_size_bucket{{model=\"{}\",le=\"+Inf\"}} {cum}",
                esc(model)
            );
            let _ = writeln!(
                o,
                "symphony_batch_size_sum{{model=\"{}\"}} {}",
                esc(model),
                ld(&m.batch_sum)
            );
            let _ = writeln!(
                o,
                "symphony_batch_size_count{{model=\"{}\"}} {cum}",
                esc(model)
            );
        }
        for (name, help, v) in [
            (
                "symphony_requests_accepted_total",
                "Requests staged and handed to the cluster",
                c.accepted,
            ),
            (
                "symphony_requests_succeeded_total",
                "Accepted requests answered with a result",
                c.succeeded,
            ),
            (
                "symphony_requests_dropped_total",
                "Accepted requests dropped by the cluster",
                c.dropped,
            ),
            (
                "symphony_requests_failed_total",
                "Accepted requests that ended in an error",
                c.failed,
            ),
            (
                "symphony_requests_rejected_full_total",
                "Requests refused because every staging slot was in use",
                c.rejected_full,
            ),
            (
                "symphony_completions_unroutable_total",
                "Outcomes naming no request in flight",
                c.unroutable,
            ),
            (
                "symphony_completions_duplicate_total",
                "Second outcomes for one request",
                c.duplicates,
            ),
            (
                "symphony_completions_late_total",
                "Outcomes arriving after their request gave up",
                c.late,
            ),
        ] {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        }
        if let Some(f) = self.extra.get() {
            f(&mut o);
        }
        o
    }
}

/// Escapes a label value (backslash, quote, newline).
fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
