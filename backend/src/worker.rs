//! The batch pipeline: plan in, READs out, execute, outputs back.
//!
//! A [`BatchWorker`] owns the scheduler connection, one connection per
//! frontend (by frontend id), an [`Executor`] and a staging region cut into
//! `batch_slots` batch buffers (`max_batch` input slots + `max_batch`
//! output slots each). Its [`poll`](BatchWorker::poll) takes `now` from the
//! caller (real or virtual clock) and does a bounded amount of work:
//!
//! 1. takes batch plans from the scheduler while a batch buffer is free
//!    (otherwise plans wait in the transport: back-pressure, never a drop);
//!    `exec_at = receipt + exec_in - control_delay`;
//! 2. posts every input READ of a plan at once, one `post_reads` per
//!    frontend (an incast), retrying `QueueFull` on later polls;
//! 3. collects READ completions; a failed READ or a dead frontend fails
//!    only its tasks;
//! 4. when every input is in (or `exec_at + fetch_grace` passed: the
//!    missing ones fail) and the device is idle, submits the batch of the
//!    arrived inputs to the executor with its `exec_at`; a batch the
//!    scheduler has already given up (past its planned end and the
//!    scheduler's grace: [`BatchWorker::set_plan_grace`]) is skipped and
//!    its tasks answered `Abandoned`;
//! 5. when the executor reports the batch, sends one `Completion` per task
//!    and then a `BatchDone` to the scheduler: the device's start and
//!    finish as durations before the send, and the batch's slowest input
//!    READ (post to completion), which the scheduler's closed loop and its
//!    delay-bound check learn from.
//!
//! Outputs travel **inline** in the `Completion` (at most
//! [`wire::MAX_INLINE_OUTPUT`] bytes): the frontend needs no second READ
//! and the output slot is free as soon as the message is queued. A task
//! whose frontend is gone (or unknown) gets its error `Completion` sent to
//! the scheduler instead, so every planned task has exactly one terminal
//! message somewhere. A batch buffer is reused only once all its READs have
//! completed (a READ that outlived a fetch deadline still owns its slot).
//!
//! Scheduler messages other than plans (frontend announcements
//! `Register{Frontend}`, heartbeats) are kept in a bounded queue for the
//! caller ([`BatchWorker::pop_control`]); while it is full the worker stops
//! reading from the scheduler (back-pressure, never a loss).
//!
//! Once warm (every batch buffer used once, connections warm) a batch
//! allocates nothing: all state is preallocated at construction.

mod config;
mod execute;
mod failures;
mod fetch;
mod plans;
mod report;
mod results;
mod seen;

use std::collections::VecDeque;

use dataplane::capability::ReadGrant;
use dataplane::time::{Duration, Instant};
use dataplane::transport::{Completion, Connection, Error, ReadOp, Registration};
use dataplane::wire::{self, TaskStatus};

use crate::exec::{Executor, Finished, InputRef};

pub use config::{WorkerConfig, WorkerError};
pub use execute::LATE_START_THRESHOLD;
pub use report::{BatchReport, ControlMessage, FenceReason, FencedPlan, WorkerStats};
use report::FENCED_CAPACITY;
use seen::SeenBatches;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TaskPhase {
    Unposted,
    Posted,
    Arrived,
    Failed(TaskStatus),
}

#[derive(Clone, Copy, Debug)]
struct TaskState {
    task_id: u64,
    frontend: u32,
    input: wire::RemoteRef,
    phase: TaskPhase,
    /// Index of the task's output in the executed job.
    out_index: u32,
    /// [`wire::BatchTask::queued_us`], echoed in its completion.
    queued_us: u32,
    /// [`wire::BatchTask::capability`], handed back in its completion.
    capability: dataplane::capability::Capability,
    /// When its READ was posted (its latency is measured from here).
    posted_at: Instant,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Free,
    /// READs posted or to post.
    Fetching,
    /// Inputs resolved; waiting for the device.
    Ready,
    /// On the device.
    Executing,
    /// Sending completions (cursor) then BatchDone.
    Sending,
    /// Everything sent; READs still outstanding.
    Draining,
}

