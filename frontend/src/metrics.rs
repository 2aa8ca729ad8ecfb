//! The frontend's per-model metrics: handles into one
//! [`MetricsRegistry`] (`node_shell::metrics`), resolved per model once at
//! start, so recording is a few relaxed atomic adds (no lock, no
//! allocation, no label lookup).
//!
//! Names follow Triton where a Triton metric means the same thing
//! (`nv_inference_*`, labels `model` and `version`); the rest are
//! `symphony_*`. Execution figures come from the backends: every
//! completion says which execution its task was part of ([`Execution`],
//! from `dataplane::wire::CompletionHead`), and an execution is counted
//! once, from the completion of its leader (position 0).

use crate::models::{ModelCatalog, ModelEntry, Resend};
use crate::staging::{CounterSnapshot, Staging};
pub use crate::types::Execution;
use node_shell::metrics::{self, Computed, Counter, Histogram, Label, MetricsRegistry, PlainCounter};
use dataplane::wire::DropReason;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Upper bounds of the batch-size histogram buckets (`+Inf` is implied).
pub const BATCH_BUCKETS: [u64; 10] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512];

/// Upper bounds of the per-stage latency buckets, µs (`+Inf` is implied).
pub const STAGE_BUCKETS_US: [u64; 16] =
    [10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000];

/// The stages of an executed request, in order; they add up to its end-to-end
/// time (`symphony_executed_request_duration_us`). Each is measured on one
/// clock: `queue` on the scheduler's, `input`/`compute`/`output` on the
/// backend's; `network` is the rest, measured here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Received here → ingress at the scheduler's ModelThread, plus the
    /// plan's trip to the backend, the batch's wait for its device, the
    /// completion's trip back and the answer: the parts no single clock
    /// measures (without synchronised clocks they cannot be split).
    Network = 0,
    /// Ingress at the ModelThread → the plan's sending (wire
    /// `queued_us`).
    Queue = 1,
    /// The plan's arrival at the backend → its READs done and the batch
    /// handed to the device (including the wait for its start moment).
    Input = 2,
    /// On the device.
    Compute = 3,
    /// Executed → the completion's sending.
    Output = 4,
}

impl Stage {
    /// Every stage, in order.
    pub const ALL: [Stage; 5] = [Stage::Network, Stage::Queue, Stage::Input, Stage::Compute, Stage::Output];
    /// Its `stage` label.
    pub const fn as_str(self) -> &'static str {
        match self {
            Stage::Network => "network",
            Stage::Queue => "queue",
            Stage::Input => "input",
            Stage::Compute => "compute",
            Stage::Output => "output",
        }
    }
    /// The `µs` of each stage of a request that took `request_ns` here
    /// and ran in execution `e`; they sum to `request_ns / 1000` unless
    /// the remote figures exceed it (then `network` is 0).
    pub fn split_us(request_ns: u64, e: &Execution) -> [u64; 5] {
        let queue = u64::from(e.queued_us);
        let input = e.input_ns / 1_000;
        let compute = e.compute_ns / 1_000;
        let output = e.since_start_ns.saturating_sub(e.compute_ns) / 1_000;
        let remote = queue + input + compute + output;
        [(request_ns / 1_000).saturating_sub(remote), queue, input, compute, output]
    }
}

/// Priority levels counted apart in the `level` label: `0` (the request
/// named none: the model's default level), `1` (the highest), `2`, and `3`
/// (3 and every lower one).
pub const LEVEL_LABELS: usize = 4;

/// The `level` label index of a request's `priority` parameter.
#[inline]
pub fn level_label(priority: u32) -> usize {
    (priority as usize).min(LEVEL_LABELS - 1)
}

/// How a request ended, as counted by priority level
/// (`symphony_requests_by_level`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LevelOutcome {
    /// Answered with a result within its budget.
    Ok,
    /// Answered with a result after its budget (as measured here).
    Late,
    /// Failed at a backend.
    Failed,
    /// No outcome within its budget plus grace.
    TimedOut,
    /// Refused before it was accepted.
    Refused,
    /// Its model was unloaded while it waited.
    Unloaded,
    /// Dropped by the cluster, with the reason.
    Dropped(DropReason),
}

