//! The scheduler daemon's counters (atomics written by the poll thread,
//! read by the `/metrics` thread; no locks) and their Prometheus text.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use dataplane::wire::{DropReason, RefuseReason};

use crate::sim::AutoscaleAdvice;
use crate::zoo::ModelSpec;

/// Upper bounds of the batch-size histogram buckets.
pub const BATCH_BUCKETS: [u32; 10] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512];
/// Batch sizes counted one by one (`symphony_batches_of_size`); larger
/// ones count as the last.
pub const EXACT_BATCH_SIZES: std::ops::RangeInclusive<u32> = 1..=512;
/// Upper bounds (µs) of the dispatch-lag histogram buckets.
pub const LAG_BUCKETS_US: [u64; 8] = [10, 50, 100, 500, 1000, 5000, 10000, 50000];

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

/// Per-model counters.
#[derive(Debug, Default)]
pub struct ModelCounters {
    /// Tasks dispatched in batches.
    pub dispatched: AtomicU64,
    /// Batches dispatched.
    pub batches: AtomicU64,
    /// Tasks dropped by the policy.
    pub dropped: AtomicU64,
}

/// Everything `/metrics` shows.
#[derive(Debug)]
pub struct SchedulerMetrics {
    names: Vec<String>,
    /// Per model, by global id.
    pub models: Vec<ModelCounters>,
    /// Live frontends.
    pub frontends: AtomicU64,
    /// Live backends.
    pub backends: AtomicU64,
    /// GPUs in matchmaking.
    pub gpus_online: AtomicU64,
    /// Tasks received.
    pub tasks_received: AtomicU64,
    /// Batches reported done.
    pub batches_done: AtomicU64,
    /// Drops by reason, indexed by [`DropReason::index`].
    pub drops: [AtomicU64; DropReason::COUNT],
    /// Tasks failed back because their backend died.
    pub failed_back: AtomicU64,
    /// Completions forwarded from backends to frontends.
    pub forwarded: AtomicU64,
    /// Outcomes for frontends that are gone.
    pub undeliverable: AtomicU64,
    /// Messages that broke the protocol (wrong sender, unknown batch, ...).
    pub protocol_errors: AtomicU64,
    /// Peers refused at registration, by reason, indexed by
    /// [`RefuseReason::index`].
    pub refused: [AtomicU64; RefuseReason::COUNT],
    /// Backends declared dead.
    pub backend_deaths: AtomicU64,
    /// Frontends declared dead.
    pub frontend_deaths: AtomicU64,
    /// Planned GPU busy time, ns (sum of `l(b)` of dispatched batches).
    pub planned_busy_ns: AtomicU64,
    /// Busy time the backends reported, ns.
    pub actual_busy_ns: AtomicU64,
    /// Online GPU time, ns (integrated by the poll thread).
    pub gpu_online_ns: AtomicU64,
    /// Batch-size histogram (non-cumulative counts per bucket, plus +Inf).
    pub batch_size: [AtomicU64; BATCH_BUCKETS.len() + 1],
    /// Sum of batch sizes.
    pub batch_size_sum: AtomicU64,
    /// Batches of each size (index = size; see [`EXACT_BATCH_SIZES`]).
    pub batches_of_size: Vec<AtomicU64>,
    /// Dispatch lag histogram (decision time minus planned time).
    pub lag: [AtomicU64; LAG_BUCKETS_US.len() + 1],
    /// Sum of dispatch lags, µs.
    pub lag_sum_us: AtomicU64,
    /// Benchmark only: frontend send -> task queued, from peers' clock
    /// stamps (empty unless `--bench-stamps`).
    pub bench_ingress_lag: super::bench_stamps::LagBuckets,
    /// Messages refused, by [`MessageRefusal::index`].
    pub refused_messages: [AtomicU64; MessageRefusal::COUNT],
    /// Closed loop acting on reports (1) or open loop (0).
    pub closed_loop_enabled: AtomicU64,
    /// GPU free times the closed loop moved later (batches ran late).
    pub free_corrections_later: AtomicU64,
    /// GPU free times the closed loop moved earlier.
    pub free_corrections_earlier: AtomicU64,
    /// The closed loop's estimates, republished by the poll thread every
    /// [`super::plane::PUBLISH_EVERY`] (a lock per publication, not per
    /// message).
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

impl SchedulerMetrics {
    /// Counters for `models`.
    pub fn new(models: &[ModelSpec]) -> Self {
        SchedulerMetrics {
            names: models.iter().map(|m| m.name.clone()).collect(),
            models: models.iter().map(|_| ModelCounters::default()).collect(),
            frontends: AtomicU64::new(0),
            backends: AtomicU64::new(0),
            gpus_online: AtomicU64::new(0),
            tasks_received: AtomicU64::new(0),
            batches_done: AtomicU64::new(0),
            drops: Default::default(),
            failed_back: AtomicU64::new(0),
            forwarded: AtomicU64::new(0),
            undeliverable: AtomicU64::new(0),
            protocol_errors: AtomicU64::new(0),
            refused: Default::default(),
            backend_deaths: AtomicU64::new(0),
            frontend_deaths: AtomicU64::new(0),
            planned_busy_ns: AtomicU64::new(0),
            actual_busy_ns: AtomicU64::new(0),
            gpu_online_ns: AtomicU64::new(0),
            batch_size: Default::default(),
            batch_size_sum: AtomicU64::new(0),
            batches_of_size: (0..=*EXACT_BATCH_SIZES.end()).map(|_| AtomicU64::new(0)).collect(),
            lag: Default::default(),
            lag_sum_us: AtomicU64::new(0),
            bench_ingress_lag: Default::default(),
            refused_messages: Default::default(),
            closed_loop_enabled: AtomicU64::new(0),
            free_corrections_later: AtomicU64::new(0),
            free_corrections_earlier: AtomicU64::new(0),
            loop_estimates: Mutex::new(Vec::new()),
            read_transport: Mutex::new(String::from("unknown")),
            read_tail_ns: AtomicU64::new(0),
            read_bound_ns: AtomicU64::new(0),
            read_percentile_milli: AtomicU64::new(0),
            read_batches: AtomicU64::new(0),
            delay_bound_exceeded: AtomicU64::new(0),
            delay_bound_alarms: AtomicU64::new(0),
            delay_bound_adopted: AtomicU64::new(0),
        }
    }