#[derive(Debug)]
struct BatchSlot {
    generation: u32,
    phase: Phase,
    batch_id: u64,
    /// The scheduler link the plan came over ([`BatchWorker::replace_scheduler`]
    /// counts them): a batch of an earlier one is not reported to a later
    /// one, whose batch ids are its own.
    link: u32,
    /// The planning scheduler's epoch.
    epoch: u32,
    /// How long the plan said the batch holds its device.
    run: Duration,
    model: u32,
    gpu: u32,
    received: Instant,
    exec_at: Instant,
    tasks: Vec<TaskState>,
    /// Tasks not yet Arrived or Failed.
    unresolved: u32,
    unposted: u32,
    outstanding_reads: u32,
    submitted: Option<Instant>,
    /// Tasks handed to the executor (their `out_index` is their position).
    ran: u32,
    start: Option<Instant>,
    finish: Option<Instant>,
    exec_ok: bool,
    /// The slowest successful READ so far and how many succeeded.
    read_max: Duration,
    reads_ok: u32,
    /// Next task whose completion to send; `tasks.len()` = BatchDone next.
    send_cursor: usize,
}

/// The batch pipeline over connections `C` and executor `E`.
pub struct BatchWorker<C: Connection, E: Executor> {
    cfg: WorkerConfig,
    exec: E,
    staging: Registration,
    scheduler: C,
    frontends: Vec<Option<C>>,
    /// Ids of the frontends ever added (so a poll visits only those, not
    /// all `max_frontends` entries).
    active_frontends: Vec<u32>,
    slots: Vec<BatchSlot>,
    free_slots: usize,
    msg_in: Vec<u8>,
    msg_out: Vec<u8>,
    out_bytes: Vec<u8>,
    ops: Vec<ReadOp>,
    /// What each of `ops` presents (its task and the plan's capability).
    grants: Vec<ReadGrant>,
    op_tasks: Vec<u32>,
    inputs: Vec<InputRef>,
    completions: Vec<Completion>,
    finished: Vec<Finished>,
    reports: VecDeque<BatchReport>,
    control: VecDeque<ControlMessage>,
    /// The worker's messages (plans, announcements) that the registration
    /// read off the link before the Welcome (a reordering network can
    /// deliver them first), taken before anything newer.
    early: VecDeque<Vec<u8>>,
    taking_plans: bool,
    scheduler_heard: Instant,
    /// Batch ids taken recently, so a duplicated plan runs once while a
    /// plan overtaken by a later one still runs.
    seen_batches: SeenBatches,
    /// How many times the scheduler link was replaced.
    scheduler_link: u32,
    /// The newest election epoch seen (Welcome or plan).
    epoch: u32,
    fenced: VecDeque<FencedPlan>,
    stats: WorkerStats,
    /// Which failed runs were logged (once per model and reason).
    failures: failures::FailureLog,
    /// This backend's id, named in every completion (the frontend checks
    /// the task's capability against it).
    backend_id: u32,
    /// How long past a plan's planned end the scheduler waits for its
    /// report before giving the batch up ([`BatchWorker::set_plan_grace`];
    /// None: plans are never skipped).
    plan_grace: Option<Duration>,
}

/// Control messages held for the caller before the worker stops reading
/// from the scheduler.
pub const CONTROL_QUEUE_CAPACITY: usize = 64;
/// Messages of the worker's that the registration keeps when they arrive
/// before the Welcome ([`BatchWorker::push_early`]).
pub const EARLY_CAPACITY: usize = 256;

