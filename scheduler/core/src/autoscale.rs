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
//! - a **stabilisation window** for scale-in: the target is the largest
//!   (most conservative) one recommended over the window, so one quiet
//!   interval in a busy period removes nothing (as Kubernetes' HPA
//!   `scaleDown.stabilizationWindowSeconds`). Scale-out acts at once:
//!   losing requests is worse than paying for a GPU;
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
//! - local processes (`symphony up --autoscale`, not built yet): `add_gpus`
//!   would start backend processes (their GPUs join matchmaking once the
//!   backend registered and warmed its models; the join time is the time
//!   to registration, which the backend logs as `join_ms`), `drain_gpus`
//!   would send each backend SIGTERM, its graceful leave (built: the
//!   backend tells the scheduler it drains, the scheduler plans nothing
//!   more on its GPUs and releases it once every batch planned there was
//!   reported, then it exits; issue 52) and `members` would read the
//!   scheduler's live membership;
//! - Kubernetes (not built yet): `add_gpus` would raise the backend
//!   StatefulSet's `replicas` through the API (RBAC: `get`/`patch` on
//!   `statefulsets/scale`), and `drain_gpus` would drain the highest
//!   ordinals first, since a StatefulSet removes the highest ordinals on
//!   scale-down and deferred idles the highest GPU ids: the scheduler maps
//!   ordinals to GPU ids in order, so the two agree. The same advice can be
//!   exported instead as an external metric for HPA or KEDA.

use crate::sim::AutoscaleAdvice;
use crate::types::GpuId;
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

/// What owns the GPUs: adds, drains and reports them. Implemented by the
/// simulator now; by local backend processes and Kubernetes later (see
/// the module documentation).
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

/// The controller: the paper's rule and the knobs of [`AutoscaleConfig`].
#[derive(Clone, Debug)]
pub struct Autoscaler {
    cfg: AutoscaleConfig,
    /// `(time, recommended GPUs)` inside the stabilisation window.
    recommendations: VecDeque<(Instant, u32)>,
    last_action: Option<Instant>,
}

impl Autoscaler {
    /// A controller with `cfg` (`min_gpus` at least 1, `max_step` at least
    /// 1, `max_gpus` at least `min_gpus`).
    pub fn new(mut cfg: AutoscaleConfig) -> Self {
        cfg.min_gpus = cfg.min_gpus.max(1);
        cfg.max_gpus = cfg.max_gpus.max(cfg.min_gpus);
        cfg.max_step = cfg.max_step.max(1);
        Autoscaler { cfg, recommendations: VecDeque::with_capacity(64), last_action: None }
    }

    /// The knobs.
    pub fn config(&self) -> &AutoscaleConfig {
        &self.cfg
    }

