//! The eager family's strong variant and Clockwork as the Symphony paper
//! describes it (issue 49): two work-conserving rules that rank models by
//! the latest moment their largest feasible batch can start.
//!
//! **Largest feasible batch by latest start** (`eager-latest-start`): when a
//! GPU is free, drop every queue head that cannot finish even alone; for
//! each model take its largest feasible batch (every queued request, oldest
//! first, that can finish by the head's deadline: the largest `n` with
//! `now + delay(n) + l(n) <= d_head`); run the batch of the model whose
//! latest start `d_head - delay(n) - l(n)` is the earliest. Ties go to the
//! lower model id. Unlike head-deadline EDF ([`super::eager`]) a model with
//! a long queue, whose batch takes long, goes before a model whose head is
//! due sooner but whose batch is short.
//!
//! **Clockwork as the Symphony paper describes it** (`clockwork-paper`,
//! arXiv 2308.07470 section 2): a free GPU takes, over all models and batch
//! sizes, the candidate with the earliest latest-executable moment, where
//! the candidate of size `b` is the `b` oldest requests sharing the head's
//! deadline. For a model the largest feasible `b` has the earliest such
//! moment, so this is the rule above with another tie rule: ties go to the
//! larger batch, then to the older head. The controller's schedule-ahead,
//! power-of-two sizes and safety margin are [`super::clockwork`]'s, not
//! this one's.
//!
//! Both drop lazily (above) or early ([`DropMode::Early`]): Nexus's sliding
//! window, whose length here is the model's queue capped at its largest
//! batch within the SLO. Heads are skipped until one can finish in a batch
//! of the window's length (the window shrinking with what is left), and the
//! chosen model drops what it skipped. With a short queue the window is
//! short and early drop is lazy drop.
//!
//! Every event costs `O(log G)`, plus `O(M)` per free GPU considered and
//! `O(log B)` per model per decision.

use super::prelude::*;

/// How a baseline gives up requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropMode {
    /// A head is dropped once it cannot finish even alone.
    Lazy,
    /// Nexus's sliding window ([`early_drop_count`]), then lazy.
    Early,
}

/// How the models are ranked when a GPU is free.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rank {
    /// Earliest latest start of the largest feasible batch; ties to the lower model id.
    LatestStart,
    /// Clockwork as the Symphony paper describes it: earliest
    /// latest-executable moment over every (model, batch size); ties to
    /// the larger batch, then the older head.
    ClockworkPaper,
}

/// How many heads of `queue` (sorted by deadline, every head able to finish
/// alone) Nexus's sliding window skips: the first `i` such that request `i`
/// finishes by its deadline in a batch of `w = min(len - i, full)`.
pub(crate) fn early_drop_count(queue: &VecDeque<Request>, profile: &LatencyProfile, full: u32, now: Instant, delay: NetworkDelay) -> usize {
    let len = queue.len();
    let mut i = 0;
    while i < len {
        let w = ((len - i) as u32).min(full).max(1);
        if now + delay.of(w) + profile.latency(w) <= queue[i].deadline {
            break;
        }
        i += 1;
    }
    i
}

/// Drops `queue`'s heads that cannot finish alone (lazy), then, with
/// [`DropMode::Early`], the heads the sliding window skips.
pub(crate) fn drop_heads(queue: &mut VecDeque<Request>, profile: &LatencyProfile, full: u32, mode: DropMode, now: Instant, delay: NetworkDelay, out: &mut Actions) -> bool {
    let before = queue.len();
    let alone = now + delay.of(1) + profile.latency(1);
    while queue.front().is_some_and(|h| h.deadline < alone) {
        if let Some(h) = queue.pop_front() {
            out.drops.push((h, DropReason::DeadlineUnmeetable));
        }
    }
    if mode == DropMode::Early {
        let skip = early_drop_count(queue, profile, full, now, delay);
        out.drops.extend(queue.drain(..skip).map(|r| (r, DropReason::EarlyDrop)));
    }
    queue.len() != before
}

/// Whether candidate `a` goes before `b` under `rank`.
fn before(rank: Rank, a: &Candidate, b: &Candidate) -> bool {
    match rank {
        Rank::LatestStart => (a.latest, a.model) < (b.latest, b.model),
        Rank::ClockworkPaper => (a.latest, std::cmp::Reverse(a.size), a.head_arrival, a.model) < (b.latest, std::cmp::Reverse(b.size), b.head_arrival, b.model),
    }
}

struct ModelState {
    profile: LatencyProfile,
    /// The largest batch that fits the SLO: the early-drop window's cap.
    full: u32,
    /// Pending requests, sorted by deadline.
    queue: VecDeque<Request>,
}

