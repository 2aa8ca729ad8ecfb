//! An autoscaler that acts on the Symphony paper's rule (section 3.5):
//! when the bad rate `r` of the last interval is over a threshold, add
//! `N·r/(1−r)` GPUs; otherwise remove `N·f`, `f` the idle fraction of the
//! `N` serving GPUs. [`AutoscaleAdvice`] computes the rule; [`Autoscaler`]
//! turns the advice into actions with what a production controller needs
//! besides:
//!
//! - a **headroom**: scale-in removes `N·f − N·headroom`, so the cluster
//!   keeps a margin of idle time instead of being cut to the point where
//!   the next interval's bad rate adds GPUs back (headroom 0 is the
//!   paper's rule as written); and, symmetrically, when the idle fraction
//!   falls under `min_idle` with no request lost, scale-out adds
//!   `N·(headroom − f)` before the bad rate rises (0, the default: only
//!   the paper's `N·r/(1−r)`, which reacts to a rising load only once
//!   requests are lost). Off by default because deferred's busy time is
//!   not its load: it spreads over the GPUs it has (smaller batches on
//!   more GPUs while a GPU would idle), so the GPUs added to restore idle
//!   time are soon busy too: on `report fig15 --quick` it doubled the
//!   GPUs in use at the same load;
//! - a **demand** signal where the scheduler has one ([`demand_gpus`]: each
//!   model's observed arrival rate at the largest batch its SLO lets it
//!   gather, over its profile): the target is then the demand with the
//!   headroom kept idle, and the idle fraction no longer sets it. Deferred
//!   hides falling load from the idle fraction (batches shrink on the GPUs
//!   it holds instead of GPUs idling: on Figure 15 it showed no slack
//!   until hour 18), while the demand tracks the fewest GPUs a static
//!   cluster needs for the load within a few percent (`report fig15`'s
//!   measured need). Requests lost still add the paper's `N·r/(1−r)`,
//!   except while the demand is over the GPUs serving (they are lost
//!   waiting for the GPUs joining, which the demand already asked for);
//! - a **stabilisation window** for scale-in: the target is the largest
//!   (most conservative) one recommended over the window, so one quiet
//!   interval in a busy period removes nothing (as Kubernetes' HPA
//!   `scaleDown.stabilizationWindowSeconds`). Scale-out acts at once:
//!   losing requests is worse than paying for a GPU;
//! - a **capacity loss** mark: where the demand's own count lost requests
//!   (the target was no more than the GPUs serving, none joining, and one
//!   fewer would not have carried the demand), the cluster is not cut back
//!   to that count while the demand stays at that level (the live
//!   controller's peak: a demand of 1.2-1.45 GPUs targets 2 backends,
//!   which lost 2-8%, and the window alone let it cycle 2 -> 3 -> 2); a
//!   loss at a demand fewer GPUs carry (a host stall at low load) marks
//!   nothing;
//! - a **cool-down** after any action before the next scale-in, so the
//!   signals measure the new cluster before it shrinks again; scale-out
//!   does not wait for it, but GPUs still joining count as already added;
//! - **minimum and maximum** GPUs, and a **step limit** per action;
//! - a scale-in that drains the GPUs consolidation already left idle:
//!   deferred matchmaking takes the lowest free GPU id, so at low load
//!   the highest ids idle, and those go first ([`pick_drain`]).
//!
//! The autoscaler is sans-IO: [`Autoscaler::decide`] is told the time, the
//! interval's signals and the membership, and answers with a
//! [`ScaleDecision`]; [`Autoscaler::step`] applies one through a
//! [`ScaleProvider`], the one interface to whatever owns the GPUs:
//!
//! - the simulator ([`crate::sim::autoscaled::SimProvider`]): GPUs join
//!   after a stated warm-up and leave once they finish what they hold, on
//!   virtual time;
//! - local processes (`symphony up --autoscale`, the `tools` crate's
//!   `autoscale::local`): `add_gpus` starts backend processes (their GPUs
//!   join matchmaking once the backend registered and warmed its models),
//!   `drain_gpus` sends each backend SIGTERM, its graceful leave (the
//!   scheduler plans nothing more on its GPUs and releases it once every
//!   batch planned there was reported, then it exits), and `members`
//!   follows the scheduler's live membership; the controller there reads
//!   the scheduler's demand gauge (this module's [`IntervalTarget`]);
//! - Kubernetes (`autoscale::kubernetes`): `add_gpus` raises the backend
//!   StatefulSet's `replicas` through the API (RBAC: `get`/`patch` on
//!   `statefulsets/scale`), and `drain_gpus` drains the highest ordinals
//!   first, since a StatefulSet removes the highest ordinals on
//!   scale-down and deferred idles the highest GPU ids. The same target
//!   is exported as an external metric for HPA or KEDA.

use crate::sim::AutoscaleAdvice;
use crate::types::GpuId;
use crate::zoo::ModelSpec;
use dataplane::time::{Duration, Instant};
use std::collections::VecDeque;

/// The autoscaler's knobs.
#[derive(Clone, Debug, PartialEq)]
pub struct AutoscaleConfig {
    /// A bad rate over this adds GPUs (the paper's threshold).
    pub bad_rate_threshold: f64,
    /// Idle fraction kept when scaling in (0: the paper's `N·f`).
    pub headroom: f64,
    /// An idle fraction under this adds GPUs up to the headroom even
    /// without bad requests (0: never).
    pub min_idle: f64,
    /// Scale-in acts on the largest target recommended over this window.
    pub stabilisation: Duration,
    /// No scale-in within this long after any action.
    pub cooldown: Duration,
    /// Never fewer GPUs than this (at least 1).
    pub min_gpus: u32,
    /// Never more GPUs than this.
    pub max_gpus: u32,
    /// At most this many GPUs added or drained per action (at least 1).
    pub max_step: u32,
}

impl Default for AutoscaleConfig {
    fn default() -> Self {
        AutoscaleConfig {
            bad_rate_threshold: 0.01,
            headroom: 0.1,
            min_idle: 0.0,
            stabilisation: Duration::from_millis(30000),
            cooldown: Duration::from_millis(10000),
            min_gpus: 1,
            max_gpus: 512,
            max_step: 64,
        }
    }
}

