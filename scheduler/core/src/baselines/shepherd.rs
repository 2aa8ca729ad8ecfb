//! Shepherd's online scheduler, Flex (Zhang et al., NSDI '23), as the
//! Symphony paper describes and re-implemented it:
//!
//! - One candidate batch per model: the largest batch, from the head of its
//!   deadline-ordered queue, that finishes by the head's deadline if it
//!   starts now.
//! - Work-conserving: whenever a GPU is free, the largest candidate runs on
//!   it.
//! - Lazy dropping: a request is dropped only when not even a batch of one
//!   could meet its deadline any more.
//! - Preemption: when every GPU is busy and the largest candidate is at
//!   least [`PREEMPT_FACTOR`] times the size of the smallest running batch,
//!   that batch is aborted (its GPU time is lost), its requests go back to
//!   their queues (those that can no longer make it are dropped lazily), and
//!   the candidate runs on the freed GPU.
//!
//! [`ShepherdScheduler::preemption_free`] is the same Flex without the
//! preemption (`shepherd-flex`, the baseline panel's second Shepherd
//! variant, issue 49): a free GPU takes the largest candidate whose head's
//! deadline holds (equal sizes: the earlier head deadline), and a running
//! batch always runs to its end. Preemption
//! throws away GPU time already spent; with profiled (exact) batch times
//! and no mispredicted arrivals to correct, that loss need not pay, so the
//! panel keeps both and reports the better per cell.
//!
//! Each decision evaluates every model with queued requests (`O(M)`, plus
//! `O(log B)` per candidate): see [`ShepherdScheduler::largest`] for why
//! not a heap of candidate sizes.

use super::prelude::*;
use std::cmp::Reverse;

/// A running batch is preempted by a candidate at least this many times its
/// size (Shepherd's choice, quoted by the Symphony paper).
pub const PREEMPT_FACTOR: u32 = 3;

struct ModelState {
    profile: LatencyProfile,
    /// Pending requests, sorted by deadline.
    queue: VecDeque<Request>,
}

impl ModelState {
    /// The rank of a candidate of `size` (lower first): larger first, and
    /// with `edf` the earlier head deadline among equal sizes. Without
    /// `edf` equal sizes tie to the lower model id.
    fn key(&self, size: u32, edf: bool) -> (Reverse<u32>, Instant) {
        let head = if edf { self.queue.front().map_or(Instant::NEVER, |h| h.deadline) } else { Instant::ZERO };
        (Reverse(size), head)
    }

    /// Lazily drops heads that cannot make it, then returns the size of the
    /// candidate batch starting now (0 when the queue is empty).
    fn candidate(&mut self, now: Instant, delay: &NetworkDelay, out: &mut Actions) -> u32 {
        let one = now + delay.of(1) + self.profile.latency(1);
        while let Some(&head) = self.queue.front() {
            if one <= head.deadline {
                break;
            }
            out.drops.push((head, DropReason::DeadlineUnmeetable));
            self.queue.pop_front();
        }
        let Some(head) = self.queue.front() else { return 0 };
        let budget = head.deadline.saturating_since(now + delay.d_ctrl);
        self.profile.max_batch_within(budget, delay.d_data, (self.queue.len() as u32).min(self.profile.max_batch()))
    }
}

/// The batch a GPU is running, kept so a preemption can re-queue it.
struct Running {
    /// When it was decided: a batch decided at this very instant may not be
    /// applied yet, so it is not preempted.
    decided_at: Instant,
    exec_at: Instant,
    finish_at: Instant,
    members: Vec<Request>,
}

/// The Shepherd (Flex) policy: see the module documentation.
pub struct ShepherdScheduler {
    delay: NetworkDelay,
    models: Vec<ModelState>,
    gpus: GpuPool,
    running: Vec<Running>,
    /// GPUs running a batch, by its size, smallest first.
    running_by_size: IndexedHeap<u32>,
    /// Scratch room for a preempted batch's requests.
    aborted: Vec<Request>,
    preemptions: u64,
    /// Preempt a running batch for a candidate [`PREEMPT_FACTOR`] times
    /// its size (Flex as the Symphony paper describes it), or never.
    preempt: bool,
}

impl ShepherdScheduler {
    /// A scheduler for `models` (model id = index) on `gpus` GPUs.
    pub fn new(models: &[ModelSpec], gpus: u32, delay: NetworkDelay) -> Self {
        Self::with_preemption(models, gpus, delay, true)
    }

    /// Flex without preemption (see the module documentation).
    pub fn preemption_free(models: &[ModelSpec], gpus: u32, delay: NetworkDelay) -> Self {
        Self::with_preemption(models, gpus, delay, false)
    }

    fn with_preemption(models: &[ModelSpec], gpus: u32, delay: NetworkDelay, preempt: bool) -> Self {
        let max_batch = models.iter().map(|m| m.profile.max_batch()).max().unwrap_or(1) as usize;
        ShepherdScheduler {
            delay,
            models: models.iter().map(|m| ModelState { profile: m.profile.clone(), queue: VecDeque::with_capacity(256) }).collect(),
            gpus: GpuPool::new(gpus),
            running: (0..gpus)
                .map(|_| Running { decided_at: Instant::ZERO, exec_at: Instant::ZERO, finish_at: Instant::ZERO, members: Vec::with_capacity(max_batch) })
                .collect(),
            running_by_size: IndexedHeap::with_ids(gpus as usize),
            aborted: Vec::with_capacity(max_batch),
            preemptions: 0,
            preempt,
        }
    }

