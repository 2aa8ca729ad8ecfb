//! The scheduler daemon's metrics: handles into one
//! [`MetricsRegistry`] (`dataplane::metrics`), written by the poll thread
//! with relaxed atomic adds (no lock, no allocation) and encoded by the
//! `/metrics` thread.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dataplane::metrics::{self, Computed, Counter, Gauge, Histogram, MetricsRegistry};
use dataplane::wire::{DropReason, RefuseReason};

use crate::sim::AutoscaleAdvice;
use crate::zoo::ModelSpec;

/// Upper bounds of the batch-size histogram buckets.
pub const BATCH_BUCKETS: [u64; 10] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512];
/// Batch sizes counted one by one (`symphony_batches_of_size`); larger
/// ones count as the last.
pub const EXACT_BATCH_SIZES: std::ops::RangeInclusive<u32> = 1..=512;
/// Upper bounds (µs) of the dispatch-lag histogram buckets.
pub const LAG_BUCKETS_US: [u64; 8] = [10, 50, 100, 500, 1000, 5000, 10000, 50000];

/// Per-model counters.
#[derive(Debug)]
pub struct ModelCounters {
    /// Tasks dispatched in batches.
    pub dispatched: Counter,
    /// Batches dispatched.
    pub batches: Counter,
    /// Tasks dropped by the policy.
    pub dropped: Counter,
}

/// Everything `/metrics` shows.
#[derive(Debug)]
pub struct SchedulerMetrics {
    registry: Arc<MetricsRegistry>,
    /// Per model, by global id.
    pub models: Vec<ModelCounters>,
    /// Live frontends.
    pub frontends: Gauge,
    /// Live backends.
    pub backends: Gauge,
    /// GPUs in matchmaking.
    pub gpus_online: Gauge,
    /// Tasks received.
    pub tasks_received: Counter,
    /// Batches reported done.
    pub batches_done: Counter,
    /// Drops by reason, indexed by [`DropReason::index`].
    pub drops: Vec<Counter>,
    /// Tasks failed back because their backend died.
    pub failed_back: Counter,
    /// Completions forwarded from backends to frontends.
    pub forwarded: Counter,
    /// Outcomes for frontends that are gone.
    pub undeliverable: Counter,
    /// Messages that broke the protocol (wrong sender, unknown batch, ...).
    pub protocol_errors: Counter,
    /// Peers refused at registration, by reason, indexed by
    /// [`RefuseReason::index`].
    pub refused: Vec<Counter>,
    /// Backends declared dead.
    pub backend_deaths: Counter,
    /// Frontends declared dead.
    pub frontend_deaths: Counter,
    /// Planned GPU busy time, ns (sum of `l(b)` of dispatched batches).
    pub planned_busy_ns: Counter,
    /// Busy time the backends reported, ns.
    pub actual_busy_ns: Counter,
    /// Online GPU time, ns (integrated by the poll thread).
    pub gpu_online_ns: Counter,
    /// Dispatched batch sizes.
    pub batch_size: Histogram,
    /// Batches of each size (index = size; see [`EXACT_BATCH_SIZES`]).
    batches_of_size: Arc<[AtomicU64]>,
    /// Dispatch lag (decision time minus planned time), µs.
    pub lag: Histogram,
}

fn counter(r: &MetricsRegistry, name: &str, help: &str) -> Counter {
    let c = Counter::default();
    r.register(name, help, c.clone());
    c
}

fn gauge(r: &MetricsRegistry, name: &str, help: &str) -> Gauge {
    let g = Gauge::default();
    r.register(name, help, g.clone());
    g
}

/// Planned busy time over online GPU time, at most 1.
fn busy_fraction(planned: &Counter, online: &Counter) -> f64 {
    let online = online.get() as f64;
    if online <= 0.0 {
        return 0.0;
    }
    (planned.get() as f64 / online).min(1.0)
}

/// Policy drops over tasks received.
fn drop_rate(models: &[Counter], received: &Counter) -> f64 {
    let rx = received.get() as f64;
    if rx <= 0.0 {
        return 0.0;
    }
    models.iter().map(Counter::get).sum::<u64>() as f64 / rx
}