/// Where a GPU is in its membership.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuPhase {
    /// Added, warming its models; offered to matchmaking at `ready_at`.
    Joining {
        /// When it joins matchmaking.
        ready_at: Instant,
    },
    /// In matchmaking.
    Serving,
    /// Told to leave: gets no new plans, finishes what it holds, leaves.
    Draining,
}

/// One GPU of the membership a provider reports.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GpuMember {
    /// Its id in the scheduler.
    pub gpu: GpuId,
    /// Where it is.
    pub phase: GpuPhase,
    /// Its idle fraction over the last interval (1 for a GPU that ran
    /// nothing).
    pub idle_fraction: f64,
}

/// Why a provider could not act.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScaleError {
    /// The provider has no more GPUs to give.
    #[error("no capacity for {wanted} more GPUs ({available} available)")]
    NoCapacity {
        /// GPUs asked for.
        wanted: u32,
        /// GPUs it could have given.
        available: u32,
    },
    /// The GPU is not serving (unknown, joining or already draining).
    #[error("GPU {gpu} is not serving")]
    NotServing {
        /// The GPU.
        gpu: GpuId,
    },
    /// The policy cannot change its GPUs while it runs.
    #[error("policy '{policy}' cannot add or remove GPUs while it runs")]
    Unsupported {
        /// The policy.
        policy: String,
    },
    /// What owns the GPUs failed to act (an API server refused or did not
    /// answer, a process did not start); the next interval tries again.
    #[error("{provider}: {reason}")]
    Provider {
        /// The provider (`kubernetes`, `local`).
        provider: &'static str,
        /// What failed, with its cause.
        reason: String,
    },
}

/// What owns the GPUs: adds, drains and reports them: the simulator, local
/// backend processes and Kubernetes (see the module documentation).
pub trait ScaleProvider {
    /// Asks for `n` more GPUs at `now`; returns the ids that will join
    /// (each [`GpuPhase::Joining`] until it has warmed).
    fn add_gpus(&mut self, now: Instant, n: u32) -> Result<Vec<GpuId>, ScaleError>;
    /// Drains `gpus` at `now`: they get no new plans from now on, finish
    /// what they hold, then leave.
    fn drain_gpus(&mut self, now: Instant, gpus: &[GpuId]) -> Result<(), ScaleError>;
    /// Every GPU that is joining, serving or draining.
    fn members(&self) -> Vec<GpuMember>;
}

/// One interval's signals.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Signals {
    /// Bad requests over requests whose outcome came in the interval.
    pub bad_rate: f64,
    /// Idle fraction of the serving GPUs over the interval.
    pub idle_fraction: f64,
    /// The GPUs the interval's arrivals need at full batches
    /// ([`demand_gpus`]), where the scheduler knows its models' rates and
    /// profiles. When given, it sets the target instead of the idle
    /// fraction (which deferred hides by spreading smaller batches over
    /// the GPUs it holds), and the paper's `N·r/(1−r)` still adds on top
    /// when requests are lost.
    pub demand_gpus: Option<f64>,
}

/// The GPUs that arrivals at `rates_rps` (per model, as `models`) keep
/// busy when every batch is as large as the SLO lets it be: for model `m`
/// at rate `λ`, the largest batch `b` whose execution plus the time to
/// gather it fits the SLO, and `λ·l(b)/b` GPUs (a model's GPU time is
/// shared with the others, so the sum is not rounded per model). The
/// batch's first request opens its window (the deadline is its arrival
/// plus the SLO), so gathering `b` takes the `b − 1` gaps after it:
/// `(b − 1)/λ + l(b)` within the SLO. Counting `b` gaps instead cost a
/// request per batch, which matters where batches are small: at Figure
/// 15's trough (seed 6) that estimate read 3-7% over the measured static
/// need, this one 0-3% under it, as it is at the peak. What the scheduler
/// itself knows at run time: its observed arrival rates and its
/// profiles; a model whose single request does not fit its SLO counts at
/// batch 1. Rates that are not finite and positive count as 0.
pub fn demand_gpus(models: &[ModelSpec], rates_rps: &[f64]) -> f64 {
    models
        .iter()
        .zip(rates_rps)
        .filter(|&(_, &rate)| rate.is_finite() && rate > 0.0)
        .map(|(m, &rate)| {
            // Past a nanosecond per request the gathering time is nil.
            let per_item = Duration::from_nanos((1e9 / rate).min(1e15) as u64);
            // `l(b) + b·gap ≤ SLO + gap` is `(b − 1)·gap + l(b) ≤ SLO`.
            let b = m.profile.max_batch_within(m.slo + per_item, per_item, m.profile.max_batch()).max(1);
            rate * m.profile.latency(b).as_secs_f64() / f64::from(b)
        })
        .sum()
}

/// What the autoscaler decided at one interval.
#[derive(Clone, Debug, PartialEq)]
pub struct ScaleDecision {
    /// The paper's advice for the serving GPUs.
    pub advice: AutoscaleAdvice,
    /// GPUs to add.
    pub add: u32,
    /// GPUs to drain, idlest first.
    pub drain: Vec<GpuId>,
    /// Why nothing (or less than advised) was done, if so.
    pub held_by: Option<Hold>,
}

/// What held an action back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    /// The stabilisation window recommended a larger cluster.
    Stabilisation,
    /// Within the cool-down of the last action.
    Cooldown,
    /// At the minimum or maximum GPUs.
    Bounds,
    /// Cut to the step limit.
    StepLimit,
    /// GPUs still joining already cover the advice.
    Joining,
}

/// At most this many capacity-loss marks are kept ([`Autoscaler`]).
const LOSS_MARKS: usize = 16;

