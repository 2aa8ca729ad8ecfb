//! The scheduler daemon's metrics: handles into one
//! [`MetricsRegistry`] (`node_shell::metrics`), written by the poll thread
//! with relaxed atomic adds (no lock, no allocation) and encoded by the
//! `/metrics` thread.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use node_shell::metrics::{self, Computed, Counter, Gauge, Histogram, MetricsRegistry};
use dataplane::wire::{DropReason, RefuseReason};

use crate::autoscale::{AutoscaleConfig, Counters, IntervalTarget};
use crate::sim::AutoscaleAdvice;
use crate::zoo::ModelSpec;

/// Upper bounds of the batch-size histogram buckets.
pub const BATCH_BUCKETS: [u64; 10] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512];
/// Batch sizes counted one by one (`symphony_batches_of_size`); larger
/// ones count as the last.
pub const EXACT_BATCH_SIZES: std::ops::RangeInclusive<u32> = 1..=512;
/// Upper bounds (µs) of the dispatch-lag histogram buckets.
pub const LAG_BUCKETS_US: [u64; 8] = [10, 50, 100, 500, 1000, 5000, 10000, 50000];
/// Priority levels counted apart in the `level` label (`1` is the highest);
/// a task of a lower level counts as the last.
pub const LEVEL_LABELS: usize = 4;

/// The `level` label index (0 = level 1) of a task at queue index
/// `level_index` ([`crate::types::Admission::level_index`]).
#[inline]
pub const fn level_label(level_index: usize) -> usize {
    if level_index < LEVEL_LABELS {
        level_index
    } else {
        LEVEL_LABELS - 1
    }
}

/// Why a registered peer's message was refused (counted, then ignored).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessageRefusal {
    /// A `BatchDone` for a batch not in flight (never planned, already
    /// reported, or given up).
    UnknownBatch,
    /// A `BatchDone` from a backend the batch was not planned on.
    WrongBackend,
    /// A `BatchDone` naming another GPU than the batch was planned on
    /// (the batch is done, but nothing is learned from the report).
    WrongGpu,
    /// A `Task` whose id (or frontend field) names another frontend than
    /// the one that sent it.
    FrontendMismatch,
}

impl MessageRefusal {
    /// Every reason, in counter order.
    pub const ALL: [MessageRefusal; 4] =
        [MessageRefusal::UnknownBatch, MessageRefusal::WrongBackend, MessageRefusal::WrongGpu, MessageRefusal::FrontendMismatch];
    /// Number of reasons.
    pub const COUNT: usize = Self::ALL.len();

    /// Its counter index.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Metric label.
    pub const fn as_str(self) -> &'static str {
        match self {
            MessageRefusal::UnknownBatch => "unknown_batch",
            MessageRefusal::WrongBackend => "wrong_backend",
            MessageRefusal::WrongGpu => "wrong_gpu",
            MessageRefusal::FrontendMismatch => "frontend_mismatch",
        }
    }
}

/// One closed-loop estimate, as last published (see
/// [`SchedulerMetrics::loop_estimates`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoopEstimate {
    /// The backend owning the GPU.
    pub backend: u32,
    /// The GPU's index at its backend.
    pub gpu: u32,
    /// The model (global id); `None`: the GPU's ratio pooled over models.
    pub model: Option<u32>,
    /// Measured over profiled time.
    pub ratio: f64,
    /// Reports behind it.
    pub samples: u64,
    /// Refined `(α, β)`, ms (model rows only, when known).
    pub alpha_beta_ms: Option<(f64, f64)>,
}

