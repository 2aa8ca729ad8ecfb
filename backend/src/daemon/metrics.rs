//! The backend's metrics: handles into one [`MetricsRegistry`]
//! (`node_shell::metrics`).
//!
//! The poll thread is the only writer: it copies the worker's counters and
//! folds each finished batch into counters and histograms with relaxed
//! atomics (no lock, no allocation); the metrics endpoint's thread only
//! encodes them when scraped.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use node_shell::metrics::{self, Computed, Counter, Histogram, Label, MetricsRegistry, PlainCounter};

use crate::worker::{BatchReport, FenceReason, WorkerStats};

/// Upper bounds of the batch-size buckets (`+Inf` follows).
const BATCH_SIZE_BOUNDS: [u64; 10] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512];
/// Upper bounds of the compute-duration buckets, microseconds.
const COMPUTE_US_BOUNDS: [u64; 12] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000,
];
/// Upper bounds of the start-lateness buckets (a batch's device start
/// after its planned `exec_at`; 0: on time or early), microseconds.
const LATENESS_US_BOUNDS: [u64; 10] = [0, 10, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000];

/// Triton's per-model series, by model id.
#[derive(Debug)]
struct ModelSeries {
    exec_count: PlainCounter,
    inference_count: PlainCounter,
    compute_input_us: PlainCounter,
    compute_infer_us: PlainCounter,
}

/// Copies of the worker's counters ([`WorkerStats`]).
#[derive(Debug)]
struct WorkerCounters {
    plans: Counter,
    batches_executed: Counter,
    tasks_ok: Counter,
    tasks_failed: Counter,
    reads_posted: Counter,
    reads_failed: Counter,
    late_starts: Counter,
    rerouted_to_scheduler: Counter,
    undeliverable: Counter,
    ignored_messages: Counter,
    plans_skipped: Counter,
    /// Plans not executed for their epoch, by [`crate::worker::FenceReason`]
    /// (`stale_epoch`, `superseded`).
    fenced: Vec<Counter>,
}

/// The backend daemon's counters.
#[derive(Debug)]
pub struct BackendMetrics {
    registry: Arc<MetricsRegistry>,
    worker: WorkerCounters,
    /// Heartbeats received from the scheduler.
    pub scheduler_heartbeats: Counter,
    /// Frontend data connections opened.
    pub frontends_connected: Counter,
    /// Frontend data connections that could not be opened.
    pub frontend_connect_failures: Counter,
    /// Scheduler Welcomes that did not prove the join token (the node's
    /// count, stored by [`store_forged_welcomes`](Self::store_forged_welcomes)).
    forged_welcomes: Counter,
    models: Vec<ModelSeries>,
    batch_size: Histogram,
    compute_us: Histogram,
    lateness_us: Histogram,
    gpu_busy_ns: Arc<[AtomicU64]>,
}

fn counter(r: &MetricsRegistry, name: &str, help: &str) -> Counter {
    let c = Counter::default();
    r.register(name, help, c.clone());
    c
}