    /// Counts a refused message.
    pub fn refuse(&self, r: MessageRefusal) {
        self.refused_messages[r.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a drop.
    pub fn count_drop(&self, r: DropReason) {
        self.drops[r.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a policy drop of `model`.
    pub fn model_drops(&self, model: u32) {
        if let Some(m) = self.models.get(model as usize) {
            m.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records a dispatched batch.
    pub fn record_batch(&self, model: u32, size: u32, planned_ns: u64, lag_ns: u64) {
        if let Some(m) = self.models.get(model as usize) {
            m.dispatched.fetch_add(u64::from(size), Ordering::Relaxed);
            m.batches.fetch_add(1, Ordering::Relaxed);
        }
        let b = BATCH_BUCKETS
            .iter()
            .position(|&u| size <= u)
            .unwrap_or(BATCH_BUCKETS.len());
        self.batch_size[b].fetch_add(1, Ordering::Relaxed);
        self.batch_size_sum
            .fetch_add(u64::from(size), Ordering::Relaxed);
        let exact = size.clamp(*EXACT_BATCH_SIZES.start(), *EXACT_BATCH_SIZES.end());
        if let Some(c) = self.batches_of_size.get(exact as usize) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        self.planned_busy_ns.fetch_add(planned_ns, Ordering::Relaxed);
        let us = lag_ns / 1000;
        let l = LAG_BUCKETS_US
            .iter()
            .position(|&u| us <= u)
            .unwrap_or(LAG_BUCKETS_US.len());
        self.lag[l].fetch_add(1, Ordering::Relaxed);
        self.lag_sum_us.fetch_add(us, Ordering::Relaxed);
    }

    /// GPU busy fraction so far (planned busy time over online GPU time).
    pub fn busy_fraction(&self) -> f64 {
        let online = self.gpu_online_ns.load(Ordering::Relaxed) as f64;
        if online <= 0.0 {
            return 0.0;
        }
        (self.planned_busy_ns.load(Ordering::Relaxed) as f64 / online).min(1.0)
    }

    /// Bad rate so far: policy drops over tasks received.
    pub fn drop_rate(&self) -> f64 {
        let rx = self.tasks_received.load(Ordering::Relaxed) as f64;
        if rx <= 0.0 {
            return 0.0;
        }
        let dropped: u64 = self.models.iter().map(|m| m.dropped.load(Ordering::Relaxed)).sum();
        dropped as f64 / rx
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut s = String::with_capacity(4096);
        let gauge = |s: &mut String, name: &str, help: &str, v: f64| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        let counter = |s: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        };
        gauge(&mut s, "symphony_frontends", "Registered live frontends.", l(&self.frontends) as f64);
        gauge(&mut s, "symphony_backends", "Registered live backends.", l(&self.backends) as f64);
        gauge(&mut s, "symphony_gpus_online", "GPUs in matchmaking.", l(&self.gpus_online) as f64);
        counter(&mut s, "symphony_tasks_received_total", "Tasks received from frontends.", l(&self.tasks_received));
        counter(&mut s, "symphony_batches_done_total", "Batches reported done by backends.", l(&self.batches_done));
        counter(&mut s, "symphony_tasks_failed_back_total", "Tasks failed back because their backend died.", l(&self.failed_back));
        counter(&mut s, "symphony_completions_forwarded_total", "Backend completions forwarded to frontends.", l(&self.forwarded));
        counter(&mut s, "symphony_undeliverable_total", "Outcomes for frontends that are gone.", l(&self.undeliverable));
        counter(&mut s, "symphony_protocol_errors_total", "Peer messages that broke the protocol.", l(&self.protocol_errors));
        counter(&mut s, "symphony_backend_deaths_total", "Backends declared dead.", l(&self.backend_deaths));
        counter(&mut s, "symphony_frontend_deaths_total", "Frontends declared dead.", l(&self.frontend_deaths));
        let _ = writeln!(s, "# HELP symphony_tasks_dropped_total Tasks dropped by the scheduler, by reason.\n# TYPE symphony_tasks_dropped_total counter");
        for r in DropReason::ALL {
            let _ = writeln!(s, "symphony_tasks_dropped_total{{reason=\"{}\"}} {}", r.as_str(), l(&self.drops[r.index()]));
        }
        let _ = writeln!(s, "# HELP symphony_peers_refused_total Peers refused at registration (nothing they sent reached the scheduler's state), by reason.\n# TYPE symphony_peers_refused_total counter");
        for r in RefuseReason::ALL {
            let _ = writeln!(s, "symphony_peers_refused_total{{reason=\"{}\"}} {}", r.as_str(), l(&self.refused[r.index()]));
        }
        let _ = writeln!(s, "# HELP symphony_model_dispatched_total Tasks dispatched in batches, by model.\n# TYPE symphony_model_dispatched_total counter");
        for (name, m) in self.names.iter().zip(&self.models) {
            let _ = writeln!(s, "symphony_model_dispatched_total{{model=\"{name}\"}} {}", l(&m.dispatched));
        }
        let _ = writeln!(s, "# HELP symphony_model_batches_total Batches dispatched, by model.\n# TYPE symphony_model_batches_total counter");
        for (name, m) in self.names.iter().zip(&self.models) {
            let _ = writeln!(s, "symphony_model_batches_total{{model=\"{name}\"}} {}", l(&m.batches));
        }
        let _ = writeln!(s, "# HELP symphony_model_dropped_total Tasks dropped by the policy, by model.\n# TYPE symphony_model_dropped_total counter");
        for (name, m) in self.names.iter().zip(&self.models) {
            let _ = writeln!(s, "symphony_model_dropped_total{{model=\"{name}\"}} {}", l(&m.dropped));
        }
        let _ = writeln!(s, "# HELP symphony_batches_of_size Batches dispatched, by exact size (sizes with none omitted).\n# TYPE symphony_batches_of_size counter");
        for (size, c) in self.batches_of_size.iter().enumerate() {
            let v = l(c);
            if v > 0 {
                let _ = writeln!(s, "symphony_batches_of_size{{size=\"{size}\"}} {v}");
            }
        }
        histogram(&mut s, "symphony_batch_size", "Dispatched batch sizes.", &BATCH_BUCKETS.map(u64::from), &self.batch_size, l(&self.batch_size_sum));
        histogram(&mut s, "symphony_dispatch_lag_us", "Decision time minus planned time, microseconds.", &LAG_BUCKETS_US, &self.lag, l(&self.lag_sum_us));
        self.bench_ingress_lag.render(&mut s, "symphony_bench_ingress_lag_us", "Benchmark only: frontend send to task queued (host clock stamps), microseconds.");
        counter(&mut s, "symphony_planned_busy_ns_total", "Planned GPU busy time of dispatched batches, ns.", l(&self.planned_busy_ns));
        counter(&mut s, "symphony_reported_busy_ns_total", "GPU busy time reported by backends, ns.", l(&self.actual_busy_ns));
        counter(&mut s, "symphony_gpu_online_ns_total", "Online GPU time, ns.", l(&self.gpu_online_ns));
        let busy = self.busy_fraction();
        gauge(&mut s, "symphony_gpu_busy_fraction", "Planned busy time over online GPU time, since start.", busy);
        let gpus = l(&self.gpus_online) as u32;
        let advice = AutoscaleAdvice::new(gpus, self.drop_rate(), 1.0 - busy, 0.01);
        gauge(&mut s, "symphony_autoscale_add_gpus", "GPUs to add: N*r/(1-r) when the drop rate r exceeds 1%.", advice.add_gpus);
        gauge(&mut s, "symphony_autoscale_remove_gpus", "GPUs that could go: N*idle fraction while the drop rate is at most 1%.", advice.remove_gpus);
        self.render_closed_loop(&mut s);
        s
    }

    /// The closed loop's and the delay watch's part of [`render`](Self::render).
    fn render_closed_loop(&self, s: &mut String) {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let _ = writeln!(s, "# HELP symphony_messages_refused_total Peer messages refused and ignored, by reason.\n# TYPE symphony_messages_refused_total counter");
        for r in MessageRefusal::ALL {
            let _ = writeln!(s, "symphony_messages_refused_total{{reason=\"{}\"}} {}", r.as_str(), l(&self.refused_messages[r.index()]));
        }
        let _ = writeln!(s, "# HELP symphony_closed_loop_enabled Whether batch reports correct GPU free times and profiles (1) or only are measured (0).\n# TYPE symphony_closed_loop_enabled gauge\nsymphony_closed_loop_enabled {}", l(&self.closed_loop_enabled));
        let _ = writeln!(s, "# HELP symphony_gpu_free_corrections_total GPU free times the closed loop moved, by direction.\n# TYPE symphony_gpu_free_corrections_total counter");
        let _ = writeln!(s, "symphony_gpu_free_corrections_total{{direction=\"later\"}} {}", l(&self.free_corrections_later));
        let _ = writeln!(s, "symphony_gpu_free_corrections_total{{direction=\"earlier\"}} {}", l(&self.free_corrections_earlier));
        let rows = self.loop_estimates.lock().map(|r| r.clone()).unwrap_or_default();
        let _ = writeln!(s, "# HELP symphony_gpu_speed_ratio Measured over profiled batch time on a GPU, pooled over its models (1 = as profiled).\n# TYPE symphony_gpu_speed_ratio gauge");
        for r in rows.iter().filter(|r| r.model.is_none()) {
            let _ = writeln!(s, "symphony_gpu_speed_ratio{{backend=\"{}\",gpu=\"{}\"}} {}", r.backend, r.gpu, r.ratio);
        }
        let model_rows = || rows.iter().filter_map(|r| Some((r, self.names.get(r.model? as usize)?)));
        let _ = writeln!(s, "# HELP symphony_profile_ratio Measured over profiled batch time, by GPU and model (the profile error).\n# TYPE symphony_profile_ratio gauge");
        for (r, name) in model_rows() {
            let _ = writeln!(s, "symphony_profile_ratio{{backend=\"{}\",gpu=\"{}\",model=\"{name}\"}} {}", r.backend, r.gpu, r.ratio);
        }
        let _ = writeln!(s, "# HELP symphony_profile_reports Batch reports behind symphony_profile_ratio.\n# TYPE symphony_profile_reports gauge");
        for (r, name) in model_rows() {
            let _ = writeln!(s, "symphony_profile_reports{{backend=\"{}\",gpu=\"{}\",model=\"{name}\"}} {}", r.backend, r.gpu, r.samples);
        }
        for (metric, help, pick) in [
            ("symphony_profile_alpha_ms", "Refined per-item batch cost alpha, ms, by GPU and model.", 0),
            ("symphony_profile_beta_ms", "Refined fixed batch cost beta, ms, by GPU and model.", 1),
        ] {
            let _ = writeln!(s, "# HELP {metric} {help}\n# TYPE {metric} gauge");
            for (r, name) in model_rows() {
                if let Some((a, b)) = r.alpha_beta_ms {
                    let v = if pick == 0 { a } else { b };
                    let _ = writeln!(s, "{metric}{{backend=\"{}\",gpu=\"{}\",model=\"{name}\"}} {v}", r.backend, r.gpu);
                }
            }
        }
        let transport = self.read_transport.lock().map(|t| t.clone()).unwrap_or_default();
        let q = l(&self.read_percentile_milli) as f64 / 100_000.0;
        let _ = writeln!(s, "# HELP symphony_read_tail_per_input_ns Slowest input READ per input of a batch at a high percentile over the last window, ns.\n# TYPE symphony_read_tail_per_input_ns gauge");
        let _ = writeln!(s, "symphony_read_tail_per_input_ns{{transport=\"{transport}\",quantile=\"{q}\"}} {}", l(&self.read_tail_ns));
        let _ = writeln!(s, "# HELP symphony_read_bound_per_input_ns The per-input READ bound charged (d_data), ns.\n# TYPE symphony_read_bound_per_input_ns gauge");
        let _ = writeln!(s, "symphony_read_bound_per_input_ns{{transport=\"{transport}\"}} {}", l(&self.read_bound_ns));
        let _ = writeln!(s, "# HELP symphony_read_batches_total Batches whose READ latency was folded into the tail.\n# TYPE symphony_read_batches_total counter");
        let _ = writeln!(s, "symphony_read_batches_total{{transport=\"{transport}\"}} {}", l(&self.read_batches));
        let _ = writeln!(s, "# HELP symphony_delay_bound_exceeded 1 while the observed READ tail exceeds the bound.\n# TYPE symphony_delay_bound_exceeded gauge");
        let _ = writeln!(s, "symphony_delay_bound_exceeded{{transport=\"{transport}\"}} {}", l(&self.delay_bound_exceeded));
        let _ = writeln!(s, "# HELP symphony_delay_bound_alarms_total Times the observed READ tail rose above the bound.\n# TYPE symphony_delay_bound_alarms_total counter");
        let _ = writeln!(s, "symphony_delay_bound_alarms_total{{transport=\"{transport}\"}} {}", l(&self.delay_bound_alarms));
        let _ = writeln!(s, "# HELP symphony_delay_bound_adopted_total Times the observed READ tail was adopted as the bound.\n# TYPE symphony_delay_bound_adopted_total counter");
        let _ = writeln!(s, "symphony_delay_bound_adopted_total{{transport=\"{transport}\"}} {}", l(&self.delay_bound_adopted));
    }
}

fn histogram(s: &mut String, name: &str, help: &str, bounds: &[u64], counts: &[AtomicU64], sum: u64) {
    let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} histogram");
    let mut cum = 0;
    for (b, c) in bounds.iter().zip(counts) {
        cum += c.load(Ordering::Relaxed);
        let _ = writeln!(s, "{name}_bucket{{le=\"{b}\"}} {cum}");
    }
    cum += counts.last().map(|c| c.load(Ordering::Relaxed)).unwrap_or(0);
    let _ = writeln!(s, "{name}_bucket{{le=\"+Inf\"}} {cum}\n{name}_sum {sum}\n{name}_count {cum}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane::control::metric;

    #[test]
    fn render_shows_counters_histograms_and_advice() {
        let m = SchedulerMetrics::new(&[ModelSpec::linear("r50", 1.0, 5.0, 50.0).unwrap()]);
        m.tasks_received.store(100, Ordering::Relaxed);
        m.record_batch(0, 3, 8_000_000, 20_000);
        m.record_batch(0, 600, 1, 0);
        m.model_drops(0);
        m.count_drop(DropReason::DeadlineUnmeetable);
        m.gpus_online.store(4, Ordering::Relaxed);
        m.gpu_online_ns.store(80_000_000, Ordering::Relaxed);
        let t = m.render();
        assert_eq!(metric(&t, "symphony_batch_size_bucket{le=\"2\"}"), Some(0.0));
        assert_eq!(metric(&t, "symphony_batch_size_bucket{le=\"4\"}"), Some(1.0));
        assert_eq!(metric(&t, "symphony_batch_size_bucket{le=\"+Inf\"}"), Some(2.0));
        assert_eq!(metric(&t, "symphony_batch_size_sum"), Some(603.0));
        assert_eq!(metric(&t, "symphony_batches_of_size{size=\"3\"}"), Some(1.0));
        assert_eq!(metric(&t, "symphony_batches_of_size{size=\"512\"}"), Some(1.0));
        assert_eq!(metric(&t, "symphony_model_dispatched_total{model=\"r50\"}"), Some(603.0));
        assert_eq!(metric(&t, "symphony_tasks_dropped_total{reason=\"deadline_unmeetable\"}"), Some(1.0));
        assert_eq!(metric(&t, "symphony_tasks_dropped_total{reason=\"frontend_lost\"}"), Some(0.0));
        m.refused[RefuseReason::BadToken.index()].fetch_add(2, Ordering::Relaxed);
        let t = m.render();
        assert_eq!(metric(&t, "symphony_peers_refused_total{reason=\"bad_token\"}"), Some(2.0));
        assert_eq!(metric(&t, "symphony_peers_refused_total{reason=\"version\"}"), Some(0.0));
        assert_eq!(metric(&t, "symphony_gpu_busy_fraction"), Some(0.1000000125));
        // 1% drop rate is at the threshold: no GPUs to add, 90% of 4 idle.
        assert_eq!(metric(&t, "symphony_autoscale_add_gpus"), Some(0.0));
        assert!((metric(&t, "symphony_autoscale_remove_gpus").unwrap() - 3.6).abs() < 1e-6);
    }
}
