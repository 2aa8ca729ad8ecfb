//! Eager scheduling and TF-Serving-style timeout batching, as the Symphony
//! paper describes them (arXiv 2308.07470, section 2: "schedule a batch of
//! requests whenever a GPU is idle, i.e., eager batching"; section 3's
//! timeout rule: a batch goes out when it is full or its oldest request has
//! waited `k`).
//!
//! **Eager** is the simplest work-conserving earliest-deadline-first policy:
//! whenever a GPU is free, take the model whose queue head has the earliest
//! deadline, drop its heads that could not finish even alone (lazy drop),
//! and run as many of its requests as can finish by the head's deadline,
//! or a larger batch of the requests behind the first heads where that
//! batching pays even counting the skipped heads ([`largest_batch`]).
//! No window, no rate estimate, no artefact of the deferred machinery.
//!
//! **Timeout** is the same loop with one more condition: a model may take a
//! free GPU only once its head has waited its `k` (per model, see
//! [`crate::goodput::best_timeouts`] for the search that picks it) or its queue
//! holds a full batch (the largest batch that fits its SLO). `k = 0` is
//! eager.
//!
//! Every event costs `O(log M + log G)` plus `O(B log B)` per batch formed.

use super::latest_start::{drop_heads, DropMode};
use super::prelude::*;
use crate::batch_past_heads::larger_batch_past_heads;

struct ModelState {
    profile: LatencyProfile,
    /// How long the head waits before the model may take a GPU.
    timeout: Duration,
    /// A queue this long is a full batch: it may go out before the timeout.
    full: usize,
    /// Pending requests, sorted by deadline.
    queue: VecDeque<Request>,
}

/// The eager (or timeout) policy: see the module documentation.
pub struct EagerScheduler {
    delay: NetworkDelay,
    models: Vec<ModelState>,
    gpus: GpuPool,
    /// Models allowed to take a GPU, by their head's deadline.
    eligible: IndexedHeap<Instant>,
    /// Models with queued requests still inside their timeout, by when it ends.
    waiting: IndexedHeap<Instant>,
    /// Lazy drop, or Nexus's sliding window before it (`eager-early`).
    drop: DropMode,
    name: &'static str,
}

impl EagerScheduler {
    /// Eager EDF for `models` (model id = index) on `gpus` GPUs.
    pub fn eager(models: &[ModelSpec], gpus: u32, delay: NetworkDelay) -> Self {
        Self::with_timeouts(models, gpus, delay, &[], "eager")
    }

    /// Eager EDF with early drop: before a model's batch is formed, the
    /// heads Nexus's sliding window skips are dropped
    /// ([`super::latest_start::early_drop_count`]).
    pub fn eager_early_drop(models: &[ModelSpec], gpus: u32, delay: NetworkDelay) -> Self {
        EagerScheduler { drop: DropMode::Early, ..Self::with_timeouts(models, gpus, delay, &[], "eager-early") }
    }

    /// Timeout batching: model `m` waits `timeouts[m]` (the last entry for
    /// models past the end; zero when empty).
    pub fn timeout(models: &[ModelSpec], gpus: u32, delay: NetworkDelay, timeouts: &[Duration]) -> Self {
        Self::with_timeouts(models, gpus, delay, timeouts, "timeout")
    }

    fn with_timeouts(models: &[ModelSpec], gpus: u32, delay: NetworkDelay, timeouts: &[Duration], name: &'static str) -> Self {
        let k = |m: usize| timeouts.get(m).or(timeouts.last()).copied().unwrap_or(Duration::ZERO);
        EagerScheduler {
            delay,
            models: models
                .iter()
                .enumerate()
                .map(|(i, m)| ModelState {
                    profile: m.profile.clone(),
                    timeout: k(i),
                    full: m.profile.max_batch_within(m.slo, Duration::ZERO, m.profile.max_batch()).max(1) as usize,
                    queue: VecDeque::with_capacity(256),
                })
                .collect(),
            gpus: GpuPool::new(gpus),
            eligible: IndexedHeap::with_ids(models.len()),
            waiting: IndexedHeap::with_ids(models.len()),
            drop: DropMode::Lazy,
            name,
        }
    }

