//! Goodput: the highest total offered rate at which every model's bad rate
//! stays at or under a threshold (1%), found by bisection on simulated runs.

use crate::policy::{build, PolicyConfig, PolicyError, PolicyKind};
use crate::sim::{simulate_until_failed, InvariantViolation, ProbeRun, SimConfig, SimReport};
use dataplane::time::Duration;
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
    /// With an initial guess: the bracket around it widens by this
    /// fraction of the rate, doubling per probe (0: as from the ceiling,
    /// 1.5x up and halving down). A guess from a neighbouring run (the
    /// same cell under another seed) is usually within a few percent, so
    /// a small step brackets it in one or two probes where halving from
    /// the ceiling takes six to eight.
    pub warm_step: f64,
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
    /// Stop a probe as soon as it is certain to fail
    /// ([`simulate_until_failed`]): the same passes and fails, so the same
    /// goodput, for less simulated time. A probe stopped early records the
    /// bad rate it had reached over all its measured requests, a lower bound
    /// on the full run's.
    pub stop_failed_probes: bool,
}

/// The longest stretch of a probe's measured span (see
/// [`GoodputSearch::min_requests_per_model`]). It only bounds probes at
/// rates near zero: the cost of a run follows its requests, which the
/// minimum bounds.
pub const MAX_STRETCH: f64 = 10_000.0;

