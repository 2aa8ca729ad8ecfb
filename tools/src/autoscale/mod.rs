//! The autoscale controller (issue 52): every interval it reads the
//! leader scheduler's signals, decides with [`Autoscaler`] (the paper's
//! rule plus stabilisation, cool-down, bounds and a step limit) and acts
//! through a [`Provider`], whatever owns the backends:
//!
//! - [`local`]: backend processes on this host (`symphony up
//!   --autoscale`): `add_gpus` starts backends, `drain_gpus` sends them
//!   SIGTERM (their graceful leave: the scheduler plans nothing more on
//!   their GPUs and releases them once what it planned there was reported,
//!   then they exit);
//! - Kubernetes (the backend StatefulSet's scale subresource).
//!
//! **Signals** come from the scheduler's `/metrics` ([`SchedulerMetrics`],
//! any [`SignalSource`]), as counters whose differences between two
//! scrapes give the interval's values:
//!
//! - the bad rate: tasks the scheduler dropped (every reason) over the
//!   tasks it received (`symphony_tasks_dropped_total`,
//!   `symphony_tasks_received_total`);
//! - the idle fraction: one minus the planned busy time over the online
//!   GPU time (`symphony_planned_busy_ns_total`,
//!   `symphony_gpu_online_ns_total`);
//! - the demand (`symphony_autoscale_demand_gpus`, a gauge): the GPUs the
//!   arrivals of the scheduler's latest closed interval need at the
//!   largest batches their SLOs let them gather
//!   ([`scheduler::autoscale::demand_gpus`] over the scheduler's own rates
//!   and profiles). When the scheduler exports it (a number: it reads NaN
//!   until its first interval closed), it sets the target as in the
//!   simulator's Figure 15 (the same [`Autoscaler`]): the demand with the
//!   headroom kept idle, plus the paper's `N·r/(1−r)` when requests were
//!   lost; without it the idle fraction sets the target (the paper's
//!   `N·f`), which deferred hides by spreading smaller batches over the
//!   GPUs it holds;
//! - each backend in matchmaking with its planned busy time
//!   ([`BACKEND_BUSY_METRIC`]): its presence says the backend's GPUs serve
//!   (it joined matchmaking, past the join gate, and is not draining), the
//!   difference its idle fraction, which picks the GPUs to drain (the
//!   idlest first: those consolidation already emptied).
//!
//! With several schedulers (hot standbys), the one that leads the newest
//! epoch (`symphony_scheduler_leader_epoch`) is read. A new leader's
//! counters start over: the interval in which they went backwards is not
//! judged (the next one is).
//!
//! The controller is synchronous and owns no thread: [`Controller::tick`]
//! is one interval, [`Controller::run`] ticks on the monotonic clock until
//! told to stop.

pub mod kubernetes;
pub mod local;

use std::net::SocketAddr;

use dataplane::control::{http_get, metric, metric_sum};
use dataplane::time::{Duration, Instant, MonotonicClock};
use scheduler::autoscale::{AutoscaleConfig, Autoscaler, GpuMember, Hold, ScaleDecision, ScaleError, ScaleProvider, Signals};
use scheduler::types::GpuId;
use tracing::warn;

/// The scheduler's per-backend family: one sample per backend whose GPUs
/// are in matchmaking, labelled `backend="ID"`, its planned busy time, ns.
pub const BACKEND_BUSY_METRIC: &str = "symphony_backend_planned_busy_ns";

/// The scheduler's demand gauge: GPUs its latest closed interval's
/// arrivals need at full batches.
pub const DEMAND_METRIC: &str = "symphony_autoscale_demand_gpus";

