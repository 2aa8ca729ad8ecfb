//! The RankThread core: GPU free times, ready candidates, matchmaking.

use super::{Candidate, Grant, ToRank};
use crate::netdelay::NetworkDelay;
use crate::types::{GpuId, ModelId};
use dataplane::mutation::{self, Mutation};
use dataplane::heap::IndexedHeap;
use dataplane::time::Instant;
use std::cmp::Reverse;

/// Counters of the RankThread core.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RankStats {
    /// Messages handled.
    pub messages: u64,
    /// Timer wake-ups handled.
    pub wakes: u64,
    /// GPUs granted.
    pub grants: u64,
    /// Candidates discarded because no GPU could start them in time.
    pub expired: u64,
    /// Free-time corrections applied (closed loop).
    pub corrections: u64,
    /// Corrections ignored: the GPU was granted out or offline.
    pub corrections_ignored: u64,
}

/// Matchmaking state. Every operation is `O(log M + log G)`.
pub struct RankCore {
    delay: NetworkDelay,
    /// GPUs not reserved by a ModelThread, keyed by the time they are free.
    busy: IndexedHeap<Instant>,
    /// GPUs already free, lowest id first so high ids stay idle at low load.
    idle: IndexedHeap<GpuId>,
    /// Ready candidates waiting for a GPU, by model.
    cands: Vec<Option<Candidate>>,
    /// Keyed by (priority level, latest start): with one level everywhere
    /// this is plain most-urgent-first.
    by_latest: IndexedHeap<(u16, Instant)>,
    by_size: IndexedHeap<Reverse<u32>>,
    /// `offline[g]`: GPU `g` left the cluster.
    offline: Vec<bool>,
    /// `granted[g]`: GPU `g` is reserved by a ModelThread until its
    /// `GpuFree` comes back.
    granted: Vec<bool>,
    wake: Option<Instant>,
    stats: RankStats,
}

impl RankCore {
    /// `models` models, `gpus` GPUs all free at time zero.
    pub fn new(models: usize, gpus: u32, delay: NetworkDelay) -> Self {
        let mut idle = IndexedHeap::with_ids(gpus as usize);
        for g in 0..gpus {
            idle.set(g, g);
        }
        RankCore {
            delay,
            busy: IndexedHeap::with_ids(gpus as usize),
            idle,
            cands: vec![None; models],
            by_latest: IndexedHeap::with_ids(models),
            by_size: IndexedHeap::with_ids(models),
            offline: vec![false; gpus as usize],
            granted: vec![false; gpus as usize],
            wake: None,
            stats: RankStats::default(),
        }
    }

    /// The network delay bound later matchmaking charges.
    pub fn set_delay(&mut self, delay: NetworkDelay) {
        self.delay = delay;
    }

    /// Counters so far.
    pub fn stats(&self) -> RankStats {
        self.stats
    }

    /// When the GPU timer wants `on_wake`.
    pub fn poll_at(&self) -> Option<Instant> {
        self.wake
    }

    /// Ready candidates waiting for a GPU.
    pub fn waiting_candidates(&self) -> usize {
        self.by_latest.len()
    }

    /// A message from a ModelThread.
    pub fn on_message(&mut self, now: Instant, msg: ToRank, grant: &mut impl FnMut(Grant)) {
        self.stats.messages += 1;
        match msg {
            ToRank::Candidate { model, cand } => {
                self.remove_candidate(model);
                if let Some(c) = cand {
                    self.offer(now, model, c, grant);
                }
            }
            ToRank::GpuFree { gpu, free_at } => {
                self.set_granted(gpu, false);
                if !self.is_offline(gpu) {
                    self.idle.remove(gpu);
                    self.busy.set(gpu, free_at);
                    self.match_gpus(now, grant);
                }
            }
            ToRank::GpuMembership { gpu, online } => {
                let g = gpu as usize;
                if g >= self.offline.len() {
                    // New ids start out offline until they join below.
                    self.offline.resize(g + 1, true);
                    self.granted.resize(g + 1, false);
                }
                self.offline[g] = !online;
                self.granted[g] = false;
                self.idle.remove(gpu);
                self.busy.remove(gpu);
                if online {
                    self.idle.set(gpu, gpu);
                    self.match_gpus(now, grant);
                }
            }
            ToRank::GpuCorrect { gpu, free_at } => {
                if self.is_offline(gpu) || self.granted.get(gpu as usize).copied().unwrap_or(false) {
                    self.stats.corrections_ignored += 1;
                } else {
                    self.stats.corrections += 1;
                    self.idle.remove(gpu);
                    self.busy.set(gpu, free_at);
                    self.promote(now);
                    self.match_gpus(now, grant);
                }
            }
        }
        self.rearm(now);
    }