    /// Files model `m` under eligible or waiting after its queue changed.
    fn rekey(&mut self, now: Instant, m: ModelId) {
        let model = &self.models[m as usize];
        let Some(head) = model.queue.front() else {
            self.eligible.remove(m);
            self.waiting.remove(m);
            return;
        };
        let ready_at = head.arrival + model.timeout;
        if ready_at <= now || model.queue.len() >= model.full {
            self.waiting.remove(m);
            self.eligible.set(m, head.deadline);
        } else {
            self.eligible.remove(m);
            self.waiting.set(m, ready_at);
        }
    }

    /// While a GPU is free and a model is eligible: earliest head deadline
    /// first, lazy drop, the largest batch that meets the head's deadline.
    fn schedule(&mut self, now: Instant, out: &mut Actions) {
        while let Some((t, m)) = self.waiting.peek() {
            if t > now {
                break;
            }
            self.waiting.remove(m);
            let head = self.models[m as usize].queue.front().map_or(now, |r| r.deadline);
            self.eligible.set(m, head);
        }
        loop {
            let Some((gpu, free)) = self.gpus.earliest(now) else { return };
            if free > now {
                return;
            }
            let Some((_, m)) = self.eligible.peek() else { return };
            let delay = self.delay;
            let model = &mut self.models[m as usize];
            let dropped = match self.drop {
                DropMode::Lazy => {
                    let alone = now + delay.of(1) + model.profile.latency(1);
                    let mut dropped = false;
                    while model.queue.front().is_some_and(|h| h.deadline < alone) {
                        if let Some(h) = model.queue.pop_front() {
                            out.drops.push((h, DropReason::DeadlineUnmeetable));
                        }
                        dropped = true;
                    }
                    dropped
                }
                DropMode::Early => drop_heads(&mut model.queue, &model.profile, model.full as u32, DropMode::Early, now, delay, out),
            };
            if dropped {
                // The head changed: another model may now be more urgent,
                // or this one may be back inside its timeout.
                self.rekey(now, m);
                continue;
            }
            if model.queue.is_empty() {
                self.rekey(now, m);
                continue;
            }
            let (skip, bs) = largest_batch(&model.queue, &model.profile, now, delay);
            let exec_at = now + delay.of(bs);
            let finish_at = exec_at + model.profile.latency(bs);
            out.push_batch(gpu, m, exec_at, finish_at, now, model.queue.drain(skip..skip + bs as usize));
            self.gpus.occupy(gpu, finish_at);
            self.rekey(now, m);
        }
    }
}

/// The batch a free GPU runs from `queue` (sorted by deadline, non-empty,
/// head able to finish alone): `(skip, size)`, members `skip..skip + size`.
/// The largest batch that finishes by the head's deadline, or a larger one
/// past the first heads where batching pays even counting the skipped
/// heads ([`larger_batch_past_heads`]).
fn largest_batch(queue: &VecDeque<Request>, profile: &LatencyProfile, now: Instant, delay: NetworkDelay) -> (usize, u32) {
    let max_batch = profile.max_batch();
    let within = |deadline: Instant, limit: u32| profile.max_batch_within(deadline.saturating_since(now + delay.d_ctrl), delay.d_data, limit);
    let Some(head) = queue.front() else { return (0, 0) };
    let b0 = within(head.deadline, (queue.len() as u32).min(max_batch)).max(1);
    larger_batch_past_heads(queue, b0, max_batch, |b| profile.latency(b), within, |_, _| true)
}

impl Scheduler for EagerScheduler {
    fn on_request(&mut self, now: Instant, req: Request, out: &mut Actions) {
        let Some(model) = self.models.get_mut(req.model as usize) else {
            out.drops.push((req, DropReason::UnknownModel));
            return;
        };
        insert_by_deadline(&mut model.queue, req);
        self.rekey(now, req.model);
        self.schedule(now, out);
    }

    /// A GPU out of matchmaking gets no new batch; one back (or new) is
    /// offered to the queues at once.
    fn set_gpu_membership(&mut self, now: Instant, gpu: GpuId, online: bool, out: &mut Actions) -> bool {
        self.gpus.set_online(now, gpu, online);
        self.schedule(now, out);
        true
    }

    fn on_batch_done(&mut self, now: Instant, _gpu: GpuId, out: &mut Actions) {
        self.schedule(now, out);
    }

    fn on_wake(&mut self, now: Instant, out: &mut Actions) {
        self.schedule(now, out);
    }

    /// When the first waiting model's timeout ends (eager never waits).
    fn poll_at(&self) -> Option<Instant> {
        self.waiting.peek().map(|(t, _)| t)
    }

    fn name(&self) -> &'static str {
        self.name
    }
}