/// What owns the backends, as the controller drives it: a
/// [`ScaleProvider`] whose GPUs belong to backends the scheduler knows by
/// id.
pub trait Provider: ScaleProvider {
    /// The scheduler's id of the backend that holds `gpu` (its planned busy
    /// time is that GPU's share of the backend's), if known.
    fn backend_of(&self, gpu: GpuId) -> Option<u32>;
    /// Brings the membership up to date at `now`, before a decision:
    /// `serving` lists the backends the scheduler has in matchmaking (a
    /// joining backend found there serves now); a provider also notices
    /// here the backends that left (a drained process that exited).
    fn observe(&mut self, now: Instant, serving: &[u32]) -> Result<(), ScaleError>;
}

/// The counters of one scrape of a scheduler's `/metrics`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Scrape {
    /// The epoch it leads (0: a standby, or alone without an election).
    pub leader_epoch: f64,
    /// Tasks received from the frontends.
    pub tasks_received: f64,
    /// Tasks dropped, every reason.
    pub tasks_dropped: f64,
    /// Planned GPU busy time, ns.
    pub planned_busy_ns: f64,
    /// Online GPU time, ns.
    pub gpu_online_ns: f64,
    /// Each backend in matchmaking with its planned busy time, ns, by id.
    pub backends: Vec<(u32, f64)>,
    /// The scheduler's demand gauge, GPUs (None: not exported, or not a
    /// finite non-negative number, as before its first interval closed).
    pub demand_gpus: Option<f64>,
}

impl Scrape {
    /// Reads the counters from a Prometheus text exposition (absent ones
    /// are 0; malformed lines are skipped).
    pub fn parse(text: &str) -> Scrape {
        let get = |name: &str| metric(text, name).unwrap_or(0.0);
        let mut backends: Vec<(u32, f64)> = text
            .lines()
            .filter_map(|l| {
                let rest = l.strip_prefix(BACKEND_BUSY_METRIC)?.strip_prefix("{backend=\"")?;
                let (id, rest) = rest.split_once("\"}")?;
                let value = rest.strip_prefix(' ')?.split_whitespace().next()?.parse::<f64>().ok()?;
                Some((id.parse::<u32>().ok()?, value))
            })
            .collect();
        backends.sort_by_key(|&(id, _)| id);
        backends.dedup_by_key(|&mut (id, _)| id);
        Scrape {
            leader_epoch: get("symphony_scheduler_leader_epoch"),
            tasks_received: get("symphony_tasks_received_total"),
            tasks_dropped: metric_sum(text, "symphony_tasks_dropped_total"),
            planned_busy_ns: get("symphony_planned_busy_ns_total"),
            gpu_online_ns: get("symphony_gpu_online_ns_total"),
            backends,
            demand_gpus: metric(text, DEMAND_METRIC).filter(|d| d.is_finite() && *d >= 0.0),
        }
    }

    /// The backends in matchmaking, by id.
    pub fn serving(&self) -> Vec<u32> {
        self.backends.iter().map(|&(id, _)| id).collect()
    }
}

/// One interval between two scrapes.
#[derive(Clone, Debug, PartialEq)]
pub struct Interval {
    /// The bad rate and the idle fraction over the interval, and the
    /// scheduler's demand at its end.
    pub signals: Signals,
    /// Tasks the scheduler received in it.
    pub tasks: f64,
    /// Each backend in matchmaking at its end with its planned busy time
    /// in the interval, ns (its whole count for one that joined in it).
    pub backend_busy_ns: Vec<(u32, f64)>,
}