    /// Decides at `now` on the last interval's `signals` and the provider's
    /// `members`. Pure apart from the window and the cool-down it keeps.
    pub fn decide(&mut self, now: Instant, signals: Signals, members: &[GpuMember]) -> ScaleDecision {
        let serving = members.iter().filter(|m| m.phase == GpuPhase::Serving).count() as u32;
        let joining = members.iter().filter(|m| matches!(m.phase, GpuPhase::Joining { .. })).count() as u32;
        let advice = AutoscaleAdvice::new(serving, signals.bad_rate, signals.idle_fraction, self.cfg.bad_rate_threshold);
        let mut decision = ScaleDecision { advice: advice.clone(), add: 0, drain: Vec::new(), held_by: None };
        let cfg = &self.cfg;
        // The cluster that counts against the bounds: GPUs draining are on
        // their way out and no longer count.
        let current = serving + joining;
        // Rounded up (down for removal) past a float's error, so that
        // `8·0.2/0.8` adds 2, not 3.
        let n = f64::from(serving);
        let raw = if advice.add_gpus > 0.0 {
            serving.saturating_add((advice.add_gpus - 1e-9).ceil() as u32)
        } else if signals.bad_rate <= cfg.bad_rate_threshold && signals.idle_fraction < cfg.min_idle && serving > 0 {
            serving.saturating_add((n * (cfg.headroom - signals.idle_fraction) - 1e-9).ceil().max(0.0) as u32)
        } else {
            let remove = (advice.remove_gpus - cfg.headroom * n + 1e-9).max(0.0).floor() as u32;
            serving - remove.min(serving)
        };
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
            let in_cooldown = self.last_action.is_some_and(|t| now.saturating_since(t) < cfg.cooldown);
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

    const QUIET: Signals = Signals { bad_rate: 0.0, idle_fraction: 0.5 };

    #[test]
    fn the_papers_rule_adds_n_r_over_1_minus_r_and_removes_n_f() {
        let mut a = Autoscaler::new(cfg());
        // r = 0.2 on 8 GPUs: 8 * 0.2 / 0.8 = 2 more.
        let d = a.decide(at(0), Signals { bad_rate: 0.2, idle_fraction: 0.0 }, &serving(8, 0.0));
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
        assert_eq!(a.decide(at(0), Signals { bad_rate: 0.0, idle_fraction: 0.02 }, &serving(20, 0.02)).add, 2);
        // Between min_idle and the headroom nothing changes.
        let d = a.decide(at(1), Signals { bad_rate: 0.0, idle_fraction: 0.07 }, &serving(22, 0.07));
        assert_eq!((d.add, d.drain.len()), (0, 0));
        // Losing requests: the paper's rule, 20 * 0.5 / 0.5.
        assert_eq!(a.decide(at(2), Signals { bad_rate: 0.5, idle_fraction: 0.0 }, &serving(20, 0.0)).add, 20);
    }

    #[test]
    fn scale_in_waits_for_the_stabilisation_window() {
        let mut a = Autoscaler::new(AutoscaleConfig { stabilisation: Duration::from_millis(30000), ..cfg() });
        // A busy interval recommends all 8; the quiet ones after it
        // recommend 4, but the window still holds the 8.
        assert!(a.decide(at(0), Signals { bad_rate: 0.0, idle_fraction: 0.0 }, &serving(8, 0.0)).drain.is_empty());
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
        assert_eq!(a.decide(at(6), Signals { bad_rate: 0.5, idle_fraction: 0.0 }, &serving(8, 0.0)).add, 8);
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
        let d = a.decide(at(1), Signals { bad_rate: 0.0, idle_fraction: 0.9 }, &serving(6, 0.9));
        assert!(d.drain.is_empty());
        assert_eq!(d.held_by, Some(Hold::Bounds));
        // r = 0.5 on 8 asks for 8 more; the maximum allows 2.
        assert_eq!(a.decide(at(2), Signals { bad_rate: 0.5, idle_fraction: 0.0 }, &serving(8, 0.0)).add, 2);
        let d = a.decide(at(3), Signals { bad_rate: 0.5, idle_fraction: 0.0 }, &serving(10, 0.0));
        assert_eq!((d.add, d.held_by), (0, Some(Hold::Bounds)));
        // Below the minimum it adds back up to it, whatever the signals.
        assert_eq!(a.decide(at(4), QUIET, &serving(3, 0.5)).add, 3);
    }

    #[test]
    fn the_step_limit_caps_each_action() {
        let mut a = Autoscaler::new(AutoscaleConfig { max_step: 3, ..cfg() });
        let d = a.decide(at(0), Signals { bad_rate: 0.5, idle_fraction: 0.0 }, &serving(10, 0.0));
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
        let d = a.decide(at(0), Signals { bad_rate: 0.2, idle_fraction: 0.0 }, &m);
        assert_eq!((d.add, d.held_by), (0, Some(Hold::Joining)));
        // r = 0.5 asks for 8: 6 more.
        assert_eq!(a.decide(at(1), Signals { bad_rate: 0.5, idle_fraction: 0.0 }, &m).add, 6);
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