impl BackendMetrics {
    /// Counters for a backend with `gpus` devices and the cluster's
    /// `model_names` (model id = index), registered in a registry of their
    /// own.
    pub fn new(backend_id: u32, gpus: u32, model_names: Vec<String>) -> Self {
        let r = Arc::new(MetricsRegistry::new());
        r.register("symphony_backend_id", "This backend's id", Computed::gauge_of(move || f64::from(backend_id)));
        r.register("symphony_backend_gpus", "GPUs of this backend", Computed::gauge_of(move || f64::from(gpus)));
        let worker = WorkerCounters {
            plans: counter(&r, "symphony_backend_plans", "Batch plans received"),
            batches_executed: counter(&r, "symphony_backend_batches_executed", "Batches the executor ran"),
            tasks_ok: counter(&r, "symphony_backend_tasks_ok", "Tasks answered with an output"),
            tasks_failed: counter(&r, "symphony_backend_tasks_failed", "Tasks answered with an error status"),
            reads_posted: counter(&r, "symphony_backend_reads_posted", "Input READs posted"),
            reads_failed: counter(&r, "symphony_backend_read_failures", "Input READs that failed or could not be posted"),
            late_starts: counter(&r, "symphony_backend_late_starts", "Batches that started more than 100 us after their planned time (symphony_backend_start_lateness_us has the distribution)"),
            rerouted_to_scheduler: counter(&r, "symphony_backend_rerouted", "Completions sent to the scheduler because the frontend was gone"),
            undeliverable: counter(&r, "symphony_backend_undeliverable", "Messages that could not be sent anywhere"),
            ignored_messages: counter(&r, "symphony_backend_ignored_messages", "Peer messages the backend does not handle"),
            plans_skipped: counter(
                &r,
                "symphony_backend_plans_skipped",
                "Plans skipped unexecuted: not started by the time the scheduler gives them up (a lagging backend catching up)",
            ),
            fenced: metrics::labelled(
                &r,
                "symphony_backend_plans_fenced",
                "Batch plans not executed because a newer scheduler epoch was seen, by reason",
                "reason",
                [FenceReason::StaleEpoch, FenceReason::Superseded].map(|f| f.as_str().to_string()),
                Counter::default,
            ),
        };
        let scheduler_heartbeats = counter(&r, "symphony_backend_scheduler_heartbeats", "Heartbeats received from the scheduler");
        let frontends_connected = counter(&r, "symphony_backend_frontend_connections", "Frontend data connections opened");
        let frontend_connect_failures = counter(&r, "symphony_backend_frontend_connect_failures", "Frontend data connections that failed");
        let forged_welcomes = counter(
            &r,
            "symphony_backend_forged_welcomes",
            "Welcomes refused because they did not prove the join token (unsigned, forged, another cluster's or replayed): something not a scheduler of this cluster answered on a scheduler address",
        );
        let labels: Vec<Vec<Label>> = model_names
            .iter()
            .map(|m| vec![("model", m.clone()), ("version", "1".to_string())])
            .collect();
        let per_model = |name: &str, help: &str| metrics::labelled_by(&r, name, help, labels.clone(), PlainCounter::default);
        let exec_count = per_model("nv_inference_exec_count", "Batches executed");
        let inference_count = per_model("nv_inference_count", "Inferences executed successfully");
        let compute_input_us = per_model(
            "nv_inference_compute_input_duration_us",
            "Cumulative time from batch plans' arrival to their hand-over to the device (input READs), us",
        );
        let compute_infer_us = per_model("nv_inference_compute_infer_duration_us", "Cumulative batch compute duration, us");
        let models = exec_count
            .into_iter()
            .zip(inference_count)
            .zip(compute_input_us)
            .zip(compute_infer_us)
            .map(|(((exec_count, inference_count), compute_input_us), compute_infer_us)| ModelSeries {
                exec_count,
                inference_count,
                compute_input_us,
                compute_infer_us,
            })
            .collect();
        let batch_size = Histogram::new(&BATCH_SIZE_BOUNDS);
        r.register("symphony_batch_size", "Tasks per batch plan executed here", batch_size.clone());
        let compute_us = Histogram::new(&COMPUTE_US_BOUNDS);
        r.register(
            "symphony_backend_compute_duration_us",
            "Batch compute duration (device start to finish), us",
            compute_us.clone(),
        );
        let lateness_us = Histogram::new(&LATENESS_US_BOUNDS);
        r.register(
            "symphony_backend_start_lateness_us",
            "How long after its planned start each batch started on its device, us (0: on time)",
            lateness_us.clone(),
        );
        let gpu_busy_ns: Arc<[AtomicU64]> = (0..gpus).map(|_| AtomicU64::new(0)).collect();
        let (busy, started) = (gpu_busy_ns.clone(), std::time::Instant::now());
        r.register(
            "nv_gpu_utilization",
            "GPU busy fraction since the backend started",
            Computed::gauge(move |s| {
                let elapsed = started.elapsed().as_nanos().max(1) as f64;
                for (g, b) in busy.iter().enumerate() {
                    s.labelled(&[("gpu", &g.to_string())], (b.load(Relaxed) as f64 / elapsed).min(1.0));
                }
            }),
        );
        BackendMetrics {
            registry: r,
            worker,
            scheduler_heartbeats,
            frontends_connected,
            frontend_connect_failures,
            forged_welcomes,
            models,
            batch_size,
            compute_us,
            lateness_us,
            gpu_busy_ns,
        }
    }

    /// The registry to serve (`MetricsEndpoint::start`).
    pub fn registry(&self) -> &Arc<MetricsRegistry> {
        &self.registry
    }

    /// Publishes the worker's counters (single writer: plain stores).
    pub fn store_stats(&self, s: &WorkerStats) {
        let w = &self.worker;
        for (c, v) in [
            (&w.plans, s.plans),
            (&w.batches_executed, s.batches_executed),
            (&w.tasks_ok, s.tasks_ok),
            (&w.tasks_failed, s.tasks_failed),
            (&w.reads_posted, s.reads_posted),
            (&w.reads_failed, s.reads_failed),
            (&w.late_starts, s.late_starts),
            (&w.rerouted_to_scheduler, s.rerouted_to_scheduler),
            (&w.undeliverable, s.undeliverable),
            (&w.ignored_messages, s.ignored_messages),
            (&w.plans_skipped, s.plans_skipped),
            (&w.fenced[0], s.stale_plans),
            (&w.fenced[1], s.superseded_batches),
        ] {
            c.inner().store(v, Relaxed);
        }
    }