/// The controller: the paper's rule and the knobs of [`AutoscaleConfig`].
#[derive(Clone, Debug)]
pub struct Autoscaler {
    cfg: AutoscaleConfig,
    /// `(time, recommended GPUs)` inside the stabilisation window.
    recommendations: VecDeque<(Instant, u32)>,
    last_action: Option<Instant>,
    /// GPUs joining at the last decision: the interval since then was
    /// still waiting for them.
    joining_before: u32,
    /// Whether the last action was a scale-in cut by the step limit: its
    /// rest follows at the next interval, without a cool-down.
    drain_cut: bool,
    /// The GPU counts that served an interval which lost requests although
    /// the demand's target was no more than them and fewer would not have
    /// carried the demand ([`Autoscaler::capacity_loss`]), ascending, at
    /// most [`LOSS_MARKS`]: the cluster stays above the largest while the
    /// demand stays where one GPU fewer would not carry it.
    lost_at: Vec<u32>,
}

impl Autoscaler {
    /// A controller with `cfg` (`min_gpus` at least 1, `max_step` at least
    /// 1, `max_gpus` at least `min_gpus`).
    pub fn new(mut cfg: AutoscaleConfig) -> Self {
        cfg.min_gpus = cfg.min_gpus.max(1);
        cfg.max_gpus = cfg.max_gpus.max(cfg.min_gpus);
        cfg.max_step = cfg.max_step.max(1);
        Autoscaler { cfg, recommendations: VecDeque::with_capacity(64), last_action: None, joining_before: 0, drain_cut: false, lost_at: Vec::with_capacity(LOSS_MARKS + 1) }
    }

    /// The knobs.
    pub fn config(&self) -> &AutoscaleConfig {
        &self.cfg
    }

    /// The GPUs the rule recommends for `serving` GPUs on one interval's
    /// `signals`: the demand with the headroom kept idle when the signals
    /// carry it, else the paper's rule (plus the headroom and `min_idle`),
    /// and in both cases `N·r/(1−r)` more when requests were lost (with a
    /// demand, only losses that were not the wait for joining GPUs:
    /// `joined_in_interval` says GPUs joined during the interval).
    /// Unbounded; [`Autoscaler::target`] bounds it.
    fn raw_target(&self, signals: Signals, serving: u32, advice: &AutoscaleAdvice, joined_in_interval: bool) -> u32 {
        let cfg = &self.cfg;
        // Rounded up (down for removal) past a float's error, so that
        // `8·0.2/0.8` adds 2, not 3.
        let n = f64::from(serving);
        let lost = if advice.add_gpus > 0.0 { serving.saturating_add((advice.add_gpus - 1e-9).ceil() as u32) } else { 0 };
        if let Some(demand) = signals.demand_gpus.filter(|d| d.is_finite() && *d >= 0.0) {
            let target = self.demand_target(demand);
            // Requests lost while the demand is over the GPUs serving, or
            // in an interval GPUs joined in, are the cost of the wait for
            // them, not a sign that the demand is short: adding N·r/(1−r)
            // on top overshot by 10-15% after a rise on Figure 15. Lost at
            // or over the demand, they add as the paper's rule says.
            if target > serving || joined_in_interval {
                target
            } else {
                target.max(lost)
            }
        } else if lost > 0 {
            lost
        } else if signals.bad_rate <= cfg.bad_rate_threshold && signals.idle_fraction < cfg.min_idle && serving > 0 {
            serving.saturating_add((n * (cfg.headroom - signals.idle_fraction) - 1e-9).ceil().max(0.0) as u32)
        } else {
            let remove = (advice.remove_gpus - cfg.headroom * n + 1e-9).max(0.0).floor() as u32;
            serving - remove.min(serving)
        }
    }

    /// The GPUs `demand` needs with the headroom kept idle.
    fn demand_target(&self, demand: f64) -> u32 {
        (demand / self.per_gpu() - 1e-9).ceil().min(f64::from(u32::MAX)) as u32
    }

    /// The demand one GPU carries with the headroom kept idle.
    fn per_gpu(&self) -> f64 {
        1.0 - self.cfg.headroom.clamp(0.0, 0.9)
    }

    /// Keeps [`Self::lost_at`] for one interval on which `serving` GPUs
    /// served (`joined`: GPUs joined during it): a loss over the threshold
    /// is the evidence that `serving` GPUs are too few for this demand when
    /// it was not the wait for GPUs the demand asked for (its target was no
    /// more than `serving`, none joined) and `serving − 1` would not carry
    /// the demand either (it is over what they carry with the headroom):
    /// the rule's count itself lost, so the rule's per-GPU capacity is too
    /// high here (few GPUs shared by many models pool worse than the
    /// demand, a sum of GPU time, assumes). A loss at a demand that fewer
    /// GPUs carry is no such evidence (a host stall, a burst: at low load
    /// the live controller saw 2.2% lost on 2 backends at a demand of 0.35)
    /// and leaves only the paper's `N·r/(1−r)` for the window. The mark
    /// goes once the demand is back where one GPU fewer than the count
    /// that lost carries it; a smaller count's mark stays while its own
    /// demand does.
    fn capacity_loss(&mut self, signals: Signals, serving: u32, joined: bool) {
        let Some(demand) = signals.demand_gpus.filter(|d| d.is_finite() && *d >= 0.0) else {
            self.lost_at.clear();
            return;
        };
        let per_gpu = self.per_gpu();
        let carried_by = |gpus: u32| f64::from(gpus) * per_gpu;
        self.lost_at.retain(|&n| demand > carried_by(n.saturating_sub(1)));
        let lost = signals.bad_rate > self.cfg.bad_rate_threshold;
        if lost && !joined && serving > 0 && self.demand_target(demand) <= serving && demand > carried_by(serving - 1) {
            if let Err(at) = self.lost_at.binary_search(&serving) {
                // Sorted. Past the bound the smallest mark goes (the floor
                // is the largest): it makes room or is the one left out.
                self.lost_at.insert(at, serving);
                if self.lost_at.len() > LOSS_MARKS {
                    self.lost_at.remove(0);
                }
            }
        }
    }