    /// Batches preempted so far.
    pub fn preemptions(&self) -> u64 {
        self.preemptions
    }

    /// The largest candidate `(model, size)`: every model with queued
    /// requests evaluated (`O(M)` per decision), in both variants. A heap
    /// of candidate sizes would be cheaper, but its keys are not upper
    /// bounds: a candidate grows when its head is dropped, so a model whose
    /// head expired while it sat below the top may hold a larger batch than
    /// its key says (measured: 5% of goodput on six A100 models against a
    /// plain scan), and a baseline must not lose to its own shortcut.
    fn largest(&mut self, now: Instant, out: &mut Actions) -> Option<(ModelId, u32)> {
        let edf = !self.preempt;
        let mut best: Option<((Reverse<u32>, Instant), ModelId, u32)> = None;
        for (m, model) in self.models.iter_mut().enumerate() {
            if model.queue.is_empty() {
                continue;
            }
            let size = model.candidate(now, &self.delay, out);
            if size == 0 {
                continue;
            }
            let key = model.key(size, edf);
            if best.is_none_or(|(k, _, _)| key < k) {
                best = Some((key, m as ModelId, size));
            }
        }
        best.map(|(_, m, size)| (m, size))
    }

    fn run(&mut self, now: Instant, gpu: GpuId, m: ModelId, size: u32, out: &mut Actions) {
        let model = &mut self.models[m as usize];
        let exec_at = now + self.delay.of(size);
        let finish_at = exec_at + model.profile.latency(size);
        let slot = &mut self.running[gpu as usize];
        slot.members.clear();
        slot.members.extend(model.queue.drain(..size as usize));
        slot.decided_at = now;
        slot.exec_at = exec_at;
        slot.finish_at = finish_at;
        out.push_batch(gpu, m, exec_at, finish_at, now, slot.members.iter().copied());
        self.gpus.occupy(gpu, finish_at);
        self.running_by_size.set(gpu, size);
    }

    /// Aborts the batch on `gpu`, runs the candidate there instead, and
    /// re-queues the aborted requests (after the candidate was taken, so
    /// the batch that runs is the one that justified the preemption).
    fn preempt(&mut self, now: Instant, gpu: GpuId, m: ModelId, size: u32, out: &mut Actions) {
        out.preemptions.push(gpu);
        self.preemptions += 1;
        self.gpus.release(gpu);
        std::mem::swap(&mut self.aborted, &mut self.running[gpu as usize].members);
        self.run(now, gpu, m, size, out);
        let ShepherdScheduler { aborted, models, .. } = self;
        for r in aborted.drain(..) {
            insert_by_deadline(&mut models[r.model as usize].queue, r);
        }
    }

    /// Runs candidates, largest first, on free GPUs, and preempts while a
    /// candidate dwarfs a running batch.
    fn schedule(&mut self, now: Instant, out: &mut Actions) {
        while let Some((m, size)) = self.largest(now, out) {
            match self.gpus.earliest(now) {
                Some((gpu, free)) if free <= now => {
                    self.run(now, gpu, m, size, out);
                    continue;
                }
                _ => {}
            }
            if !self.preempt {
                break;
            }
            let victim = self.running_by_size.peek().filter(|&(running, g)| {
                let r = &self.running[g as usize];
                size >= PREEMPT_FACTOR.saturating_mul(running) && r.decided_at < now && r.exec_at <= now && now < r.finish_at
            });
            match victim {
                // Each preemption replaces a batch by one at least 3x its
                // size, so the loop ends.
                Some((_, g)) => self.preempt(now, g, m, size, out),
                None => break,
            }
        }
    }
}

impl Scheduler for ShepherdScheduler {
    fn on_request(&mut self, now: Instant, req: Request, out: &mut Actions) {
        let Some(model) = self.models.get_mut(req.model as usize) else {
            out.drops.push((req, DropReason::UnknownModel));
            return;
        };
        insert_by_deadline(&mut model.queue, req);
        self.schedule(now, out);
    }

    fn on_batch_done(&mut self, now: Instant, gpu: GpuId, out: &mut Actions) {
        self.running_by_size.remove(gpu);
        if let Some(r) = self.running.get_mut(gpu as usize) {
            r.members.clear();
        }
        self.schedule(now, out);
    }

    fn on_wake(&mut self, now: Instant, out: &mut Actions) {
        self.schedule(now, out);
    }

    /// Flex acts only on arrivals and completions; requests that expire
    /// while every GPU is busy are dropped when a GPU frees.
    fn poll_at(&self) -> Option<Instant> {
        None
    }

    fn name(&self) -> &'static str {
        if self.preempt {
            "shepherd"
        } else {
            "shepherd-flex"
        }
    }
}