impl Interval {
    /// The interval from `before` to `after`; None if a counter went
    /// backwards (another scheduler leads now, its counters started over).
    pub fn between(before: &Scrape, after: &Scrape) -> Option<Interval> {
        let delta = |a: f64, b: f64| (a >= b).then_some(a - b);
        let received = delta(after.tasks_received, before.tasks_received)?;
        let dropped = delta(after.tasks_dropped, before.tasks_dropped)?;
        let busy = delta(after.planned_busy_ns, before.planned_busy_ns)?;
        let online = delta(after.gpu_online_ns, before.gpu_online_ns)?;
        let bad_rate = if received > 0.0 { (dropped / received).min(1.0) } else { 0.0 };
        let idle_fraction = if online > 0.0 { 1.0 - (busy / online).min(1.0) } else { 1.0 };
        let backend_busy_ns = after
            .backends
            .iter()
            .map(|&(id, ns)| {
                let was = before.backends.iter().find(|&&(b, _)| b == id).map_or(0.0, |&(_, v)| v);
                (id, if ns >= was { ns - was } else { ns })
            })
            .collect();
        Some(Interval { signals: Signals { bad_rate, idle_fraction, demand_gpus: after.demand_gpus }, tasks: received, backend_busy_ns })
    }
}

/// Why the signals could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SignalError {
    /// No scheduler's `/metrics` answered.
    #[error("no scheduler metrics endpoint answered ({addrs}): {source}")]
    Unreachable {
        /// The addresses tried.
        addrs: String,
        /// The last one's error.
        #[source]
        source: std::io::Error,
    },
}

/// Where the controller reads the signals.
pub trait SignalSource {
    /// The counters now.
    fn scrape(&mut self) -> Result<Scrape, SignalError>;
}

/// The schedulers' `/metrics` endpoints over HTTP; the leader's is read.
#[derive(Clone, Debug)]
pub struct SchedulerMetrics {
    addrs: Vec<SocketAddr>,
    timeout: std::time::Duration,
}

impl SchedulerMetrics {
    /// The endpoints at `addrs` (each scrape bounded by one second).
    pub fn new(addrs: Vec<SocketAddr>) -> Self {
        SchedulerMetrics { addrs, timeout: std::time::Duration::from_secs(1) }
    }
}

impl SignalSource for SchedulerMetrics {
    fn scrape(&mut self) -> Result<Scrape, SignalError> {
        let mut best: Option<Scrape> = None;
        let mut last_err = std::io::Error::other("no address given");
        for &a in &self.addrs {
            match http_get(a, "/metrics", self.timeout) {
                Ok(text) => {
                    let s = Scrape::parse(&text);
                    if best.as_ref().is_none_or(|b| s.leader_epoch > b.leader_epoch) {
                        best = Some(s);
                    }
                }
                Err(e) => last_err = e,
            }
        }
        best.ok_or_else(|| SignalError::Unreachable {
            addrs: self.addrs.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
            source: last_err,
        })
    }
}

/// The controller's knobs.
#[derive(Clone, Debug, PartialEq)]
pub struct ControllerConfig {
    /// The autoscaler's.
    pub autoscale: AutoscaleConfig,
    /// How often the signals are read and a decision taken.
    pub interval: Duration,
}

/// The controller's flags, one definition for `up --autoscale` and
/// `symphony autoscale` (one meaning per flag name), checked once.
#[derive(clap::Args, Clone, Debug)]
pub struct ControllerFlags {
    /// How often the autoscale controller reads the scheduler's signals and
    /// decides, ms.
    #[arg(long = "autoscale-interval-ms", default_value_t = 1000)]
    pub interval_ms: u64,
    /// Never fewer backends (2: one emulated GPU cannot hold every model of
    /// the zoo within their SLOs, and a second keeps serving while one
    /// restarts).
    #[arg(long = "autoscale-min-backends", default_value_t = 2)]
    pub min_backends: u32,
    /// Never more backends (with `up --autoscale`, also the peak-sized
    /// cluster the peak rate and the GPU-seconds are measured against).
    #[arg(long = "autoscale-max-backends", default_value_t = 4)]
    pub max_backends: u32,
    /// No scale-in within this long after an action, s.
    #[arg(long = "autoscale-cooldown-s", default_value_t = 4.0)]
    pub cooldown_s: f64,
    /// Scale-in acts on the largest cluster recommended over this window, s.
    #[arg(long = "autoscale-stabilisation-s", default_value_t = 4.0)]
    pub stabilisation_s: f64,
    /// The idle fraction scale-in keeps, in [0, 1).
    #[arg(long = "autoscale-headroom", default_value_t = 0.3)]
    pub headroom: f64,
}

