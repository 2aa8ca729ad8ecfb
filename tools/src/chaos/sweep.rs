//! Many seeds of one configuration, spread over threads; the summary a CI
//! run or a nightly soak reads.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use serde::Serialize;

use super::{run, ChaosConfig, ChaosError, ChaosReport, FaultClass};

/// The outcome of a sweep over seeds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SweepSummary {
    /// Seeds run.
    pub seeds: u64,
    /// Requests over all seeds.
    pub accepted: u64,
    /// Succeeded over all seeds.
    pub succeeded: u64,
    /// Unaccounted over all seeds (must be 0).
    pub unaccounted: u64,
    /// Cancelled by the client over all seeds.
    pub cancelled: u64,
    /// Faults that hit something in flight, by class, over all seeds.
    pub faults: BTreeMap<String, u64>,
    /// Classes asked for that never hit anything in flight.
    pub classes_without_hits: Vec<String>,
    /// Seeds whose invariants failed, with their reports (at most 10).
    pub failures: Vec<ChaosReport>,
    /// Seeds that failed, in all.
    pub failed_seeds: u64,
    /// Fewest requests in one seed.
    pub min_requests: u64,
    /// Plans backends did not run for their epoch, over all seeds.
    pub fenced_plans: u64,
    /// Tasks frontends took back (answered `moved`) to resubmit (two
    /// scheduler groups).
    pub resubmitted: u64,
    /// Requests that still ended dropped `moved`.
    pub moved_dropped: u64,
}

impl SweepSummary {
    /// Whether every seed held every invariant and every class hit.
    pub fn ok(&self) -> bool {
        self.failed_seeds == 0 && self.unaccounted == 0 && self.classes_without_hits.is_empty()
    }
}

/// Runs `seeds` seeds from `base.seed` on `threads` threads; `progress` is
/// called after each seed with the count done.
pub fn sweep(base: &ChaosConfig, seeds: u64, threads: usize, progress: &(dyn Fn(u64) + Sync)) -> Result<SweepSummary, ChaosError> {
    let next = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    let summary = Mutex::new(SweepSummary { min_requests: u64::MAX, ..SweepSummary::default() });
    let error: Mutex<Option<ChaosError>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= seeds {
                    return;
                }
                let cfg = ChaosConfig { seed: base.seed + i, ..base.clone() };
                let rep = match run(cfg) {
                    Ok(r) => r,
                    Err(e) => {
                        if let Ok(mut g) = error.lock() {
                            g.get_or_insert(e);
                        }
                        return;
                    }
                };
                if let Ok(mut sum) = summary.lock() {
                    sum.seeds += 1;
                    sum.accepted += rep.accepted;
                    sum.succeeded += rep.succeeded;
                    sum.unaccounted += rep.unaccounted;
                    sum.cancelled += rep.cancelled;
                    sum.min_requests = sum.min_requests.min(rep.accepted);
                    sum.fenced_plans += rep.fenced_plans;
                    sum.resubmitted += rep.resubmitted;
                    sum.moved_dropped += rep.dropped.get("moved").copied().unwrap_or(0);
                    for (k, v) in &rep.faults {
                        *sum.faults.entry(k.clone()).or_insert(0) += v;
                    }
                    if !rep.ok() {
                        sum.failed_seeds += 1;
                        if sum.failures.len() < 10 {
                            sum.failures.push(rep);
                        }
                    }
                }
                progress(done.fetch_add(1, Ordering::Relaxed) + 1);
            });
        }
    });
    if let Some(e) = error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    let mut sum = summary.into_inner().unwrap_or_else(|p| p.into_inner());
    sum.failures.sort_by_key(|r| r.seed);
    for c in FaultClass::ALL.into_iter().chain(FaultClass::FAILOVER).chain(FaultClass::MEMBERSHIP) {
        if base.faults.has(c) && sum.faults.get(c.as_str()).copied().unwrap_or(0) == 0 {
            sum.classes_without_hits.push(c.as_str().to_string());
        }
    }
    if sum.seeds == 0 {
        sum.min_requests = 0;
    }
    Ok(sum)
}
