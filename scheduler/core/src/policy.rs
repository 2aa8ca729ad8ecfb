//! Every policy behind one constructor, so the simulator, the CLI and the
//! benchmarks run them all the same way.

use crate::baselines::{Algorithm1Scheduler, ClockworkConfig, ClockworkScheduler, DropMode, EagerScheduler, LatestStartScheduler, NexusConfig, NexusScheduler, Rank, ShepherdScheduler};
use crate::deferred::{CoreConfig, DeferredScheduler, DepartureSet, Gather};
use crate::netdelay::NetworkDelay;
use crate::types::Scheduler;
use crate::zoo::ModelSpec;
use dataplane::time::Duration;
use std::fmt;

/// Which policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyKind {
    /// Symphony's deferred batch scheduling.
    Deferred,
    /// Eager: work-conserving earliest-deadline-first, dispatched as soon
    /// as a GPU is free.
    Eager,
    /// TF-Serving style: full batch or the oldest waited `k` (per model).
    Timeout,
    /// Clockwork's controller: schedule-ahead, power-of-two batches, a
    /// safety margin.
    Clockwork,
    /// Clockwork's controller with any batch size (the Symphony authors'
    /// fairness variant).
    ClockworkAny,
    /// Shepherd-style largest-batch-first with preemption.
    Shepherd,
    /// Shepherd's Flex without preemption: the largest candidate whose
    /// head's deadline holds runs on a free GPU; running batches finish.
    ShepherdFlex,
    /// Nexus epoch squishy bin packing with per-GPU round robin.
    Nexus,
    /// Eager EDF with Nexus's early-drop sliding window.
    EagerEarly,
    /// Eager, the largest feasible batch of the model whose latest start
    /// is the earliest ([`crate::baselines::latest_start`]), lazy drop.
    EagerLatestStart,
    /// [`PolicyKind::EagerLatestStart`] with early drop.
    EagerLatestStartEarly,
    /// Clockwork as the Symphony paper describes it: the earliest
    /// latest-executable moment over every model and batch size.
    ClockworkPaper,
    /// The Symphony paper's Algorithm 1 as written, with Appendix D's
    /// network delay ([`crate::baselines::algorithm1`]): deferred without
    /// its departures.
    Algorithm1,
}

impl PolicyKind {
    /// Every policy, in report order.
    pub const ALL: [PolicyKind; 13] = [
        PolicyKind::Deferred,
        PolicyKind::Clockwork,
        PolicyKind::ClockworkAny,
        PolicyKind::Shepherd,
        PolicyKind::ShepherdFlex,
        PolicyKind::Timeout,
        PolicyKind::Nexus,
        PolicyKind::Eager,
        PolicyKind::EagerEarly,
        PolicyKind::EagerLatestStart,
        PolicyKind::EagerLatestStartEarly,
        PolicyKind::ClockworkPaper,
        PolicyKind::Algorithm1,
    ];

    /// Parses a policy name.
    pub fn parse(s: &str) -> Result<Self, PolicyError> {
        Ok(match s {
            "deferred" | "symphony" => PolicyKind::Deferred,
            "eager" => PolicyKind::Eager,
            "timeout" => PolicyKind::Timeout,
            "clockwork" => PolicyKind::Clockwork,
            "clockwork-any" => PolicyKind::ClockworkAny,
            "shepherd" => PolicyKind::Shepherd,
            "shepherd-flex" => PolicyKind::ShepherdFlex,
            "nexus" => PolicyKind::Nexus,
            "eager-early" => PolicyKind::EagerEarly,
            "eager-latest-start" => PolicyKind::EagerLatestStart,
            "eager-latest-start-early" => PolicyKind::EagerLatestStartEarly,
            "clockwork-paper" => PolicyKind::ClockworkPaper,
            "algorithm1" => PolicyKind::Algorithm1,
            other => return Err(PolicyError::Unknown { name: other.to_string() }),
        })
    }

    /// The policy's name.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::Deferred => "deferred",
            PolicyKind::Eager => "eager",
            PolicyKind::Timeout => "timeout",
            PolicyKind::Clockwork => "clockwork",
            PolicyKind::ClockworkAny => "clockwork-any",
            PolicyKind::Shepherd => "shepherd",
            PolicyKind::ShepherdFlex => "shepherd-flex",
            PolicyKind::Nexus => "nexus",
            PolicyKind::EagerEarly => "eager-early",
            PolicyKind::EagerLatestStart => "eager-latest-start",
            PolicyKind::EagerLatestStartEarly => "eager-latest-start-early",
            PolicyKind::ClockworkPaper => "clockwork-paper",
            PolicyKind::Algorithm1 => "algorithm1",
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a policy could not be chosen or built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// The name is not a policy.
    #[error("unknown policy '{name}' (deferred, clockwork, clockwork-any, clockwork-paper, shepherd, shepherd-flex, timeout, nexus, eager, eager-early, eager-latest-start, eager-latest-start-early, algorithm1)")]
    Unknown {
        /// The name given.
        name: String,
    },
    /// No model or no GPU to schedule.
    #[error("a policy needs at least one model and one GPU (got {models} models, {gpus} GPUs)")]
    EmptyCluster {
        /// Models given.
        models: usize,
        /// GPUs given.
        gpus: u32,
    },
}


