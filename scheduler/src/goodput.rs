//! Goodput: the highest total offered rate at which every model's bad rate
//! stays at or under a threshold (1%), found by bisection on simulated runs.

use crate::policy::{build, PolicyConfig, PolicyError};
use crate::sim::{simulate, InvariantViolation, SimConfig, SimReport};
use serde::Serialize;

/// Search knobs.
#[derive(Clone, Debug)]
pub struct GoodputSearch {
    /// A rate passes when every model's bad rate is at or under this.
    pub max_bad_rate: f64,
    /// Stop when the bracket is narrower than this fraction of its top.
    pub rel_precision: f64,
    /// Initial guess (0: derive from the cluster's ideal throughput).
    pub initial_rps: f64,
    /// At most this many simulations.
    pub max_runs: u32,
    /// Each probe measures at least this many requests of every model (by
    /// the offered rate and the popularity), times the arrivals' squared
    /// gap CV when above 1: a low rate runs longer, up to [`MAX_STRETCH`]
    /// times the base's measured span (0: the base's span at every rate).
    /// With 100 requests one drop is already 1%, so a bar of 1% judged on
    /// a few seconds of a low rate passes or fails on single drops; every
    /// policy gets the same stretched runs. Bursty arrivals drop in
    /// clusters (a burst too big for the cluster loses several requests at
    /// once), so the count of independent events behind a bad rate is the
    /// count of bursts, about the requests over the index of dispersion
    /// ([`crate::sim::Arrival::gap_cv2`]).
    pub min_requests_per_model: u64,
}

/// The longest stretch of a probe's measured span (see
/// [`GoodputSearch::min_requests_per_model`]). It only bounds probes at
/// rates near zero: the cost of a run follows its requests, which the
/// minimum bounds.
pub const MAX_STRETCH: f64 = 10_000.0;

impl Default for GoodputSearch {
    fn default() -> Self {
        GoodputSearch { max_bad_rate: 0.01, rel_precision: 0.005, initial_rps: 0.0, max_runs: 40, min_requests_per_model: 0 }
    }
}

/// Why a goodput search stopped.
#[derive(Debug, thiserror::Error)]
pub enum GoodputError {
    /// The policy could not be built.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// A simulated run broke an invariant.
    #[error("simulating {rate_rps:.1} rps: {source}")]
    Simulation {
        /// The offered rate of the failing run.
        rate_rps: f64,
        /// The invariant.
        source: InvariantViolation,
    },
}


/// The search's answer.
#[derive(Clone, Debug, Serialize)]
pub struct GoodputResult {
    /// Highest passing rate found.
    pub goodput_rps: f64,
    /// The run at that rate.
    pub at_goodput: Option<SimReport>,
    /// `(offered_rps, max model bad rate, passed)` of every probe, in order.
    pub probes: Vec<(f64, f64, bool)>,
}

/// An upper bound on the cluster's throughput: every GPU running the
/// largest batch that fits each model's SLO, weighted by popularity.
pub fn ideal_throughput(cfg: &SimConfig) -> f64 {
    let shares = cfg.workload.popularity.shares(cfg.models.len());
    // Time per request of the mix at best batch sizes.
    let mut secs_per_req = 0.0;
    for (m, s) in cfg.models.iter().zip(shares) {
        let b = m.profile.max_batch_within(m.slo, dataplane::time::Duration::ZERO, u32::MAX).max(1);
        secs_per_req += s / m.profile.throughput_rps(b);
    }
    if secs_per_req > 0.0 {
        f64::from(cfg.gpus) / secs_per_req
    } else {
        0.0
    }
}

/// The run length at `rate` that measures at least `min_requests` of the
/// least popular model, never shorter than the base's and its measured
/// span at most [`MAX_STRETCH`] times the base's.
fn stretched(base: &SimConfig, rate: f64, min_requests: u64) -> dataplane::time::Duration {
    let measured = base.duration.saturating_sub(base.warmup).as_secs_f64();
    let share = base.workload.popularity.shares(base.models.len()).into_iter().filter(|s| *s > 0.0).fold(f64::INFINITY, f64::min);
    if min_requests == 0 || rate <= 0.0 || !share.is_finite() || measured <= 0.0 {
        return base.duration;
    }
    let min_requests = min_requests as f64 * base.workload.arrival.gap_cv2().max(1.0);
    let need = (min_requests / (rate * share)).min(measured * MAX_STRETCH);
    if need <= measured {
        return base.duration;
    }
    base.warmup + dataplane::time::Duration::from_secs_f64(need)
}

