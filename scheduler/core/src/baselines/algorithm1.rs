//! Algorithm 1 of the Symphony paper as written (arXiv 2308.07470, section
//! 3.2), with the network delay of its Appendix D (Figure 18) and nothing
//! else: the reference beside which [`crate::deferred`]'s departures are
//! measured (issue 49). Read it beside the paper; comments cite Algorithm 1
//! as "A1 line N" and Figure 18's functions by name.
//!
//! Per model: a queue `Q_M` and a candidate `c_M = (bs, exec_at, latest)`
//! (`update_candidate`). Per GPU: when it is free. Three kinds of timer: a
//! model timer at `c.exec_at - delay(c.bs)` (`inform_candidate`), one GPU
//! timer at the earliest free GPU's `free_at - delay(bs)` for the largest
//! waiting candidate (`set_gpu_timer`), and a drop timer per model at its
//! head's deadline. The paper's two threads become plain calls: a grant is
//! acted on at once, so no GPU is ever marked `+inf`.
//!
//! Where the pseudo-code is silent, the reading taken:
//! - `GetBatch` (A1 line 2, `batch.update_batch`) is the lazy gatherer the
//!   paper names first: drop heads that cannot finish even alone, then take
//!   the longest prefix of the queue that finishes by the head's deadline,
//!   starting at `max(now + delay(b), gpu_free_at)`.
//! - At the profile's largest batch `l(bs + 1)` is undefined; the batch
//!   cannot grow, so there is nothing to wait for and the frontrun bound is
//!   dropped (`exec_at = earliest`). The zoo caps profiles at the largest
//!   batch within the SLO, where a linear profile's extrapolated frontrun
//!   lies before the head's arrival: the same thing.
//! - A drop timer's `update_candidate` is followed by `inform_candidate`,
//!   like every other one: otherwise a model whose candidate expired out of
//!   `mc` would wait for its next arrival with requests queued.
//! - One GPU timer, not one per GPU: `set_gpu_timer` only ever re-arms the
//!   earliest GPU's, and a timer left on a GPU that stopped being the
//!   earliest would grant a later GPU than the earliest.
//! - Among free GPUs the lowest id (A1 line 19, section 3.2: high ids stay
//!   idle at low load); among busy ones the earliest free (`get_earliest`),
//!   accepted when it frees by `exec_at` (`<=`, Figure 18; A1 writes `<`).
//!
//! Costs: `O(G)` per model timer and per GPU timer re-arm, `O(M)` per GPU
//! timer (the waiting candidates), `O(log B)` per candidate update.

use super::prelude::*;

/// `c_M` (A1 line 7; Figure 18's `Candidate`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Candidate {
    /// `|B|`: the batch is the first `bs` requests of the queue.
    bs: u32,
    /// When the batch should start on the GPU (A1 line 5, with delay).
    exec_at: Instant,
    /// The latest start that still meets the head's deadline (A1 line 6).
    latest: Instant,
}

struct Model {
    profile: LatencyProfile,
    /// `Q_M`, sorted by deadline.
    queue: VecDeque<Request>,
    /// `c_M`.
    candidate: Option<Candidate>,
}

/// Algorithm 1 with Appendix D's network delay: see the module documentation.
pub struct Algorithm1Scheduler {
    delay: NetworkDelay,
    models: Vec<Model>,
    /// `gpu_free_at` (Figure 18's `RankThread`).
    gpu_free_at: Vec<Instant>,
    /// `mc`: models whose candidate found no GPU at its model timer, keyed
    /// by the candidate's `latest` (ties to the lower model id).
    waiting: IndexedHeap<Instant>,
    /// Every timer: model `m`'s at id `m`, its drop timer at `M + m`, the
    /// GPU timer at `2M`.
    timers: IndexedHeap<Instant>,
    /// The GPU the GPU timer is for.
    gpu_timer_gpu: GpuId,
}

impl Algorithm1Scheduler {
    /// The policy for `models` (model id = index) on `gpus` GPUs, charging
    /// `delay(b)` before each batch of `b`.
    pub fn new(models: &[ModelSpec], gpus: u32, delay: NetworkDelay) -> Self {
        let n = models.len();
        Algorithm1Scheduler {
            delay,
            models: models.iter().map(|m| Model { profile: m.profile.clone(), queue: VecDeque::with_capacity(256), candidate: None }).collect(),
            gpu_free_at: vec![Instant::ZERO; gpus.max(1) as usize],
            waiting: IndexedHeap::with_ids(n),
            timers: IndexedHeap::with_ids(2 * n + 1),
            gpu_timer_gpu: 0,
        }
    }

