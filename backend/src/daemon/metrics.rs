//! The backend's Prometheus counters.
//!
//! The poll thread is the only writer: it stores the worker's counters and
//! folds each finished batch into histograms with relaxed atomics (no lock,
//! no allocation); the metrics HTTP thread only reads them when it renders
//! a scrape.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::worker::{BatchReport, WorkerStats};

/// Upper bounds of the batch-size buckets (`+Inf` follows).
const BATCH_SIZE_BOUNDS: [u64; 10] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512];
/// Upper bounds of the compute-duration buckets, microseconds.
const COMPUTE_US_BOUNDS: [u64; 12] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000,
];

/// Counters shared by the poll thread (writer) and the scrape renderer.
#[derive(Debug)]
pub struct BackendMetrics {
    start: std::time::Instant,
    backend_id: u32,
    model_names: Vec<String>,
    // Copies of the worker's counters.
    plans: AtomicU64,
    batches_executed: AtomicU64,
    tasks_ok: AtomicU64,
    tasks_failed: AtomicU64,
    reads_posted: AtomicU64,
    reads_failed: AtomicU64,
    rerouted_to_scheduler: AtomicU64,
    undeliverable: AtomicU64,
    late_starts: AtomicU64,
    ignored_messages: AtomicU64,
    // Daemon events.
    /// Heartbeats received from the scheduler.
    pub scheduler_heartbeats: AtomicU64,
    /// Frontend data connections opened.
    pub frontends_connected: AtomicU64,
    /// Frontend data connections that could not be opened.
    pub frontend_connect_failures: AtomicU64,
    // Per model.
    exec_count: Vec<AtomicU64>,
    inference_count: Vec<AtomicU64>,
    compute_us: Vec<AtomicU64>,
    // Histograms over batches.
    batch_size_buckets: [AtomicU64; BATCH_SIZE_BOUNDS.len() + 1],
    batch_size_sum: AtomicU64,
    compute_buckets: [AtomicU64; COMPUTE_US_BOUNDS.len() + 1],
    compute_sum_us: AtomicU64,
    batches_reported: AtomicU64,
    // Per GPU.
    gpu_busy_ns: Vec<AtomicU64>,
}

fn zeros(n: usize) -> Vec<AtomicU64> {
    (0..n).map(|_| AtomicU64::new(0)).collect()
}

fn bucket(bounds: &[u64], v: u64) -> usize {
    bounds.iter().position(|&b| v <= b).unwrap_or(bounds.len())
}

impl BackendMetrics {
    /// Counters for a backend with `gpus` devices and the cluster's
    /// `model_names` (model id = index).
    pub fn new(backend_id: u32, gpus: u32, model_names: Vec<String>) -> Self {
        let m = model_names.len();
        BackendMetrics {
            start: std::time::Instant::now(),
            backend_id,
            model_names,
            plans: AtomicU64::new(0),
            batches_executed: AtomicU64::new(0),
            tasks_ok: AtomicU64::new(0),
            tasks_failed: AtomicU64::new(0),
            reads_posted: AtomicU64::new(0),
            reads_failed: AtomicU64::new(0),
            rerouted_to_scheduler: AtomicU64::new(0),
            undeliverable: AtomicU64::new(0),
            late_starts: AtomicU64::new(0),
            ignored_messages: AtomicU64::new(0),
            scheduler_heartbeats: AtomicU64::new(0),
            frontends_connected: AtomicU64::new(0),
            frontend_connect_failures: AtomicU64::new(0),
            exec_count: zeros(m),
            inference_count: zeros(m),
            compute_us: zeros(m),
            batch_size_buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            batch_size_sum: AtomicU64::new(0),
            compute_buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            compute_sum_us: AtomicU64::new(0),
            batches_reported: AtomicU64::new(0),
            gpu_busy_ns: zeros(gpus as usize),
        }
    }

