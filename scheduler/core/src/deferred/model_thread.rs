//! The ModelThread core: per-model queues, batch gathering, candidates and
//! timers for a disjoint set of models.

use super::{Candidate, CoreConfig, Departure, DepartureSet, Gather, Grant, ToRank};
use super::follow_ups::FollowUps;
use super::rate_window::{RateWindow, BURSTY_CV2};
#[cfg(test)]
use super::recent_loss::RECENT_LOSS_SPAN;
pub(super) use super::recent_loss::takes_the_losses;
use super::recent_loss::{RecentLoss, LOSS_SPREAD_WIDENING};
use crate::batch_past_heads::larger_batch_past_heads;
use crate::netdelay::NetworkDelay;
use crate::profile::LatencyProfile;
use crate::types::{Actions, Admission, DropReason, GpuId, ModelId, Request, RequestId};
use crate::zoo::ModelSpec;
use dataplane::heap::IndexedHeap;
use dataplane::time::{Duration, Instant};
use std::collections::VecDeque;

/// Why a request that ran out of time goes: its own timeout, or its
/// model's deadline.
#[inline]
fn out_of_time(r: &Request) -> DropReason {
    if r.timed {
        DropReason::Timeout
    } else {
        DropReason::DeadlineUnmeetable
    }
}

/// Under Poisson arrivals the early-drop window is at most the count that
/// a fill of the target's mean reaches in all but this share of fills
/// (docs/decisions.md, deferred item 17).
const SHORT_FILL_SHARE: f64 = 0.2;
/// The fill floor caps the early-drop window while the gaps' squared CV
/// is at most this: Poisson (1) and Gamma(0.5) (2, estimated 1.98 +-
/// 0.30), not Gamma(0.2) (5), whose bursts bring backlogs far beyond a
/// fill's spread (docs/decisions.md, deferred item 17).
const FILL_FLOOR_MAX_CV2: f64 = 2.5;
/// Under bursts the widened early-drop window is never below the target
/// divided by this (nor above the plain window): on a flat efficiency
/// curve the widened fraction alone tolerates batches of a fifth of the
/// target (docs/decisions.md, deferred item 21).
const BURST_WINDOW_FLOOR_DIVISOR: u32 = 3;

/// Whether waiting for a second request pays enough to protect the pair
/// (deferred item 19): running two together saves `2 l(1) - l(2)` of GPU
/// time (`beta` for a linear profile), which must be at least what the
/// second adds to the batch, `l(2) - l(1)` (`alpha`). A model whose
/// batching saves less (1080Ti Xception: `beta` 2.0 ms, `alpha` 4.8 ms)
/// loses little by running a burst's requests apart and more by holding a
/// GPU idle for a partner, so it is never pair-locked.
fn pair_worth_waiting_for(profile: &LatencyProfile) -> bool {
    let (one, two) = (profile.latency(1), profile.latency(2));
    (one + one).saturating_sub(two) >= two.saturating_sub(one)
}

/// The largest `w <= mean` (at least 1) with `P(N < w) <= SHORT_FILL_SHARE`
/// for `N ~ Poisson(mean)`: the count a fill whose expected count is
/// `mean` falls short of only in that share of fills. `O(mean)`; the
/// terms are summed from their logarithms, so a large mean does not
/// underflow `e^-mean` into a window of the whole target.
fn poisson_fill_floor(mean: u32) -> u32 {
    let m = f64::from(mean);
    let ln_m = m.ln();
    let mut ln_term = -m; // ln P(N = w)
    let mut below = 0.0; // P(N < w)
    let mut w = 0u32;
    while w < mean {
        let p = ln_term.exp();
        if below + p > SHORT_FILL_SHARE {
            break;
        }
        below += p;
        w += 1;
        ln_term += ln_m - f64::from(w).ln();
    }
    w.max(1)
}
const NOT_OWNED: u32 = u32::MAX;
/// The largest target whose [`poisson_fill_floor`] a model remembers
/// (4 bytes each).
const FILL_FLOOR_MEMO_MAX: usize = 4096;

/// Counters of one ModelThread core.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModelThreadStats {
    /// Requests accepted.
    pub requests: u64,
    /// Batches dispatched.
    pub batches: u64,
    /// Requests dropped.
    pub drops: u64,
    /// Messages sent to the RankThread.
    pub to_rank: u64,
    /// Grants received that found no batch to run (GPU handed back).
    pub grants_returned: u64,
    /// Requests refused or evicted because their model's queue was full
    /// (also counted in `drops`).
    pub refused: u64,
    /// Requests cancelled while queued (also counted in `drops`).
    pub cancelled: u64,
}

/// A batch of a model whose gaps are clearly bursty (squared CV above
/// [`BURSTY_CV2`]) stops deferring once a burst goes quiet: see
/// [`RateWindow::quiet_start`] and docs/decisions.md, deferred item 18.
const QUIET_STOP_MIN_CV2: f64 = BURSTY_CV2;
/// ... once the next request comes before the frontrun with a chance below
/// this (`1 - e^-5`: under Poisson gaps, the last five mean gaps before
/// the frontrun; chosen by the full grid, item 18).
const QUIET_STOP_CHANCE: f64 = 0.993_262_053;

/// A lone request of a model that locks out a following pair but whose
/// pair is not worth the frontrun ([`pair_worth_waiting_for`]) waits, under
/// bursts stronger than Gamma(0.5), while a partner comes before the
/// frontrun with at least this chance (deferred item 22).
const PARTNER_HOLD_CHANCE: f64 = 0.2;

/// With [`MANY_IDLE_GPUS`] GPUs idle, a lone request that locks out a pair
/// behind it (deferred items 12, 13 and 22) waits for a partner only while
/// one comes before the frontrun with at least this chance: as likely as
/// not (deferred item 24).
const MANY_IDLE_PARTNER_CHANCE: f64 = 0.5;

/// While another model takes the cluster's losses alone, a burst-locked
/// batch waits for its partner only while one comes before the frontrun
/// with at least this chance (deferred item 28: under the grid's Gamma(0.2)
/// gaps about 2 ms, near the timeout policy's searched `k` there).
const YIELDING_PARTNER_CHANCE: f64 = 0.1;

/// Idle GPUs, counting the one a batch would take, at which a
/// burst-locked batch no longer holds out for the frontrun (deferred item
/// 24): at a grant, the granted GPU and two of the three others a
/// [`Grant`] reports; between grants, three of those four.
const MANY_IDLE_GPUS: usize = 3;

/// A core's view of the idle GPUs before its first grant: one free now.
const UNKNOWN_SPARE_GPUS: [Instant; MANY_IDLE_GPUS] = [Instant::ZERO, Instant::NEVER, Instant::NEVER];

/// What a ModelThread knows of the idle GPUs when it gathers a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct IdleGpus {
    /// Some GPU idles (at a grant: another than the granted one).
    spare: bool,
    /// At least [`MANY_IDLE_GPUS`] idle, counting the one the batch takes.
    many: bool,
}

/// What the deferral rules of one gather read ([`ModelState::gather`]
/// computes it once and hands it to the rule it applies).
#[derive(Clone, Copy, Debug)]
struct Deferral {
    /// The batch's earliest deadline and its size.
    dl: Instant,
    bs: u32,
    /// The GPU's slowdown over the profile, at least 1: a window never
    /// opens later than the profile's.
    slow: f64,
    mean_gap: Option<Duration>,
    gap_cv2: Option<f64>,
    idle: IdleGpus,
    /// Deferred items 12 and 13: see [`ModelState::gather`].
    burst_locked: bool,
}

/// One model's scheduling state.
#[derive(Clone, Debug)]
struct ModelState {
    id: ModelId,
    profile: LatencyProfile,
    slo: Duration,
    /// The batch with the best throughput per GPU that fits the SLO.
    best_batch: u32,
    /// `l(1) + l(2) > SLO`: a GPU that starts one of this model's requests
    /// alone cannot serve a pair arriving just after it within the SLO
    /// (see [`Self::gather`], deferred items 12 and 13), and the pair is
    /// worth waiting for (see [`pair_worth_waiting_for`], item 19).
    pair_locked_out: bool,
    /// `l(1) + l(2) > SLO`, whether or not the pair is worth the wait: a
    /// lone request started at once leaves no room for a pair behind it on
    /// its GPU (deferred items 13, 19 and 22).
    lone_locks_out_pair: bool,
    /// `l(1)` exceeds the SLO of another model of this core: a lone
    /// request holds a GPU longer than that model's requests can wait
    /// (deferred item 33).
    long_runner: bool,
    /// Pending requests, one queue per priority level (highest first),
    /// each sorted by deadline (arrival order for one SLO).
    queues: Vec<VecDeque<Request>>,
    admission: Admission,
    /// What the RankThread currently holds for this model.
    informed: Option<Candidate>,
    /// When `informed` was last sent.
    informed_at: Instant,
    /// The pending (not yet schedulable) candidate the RankThread holds.
    informed_pending: Option<Candidate>,
    rate: RateWindow,
    /// The closed loop's per-GPU latency factor of this model (index: GPU
    /// id; NaN or absent: use the GPU's factor).
    gpu_factors: Vec<f64>,
    /// `e(b) = b / l(b)` for `b` in `1..=max_batch` (index `b - 1`): the
    /// early-drop window and the efficiency stop read it once or a dozen
    /// times per request, and each read was a division (the largest share
    /// of `gather`, node_path). The same expression, so the same bits.
    efficiency: Box<[f64]>,
    /// The last [`Self::target_batch_at`] answer: the mean gap moves a
    /// little per arrival and the target rarely with it, so checking the
    /// answer's two borders (two lookups) replaces a binary search.
    target_memo: u32,
    /// The last [`Self::drop_window`] (target, fraction bits, answer).
    drop_window_memo: Option<(u32, u64, u32)>,
    /// The share of recent admitted requests dropped (deferred item 20).
    loss: RecentLoss,
    /// Whether the arrivals are a closed loop's, and when its clients are
    /// all back (see [`super::follow_ups`]).
    follow_ups: FollowUps,
    /// [`Grant::others_loss_bp`] of this model's last grant.
    others_loss_bp: Option<u16>,
    /// [`poisson_fill_floor`] by target, 0 where not yet computed (it is
    /// at least 1), for targets up to the profile's largest batch (capped
    /// at [`FILL_FLOOR_MEMO_MAX`]); sized at construction, filled on first
    /// use. The target moves by about one per request under load, so a
    /// memo of the last target alone missed nearly every time and cost
    /// ~13 `exp` + `ln` per request (42% of the scheduler daemon's CPU at
    /// 1 M tasks/s, benchmarks.md "bench-cluster").
    fill_floor_memo: Vec<u32>,
}

impl ModelState {
    /// Earliest start of a batch of `b` given the network and the GPU.
    #[inline]
    fn earliest(now: Instant, delay: &NetworkDelay, gpu_free: Instant, b: u32) -> Instant {
        (now + delay.of(b)).max(gpu_free)
    }