impl<C: Connection, E: Executor> BatchWorker<C, E> {
    /// A worker. `staging` is the registration (with `LOCAL_WRITE`) of the
    /// region the executor was built on, at least
    /// [`WorkerConfig::staging_bytes`] long; `scheduler` is the connection
    /// plans arrive on.
    pub fn new(
        cfg: WorkerConfig,
        exec: E,
        staging: Registration,
        scheduler: C,
    ) -> Result<Self, WorkerError> {
        if cfg.max_batch == 0 || cfg.max_batch as usize > wire::MAX_BATCH_TASKS {
            return Err(WorkerError::Config("max_batch must be 1..=MAX_BATCH_TASKS"));
        }
        if cfg.max_batch > exec.max_batch() {
            return Err(WorkerError::Config("max_batch above the executor's"));
        }
        if cfg.output_slot as usize > wire::MAX_INLINE_OUTPUT {
            return Err(WorkerError::Config("output_slot above MAX_INLINE_OUTPUT"));
        }
        if cfg.input_slot == 0 || cfg.batch_slots == 0 || cfg.batch_slots > 0xffff {
            return Err(WorkerError::Config(
                "input_slot and batch_slots must be positive",
            ));
        }
        if (staging.region().len() as u64) < cfg.staging_bytes() {
            return Err(WorkerError::Config(
                "staging region smaller than staging_bytes()",
            ));
        }
        let mb = cfg.max_batch as usize;
        let slots = (0..cfg.batch_slots)
            .map(|_| BatchSlot {
                generation: 1,
                phase: Phase::Free,
                batch_id: 0,
                link: 0,
                epoch: 0,
                run: Duration::ZERO,
                model: 0,
                gpu: 0,
                received: Instant::ZERO,
                exec_at: Instant::ZERO,
                tasks: Vec::with_capacity(mb),
                unresolved: 0,
                unposted: 0,
                outstanding_reads: 0,
                submitted: None,
                ran: 0,
                start: None,
                finish: None,
                exec_ok: false,
                read_max: Duration::ZERO,
                reads_ok: 0,
                send_cursor: 0,
            })
            .collect();
        Ok(BatchWorker {
            exec,
            staging,
            scheduler,
            frontends: (0..cfg.max_frontends).map(|_| None).collect(),
            active_frontends: Vec::with_capacity(cfg.max_frontends as usize),
            slots,
            free_slots: cfg.batch_slots as usize,
            msg_in: vec![0; wire::MAX_MESSAGE_LEN],
            msg_out: vec![0; wire::MAX_MESSAGE_LEN],
            out_bytes: vec![0; cfg.output_slot as usize],
            ops: Vec::with_capacity(mb),
            grants: Vec::with_capacity(mb),
            op_tasks: Vec::with_capacity(mb),
            inputs: Vec::with_capacity(mb),
            completions: vec![Completion::default(); 64],
            finished: vec![Finished::default(); 16],
            reports: VecDeque::with_capacity(cfg.report_capacity as usize),
            control: VecDeque::with_capacity(CONTROL_QUEUE_CAPACITY),
            early: VecDeque::new(),
            taking_plans: true,
            scheduler_heard: Instant::ZERO,
            seen_batches: SeenBatches::default(),
            scheduler_link: 0,
            epoch: 0,
            fenced: VecDeque::with_capacity(FENCED_CAPACITY),
            stats: WorkerStats::default(),
            failures: failures::FailureLog::default(),
            backend_id: 0,
            plan_grace: None,
            cfg,
        })
    }

    /// This backend's id, named in its completions (the node sets it).
    pub fn set_backend_id(&mut self, id: u32) {
        self.backend_id = id;
    }

    /// Adds (or replaces) the connection to frontend `id`. A replaced
    /// connection is returned; its outstanding READs are lost with it, so
    /// only replace a connection that has none.
    pub fn add_frontend(&mut self, id: u32, conn: C) -> Result<Option<C>, WorkerError> {
        let slot = self
            .frontends
            .get_mut(id as usize)
            .ok_or(WorkerError::Config("frontend id >= max_frontends"))?;
        let old = slot.replace(conn);
        if old.is_none() && !self.active_frontends.contains(&id) {
            self.active_frontends.push(id);
        }
        Ok(old)
    }

    /// The connection to frontend `id`.
    pub fn frontend(&mut self, id: u32) -> Option<&mut C> {
        self.frontends.get_mut(id as usize)?.as_mut()
    }

    /// Sets the one-way control delay bound subtracted from later plans'
    /// `exec_in` (the scheduler announces it at registration).
    pub fn set_control_delay(&mut self, bound: Duration) {
        self.cfg.control_delay = bound;
    }

    /// How long past a plan's planned end the scheduler waits for the
    /// batch's report before it gives the batch up and fails its tasks
    /// back (its batch grace). A plan that has not started by then (its
    /// planned end, plus this, plus the control delay bound by which this
    /// backend's clock may run ahead of the plan's) is skipped: its tasks
    /// are answered `Abandoned` and its `BatchDone` reports nothing run,
    /// so a backend that lags behind its plans catches up instead of
    /// running work nobody waits for. None (the default): never skipped.
    pub fn set_plan_grace(&mut self, grace: Option<Duration>) {
        self.plan_grace = grace;
    }