    /// The GPU timer fired.
    pub fn on_wake(&mut self, now: Instant, grant: &mut impl FnMut(Grant)) {
        self.stats.wakes += 1;
        self.match_gpus(now, grant);
        self.rearm(now);
    }

    fn is_offline(&self, gpu: GpuId) -> bool {
        self.offline.get(gpu as usize).copied().unwrap_or(true)
    }

    /// GPUs currently in the cluster.
    pub fn online_gpus(&self) -> usize {
        self.offline.iter().filter(|o| !**o).count()
    }

    fn remove_candidate(&mut self, model: ModelId) {
        if let Some(slot) = self.cands.get_mut(model as usize) {
            if slot.take().is_some() {
                self.by_latest.remove(model);
                self.by_size.remove(model);
            }
        }
    }

    /// Moves GPUs whose free time has passed into the idle set.
    fn promote(&mut self, now: Instant) {
        while let Some((t, g)) = self.busy.peek() {
            if t > now {
                break;
            }
            self.busy.pop();
            self.idle.set(g, g);
        }
    }

    fn set_granted(&mut self, gpu: GpuId, granted: bool) {
        if let Some(g) = self.granted.get_mut(gpu as usize) {
            *g = granted;
        }
    }

    fn give(&mut self, model: ModelId, gpu: GpuId, free_at: Instant, grant: &mut impl FnMut(Grant)) {
        self.stats.grants += 1;
        self.set_granted(gpu, true);
        grant(Grant { model, gpu, free_at });
    }

    /// Appendix D's on_model_timer: a candidate just became schedulable.
    fn offer(&mut self, now: Instant, model: ModelId, c: Candidate, grant: &mut impl FnMut(Grant)) {
        if model as usize >= self.cands.len() {
            return;
        }
        self.promote(now);
        if let Some((_, g)) = self.idle.pop() {
            // Mutation testing only (compiled out without the `mutations`
            // feature): grant a GPU that is still busy as if it were free.
            if let Some((busy_until, b)) = self.busy.peek() {
                if busy_until > now + self.delay.of(c.bs) && mutation::fires(Mutation::SchedulerPlansOntoBusyGpu) {
                    self.idle.set(g, g);
                    self.busy.pop();
                    self.give(model, b, now, grant);
                    return;
                }
            }
            self.give(model, g, now, grant);
            return;
        }
        let start = c.exec_at.max(now + self.delay.of(c.bs));
        // A GPU about to free goes to the newcomer only if no waiting
        // candidate has a higher priority level (one level: always).
        let outranked = self.by_latest.peek().is_some_and(|((level, _), _)| level < c.level);
        if let Some((free_at, g)) = self.busy.peek().filter(|_| !outranked) {
            if free_at <= start && free_at <= c.latest {
                self.busy.pop();
                self.give(model, g, free_at, grant);
                return;
            }
        }
        self.cands[model as usize] = Some(c);
        self.by_latest.set(model, (c.level, c.latest));
        self.by_size.set(model, Reverse(c.bs));
    }

    /// Appendix D's on_gpu_timer, for every GPU that is (about to be) free
    /// while candidates wait: the most urgent feasible candidate wins.
    fn match_gpus(&mut self, now: Instant, grant: &mut impl FnMut(Grant)) {
        while !self.by_latest.is_empty() {
            self.promote(now);
            let (gpu, free_at) = if let Some((_, g)) = self.idle.peek() {
                (g, now)
            } else if let Some((t, g)) = self.busy.peek() {
                if t - self.max_lead() > now {
                    break;
                }
                (g, t)
            } else {
                break;
            };
            let mut winner = None;
            while let Some(((_, latest), m)) = self.by_latest.peek() {
                let bs = self.cands[m as usize].map_or(1, |c| c.bs);
                if free_at.max(now + self.delay.of(bs)) > latest {
                    // No GPU frees earlier than this one: the candidate can
                    // no longer run; its ModelThread will shrink or drop it.
                    self.remove_candidate(m);
                    self.stats.expired += 1;
                    continue;
                }
                winner = Some(m);
                break;
            }
            let Some(m) = winner else { break };
            self.remove_candidate(m);
            self.idle.remove(gpu);
            self.busy.remove(gpu);
            self.give(m, gpu, free_at, grant);
        }
    }