/// Bisects the offered rate of `base` (its `workload.rate_rps` is ignored)
/// under `policy`. `progress` is told `(run, of_at_most, rate, passed)`.
pub fn search(
    base: &SimConfig,
    policy: &PolicyConfig,
    knobs: &GoodputSearch,
    progress: &mut dyn FnMut(u32, u32, f64, bool),
) -> Result<GoodputResult, GoodputError> {
    let mut probes = Vec::new();
    let mut runs = 0;
    let mut run = |rate: f64, probes: &mut Vec<(f64, f64, bool)>| -> Result<(bool, SimReport), GoodputError> {
        let mut cfg = base.clone();
        cfg.workload.rate_rps = rate;
        cfg.duration = stretched(base, rate, knobs.min_requests_per_model);
        let mut sched = build(&cfg.models, cfg.gpus, policy)?;
        let r = simulate(&cfg, sched.as_mut()).map_err(|source| GoodputError::Simulation { rate_rps: rate, source })?;
        let ok = r.max_model_bad_rate <= knobs.max_bad_rate && r.offered > 0;
        probes.push((rate, r.max_model_bad_rate, ok));
        runs += 1;
        progress(runs, knobs.max_runs, rate, ok);
        Ok((ok, r))
    };
    let ceiling = ideal_throughput(base);
    let mut hi = if knobs.initial_rps > 0.0 { knobs.initial_rps } else { ceiling.max(1.0) };
    let mut lo = 0.0;
    let mut best: Option<SimReport> = None;
    // Bracket: the ceiling normally fails; if it passes, grow.
    loop {
        let (ok, r) = run(hi, &mut probes)?;
        if !ok {
            break;
        }
        lo = hi;
        best = Some(r);
        hi *= 1.5;
        if probes.len() as u32 >= knobs.max_runs {
            break;
        }
    }
    if lo == 0.0 {
        // Find a passing lower bound by halving.
        let mut probe = hi / 2.0;
        while probe > 1e-3 && (probes.len() as u32) < knobs.max_runs {
            let (ok, r) = run(probe, &mut probes)?;
            if ok {
                lo = probe;
                best = Some(r);
                break;
            }
            hi = probe;
            probe /= 2.0;
        }
    }
    while lo > 0.0 && (hi - lo) > knobs.rel_precision * hi && (probes.len() as u32) < knobs.max_runs {
        let mid = 0.5 * (lo + hi);
        let (ok, r) = run(mid, &mut probes)?;
        if ok {
            lo = mid;
            best = Some(r);
        } else {
            hi = mid;
        }
    }
    Ok(GoodputResult { goodput_rps: lo, at_goodput: best, probes })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{Arrival, Popularity, RateSchedule, Workload};
    use crate::zoo::ModelSpec;
    use dataplane::time::Duration;

    fn base(arrival: Arrival) -> SimConfig {
        let models = vec![ModelSpec::linear("a", 1.0, 5.0, 20.0).unwrap(), ModelSpec::linear("b", 1.0, 5.0, 20.0).unwrap()];
        SimConfig {
            models,
            gpus: 2,
            workload: Workload { rate_rps: 0.0, arrival, popularity: Popularity::Equal, schedule: RateSchedule::default() },
            duration: Duration::from_millis(6000),
            warmup: Duration::from_millis(1000),
            seed: 1,
            trace: None,
            admission: Default::default(),
        }
    }

    #[test]
    fn a_probe_measures_the_minimum_scaled_by_the_gaps_dispersion() {
        // 100 rps over two models: 50 per model per second.
        let poisson = stretched(&base(Arrival::Poisson), 100.0, 2000);
        assert_eq!(poisson, Duration::from_millis(41_000));
        let bursty = stretched(&base(Arrival::Gamma(0.2)), 100.0, 2000);
        assert_eq!(bursty, Duration::from_millis(201_000));
        // Constant gaps are not shortened below the Poisson count.
        assert_eq!(stretched(&base(Arrival::Uniform), 100.0, 2000), poisson);
        // A high rate keeps the base span; 0 turns stretching off.
        assert_eq!(stretched(&base(Arrival::Gamma(0.2)), 1e6, 2000), Duration::from_millis(6000));
        assert_eq!(stretched(&base(Arrival::Gamma(0.2)), 100.0, 0), Duration::from_millis(6000));
        // A rate near zero stops at the cap.
        let cap = Duration::from_millis(1000) + Duration::from_secs_f64(5.0 * MAX_STRETCH);
        assert_eq!(stretched(&base(Arrival::Poisson), 1e-3, 2000), cap);
    }
}