impl LevelOutcome {
    /// Outcomes other than drops, in counter order.
    const PLAIN: [&'static str; 6] = ["ok", "late", "failed", "timed_out", "refused", "unloaded"];
    /// Number of outcomes (drops count per reason).
    pub const COUNT: usize = Self::PLAIN.len() + DropReason::COUNT;

    /// Its counter index.
    pub fn index(self) -> usize {
        match self {
            LevelOutcome::Ok => 0,
            LevelOutcome::Late => 1,
            LevelOutcome::Failed => 2,
            LevelOutcome::TimedOut => 3,
            LevelOutcome::Refused => 4,
            LevelOutcome::Unloaded => 5,
            LevelOutcome::Dropped(r) => Self::PLAIN.len() + r.index(),
        }
    }

    /// Every `outcome` label, in counter order.
    pub fn labels() -> impl Iterator<Item = String> {
        Self::PLAIN.iter().map(|s| s.to_string()).chain(DropReason::ALL.iter().map(|r| r.as_str().to_string()))
    }
}

/// One model's series.
#[derive(Debug)]
struct ModelSeries {
    success: PlainCounter,
    failure: PlainCounter,
    inference_count: PlainCounter,
    exec_count: PlainCounter,
    request_us: PlainCounter,
    queue_us: PlainCounter,
    compute_input_us: PlainCounter,
    compute_infer_us: PlainCounter,
    compute_output_us: PlainCounter,
    dropped: Vec<Counter>,
    /// Tries sent again for a late answer, per [`Resend`] cause.
    resends: Vec<Counter>,
    batch_size: Histogram,
    /// Per [`Stage`], µs, of executed requests.
    stages: Vec<Histogram>,
    /// End to end, µs, of executed requests (the stages' total).
    executed_us: Histogram,
    /// Outcomes by level: `level_label * LevelOutcome::COUNT + index`.
    by_level: Vec<Counter>,
    /// Per level and [`Stage`], µs, of executed requests:
    /// `level_label * Stage::ALL.len() + stage`.
    level_stages: Vec<Histogram>,
    /// The part of `request_us` spent by failed requests (statistics).
    failure_us: AtomicU64,
    /// The last success, milliseconds since the Unix epoch (statistics).
    last_success_ms: AtomicU64,
}

/// One model's counters at one moment (see [`Metrics::model_counters`]):
/// what the statistics extension reports, so `/stats` and `/metrics` agree.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelCounters {
    /// Successful requests (`nv_inference_request_success`).
    pub success: u64,
    /// Failed requests (`nv_inference_request_failure`).
    pub failure: u64,
    /// Inferences (`nv_inference_count`).
    pub inference_count: u64,
    /// Executions (`nv_inference_exec_count`).
    pub exec_count: u64,
    /// End-to-end duration of all requests, µs.
    pub request_us: u64,
    /// The part of `request_us` spent by failed requests.
    pub failure_us: u64,
    /// Queueing time summed over executed requests, µs.
    pub queue_us: u64,
    /// Input time summed over executed requests, µs.
    pub compute_input_us: u64,
    /// Compute time summed over executed requests, µs.
    pub compute_us: u64,
    /// Output time summed over executed requests, µs.
    pub compute_output_us: u64,
    /// Executions per [`BATCH_BUCKETS`] bucket (the last: larger).
    pub batch_buckets: Vec<u64>,
    /// Requests executed, summed over executions.
    pub batch_sum: u64,
    /// The last success, milliseconds since the Unix epoch (0: none).
    pub last_success_ms: u64,
}

/// Per-model metrics of one frontend, and the registry its `/metrics`
/// encodes.
#[derive(Debug)]
pub struct Metrics {
    registry: Arc<MetricsRegistry>,
    models: Box<[ModelSeries]>,
}

/// The label sets of a by-level family: every model, every level, every
/// value of its `second` label, in that order.
fn level_labels(entries: &[ModelEntry], second: &'static str, values: Vec<String>) -> Vec<Vec<Label>> {
    entries
        .iter()
        .flat_map(|e| {
            let values = values.clone();
            (0..LEVEL_LABELS).flat_map(move |l| {
                let name = e.spec.name.clone();
                values.clone().into_iter().map(move |v| vec![("model", name.clone()), ("level", l.to_string()), (second, v)])
            })
        })
        .collect()
}