    /// The largest network lead time among waiting candidates.
    fn max_lead(&self) -> dataplane::time::Duration {
        self.by_size.peek().map_or(dataplane::time::Duration::ZERO, |(Reverse(bs), _)| self.delay.of(bs))
    }

    fn rearm(&mut self, now: Instant) {
        self.wake = if self.by_latest.is_empty() {
            None
        } else if !self.idle.is_empty() {
            Some(now)
        } else {
            self.busy.peek().map(|(t, _)| (t - self.max_lead()).max(now))
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane::time::Duration;

    fn cand(bs: u32, latest_ms: u64) -> Candidate {
        Candidate { bs, exec_at: Instant::ZERO, latest: Instant::from_nanos(latest_ms * 1_000_000), level: 0 }
    }

    #[test]
    fn grants_lowest_idle_gpu_and_never_an_offline_one() {
        let mut rank = RankCore::new(2, 3, NetworkDelay::ZERO);
        let mut grants = Vec::new();
        let now = Instant::ZERO;
        rank.on_message(now, ToRank::GpuMembership { gpu: 0, online: false }, &mut |g| grants.push(g));
        rank.on_message(now, ToRank::Candidate { model: 0, cand: Some(cand(4, 10)) }, &mut |g| grants.push(g));
        assert_eq!(grants.pop().map(|g| g.gpu), Some(1), "GPU 0 left, so the lowest idle is 1");
        // The in-flight batch on GPU 0 finishes: still offline, not reused.
        rank.on_message(now, ToRank::GpuFree { gpu: 0, free_at: now }, &mut |g| grants.push(g));
        rank.on_message(now, ToRank::Candidate { model: 1, cand: Some(cand(4, 10)) }, &mut |g| grants.push(g));
        assert_eq!(grants.pop().map(|g| g.gpu), Some(2));
        assert_eq!(rank.online_gpus(), 2);
        // A new GPU joins and takes the waiting candidate at once.
        rank.on_message(now, ToRank::Candidate { model: 0, cand: Some(cand(4, 10)) }, &mut |g| grants.push(g));
        assert!(grants.is_empty() && rank.waiting_candidates() == 1);
        rank.on_message(now + Duration::from_millis(1), ToRank::GpuMembership { gpu: 7, online: true }, &mut |g| grants.push(g));
        assert_eq!(grants.pop().map(|g| (g.model, g.gpu)), Some((0, 7)));
        assert_eq!(rank.online_gpus(), 3);
    }

    #[test]
    fn a_correction_moves_a_gpu_free_time_but_never_a_granted_gpu() {
        let ms = |ms: u64| Instant::from_nanos(ms * 1_000_000);
        let mut rank = RankCore::new(1, 1, NetworkDelay::ZERO);
        let mut grants = Vec::new();
        rank.on_message(ms(0), ToRank::Candidate { model: 0, cand: Some(cand(4, 100)) }, &mut |g| grants.push(g));
        assert_eq!(grants.len(), 1);
        // Granted and not handed back: a correction cannot free it.
        rank.on_message(ms(1), ToRank::GpuCorrect { gpu: 0, free_at: ms(1) }, &mut |g| grants.push(g));
        assert_eq!(rank.stats().corrections_ignored, 1);
        rank.on_message(ms(1), ToRank::GpuFree { gpu: 0, free_at: ms(10) }, &mut |g| grants.push(g));
        // The batch ran late: busy until 15 ms, not 10.
        rank.on_message(ms(2), ToRank::GpuCorrect { gpu: 0, free_at: ms(15) }, &mut |g| grants.push(g));
        rank.on_message(ms(2), ToRank::Candidate { model: 0, cand: Some(cand(4, 100)) }, &mut |g| grants.push(g));
        assert_eq!(rank.poll_at(), Some(ms(15)));
        rank.on_wake(ms(15), &mut |g| grants.push(g));
        assert_eq!(grants.last().map(|g| g.free_at), Some(ms(15)));
        // It finished early: free at 3 ms instead of 20, taken at once.
        rank.on_message(ms(3), ToRank::GpuFree { gpu: 0, free_at: ms(20) }, &mut |g| grants.push(g));
        rank.on_message(ms(3), ToRank::Candidate { model: 0, cand: Some(cand(4, 100)) }, &mut |g| grants.push(g));
        let before = grants.len();
        rank.on_message(ms(4), ToRank::GpuCorrect { gpu: 0, free_at: ms(3) }, &mut |g| grants.push(g));
        assert_eq!(grants.len(), before + 1);
        assert_eq!(rank.stats().corrections, 2);
    }
}
