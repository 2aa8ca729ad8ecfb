//! Passing over a queue's first heads for a larger batch of the requests
//! behind them: eager's batch rule (docs/journal/benchmarks-2026.md, "Eager: the largest
//! batch"), also taken by a deferred grant for a model whose lone request
//! locks out a pair (docs/decisions.md, deferred item 25).

use crate::types::Request;
use dataplane::time::{Duration, Instant};
use std::collections::VecDeque;

/// The batch a GPU runs from `queue` (sorted by deadline, non-empty; its
/// head can finish in a batch of `b0`, the largest that finishes by the
/// head's deadline): `(skip, size)`, members `skip..skip + size`.
///
/// By default the head's batch (`skip = 0`). Sizing by the head alone is
/// metastable: after a burst every head has little slack, every GPU runs
/// batches of one and the queue never drains. So the batch may instead
/// leave the first `i` heads queued and take the next requests, whose later
/// deadlines allow a larger batch `b_i`, but only where batching pays: the
/// GPU time per request of that batch plus the skipped heads run as a batch
/// of their own, `(l(b_i) + l(i)) / (b_i + i)`, must be below the head's
/// batch's `l(b_0) / b_0`. Models without batching benefit (A100
/// SSDMobilenet, `l(b) = 19.4 b + 4.4 ms`) then never skip their heads.
/// Among the batches that pass, the largest (fewest skipped heads on ties).
///
/// `latency(b)`: a batch's GPU time on this GPU; `within(deadline, limit)`:
/// the largest batch up to `limit` that finishes there by `deadline`;
/// `worth(r, b)`: a caller's further condition on passing the heads over
/// for a batch of `b` from request `r` on (eager: none).
pub fn larger_batch_past_heads(
    queue: &VecDeque<Request>,
    b0: u32,
    max_batch: u32,
    latency: impl Fn(u32) -> Duration,
    within: impl Fn(Instant, u32) -> u32,
    worth: impl Fn(&Request, u32) -> bool,
) -> (usize, u32) {
    let per_request = |n: u32, t: Duration| t.as_secs_f64() / f64::from(n);
    let head_cost = per_request(b0, latency(b0));
    let (mut skip, mut size) = (0usize, b0);
    // Skipping more heads than a batch holds: they could not run as one.
    for (i, r) in queue.iter().enumerate().skip(1).take(max_batch as usize) {
        let cap = ((queue.len() - i) as u32).min(max_batch);
        if cap <= size {
            break;
        }
        let b = within(r.deadline, cap);
        let skipped = i as u32;
        if b > size && per_request(b + skipped, latency(b) + latency(skipped)) < head_cost && worth(r, b) {
            (skip, size) = (i, b);
        }
    }
    (skip, size)
}