/// `symphony_late_resends`: per model, one counter per [`Resend`] cause.
fn resend_counters(r: &Arc<MetricsRegistry>, entries: &[ModelEntry]) -> Vec<Counter> {
    let labels = entries
        .iter()
        .flat_map(|e| Resend::ALL.map(|c| vec![("model", e.spec.name.clone()), ("cause", c.as_str().to_string())]))
        .collect();
    metrics::labelled_by(
        r,
        "symphony_late_resends",
        "Tries of requests to models serving late answers sent again, by the cause that ended the try before (deadline: dropped for it; abandoned: its batch given up by the scheduler; input_unavailable: its input not fetched)",
        labels,
        Counter::default,
    )
}

impl Metrics {
    /// Metrics for every model of `catalog`, in a registry of their own.
    pub fn new(catalog: &ModelCatalog) -> Self {
        let r = Arc::new(MetricsRegistry::new());
        let entries = catalog.entries();
        let labels: Vec<Vec<Label>> = entries
            .iter()
            .map(|e| vec![("model", e.spec.name.clone()), ("version", e.version.clone())])
            .collect();
        let triton = |name: &str, help: &str| metrics::labelled_by(&r, name, help, labels.clone(), PlainCounter::default);
        let mut success = triton("nv_inference_request_success", "Number of successful inference requests, all batch sizes").into_iter();
        let mut failure = triton(
            "nv_inference_request_failure",
            "Number of failed inference requests (errors and drops), all batch sizes",
        )
        .into_iter();
        let mut inference_count = triton("nv_inference_count", "Number of inferences performed (requests of batch 1 each)").into_iter();
        let mut exec_count = triton("nv_inference_exec_count", "Number of model executions performed (batches)").into_iter();
        let mut request_us = triton("nv_inference_request_duration_us", "Cumulative end-to-end inference request duration in microseconds").into_iter();
        let mut queue_us = triton(
            "nv_inference_queue_duration_us",
            "Cumulative time requests waited before their input fetch began (frontend queue, network, scheduling), in microseconds",
        )
        .into_iter();
        let mut compute_input_us = triton(
            "nv_inference_compute_input_duration_us",
            "Cumulative input duration (backend input READs until the device took the batch) in microseconds",
        )
        .into_iter();
        let mut compute_infer_us = triton("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds").into_iter();
        let mut compute_output_us = triton(
            "nv_inference_compute_output_duration_us",
            "Cumulative output duration (device finish until the backend sent the result) in microseconds",
        )
        .into_iter();
        let drop_labels = entries
            .iter()
            .flat_map(|e| DropReason::ALL.map(|d| vec![("model", e.spec.name.clone()), ("reason", d.as_str().to_string())]))
            .collect();
        let mut dropped = metrics::labelled_by(&r, "symphony_dropped", "Requests dropped by the cluster, by reason", drop_labels, Counter::default).into_iter();
        let mut resends = resend_counters(&r, entries).into_iter();
        let mut batch_size = metrics::labelled(
            &r,
            "symphony_batch_size",
            "Sizes of executed batches (counted by their leader's frontend)",
            "model",
            entries.iter().map(|e| e.spec.name.clone()),
            || Histogram::new(&BATCH_BUCKETS),
        )
        .into_iter();
        let stage_labels = entries
            .iter()
            .flat_map(|e| Stage::ALL.map(|st| vec![("model", e.spec.name.clone()), ("stage", st.as_str().to_string())]))
            .collect();
        let mut stages = metrics::labelled_by(
            &r,
            "symphony_stage_duration_us",
            "Executed requests' time per stage in microseconds: network (received to scheduler ingress, plan and completion trips, device wait, answer), queue (scheduler ingress to plan sent), input (plan at backend to READs done), compute, output (executed to completion sent)",
            stage_labels,
            || Histogram::new(&STAGE_BUCKETS_US),
        )
        .into_iter();
        let mut executed_us = metrics::labelled(
            &r,
            "symphony_executed_request_duration_us",
            "Executed requests' end-to-end time at the frontend in microseconds (the sum of their stages)",
            "model",
            entries.iter().map(|e| e.spec.name.clone()),
            || Histogram::new(&STAGE_BUCKETS_US),
        )
        .into_iter();
        let mut by_level = metrics::labelled_by(
            &r,
            "symphony_requests_by_level",
            "Requests by their priority parameter (level 0: none given; 3: 3 and lower) and outcome (late: a result after the budget, as measured here; drops by reason)",
            level_labels(entries, "outcome", LevelOutcome::labels().collect()),
            Counter::default,
        )
        .into_iter();
        let mut level_stages = metrics::labelled_by(
            &r,
            "symphony_stage_duration_by_level_us",
            "Executed requests' time per stage in microseconds (as symphony_stage_duration_us), by priority parameter (level 0: none given; 3: 3 and lower)",
            level_labels(entries, "stage", Stage::ALL.iter().map(|st| st.as_str().to_string()).collect()),
            || Histogram::new(&STAGE_BUCKETS_US),
        )
        .into_iter();
        let models = entries
            .iter()
            .filter_map(|_| {
                Some(ModelSeries {
                    success: success.next()?,
                    failure: failure.next()?,
                    inference_count: inference_count.next()?,
                    exec_count: exec_count.next()?,
                    request_us: request_us.next()?,
                    queue_us: queue_us.next()?,
                    compute_input_us: compute_input_us.next()?,
                    compute_infer_us: compute_infer_us.next()?,
                    compute_output_us: compute_output_us.next()?,
                    dropped: dropped.by_ref().take(DropReason::COUNT).collect(),
                    resends: resends.by_ref().take(Resend::ALL.len()).collect(),
                    batch_size: batch_size.next()?,
                    stages: stages.by_ref().take(Stage::ALL.len()).collect(),
                    executed_us: executed_us.next()?,
                    by_level: by_level.by_ref().take(LEVEL_LABELS * LevelOutcome::COUNT).collect(),
                    level_stages: level_stages.by_ref().take(LEVEL_LABELS * Stage::ALL.len()).collect(),
                    failure_us: AtomicU64::new(0),
                    last_success_ms: AtomicU64::new(0),
                })
            })
            .collect();
        Metrics { registry: r, models }
    }