impl Default for GoodputSearch {
    fn default() -> Self {
        GoodputSearch { max_bad_rate: 0.01, rel_precision: 0.005, initial_rps: 0.0, warm_step: 0.0, max_runs: 40, min_requests_per_model: 0, stop_failed_probes: true }
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
    /// `(offered_rps, max model bad rate, passed)` of every probe, in order
    /// (a failed probe stopped early: the bad rate it had reached; see
    /// [`GoodputSearch::stop_failed_probes`]).
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
    let found = bisect(base, policy, knobs, false, progress)?;
    // Without `to_beat` the search never gives up.
    Ok(found.unwrap_or(GoodputResult { goodput_rps: 0.0, at_goodput: None, probes: Vec::new() }))
}

/// [`search`] warmed at `incumbent` (a goodput to beat, with the knobs'
/// `warm_step`), answering only whether `policy` beats it: `None` when the
/// first probe, at `incumbent`, fails. A warm search whose first probe
/// fails only probes lower rates after it, so its goodput would be below
/// `incumbent`; the probes that would place it are skipped. When that
/// probe passes the answer is exactly [`search`]'s with `initial_rps` =
/// `incumbent`. Without a `warm_step` or an incumbent (0) it is
/// [`search`] with `knobs` as given, never `None`. For choosing the best
/// of many configurations (the timeout policy's `k`s), where most lose.
pub fn search_to_beat(
    base: &SimConfig,
    policy: &PolicyConfig,
    knobs: &GoodputSearch,
    incumbent: f64,
    progress: &mut dyn FnMut(u32, u32, f64, bool),
) -> Result<Option<GoodputResult>, GoodputError> {
    if incumbent <= 0.0 || knobs.warm_step <= 0.0 {
        return bisect(base, policy, knobs, false, progress);
    }
    bisect(base, policy, &GoodputSearch { initial_rps: incumbent, ..knobs.clone() }, true, progress)
}

/// The bisection of [`search`]; with `to_beat` (a warm search), `None`
/// once the first probe fails.
fn bisect(
    base: &SimConfig,
    policy: &PolicyConfig,
    knobs: &GoodputSearch,
    to_beat: bool,
    progress: &mut dyn FnMut(u32, u32, f64, bool),
) -> Result<Option<GoodputResult>, GoodputError> {
    let mut probes = Vec::new();
    let mut runs = 0;
    let mut run = |rate: f64, probes: &mut Vec<(f64, f64, bool)>| -> Result<(bool, Option<SimReport>), GoodputError> {
        let mut cfg = base.clone();
        cfg.workload.rate_rps = rate;
        cfg.duration = stretched(base, rate, knobs.min_requests_per_model);
        let mut sched = build(&cfg.models, cfg.gpus, policy)?;
        // Without early stops the bar is never crossed before the end (no
        // bad rate exceeds infinity): the run is the plain one.
        let bar = if knobs.stop_failed_probes { knobs.max_bad_rate } else { f64::INFINITY };
        let outcome = simulate_until_failed(&cfg, sched.as_mut(), bar).map_err(|source| GoodputError::Simulation { rate_rps: rate, source })?;
        let (ok, bad, report) = match outcome {
            ProbeRun::Completed(r) => (r.max_model_bad_rate <= knobs.max_bad_rate && r.offered > 0, r.max_model_bad_rate, Some(*r)),
            ProbeRun::Failed { bad_rate_at_least, .. } => (false, bad_rate_at_least, None),
        };
        probes.push((rate, bad, ok));
        runs += 1;
        progress(runs, knobs.max_runs, rate, ok);
        Ok((ok, report))
    };
    let ceiling = ideal_throughput(base);
    let warm = knobs.initial_rps > 0.0 && knobs.warm_step > 0.0;
    let mut hi = if knobs.initial_rps > 0.0 { knobs.initial_rps } else { ceiling.max(1.0) };
    let mut lo = 0.0;
    let mut best: Option<SimReport> = None;
    let mut step = knobs.warm_step;
    // Bracket: the ceiling normally fails; if it passes, grow.
    loop {
        let (ok, r) = run(hi, &mut probes)?;
        if !ok {
            if to_beat && lo == 0.0 {
                return Ok(None);
            }
            break;
        }
        lo = hi;
        best = r;
        hi *= if warm { 1.0 + step } else { 1.5 };
        step *= 2.0;
        if probes.len() as u32 >= knobs.max_runs {
            break;
        }
    }
    if lo == 0.0 {
        // Find a passing lower bound by halving (or, warm, by a widening step).
        let shrink = |step: f64| if warm { (1.0 - step).max(0.5) } else { 0.5 };
        let mut probe = hi * shrink(step);
        while probe > 1e-3 && (probes.len() as u32) < knobs.max_runs {
            let (ok, r) = run(probe, &mut probes)?;
            if ok {
                lo = probe;
                best = r;
                break;
            }
            hi = probe;
            step *= 2.0;
            probe *= shrink(step);
        }
    }
    while lo > 0.0 && (hi - lo) > knobs.rel_precision * hi && (probes.len() as u32) < knobs.max_runs {
        let mid = 0.5 * (lo + hi);
        let (ok, r) = run(mid, &mut probes)?;
        if ok {
            lo = mid;
            best = r;
        } else {
            hi = mid;
        }
    }
    Ok(Some(GoodputResult { goodput_rps: lo, at_goodput: best, probes }))
}

// The timeout policy's `k`, chosen per model by a goodput search (kept
// here, beside the search it runs, so the baselines never import the
// policy builder that imports them): a
// timeout baseline is only honest at its best `k` (the Symphony paper,
// section 3, compares deferred scheduling against timeout batching "with
// the best timeout").
//
// The search runs over a fixed list of candidate `k`s, each a fraction of
// the model's SLO. First every model gets the same fraction, each in turn
// (with one model, an exhaustive search over the list); then, with several
// models and [`TimeoutSearch::per_model`], one pass of coordinate descent
// from the best of those: each model in turn gets the candidate that
// maximises the cluster's goodput with the others held.

/// The seed reports search `k` on: one that no report measures a goodput
/// on (they use seeds 1-5, and 6-10 to check), so the `k` chosen is not
/// also judged on the arrivals it was picked for. Searched on seed 1 and
/// judged on seeds 1-5, the best of some 25 configurations on seed 1
/// carried seed 1's luck into the median: in six of the grid's seven
/// lowest cells the timeout policy lost 0.1-1.4% when searched on seed 6
/// (docs/decisions.md, Baselines, "Timeout": "The `k` is searched on a
/// seed of its own"). An operator picks `k` the same way: on yesterday's
/// traffic, for today's.
pub const TUNING_SEED: u64 = 0;

/// Candidate `k`s as fractions of the model's SLO.
pub const K_FRACTIONS: [f64; 7] = [0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4];

/// The best `k` per model found, and the goodput (requests/s) with them.
#[derive(Clone, Debug, PartialEq)]
pub struct BestTimeouts {
    /// Per model (model id = index).
    pub timeouts: Vec<Duration>,
    /// Goodput of `base` with these `k`s.
    pub goodput_rps: f64,
}

/// How [`best_timeouts`] searches.
#[derive(Clone, Debug)]
pub struct TimeoutSearch {
    /// Each goodput search's knobs. With a `warm_step`, every search after
    /// the first is bracketed around the best goodput so far (neighbouring
    /// `k`s have close goodputs), which takes fewer probes, and given up
    /// at its first probe when that fails ([`search_to_beat`]).
    pub knobs: GoodputSearch,
    /// After the common fraction, one pass per model over the others.
    pub per_model: bool,
}

/// Searches `k` per model for the timeout policy on `base` (its rate is
/// ignored), with `policy`'s other knobs (its kind is forced to timeout).
/// Ties keep the earlier candidate.
pub fn best_timeouts(base: &SimConfig, policy: &PolicyConfig, how: &TimeoutSearch) -> Result<BestTimeouts, GoodputError> {
    let k_at = |m: usize, f: f64| Duration::from_nanos((base.models[m].slo.as_nanos() as f64 * f) as u64);
    // The best goodput so far and its `k`s.
    let mut best: Option<(f64, Vec<Duration>)> = None;
    // With a `warm_step`, a candidate is searched from the best goodput so
    // far and given up at once when it fails there: it could only come out
    // below, and a candidate must beat the best to replace it, so the
    // choice and its goodput are those of complete searches.
    let consider = |timeouts: Vec<Duration>, best: &mut Option<(f64, Vec<Duration>)>| -> Result<(), GoodputError> {
        let incumbent = best.as_ref().map_or(0.0, |(g, _)| *g);
        let knobs = GoodputSearch { initial_rps: 0.0, ..how.knobs.clone() };
        let p = PolicyConfig { kind: PolicyKind::Timeout, timeouts: timeouts.clone(), ..policy.clone() };
        let Some(found) = search_to_beat(base, &p, &knobs, incumbent, &mut |_, _, _, _| {})? else { return Ok(()) };
        let g = found.goodput_rps;
        if best.as_ref().is_none_or(|(b, _)| g > *b) {
            *best = Some((g, timeouts));
        }
        Ok(())
    };
    for f in K_FRACTIONS {
        consider((0..base.models.len()).map(|m| k_at(m, f)).collect(), &mut best)?;
    }
    if how.per_model && base.models.len() > 1 {
        for m in 0..base.models.len() {
            let Some((_, held)) = best.clone() else { break };
            for f in K_FRACTIONS {
                let mut timeouts = held.clone();
                timeouts[m] = k_at(m, f);
                // The held configuration is already measured.
                if timeouts[m] != held[m] {
                    consider(timeouts, &mut best)?;
                }
            }
        }
    }
    let (goodput_rps, timeouts) = best.unwrap_or((0.0, vec![Duration::ZERO; base.models.len()]));
    Ok(BestTimeouts { timeouts, goodput_rps: goodput_rps.max(0.0) })
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

    #[test]
    fn a_probe_stopped_once_it_must_fail_leaves_every_pass_fail_and_the_goodput_as_they_were() {
        use crate::sim::{simulate, simulate_until_failed, ProbeRun};
        for (arrival, kind) in [(Arrival::Poisson, PolicyKind::Deferred), (Arrival::Gamma(0.2), PolicyKind::Eager), (Arrival::Poisson, PolicyKind::Nexus)] {
            let policy = PolicyConfig::new(kind);
            let knobs = GoodputSearch { min_requests_per_model: 500, ..GoodputSearch::default() };
            let full = GoodputSearch { stop_failed_probes: false, ..knobs.clone() };
            let a = search(&base(arrival), &policy, &knobs, &mut |_, _, _, _| {}).unwrap();
            let b = search(&base(arrival), &policy, &full, &mut |_, _, _, _| {}).unwrap();
            assert_eq!(a.goodput_rps, b.goodput_rps, "{arrival:?} {kind:?}");
            let verdicts = |r: &GoodputResult| r.probes.iter().map(|&(rate, _, ok)| (rate, ok)).collect::<Vec<_>>();
            assert_eq!(verdicts(&a), verdicts(&b));
            assert!(a.probes.iter().any(|p| !p.2), "some probe fails");
            // A stopped probe's bad rate is a lower bound on the full run's.
            for (x, y) in a.probes.iter().zip(&b.probes) {
                assert!(x.1 <= y.1 && x.1 > knobs.max_bad_rate || x.2, "{x:?} {y:?}");
            }
            // Far above the crossing a probe stops well before its end.
            let mut cfg = base(arrival);
            cfg.workload.rate_rps = 4.0 * a.goodput_rps;
            let mut sched = build(&cfg.models, cfg.gpus, &policy).unwrap();
            match simulate_until_failed(&cfg, sched.as_mut(), 0.01).unwrap() {
                ProbeRun::Failed { bad_rate_at_least, stopped_at, .. } => {
                    assert!(bad_rate_at_least > 0.01);
                    assert!(stopped_at < dataplane::time::Instant::from_nanos(cfg.duration.as_nanos() / 2), "{stopped_at}");
                }
                ProbeRun::Completed(r) => panic!("4x the goodput passed: {}", r.max_model_bad_rate),
            }
            // A passing run is the plain run.
            cfg.workload.rate_rps = 0.5 * a.goodput_rps;
            let mut sched = build(&cfg.models, cfg.gpus, &policy).unwrap();
            let ProbeRun::Completed(r) = simulate_until_failed(&cfg, sched.as_mut(), 0.01).unwrap() else { panic!("half the goodput failed") };
            let mut sched = build(&cfg.models, cfg.gpus, &policy).unwrap();
            let plain = simulate(&cfg, sched.as_mut()).unwrap();
            assert_eq!(serde_json::to_string(&r).unwrap(), serde_json::to_string(&plain).unwrap());
        }
    }

    #[test]
    fn a_search_to_beat_gives_up_only_where_the_full_search_would_end_below_the_incumbent() {
        let policy = PolicyConfig::new(PolicyKind::Timeout);
        let knobs = GoodputSearch { min_requests_per_model: 500, warm_step: 0.02, ..GoodputSearch::default() };
        let cfg = base(Arrival::Gamma(0.5));
        let cold = search(&cfg, &policy, &knobs, &mut |_, _, _, _| {}).unwrap();
        let (mut gave_up, mut beat) = (0, 0);
        for incumbent in [0.5, 0.9, 0.97, 1.0, 1.03, 1.1, 2.0].map(|f| f * cold.goodput_rps) {
            let full = search(&cfg, &policy, &GoodputSearch { initial_rps: incumbent, ..knobs.clone() }, &mut |_, _, _, _| {}).unwrap();
            let mut probes = 0;
            match search_to_beat(&cfg, &policy, &knobs, incumbent, &mut |_, _, _, _| probes += 1).unwrap() {
                None => {
                    gave_up += 1;
                    assert_eq!(probes, 1, "one probe, at the incumbent");
                    assert!(!full.probes[0].2 && full.goodput_rps < incumbent, "{incumbent}: {:?}", full.probes);
                }
                Some(r) => {
                    beat += 1;
                    assert!(full.probes[0].2, "{incumbent}: {:?}", full.probes);
                    assert_eq!((r.goodput_rps, r.probes.clone()), (full.goodput_rps, full.probes), "{incumbent}");
                }
            }
        }
        assert!(gave_up >= 2 && beat >= 2, "gave up {gave_up}, beat {beat}");
        // Without an incumbent or a warm step: the plain search.
        let plain = search_to_beat(&cfg, &policy, &knobs, 0.0, &mut |_, _, _, _| {}).unwrap().unwrap();
        assert_eq!(plain.probes, cold.probes);
        let no_step = GoodputSearch { warm_step: 0.0, ..knobs.clone() };
        let plain = search_to_beat(&cfg, &policy, &no_step, 2.0 * cold.goodput_rps, &mut |_, _, _, _| {}).unwrap().unwrap();
        assert_eq!(plain.probes, search(&cfg, &policy, &no_step, &mut |_, _, _, _| {}).unwrap().probes);
    }

    #[test]
    fn a_search_warmed_by_a_neighbouring_goodput_brackets_it_in_fewer_probes_to_the_same_precision() {
        let policy = PolicyConfig::new(PolicyKind::Deferred);
        let knobs = GoodputSearch { min_requests_per_model: 500, ..GoodputSearch::default() };
        let mut cfg = base(Arrival::Poisson);
        let cold = search(&cfg, &policy, &knobs, &mut |_, _, _, _| {}).unwrap();
        for seed in [2, 3] {
            cfg.seed = seed;
            let fresh = search(&cfg, &policy, &knobs, &mut |_, _, _, _| {}).unwrap();
            let warm_knobs = GoodputSearch { initial_rps: cold.goodput_rps, warm_step: 0.02, ..knobs.clone() };
            let warm = search(&cfg, &policy, &warm_knobs, &mut |_, _, _, _| {}).unwrap();
            assert!(warm.probes.len() < fresh.probes.len(), "{} vs {}", warm.probes.len(), fresh.probes.len());
            // Both end with a passing rate and a failing one within the
            // precision above it; the crossings agree to about that.
            let gap = (warm.goodput_rps - fresh.goodput_rps).abs() / fresh.goodput_rps;
            assert!(gap < 0.02, "seed {seed}: {} vs {}", warm.goodput_rps, fresh.goodput_rps);
            let above = warm.probes.iter().filter(|p| !p.2 && p.0 > warm.goodput_rps).map(|p| p.0).fold(f64::INFINITY, f64::min);
            assert!(above - warm.goodput_rps <= knobs.rel_precision * above + 1e-9, "{:?}", warm.probes);
        }
        // A guess far off still brackets (widening doubles per probe) and
        // ends as precisely; near the bar the bad rate is not monotone in
        // the rate, so another probe sequence may settle on another
        // crossing a little apart.
        let far = GoodputSearch { initial_rps: cold.goodput_rps * 3.0, warm_step: 0.02, ..knobs.clone() };
        cfg.seed = 1;
        let r = search(&cfg, &policy, &far, &mut |_, _, _, _| {}).unwrap();
        assert!((r.goodput_rps - cold.goodput_rps).abs() / cold.goodput_rps < 0.05, "{} vs {}", r.goodput_rps, cold.goodput_rps);
        let above = r.probes.iter().filter(|p| !p.2 && p.0 > r.goodput_rps).map(|p| p.0).fold(f64::INFINITY, f64::min);
        assert!(above - r.goodput_rps <= knobs.rel_precision * above + 1e-9, "{:?}", r.probes);
        assert!(r.probes.iter().any(|p| p.2 && p.0 == r.goodput_rps));
    }
}