impl SchedulerMetrics {
    /// Counters for `models`, registered in a registry of their own.
    pub fn new(models: &[ModelSpec]) -> Self {
        let r = Arc::new(MetricsRegistry::new());
        let names = || models.iter().map(|m| m.name.clone());
        let new_counter = Counter::default as fn() -> Counter;
        let frontends = gauge(&r, "symphony_frontends", "Registered live frontends");
        let backends = gauge(&r, "symphony_backends", "Registered live backends");
        let gpus_online = gauge(&r, "symphony_gpus_online", "GPUs in matchmaking");
        let tasks_received = counter(&r, "symphony_tasks_received", "Tasks received from frontends");
        let batches_done = counter(&r, "symphony_batches_done", "Batches reported done by backends");
        let failed_back = counter(&r, "symphony_tasks_failed_back", "Tasks failed back because their backend died");
        let forwarded = counter(&r, "symphony_completions_forwarded", "Backend completions forwarded to frontends");
        let undeliverable = counter(&r, "symphony_undeliverable", "Outcomes for frontends that are gone");
        let protocol_errors = counter(&r, "symphony_protocol_errors", "Peer messages that broke the protocol");
        let backend_deaths = counter(&r, "symphony_backend_deaths", "Backends declared dead");
        let frontend_deaths = counter(&r, "symphony_frontend_deaths", "Frontends declared dead");
        let drops = metrics::labelled(
            &r,
            "symphony_tasks_dropped",
            "Tasks dropped by the scheduler, by reason",
            "reason",
            DropReason::ALL.map(|d| d.as_str().to_string()),
            new_counter,
        );
        let refused = metrics::labelled(
            &r,
            "symphony_peers_refused",
            "Peers refused at registration (nothing they sent reached the scheduler's state), by reason",
            "reason",
            RefuseReason::ALL.map(|d| d.as_str().to_string()),
            new_counter,
        );
        let dispatched = metrics::labelled(&r, "symphony_model_dispatched", "Tasks dispatched in batches, by model", "model", names(), new_counter);
        let batches = metrics::labelled(&r, "symphony_model_batches", "Batches dispatched, by model", "model", names(), new_counter);
        let dropped = metrics::labelled(&r, "symphony_model_dropped", "Tasks dropped by the policy, by model", "model", names(), new_counter);
        let batches_of_size: Arc<[AtomicU64]> = (0..=*EXACT_BATCH_SIZES.end()).map(|_| AtomicU64::new(0)).collect();
        let sizes = batches_of_size.clone();
        r.register(
            "symphony_batches_of_size",
            "Batches dispatched, by exact size (sizes with none omitted)",
            Computed::plain(move |s| {
                for (size, c) in sizes.iter().enumerate() {
                    let v = c.load(Ordering::Relaxed);
                    if v > 0 {
                        s.labelled(&[("size", &size.to_string())], v as f64);
                    }
                }
            }),
        );
        let batch_size = Histogram::new(&BATCH_BUCKETS);
        r.register("symphony_batch_size", "Dispatched batch sizes", batch_size.clone());
        let lag = Histogram::new(&LAG_BUCKETS_US);
        r.register("symphony_dispatch_lag_us", "Decision time minus planned time, microseconds", lag.clone());
        let planned_busy_ns = counter(&r, "symphony_planned_busy_ns", "Planned GPU busy time of dispatched batches, ns");
        let actual_busy_ns = counter(&r, "symphony_reported_busy_ns", "GPU busy time reported by backends, ns");
        let gpu_online_ns = counter(&r, "symphony_gpu_online_ns", "Online GPU time, ns");
        let (p, o) = (planned_busy_ns.clone(), gpu_online_ns.clone());
        r.register(
            "symphony_gpu_busy_fraction",
            "Planned busy time over online GPU time, since start",
            Computed::gauge_of(move || busy_fraction(&p, &o)),
        );
        let advice = {
            let (p, o, g, d, rx) = (planned_busy_ns.clone(), gpu_online_ns.clone(), gpus_online.clone(), dropped.clone(), tasks_received.clone());
            move || AutoscaleAdvice::new(g.get().max(0) as u32, drop_rate(&d, &rx), 1.0 - busy_fraction(&p, &o), 0.01)
        };
        let add = advice.clone();
        r.register(
            "symphony_autoscale_add_gpus",
            "GPUs to add: N*r/(1-r) when the drop rate r exceeds 1%",
            Computed::gauge_of(move || add().add_gpus),
        );
        r.register(
            "symphony_autoscale_remove_gpus",
            "GPUs that could go: N*idle fraction while the drop rate is at most 1%",
            Computed::gauge_of(move || advice().remove_gpus),
        );
        let models = dispatched
            .into_iter()
            .zip(batches)
            .zip(dropped)
            .map(|((dispatched, batches), dropped)| ModelCounters { dispatched, batches, dropped })
            .collect();
        SchedulerMetrics {
            registry: r,
            models,
            frontends,
            backends,
            gpus_online,
            tasks_received,
            batches_done,
            drops,
            failed_back,
            forwarded,
            undeliverable,
            protocol_errors,
            refused,
            backend_deaths,
            frontend_deaths,
            planned_busy_ns,
            actual_busy_ns,
            gpu_online_ns,
            batch_size,
            batches_of_size,
            lag,
        }
    }