    /// The registry (the daemon serves it and adds its own families).
    pub fn registry(&self) -> &Arc<MetricsRegistry> {
        &self.registry
    }

    /// The OpenMetrics text of every family.
    pub fn encode(&self) -> String {
        self.registry.encode()
    }

    /// Registers `staging`'s outcome accounting as the
    /// `symphony_requests_*` / `symphony_completions_*` families (once per
    /// staging area: the service does it when it is built).
    pub fn register_staging(&self, staging: &Arc<Staging>) {
        type Pick = fn(&CounterSnapshot) -> u64;
        let families: [(&str, &str, Pick); 9] = [
            ("symphony_requests_accepted", "Requests staged and handed to the cluster", |c| c.accepted),
            ("symphony_requests_succeeded", "Accepted requests answered with a result", |c| c.succeeded),
            ("symphony_requests_dropped", "Accepted requests dropped by the cluster", |c| c.dropped),
            ("symphony_requests_failed", "Accepted requests that ended in an error", |c| c.failed),
            ("symphony_requests_rejected_full", "Requests refused because every staging slot was in use", |c| c.rejected_full),
            ("symphony_completions_unroutable", "Outcomes naming no request in flight", |c| c.unroutable),
            ("symphony_completions_duplicate", "Second outcomes for one request", |c| c.duplicates),
            ("symphony_completions_late", "Outcomes arriving after their request gave up", |c| c.late),
            ("symphony_frontend_refused_completions", "Completions and drops refused: their capability did not verify for their sender (forged, or a task planned to another backend), or a backend sent a drop", |c| c.refused),
        ];
        for (name, help, pick) in families {
            let s = staging.clone();
            self.registry
                .register(name, help, Computed::counter_of(move || pick(&s.counters().snapshot())));
        }
    }