/// The closed loop's and the delay watch's state as `/metrics` shows it.
/// Written by the poll thread (relaxed stores and adds; the two locks once
/// per publication, never per message), read when scraped.
#[derive(Debug, Default)]
pub struct LoopMetrics {
    /// Messages refused, by [`MessageRefusal::index`].
    pub refused_messages: [AtomicU64; MessageRefusal::COUNT],
    /// Closed loop acting on reports (1) or open loop (0).
    pub closed_loop_enabled: AtomicU64,
    /// GPU free times the closed loop moved later (batches ran late).
    pub free_corrections_later: AtomicU64,
    /// GPU free times the closed loop moved earlier.
    pub free_corrections_earlier: AtomicU64,
    /// The closed loop's estimates, republished by the poll thread every
    /// [`super::plane::PUBLISH_EVERY`].
    pub loop_estimates: Mutex<Vec<LoopEstimate>>,
    /// The transport the READ tail is measured on (metric label).
    pub read_transport: Mutex<String>,
    /// The READ tail per input at the watched percentile, ns, of the last
    /// full window (0 before one).
    pub read_tail_ns: AtomicU64,
    /// The per-input READ bound in force (`d_data`), ns.
    pub read_bound_ns: AtomicU64,
    /// The watched percentile, times 1000.
    pub read_percentile_milli: AtomicU64,
    /// Batches with READs the watch folded in.
    pub read_batches: AtomicU64,
    /// 1 while the observed READ tail exceeds the bound.
    pub delay_bound_exceeded: AtomicU64,
    /// Times the delay-bound alarm was raised.
    pub delay_bound_alarms: AtomicU64,
    /// Times an observed bound was adopted.
    pub delay_bound_adopted: AtomicU64,
}

impl LoopMetrics {
    /// Registers the families that show `this` in `r`.
    fn register(this: &Arc<LoopMetrics>, r: &MetricsRegistry, names: Arc<[String]>) {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        let m = this.clone();
        r.register(
            "symphony_messages_refused",
            "Peer messages refused and ignored, by reason",
            Computed::counter(move |s| {
                for r in MessageRefusal::ALL {
                    s.labelled(&[("reason", r.as_str())], l(&m.refused_messages[r.index()]));
                }
            }),
        );
        let m = this.clone();
        r.register(
            "symphony_closed_loop_enabled",
            "Whether batch reports correct GPU free times and profiles (1) or only are measured (0)",
            Computed::gauge_of(move || l(&m.closed_loop_enabled)),
        );
        let m = this.clone();
        r.register(
            "symphony_gpu_free_corrections",
            "GPU free times the closed loop moved, by direction",
            Computed::counter(move |s| {
                s.labelled(&[("direction", "later")], l(&m.free_corrections_later));
                s.labelled(&[("direction", "earlier")], l(&m.free_corrections_earlier));
            }),
        );
        Self::register_estimates(this, r, names);
        Self::register_read_watch(this, r);
    }

    /// The closed loop's per-GPU and per-(GPU, model) estimates.
    fn register_estimates(this: &Arc<LoopMetrics>, r: &MetricsRegistry, names: Arc<[String]>) {
        let rows = |m: &LoopMetrics| m.loop_estimates.lock().map(|r| r.clone()).unwrap_or_default();
        let m = this.clone();
        r.register(
            "symphony_gpu_speed_ratio",
            "Measured over profiled batch time on a GPU, pooled over its models (1 = as profiled)",
            Computed::gauge(move |s| {
                for e in rows(&m).iter().filter(|e| e.model.is_none()) {
                    s.labelled(&[("backend", &e.backend.to_string()), ("gpu", &e.gpu.to_string())], e.ratio);
                }
            }),
        );
        type Pick = fn(&LoopEstimate) -> Option<f64>;
        let families: [(&str, &str, Pick); 4] = [
            ("symphony_profile_ratio", "Measured over profiled batch time, by GPU and model (the profile error)", |e| Some(e.ratio)),
            ("symphony_profile_reports", "Batch reports behind symphony_profile_ratio", |e| Some(e.samples as f64)),
            ("symphony_profile_alpha_ms", "Refined per-item batch cost alpha, ms, by GPU and model", |e| e.alpha_beta_ms.map(|(a, _)| a)),
            ("symphony_profile_beta_ms", "Refined fixed batch cost beta, ms, by GPU and model", |e| e.alpha_beta_ms.map(|(_, b)| b)),
        ];
        for (name, help, pick) in families {
            let (m, names) = (this.clone(), names.clone());
            r.register(
                name,
                help,
                Computed::gauge(move |s| {
                    for e in rows(&m) {
                        let Some(model) = e.model.and_then(|i| names.get(i as usize)) else { continue };
                        if let Some(v) = pick(&e) {
                            let (b, g) = (e.backend.to_string(), e.gpu.to_string());
                            s.labelled(&[("backend", &b), ("gpu", &g), ("model", model)], v);
                        }
                    }
                }),
            );
        }
    }