    /// The control delay bound in force.
    pub fn control_delay(&self) -> Duration {
        self.cfg.control_delay
    }

    /// The scheduler connection.
    pub fn scheduler(&mut self) -> &mut C {
        &mut self.scheduler
    }

    /// Puts `conn` in place of the scheduler connection (a scheduler
    /// reached again after the last one was lost) and returns the old one;
    /// batches in flight carry on.
    pub fn replace_scheduler(&mut self, conn: C) -> C {
        // A new scheduler numbers its batches afresh.
        self.scheduler_link = self.scheduler_link.wrapping_add(1);
        self.seen_batches = SeenBatches::default();
        std::mem::replace(&mut self.scheduler, conn)
    }

    /// The newest election epoch seen (0: none).
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// An election epoch seen (a Welcome's or a plan's). A newer one than
    /// any before fences the older epochs: batches of theirs held and not
    /// started are dropped unexecuted (their tasks are the new leader's to
    /// plan; frontends resubmit what they await), and their later plans
    /// are refused. Running batches finish (they started before the new
    /// epoch was known, and the new leader was told how long their GPUs
    /// stay busy). Returns how many batches were dropped.
    pub fn see_epoch(&mut self, epoch: u32) -> usize {
        if epoch <= self.epoch {
            return 0;
        }
        self.epoch = epoch;
        let mut dropped = 0;
        for si in 0..self.slots.len() {
            let s = &mut self.slots[si];
            if s.epoch >= epoch || !matches!(s.phase, Phase::Fetching | Phase::Ready) {
                continue;
            }
            s.unposted = 0;
            if s.outstanding_reads == 0 {
                s.phase = Phase::Free;
                self.free_slots += 1;
            } else {
                // Freed when its READs are in (they own its buffer).
                s.phase = Phase::Draining;
            }
            let f = FencedPlan { batch_id: s.batch_id, epoch: s.epoch, newest: epoch, reason: FenceReason::Superseded };
            self.stats.superseded_batches += 1;
            self.note_fenced(f);
            dropped += 1;
        }
        dropped
    }

    fn note_fenced(&mut self, f: FencedPlan) {
        if self.fenced.len() < FENCED_CAPACITY {
            self.fenced.push_back(f);
        }
    }

    /// The oldest plan refused for its epoch not yet taken (for the log).
    pub fn pop_fenced(&mut self) -> Option<FencedPlan> {
        self.fenced.pop_front()
    }