    /// Registers `forged`, the count of scheduler Welcomes that did not
    /// prove the join token (the I/O thread stores the node's count in it),
    /// as `symphony_frontend_forged_welcomes_total`.
    pub fn register_forged_welcomes(&self, forged: Counter) {
        self.registry.register(
            "symphony_frontend_forged_welcomes",
            "Welcomes refused because they did not prove the join token (unsigned, forged, another cluster's or replayed): something not a scheduler of this cluster answered on a scheduler address",
            forged,
        );
    }

    fn model(&self, id: u32) -> Option<&ModelSeries> {
        self.models.get(id as usize)
    }

    /// A request of model `id` succeeded after `request_us` end to end.
    pub fn record_success(&self, id: u32, request_us: u64) {
        if let Some(m) = self.model(id) {
            m.success.inc();
            m.inference_count.inc();
            m.request_us.inc_by(request_us);
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            m.last_success_ms.fetch_max(now_ms, Ordering::Relaxed);
        }
    }
    /// A request of model `id` failed (error, timeout, or drop).
    pub fn record_failure(&self, id: u32, request_us: u64) {
        if let Some(m) = self.model(id) {
            m.failure.inc();
            m.request_us.inc_by(request_us);
            m.failure_us.fetch_add(request_us, Ordering::Relaxed);
        }
    }
    /// A request of model `id` was dropped for `reason` (also a failure in
    /// Triton's terms; call [`Metrics::record_failure`] as well).
    pub fn record_drop(&self, id: u32, reason: DropReason) {
        if let Some(m) = self.model(id).and_then(|m| m.dropped.get(reason.index())) {
            m.inc();
        }
    }
    /// A try of a request of model `id` ended for `cause` and is sent again.
    pub fn record_resend(&self, id: u32, cause: Resend) {
        if let Some(c) = self.model(id).and_then(|m| m.resends.get(cause as usize)) {
            c.inc();
        }
    }
    /// A request of model `id` that took `request_ns` end to end was part
    /// of execution `e`: its queue, input, compute and output times (per
    /// request, as Triton counts them), and, from the execution's leader,
    /// the execution itself.
    pub fn record_execution(&self, id: u32, request_ns: u64, e: &Execution) {
        let Some(m) = self.model(id) else { return };
        // Everything before the backend's input phase: the request's time
        // here minus the backend's time since it began the batch's inputs
        // (the completion's trip back is counted in, as it is not known).
        let at_backend = e.since_start_ns.saturating_add(e.input_ns);
        m.queue_us.inc_by(request_ns.saturating_sub(at_backend) / 1_000);
        m.compute_input_us.inc_by(e.input_ns / 1_000);
        m.compute_infer_us.inc_by(e.compute_ns / 1_000);
        m.compute_output_us.inc_by(e.since_start_ns.saturating_sub(e.compute_ns) / 1_000);
        let split = Stage::split_us(request_ns, e);
        for (h, us) in m.stages.iter().zip(split) {
            h.observe(us);
        }
        m.executed_us.observe(request_ns / 1_000);
        if e.batch_index == 0 {
            m.exec_count.inc();
            m.batch_size.observe(u64::from(e.batch_size));
        }
    }

    /// A request of model `id` with `priority` ended as `outcome`; `stages`:
    /// its time per [`Stage`] (µs) if it was executed.
    pub fn record_level(&self, id: u32, priority: u32, outcome: LevelOutcome, stages: Option<[u64; 5]>) {
        let Some(m) = self.model(id) else { return };
        let level = level_label(priority);
        if let Some(c) = m.by_level.get(level * LevelOutcome::COUNT + outcome.index()) {
            c.inc();
        }
        if let Some(split) = stages {
            let n = Stage::ALL.len();
            for (h, us) in m.level_stages.iter().skip(level * n).take(n).zip(split) {
                h.observe(us);
            }
        }
    }