    /// The largest batch up to `limit` that reaches a GPU free at
    /// `gpu_free` over the network and finishes there by `deadline`, on a
    /// GPU `factor` times slower than the profile.
    #[inline]
    fn batch_by(profile: &LatencyProfile, now: Instant, delay: &NetworkDelay, gpu_free: Instant, deadline: Instant, limit: u32, factor: f64) -> u32 {
        let by_network = profile.max_batch_within_scaled(deadline.saturating_since(now + delay.d_ctrl), delay.d_data, limit, factor);
        // A GPU free by the time a batch reaches it over the network
        // bounds nothing the network does not: its test has the larger
        // budget and no per-item cost, so it passes every size the
        // network's passes, and its search (the same probes until the
        // first size only it passes) ends no lower. The minimum is the
        // network's: the second search is skipped in most gathers (between
        // grants the GPU is unknown, free at zero).
        if gpu_free <= now + delay.d_ctrl {
            return by_network;
        }
        let by_gpu = profile.max_batch_within_scaled(deadline.saturating_since(gpu_free), Duration::ZERO, limit, factor);
        by_network.min(by_gpu)
    }

    /// The drop test (at the profile's speed: see [`Self::gather`]).
    #[inline]
    fn fits_head(profile: &LatencyProfile, now: Instant, delay: &NetworkDelay, gpu_free: Instant, b: u32, deadline: Instant) -> bool {
        Self::earliest(now, delay, gpu_free, b) + profile.scaled_latency(b, 1.0) <= deadline
    }

    /// The early-drop fraction: `fraction`, but with its tolerated
    /// shortfall [`LOSS_SPREAD_WIDENING`] times as wide while this model
    /// has lost at least [`LOSS_SPREAD_MIN_BP`] of its recent requests and
    /// more than twice the share of every other model (deferred item 27).
    /// Early drop gives up a head for the GPU time a fuller batch saves,
    /// and on a saturated cluster that time goes to every model while the
    /// heads are all this one's: at the bar (every model's bad rate) a
    /// model that takes the cluster's losses alone fails it first (A100
    /// ResNet50 + VGG16 on 2 GPUs at 50 ms: 1.77% against 0.04%).
    /// Without [`Departure::DropShortfall`] the fraction is 1 (Nexus's
    /// window: the target batch), without [`Departure::LossSpread`] never
    /// widened.
    fn early_drop_fraction(&self, fraction: f64, d: DepartureSet) -> f64 {
        if !d.has(Departure::DropShortfall) {
            return 1.0;
        }
        match self.others_loss_bp {
            Some(others) if d.has(Departure::LossSpread) && takes_the_losses(self.loss.basis_points(), others) => 1.0 - (1.0 - fraction) * LOSS_SPREAD_WIDENING,
            _ => fraction,
        }
    }

    /// Whether another model takes the cluster's losses alone, by the test
    /// [`Self::early_drop_fraction`] applies to this one: as of this
    /// model's last grant, some other model lost at least
    /// [`LOSS_SPREAD_MIN_BP`] of its recent requests and more than twice
    /// this model's share (deferred item 28).
    fn another_takes_the_losses(&self) -> bool {
        self.others_loss_bp.is_some_and(|others| takes_the_losses(others, self.loss.basis_points()))
    }

    /// Target batch size for early drop: the largest `b` whose fill time at
    /// the current arrival rate plus execution and network time fits the SLO
    /// (the staggered-execution batch size, as Nexus estimates it).
    /// `None` while the rate is unknown (fewer than two arrivals).
    #[cfg(test)]
    fn target_batch(&self, now: Instant, delay: &NetworkDelay) -> Option<u32> {
        self.rate.mean_gap(now).map(|gap| self.target_batch_at(gap, delay))
    }

    /// [`Self::target_batch`] at mean gap `gap`.
    fn target_batch_at(&self, gap: Duration, delay: &NetworkDelay) -> u32 {
        let budget = self.slo.saturating_sub(delay.d_ctrl);
        self.profile.max_batch_within(budget, gap + delay.d_data, u32::MAX).max(1)
    }

    /// [`Self::target_batch_at`], answered from the last answer when it
    /// still holds. The cost is non-decreasing in `b` (what the binary
    /// search relies on), so `t` is the answer exactly when `t` fits (or is
    /// 1, the floor) and `t + 1` does not (or `t` is the largest batch).
    fn target_batch_memo(&mut self, gap: Duration, delay: &NetworkDelay) -> u32 {
        let budget = self.slo.saturating_sub(delay.d_ctrl);
        let per_item = gap + delay.d_data;
        let t = self.target_memo;
        let max = self.profile.max_batch();
        let fits = |b: u32| self.profile.batch_fits(budget, per_item, b, 1.0);
        if (1..=max).contains(&t) && (t == 1 || fits(t)) && (t == max || !fits(t + 1)) {
            return t;
        }
        let t = self.target_batch_at(gap, delay);
        self.target_memo = t;
        t
    }

    /// `e(b) = b / l(b)`, the throughput per GPU of a batch of `b`.
    #[inline]
    fn efficiency(&self, b: u32) -> f64 {
        match b.checked_sub(1).and_then(|i| self.efficiency.get(i as usize)) {
            Some(&e) => e,
            None => efficiency_of(&self.profile, b),
        }
    }

    /// Drops what the gathering policy drops, then returns the candidate
    /// batch (Algorithm 1's UpdateCandidate / Appendix D's update_candidate).
    /// `factor` is how much slower than the profile the GPU at hand runs
    /// (the closed loop's estimate; exactly 1 without a GPU or a loop): it
    /// sizes the batch and its latest start. The window's opening
    /// (frontrun) is never later than the profile's, so a grant the
    /// profile would take is taken.
    /// `idle`: the idle GPUs, as far as this ModelThread knows (see
    /// [`ModelThreadCore::spare_gpus_at`]).
    fn gather(&mut self, now: Instant, cfg: &CoreConfig, gpu_free: Option<Instant>, factor: f64, idle: IdleGpus, out: &mut Actions) -> Option<Candidate> {
        let delay = &cfg.delay;
        let d = cfg.departures;
        // Light load (item 32) asks whether a GPU idles now: between grants
        // as far as this core knows, at a grant also the granted one (so a
        // grant never undoes what the candidate offered).
        let gpu_idles = idle.spare || gpu_free.is_some_and(|t| t <= now);
        let gpu_free = gpu_free.unwrap_or(Instant::ZERO);
        // Without early drop (item 5) deferred gathers lazily.
        let gather = if d.has(Departure::EarlyDrop) { cfg.gather } else { Gather::Lazy };
        // The rate estimate does not change within a gather: read once
        // (each read divides; three of each per request before).
        let mean_gap = self.rate.mean_gap(now);
        let gap_cv2 = self.rate.gap_cv2();
        let target = mean_gap.map(|gap| self.target_batch_memo(gap, delay));
        let window = match gather {
            Gather::Lazy => 1,
            Gather::Early => {
                // Bursty arrivals: the mean-gap target says little about
                // the rate inside a burst, so the tolerated shortfall
                // widens with the squared coefficient of variation of the
                // gaps, as the schedulable window does (Poisson: as set).
                self.early_drop_window(target.unwrap_or(1), gap_cv2, self.early_drop_fraction(cfg.early_drop_fraction, d), d)
            }
        };
        // The drop decision is the profile's (the early-drop window is
        // about the model's rate, not this GPU's speed): a GPU slower than
        // its profile makes the batch smaller, and drops only the heads
        // that not even a batch of one on it can serve.
        let (dl, bs) = self.drop_and_size(now, cfg, gpu_free, factor, window, out)?;
        let full = bs >= self.profile.max_batch();
        let latest = dl - self.profile.scaled_latency(bs, factor);
        let slow = factor.max(1.0);
        // A GPU that starts one of this model's requests alone cannot serve
        // a pair arriving just after it in time (`l(1) + l(2) > SLO`): a
        // batch started early locks the requests behind it out of that GPU.
        // Under clearly bursty arrivals those requests are moments away and
        // come in groups (the mean gap is dominated by the quiet spells
        // between bursts), so the two
        // shortcuts that end deferral early, the efficiency stop at the mean
        // rate's target and the window of `window_gaps x CV^2` mean gaps,
        // are off: the batch defers to the paper's frontrun (docs/
        // decisions.md, deferred items 12 and 13). That bets on a GPU being
        // free at the frontrun: on a cluster with no GPU idle the narrow
        // window mostly closes before one frees, so the rule holds only
        // while one idles.
        let burst_locked = d.has(Departure::BurstLock) && idle.spare && self.pair_locked_out && self.rate.maybe_bursty(gap_cv2, d.has(Departure::EarlyBurstTest));
        // Without a rate estimate there is no target: defer as for the SLO.
        // Nor with many GPUs idle (deferred item 30): the efficiency stop
        // at the target ends deferral early so that a later batch finds a
        // GPU, and with three idle a later batch finds one anyway. The
        // batch then grows to what its deadline allows and the GPU time
        // spent follows the load (at half of Table 2's load: idle 51.3% ->
        // 52.1%, goodput unchanged).
        // Without item 11 the stop aims at the SLO-bound batch throughout.
        let target = match (gather, target) {
            (Gather::Early, Some(t)) if d.has(Departure::StopAtTarget) && !burst_locked && !(idle.many && d.has(Departure::ManyIdleDeferToSlo)) => t,
            _ => self.best_batch,
        };
        let view = Deferral { dl, bs, slow, mean_gap, gap_cv2, idle, burst_locked };
        let exec_at = if full || (d.has(Departure::LightLoad) && gpu_idles && self.light_load(now, dl, bs, mean_gap)) {
            Instant::ZERO
        } else if d.has(Departure::EfficiencyStop) && self.near_best_efficiency(bs, target, cfg.efficiency_slack) {
            self.partner_hold(&view, d)
        } else {
            self.frontrun_start(&view, cfg)
        };
        let (level, urgency) = self.top_level_urgency(dl, bs, latest, factor);
        Some(Candidate { bs, exec_at, latest, level, urgency, exec: self.profile.scaled_latency(bs, factor), recent_loss_bp: self.loss.basis_points() })
    }

    /// The batch [`Self::gather`] offers, `(earliest deadline, size)`,
    /// after the heads the policy drops (`window`: the early-drop window
    /// of the lowest level) are gone; `None` with nothing queued.
    fn drop_and_size(&mut self, now: Instant, cfg: &CoreConfig, gpu_free: Instant, factor: f64, window: u32, out: &mut Actions) -> Option<(Instant, u32)> {
        loop {
            self.drop_heads(now, &cfg.delay, gpu_free, window, out);
            if let Some(c) = self.size_batch(now, cfg, gpu_free, factor) {
                return Some(c);
            }
            let q = self.queues.iter_mut().find(|q| !q.is_empty())?;
            if factor <= 1.0 {
                // Unreachable after the drop loop (a batch of one fits the
                // head); kept total so a profile rounding quirk cannot
                // stall a model.
                return None;
            }
            // Not even one fits on this slow GPU: the head cannot run here
            // in time. Handing the GPU back would only have it granted
            // again at once; the head goes.
            if let Some(head) = q.pop_front() {
                self.loss.dropped();
                out.drops.push((head, out_of_time(&head)));
            }
        }
    }

