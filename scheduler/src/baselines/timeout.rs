//! The timeout policy's `k`, chosen per model by a goodput search: a
//! timeout baseline is only honest at its best `k` (the Symphony paper,
//! section 3, compares deferred scheduling against timeout batching "with
//! the best timeout").
//!
//! The search runs over a fixed list of candidate `k`s, each a fraction of
//! the model's SLO. First every model gets the same fraction, each in turn
//! (with one model, an exhaustive search over the list); then, with several
//! models and [`TimeoutSearch::per_model`], one pass of coordinate descent
//! from the best of those: each model in turn gets the candidate that
//! maximises the cluster's goodput with the others held.

use crate::goodput::{search_to_beat, GoodputError, GoodputSearch};
use crate::policy::{PolicyConfig, PolicyKind};
use crate::sim::SimConfig;
use dataplane::time::Duration;

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