    /// The cluster the rule recommends on one interval's `signals` with
    /// `serving` GPUs, within the minimum and maximum: what an external
    /// scaler (HPA, KEDA) can act on, with its own stabilisation and step
    /// limits in place of [`Autoscaler::decide`]'s.
    pub fn target(&self, signals: Signals, serving: u32) -> u32 {
        let advice = AutoscaleAdvice::new(serving, signals.bad_rate, signals.idle_fraction, self.cfg.bad_rate_threshold);
        self.raw_target(signals, serving, &advice, false).clamp(self.cfg.min_gpus, self.cfg.max_gpus)
    }

    /// Decides at `now` on the last interval's `signals` and the provider's
    /// `members`. Pure apart from the window and the cool-down it keeps.
    pub fn decide(&mut self, now: Instant, signals: Signals, members: &[GpuMember]) -> ScaleDecision {
        let serving = members.iter().filter(|m| m.phase == GpuPhase::Serving).count() as u32;
        let joining = members.iter().filter(|m| matches!(m.phase, GpuPhase::Joining { .. })).count() as u32;
        let advice = AutoscaleAdvice::new(serving, signals.bad_rate, signals.idle_fraction, self.cfg.bad_rate_threshold);
        let joined = self.joining_before > 0 || joining > 0;
        self.capacity_loss(signals, serving, joined);
        // Never back to a count that lost at this demand (`lost_at`).
        let raw = self.raw_target(signals, serving, &advice, joined).max(self.lost_at.last().map_or(0, |n| n.saturating_add(1)));
        self.joining_before = joining;
        let mut decision = ScaleDecision { advice, add: 0, drain: Vec::new(), held_by: None };
        let cfg = &self.cfg;
        // The cluster that counts against the bounds: GPUs draining are on
        // their way out and no longer count.
        let current = serving + joining;
        let recommended = raw.clamp(cfg.min_gpus, cfg.max_gpus);
        while self.recommendations.front().is_some_and(|&(t, _)| now.saturating_since(t) >= cfg.stabilisation) {
            self.recommendations.pop_front();
        }
        self.recommendations.push_back((now, recommended));
        if recommended > current || current < cfg.min_gpus {
            // Scale out at once, GPUs already joining counted.
            let want = recommended.max(cfg.min_gpus) - current;
            let step = want.min(cfg.max_step);
            decision.add = step;
            if step < want {
                decision.held_by = Some(Hold::StepLimit);
            }
        } else if raw > serving && joining > 0 {
            decision.held_by = Some(Hold::Joining);
        } else if recommended < serving {
            let stable = self.recommendations.iter().map(|&(_, r)| r).max().unwrap_or(recommended);
            // The rest of a scale-in the step limit cut is one decision
            // spread over intervals, not a new one to wait for: with the
            // cool-down between its steps, a fall of 115 GPUs on Figure 15
            // took 13 s to drain at 64 a step.
            let in_cooldown = !self.drain_cut && self.last_action.is_some_and(|t| now.saturating_since(t) < cfg.cooldown);
            // Joining GPUs are capacity on its way: the serving ones shrink
            // only by what the target leaves of them.
            let target = stable.max(cfg.min_gpus).saturating_sub(joining);
            if in_cooldown {
                decision.held_by = Some(Hold::Cooldown);
            } else if target >= serving {
                decision.held_by = Some(Hold::Stabilisation);
            } else {
                let want = serving - target;
                let step = want.min(cfg.max_step);
                decision.drain = pick_drain(members, step);
                if step < want {
                    decision.held_by = Some(Hold::StepLimit);
                } else if stable > recommended {
                    decision.held_by = Some(Hold::Stabilisation);
                }
            }
        } else if raw != recommended {
            decision.held_by = Some(Hold::Bounds);
        }
        if decision.add > 0 || !decision.drain.is_empty() {
            self.last_action = Some(now);
            self.drain_cut = !decision.drain.is_empty() && decision.held_by == Some(Hold::StepLimit);
        }
        decision
    }

    /// [`Autoscaler::decide`] on `provider`'s membership, and applies the
    /// decision through it.
    pub fn step<P: ScaleProvider + ?Sized>(&mut self, now: Instant, signals: Signals, provider: &mut P) -> Result<ScaleDecision, ScaleError> {
        let members = provider.members();
        let decision = self.decide(now, signals, &members);
        if decision.add > 0 {
            provider.add_gpus(now, decision.add)?;
        }
        if !decision.drain.is_empty() {
            provider.drain_gpus(now, &decision.drain)?;
        }
        Ok(decision)
    }
}

/// A scheduler's cumulative counters at one moment: what an interval's
/// [`Signals`] are the differences of.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Tasks received.
    pub received: u64,
    /// Tasks dropped.
    pub dropped: u64,
    /// Planned GPU busy time, ns.
    pub planned_busy_ns: u64,
    /// GPU time in matchmaking, ns.
    pub gpu_online_ns: u64,
    /// Tasks that reached an outcome (dispatched in a batch or dropped),
    /// per model: their differences are the models' arrival rates.
    pub per_model: Vec<u64>,
}

/// One closed interval's reading for an external scaler.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TargetReading {
    /// The interval's signals.
    pub signals: Signals,
    /// Its arrivals' demand, GPUs ([`demand_gpus`]).
    pub demand_gpus: f64,
    /// The GPUs [`Autoscaler::target`] recommends after it.
    pub desired_gpus: u32,
}

/// [`Autoscaler::target`] on the latest interval of a scheduler's counters,
/// for an external scaler (HPA, KEDA) that reads it as a gauge: an
/// interval closes at the first reading at least `min_interval` after the
/// last one closed, so several scrapers, or one scraping fast, all see the
/// same interval, and a gauge that counted since start never stands in
/// for the current load.
#[derive(Clone, Debug)]
pub struct IntervalTarget {
    autoscaler: Autoscaler,
    models: Vec<ModelSpec>,
    min_interval: Duration,
    last: Option<(Instant, Counters)>,
    latest: Option<TargetReading>,
    rates: Vec<f64>,
}