    /// The READ tail against the delay bound.
    fn register_read_watch(this: &Arc<LoopMetrics>, r: &MetricsRegistry) {
        let transport = |m: &LoopMetrics| m.read_transport.lock().map(|t| t.clone()).unwrap_or_default();
        let m = this.clone();
        r.register(
            "symphony_read_tail_per_input_ns",
            "Slowest input READ per input of a batch at a high percentile over the last window, ns",
            Computed::gauge(move |s| {
                let q = (m.read_percentile_milli.load(Ordering::Relaxed) as f64 / 100_000.0).to_string();
                s.labelled(&[("transport", &transport(&m)), ("quantile", &q)], l(&m.read_tail_ns));
            }),
        );
        type Field = fn(&LoopMetrics) -> &AtomicU64;
        let gauges: [(&str, &str, Field); 2] = [
            ("symphony_read_bound_per_input_ns", "The per-input READ bound charged (d_data), ns", |m| &m.read_bound_ns),
            ("symphony_delay_bound_exceeded", "1 while the observed READ tail exceeds the bound", |m| &m.delay_bound_exceeded),
        ];
        for (name, help, field) in gauges {
            let m = this.clone();
            r.register(name, help, Computed::gauge(move |s| s.labelled(&[("transport", &transport(&m))], l(field(&m)))));
        }
        let counters: [(&str, &str, Field); 3] = [
            ("symphony_read_batches", "Batches whose READ latency was folded into the tail", |m| &m.read_batches),
            ("symphony_delay_bound_alarms", "Times the observed READ tail rose above the bound", |m| &m.delay_bound_alarms),
            ("symphony_delay_bound_adopted", "Times the observed READ tail was adopted as the bound", |m| &m.delay_bound_adopted),
        ];
        for (name, help, field) in counters {
            let m = this.clone();
            r.register(name, help, Computed::counter(move |s| s.labelled(&[("transport", &transport(&m))], l(field(&m)))));
        }
    }
}

fn l(a: &AtomicU64) -> f64 {
    a.load(Ordering::Relaxed) as f64
}

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
    /// Reports of batches given up before they came (learned from; their
    /// tasks stay failed back).
    pub late_batch_reports: Counter,
    /// Drops by reason, indexed by [`DropReason::index`].
    pub drops: Vec<Counter>,
    /// Policy drops by priority level and reason, indexed by
    /// `level_label * DropReason::COUNT + reason index`.
    drops_by_level: Vec<Counter>,
    /// Tasks dispatched in batches, by priority level ([`level_label`]).
    dispatched_by_level: Vec<Counter>,
    /// Tasks failed back because their backend died.
    pub failed_back: Counter,
    /// Completions forwarded from backends to frontends.
    pub forwarded: Counter,
    /// Outcomes for frontends that are gone.
    pub undeliverable: Counter,
    /// The routing-table revision applied (issue 19; 0: none).
    pub route_revision: Gauge,
    /// Plans of a model moved away, held back instead of sent.
    pub unowned_plans_held: Counter,
    /// Messages that broke the protocol (wrong sender, unknown batch, ...).
    pub protocol_errors: Counter,
    /// Peers refused at registration, by reason, indexed by
    /// [`RefuseReason::index`].
    pub refused: Vec<Counter>,
    /// Backends declared dead.
    pub backend_deaths: Counter,
    /// Backends that left after their drain was released (not deaths).
    pub backends_drained: Counter,
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
    /// The closed loop and the delay watch.
    pub closed_loop: Arc<LoopMetrics>,
    /// The poll loop's turns (what each costs is spread over the tasks it
    /// finds: per task it is this over `tasks_received`).
    pub poll_passes: Counter,
    /// Idle turns that slept in the wait set (each two context switches
    /// and a wake-up: by a peer's bytes or doorbell, a notify, or a timer).
    pub poll_sleeps: Counter,
    /// Idle turns that spun instead, the next timer being nearer than a
    /// sleep's wake-up (`dataplane::waitset::SLEEP_ABOVE`).
    pub poll_timer_spins: Counter,
    /// Benchmark only: frontend send -> task queued, from peers' clock
    /// stamps (empty unless `--bench-stamps`).
    pub bench_ingress_lag: super::bench_stamps::LagBuckets,
    /// Benchmark only: a plan's planned dispatch moment -> the plan
    /// encoded for its backend (the first part of the dispatch lag).
    pub bench_decision_lag: super::bench_stamps::LagBuckets,
    /// Benchmark only: planned dispatch moment -> the plan handed to its
    /// backend's link (the rest, to the backend's receipt, is transit and
    /// the backend's wake-up).
    pub bench_send_lag: super::bench_stamps::LagBuckets,
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

