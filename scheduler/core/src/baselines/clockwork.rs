//! Clockwork (Gujarati et al., OSDI '20) as a sans-IO policy.
//!
//! The Symphony paper summarises Clockwork as: for every request, a batch
//! candidate per batch size; when a GPU frees, dispatch the candidate whose
//! *latest executable moment* (the last start that still meets its deadline)
//! is the earliest. Read literally, with FIFO queues and one SLO per model,
//! that rule always picks the largest batch that still fits, and the policy
//! is plain eager batching. What keeps Clockwork's batches small in practice
//! (median 1 on ResNet50 in Symphony's Figure 1) is how its controller
//! applies the rule, and this module models those parts:
//!
//! - **Schedule-ahead.** The controller does not wait for a GPU to be free:
//!   it keeps each GPU's action queue filled up to a horizon
//!   ([`ClockworkConfig::schedule_ahead`], 10 ms in Clockwork's released
//!   controller). A batch is decided as soon as its GPU's planned work ends
//!   within the horizon, from the requests present at that moment, and then
//!   starts when the GPU gets to it. Requests are drained into small batches
//!   long before a large batch could have formed, and each waits up to the
//!   horizon after being batched.
//! - **Power-of-two batch sizes.** Clockwork's models are compiled by TVM for
//!   batch sizes 1, 2, 4, 8, 16 only; 7 queued requests run as 4 (+2 +1).
//!   Clockwork keeps one queue per batch size holding the requests that could
//!   still finish at that size, and runs the largest size whose queue holds
//!   a full batch; the requests only smaller sizes could have served are
//!   abandoned (its queues "catch up" past the batch).
//! - **A safety margin.** Clockwork aims each request at its deadline minus
//!   a buffer (5 ms in its controller), so it never plans to the last moment.
//!
//! Requests are dropped lazily, when a GPU is considered for their model and
//! not even a batch of one could finish by the (buffered) deadline, which is
//! how Clockwork times requests out. The Symphony authors also gave their
//! Clockwork arbitrary batch sizes for fairness; set
//! [`ClockworkConfig::pow2_batches`] to `false` for that variant. Clockwork's
//! controller overheads (a per-action cost, locks, shipping inputs through
//! the controller) are not modelled.
//!
//! Every event costs `O(log M + log G)` plus `O(log B * log Q)` per batch
//! formed (a binary search over batch sizes, each with a binary search of
//! the queue).

use super::prelude::*;

/// Clockwork's knobs. The defaults are those of Clockwork's released
/// controller (the `INFER5` scheduler).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClockworkConfig {
    /// A GPU's next batch is decided once its planned work ends within this
    /// much of now.
    pub schedule_ahead: Duration,
    /// Requests are aimed this long before their deadline (never more than
    /// leaves them `schedule_ahead + slo_buffer` of budget, nor past the
    /// real deadline).
    pub slo_buffer: Duration,
    /// Largest batch size used.
    pub max_batch: u32,
    /// Use only power-of-two batch sizes.
    pub pow2_batches: bool,
    /// Network delay charged before a batch can start.
    pub delay: NetworkDelay,
}

impl Default for ClockworkConfig {
    fn default() -> Self {
        ClockworkConfig {
            schedule_ahead: Duration::from_millis(10),
            slo_buffer: Duration::from_millis(5),
            max_batch: 16,
            pow2_batches: true,
            delay: NetworkDelay::ZERO,
        }
    }
}

struct ModelState {
    profile: LatencyProfile,
    /// How long before its deadline a request is aimed at.
    margin: Duration,
    /// The batch sizes this model may run, ascending, starting at 1.
    sizes: Vec<u32>,
    /// Pending requests, sorted by deadline.
    queue: VecDeque<Request>,
}

impl ModelState {
    fn new(spec: &ModelSpec, cfg: &ClockworkConfig) -> Self {
        let slo = spec.slo;
        let exec_slo = slo.saturating_sub(cfg.slo_buffer).max(cfg.schedule_ahead + cfg.slo_buffer).min(slo);
        let cap = cfg.max_batch.min(spec.profile.max_batch()).max(1);
        let sizes = if cfg.pow2_batches {
            (0..32).map(|i| 1u32 << i).take_while(|&b| b <= cap).collect()
        } else {
            (1..=cap).collect()
        };
        ModelState { profile: spec.profile.clone(), margin: slo - exec_slo, sizes, queue: VecDeque::with_capacity(256) }
    }

    #[inline]
    fn target(&self, r: &Request) -> Instant {
        r.deadline - self.margin
    }

    /// The latest moment the model's largest possible batch can start: its
    /// urgency among models.
    fn latest(&self) -> Option<Instant> {
        let head = self.queue.front()?;
        let n = self.queue.len() as u32;
        let b = self.sizes[self.sizes.partition_point(|&s| s <= n).max(1) - 1];
        Some(self.target(head) - self.profile.latency(b))
    }