impl IntervalTarget {
    /// The target of `cfg`'s rule for `models` over intervals of at least
    /// `min_interval` (at least a millisecond).
    pub fn new(cfg: AutoscaleConfig, models: Vec<ModelSpec>, min_interval: Duration) -> Self {
        let rates = vec![0.0; models.len()];
        IntervalTarget { autoscaler: Autoscaler::new(cfg), models, min_interval: min_interval.max(Duration::from_millis(1)), last: None, latest: None, rates }
    }

    /// Reads `counters` at `now` with `serving` GPUs in matchmaking;
    /// returns the latest closed interval's reading (None before the first
    /// closed). Counters that went backwards (a restart) start the interval
    /// over.
    pub fn observe(&mut self, now: Instant, counters: Counters, serving: u32) -> Option<TargetReading> {
        let Some((since, before)) = &self.last else {
            self.last = Some((now, counters));
            return None;
        };
        let elapsed = now.saturating_since(*since);
        if elapsed < self.min_interval {
            return self.latest;
        }
        let d = |a: u64, b: u64| a.checked_sub(b);
        let whole = d(counters.received, before.received)
            .zip(d(counters.dropped, before.dropped))
            .zip(d(counters.planned_busy_ns, before.planned_busy_ns).zip(d(counters.gpu_online_ns, before.gpu_online_ns)));
        let went_back = counters.per_model.len() != before.per_model.len() || counters.per_model.iter().zip(&before.per_model).any(|(a, b)| a < b);
        let Some(((received, dropped), (busy, online))) = whole.filter(|_| !went_back) else {
            self.last = Some((now, counters));
            return self.latest;
        };
        let secs = elapsed.as_secs_f64();
        for ((rate, a), b) in self.rates.iter_mut().zip(&counters.per_model).zip(&before.per_model) {
            *rate = (a - b) as f64 / secs;
        }
        let demand = demand_gpus(&self.models, &self.rates);
        let signals = Signals {
            bad_rate: if received > 0 { (dropped as f64 / received as f64).min(1.0) } else { 0.0 },
            idle_fraction: if online > 0 { 1.0 - (busy as f64 / online as f64).min(1.0) } else { 1.0 },
            demand_gpus: Some(demand),
        };
        let reading = TargetReading { signals, demand_gpus: demand, desired_gpus: self.autoscaler.target(signals, serving) };
        self.latest = Some(reading);
        self.last = Some((now, counters));
        self.latest
    }
}