    /// Publishes the node's count of forged Welcomes (single writer: a
    /// plain store).
    pub fn store_forged_welcomes(&self, n: u64) {
        self.forged_welcomes.inner().store(n, Relaxed);
    }

    /// Folds one finished batch into the counters and histograms.
    pub fn record_batch(&self, r: &BatchReport) {
        let size = u64::from(r.ok) + u64::from(r.failed);
        self.batch_size.observe(size);
        let (Some(start), Some(finish)) = (r.start, r.finish) else {
            return;
        };
        let ns = finish.saturating_since(start).as_nanos();
        let us = ns / 1_000;
        self.compute_us.observe(us);
        self.lateness_us.observe(start.saturating_since(r.exec_at).as_nanos() / 1_000);
        if let Some(m) = self.models.get(r.model as usize) {
            m.exec_count.inc();
            m.inference_count.inc_by(u64::from(r.ok));
            m.compute_infer_us.inc_by(us);
            if let Some(submitted) = r.submitted {
                m.compute_input_us.inc_by(submitted.saturating_since(r.received).as_nanos() / 1_000);
            }
        }
        if let Some(g) = self.gpu_busy_ns.get(r.gpu as usize) {
            g.fetch_add(ns, Relaxed);
        }
    }

    /// The OpenMetrics text of every family.
    pub fn encode(&self) -> String {
        self.registry.encode()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane::control::{metric, metric_sum};
    use dataplane::time::{Duration, Instant};

    #[test]
    fn batches_fold_into_histograms_and_render() {
        let m = BackendMetrics::new(7, 2, vec!["a".into(), "b".into()]);
        let t0 = Instant::from_nanos(1_000);
        for (size, model, gpu, dur_us, late_us) in [
            (1u32, 0u32, 0u32, 300u64, 0u64),
            (20, 1, 1, 4_000, 0),
            (600, 1, 1, 2_000_000, 300),
        ] {
            let start = t0 + Duration::from_micros(late_us);
            m.record_batch(&BatchReport {
                batch_id: 1,
                gpu,
                model,
                received: t0,
                exec_at: t0,
                submitted: Some(t0 + Duration::from_micros(5)),
                start: Some(start),
                finish: Some(start + Duration::from_micros(dur_us)),
                ok: size,
                failed: 0,
                read_max: Duration::ZERO,
                epoch: 0,
            });
        }
        m.store_stats(&WorkerStats {
            batches_executed: 3,
            reads_failed: 2,
            ..WorkerStats::default()
        });
        let text = m.encode();
        assert_eq!(
            metric(&text, "symphony_batch_size_bucket{le=\"1.0\"}"),
            Some(1.0)
        );
        assert_eq!(
            metric(&text, "symphony_batch_size_bucket{le=\"32.0\"}"),
            Some(2.0)
        );
        assert_eq!(
            metric(&text, "symphony_batch_size_bucket{le=\"+Inf\"}"),
            Some(3.0)
        );
        assert_eq!(metric(&text, "symphony_batch_size_sum"), Some(621.0));
        // Start lateness: two on time, one 300 us after its exec_at.
        let late = |le: &str| metric(&text, &format!("symphony_backend_start_lateness_us_bucket{{le=\"{le}\"}}"));
        assert_eq!((late("0.0"), late("250.0"), late("500.0")), (Some(2.0), Some(2.0), Some(3.0)));
        assert_eq!(metric(&text, "symphony_backend_start_lateness_us_sum"), Some(300.0));
        assert_eq!(
            metric(&text, "nv_inference_exec_count{model=\"b\",version=\"1\"}"),
            Some(2.0)
        );
        assert_eq!(metric_sum(&text, "nv_inference_count"), 621.0);
        assert_eq!(metric_sum(&text, "nv_inference_compute_input_duration_us"), 15.0);
        assert_eq!(
            metric(
                &text,
                "symphony_backend_compute_duration_us_bucket{le=\"500.0\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            metric(&text, "symphony_backend_read_failures_total"),
            Some(2.0)
        );
        assert_eq!(
            metric(&text, "symphony_backend_batches_executed_total"),
            Some(3.0)
        );
        assert_eq!(metric(&text, "symphony_backend_forged_welcomes_total"), Some(0.0));
        m.store_forged_welcomes(4);
        assert_eq!(metric(&m.encode(), "symphony_backend_forged_welcomes_total"), Some(4.0));
        let u1 = metric(&text, "nv_gpu_utilization{gpu=\"1\"}").unwrap();
        assert!(u1 > 0.0 && u1 <= 1.0);
    }
}