/// Batches dispatched by exact size, registered as one computed family
/// (sizes with none omitted).
fn batches_of_size(r: &MetricsRegistry) -> Arc<[AtomicU64]> {
    let counts: Arc<[AtomicU64]> = (0..=*EXACT_BATCH_SIZES.end()).map(|_| AtomicU64::new(0)).collect();
    let sizes = counts.clone();
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
    counts
}

/// The GPU busy fraction and the autoscaling advice, computed at each
/// scrape from the counters they read.
fn register_utilisation(r: &MetricsRegistry, planned: &Counter, online: &Counter, gpus_online: &Gauge, dropped: &[Counter], received: &Counter) {
    let (p, o) = (planned.clone(), online.clone());
    r.register(
        "symphony_gpu_busy_fraction",
        "Planned busy time over online GPU time, since start",
        Computed::gauge_of(move || busy_fraction(&p, &o)),
    );
    let advice = {
        let (p, o, g, d, rx) = (planned.clone(), online.clone(), gpus_online.clone(), dropped.to_vec(), received.clone());
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
}

/// The handles an autoscaler's signals are read from.
struct SignalHandles<'a> {
    planned: &'a Counter,
    online: &'a Counter,
    received: &'a Counter,
    gpus_online: &'a Gauge,
    backends: &'a Gauge,
    /// Drops by reason (every reason).
    drops: &'a [Counter],
    model_dispatched: &'a [Counter],
    /// Policy drops by model.
    model_dropped: &'a [Counter],
}

/// The utilisation and advice gauges (since start) and the autoscaler's
/// target for the latest interval.
fn register_signals(r: &MetricsRegistry, models: &[ModelSpec], h: &SignalHandles<'_>) {
    register_utilisation(r, h.planned, h.online, h.gpus_online, h.model_dropped, h.received);
    let (rx, drops, busy, online, d, p) = (h.received.clone(), h.drops.to_vec(), h.planned.clone(), h.online.clone(), h.model_dispatched.to_vec(), h.model_dropped.to_vec());
    let counters = move || Counters {
        received: rx.get(),
        dropped: drops.iter().map(Counter::get).sum(),
        planned_busy_ns: busy.get(),
        gpu_online_ns: online.get(),
        per_model: d.iter().zip(&p).map(|(a, b)| a.get() + b.get()).collect(),
    };
    register_autoscale_target(r, models, counters, h.gpus_online, h.backends);
}

/// The shortest interval the autoscale target gauges are measured over:
/// 2 s, so a controller scraping every second (`up --autoscale`) sees a
/// change of load within about 2 s, while an interval still holds enough
/// arrivals per model for a steady rate; a scraper slower than that
/// (Prometheus for an HPA) closes one interval per scrape.
pub const TARGET_INTERVAL: dataplane::time::Duration = dataplane::time::Duration::from_millis(2_000);

/// One of (desired GPUs, desired backends, demand GPUs).
type PickTarget = fn((f64, f64, f64)) -> f64;