/// A model's candidate at a decision: `skip` heads the window passes over,
/// then a batch of `size`, whose latest start is `latest`.
#[derive(Clone, Copy)]
struct Candidate {
    model: ModelId,
    skip: usize,
    size: u32,
    latest: Instant,
    head_arrival: Instant,
}

/// The latest-start policies: see the module documentation.
pub struct LatestStartScheduler {
    delay: NetworkDelay,
    models: Vec<ModelState>,
    gpus: GpuPool,
    /// Requests queued over every model (a free GPU with none skips the scan).
    queued: usize,
    drop: DropMode,
    rank: Rank,
    name: &'static str,
}

impl LatestStartScheduler {
    /// The policy for `models` (model id = index) on `gpus` GPUs.
    pub fn new(models: &[ModelSpec], gpus: u32, delay: NetworkDelay, rank: Rank, drop: DropMode) -> Self {
        let name = match (rank, drop) {
            (Rank::LatestStart, DropMode::Lazy) => "eager-latest-start",
            (Rank::LatestStart, DropMode::Early) => "eager-latest-start-early",
            (Rank::ClockworkPaper, DropMode::Lazy) => "clockwork-paper",
            (Rank::ClockworkPaper, DropMode::Early) => "clockwork-paper-early",
        };
        LatestStartScheduler {
            delay,
            models: models
                .iter()
                .map(|m| ModelState {
                    profile: m.profile.clone(),
                    full: m.profile.max_batch_within(m.slo, Duration::ZERO, m.profile.max_batch()).max(1),
                    queue: VecDeque::with_capacity(256),
                })
                .collect(),
            gpus: GpuPool::new(gpus),
            queued: 0,
            drop,
            rank,
            name,
        }
    }

    /// While a GPU is free and a request is queued: lazy drop everywhere,
    /// then the most urgent model's largest feasible batch.
    fn schedule(&mut self, now: Instant, out: &mut Actions) {
        let (delay, rank) = (self.delay, self.rank);
        loop {
            if self.queued == 0 {
                return;
            }
            let Some((gpu, free)) = self.gpus.earliest(now) else { return };
            if free > now {
                return;
            }
            let mut best: Option<Candidate> = None;
            for (m, model) in self.models.iter_mut().enumerate() {
                if model.queue.is_empty() {
                    continue;
                }
                let queued_before = model.queue.len();
                drop_heads(&mut model.queue, &model.profile, model.full, DropMode::Lazy, now, delay, out);
                self.queued -= queued_before - model.queue.len();
                let skip = match self.drop {
                    DropMode::Lazy => 0,
                    DropMode::Early => early_drop_count(&model.queue, &model.profile, model.full, now, delay),
                };
                let Some(head) = model.queue.get(skip) else { continue };
                let limit = ((model.queue.len() - skip) as u32).min(model.profile.max_batch());
                let size = model.profile.max_batch_within(head.deadline.saturating_since(now + delay.d_ctrl), delay.d_data, limit).max(1);
                let c = Candidate { model: m as ModelId, skip, size, latest: head.deadline - delay.of(size) - model.profile.latency(size), head_arrival: head.arrival };
                if best.as_ref().is_none_or(|b| before(rank, &c, b)) {
                    best = Some(c);
                }
            }
            let Some(c) = best else { return };
            let model = &mut self.models[c.model as usize];
            out.drops.extend(model.queue.drain(..c.skip).map(|r| (r, DropReason::EarlyDrop)));
            let exec_at = now + delay.of(c.size);
            let finish_at = exec_at + model.profile.latency(c.size);
            out.push_batch(gpu, c.model, exec_at, finish_at, now, model.queue.drain(..c.size as usize));
            self.queued -= c.skip + c.size as usize;
            self.gpus.occupy(gpu, finish_at);
        }
    }
}

impl Scheduler for LatestStartScheduler {
    fn on_request(&mut self, now: Instant, req: Request, out: &mut Actions) {
        let Some(model) = self.models.get_mut(req.model as usize) else {
            out.drops.push((req, DropReason::UnknownModel));
            return;
        };
        super::insert_by_deadline(&mut model.queue, req);
        self.queued += 1;
        self.schedule(now, out);
    }

    fn on_batch_done(&mut self, now: Instant, _gpu: GpuId, out: &mut Actions) {
        self.schedule(now, out);
    }

    fn on_wake(&mut self, now: Instant, out: &mut Actions) {
        self.schedule(now, out);
    }

    /// Never: every decision follows an arrival or a finish.
    fn poll_at(&self) -> Option<Instant> {
        None
    }

    fn name(&self) -> &'static str {
        self.name
    }
}