    fn model_timer(m: usize) -> u32 {
        m as u32
    }

    fn drop_timer(&self, m: usize) -> u32 {
        (self.models.len() + m) as u32
    }

    fn gpu_timer(&self) -> u32 {
        (2 * self.models.len()) as u32
    }

    /// `update_candidate(gpu_free_at)`; `Instant::ZERO` stands for `-inf`.
    fn update_candidate(&mut self, now: Instant, m: usize, gpu_free_at: Instant, out: &mut Actions) {
        let delay = self.delay;
        let drop_timer = self.drop_timer(m);
        let model = &mut self.models[m];
        // GetBatch (A1 line 2): lazy drop of heads that cannot finish alone
        // (Figure 18's `pop_dropped`)...
        let alone = (now + delay.of(1)).max(gpu_free_at) + model.profile.latency(1);
        while model.queue.front().is_some_and(|h| h.deadline < alone) {
            if let Some(h) = model.queue.pop_front() {
                out.drops.push((h, DropReason::DeadlineUnmeetable));
            }
        }
        let Some(head) = model.queue.front() else {
            model.candidate = None; // A1 line 8
            self.timers.remove(drop_timer);
            return;
        };
        // ...then the longest prefix that finishes by the head's deadline,
        // the earliest deadline of the batch (A1 line 4).
        let dl = head.deadline;
        let limit = (model.queue.len() as u32).min(model.profile.max_batch());
        let by_network = model.profile.max_batch_within(dl.saturating_since(now + delay.d_ctrl), delay.d_data, limit);
        let by_gpu = model.profile.max_batch_within(dl.saturating_since(gpu_free_at), Duration::ZERO, limit);
        let bs = by_network.min(by_gpu).max(1);
        // drop_timer.set(dl): never at `now`, so a zero-latency profile
        // (whose head is not yet late at its deadline) cannot spin.
        self.timers.set(drop_timer, dl.max(now + Duration::from_nanos(1)));
        let earliest = (now + delay.of(bs)).max(gpu_free_at);
        let exec_at = if bs < model.profile.max_batch() {
            let frontrun_at = dl - model.profile.latency(bs + 1);
            earliest.max(frontrun_at) // A1 line 5
        } else {
            earliest // the batch cannot grow: no frontrun (module docs)
        };
        let latest = dl - model.profile.latency(bs); // A1 line 6
        model.candidate = Some(Candidate { bs, exec_at, latest });
    }

    /// `inform_candidate`: `del mc[m]`, and the model timer re-armed at
    /// `c.exec_at - delay(c.bs)` so the inputs arrive by `exec_at`.
    fn inform_candidate(&mut self, m: usize) {
        self.waiting.remove(m as u32);
        match self.models[m].candidate {
            Some(c) => self.timers.set(Self::model_timer(m), c.exec_at - self.delay.of(c.bs)),
            None => {
                self.timers.remove(Self::model_timer(m));
            }
        }
    }

    /// `gpu_free_at.get_earliest()`: the lowest-id free GPU, else the one
    /// that frees first.
    fn earliest_gpu(&self, now: Instant) -> (GpuId, Instant) {
        let mut best = (0, self.gpu_free_at[0]);
        for (g, &free) in self.gpu_free_at.iter().enumerate() {
            if free.max(now) < best.1.max(now) {
                best = (g as GpuId, free);
            }
        }
        best
    }

    /// `inform_gpu`.
    fn inform_gpu(&mut self, now: Instant, gpu: GpuId, free_at: Instant) {
        self.gpu_free_at[gpu as usize] = free_at;
        self.set_gpu_timer(now);
    }

    /// `set_gpu_timer`: the earliest GPU's timer, `delay(bs)` of the largest
    /// waiting candidate ahead of its free time.
    fn set_gpu_timer(&mut self, now: Instant) {
        let (gpu, free_at) = self.earliest_gpu(now);
        let timer = self.gpu_timer();
        self.timers.remove(timer);
        let largest = self.waiting.iter().filter_map(|(_, m)| self.models[m as usize].candidate).map(|c| c.bs).max();
        if let Some(bs) = largest {
            self.gpu_timer_gpu = gpu;
            self.timers.set(timer, free_at - self.delay.of(bs));
        }
    }