/// The autoscaler's target for the latest interval (issue 52), for an
/// HPA or KEDA external metric: `symphony_autoscale_desired_gpus` and
/// `_desired_backends` (at the GPUs per backend now registered) and the
/// interval's `symphony_autoscale_demand_gpus`, the live controller's
/// target signal, from [`crate::autoscale::IntervalTarget`] over intervals
/// of at least [`TARGET_INTERVAL`] closed at a scrape. Before the first
/// interval closed the desired ones read the GPUs in matchmaking (no
/// change) and the demand NaN (not measured: a reader must not take it
/// for no load).
fn register_autoscale_target(r: &MetricsRegistry, models: &[ModelSpec], counters: impl Fn() -> Counters + Send + Sync + 'static, gpus_online: &Gauge, backends: &Gauge) {
    let target = Arc::new(Mutex::new((
        dataplane::time::MonotonicClock::new(),
        IntervalTarget::new(AutoscaleConfig { max_gpus: u32::MAX, ..AutoscaleConfig::default() }, models.to_vec(), TARGET_INTERVAL),
    )));
    let (g, b) = (gpus_online.clone(), backends.clone());
    // (desired GPUs, desired backends, demand GPUs) now.
    let read = Arc::new(move || {
        let serving = g.get().max(0) as u32;
        let reading = target.lock().ok().and_then(|mut t| {
            let now = t.0.now();
            t.1.observe(now, counters(), serving)
        });
        let desired = reading.map_or(serving, |r| r.desired_gpus);
        let per_backend = if b.get() > 0 { (f64::from(serving) / b.get() as f64).max(1.0) } else { 1.0 };
        (f64::from(desired), (f64::from(desired) / per_backend).ceil(), reading.map_or(f64::NAN, |r| r.demand_gpus))
    });
    let families: [(&str, &str, PickTarget); 3] = [
        ("symphony_autoscale_desired_gpus", "GPUs the autoscaler's rule wants after the latest interval (>= 2 s; demand, bad rate)", |t| t.0),
        ("symphony_autoscale_desired_backends", "Backends for symphony_autoscale_desired_gpus at the GPUs per backend now registered", |t| t.1),
        ("symphony_autoscale_demand_gpus", "GPUs the latest interval's arrivals need at the largest batches their SLOs allow (NaN before the first interval)", |t| t.2),
    ];
    for (name, help, pick) in families {
        let read = read.clone();
        r.register(name, help, Computed::gauge_of(move || pick(read())));
    }
}

/// A benchmark lag histogram, registered.
fn lag_buckets(r: &MetricsRegistry, name: &str, help: &str) -> super::bench_stamps::LagBuckets {
    let lag = super::bench_stamps::LagBuckets::default();
    r.register(name, help, lag.histogram().clone());
    lag
}