/// The `n` serving GPUs to drain: the idlest over the last interval, the
/// highest id first among equals (deferred matchmaking prefers low ids, so
/// consolidation leaves the high ones idle).
pub fn pick_drain(members: &[GpuMember], n: u32) -> Vec<GpuId> {
    let mut serving: Vec<&GpuMember> = members.iter().filter(|m| m.phase == GpuPhase::Serving).collect();
    serving.sort_by(|a, b| b.idle_fraction.total_cmp(&a.idle_fraction).then(b.gpu.cmp(&a.gpu)));
    serving.iter().take(n as usize).map(|m| m.gpu).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: u64) -> Instant {
        Instant::ZERO + Duration::from_millis(s * 1000)
    }

    fn serving(n: u32, idle: f64) -> Vec<GpuMember> {
        (0..n).map(|gpu| GpuMember { gpu, phase: GpuPhase::Serving, idle_fraction: idle }).collect()
    }

    fn cfg() -> AutoscaleConfig {
        AutoscaleConfig {
            bad_rate_threshold: 0.01,
            headroom: 0.0,
            min_idle: 0.0,
            stabilisation: Duration::ZERO,
            cooldown: Duration::ZERO,
            min_gpus: 1,
            max_gpus: 100,
            max_step: 100,
        }
    }

    const QUIET: Signals = Signals { bad_rate: 0.0, idle_fraction: 0.5, demand_gpus: None };

    #[test]
    fn the_papers_rule_adds_n_r_over_1_minus_r_and_removes_n_f() {
        let mut a = Autoscaler::new(cfg());
        // r = 0.2 on 8 GPUs: 8 * 0.2 / 0.8 = 2 more.
        let d = a.decide(at(0), Signals { bad_rate: 0.2, idle_fraction: 0.0, demand_gpus: None }, &serving(8, 0.0));
        assert_eq!((d.add, d.drain.len()), (2, 0));
        // f = 0.5 on 8 GPUs, no headroom: 4 fewer.
        let d = a.decide(at(1), QUIET, &serving(8, 0.5));
        assert_eq!((d.add, d.drain.len()), (0, 4));
        // Headroom 0.25 keeps 2 of them.
        let mut a = Autoscaler::new(AutoscaleConfig { headroom: 0.25, ..cfg() });
        assert_eq!(a.decide(at(0), QUIET, &serving(8, 0.5)).drain.len(), 2);
    }

    #[test]
    fn a_cluster_without_idle_time_grows_to_the_headroom_before_losing_requests() {
        let mut a = Autoscaler::new(AutoscaleConfig { headroom: 0.1, min_idle: 0.05, ..cfg() });
        // 20 GPUs 2% idle, nothing lost: 20 * (0.1 - 0.02) = 1.6, so 2 more.
        assert_eq!(a.decide(at(0), Signals { bad_rate: 0.0, idle_fraction: 0.02, demand_gpus: None }, &serving(20, 0.02)).add, 2);
        // Between min_idle and the headroom nothing changes.
        let d = a.decide(at(1), Signals { bad_rate: 0.0, idle_fraction: 0.07, demand_gpus: None }, &serving(22, 0.07));
        assert_eq!((d.add, d.drain.len()), (0, 0));
        // Losing requests: the paper's rule, 20 * 0.5 / 0.5.
        assert_eq!(a.decide(at(2), Signals { bad_rate: 0.5, idle_fraction: 0.0, demand_gpus: None }, &serving(20, 0.0)).add, 20);
    }

    #[test]
    fn scale_in_waits_for_the_stabilisation_window() {
        let mut a = Autoscaler::new(AutoscaleConfig { stabilisation: Duration::from_millis(30000), ..cfg() });
        // A busy interval recommends all 8; the quiet ones after it
        // recommend 4, but the window still holds the 8.
        assert!(a.decide(at(0), Signals { bad_rate: 0.0, idle_fraction: 0.0, demand_gpus: None }, &serving(8, 0.0)).drain.is_empty());
        for s in [10, 20, 29] {
            let d = a.decide(at(s), QUIET, &serving(8, 0.5));
            assert!(d.drain.is_empty(), "at {s} s");
            assert_eq!(d.held_by, Some(Hold::Stabilisation));
        }
        // 30 s after the busy one it has left the window.
        assert_eq!(a.decide(at(30), QUIET, &serving(8, 0.5)).drain.len(), 4);
    }

    #[test]
    fn no_scale_in_within_the_cool_down_but_scale_out_at_once() {
        let mut a = Autoscaler::new(AutoscaleConfig { cooldown: Duration::from_millis(10000), ..cfg() });
        assert_eq!(a.decide(at(0), QUIET, &serving(16, 0.5)).drain.len(), 8);
        let d = a.decide(at(5), QUIET, &serving(8, 0.5));
        assert!(d.drain.is_empty());
        assert_eq!(d.held_by, Some(Hold::Cooldown));
        // Losing requests is not held by the cool-down.
        assert_eq!(a.decide(at(6), Signals { bad_rate: 0.5, idle_fraction: 0.0, demand_gpus: None }, &serving(8, 0.0)).add, 8);
        // ... which restarts it.
        assert!(a.decide(at(15), QUIET, &serving(16, 0.5)).drain.is_empty());
        assert_eq!(a.decide(at(16), QUIET, &serving(16, 0.5)).drain.len(), 8);
    }

    #[test]
    fn min_and_max_bound_the_cluster() {
        let mut a = Autoscaler::new(AutoscaleConfig { min_gpus: 6, max_gpus: 10, ..cfg() });
        // Remove 4 of 8 would leave 4 < 6: only 2 go.
        assert_eq!(a.decide(at(0), QUIET, &serving(8, 0.5)).drain.len(), 2);
        // At the minimum nothing goes.
        let d = a.decide(at(1), Signals { bad_rate: 0.0, idle_fraction: 0.9, demand_gpus: None }, &serving(6, 0.9));
        assert!(d.drain.is_empty());
        assert_eq!(d.held_by, Some(Hold::Bounds));
        // r = 0.5 on 8 asks for 8 more; the maximum allows 2.
        assert_eq!(a.decide(at(2), Signals { bad_rate: 0.5, idle_fraction: 0.0, demand_gpus: None }, &serving(8, 0.0)).add, 2);
        let d = a.decide(at(3), Signals { bad_rate: 0.5, idle_fraction: 0.0, demand_gpus: None }, &serving(10, 0.0));
        assert_eq!((d.add, d.held_by), (0, Some(Hold::Bounds)));
        // Below the minimum it adds back up to it, whatever the signals.
        assert_eq!(a.decide(at(4), QUIET, &serving(3, 0.5)).add, 3);
    }

    #[test]
    fn the_rest_of_a_scale_in_cut_by_the_step_limit_waits_for_no_cool_down() {
        let mut a = Autoscaler::new(AutoscaleConfig { max_step: 3, cooldown: Duration::from_millis(10000), ..cfg() });
        let quiet = |n| Signals { bad_rate: 0.0, idle_fraction: 0.0, demand_gpus: Some(n) };
        // 10 serving, a demand of 3: 7 to go, 3 at a time, one interval
        // apart.
        assert_eq!(a.decide(at(0), quiet(3.0), &serving(10, 0.0)).drain.len(), 3);
        assert_eq!(a.decide(at(1), quiet(3.0), &serving(7, 0.0)).drain.len(), 3);
        let d = a.decide(at(2), quiet(3.0), &serving(4, 0.0));
        assert_eq!((d.drain.len(), d.held_by), (1, None));
        // That scale-in is done: a new one waits for the cool-down.
        assert_eq!(a.decide(at(3), quiet(2.0), &serving(3, 0.0)).held_by, Some(Hold::Cooldown));
        assert_eq!(a.decide(at(12), quiet(2.0), &serving(3, 0.0)).drain.len(), 1);
    }

    #[test]
    fn the_step_limit_caps_each_action() {
        let mut a = Autoscaler::new(AutoscaleConfig { max_step: 3, ..cfg() });
        let d = a.decide(at(0), Signals { bad_rate: 0.5, idle_fraction: 0.0, demand_gpus: None }, &serving(10, 0.0));
        assert_eq!((d.add, d.held_by), (3, Some(Hold::StepLimit)));
        let d = a.decide(at(1), QUIET, &serving(10, 0.5));
        assert_eq!((d.drain.len(), d.held_by), (3, Some(Hold::StepLimit)));
    }

    #[test]
    fn gpus_still_joining_count_as_added() {
        let mut a = Autoscaler::new(cfg());
        let mut m = serving(8, 0.0);
        m.push(GpuMember { gpu: 8, phase: GpuPhase::Joining { ready_at: at(5) }, idle_fraction: 1.0 });
        m.push(GpuMember { gpu: 9, phase: GpuPhase::Joining { ready_at: at(5) }, idle_fraction: 1.0 });
        // r = 0.2 on 8 serving asks for 2, and 2 are joining.
        let d = a.decide(at(0), Signals { bad_rate: 0.2, idle_fraction: 0.0, demand_gpus: None }, &m);
        assert_eq!((d.add, d.held_by), (0, Some(Hold::Joining)));
        // r = 0.5 asks for 8: 6 more.
        assert_eq!(a.decide(at(1), Signals { bad_rate: 0.5, idle_fraction: 0.0, demand_gpus: None }, &m).add, 6);
    }

    fn linear(alpha_ms: f64, beta_ms: f64, slo_ms: f64) -> ModelSpec {
        ModelSpec::linear("m", alpha_ms, beta_ms, slo_ms).expect("a valid model")
    }

    #[test]
    fn demand_is_each_models_rate_at_the_largest_batch_its_slo_lets_gather() {
        // l(b) = 1 ms·b + 4 ms, SLO 100 ms. At 10 000 rps a batch gathers in
        // (b − 1)/10 ms: the largest with b + 4 + (b − 1)/10 ≤ 100 is 87,
        // which takes 91 ms: 10 000·0.091/87 GPUs.
        let m = linear(1.0, 4.0, 100.0);
        let d = demand_gpus(std::slice::from_ref(&m), &[10_000.0]);
        assert!((d - 10_000.0 * 0.091 / 87.0).abs() < 1e-9, "{d}");
        // At 100 rps only 10·(b − 1) + b + 4 ≤ 100 gathers: b = 9, 13 ms
        // for 9 (the first request opens the window; 9 gaps would not fit).
        let d = demand_gpus(std::slice::from_ref(&m), &[100.0]);
        assert!((d - 100.0 * 0.013 / 9.0).abs() < 1e-9, "{d}");
        // A lone request per window: 10 rps, 100 ms gaps, batch 1.
        let d = demand_gpus(std::slice::from_ref(&m), &[10.0]);
        assert!((d - 10.0 * 0.005).abs() < 1e-9, "{d}");
        // Per request, a slow model costs more GPU time than a busy one.
        assert!(demand_gpus(std::slice::from_ref(&m), &[100.0]) / 100.0 > demand_gpus(std::slice::from_ref(&m), &[10_000.0]) / 10_000.0);
        // Models add; absent, zero, negative and non-finite rates are 0.
        let two = [m.clone(), linear(2.0, 10.0, 200.0)];
        let sum = demand_gpus(&two, &[10_000.0, 500.0]);
        assert!((sum - demand_gpus(&two[..1], &[10_000.0]) - demand_gpus(&two[1..], &[500.0])).abs() < 1e-12);
        assert_eq!(demand_gpus(&two, &[0.0, f64::NAN]), 0.0);
        assert_eq!(demand_gpus(&two, &[-5.0]), 0.0);
        assert!(demand_gpus(&two, &[f64::INFINITY, 1e300]).is_finite());
    }

    #[test]
    fn the_demand_sets_the_target_when_the_idle_fraction_hides_it() {
        let demand = |d: f64, bad_rate: f64| Signals { bad_rate, idle_fraction: 0.0, demand_gpus: Some(d) };
        let mut a = Autoscaler::new(AutoscaleConfig { headroom: 0.2, ..cfg() });
        // 40 GPUs all busy (deferred spreads smaller batches over them), a
        // demand of 16: 16/0.8 = 20 stay.
        let d = a.decide(at(0), demand(16.0, 0.0), &serving(40, 0.0));
        assert_eq!((d.add, d.drain.len()), (0, 20));
        assert_eq!(a.target(demand(16.0, 0.0), 40), 20);
        // A demand over the cluster adds before anything is lost.
        assert_eq!(a.decide(at(1), demand(24.0, 0.0), &serving(20, 0.0)).add, 10);
        // Losing requests adds the paper's N·r/(1−r) when that is more.
        assert_eq!(a.decide(at(2), demand(8.0, 0.5), &serving(20, 0.0)).add, 20);
        // ... but not while the demand is over the GPUs serving: those
        // losses are the wait for the GPUs joining. 20 serving, a demand of
        // 24 (30 GPUs), half lost: 30, not 20 + 20.
        assert_eq!(a.target(demand(24.0, 0.5), 20), 30);
        let mut a = Autoscaler::new(AutoscaleConfig { headroom: 0.2, ..cfg() });
        let mut m = serving(20, 0.0);
        m.extend((20..30).map(|gpu| GpuMember { gpu, phase: GpuPhase::Joining { ready_at: at(9) }, idle_fraction: 1.0 }));
        let d = a.decide(at(3), demand(24.0, 0.5), &m);
        assert_eq!((d.add, d.held_by), (0, Some(Hold::Joining)));
        // They joined: the losses reported next were still the wait.
        assert_eq!(a.decide(at(4), demand(24.0, 0.3), &serving(30, 0.0)).add, 0);
        // One interval later losses at the demand add again: 30·0.25/0.75.
        assert_eq!(a.decide(at(5), demand(24.0, 0.25), &serving(30, 0.0)).add, 10);

        // Bounds hold; a demand that is not a number is not a signal.
        let b = Autoscaler::new(AutoscaleConfig { min_gpus: 4, max_gpus: 30, ..cfg() });
        assert_eq!(b.target(demand(0.0, 0.0), 10), 4);
        assert_eq!(b.target(demand(1e12, 0.0), 10), 30);
        assert_eq!(b.target(Signals { demand_gpus: Some(f64::NAN), ..QUIET }, 8), 4);
    }

    #[test]
    fn a_count_that_lost_at_its_own_demand_is_not_returned_to_while_the_demand_stays() {
        let cfg = AutoscaleConfig { headroom: 0.3, min_gpus: 2, stabilisation: Duration::from_millis(4000), ..cfg() };
        let sig = |d: f64, bad_rate: f64| Signals { bad_rate, idle_fraction: 0.3, demand_gpus: Some(d) };
        let joining = |serving: u32| {
            let mut m = self::serving(serving, 0.3);
            m.push(GpuMember { gpu: serving, phase: GpuPhase::Joining { ready_at: at(100) }, idle_fraction: 1.0 });
            m
        };
        // The live controller's peak: a demand of 1.3 targets 2 (1.3/0.7),
        // and 2 lose 3%, where 1 GPU would not carry 1.3 either.
        let mut a = Autoscaler::new(cfg.clone());
        assert_eq!(a.decide(at(0), sig(1.3, 0.03), &serving(2, 0.3)).add, 1);
        assert_eq!(a.decide(at(1), sig(1.3, 0.0), &joining(2)).add, 0);
        // Long past the stabilisation window, the demand's target still 2:
        // 3 stay.
        for s in 2..20 {
            let d = a.decide(at(s), sig(1.3, 0.0), &serving(3, 0.5));
            assert!(d.drain.is_empty() && d.add == 0, "at {s} s: {d:?}");
        }
        // 3 lose at a demand of 1.5, which 2 do not carry: a fourth, kept
        // while the demand stays over 1.4; below it 3 stay, not 2.
        assert_eq!(a.decide(at(20), sig(1.5, 0.03), &serving(3, 0.3)).add, 1);
        assert!(a.decide(at(21), sig(1.5, 0.0), &serving(4, 0.5)).drain.is_empty());
        assert_eq!(a.decide(at(30), sig(1.3, 0.0), &serving(4, 0.5)).drain.len(), 1);
        assert!(a.decide(at(40), sig(1.3, 0.0), &serving(3, 0.5)).drain.is_empty());
        // The demand falls to what one GPU carries (0.6 <= 0.7): the mark
        // goes, and after the window the third GPU with it.
        assert!(a.decide(at(41), sig(0.6, 0.0), &serving(3, 0.8)).drain.is_empty());
        assert_eq!(a.decide(at(44), sig(0.6, 0.0), &serving(3, 0.8)).drain.len(), 1);
        // Marks are bounded; the floor is the largest.
        for n in 10..40 {
            a.decide(at(60 + u64::from(n)), sig(f64::from(n) * 0.69, 0.03), &serving(n, 0.0));
        }
        assert_eq!((a.lost_at.len(), a.lost_at.last()), (LOSS_MARKS, Some(&39)));
        assert!(a.lost_at.windows(2).all(|w| w[0] < w[1]));

        // A loss at a demand 1 GPU carries (a host stall at low load) adds
        // by the paper's rule and is drained after the window as before.
        let mut a = Autoscaler::new(cfg.clone());
        assert_eq!(a.decide(at(0), sig(0.35, 0.03), &serving(2, 0.8)).add, 1);
        assert!(a.decide(at(2), sig(0.35, 0.0), &serving(3, 0.9)).drain.is_empty());
        assert_eq!(a.decide(at(4), sig(0.35, 0.0), &serving(3, 0.9)).drain.len(), 1);

        // Losses while the demand's GPUs join are their wait: no mark.
        let mut a = Autoscaler::new(cfg);
        assert_eq!(a.decide(at(0), sig(1.6, 0.2), &serving(2, 0.0)).add, 1);
        assert_eq!(a.decide(at(1), sig(1.3, 0.2), &joining(2)).add, 0);
        assert!(a.decide(at(2), sig(1.3, 0.0), &serving(3, 0.5)).drain.is_empty());
        assert_eq!(a.decide(at(5), sig(1.3, 0.0), &serving(3, 0.5)).drain.len(), 1);
    }

    #[test]
    fn the_interval_target_reads_the_latest_interval_only() {
        let m = linear(1.0, 4.0, 100.0);
        let mut t = IntervalTarget::new(cfg(), vec![m.clone()], Duration::from_millis(5000));
        let c = |received: u64, dropped: u64, busy_s: u64, online_s: u64, outcomes: u64| Counters {
            received,
            dropped,
            planned_busy_ns: busy_s * 1_000_000_000,
            gpu_online_ns: online_s * 1_000_000_000,
            per_model: vec![outcomes],
        };
        assert_eq!(t.observe(at(0), c(0, 0, 0, 0, 0), 8), None);
        // A first busy interval: 10 000 rps for 10 s on 8 GPUs.
        let r = t.observe(at(10), c(100_000, 0, 80, 80, 100_000), 8).expect("an interval closed");
        let busy = demand_gpus(std::slice::from_ref(&m), &[10_000.0]);
        assert!((r.demand_gpus - busy).abs() < 1e-9);
        assert_eq!(r.desired_gpus, busy.ceil() as u32);
        // Read again within the interval: the same reading.
        assert_eq!(t.observe(at(12), c(120_000, 0, 96, 96, 120_000), 8), Some(r));
        // The load falls to 100 rps: the target falls with it at once,
        // whatever the counts since start say.
        let r2 = t.observe(at(20), c(101_000, 0, 88, 160, 101_000), 8).expect("closed");
        assert_eq!(r2.desired_gpus, 1);
        assert!(r2.demand_gpus < 0.5 && r2.signals.bad_rate == 0.0);
        // Counters that went backwards (a restarted scheduler) close
        // nothing: the last reading stands, the next interval starts there.
        assert_eq!(t.observe(at(30), c(10, 0, 0, 0, 10), 8), Some(r2));
        let r3 = t.observe(at(40), c(100_010, 50_000, 80, 80, 100_010), 8).expect("closed");
        // Half dropped on 8 GPUs while the demand asks for 11: the losses
        // are the wait for those, the target the demand's.
        assert_eq!((r3.signals.bad_rate, r3.desired_gpus), (0.5, busy.ceil() as u32));
        // Half dropped on 12, over the demand: the paper's rule adds
        // 12·0.5/0.5 on top of 12.
        let r4 = t.observe(at(50), c(200_010, 100_000, 160, 160, 200_010), 12).expect("closed");
        assert_eq!((r4.signals.bad_rate, r4.desired_gpus), (0.5, 24));
    }

    #[test]
    fn scale_in_drains_the_gpus_consolidation_left_idle() {
        // Deferred's shape: low ids busy, high ids idle.
        let m: Vec<GpuMember> =
            (0..8).map(|gpu| GpuMember { gpu, phase: GpuPhase::Serving, idle_fraction: if gpu < 4 { 0.1 } else { 1.0 } }).collect();
        assert_eq!(pick_drain(&m, 3), vec![7, 6, 5]);
        // The idlest first whatever its id; joining and draining GPUs never.
        let mut m = serving(4, 0.2);
        m[1].idle_fraction = 0.9;
        m[3].phase = GpuPhase::Draining;
        m.push(GpuMember { gpu: 4, phase: GpuPhase::Joining { ready_at: at(1) }, idle_fraction: 1.0 });
        assert_eq!(pick_drain(&m, 2), vec![1, 2]);
        assert_eq!(pick_drain(&m, 10), vec![1, 2, 0]);
    }
}