impl ControllerFlags {
    /// The controller's configuration for backends of `gpus_per_backend`
    /// GPUs, or what is wrong with the flags.
    pub fn config(&self, gpus_per_backend: u32) -> Result<ControllerConfig, String> {
        if self.min_backends == 0 || self.max_backends < self.min_backends || gpus_per_backend == 0 {
            return Err("need 1 <= --autoscale-min-backends <= --autoscale-max-backends and at least 1 GPU per backend".into());
        }
        if self.interval_ms == 0 {
            return Err("--autoscale-interval-ms must be > 0".into());
        }
        if !(0.0..1.0).contains(&self.headroom) {
            return Err("--autoscale-headroom must be in [0, 1)".into());
        }
        let seconds = |s: f64, flag: &str| {
            (s.is_finite() && (0.0..=86_400.0).contains(&s))
                .then(|| Duration::from_secs_f64(s))
                .ok_or_else(|| format!("{flag} must be a number of seconds in [0, 86400]"))
        };
        Ok(ControllerConfig {
            autoscale: AutoscaleConfig {
                headroom: self.headroom,
                cooldown: seconds(self.cooldown_s, "--autoscale-cooldown-s")?,
                stabilisation: seconds(self.stabilisation_s, "--autoscale-stabilisation-s")?,
                min_gpus: self.min_backends.saturating_mul(gpus_per_backend),
                max_gpus: self.max_backends.saturating_mul(gpus_per_backend),
                ..AutoscaleConfig::default()
            },
            interval: Duration::from_millis(self.interval_ms),
        })
    }
}

/// Why a tick did not act.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// The signals could not be read.
    #[error(transparent)]
    Signals(#[from] SignalError),
    /// The provider could not act.
    #[error(transparent)]
    Scale(#[from] ScaleError),
}

/// One interval's outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct Tick {
    /// When it was decided.
    pub at: Instant,
    /// What the interval measured.
    pub interval: Interval,
    /// The membership it was decided on (idle fractions from the
    /// scheduler's per-backend busy time).
    pub members: Vec<GpuMember>,
    /// What was decided and done.
    pub decision: ScaleDecision,
}

/// The controller: a [`SignalSource`], an [`Autoscaler`] and a
/// [`Provider`].
pub struct Controller<P, S> {
    autoscaler: Autoscaler,
    provider: P,
    source: S,
    interval: Duration,
    /// The previous scrape and when it was taken.
    last: Option<(Instant, Scrape)>,
    /// The first interval judged.
    started: Option<Instant>,
}

impl<P: Provider, S: SignalSource> Controller<P, S> {
    /// A controller reading `source` and acting through `provider`.
    pub fn new(cfg: ControllerConfig, provider: P, source: S) -> Self {
        Controller { autoscaler: Autoscaler::new(cfg.autoscale), provider, source, interval: cfg.interval, last: None, started: None }
    }

    /// How often it decides.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// The provider.
    pub fn provider(&self) -> &P {
        &self.provider
    }

    /// The provider, to change.
    pub fn provider_mut(&mut self) -> &mut P {
        &mut self.provider
    }

    /// The provider back.
    pub fn into_provider(self) -> P {
        self.provider
    }