    /// `on_model_timer` (A1 lines 18-20).
    fn on_model_timer(&mut self, now: Instant, m: usize, out: &mut Actions) {
        let Some(c) = self.models[m].candidate else { return };
        let (gpu, free_at) = self.earliest_gpu(now);
        if free_at <= c.exec_at {
            self.granted_gpu(now, m, gpu, free_at, out);
        } else {
            // No GPU by exec_at: the candidate waits in `mc` for one.
            self.waiting.set(m as u32, c.latest);
            self.set_gpu_timer(now);
        }
    }

    /// `on_gpu_timer` (A1 lines 21-23): forget the candidates the GPU frees
    /// too late for, then grant it to the one whose `latest` is the closest.
    fn on_gpu_timer(&mut self, now: Instant, out: &mut Actions) {
        let gpu = self.gpu_timer_gpu;
        let free_at = self.gpu_free_at[gpu as usize];
        while let Some((latest, _)) = self.waiting.peek() {
            if free_at <= latest {
                break;
            }
            self.waiting.pop();
        }
        if let Some((_, m)) = self.waiting.peek() {
            self.granted_gpu(now, m as usize, gpu, free_at, out);
        }
        self.set_gpu_timer(now);
    }

    /// `granted_gpu` (A1 `Dispatch`, lines 9-14): the candidate recomputed
    /// for this GPU's free time, sent, and the next one prepared.
    fn granted_gpu(&mut self, now: Instant, m: usize, gpu: GpuId, gpu_free_at: Instant, out: &mut Actions) {
        self.update_candidate(now, m, gpu_free_at, out); // A1 line 10
        if let Some(c) = self.models[m].candidate {
            let model = &mut self.models[m];
            let finish_at = c.exec_at + model.profile.latency(c.bs); // A1 line 12
            out.push_batch(gpu, m as ModelId, c.exec_at, finish_at, now, model.queue.drain(..c.bs as usize)); // A1 lines 11, 13
            self.update_candidate(now, m, Instant::ZERO, out); // A1 line 14
            self.inform_gpu(now, gpu, finish_at);
        } else {
            // Nothing left to run: the GPU keeps its free time.
            self.set_gpu_timer(now);
        }
        self.inform_candidate(m);
    }

    /// Fires every timer due by `now`, earliest first. Each firing drops a
    /// head, dispatches, or moves a candidate into `mc` (which only a
    /// dispatch or an update takes it out of), so this ends.
    fn run_timers(&mut self, now: Instant, out: &mut Actions) {
        let n = self.models.len();
        while let Some((at, id)) = self.timers.peek() {
            if at > now {
                return;
            }
            self.timers.pop();
            let id = id as usize;
            if id < n {
                self.on_model_timer(now, id, out);
            } else if id < 2 * n {
                // drop_timer: lambda: update_candidate(-inf) (then inform).
                self.update_candidate(now, id - n, Instant::ZERO, out);
                self.inform_candidate(id - n);
            } else {
                self.on_gpu_timer(now, out);
            }
        }
    }
}

impl Scheduler for Algorithm1Scheduler {
    /// `OnNewRequest` (A1 lines 15-17; Figure 18's `schedule`).
    fn on_request(&mut self, now: Instant, req: Request, out: &mut Actions) {
        let m = req.model as usize;
        let Some(model) = self.models.get_mut(m) else {
            out.drops.push((req, DropReason::UnknownModel));
            return;
        };
        super::insert_by_deadline(&mut model.queue, req);
        self.update_candidate(now, m, Instant::ZERO, out);
        self.inform_candidate(m);
        self.run_timers(now, out);
    }

    /// The policy planned the GPU's free time when it dispatched; only the
    /// timers due by now run.
    fn on_batch_done(&mut self, now: Instant, _gpu: GpuId, out: &mut Actions) {
        self.run_timers(now, out);
    }

    fn on_wake(&mut self, now: Instant, out: &mut Actions) {
        self.run_timers(now, out);
    }

    fn poll_at(&self) -> Option<Instant> {
        self.timers.peek().map(|(at, _)| at)
    }

    fn name(&self) -> &'static str {
        "algorithm1"
    }
}