    /// The registry to serve (`MetricsEndpoint::start`).
    pub fn registry(&self) -> &Arc<MetricsRegistry> {
        &self.registry
    }

    /// Counts a drop.
    pub fn count_drop(&self, r: DropReason) {
        self.drops[r.index()].inc();
    }

    /// Counts a peer refused at registration.
    pub fn count_refusal(&self, r: RefuseReason) {
        self.refused[r.index()].inc();
    }

    /// Counts a policy drop of `model`.
    pub fn model_drops(&self, model: u32) {
        if let Some(m) = self.models.get(model as usize) {
            m.dropped.inc();
        }
    }

    /// Records a dispatched batch.
    pub fn record_batch(&self, model: u32, size: u32, planned_ns: u64, lag_ns: u64) {
        if let Some(m) = self.models.get(model as usize) {
            m.dispatched.inc_by(u64::from(size));
            m.batches.inc();
        }
        self.batch_size.observe(u64::from(size));
        let exact = size.clamp(*EXACT_BATCH_SIZES.start(), *EXACT_BATCH_SIZES.end());
        if let Some(c) = self.batches_of_size.get(exact as usize) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        self.planned_busy_ns.inc_by(planned_ns);
        self.lag.observe(lag_ns / 1000);
    }

    /// GPU busy fraction so far (planned busy time over online GPU time).
    pub fn busy_fraction(&self) -> f64 {
        busy_fraction(&self.planned_busy_ns, &self.gpu_online_ns)
    }

    /// The OpenMetrics text of every family.
    pub fn encode(&self) -> String {
        self.registry.encode()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane::control::metric;

    #[test]
    fn render_shows_counters_histograms_and_advice() {
        let m = SchedulerMetrics::new(&[ModelSpec::linear("r50", 1.0, 5.0, 50.0).unwrap()]);
        m.tasks_received.inc_by(100);
        m.record_batch(0, 3, 8_000_000, 20_000);
        m.record_batch(0, 600, 1, 0);
        m.model_drops(0);
        m.count_drop(DropReason::DeadlineUnmeetable);
        m.gpus_online.set(4);
        m.gpu_online_ns.inc_by(80_000_000);
        let t = m.encode();
        assert_eq!(metric(&t, "symphony_batch_size_bucket{le=\"2.0\"}"), Some(0.0));
        assert_eq!(metric(&t, "symphony_batch_size_bucket{le=\"4.0\"}"), Some(1.0));
        assert_eq!(metric(&t, "symphony_batch_size_bucket{le=\"+Inf\"}"), Some(2.0));
        assert_eq!(metric(&t, "symphony_batch_size_sum"), Some(603.0));
        assert_eq!(metric(&t, "symphony_batches_of_size{size=\"3\"}"), Some(1.0));
        assert_eq!(metric(&t, "symphony_batches_of_size{size=\"512\"}"), Some(1.0));
        assert_eq!(metric(&t, "symphony_model_dispatched_total{model=\"r50\"}"), Some(603.0));
        assert_eq!(metric(&t, "symphony_tasks_dropped_total{reason=\"deadline_unmeetable\"}"), Some(1.0));
        assert_eq!(metric(&t, "symphony_tasks_dropped_total{reason=\"frontend_lost\"}"), Some(0.0));
        m.count_refusal(RefuseReason::BadToken);
        m.count_refusal(RefuseReason::BadToken);
        let t = m.encode();
        assert_eq!(metric(&t, "symphony_peers_refused_total{reason=\"bad_token\"}"), Some(2.0));
        assert_eq!(metric(&t, "symphony_peers_refused_total{reason=\"version\"}"), Some(0.0));
        assert_eq!(metric(&t, "symphony_gpu_busy_fraction"), Some(0.1000000125));
        // 1% drop rate is at the threshold: no GPUs to add, 90% of 4 idle.
        assert_eq!(metric(&t, "symphony_autoscale_add_gpus"), Some(0.0));
        assert!((metric(&t, "symphony_autoscale_remove_gpus").unwrap() - 3.6).abs() < 1e-6);
    }
}