    /// Picks the batch to run on a GPU free at `free`: drops what cannot
    /// make it, and returns the batch size and its start. The batch is the
    /// first `b` requests of the queue afterwards.
    fn take(&mut self, now: Instant, free: Instant, delay: &NetworkDelay, out: &mut Actions) -> Option<(u32, Instant)> {
        let start = |b: u32| (now + delay.of(b)).max(free);
        let done_by = |b: u32| start(b) + self.profile.latency(b);
        while let Some(head) = self.queue.front() {
            if done_by(1) <= self.target(head) {
                break;
            }
            out.drops.push((*head, DropReason::DeadlineUnmeetable));
            self.queue.pop_front();
        }
        let n = self.queue.len();
        if n == 0 {
            return None;
        }
        // Requests feasible at size b form a suffix of the queue (deadline
        // order); the largest size with a full batch of them wins. The
        // predicate `feasible(b) >= b` holds for b = 1 (the head fits) and is
        // monotone, so binary-search it.
        let skip = |b: u32| {
            let need = done_by(b);
            self.queue.partition_point(|r| self.target(r) < need)
        };
        let fits = |b: u32| b as usize <= n - skip(b);
        let (mut lo, mut hi) = (0usize, self.sizes.partition_point(|&s| s as usize <= n) - 1);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if fits(self.sizes[mid]) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        let b = self.sizes[lo];
        let abandoned = skip(b);
        for r in self.queue.drain(..abandoned) {
            out.drops.push((r, DropReason::EarlyDrop));
        }
        Some((b, start(b)))
    }
}

/// The Clockwork policy: see the module documentation.
pub struct ClockworkScheduler {
    cfg: ClockworkConfig,
    models: Vec<ModelState>,
    gpus: GpuPool,
    /// Models with queued requests, by their latest executable moment.
    by_latest: IndexedHeap<Instant>,
    wake: Option<Instant>,
    batches: u64,
}

impl ClockworkScheduler {
    /// A scheduler for `models` (model id = index) on `gpus` GPUs.
    pub fn new(models: &[ModelSpec], gpus: u32, cfg: ClockworkConfig) -> Self {
        ClockworkScheduler {
            models: models.iter().map(|m| ModelState::new(m, &cfg)).collect(),
            cfg,
            gpus: GpuPool::new(gpus),
            by_latest: IndexedHeap::with_ids(models.len()),
            wake: None,
            batches: 0,
        }
    }

    /// Batches dispatched so far.
    pub fn batches(&self) -> u64 {
        self.batches
    }

    fn rekey(&mut self, m: ModelId) {
        match self.models[m as usize].latest() {
            Some(t) => self.by_latest.set(m, t),
            None => {
                self.by_latest.remove(m);
            }
        }
    }

    /// Fills every GPU's action queue up to the schedule-ahead horizon,
    /// most urgent model first.
    fn fill(&mut self, now: Instant, out: &mut Actions) {
        let horizon = now + self.cfg.schedule_ahead;
        while let Some((_, m)) = self.by_latest.peek() {
            let Some((gpu, free)) = self.gpus.earliest(now) else { break };
            if free > horizon {
                break;
            }
            let model = &mut self.models[m as usize];
            if let Some((b, start)) = model.take(now, free, &self.cfg.delay, out) {
                let finish = start + model.profile.latency(b);
                out.push_batch(gpu as GpuId, m, start, finish, now, model.queue.drain(..b as usize));
                self.gpus.occupy(gpu, finish);
                self.batches += 1;
            }
            self.rekey(m);
        }
        // Work is waiting and every GPU is planned past the horizon: come
        // back when the first one's plan ends within it.
        self.wake = match self.by_latest.is_empty() {
            true => None,
            false => self.gpus.next_free().map(|t| (t - self.cfg.schedule_ahead).max(now)),
        };
    }
}

impl Scheduler for ClockworkScheduler {
    fn on_request(&mut self, now: Instant, req: Request, out: &mut Actions) {
        let Some(model) = self.models.get_mut(req.model as usize) else {
            out.drops.push((req, DropReason::UnknownModel));
            return;
        };
        insert_by_deadline(&mut model.queue, req);
        self.rekey(req.model);
        self.fill(now, out);
    }

    /// A GPU out of matchmaking gets no new batch; one back (or new) is
    /// offered to the queues at once.
    fn set_gpu_membership(&mut self, now: Instant, gpu: GpuId, online: bool, out: &mut Actions) -> bool {
        self.gpus.set_online(now, gpu, online);
        self.fill(now, out);
        true
    }

    fn on_batch_done(&mut self, now: Instant, _gpu: GpuId, out: &mut Actions) {
        self.fill(now, out);
    }

    fn on_wake(&mut self, now: Instant, out: &mut Actions) {
        self.fill(now, out);
    }

    fn poll_at(&self) -> Option<Instant> {
        self.wake
    }

    fn name(&self) -> &'static str {
        if self.cfg.pow2_batches {
            "clockwork"
        } else {
            "clockwork-any"
        }
    }
}