    /// Drops the heads that cannot be served: at the lowest level those
    /// that would force a batch below `window`, at a higher one those not
    /// even a batch of one can serve.
    fn drop_heads(&mut self, now: Instant, delay: &NetworkDelay, gpu_free: Instant, window: u32, out: &mut Actions) {
        let profile = &self.profile;
        let lowest = self.queues.len() - 1;
        for (level, q) in self.queues.iter_mut().enumerate() {
            // Early drop trades heads for efficient batches: only the
            // lowest level pays for it; a higher level's head goes only
            // when not even a batch of one can serve it.
            let window = if level == lowest { window } else { 1 };
            while let Some(&head) = q.front() {
                let w = window.min(q.len() as u32).max(1);
                if Self::fits_head(profile, now, delay, gpu_free, w, head.deadline) {
                    break;
                }
                let reason = if w > 1 && Self::fits_head(profile, now, delay, gpu_free, 1, head.deadline) {
                    DropReason::EarlyDrop
                } else {
                    out_of_time(&head)
                };
                q.pop_front();
                self.loss.dropped();
                out.drops.push((head, reason));
            }
        }
    }

    /// The largest feasible batch over the priority levels, `(earliest
    /// deadline, size)`; `None` when not even a batch of one fits.
    fn size_batch(&self, now: Instant, cfg: &CoreConfig, gpu_free: Instant, factor: f64) -> Option<(Instant, u32)> {
        let delay = &cfg.delay;
        // The batch takes the levels in order, highest first, each by
        // deadline: every request of a level goes in before any of the
        // next, so lower-priority work never takes a place a
        // higher-priority request could have had. The batch's deadline
        // is its members' earliest; the largest feasible batch is found
        // level by level (one level: exactly the single-queue rule).
        let mut taken = 0u32;
        let mut chosen: Option<(Instant, u32)> = None;
        let max_batch = self.profile.max_batch();
        let lowest = self.queues.len() - 1;
        let profile = &self.profile;
        let size = |dl: Instant, limit: u32| Self::batch_by(profile, now, delay, gpu_free, dl, limit, factor);
        for (level, q) in self.queues.iter().enumerate() {
            let Some(head) = q.front() else { continue };
            let own = if level < lowest { head.deadline - cfg.priority_reserve } else { head.deadline };
            let dl = chosen.map_or(own, |(d, _)| d.min(own));
            let level_end = taken.saturating_add(q.len() as u32);
            let limit = level_end.min(max_batch);
            let bs = size(dl, limit);
            if bs <= taken {
                if own < head.deadline && taken == 0 {
                    // Not even this level's head fits its reserve: it
                    // runs without one, and no lower level joins.
                    let dl = head.deadline;
                    let bs = size(dl, limit);
                    if bs > 0 {
                        chosen = Some((dl, bs));
                    }
                }
                break;
            }
            chosen = Some((dl, bs));
            if bs < level_end {
                break;
            }
            taken = level_end;
        }
        chosen
    }

    /// When a batch that stopped deferring at its efficiency target
    /// starts: at once, or (item 22) when a partner becomes unlikely.
    fn partner_hold(&self, view: &Deferral, d: DepartureSet) -> Instant {
        let Deferral { dl, bs, slow, gap_cv2, idle, .. } = *view;
        // A model that locks out a pair behind a lone request but whose
        // pair is not worth holding a GPU to the frontrun (item 19)
        // still waits, under strong bursts with a GPU idle, while a
        // partner is likely: a burst's requests come microseconds to
        // a millisecond apart, and two run apart take two GPUs that the
        // rest of the burst then lacks (deferred item 22). With three
        // GPUs idle a lone start still leaves two (partner and burst),
        // so it holds only while a partner is as likely as not (item
        // 24).
        let hold = d.has(Departure::PartnerHold)
            && idle.spare
            && self.lone_locks_out_pair
            && !self.pair_locked_out
            && bs < self.best_batch
            && gap_cv2.is_some_and(|c| c > FILL_FLOOR_MAX_CV2);
        if hold {
            let frontrun = dl - self.profile.scaled_latency(bs + 1, slow);
            let chance = if idle.many && d.has(Departure::ManyIdlePartner) { MANY_IDLE_PARTNER_CHANCE } else { PARTNER_HOLD_CHANCE };
            self.rate.quiet_start(frontrun, chance).unwrap_or(Instant::ZERO)
        } else {
            Instant::ZERO
        }
    }

    /// When a deferring batch's window opens: the frontrun, or earlier
    /// (the mean-gap window, a quiet burst, a closed loop's clients all
    /// back).
    fn frontrun_start(&self, view: &Deferral, cfg: &CoreConfig) -> Instant {
        let Deferral { dl, bs, slow, mean_gap, gap_cv2, idle, burst_locked } = *view;
        let d = cfg.departures;
        // Frontrun, `d - l(bs+1)`. Waiting until the last moment buys at
        // most the requests that arrive meanwhile; within the final
        // `window_gaps` expected inter-arrival gaps that is likely none,
        // while a window as narrow as `alpha` drops the head whenever no
        // GPU frees inside it. See docs/decisions.md.
        // The gaps count in Poisson units, widened by the squared
        // coefficient of variation of the recent gaps when the arrivals
        // are burstier than Poisson: the chance that the last stretch
        // before `latest` brings no request grows with burstiness
        // (Gamma(0.2): five times the Poisson window). Never narrower
        // than Poisson's: with evenly spaced arrivals the window would
        // shrink to `alpha`, too narrow for a GPU slower than its
        // profile (the closed loop's factor) to start in.
        // Burst-locked: no widening (only `min_window`).
        let frontrun = dl - self.profile.scaled_latency(bs + 1, slow);
        let gap = match mean_gap {
            Some(g) if !burst_locked && d.has(Departure::WindowGaps) => Duration::from_nanos((g.as_nanos() as f64 * cfg.window_gaps * gap_cv2.unwrap_or(1.0).max(1.0)) as u64),
            _ => Duration::ZERO,
        };
        let at = frontrun.min((dl - self.profile.scaled_latency(bs, slow)) - cfg.min_window.max(gap));
        // Burstier than Poisson: also stop once a burst has gone quiet
        // (the next request is no longer all but certain before the
        // frontrun, given the quiet so far and the recent gaps). The
        // mean-gap window above knows the average burstiness, not
        // whether a burst is under way (deferred item 18).
        // Burst-locked models wait for the frontrun as before: there a
        // batch started early locks out the pair behind it.
        // With three GPUs idle a lone request started before the
        // frontrun still leaves two: one for its partner, one for the
        // rest of the burst. So a burst-locked batch waits for its
        // partner only while one is at least as likely as not to come
        // by the frontrun (deferred item 24).
        // While another model takes the cluster's losses alone, the
        // GPU this batch would take late is one that model's next
        // burst needs: the batch waits for its partner only while one
        // is still fairly likely (deferred item 28).
        // A long runner's quiet stop needs quiet (item 33): where even
        // right after an arrival a next one before the frontrun is less
        // likely than the chance (heavy-tailed gaps, a long horizon), the
        // test answers the newest arrival itself and says nothing about a
        // burst; the lone requests it would start at once hold GPUs
        // longer than another model's requests can wait.
        let needs_quiet = self.long_runner && d.has(Departure::LongRunnerQuiet);
        let quiet = if !burst_locked && d.has(Departure::QuietStop) && gap_cv2.is_some_and(|c| c > QUIET_STOP_MIN_CV2) {
            self.rate.quiet_start(frontrun, QUIET_STOP_CHANCE).filter(|&at| !needs_quiet || at > self.rate.newest())
        } else if burst_locked && idle.many && d.has(Departure::ManyIdlePartner) {
            self.rate.quiet_start(frontrun, MANY_IDLE_PARTNER_CHANCE)
        } else if burst_locked && d.has(Departure::YieldToLoser) && self.another_takes_the_losses() {
            self.rate.quiet_start(frontrun, YIELDING_PARTNER_CHANCE)
        } else {
            None
        };
        let at = quiet.map_or(at, |q| at.min(q));
        // A closed loop's clients are all back by `all_back_at`: no
        // request comes after it until a batch is dispatched.
        match self.follow_ups.all_back_at() {
            Some(b) if d.has(Departure::FollowUps) => at.min(b),
            _ => at,
        }
    }

    /// The batch's highest priority level and the latest start that still
    /// serves that level's members.
    fn top_level_urgency(&self, dl: Instant, bs: u32, latest: Instant, factor: f64) -> (u16, Instant) {
        let level = self.queues.iter().position(|q| !q.is_empty()).unwrap_or(0);
        // The top level's own deadline and share of the batch (one level:
        // exactly `latest`).
        let urgency = match self.queues.get(level).and_then(|q| q.front().map(|h| (h.deadline, q.len() as u32))) {
            Some((d_top, n_top)) if n_top < bs || d_top > dl => d_top - self.profile.scaled_latency(bs.min(n_top), factor),
            _ => latest,
        };
        (level as u16, urgency)
    }

    /// What a pending candidate will be when its window opens, for the
    /// RankThread's plan: the batch grows at the current arrival rate until
    /// one more request would miss the head's deadline
    /// (`now + (b - bs) gap + l(b) <= deadline`), so the GPU time it will
    /// claim is `l(b)` from `deadline - l(b)` at the latest.
    fn projected(&self, now: Instant, c: Candidate) -> Candidate {
        let Some(gap) = self.rate.mean_gap(now).filter(|g| *g > Duration::ZERO) else { return c };
        let deadline = c.latest + c.exec;
        let budget = deadline.saturating_since(now) + gap.saturating_mul(u64::from(c.bs));
        let b = self.profile.max_batch_within(budget, gap, self.profile.max_batch()).max(c.bs);
        if b == c.bs {
            return c;
        }
        let exec = self.profile.latency(b);
        let latest = deadline - exec;
        Candidate { bs: b, exec_at: c.exec_at.min(latest), latest, level: c.level, urgency: c.urgency.min(latest), exec, recent_loss_bp: c.recent_loss_bp }
    }

    /// The batch a grant runs from the one queue of a model whose lone
    /// request locks out a pair (`b0`: the head's batch, as gathered):
    /// `(skip, size)`, members `skip..skip + size`. A head that can run
    /// only in a small batch holds a GPU for `l(1)` or more, longer than a
    /// request that comes after it can wait; when a larger batch behind it
    /// pays even counting the heads run apart (eager's rule, [`larger_batch_past_heads`])
    /// and the next GPU to free (`next_free`, at the profile's speed) could
    /// not run that batch as large, the heads stay queued for another GPU
    /// and this one runs the larger batch (deferred item 25). Where the
    /// next GPU could, the head runs here and the batch there, as before.
    fn batch_past_heads(&self, now: Instant, delay: &NetworkDelay, gpu_free: Instant, next_free: Instant, factor: f64, b0: u32) -> (usize, u32) {
        let p = &self.profile;
        let here = |deadline: Instant, limit: u32| Self::batch_by(p, now, delay, gpu_free, deadline, limit, factor);
        let next_could = |r: &Request, b: u32| Self::batch_by(p, now, delay, next_free, r.deadline, b, 1.0) >= b;
        larger_batch_past_heads(&self.queues[0], b0, p.max_batch(), |b| p.scaled_latency(b, factor), here, |r, b| !next_could(r, b))
    }