    /// Successful requests of model `id` so far.
    pub fn successes(&self, id: u32) -> u64 {
        self.model(id).map_or(0, |m| m.success.get())
    }
    /// Inferences of model `id` so far.
    pub fn inferences(&self, id: u32) -> u64 {
        self.model(id).map_or(0, |m| m.inference_count.get())
    }
    /// Executions (batches) of model `id` counted here so far.
    pub fn exec_count(&self, id: u32) -> u64 {
        self.model(id).map_or(0, |m| m.exec_count.get())
    }

    /// Model `id`'s stage histograms so far: (observations, sum in µs) per
    /// [`Stage::ALL`], then the end-to-end total's.
    pub fn stage_totals(&self, id: u32) -> ([(u64, u64); 5], (u64, u64)) {
        let mut out = [(0, 0); 5];
        let Some(m) = self.model(id) else { return (out, (0, 0)) };
        for (o, h) in out.iter_mut().zip(&m.stages) {
            *o = (h.count(), h.sum());
        }
        (out, (m.executed_us.count(), m.executed_us.sum()))
    }

    /// Model `id`'s counters, each read once.
    pub fn model_counters(&self, id: u32) -> ModelCounters {
        let Some(m) = self.model(id) else {
            return ModelCounters::default();
        };
        ModelCounters {
            success: m.success.get(),
            failure: m.failure.get(),
            inference_count: m.inference_count.get(),
            exec_count: m.exec_count.get(),
            request_us: m.request_us.get(),
            failure_us: m.failure_us.load(Ordering::Relaxed),
            queue_us: m.queue_us.get(),
            compute_input_us: m.compute_input_us.get(),
            compute_us: m.compute_infer_us.get(),
            compute_output_us: m.compute_output_us.get(),
            batch_buckets: m.batch_size.buckets(),
            batch_sum: m.batch_size.sum(),
            last_success_ms: m.last_success_ms.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane::control::metric;
    use scheduler_core::zoo::ModelSpec;

    #[test]
    fn outcomes_and_stages_are_counted_by_priority_level() {
        let m = Metrics::new(&ModelCatalog::with_default_tensors(&[ModelSpec::linear("bert", 7.0, 0.2, 59.0).unwrap()]));
        m.record_level(0, 1, LevelOutcome::Late, Some([300, 1_000, 50, 28_000, 20]));
        m.record_level(0, 1, LevelOutcome::Ok, None);
        m.record_level(0, 2, LevelOutcome::Dropped(DropReason::EarlyDrop), None);
        // Past the last label: counted as the last.
        m.record_level(0, 9, LevelOutcome::TimedOut, None);
        m.record_level(0, 0, LevelOutcome::Ok, None);
        let t = m.encode();
        let n = |level: &str, outcome: &str| metric(&t, &format!("symphony_requests_by_level_total{{model=\"bert\",level=\"{level}\",outcome=\"{outcome}\"}}"));
        assert_eq!((n("1", "late"), n("1", "ok"), n("1", "early_drop")), (Some(1.0), Some(1.0), Some(0.0)));
        assert_eq!((n("2", "early_drop"), n("3", "timed_out"), n("0", "ok")), (Some(1.0), Some(1.0), Some(1.0)));
        let stage = |s: &str| metric(&t, &format!("symphony_stage_duration_by_level_us_sum{{model=\"bert\",level=\"1\",stage=\"{s}\"}}"));
        assert_eq!((stage("network"), stage("compute")), (Some(300.0), Some(28_000.0)));
        assert_eq!(metric(&t, "symphony_stage_duration_by_level_us_count{model=\"bert\",level=\"2\",stage=\"queue\"}"), Some(0.0));
    }
    #[test]
    fn forged_welcomes_are_published_as_the_io_thread_stores_them() {
        let m = Metrics::new(&ModelCatalog::with_default_tensors(&[ModelSpec::linear("bert", 7.0, 0.2, 59.0).unwrap()]));
        let forged = Counter::default();
        m.register_forged_welcomes(forged.clone());
        assert_eq!(metric(&m.encode(), "symphony_frontend_forged_welcomes_total"), Some(0.0));
        forged.inner().store(3, Ordering::Relaxed);
        assert_eq!(metric(&m.encode(), "symphony_frontend_forged_welcomes_total"), Some(3.0));
    }
}