/// A policy and its knobs.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyConfig {
    /// Which policy.
    pub kind: PolicyKind,
    /// Batch gathering for deferred scheduling.
    pub gather: Gather,
    /// The timeout policy's `k` for every model without one in `timeouts`.
    pub timeout: Duration,
    /// The timeout policy's `k` per model (model id = index), e.g. from
    /// [`crate::goodput::best_timeouts`]; empty: `timeout`.
    pub timeouts: Vec<Duration>,
    /// Network delay bound charged before each batch.
    pub delay: NetworkDelay,
    /// Deferred: the narrowest schedulable window (see [`CoreConfig::min_window`]).
    pub min_window: Duration,
    /// Deferred: the window is at least this many inter-arrival gaps wide.
    pub window_gaps: f64,
    /// Deferred early drop: fraction of the target batch's throughput per GPU below which heads are dropped.
    pub early_drop_fraction: f64,
    /// Deferred: stop deferring within this fraction of the best efficiency.
    pub efficiency_slack: f64,
    /// Deferred: which departures from Algorithm 1 are on.
    pub departures: DepartureSet,
    /// Nexus: number of routing frontends.
    pub nexus_frontends: u32,
    /// Nexus: epoch length for re-planning.
    pub nexus_epoch: Duration,
    /// Nexus: relay overflow to backup GPUs.
    pub nexus_backups: bool,
    /// Nexus: plan over every GPU (rates scaled up to the cluster); off: the fewest GPUs.
    pub nexus_fill_cluster: bool,
}

impl PolicyConfig {
    /// Defaults for `kind`.
    pub fn new(kind: PolicyKind) -> Self {
        PolicyConfig {
            kind,
            gather: Gather::Early,
            timeout: Duration::from_millis(5),
            timeouts: Vec::new(),
            delay: NetworkDelay::ZERO,
            min_window: crate::deferred::DEFAULT_MIN_WINDOW,
            window_gaps: crate::deferred::DEFAULT_WINDOW_GAPS,
            early_drop_fraction: crate::deferred::DEFAULT_EARLY_DROP_FRACTION,
            efficiency_slack: crate::deferred::DEFAULT_EFFICIENCY_SLACK,
            departures: DepartureSet::default(),
            nexus_frontends: 1,
            nexus_epoch: Duration::from_millis(10_000),
            nexus_backups: true,
            nexus_fill_cluster: true,
        }
    }
}

/// Builds the policy for `models` (id = index) on `gpus` GPUs.
pub fn build(models: &[ModelSpec], gpus: u32, cfg: &PolicyConfig) -> Result<Box<dyn Scheduler>, PolicyError> {
    if models.is_empty() || gpus == 0 {
        return Err(PolicyError::EmptyCluster { models: models.len(), gpus });
    }
    let core = CoreConfig { gather: cfg.gather, delay: cfg.delay, min_window: cfg.min_window, window_gaps: cfg.window_gaps, early_drop_fraction: cfg.early_drop_fraction, efficiency_slack: cfg.efficiency_slack, priority_reserve: Duration::ZERO, departures: cfg.departures };
    Ok(match cfg.kind {
        PolicyKind::Deferred => Box::new(DeferredScheduler::new(models, gpus, core)),
        PolicyKind::Eager => Box::new(EagerScheduler::eager(models, gpus, cfg.delay)),
        PolicyKind::Timeout => {
            let ks: Vec<Duration> = (0..models.len()).map(|m| cfg.timeouts.get(m).copied().unwrap_or(cfg.timeout)).collect();
            Box::new(EagerScheduler::timeout(models, gpus, cfg.delay, &ks))
        }
        PolicyKind::Clockwork => Box::new(ClockworkScheduler::new(models, gpus, ClockworkConfig { delay: cfg.delay, ..ClockworkConfig::default() })),
        PolicyKind::ClockworkAny => {
            Box::new(ClockworkScheduler::new(models, gpus, ClockworkConfig { delay: cfg.delay, pow2_batches: false, ..ClockworkConfig::default() }))
        }
        PolicyKind::Shepherd => Box::new(ShepherdScheduler::new(models, gpus, cfg.delay)),
        PolicyKind::ShepherdFlex => Box::new(ShepherdScheduler::preemption_free(models, gpus, cfg.delay)),
        PolicyKind::EagerEarly => Box::new(EagerScheduler::eager_early_drop(models, gpus, cfg.delay)),
        PolicyKind::EagerLatestStart => Box::new(LatestStartScheduler::new(models, gpus, cfg.delay, Rank::LatestStart, DropMode::Lazy)),
        PolicyKind::EagerLatestStartEarly => Box::new(LatestStartScheduler::new(models, gpus, cfg.delay, Rank::LatestStart, DropMode::Early)),
        PolicyKind::ClockworkPaper => Box::new(LatestStartScheduler::new(models, gpus, cfg.delay, Rank::ClockworkPaper, DropMode::Lazy)),
        PolicyKind::Algorithm1 => Box::new(Algorithm1Scheduler::new(models, gpus, cfg.delay)),
        PolicyKind::Nexus => Box::new(NexusScheduler::new(
            models,
            gpus,
            NexusConfig { delay: cfg.delay, frontends: cfg.nexus_frontends, epoch: cfg.nexus_epoch, rates: None, backups: cfg.nexus_backups, fill_cluster: cfg.nexus_fill_cluster, ..NexusConfig::default() },
        )),
    })
}