/// The benchmark-only lag histograms: ingress, decision and send.
fn bench_lags(r: &MetricsRegistry) -> [super::bench_stamps::LagBuckets; 3] {
    [
        lag_buckets(r, "symphony_bench_ingress_lag_us", "Benchmark only: frontend send to task queued (host clock stamps), microseconds"),
        lag_buckets(r, "symphony_bench_decision_lag_us", "Benchmark only: planned dispatch moment to the plan encoded (host clock), microseconds"),
        lag_buckets(r, "symphony_bench_send_lag_us", "Benchmark only: planned dispatch moment to the plan handed to its link (host clock), microseconds"),
    ]
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
        let late_batch_reports = counter(&r, "symphony_late_batch_reports", "Batch reports taken after the batch was given up (learned from)");
        let failed_back = counter(&r, "symphony_tasks_failed_back", "Tasks failed back because their backend died");
        let forwarded = counter(&r, "symphony_completions_forwarded", "Backend completions forwarded to frontends");
        let undeliverable = counter(&r, "symphony_undeliverable", "Outcomes for frontends that are gone");
        let route_revision = gauge(&r, "symphony_route_revision", "Routing-table revision applied (0: no table, every model owned)");
        let unowned_plans_held = counter(&r, "symphony_unowned_plans_held", "Plans of a model that moved to another group, held back (their tasks answered moved)");
        let protocol_errors = counter(&r, "symphony_protocol_errors", "Peer messages that broke the protocol");
        let backend_deaths = counter(&r, "symphony_backend_deaths", "Backends declared dead");
        let backends_drained = counter(&r, "symphony_backends_drained", "Backends that left after their drain was released (not deaths)");
        let frontend_deaths = counter(&r, "symphony_frontend_deaths", "Frontends declared dead");
        let drops = metrics::labelled(
            &r,
            "symphony_tasks_dropped",
            "Tasks dropped by the scheduler, by reason",
            "reason",
            DropReason::ALL.map(|d| d.as_str().to_string()),
            new_counter,
        );
        let level_values = || (1..=LEVEL_LABELS).map(|l| l.to_string());
        let drops_by_level = metrics::labelled_by(
            &r,
            "symphony_tasks_dropped_by_level",
            "Tasks dropped by the policy, by priority level (1 highest; the last also counts lower ones) and reason",
            level_values()
                .flat_map(|l| DropReason::ALL.map(|d| vec![("level", l.clone()), ("reason", d.as_str().to_string())]))
                .collect(),
            new_counter,
        );
        let dispatched_by_level = metrics::labelled(
            &r,
            "symphony_tasks_dispatched_by_level",
            "Tasks dispatched in batches, by priority level (1 highest; the last also counts lower ones)",
            "level",
            level_values(),
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
        let batches_of_size = batches_of_size(&r);
        let batch_size = Histogram::new(&BATCH_BUCKETS);
        r.register("symphony_batch_size", "Dispatched batch sizes", batch_size.clone());
        let lag = Histogram::new(&LAG_BUCKETS_US);
        r.register("symphony_dispatch_lag_us", "Decision time minus planned time, microseconds", lag.clone());
        let planned_busy_ns = counter(&r, "symphony_planned_busy_ns", "Planned GPU busy time of dispatched batches, ns");
        let actual_busy_ns = counter(&r, "symphony_reported_busy_ns", "GPU busy time reported by backends, ns");
        let gpu_online_ns = counter(&r, "symphony_gpu_online_ns", "Online GPU time, ns");
        register_signals(&r, models, &SignalHandles { planned: &planned_busy_ns, online: &gpu_online_ns, received: &tasks_received, gpus_online: &gpus_online, backends: &backends, drops: &drops, model_dispatched: &dispatched, model_dropped: &dropped });
        let poll_passes = counter(&r, "symphony_poll_passes", "Turns of the scheduler's poll loop");
        let poll_sleeps = counter(&r, "symphony_poll_sleeps", "Idle turns of the poll loop that went to sleep until a peer, a notify or a timer woke it (or found work at the last check before)");
        let poll_timer_spins = counter(&r, "symphony_poll_timer_spins", "Idle turns of the poll loop that spun, the next timer being too near for a sleep");
        let [bench_ingress_lag, bench_decision_lag, bench_send_lag] = bench_lags(&r);
        let closed_loop = Arc::new(LoopMetrics::default());
        if let Ok(mut t) = closed_loop.read_transport.lock() {
            t.push_str("unknown");
        }
        LoopMetrics::register(&closed_loop, &r, names().collect());
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
            late_batch_reports,
            drops,
            drops_by_level,
            dispatched_by_level,
            failed_back,
            forwarded,
            undeliverable,
            route_revision,
            unowned_plans_held,
            protocol_errors,
            refused,
            backend_deaths,
            backends_drained,
            frontend_deaths,
            planned_busy_ns,
            actual_busy_ns,
            gpu_online_ns,
            batch_size,
            batches_of_size,
            lag,
            closed_loop,
            poll_passes,
            poll_sleeps,
            poll_timer_spins,
            bench_ingress_lag,
            bench_decision_lag,
            bench_send_lag,
        }
    }

    /// Counts a refused message.
    pub fn refuse(&self, r: MessageRefusal) {
        self.closed_loop.refused_messages[r.index()].fetch_add(1, Ordering::Relaxed);
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

    /// Counts a policy drop of a task at queue index `level_index` (the
    /// model's [`crate::types::Admission::level_index`]).
    pub fn level_drops(&self, level_index: usize, r: DropReason) {
        if let Some(c) = self.drops_by_level.get(level_label(level_index) * DropReason::COUNT + r.index()) {
            c.inc();
        }
    }

    /// Counts `n` dispatched tasks at queue index `level_index`.
    pub fn level_dispatched(&self, level_index: usize, n: u64) {
        if let Some(c) = self.dispatched_by_level.get(level_label(level_index)) {
            c.inc_by(n);
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
        // The per-interval target before an interval closed: the GPUs in
        // matchmaking, one backend holding them (its rule is tested with
        // IntervalTarget, on virtual time).
        m.backends.set(1);
        let t = m.encode();
        assert_eq!(metric(&t, "symphony_autoscale_desired_gpus"), Some(4.0));
        assert_eq!(metric(&t, "symphony_autoscale_desired_backends"), Some(1.0));
        // Not measured yet: not a number, never a demand of 0.
        assert!(metric(&t, "symphony_autoscale_demand_gpus").is_some_and(f64::is_nan), "{t}");
    }
}
