//! The timeout policy's `k`, chosen per model by a goodput search: a
//! timeout baseline is only honest at its best `k` (the Symphony paper,
//! section 3, compares deferred scheduling against timeout batching "with
//! the best timeout").
//!
//! The search is coordinate descent over a fixed list of candidate `k`s,
//! each a fraction of the model's SLO: starting from eager (`k = 0` for
//! every model), each model in turn gets the candidate that maximises the
//! cluster's goodput with the others held. One pass; with one model it is
//! an exhaustive search over the list.

use crate::goodput::{search, GoodputError, GoodputSearch};
use crate::policy::{PolicyConfig, PolicyKind};
use crate::sim::SimConfig;
use dataplane::time::Duration;

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

/// Searches `k` per model for the timeout policy on `base` (its rate is
/// ignored), with `policy`'s other knobs (its kind is forced to timeout).
pub fn best_timeouts(base: &SimConfig, policy: &PolicyConfig, knobs: &GoodputSearch) -> Result<BestTimeouts, GoodputError> {
    let mut p = policy.clone();
    p.kind = PolicyKind::Timeout;
    p.timeouts = vec![Duration::ZERO; base.models.len()];
    let mut best = f64::NEG_INFINITY;
    for m in 0..base.models.len() {
        let slo = base.models[m].slo;
        let mut best_k = p.timeouts[m];
        for f in K_FRACTIONS {
            if m > 0 && f == 0.0 && best_k == Duration::ZERO {
                // The held configuration: already measured.
                continue;
            }
            p.timeouts[m] = Duration::from_nanos((slo.as_nanos() as f64 * f) as u64);
            let g = search(base, &p, knobs, &mut |_, _, _, _| {})?.goodput_rps;
            if g > best {
                best = g;
                best_k = p.timeouts[m];
            }
        }
        p.timeouts[m] = best_k;
    }
    Ok(BestTimeouts { timeouts: p.timeouts, goodput_rps: best.max(0.0) })
}