    /// One interval at `now`: reads the signals, brings the provider's
    /// membership up to date, decides and acts. None when there is no
    /// interval to judge yet (the first scrape, or the counters started
    /// over under a new leader): that scrape is the next one's baseline.
    pub fn tick(&mut self, now: Instant) -> Result<Option<Tick>, ControllerError> {
        let scrape = self.source.scrape()?;
        self.provider.observe(now, &scrape.serving())?;
        let judged = self.last.as_ref().and_then(|(at, before)| Some((now.saturating_since(*at), Interval::between(before, &scrape)?)));
        self.last = Some((now, scrape));
        let Some((elapsed, interval)) = judged else { return Ok(None) };
        let idle = backend_idle(&self.provider, &interval, elapsed);
        // The membership as decided on, before the action changes it.
        let members = with_idle(self.provider.members(), &self.provider, &idle);
        let mut decision = self.autoscaler.decide(now, interval.signals, &members);
        // Until the stabilisation window has been watched once, nothing is
        // drained: the first intervals after a start (a cluster still
        // warming, a load still arriving) are no case for a smaller one.
        let started = *self.started.get_or_insert(now);
        if !decision.drain.is_empty() && now.saturating_since(started) < self.autoscaler.config().stabilisation {
            decision.drain.clear();
            decision.held_by = Some(Hold::Stabilisation);
        }
        if decision.add > 0 {
            self.provider.add_gpus(now, decision.add)?;
        }
        if !decision.drain.is_empty() {
            self.provider.drain_gpus(now, &decision.drain)?;
        }
        Ok(Some(Tick { at: now, interval, members, decision }))
    }

    /// Ticks every interval on `clock` until `stop()` (checked every
    /// 50 ms); each tick's outcome goes to `on_tick` with the provider as
    /// it left it. A tick that fails is logged and the next one tried: a
    /// scheduler briefly unreachable (a failover) or a provider refusing
    /// stops nothing.
    pub fn run(&mut self, clock: &MonotonicClock, stop: &dyn Fn() -> bool, on_tick: &mut dyn FnMut(&Tick, &P)) {
        let mut next = clock.now();
        while !stop() {
            let now = clock.now();
            if now < next {
                let nap = next.saturating_since(now).min(Duration::from_millis(50));
                std::thread::sleep(std::time::Duration::from_nanos(nap.as_nanos()));
                continue;
            }
            next = now + self.interval;
            match self.tick(now) {
                Ok(Some(t)) => on_tick(&t, &self.provider),
                Ok(None) => {}
                Err(e) => warn!("autoscale: {e}"),
            }
        }
    }
}

/// Each backend's idle fraction over an interval `len` long, from its
/// planned busy time over its GPUs' time.
fn backend_idle<P: Provider>(provider: &P, interval: &Interval, len: Duration) -> Vec<(u32, f64)> {
    let members = provider.members();
    let len_ns = len.as_secs_f64() * 1e9;
    interval
        .backend_busy_ns
        .iter()
        .map(|&(b, ns)| {
            let gpus = members.iter().filter(|m| provider.backend_of(m.gpu) == Some(b)).count().max(1) as f64;
            (b, if len_ns > 0.0 { 1.0 - (ns / (len_ns * gpus)).clamp(0.0, 1.0) } else { 1.0 })
        })
        .collect()
}

/// `members` with each GPU's idle fraction its backend's, where known.
fn with_idle<P: Provider + ?Sized>(mut members: Vec<GpuMember>, provider: &P, idle: &[(u32, f64)]) -> Vec<GpuMember> {
    for m in &mut members {
        if let Some(&(_, f)) = provider.backend_of(m.gpu).and_then(|b| idle.iter().find(|&&(id, _)| id == b)) {
            m.idle_fraction = f;
        }
    }
    members
}

#[cfg(test)]
mod tests {
    use super::*;
    use scheduler::autoscale::GpuPhase;