    /// How long each device stays busy after `now` with the batches held
    /// (running or waiting to run): one entry per busy device, for the
    /// registration with a new scheduler. Each batch holds its device for
    /// its plan's duration from its start (planned, or actual once
    /// submitted); the batches of a device run one after another.
    pub fn busy_report(&self, now: Instant, out: &mut Vec<wire::GpuBusy>) {
        out.clear();
        for gpu in 0..self.exec.devices() {
            let mut free = now;
            let mut batches = 0;
            // Few batches per device: take them in start order by repeated
            // scans rather than sorting a copy.
            let mut after: Option<(Instant, usize)> = None;
            loop {
                let next = self
                    .slots
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.gpu == gpu && matches!(s.phase, Phase::Fetching | Phase::Ready | Phase::Executing))
                    .map(|(i, s)| (s.submitted.map_or(s.exec_at, |t| t.max(s.exec_at)), i))
                    .filter(|k| after.is_none_or(|a| *k > a))
                    .min();
                let Some((start, i)) = next else { break };
                after = Some((start, i));
                free = free.max(start) + self.slots[i].run;
                batches += 1;
            }
            if batches > 0 {
                out.push(wire::GpuBusy { busy_ns: free.saturating_since(now).as_nanos(), gpu_id: gpu, batches });
            }
        }
    }

    /// The connection to frontend `id`, to look at (e.g. its `wait_fd`).
    pub fn frontend_ref(&self, id: u32) -> Option<&C> {
        self.frontends.get(id as usize)?.as_ref()
    }

    /// The scheduler connection, to look at.
    pub fn scheduler_ref(&self) -> &C {
        &self.scheduler
    }

    /// The executor.
    pub fn executor(&self) -> &E {
        &self.exec
    }

    /// The executor, to change it between batches (e.g. a slowed device
    /// in the chaos harness).
    pub fn executor_mut(&mut self) -> &mut E {
        &mut self.exec
    }

    /// Counters.
    pub fn stats(&self) -> WorkerStats {
        self.stats
    }

    /// The configuration.
    pub fn config(&self) -> &WorkerConfig {
        &self.cfg
    }

    /// The oldest scheduler control message (not a plan) not yet taken.
    /// Callers should take them every pass: while
    /// [`CONTROL_QUEUE_CAPACITY`] are held, nothing more is read from the
    /// scheduler (plans included).
    pub fn pop_control(&mut self) -> Option<ControlMessage> {
        self.control.pop_front()
    }

    /// When a message (of any kind) last arrived from the scheduler, on the
    /// clock of the `now` given to [`poll`](Self::poll); `Instant::ZERO`
    /// before the first.
    pub fn scheduler_heard_at(&self) -> Instant {
        self.scheduler_heard
    }

    /// Whether new plans (and control messages) are read from the scheduler
    /// (true at construction). A worker that is shutting down sets false
    /// and polls until [`batches_in_flight`](Self::batches_in_flight) is 0:
    /// the batches in hand finish, later plans stay in the transport.
    pub fn set_taking_plans(&mut self, taking: bool) {
        self.taking_plans = taking;
    }

    /// Hands over a message of the worker's (a plan or an announcement)
    /// that arrived on the scheduler link before the registration ended;
    /// it is taken before anything still in the link. At most
    /// [`EARLY_CAPACITY`] are kept (registration only: the copy is off the
    /// hot path); beyond that the message is counted as ignored.
    pub fn push_early(&mut self, msg: &[u8]) {
        if self.early.len() < EARLY_CAPACITY && msg.len() <= self.msg_in.len() {
            self.early.push_back(msg.to_vec());
        } else {
            self.stats.ignored_messages += 1;
        }
    }

    /// Whether every batch buffer is held, so nothing is read from the
    /// scheduler until one frees (its silence then says nothing about its
    /// liveness).
    pub fn scheduler_backlogged(&self) -> bool {
        self.free_slots == 0 || self.control.len() >= CONTROL_QUEUE_CAPACITY
    }

    /// The oldest finished-batch report not yet taken.
    pub fn pop_report(&mut self) -> Option<BatchReport> {
        self.reports.pop_front()
    }

    /// Batches held (fetching, waiting, running, sending or draining).
    pub fn batches_in_flight(&self) -> usize {
        self.slots.len() - self.free_slots
    }

    /// Whether progress depends on I/O rather than on time: READs
    /// outstanding or to post, or messages waiting to be sent. A caller on
    /// a virtual clock keeps polling at the same `now` while this holds.
    pub fn io_pending(&self) -> bool {
        self.slots
            .iter()
            .any(|s| s.outstanding_reads > 0 || s.unposted > 0 || s.phase == Phase::Sending)
    }

    /// The next instant at which time alone makes progress: a device
    /// finishing, a batch's planned start, or a fetch deadline. `None`
    /// when only I/O can.
    pub fn next_wakeup(&self) -> Option<Instant> {
        let mut t = self.exec.next_wakeup();
        for s in &self.slots {
            let due = match s.phase {
                Phase::Fetching => Some(s.exec_at + self.cfg.fetch_grace),
                _ => None,
            };
            t = match (t, due) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        t
    }

    /// Does one round of work at `now`; returns whether anything happened.
    ///
    /// Errors are about the scheduler connection (gone, or a malformed
    /// message from it); they are returned after the round's other work
    /// (READs, execution, answers to frontends) is done, and the worker
    /// stays usable: batches in flight still finish on later polls.
    pub fn poll(&mut self, now: Instant) -> Result<bool, WorkerError> {
        let plans = self.take_plans(now);
        let mut progressed = *plans.as_ref().unwrap_or(&false);
        progressed |= self.post_pending_reads(now);
        progressed |= self.poll_frontends(now);
        progressed |= self.expire_fetches(now);
        progressed |= self.collect_finished(now);
        progressed |= self.submit_ready(now)?;
        progressed |= self.send_results(now);
        plans?;
        if let Err(e) = self.scheduler.progress() {
            if matches!(e, Error::PeerDisconnected) {
                return Err(WorkerError::SchedulerGone);
            }
            return Err(WorkerError::Transport(e));
        }
        Ok(progressed)
    }
}