    /// Early drop's window: the smallest batch whose throughput per GPU is
    /// at least `fraction` of the target batch's (`e(b) = b / l(b)`). A head
    /// that would force a smaller batch costs more GPU time per request than
    /// the rate allows saving, so it goes; a head that merely keeps the batch
    /// a little below the target is served. For a weak batcher (large
    /// `alpha / beta`) this is a batch of one: nothing to protect.
    /// `O(log target)` (`e` grows with `b` for every profile with a fixed
    /// cost and a non-decreasing per-item cost).
    fn drop_window(&mut self, target: u32, fraction: f64) -> u32 {
        let key = (target, fraction.to_bits());
        if let Some((t, f, w)) = self.drop_window_memo {
            if (t, f) == key {
                return w;
            }
        }
        let w = self.drop_window_search(target, fraction);
        self.drop_window_memo = Some((key.0, key.1, w));
        w
    }

    /// The early-drop window at `target` for arrivals whose gaps have
    /// squared CV `gap_cv2`: [`Self::drop_window`] at `fraction`, whose
    /// tolerated shortfall widens with `max(1, CV^2)` (bursty arrivals:
    /// the mean-gap target says little about the rate inside a burst).
    /// Under arrivals no burstier than Gamma(0.5) (`CV^2 <=
    /// FILL_FLOOR_MAX_CV2`) the window is also at most
    /// [`poisson_fill_floor`]`(target)`: the target is what the *mean*
    /// rate fills, the count that arrives in a fill time varies about it
    /// (Poisson at least), and a window above what most fills reach drops
    /// heads whenever a fill comes short by chance, heads a GPU could have
    /// served (small targets: 1080Ti ResNet50 at 15 ms, target 3, `e(2) =
    /// 0.81 e(3)`, so the fraction alone protected the whole target).
    /// Under stronger bursts the cap is not applied: there the window is
    /// what stops the queue from collapsing into small batches after a
    /// burst (docs/decisions.md, deferred items 5, 16 and 17), and capping
    /// it cost 4-6% on small clusters.
    /// The widening stops at a third of the target
    /// ([`BURST_WINDOW_FLOOR_DIVISOR`]), or at the plain window where that
    /// is smaller: a shortfall in throughput per GPU is not one in batch
    /// size, and where `e(b)` is flat (1080Ti ResNet50 at 100 ms, target
    /// 30: `e(6) = 0.75 e(30)`) the widened fraction lets a backlog that
    /// outlives its burst run its oldest heads, each near its deadline, in
    /// batches of 6-16 that cannot keep up with the rate (deferred item 21).
    /// Items 17 and 21 are [`Departure::FillFloor`] and
    /// [`Departure::BurstWindowFloor`] in `d`.
    fn early_drop_window(&mut self, target: u32, gap_cv2: Option<f64>, fraction: f64, d: DepartureSet) -> u32 {
        let cv2 = gap_cv2.unwrap_or(1.0).max(1.0);
        let window = self.drop_window(target, 1.0 - (1.0 - fraction) * cv2);
        let fill_floor = d.has(Departure::FillFloor);
        let window = if fill_floor && gap_cv2.is_some_and(|c| c <= FILL_FLOOR_MAX_CV2) { window.min(self.fill_floor(target)) } else { window };
        let floor = target / BURST_WINDOW_FLOOR_DIVISOR;
        if d.has(Departure::BurstWindowFloor) && cv2 > 1.0 && window < floor {
            // Only here: a second fraction would evict the memo each gather.
            let plain = self.drop_window_search(target, fraction);
            let plain = if fill_floor { plain.min(self.fill_floor(target)) } else { plain };
            window.max(plain.min(floor))
        } else {
            window
        }
    }

    /// [`poisson_fill_floor`]`(target)`, remembered per target.
    fn fill_floor(&mut self, target: u32) -> u32 {
        match self.fill_floor_memo.get_mut(target as usize) {
            Some(known) if *known != 0 => *known,
            Some(unknown) => {
                *unknown = poisson_fill_floor(target);
                *unknown
            }
            None => poisson_fill_floor(target),
        }
    }