    /// Publishes the worker's counters (single writer: plain stores).
    pub fn store_stats(&self, s: &WorkerStats) {
        self.plans.store(s.plans, Relaxed);
        self.batches_executed.store(s.batches_executed, Relaxed);
        self.tasks_ok.store(s.tasks_ok, Relaxed);
        self.tasks_failed.store(s.tasks_failed, Relaxed);
        self.reads_posted.store(s.reads_posted, Relaxed);
        self.reads_failed.store(s.reads_failed, Relaxed);
        self.rerouted_to_scheduler
            .store(s.rerouted_to_scheduler, Relaxed);
        self.undeliverable.store(s.undeliverable, Relaxed);
        self.late_starts.store(s.late_starts, Relaxed);
        self.ignored_messages.store(s.ignored_messages, Relaxed);
    }

    /// Folds one finished batch into the histograms.
    pub fn record_batch(&self, r: &BatchReport) {
        let size = u64::from(r.ok) + u64::from(r.failed);
        self.batch_size_buckets[bucket(&BATCH_SIZE_BOUNDS, size)].fetch_add(1, Relaxed);
        self.batch_size_sum.fetch_add(size, Relaxed);
        self.batches_reported.fetch_add(1, Relaxed);
        let (Some(start), Some(finish)) = (r.start, r.finish) else {
            return;
        };
        let ns = finish.saturating_since(start).as_nanos();
        let us = ns / 1_000;
        self.compute_buckets[bucket(&COMPUTE_US_BOUNDS, us)].fetch_add(1, Relaxed);
        self.compute_sum_us.fetch_add(us, Relaxed);
        if let Some(c) = self.exec_count.get(r.model as usize) {
            c.fetch_add(1, Relaxed);
            self.inference_count[r.model as usize].fetch_add(u64::from(r.ok), Relaxed);
            self.compute_us[r.model as usize].fetch_add(us, Relaxed);
        }
        if let Some(g) = self.gpu_busy_ns.get(r.gpu as usize) {
            g.fetch_add(ns, Relaxed);
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut o = String::with_capacity(4096);
        let counter = |o: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        };
        let l = |a: &AtomicU64| a.load(Relaxed);
        let _ = writeln!(
            o,
            "# HELP symphony_backend_id This backend's id\n# TYPE symphony_backend_id gauge\nsymphony_backend_id {}",
            self.backend_id
        );
        let _ = writeln!(
            o,
            "# HELP symphony_backend_gpus GPUs of this backend\n# TYPE symphony_backend_gpus gauge\nsymphony_backend_gpus {}",
            self.gpu_busy_ns.len()
        );
        counter(
            &mut o,
            "symphony_backend_plans_total",
            "Batch plans received",
            l(&self.plans),
        );
        counter(
            &mut o,
            "symphony_backend_batches_executed_total",
            "Batches the executor ran",
            l(&self.batches_executed),
        );
        counter(
            &mut o,
            "symphony_backend_tasks_ok_total",
            "Tasks answered with an output",
            l(&self.tasks_ok),
        );
        counter(
            &mut o,
            "symphony_backend_tasks_failed_total",
            "Tasks answered with an error status",
            l(&self.tasks_failed),
        );
        counter(
            &mut o,
            "symphony_backend_reads_posted_total",
            "Input READs posted",
            l(&self.reads_posted),
        );
        counter(
            &mut o,
            "symphony_backend_read_failures_total",
            "Input READs that failed or could not be posted",
            l(&self.reads_failed),
        );
        counter(
            &mut o,
            "symphony_backend_late_starts_total",
            "Batches that started after their planned time",
            l(&self.late_starts),
        );
        counter(
            &mut o,
            "symphony_backend_rerouted_total",
            "Completions sent to the scheduler because the frontend was gone",
            l(&self.rerouted_to_scheduler),
        );
        counter(
            &mut o,
            "symphony_backend_undeliverable_total",
            "Messages that could not be sent anywhere",
            l(&self.undeliverable),
        );
        counter(
            &mut o,
            "symphony_backend_ignored_messages_total",
            "Peer messages the backend does not handle",
            l(&self.ignored_messages),
        );
        counter(
            &mut o,
            "symphony_backend_scheduler_heartbeats_total",
            "Heartbeats received from the scheduler",
            l(&self.scheduler_heartbeats),
        );
        counter(
            &mut o,
            "symphony_backend_frontend_connections_total",
            "Frontend data connections opened",
            l(&self.frontends_connected),
        );
        counter(
            &mut o,
            "symphony_backend_frontend_connect_failures_total",
            "Frontend data connections that failed",
            l(&self.frontend_connect_failures),
        );

        for (name, help, per_model) in [
            (
                "nv_inference_exec_count",
                "Batches executed",
                &self.exec_count,
            ),
            (
                "nv_inference_count",
                "Inferences executed successfully",
                &self.inference_count,
            ),
            (
                "nv_inference_compute_infer_duration_us",
                "Cumulative batch compute duration, us",
                &self.compute_us,
            ),
        ] {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter");
            for (m, v) in per_model.iter().enumerate() {
                let _ = writeln!(
                    o,
                    "{name}{{model=\"{}\",version=\"1\"}} {}",
                    self.model_names[m],
                    l(v)
                );
            }
        }

        let histogram = |o: &mut String,
                         name: &str,
                         help: &str,
                         bounds: &[u64],
                         buckets: &[AtomicU64],
                         sum: u64| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} histogram");
            let mut cum = 0;
            for (k, b) in buckets.iter().enumerate() {
                cum += l(b);
                match bounds.get(k) {
                    Some(le) => {
                        let _ = writeln!(o, "{name}_bucket{{le=\"{le}\"}} {cum}");
                    }
                    None => {
                        let _ = writeln!(o, "{name}_bucket{{le=\"+Inf\"}} {cum}");
                    }
                }
            }
            let _ = writeln!(o, "{name}_sum {sum}\n{name}_count {cum}");
        };
        histogram(
            &mut o,
            "symphony_batch_size",
            "Tasks per batch plan executed here",
            &BATCH_SIZE_BOUNDS,
            &self.batch_size_buckets,
            l(&self.batch_size_sum),
        );
        histogram(
            &mut o,
            "symphony_backend_compute_duration_us",
            "Batch compute duration (device start to finish), us",
            &COMPUTE_US_BOUNDS,
            &self.compute_buckets,
            l(&self.compute_sum_us),
        );

        let elapsed = self.start.elapsed().as_nanos().max(1) as f64;
        let _ = writeln!(
            o,
            "# HELP nv_gpu_utilization GPU busy fraction since the backend started\n# TYPE nv_gpu_utilization gauge"
        );
        for (g, busy) in self.gpu_busy_ns.iter().enumerate() {
            let frac = (l(busy) as f64 / elapsed).min(1.0);
            let _ = writeln!(o, "nv_gpu_utilization{{gpu=\"{g}\"}} {frac:.6}");
        }
        o
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
        for (size, model, gpu, dur_us) in [
            (1u32, 0u32, 0u32, 300u64),
            (20, 1, 1, 4_000),
            (600, 1, 1, 2_000_000),
        ] {
            m.record_batch(&BatchReport {
                batch_id: 1,
                gpu,
                model,
                received: t0,
                exec_at: t0,
                start: Some(t0),
                finish: Some(t0 + Duration::from_micros(dur_us)),
                ok: size,
                failed: 0,
                read_max: Duration::ZERO,
            });
        }
        m.store_stats(&WorkerStats {
            batches_executed: 3,
            reads_failed: 2,
            ..WorkerStats::default()
        });
        let text = m.render();
        assert_eq!(
            metric(&text, "symphony_batch_size_bucket{le=\"1\"}"),
            Some(1.0)
        );
        assert_eq!(
            metric(&text, "symphony_batch_size_bucket{le=\"32\"}"),
            Some(2.0)
        );
        assert_eq!(
            metric(&text, "symphony_batch_size_bucket{le=\"+Inf\"}"),
            Some(3.0)
        );
        assert_eq!(metric(&text, "symphony_batch_size_sum"), Some(621.0));
        assert_eq!(
            metric(&text, "nv_inference_exec_count{model=\"b\",version=\"1\"}"),
            Some(2.0)
        );
        assert_eq!(metric_sum(&text, "nv_inference_count"), 621.0);
        assert_eq!(
            metric(
                &text,
                "symphony_backend_compute_duration_us_bucket{le=\"500\"}"
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
        let u1 = metric(&text, "nv_gpu_utilization{gpu=\"1\"}").unwrap();
        assert!(u1 > 0.0 && u1 <= 1.0);
    }
}