    const TEXT: &str = "\
# TYPE symphony_tasks_received counter
symphony_tasks_received_total 1000
symphony_tasks_dropped_total{reason=\"deadline\"} 10
symphony_tasks_dropped_total{reason=\"overloaded\"} 5
symphony_planned_busy_ns_total 4000000000
symphony_gpu_online_ns_total 8000000000
symphony_scheduler_leader_epoch 3
symphony_backend_planned_busy_ns{backend=\"2\"} 1000000000
symphony_backend_planned_busy_ns{backend=\"1\"} 3000000000
symphony_backend_planned_busy_ns{backend=\"x\"} 7
symphony_backend_planned_busy_ns{backend=\"4\"} garbage
symphony_autoscale_demand_gpus 2.5
";

    #[test]
    fn a_scrape_reads_the_counters_and_the_backends_in_matchmaking() {
        let s = Scrape::parse(TEXT);
        assert_eq!(s.leader_epoch, 3.0);
        assert_eq!(s.tasks_received, 1000.0);
        assert_eq!(s.tasks_dropped, 15.0);
        assert_eq!(s.planned_busy_ns, 4e9);
        assert_eq!(s.gpu_online_ns, 8e9);
        // Sorted by id; malformed samples skipped.
        assert_eq!(s.backends, vec![(1, 3e9), (2, 1e9)]);
        assert_eq!(s.serving(), vec![1, 2]);
        assert_eq!(s.demand_gpus, Some(2.5));
        // Garbage is no counter, and no panic.
        assert_eq!(Scrape::parse("\u{0}{{{ 12\nsymphony_tasks_received_total NaNx"), Scrape::default());
        // A demand not measured yet (NaN), negative or absent is no demand.
        for text in ["symphony_autoscale_demand_gpus NaN", "symphony_autoscale_demand_gpus -1", "symphony_autoscale_demand_gpus +Inf", ""] {
            assert_eq!(Scrape::parse(text).demand_gpus, None, "{text}");
        }
    }

    #[test]
    fn an_interval_is_the_difference_and_a_restarted_leader_is_none() {
        let before = Scrape::parse(TEXT);
        let mut after = before.clone();
        after.tasks_received += 200.0;
        after.tasks_dropped += 10.0;
        after.planned_busy_ns += 1e9;
        after.gpu_online_ns += 4e9;
        after.backends = vec![(1, 3.5e9), (3, 0.2e9)];
        after.demand_gpus = Some(3.25);
        let i = Interval::between(&before, &after).unwrap();
        // The demand is the gauge at the interval's end.
        assert_eq!(i.signals, Signals { bad_rate: 0.05, idle_fraction: 0.75, demand_gpus: Some(3.25) });
        assert_eq!(i.tasks, 200.0);
        // Backend 2 left matchmaking; 3 joined: its whole count.
        assert_eq!(i.backend_busy_ns, vec![(1, 0.5e9), (3, 0.2e9)]);
        // A quiet interval: nothing bad, all idle.
        let q = Interval::between(&after, &Scrape { demand_gpus: None, ..after.clone() }).unwrap();
        assert_eq!(q.signals, Signals { bad_rate: 0.0, idle_fraction: 1.0, demand_gpus: None });
        // A new leader's counters start over.
        assert_eq!(Interval::between(&after, &Scrape::default()), None);
    }

    /// Scrapes of a cluster whose GPUs are all busy every interval
    /// (deferred spreads smaller batches over what it holds), each with
    /// the given demand gauge.
    struct AllBusy {
        demands: Vec<Option<f64>>,
        serving: std::rc::Rc<std::cell::RefCell<Vec<u32>>>,
        last: Scrape,
    }

    impl SignalSource for AllBusy {
        fn scrape(&mut self) -> Result<Scrape, SignalError> {
            let serving = self.serving.borrow().clone();
            let s = &mut self.last;
            s.tasks_received += 1000.0;
            s.planned_busy_ns += 1e9 * serving.len() as f64;
            s.gpu_online_ns += 1e9 * serving.len() as f64;
            s.backends = serving.iter().map(|&b| (b, s.backends.iter().find(|&&(id, _)| id == b).map_or(0.0, |&(_, v)| v) + 1e9)).collect();
            s.demand_gpus = if self.demands.is_empty() { None } else { self.demands.remove(0) };
            Ok(s.clone())
        }
    }

    /// Backends of one GPU each (GPU id = backend id): added ones join and
    /// serve at the next scrape; drained ones leave at once.
    struct Fleet {
        members: Vec<GpuMember>,
        serving: std::rc::Rc<std::cell::RefCell<Vec<u32>>>,
    }

    impl ScaleProvider for Fleet {
        fn add_gpus(&mut self, _now: Instant, n: u32) -> Result<Vec<GpuId>, ScaleError> {
            let first = self.members.iter().map(|m| m.gpu + 1).max().unwrap_or(0);
            let ids: Vec<GpuId> = (first..first + n).collect();
            self.members.extend(ids.iter().map(|&gpu| GpuMember { gpu, phase: GpuPhase::Joining { ready_at: Instant::ZERO }, idle_fraction: 1.0 }));
            self.serving.borrow_mut().extend(&ids);
            Ok(ids)
        }
        fn drain_gpus(&mut self, _now: Instant, gpus: &[GpuId]) -> Result<(), ScaleError> {
            self.members.retain(|m| !gpus.contains(&m.gpu));
            self.serving.borrow_mut().retain(|b| !gpus.contains(b));
            Ok(())
        }
        fn members(&self) -> Vec<GpuMember> {
            self.members.clone()
        }
    }

    impl Provider for Fleet {
        fn backend_of(&self, gpu: GpuId) -> Option<u32> {
            Some(gpu)
        }
        fn observe(&mut self, _now: Instant, serving: &[u32]) -> Result<(), ScaleError> {
            for m in &mut self.members {
                if serving.contains(&m.gpu) {
                    m.phase = GpuPhase::Serving;
                }
            }
            Ok(())
        }
    }

    #[test]
    fn the_controller_follows_the_schedulers_demand_where_the_idle_fraction_shows_none() {
        let serving = std::rc::Rc::new(std::cell::RefCell::new(vec![0, 1]));
        let fleet = Fleet { members: (0..2).map(|gpu| GpuMember { gpu, phase: GpuPhase::Serving, idle_fraction: 0.0 }).collect(), serving: serving.clone() };
        // Baseline; no demand yet (NaN before the scheduler's first
        // interval); a demand of 3.5 GPUs; then of 1.2.
        let source = AllBusy { demands: vec![None, None, Some(3.5), Some(1.2)], serving, last: Scrape::default() };
        let autoscale = AutoscaleConfig { headroom: 0.0, stabilisation: Duration::ZERO, cooldown: Duration::ZERO, min_gpus: 1, max_gpus: 8, max_step: 8, ..AutoscaleConfig::default() };
        let mut c = Controller::new(ControllerConfig { autoscale, interval: Duration::from_millis(1000) }, fleet, source);
        let at = |s: u64| Instant::ZERO + Duration::from_millis(s * 1000);
        assert_eq!(c.tick(at(0)).expect("tick"), None);
        // Without a demand, the idle fraction (none) keeps the 2.
        let t = c.tick(at(1)).expect("tick").expect("an interval");
        assert_eq!((t.interval.signals.demand_gpus, t.decision.add, t.decision.drain.len()), (None, 0, 0));
        // A demand of 3.5 with nothing lost: 4 GPUs.
        let t = c.tick(at(2)).expect("tick").expect("an interval");
        assert_eq!((t.decision.add, t.decision.drain.len()), (2, 0), "{t:?}");
        // Every GPU busy, but a demand of 1.2: 2 stay, the newest go.
        let t = c.tick(at(3)).expect("tick").expect("an interval");
        assert_eq!(t.members.iter().filter(|m| m.phase == GpuPhase::Serving && m.idle_fraction == 0.0).count(), 4, "{t:?}");
        assert_eq!((t.decision.add, t.decision.drain.clone()), (0, vec![3, 2]), "{t:?}");
        assert_eq!(c.provider().members().len(), 2);
    }
}