    /// [`Self::drop_window`] by binary search.
    fn drop_window_search(&self, target: u32, fraction: f64) -> u32 {
        let e = |b: u32| self.efficiency(b);
        let want = fraction * e(target.min(self.profile.max_batch()));
        let (mut lo, mut hi) = (1u32, target.clamp(1, self.profile.max_batch()));
        // Invariant: e(hi) >= want (or hi == target); the answer is in [lo, hi].
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if e(mid) >= want {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        lo
    }

    /// True when a batch of `b` already runs within `slack` of the best
    /// throughput per GPU it can reach: that of `target` (early drop: the
    /// batch the current rate fills in time), never more than the best the
    /// SLO allows (`e(b) = b / l(b)`). Deferring further would buy at most
    /// that much, while a GPU held idle for it may be missing when the
    /// next batches fall due (docs/decisions.md, deferred item 11).
    #[inline]
    fn near_best_efficiency(&self, b: u32, target: u32, slack: f64) -> bool {
        let e = |b: u32| self.efficiency(b);
        e(b) >= (1.0 - slack) * e(target.clamp(1, self.best_batch))
    }

    /// Light load (item 32, [`Departure::LightLoad`]): a batch of `bs`
    /// whose earliest member is due at `dl` gains too little from waiting
    /// to be worth the latency. Either the model's arrivals, served in
    /// batches of `bs`, need at most [`super::LIGHT_LOAD_SHARE`] of a GPU
    /// (at that load the throughput per GPU that deferral buys is not
    /// needed), or the requests expected at the mean gap by the batch's
    /// latest start would raise its throughput per GPU by less than
    /// [`super::LIGHT_LOAD_GAIN`] (a weak batcher, or too few arrivals).
    /// Before the second arrival (no rate known) a lone request is light.
    /// The caller asks only while a GPU idles.
    fn light_load(&self, now: Instant, dl: Instant, bs: u32, mean_gap: Option<Duration>) -> bool {
        let Some(gap) = mean_gap.filter(|g| *g > Duration::ZERO) else { return true };
        let e_now = self.efficiency(bs);
        let load = 1.0 / (e_now * gap.as_nanos() as f64);
        if load <= super::LIGHT_LOAD_SHARE {
            return true;
        }
        let latest = dl - self.profile.latency(bs);
        let expected = latest.saturating_since(now).as_nanos() / gap.as_nanos();
        let grown = (u64::from(bs) + expected).min(u64::from(self.best_batch.max(bs))) as u32;
        self.efficiency(grown) < (1.0 + super::LIGHT_LOAD_GAIN) * e_now
    }

    /// True when the candidate's window has opened: a batch decided now
    /// starts no earlier than its frontrun moment.
    #[inline]
    fn ready(now: Instant, delay: &NetworkDelay, c: &Candidate) -> bool {
        c.exec_at <= now + delay.of(c.bs)
    }

    /// Recomputes the candidate, tells the RankThread what changed, and
    /// returns when this model next needs attention.
    fn refresh(&mut self, now: Instant, cfg: &CoreConfig, idle: IdleGpus, out: &mut Actions, to_rank: &mut impl FnMut(ToRank), sent: &mut u64) -> Option<Instant> {
        let cand = self.gather(now, cfg, None, 1.0, idle, out);
        let delay = &cfg.delay;
        let ready = cand.filter(|c| Self::ready(now, delay, c));
        if ready != self.informed {
            self.informed = ready;
            self.informed_at = now;
            // The RankThread drops its pending copy on any `Candidate`.
            self.informed_pending = None;
            *sent += 1;
            to_rank(ToRank::Candidate { model: self.id, cand: ready });
        }
        // The pending candidate is projected once per head (the projection
        // already counts the arrivals to come), so the RankThread still
        // hears from a model about once per batch, not per request.
        let pending = if ready.is_some() { None } else { cand };
        let head = |c: &Candidate| (c.latest + c.exec, c.level);
        if pending.as_ref().map(head) != self.informed_pending.as_ref().map(head) {
            let pending = pending.map(|c| self.projected(now, c));
            self.informed_pending = pending;
            *sent += 1;
            to_rank(ToRank::Pending { model: self.id, cand: pending });
        }
        let wake = cand.map(|c| {
            let lead = delay.of(c.bs);
            // One nanosecond after this, a batch of `bs` can no longer make it:
            // recompute (shrink the batch, or drop the head).
            let invalid_at = (c.latest - lead) + Duration::from_nanos(1);
            if ready.is_some() {
                invalid_at
            } else {
                (c.exec_at - lead).min(invalid_at)
            }
        });
        if self.queues.len() == 1 {
            return wake;
        }
        // With priority levels, a lower level's head may be outside the
        // candidate: wake when not even a batch of one could serve it, so
        // it is answered at once (a timeout, typically), not at the next
        // arrival.
        let one = self.profile.scaled_latency(1, 1.0) + delay.of(1);
        let heads = self.queues.iter().filter_map(|q| q.front()).map(|h| (h.deadline - one) + Duration::from_nanos(1)).min();
        match (wake, heads) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Requests waiting, every level together.
    fn queued(&self) -> usize {
        self.queues.iter().map(VecDeque::len).sum()
    }
}

/// `e(b) = b / l(b)` (see [`ModelState::efficiency`]).
#[inline]
fn efficiency_of(profile: &LatencyProfile, b: u32) -> f64 {
    f64::from(b) / profile.latency(b).as_nanos().max(1) as f64
}

/// Inserts `r` into `q` keeping it sorted by deadline; with one SLO per
/// model and no timeouts this is always a push to the back.
fn insert_by_deadline(q: &mut VecDeque<Request>, r: Request) {
    let mut pos = q.len();
    while pos > 0 && q[pos - 1].deadline > r.deadline {
        pos -= 1;
    }
    if pos == q.len() {
        // The common case; `insert` at the end still goes through its
        // general (memmove) path.
        q.push_back(r);
    } else {
        q.insert(pos, r);
    }
}

/// The ModelThread core: owns a set of models and their timers.
pub struct ModelThreadCore {
    cfg: CoreConfig,
    models: Vec<ModelState>,
    /// Global model id -> index in `models`, or [`NOT_OWNED`].
    local: Vec<u32>,
    /// Per local model: when it wants a refresh.
    wakes: IndexedHeap<Instant>,
    /// The closed loop's latency factor of each GPU (absent: 1).
    gpu_factors: Vec<f64>,
    /// When the first [`MANY_IDLE_GPUS`] GPUs are free, earliest first, as
    /// of the last grant this core received: the RankThread's
    /// [`Grant::other_free_at`] and [`Grant::more_free_at`] and the
    /// granted GPU's own free time (its batch ends, or it was handed back).
    /// At or before now: that many GPUs idle. Before the first grant the
    /// core knows only that some GPU is free (a cluster has at least one),
    /// not that three are: a 2-GPU cluster never has three idle, and
    /// reading them there let item 30 defer its first batches.
    spare_gpus_at: [Instant; MANY_IDLE_GPUS],
    stats: ModelThreadStats,
}

/// Sets `table[gpu] = value`, growing the table (new entries NaN, which
/// both readers take as "not set") only when a new GPU id appears.
fn set_factor(table: &mut Vec<f64>, gpu: GpuId, value: f64) {
    let g = gpu as usize;
    if table.len() <= g {
        table.resize(g + 1, f64::NAN);
    }
    table[g] = value;
}

impl ModelThreadCore {
    /// A core owning `models` (global id, spec).
    pub fn new(cfg: CoreConfig, models: Vec<(ModelId, ModelSpec)>) -> Self {
        let max_id = models.iter().map(|(id, _)| *id as usize + 1).max().unwrap_or(0);
        let mut local = vec![NOT_OWNED; max_id];
        // The two tightest SLOs: each model's tightest other is the first,
        // or the second for the model that has the first.
        let mut slos: Vec<Duration> = models.iter().map(|(_, s)| s.slo).collect();
        slos.sort_unstable();
        let states: Vec<ModelState> = models
            .into_iter()
            .enumerate()
            .map(|(i, (id, spec))| {
                local[id as usize] = i as u32;
                let lone_locks_out_pair = spec.profile.latency(1) + spec.profile.latency(2) > spec.slo;
                let tightest_other = if slos.first() == Some(&spec.slo) { slos.get(1) } else { slos.first() };
                let long_runner = tightest_other.is_some_and(|&other| spec.profile.latency(1) > other);
                // Without item 19 every model whose lone request locks out
                // a pair is pair-locked.
                let pair_locked_out = lone_locks_out_pair && (!cfg.departures.has(Departure::PairWorth) || pair_worth_waiting_for(&spec.profile));
                let best_batch = (1..=spec.profile.max_batch_within(spec.slo, Duration::ZERO, u32::MAX).max(1))
                    .max_by(|&a, &b| spec.profile.throughput_rps(a).total_cmp(&spec.profile.throughput_rps(b)))
                    .unwrap_or(1);
                let efficiency = (1..=spec.profile.max_batch()).map(|b| efficiency_of(&spec.profile, b)).collect();
                let fill_floor_memo = vec![0; (spec.profile.max_batch() as usize).min(FILL_FLOOR_MEMO_MAX) + 1];
                ModelState {
                    id,
                    best_batch,
                    pair_locked_out,
                    lone_locks_out_pair,
                    long_runner,
                    profile: spec.profile,
                    slo: spec.slo,
                    queues: vec![VecDeque::with_capacity(256)],
                    admission: Admission::default(),
                    informed: None,
                    informed_at: Instant::ZERO,
                    informed_pending: None,
                    rate: RateWindow::new(),
                    gpu_factors: Vec::new(),
                    efficiency,
                    target_memo: 0,
                    drop_window_memo: None,
                    loss: RecentLoss::default(),
                    follow_ups: FollowUps::default(),
                    others_loss_bp: None,
                    fill_floor_memo,
                }
            })
            .collect();
        let n = states.len();
        ModelThreadCore { cfg, models: states, local, wakes: IndexedHeap::with_ids(n), gpu_factors: Vec::new(), spare_gpus_at: UNKNOWN_SPARE_GPUS, stats: ModelThreadStats::default() }
    }

    /// The network delay bound later decisions charge (the delay watch
    /// adopted an observed one).
    pub fn set_delay(&mut self, delay: NetworkDelay) {
        self.cfg.delay = delay;
    }

    /// Closed loop: batches on `gpu` take `factor` times their profiled
    /// time (every model without a factor of its own there). Not a
    /// positive finite number: back to the profile (1).
    pub fn set_gpu_factor(&mut self, gpu: GpuId, factor: f64) {
        set_factor(&mut self.gpu_factors, gpu, if factor.is_finite() && factor > 0.0 { factor } else { 1.0 });
    }

    /// Closed loop: batches of `model` on `gpu` take `factor` times their
    /// profiled time; `None` (or not a positive finite number) falls back
    /// to the GPU's factor. A model this core does not own is ignored.
    pub fn set_model_gpu_factor(&mut self, model: ModelId, gpu: GpuId, factor: Option<f64>) {
        if let Some(i) = self.local_index(model) {
            let f = factor.filter(|f| f.is_finite() && *f > 0.0).unwrap_or(f64::NAN);
            set_factor(&mut self.models[i].gpu_factors, gpu, f);
        }
    }

    /// The factor batches of local model `i` on `gpu` are planned with.
    #[inline]
    fn factor(&self, i: usize, gpu: GpuId) -> f64 {
        let g = gpu as usize;
        match self.models[i].gpu_factors.get(g) {
            Some(f) if !f.is_nan() => *f,
            _ => match self.gpu_factors.get(g) {
                Some(f) if !f.is_nan() => *f,
                _ => 1.0,
            },
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> ModelThreadStats {
        self.stats
    }

    /// Requests waiting in this core's queues.
    pub fn queued(&self) -> usize {
        self.models.iter().map(ModelState::queued).sum()
    }

    /// Requests waiting in `model`'s queue (0 if not ours).
    pub fn queued_of(&self, model: ModelId) -> usize {
        self.local_index(model).map_or(0, |i| self.models[i].queued())
    }

    /// Sets `model`'s priority levels, default level and queue bound.
    /// Requests already waiting keep their place (a lower level count
    /// folds the levels past it into the new lowest). A model this core
    /// does not own is ignored.
    pub fn set_admission(&mut self, model: ModelId, admission: Admission) {
        let Some(i) = self.local_index(model) else { return };
        let levels = usize::from(admission.levels.max(1));
        let admission = Admission { levels: levels as u16, default_level: admission.default_level.clamp(1, levels as u16), ..admission };
        let m = &mut self.models[i];
        m.admission = admission;
        while m.queues.len() > levels {
            let folded = m.queues.pop().unwrap_or_default();
            if let Some(last) = m.queues.last_mut() {
                for r in folded {
                    insert_by_deadline(last, r);
                }
            }
        }
        while m.queues.len() < levels {
            m.queues.push(VecDeque::with_capacity(64));
        }
    }

    /// The largest batch any owned model supports.
    pub fn max_batch(&self) -> u32 {
        self.models.iter().map(|m| m.profile.max_batch()).max().unwrap_or(1)
    }

    /// The earliest time any owned model wants a refresh.
    pub fn poll_at(&self) -> Option<Instant> {
        self.wakes.peek().map(|(t, _)| t)
    }

    fn local_index(&self, model: ModelId) -> Option<usize> {
        match self.local.get(model as usize) {
            Some(&i) if i != NOT_OWNED => Some(i as usize),
            _ => None,
        }
    }

    fn refresh(&mut self, i: usize, now: Instant, out: &mut Actions, to_rank: &mut impl FnMut(ToRank)) {
        let drops_before = out.drops.len();
        let idle = IdleGpus { spare: self.spare_gpus_at[0] <= now, many: self.spare_gpus_at[MANY_IDLE_GPUS - 1] <= now };
        let mut wake = self.models[i].refresh(now, &self.cfg, idle, out, to_rank, &mut self.stats.to_rank);
        self.stats.drops += (out.drops.len() - drops_before) as u64;
        // Light load (item 32) is asked only while a GPU idles: a request
        // that arrives while every GPU this core knows of is busy would wait
        // for its window (up to a mean gap before its latest start) although
        // the first GPU frees long before. Look again when that one frees.
        if self.cfg.departures.has(Departure::LightLoad) && !idle.spare && self.models[i].queued() > 0 {
            let first_free = self.spare_gpus_at[0];
            wake = wake.map(|w| w.min(first_free));
        }
        match wake {
            Some(t) => self.wakes.set(i as u32, t),
            None => {
                self.wakes.remove(i as u32);
            }
        }
    }

    /// Frontend -> ModelThread: a new request.
    pub fn on_request(&mut self, now: Instant, req: Request, out: &mut Actions, to_rank: &mut impl FnMut(ToRank)) {
        let Some(i) = self.local_index(req.model) else {
            out.drops.push((req, DropReason::UnknownModel));
            self.stats.drops += 1;
            return;
        };
        let m = &mut self.models[i];
        let level = m.admission.level_index(req.priority);
        let bound = m.admission.max_queue as usize;
        if bound > 0 && m.queued() >= bound {
            // Full: make room by evicting the latest request of a lower
            // level, or refuse this one at once. Either way the answer is
            // immediate, never a wait for the deadline.
            let lowest = m.queues.iter().rposition(|q| !q.is_empty());
            let victim = match lowest {
                Some(j) if j > level => m.queues[j].pop_back(),
                _ => None,
            };
            self.stats.refused += 1;
            self.stats.drops += 1;
            match victim {
                Some(v) => out.drops.push((v, DropReason::Overloaded)),
                None => {
                    out.drops.push((req, DropReason::Overloaded));
                    return;
                }
            }
        }
        self.stats.requests += 1;
        let m = &mut self.models[i];
        // Only admitted requests count towards the rate: the estimate says
        // how fast batches fill.
        m.rate.record(now);
        m.follow_ups.arrived(now);
        m.loss.admitted();
        insert_by_deadline(&mut m.queues[level], req);
        self.refresh(i, now, out, to_rank);
    }

    /// Frontend -> ModelThread: the client gave request `id` of `model` up.
    /// If it is still waiting (not yet in a dispatched batch) it leaves the
    /// queue and is answered as [`DropReason::Cancelled`]; returns whether
    /// it was. O(queue length): cancellations are rare next to arrivals.
    pub fn cancel(&mut self, now: Instant, model: ModelId, id: RequestId, out: &mut Actions, to_rank: &mut impl FnMut(ToRank)) -> bool {
        let Some(i) = self.local_index(model) else { return false };
        let m = &mut self.models[i];
        let found = m.queues.iter_mut().find_map(|q| q.iter().position(|r| r.id == id).and_then(|p| q.remove(p)));
        let Some(req) = found else { return false };
        out.drops.push((req, DropReason::Cancelled));
        self.stats.cancelled += 1;
        self.stats.drops += 1;
        self.refresh(i, now, out, to_rank);
        true
    }

    /// RankThread -> ModelThread: a GPU is reserved for one of our models.
    pub fn on_grant(&mut self, now: Instant, g: Grant, out: &mut Actions, to_rank: &mut impl FnMut(ToRank)) {
        let Some(i) = self.local_index(g.model) else {
            // Not ours: hand the GPU straight back.
            to_rank(ToRank::GpuFree { gpu: g.gpu, free_at: g.free_at });
            return;
        };
        let cfg = self.cfg;
        let factor = self.factor(i, g.gpu);
        let m = &mut self.models[i];
        m.others_loss_bp = g.others_loss_bp;
        // The RankThread dropped its copy of our candidate when it granted.
        let was_ready = m.informed.take().is_some();
        // So did it its pending copy.
        m.informed_pending = None;
        let drops_before = out.drops.len();
        // The granted GPU is the batch's; the grant tells of the next three.
        self.spare_gpus_at = [g.other_free_at, g.more_free_at[0], g.more_free_at[1]];
        let idle = IdleGpus { spare: g.other_free_at <= now, many: g.more_free_at[0] <= now };
        let cand = m.gather(now, &cfg, Some(g.free_at), factor, idle, out);
        self.stats.drops += (out.drops.len() - drops_before) as u64;
        let start_at = |bs: u32| ModelState::earliest(now, &cfg.delay, g.free_at, bs);
        match cand {
            // With priority levels the grant's batch may leave out a lower
            // level that the profile's candidate had (a slower GPU fits
            // fewer), which moves its window later; handing the GPU back
            // would only have the same candidate granted again at once.
            // The window was open when the candidate was offered: take it.
            // An early grant (the work-conserving fallback) runs the batch
            // the queue holds now, before its window.
            Some(c) if c.exec_at <= start_at(c.bs) || g.early || (was_ready && m.queues.len() > 1) => {
                let lead = cfg.delay.of(c.bs);
                let planned_at = m.informed_at.max(g.free_at - lead).max(c.exec_at - lead).min(now);
                // A model whose lone request locks out a pair may pass its
                // first heads over for a larger batch behind them (deferred
                // item 25); with priority levels the batch keeps level order.
                let (skip, bs) = if cfg.departures.has(Departure::BatchPastHeads) && m.lone_locks_out_pair && m.queues.len() == 1 {
                    m.batch_past_heads(now, &cfg.delay, g.free_at, g.other_free_at, factor, c.bs)
                } else {
                    (0, c.bs)
                };
                let exec_at = start_at(bs);
                let finish_at = exec_at + m.profile.scaled_latency(bs, factor);
                if skip > 0 {
                    out.push_batch(g.gpu, m.id, exec_at, finish_at, planned_at, m.queues[0].drain(skip..skip + bs as usize));
                } else {
                    // The batch is the first `bs` requests in level order
                    // (what `gather` sized it from).
                    let mut left = bs as usize;
                    let members = m.queues.iter_mut().flat_map(|q| {
                        let k = left.min(q.len());
                        left -= k;
                        q.drain(..k)
                    });
                    out.push_batch(g.gpu, m.id, exec_at, finish_at, planned_at, members);
                }
                m.follow_ups.dispatched(finish_at, bs);
                self.stats.batches += 1;
                self.stats.to_rank += 1;
                self.note_gpu_free(finish_at);
                to_rank(ToRank::GpuFree { gpu: g.gpu, free_at: finish_at });
            }
            _ => {
                self.stats.grants_returned += 1;
                self.stats.to_rank += 1;
                self.note_gpu_free(g.free_at);
                to_rank(ToRank::GpuFree { gpu: g.gpu, free_at: g.free_at });
            }
        }
        self.refresh(i, now, out, to_rank);
    }

    /// A GPU this core held is free at `t` (its batch ends, or it was
    /// handed back): it joins the earliest free GPUs it knows of.
    fn note_gpu_free(&mut self, t: Instant) {
        let s = &mut self.spare_gpus_at;
        if t < s[MANY_IDLE_GPUS - 1] {
            s[MANY_IDLE_GPUS - 1] = t;
            s.sort_unstable();
        }
    }

    /// Timer: refreshes every model whose wake time has come.
    pub fn on_wake(&mut self, now: Instant, out: &mut Actions, to_rank: &mut impl FnMut(ToRank)) {
        while let Some((t, i)) = self.wakes.peek() {
            if t > now {
                break;
            }
            self.refresh(i as usize, now, out, to_rank);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn core(alpha_ms: f64, beta_ms: f64) -> ModelThreadCore {
        core_at(alpha_ms, beta_ms, 25.0)
    }

    /// One model with a linear profile at `slo_ms`.
    fn core_at(alpha_ms: f64, beta_ms: f64, slo_ms: f64) -> ModelThreadCore {
        let spec = ModelSpec::linear("m", alpha_ms, beta_ms, slo_ms).expect("a valid profile");
        ModelThreadCore::new(CoreConfig::default(), vec![(0, spec)])
    }

    /// Whether such a model is pair-locked (deferred items 13 and 19).
    fn locked(alpha_ms: f64, beta_ms: f64, slo_ms: f64) -> bool {
        core_at(alpha_ms, beta_ms, slo_ms).models[0].pair_locked_out
    }

    #[test]
    fn the_gap_variation_is_zero_for_even_arrivals_and_large_for_bursts() {
        let ms = |n: u64| Instant::from_nanos(n * 1_000_000);
        let mut even = RateWindow::new();
        for i in 0..1000 {
            even.record(ms(i));
        }
        assert!(even.gap_cv2().is_some_and(|c| c < 1e-9), "{:?}", even.gap_cv2());
        // Bursts of ten back-to-back arrivals every 100 ms (window wrapped).
        let mut bursty = RateWindow::new();
        for i in 0..1000u64 {
            bursty.record(Instant::from_nanos((i / 10) * 100_000_000 + (i % 10) * 1_000));
        }
        assert!(bursty.gap_cv2().is_some_and(|c| c > 5.0), "{:?}", bursty.gap_cv2());
        assert!(bursty.mean_gap(Instant::from_nanos(9_900_009_000)).is_some_and(|g| g > Duration::from_millis(9)));
    }

    #[test]
    fn a_burst_is_waited_out_and_a_quiet_spell_is_not() {
        // Bursts of ten arrivals 1 µs apart every 100 ms (window wrapped):
        // nine gaps in ten are 1 µs.
        let mut w = RateWindow::new();
        let mut last = Instant::ZERO;
        for i in 0..1000u64 {
            last = Instant::from_nanos(1_000_000_000 + (i / 10) * 100_000_000 + (i % 10) * 1_000);
            w.record(last);
        }
        let cdf = |x: u64| w.gap_cdf(Duration::from_nanos(x)).expect("known");
        assert!((cdf(2_047) - 0.9).abs() < 0.01, "{}", cdf(2_047));
        assert!(cdf(200_000_000) > 0.999);
        // A frontrun 5 ms away: the next request comes by then with chance
        // 0.9 right after an arrival, so only the burst's 1 µs gaps are
        // waited out (at the quantile, within their octave)...
        let start = w.quiet_start(last + Duration::from_millis(5), 0.5).expect("known");
        assert!(start.saturating_since(last) <= Duration::from_nanos(2_048), "{:?}", start.saturating_since(last));
        // ... and a near-certain chance is asked for: no wait at all.
        assert_eq!(w.quiet_start(last + Duration::from_millis(5), QUIET_STOP_CHANCE), Some(last));
        // A frontrun past the next burst: that burst is all but certain to
        // start first, so the wait runs into the long gaps' octave.
        let start = w.quiet_start(last + Duration::from_millis(150), QUIET_STOP_CHANCE).expect("known");
        assert!(start.saturating_since(last) > Duration::from_millis(60), "{:?}", start.saturating_since(last));
        // Too few arrivals: nothing known.
        let mut few = RateWindow::new();
        for i in 0..10u64 {
            few.record(Instant::from_nanos(i * 1_000));
        }
        assert_eq!(few.quiet_start(Instant::from_nanos(1_000_000), 0.5), None);
    }

    #[test]
    fn poisson_gaps_stop_about_the_chance_s_mean_gaps_before_the_frontrun() {
        use rand::SeedableRng as _;
        use rand_distr::{Distribution as _, Exp};
        let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(7);
        let gap = Exp::new(1.0 / 10e6).expect("a valid rate"); // mean 10 ms
        let mut w = RateWindow::new();
        let mut t = 1e9;
        for _ in 0..1000 {
            t += gap.sample(&mut rng);
            w.record(Instant::from_nanos(t as u64));
        }
        let last = Instant::from_nanos(t as u64);
        // Chance 1 - 1/e: one mean gap (10 ms) before a frontrun 60 ms
        // away, so about 50 ms after the last arrival (octave-linear CDF:
        // within 20%).
        let start = w.quiet_start(last + Duration::from_millis(60), 1.0 - (-1.0f64).exp()).expect("known");
        let waited = start.saturating_since(last).as_millis_f64();
        assert!((40.0..=60.0).contains(&waited), "{waited} ms");
    }

    #[test]
    fn a_model_locking_out_pairs_waits_for_the_frontrun_only_under_bursts_with_a_gpu_idle() {
        // A100 EfficientNetV2S at SLO 15 ms: l(1) = 8.8 ms, l(2) = 10.3 ms.
        let start_with = |arrivals: u64, bursty: bool, idle: IdleGpus| {
            let mut c = core_at(1.454, 7.378, 15.0);
            let m = &mut c.models[0];
            assert!(m.pair_locked_out);
            // Mean gap 10 ms: bursts of five 1 us apart every 50 ms, or one
            // every 10 ms with a Poisson-like spread of gaps.
            let mut t = 0u64;
            for i in 0..arrivals {
                t += if bursty { if i % 5 == 0 { 50_000_000 - 4_000 } else { 1_000 } } else { [2, 6, 10, 14, 18][(i * 3 % 5) as usize] * 1_000_000 };
                m.rate.record(Instant::from_nanos(t));
            }
            let now = Instant::from_nanos(t);
            m.queues[0].push_back(Request::new(1, 0, now, now + Duration::from_millis(15)));
            let cand = m.gather(now, &c.cfg, None, 1.0, idle, &mut Actions::default()).expect("a candidate");
            cand.exec_at.saturating_since(now)
        };
        let start_after = |arrivals: u64, bursty: bool, spare: bool| start_with(arrivals, bursty, IdleGpus { spare, many: false });
        let start = |bursty: bool, spare_gpu: bool| start_after(600, bursty, spare_gpu);
        // Bursty: wait until the frontrun d - l(2) (4.7 ms after arrival).
        let wait = start(true, true);
        assert!(wait > Duration::from_millis(4) && wait < Duration::from_millis(5), "{wait:?}");
        // Steady arrivals: the batch the rate fills is one, so it starts now.
        assert_eq!(start(false, true), Duration::ZERO);
        // No GPU idle: it takes the next one that frees, as without bursts.
        assert_eq!(start(true, false), Duration::ZERO);
        // Twenty arrivals: the early test decides (see the next test).
        let wait = start_after(20, true, true);
        assert!(wait > Duration::from_millis(4) && wait < Duration::from_millis(5), "{wait:?}");
        assert_eq!(start_after(20, false, true), Duration::ZERO);
        // The first two arrivals tell nothing: the frontrun.
        let wait = start_after(2, false, true);
        assert!(wait > Duration::from_millis(4) && wait < Duration::from_millis(5), "{wait:?}");
        // Three GPUs idle: a lone request started early still leaves two
        // (its partner's and one more), so the batch waits only while a
        // partner is as likely as not by the frontrun: the burst's 1 us
        // gaps (deferred item 24). Under steady arrivals nothing changes.
        let many = IdleGpus { spare: true, many: true };
        let wait = start_with(600, true, many);
        assert!(wait > Duration::ZERO && wait <= Duration::from_nanos(2_048), "{wait:?}");
        assert_eq!(start_with(600, false, many), Duration::ZERO);
    }

    #[test]
    fn a_long_runner_s_quiet_stop_needs_quiet() {
        // 1080Ti EfficientNetB5 at SLO 166 ms (l(1) = 33.7 ms, so a lone
        // request outlasts MobileNetV2's whole 16 ms SLO), bursts of ten
        // 1 us apart every 120 ms: one gap in ten is longer than the 109 ms
        // to the frontrun, so even right after an arrival the next one
        // before it is less likely than the quiet stop's chance.
        let start = |departures: DepartureSet, with_tight: bool| {
            let long = ModelSpec::linear("b5", 23.435, 10.301, 166.0).expect("a valid profile");
            let tight = ModelSpec::linear("v2", 1.180, 3.483, 16.0).expect("a valid profile");
            let models = if with_tight { vec![(0, long), (1, tight)] } else { vec![(0, long)] };
            let mut c = ModelThreadCore::new(CoreConfig { departures, ..CoreConfig::default() }, models);
            assert!(c.models.get(1).is_none_or(|t| !t.long_runner), "the tight model is no long runner");
            let m = &mut c.models[0];
            let mut t = 0u64;
            for i in 0..600u64 {
                t += if i % 10 == 0 { 120_000_000 - 9_000 } else { 1_000 };
                m.rate.record(Instant::from_nanos(t));
            }
            let now = Instant::from_nanos(t);
            m.queues[0].push_back(Request::new(1, 0, now, now + Duration::from_millis(166)));
            let cand = m.gather(now, &c.cfg, None, 1.0, IdleGpus { spare: true, many: false }, &mut Actions::default()).expect("a candidate");
            (m.long_runner, cand.exec_at.saturating_since(now))
        };
        // The mean-gap window (12 ms x CV^2 9 = 108 ms before the latest
        // start) opens 24 ms after the arrival: the batch defers that long.
        let (long, wait) = start(DepartureSet::default(), true);
        assert!(long);
        assert!(wait > Duration::from_millis(20) && wait < Duration::from_millis(30), "{wait:?}");
        // Item 33 off, or no tighter model beside it: the quiet test
        // answers the newest arrival itself, and the batch starts now.
        assert_eq!(start(DepartureSet::default().without(Departure::LongRunnerQuiet), true), (true, Duration::ZERO));
        assert_eq!(start(DepartureSet::default(), false), (false, Duration::ZERO));
    }

    #[test]
    fn a_model_holding_out_for_its_pair_yields_while_another_takes_the_losses_alone() {
        // A100 EfficientNetV2S at SLO 15 ms (pair-locked), bursts of five
        // 1 us apart every 50 ms, a GPU idle besides the one it would take.
        let start = |others: Option<u16>, own_drops_per_1000: u32| {
            let mut c = core_at(1.454, 7.378, 15.0);
            let m = &mut c.models[0];
            let mut t = 0u64;
            for i in 0..600u64 {
                t += if i % 5 == 0 { 50_000_000 - 4_000 } else { 1_000 };
                m.rate.record(Instant::from_nanos(t));
            }
            lose_of_1000(m, own_drops_per_1000);
            m.others_loss_bp = others;
            let now = Instant::from_nanos(t);
            m.queues[0].push_back(Request::new(1, 0, now, now + Duration::from_millis(15)));
            let cand = m.gather(now, &c.cfg, None, 1.0, IdleGpus { spare: true, many: false }, &mut Actions::default()).expect("a candidate");
            cand.exec_at.saturating_since(now)
        };
        let frontrun = |wait: Duration| wait > Duration::from_millis(4) && wait < Duration::from_millis(5);
        // Alone, or no other model losing much, or not more than twice
        // this one's share: the frontrun (4.7 ms), as before.
        for (others, own) in [(None, 0), (Some(0), 0), (Some(10), 0), (Some(100), 5), (Some(100), 6)] {
            let wait = start(others, own);
            assert!(frontrun(wait), "{others:?} {own}: {wait:?}");
        }
        // Another model taking the losses alone (1% against 0 or 0.4%):
        // only the burst's 1 us gaps are waited out.
        for (others, own) in [(Some(100), 0), (Some(100), 4), (Some(20), 0)] {
            let wait = start(others, own);
            assert!(wait > Duration::ZERO && wait <= Duration::from_nanos(2_048), "{others:?} {own}: {wait:?}");
        }
    }

    #[test]
    fn a_lone_request_whose_pair_is_not_worth_the_frontrun_waits_only_while_a_partner_is_likely() {
        // 1080Ti Xception at SLO 15 ms: l(1) + l(2) = 6.8 + 11.5 ms locks
        // out a pair, but the pair saves beta = 2.0 ms < alpha = 4.8 ms.
        let start = |alpha: f64, slo: f64, bursty: bool, spare_gpu: bool| {
            let idle = IdleGpus { spare: spare_gpu, many: false };
            let mut c = core_at(alpha, 2.046, slo);
            let m = &mut c.models[0];
            assert!(!m.pair_locked_out);
            // Mean gap 20 ms: bursts of five 1 us apart every 100 ms (squared
            // CV 4), or a Poisson-like spread of gaps.
            let mut t = 0u64;
            for i in 0..600u64 {
                t += if bursty { if i % 5 == 0 { 100_000_000 - 4_000 } else { 1_000 } } else { [4, 12, 20, 28, 36][(i * 3 % 5) as usize] * 1_000_000 };
                m.rate.record(Instant::from_nanos(t));
            }
            let now = Instant::from_nanos(t);
            m.queues[0].push_back(Request::new(1, 0, now, now + Duration::from_millis(slo as u64)));
            let cand = m.gather(now, &c.cfg, None, 1.0, idle, &mut Actions::default()).expect("a candidate");
            (m.lone_locks_out_pair, cand.exec_at.saturating_since(now))
        };
        // Bursts: the burst's microsecond gaps are waited out (four gaps in
        // five are 1 us, so a partner is likely only that long)...
        let (locks, wait) = start(4.751, 15.0, true, true);
        assert!(locks);
        assert!(wait > Duration::ZERO && wait <= Duration::from_nanos(2_048), "{wait:?}");
        // ... but not without an idle GPU, nor under Poisson-like gaps.
        assert_eq!(start(4.751, 15.0, true, false).1, Duration::ZERO);
        assert_eq!(start(4.751, 15.0, false, true).1, Duration::ZERO);
        // At SLO 25 ms a pair fits behind a lone request: nothing to hold for.
        let (locks, wait) = start(4.751, 25.0, true, true);
        assert!(!locks);
        assert_eq!(wait, Duration::ZERO);
    }

    #[test]
    fn with_three_gpus_idle_a_lone_request_holds_only_for_a_partner_as_likely_as_not() {
        // 1080Ti Xception at SLO 15 ms (the frontrun 3.45 ms after an
        // arrival). Per ten gaps: four of 1 us, five of 5 ms, one of 300 ms
        // (squared CV 7.5): a partner comes by the frontrun with a chance
        // of 0.4 right after an arrival.
        let wait = |idle: IdleGpus| {
            let mut c = core_at(4.751, 2.046, 15.0);
            let m = &mut c.models[0];
            let mut t = 0u64;
            for i in 0..600u64 {
                t += match i % 10 {
                    0..=3 => 1_000,
                    4..=8 => 5_000_000,
                    _ => 300_000_000,
                };
                m.rate.record(Instant::from_nanos(t));
            }
            let now = Instant::from_nanos(t);
            m.queues[0].push_back(Request::new(1, 0, now, now + Duration::from_millis(15)));
            let cand = m.gather(now, &c.cfg, None, 1.0, idle, &mut Actions::default()).expect("a candidate");
            cand.exec_at.saturating_since(now)
        };
        // One or two GPUs idle: 0.4 is above item 22's 0.2, so it holds
        // through the microsecond gaps.
        let held = wait(IdleGpus { spare: true, many: false });
        assert!(held > Duration::ZERO && held <= Duration::from_nanos(2_048), "{held:?}");
        // Three idle: 0.4 is below even odds, so it starts at once.
        assert_eq!(wait(IdleGpus { spare: true, many: true }), Duration::ZERO);
    }

    #[test]
    fn a_grant_passes_a_lone_head_over_for_a_batch_the_next_gpu_could_not_run() {
        // 1080Ti ResNet50 at SLO 15 ms (l(1) = 7.4 ms, l(4) = 13.6 ms): a
        // lone request locks out a pair. The head has 8 ms left (a batch of
        // one), four requests behind it 15 ms.
        let ms = |n: u64| Duration::from_millis(n);
        let run = |next_free: Instant| {
            let mut c = core_at(2.050, 5.378, 15.0);
            assert!(c.models[0].lone_locks_out_pair);
            let now = Instant::from_nanos(1_000_000_000);
            c.models[0].queues[0].push_back(Request::new(1, 0, now - ms(7), now + ms(8)));
            for id in 2..6 {
                c.models[0].queues[0].push_back(Request::new(id, 0, now, now + ms(15)));
            }
            let mut out = Actions::default();
            let g = Grant { model: 0, gpu: 0, free_at: now, early: true, other_free_at: next_free, more_free_at: [Instant::NEVER; 2], others_loss_bp: None };
            c.on_grant(now, g, &mut out, &mut |_| {});
            let batch = out.batches.first().expect("a batch");
            let ids: Vec<u64> = out.members[batch.members.clone()].iter().map(|r| r.id).collect();
            (ids, c.models[0].queues[0].iter().map(|r| r.id).collect::<Vec<_>>())
        };
        let now = Instant::from_nanos(1_000_000_000);
        // The next GPU frees in 10 ms, too late for a batch of four: the
        // four run here and the head stays queued for another GPU.
        assert_eq!(run(now + ms(10)), (vec![2, 3, 4, 5], vec![1]));
        // Another GPU idles: the head runs here, the four there.
        assert_eq!(run(now), (vec![1], vec![2, 3, 4, 5]));
    }

    #[test]
    fn a_few_gaps_tell_gamma_bursts_from_poisson_by_their_logarithms() {
        use rand::SeedableRng as _;
        use rand_distr::{Distribution as _, Gamma};
        // Share of 400 seeded windows of `gaps` Gamma(shape) gaps (mean
        // 10 ms) called bursty, by the early test and by the squared CV.
        let called = |shape: f64, gaps: usize| {
            let mut by_log = 0;
            let mut by_cv2 = 0;
            for seed in 0..400u64 {
                let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(seed);
                let g = Gamma::new(shape, 10e6 / shape).expect("a valid Gamma");
                let mut w = RateWindow::new();
                let mut t = 1e9;
                w.record(Instant::from_nanos(t as u64));
                for _ in 0..gaps {
                    t += g.sample(&mut rng);
                    w.record(Instant::from_nanos(t as u64));
                }
                by_log += usize::from(w.maybe_bursty(w.gap_cv2(), true));
                by_cv2 += usize::from(w.gap_cv2().is_some_and(|c| c > BURSTY_CV2));
            }
            (by_log as f64 / 400.0, by_cv2 as f64 / 400.0)
        };
        // Gamma(0.2) over 10 and 30 gaps: the log statistic sees the bursts
        // where the squared CV misses a fair share of them.
        for gaps in [10, 30] {
            let (log, cv2) = called(0.2, gaps);
            assert!(log > 0.95 && log > cv2, "Gamma(0.2), {gaps} gaps: log {log}, cv2 {cv2}");
        }
        // Poisson: mostly not bursty.
        for gaps in [10, 30] {
            let (log, _) = called(1.0, gaps);
            assert!(log < 0.2, "Poisson, {gaps} gaps: {log}");
        }
    }

    #[test]
    fn the_recent_loss_is_the_dropped_share_of_the_last_admitted_requests() {
        let mut l = RecentLoss::default();
        assert_eq!(l.basis_points(), 0);
        for i in 0..1000 {
            l.admitted();
            if i % 50 == 0 {
                l.dropped();
            }
        }
        assert_eq!(l.basis_points(), 200, "20 of 1000");
        // Both counts halve at the span: the share holds, old requests
        // weigh less from then on.
        for _ in 1000..RECENT_LOSS_SPAN {
            l.admitted();
        }
        assert_eq!((l.admitted, l.dropped), (RECENT_LOSS_SPAN / 2, 10));
        // Never above all of them.
        let mut all = RecentLoss::default();
        all.dropped();
        all.admitted();
        all.dropped();
        assert_eq!(all.basis_points(), 10_000);
    }

    /// An A100 ResNet50 at 25 ms that dropped one in `every` of its last
    /// 1000 requests.
    fn losing_one_in(every: u32) -> ModelThreadCore {
        let mut c = core(0.268, 5.172);
        lose_of_1000(&mut c.models[0], 1000 / every);
        c
    }

    /// Records 1000 admitted requests of which `dropped` were dropped.
    fn lose_of_1000(m: &mut ModelState, dropped: u32) {
        for i in 0..1000 {
            m.loss.admitted();
            if i < dropped {
                m.loss.dropped();
            }
        }
    }

    #[test]
    fn a_model_taking_the_losses_alone_early_drops_less() {
        let relaxed = |m: &ModelState| (m.early_drop_fraction(0.95, DepartureSet::default()) - 0.85).abs() < 1e-12;
        let mut c = losing_one_in(50);
        let m = &mut c.models[0];
        assert_eq!(m.loss.basis_points(), 200);
        // Alone in the scheduler, or with another model losing half as
        // much or more: the fraction as configured.
        for others in [None, Some(100), Some(150)] {
            m.others_loss_bp = others;
            assert_eq!(m.early_drop_fraction(0.95, DepartureSet::default()), 0.95, "{others:?}");
        }
        // More than twice every other model's share: the shortfall triples.
        for others in [Some(0), Some(99)] {
            m.others_loss_bp = others;
            assert!(relaxed(m), "{others:?}");
        }
        // From a fifth of the bar up, however small; below it nothing moves.
        for (every, bp, relaxes) in [(100, 100, true), (200, 50, true), (1000, 10, false)] {
            let mut c = losing_one_in(every);
            let m = &mut c.models[0];
            assert_eq!(m.loss.basis_points(), bp);
            m.others_loss_bp = Some(0);
            assert_eq!(relaxed(m), relaxes, "{bp} bp");
        }
    }

    #[test]
    fn a_pair_that_saves_less_than_its_second_request_costs_locks_nothing_out() {
        // 1080Ti Xception at 15 ms: l(1) + l(2) = 6.8 + 11.5 ms, but the
        // pair saves beta = 2.0 ms against alpha = 4.8 ms for its second.
        assert!(!locked(4.751, 2.046, 15.0));
        // 1080Ti EfficientNetB0 and A100 EfficientNetV2S at 15 ms: beta > alpha.
        assert!(locked(1.569, 5.586, 15.0));
        assert!(locked(1.454, 7.378, 15.0));
        // The border: beta = alpha is worth it.
        assert!(locked(5.0, 5.0, 15.0));
    }

    #[test]
    fn a_pair_behind_a_lone_request_decides_the_lock_out() {
        // 1080Ti ResNet50 at 15 ms: 2 l(1) = 14.9 ms fits, l(1) + l(2) = 16.9 ms does not.
        assert!(locked(2.050, 5.378, 15.0));
        assert!(!locked(2.050, 5.378, 25.0));
        // A100 ResNet50 at 15 ms: 5.4 + 5.7 ms.
        assert!(!locked(0.268, 5.172, 15.0));
    }

    #[test]
    fn the_early_drop_window_protects_throughput_per_gpu_not_batch_size() {
        // Table 2's ResNet50, target 16: e(11) >= 0.9 e(16) > e(10).
        let mut c = core(1.053, 5.072);
        assert_eq!(c.models[0].drop_window(16, 0.9), 11);
        assert_eq!(c.models[0].drop_window(16, 1.0), 16, "fraction 1 is Nexus's window");
        // A weak batcher: a batch of one runs within 10% of the target's
        // throughput, so no head is dropped to protect a batch.
        let mut c = core(5.0, 0.1);
        assert_eq!(c.models[0].drop_window(4, 0.9), 1);
        assert_eq!(c.models[0].drop_window(1, 0.9), 1);
    }

    #[test]
    fn the_poisson_fill_floor_is_the_count_four_fills_in_five_reach() {
        // A plain sum of the Poisson terms (fine for small means).
        let plain = |mean: u32| {
            let m = f64::from(mean);
            let (mut p, mut below, mut w) = ((-m).exp(), 0.0, 0u32);
            while w < mean && below + p <= SHORT_FILL_SHARE {
                below += p;
                w += 1;
                p *= m / f64::from(w);
            }
            w.max(1)
        };
        for mean in 1..=200 {
            assert_eq!(poisson_fill_floor(mean), plain(mean), "mean {mean}");
        }
        // P(N < 2) = 0.199 for a mean of 3; P(N < 13) = 0.193 for 16.
        assert_eq!(poisson_fill_floor(3), 2);
        assert_eq!(poisson_fill_floor(7), 5);
        assert_eq!(poisson_fill_floor(16), 13);
        // A mean whose e^-mean underflows: about mean - 0.84 sqrt(mean).
        let w = poisson_fill_floor(2000);
        assert!((1955..=1965).contains(&w), "{w}");
    }

    #[test]
    fn under_poisson_arrivals_the_early_drop_window_is_what_most_fills_reach() {
        // 1080Ti ResNet50 at 15 ms, target 3: e(2) = 0.81 e(3), below the
        // 0.95 fraction, so the fraction alone protects the whole target.
        let mut c = core_at(2.050, 5.378, 15.0);
        let m = &mut c.models[0];
        assert_eq!(m.drop_window(3, 0.95), 3);
        assert_eq!(m.early_drop_window(3, Some(1.0), 0.95, DepartureSet::default()), 2, "Poisson: one request short is served");
        assert_eq!(m.early_drop_window(3, Some(0.0), 0.95, DepartureSet::default()), 2, "evenly spaced");
        // Gamma(0.5) (CV^2 2): the widened fraction 0.9 still protects
        // the whole target, and the fill floor caps it.
        assert_eq!(m.drop_window(3, 0.9), 3);
        assert_eq!(m.early_drop_window(3, Some(2.0), 0.95, DepartureSet::default()), 2);
        // Gamma(0.2) (CV^2 5): the fraction alone.
        assert_eq!(m.early_drop_window(3, Some(5.0), 0.95, DepartureSet::default()), m.drop_window(3, 0.75));
        // No estimate yet: the fraction alone.
        assert_eq!(m.early_drop_window(3, None, 0.95, DepartureSet::default()), 3);
        assert_eq!(m.early_drop_window(1, Some(1.0), 0.95, DepartureSet::default()), 1, "never below one");
        // Table 2's ResNet50, target 16: the fraction's window is 14, and
        // one Poisson fill in four comes below it (P(N < 14) = 0.27).
        let mut c = core(1.053, 5.072);
        let m = &mut c.models[0];
        assert_eq!(m.drop_window(16, 0.95), 14);
        assert_eq!(m.early_drop_window(16, Some(1.0), 0.95, DepartureSet::default()), 13);
        assert_eq!(m.early_drop_window(16, Some(2.0), 0.95, DepartureSet::default()), m.drop_window(16, 0.9).min(13));
        assert_eq!(m.early_drop_window(16, Some(5.0), 0.95, DepartureSet::default()), m.drop_window(16, 0.75), "strong bursts: the fraction alone");
        // A 1080Ti ResNet50 at 25 ms, target 7: the fraction leaves 6,
        // the fill floor 5.
        let mut c = core_at(2.050, 5.378, 25.0);
        let m = &mut c.models[0];
        assert_eq!(m.drop_window(7, 0.95), 6);
        assert_eq!(m.early_drop_window(7, Some(1.0), 0.95, DepartureSet::default()), 5);
    }

    #[test]
    fn burst_widening_stops_at_a_third_of_the_target_or_the_plain_window() {
        // 1080Ti ResNet50 at 100 ms, target 30: e(b) is flat, so the
        // Gamma(0.2) fraction 0.75 alone would serve batches of 6.
        let mut c = core_at(2.050, 5.378, 100.0);
        let m = &mut c.models[0];
        assert_eq!(m.drop_window(30, 0.75), 6);
        assert_eq!(m.early_drop_window(30, Some(5.0), 0.95, DepartureSet::default()), 10, "a third of the target");
        assert_eq!(m.early_drop_window(30, Some(2.0), 0.95, DepartureSet::default()), m.drop_window(30, 0.9).max(10), "Gamma(0.5)");
        // Poisson and no estimate: unchanged (the floor only bounds the widening).
        let plain = m.drop_window(30, 0.95).min(poisson_fill_floor(30));
        assert_eq!(m.early_drop_window(30, Some(1.0), 0.95, DepartureSet::default()), plain);
        assert_eq!(m.early_drop_window(30, None, 0.95, DepartureSet::default()), m.drop_window(30, 0.95));
        // A weak batcher's plain window is one: the floor never lifts it.
        let mut c = core_at(5.0, 0.1, 100.0);
        let m = &mut c.models[0];
        assert_eq!(m.early_drop_window(12, Some(1.0), 0.95, DepartureSet::default()), 1);
        assert_eq!(m.early_drop_window(12, Some(5.0), 0.95, DepartureSet::default()), 1);
    }

    #[test]
    fn the_remembered_target_and_window_answer_as_the_searches_do() {
        // Gaps sweeping up and down (the memo's borders crossed both ways),
        // a strong and a weak batcher, with and without a network delay.
        for (alpha, beta, slo) in [(1.053, 5.072, 25.0), (0.1, 5.0, 50.0), (5.0, 0.1, 30.0)] {
            for delay in [NetworkDelay::ZERO, NetworkDelay { d_ctrl: Duration::from_micros(200), d_data: Duration::from_micros(30) }] {
                let mut c = core_at(alpha, beta, slo);
                let m = &mut c.models[0];
                for step in (0..4000u64).chain((0..4000).rev()) {
                    let gap = Duration::from_nanos(step * step / 3);
                    let target = m.target_batch_memo(gap, &delay);
                    assert_eq!(target, m.target_batch_at(gap, &delay), "gap {gap:?}");
                    for fraction in [0.9, 0.85, 1.0, -0.2] {
                        assert_eq!(m.drop_window(target, fraction), m.drop_window_search(target, fraction));
                    }
                }
                for b in 0..m.profile.max_batch() + 3 {
                    assert_eq!(m.efficiency(b).to_bits(), efficiency_of(&m.profile, b).to_bits(), "b {b}");
                }
            }
        }
    }

    #[test]
    fn deferral_stops_near_the_target_batch_and_without_a_rate_at_the_slo_best() {
        // Table 2's ResNet50: the SLO alone allows 18; e(15) is within 2% of
        // e(16), e(14) is not.
        let c = core(1.053, 5.072);
        let m = &c.models[0];
        assert_eq!(m.best_batch, 18);
        assert!(m.near_best_efficiency(15, 16, 0.02));
        assert!(!m.near_best_efficiency(14, 16, 0.02));
        // A target above the SLO's best counts as the best.
        assert_eq!(m.near_best_efficiency(17, 40, 0.02), m.near_best_efficiency(17, 18, 0.02));
        // No arrival yet: no target.
        assert_eq!(m.target_batch(Instant::ZERO, &NetworkDelay::ZERO), None);
    }
}
