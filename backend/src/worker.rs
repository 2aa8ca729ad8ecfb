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
//!    arrived inputs to the executor with its `exec_at`;
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

use std::collections::VecDeque;

use dataplane::mem::LocalRef;
use dataplane::mutation::{self, Mutation};
use dataplane::time::{Duration, Instant};
use dataplane::transport::{Completion, Connection, Error, ReadOp, Registration};
use dataplane::wire::{self, BatchDone, CompletionHead, Message, OutputKind, TaskStatus};

use crate::exec::{ExecError, Executor, Finished, InputRef, Job, OutputRef};

/// Sizes and delays of a [`BatchWorker`].
#[derive(Clone, Copy, Debug)]
pub struct WorkerConfig {
    /// Largest batch (at most [`wire::MAX_BATCH_TASKS`]).
    pub max_batch: u32,
    /// Bytes of one input slot (longest input).
    pub input_slot: u32,
    /// Bytes of one output slot (longest model output, at most
    /// [`wire::MAX_INLINE_OUTPUT`]).
    pub output_slot: u32,
    /// Batch buffers: batches fetching, waiting, running or sending at
    /// once, over all devices (2-3 per device is plenty: one running, one
    /// fetching).
    pub batch_slots: u32,
    /// Largest frontend id + 1.
    pub max_frontends: u32,
    /// One-way control delay bound subtracted from a plan's `exec_in`.
    pub control_delay: Duration,
    /// How long after `exec_at` missing inputs are waited for before the
    /// batch runs without them.
    pub fetch_grace: Duration,
    /// Finished-batch reports kept for [`BatchWorker::pop_report`].
    pub report_capacity: u32,
    /// Start a batch as soon as its inputs are in and its device is idle,
    /// even before its planned `exec_at`. The plan fixed the batch's
    /// members, so starting early costs nothing and finishing early leaves
    /// slack for a late wake-up; the scheduler's plan for the device is
    /// unaffected (the device is free no later than it assumed).
    pub start_when_ready: bool,
}

impl WorkerConfig {
    /// Bytes of one batch buffer.
    pub fn batch_buffer_bytes(&self) -> u64 {
        u64::from(self.max_batch) * (u64::from(self.input_slot) + u64::from(self.output_slot))
    }
    /// Bytes the staging region needs.
    pub fn staging_bytes(&self) -> u64 {
        self.batch_buffer_bytes() * u64::from(self.batch_slots)
    }
    /// Where task `task`'s input of batch buffer `slot` lands: the input
    /// slots of a batch are contiguous (`input_slot` apart), which is what
    /// lets an executor read a whole batch in place.
    pub fn input_offset(&self, slot: usize, task: usize) -> u64 {
        slot as u64 * self.batch_buffer_bytes() + task as u64 * u64::from(self.input_slot)
    }
    /// Where output 0 of batch buffer `slot` goes (outputs `output_slot` apart).
    pub fn output_offset(&self, slot: usize) -> u64 {
        slot as u64 * self.batch_buffer_bytes()
            + u64::from(self.max_batch) * u64::from(self.input_slot)
    }
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            max_batch: 64,
            input_slot: 4096,
            output_slot: 1024,
            batch_slots: 8,
            max_frontends: 64,
            control_delay: Duration::ZERO,
            fetch_grace: Duration::from_millis(5),
            report_capacity: 1024,
            start_when_ready: false,
        }
    }
}

/// Worker failures.
#[derive(Debug)]
pub enum WorkerError {
    /// The configuration cannot work (why).
    Config(&'static str),
    /// The scheduler connection is gone.
    SchedulerGone,
    /// A transport call failed in a way that is not a task's failure.
    Transport(Error),
    /// The executor refused a batch that the worker checked (a bug).
    Executor(ExecError),
}

impl std::fmt::Display for WorkerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WorkerError::Config(w) => write!(f, "bad worker configuration: {w}"),
            WorkerError::SchedulerGone => write!(f, "scheduler connection lost"),
            WorkerError::Transport(e) => write!(f, "transport: {e}"),
            WorkerError::Executor(e) => write!(f, "executor: {e}"),
        }
    }
}

impl std::error::Error for WorkerError {}

/// Counters (monotone).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// Batch plans received.
    pub plans: u64,
    /// Batches the executor ran.
    pub batches_executed: u64,
    /// Tasks answered with an output.
    pub tasks_ok: u64,
    /// Tasks answered with an error status.
    pub tasks_failed: u64,
    /// READs posted.
    pub reads_posted: u64,
    /// READs that completed with an error or never got posted.
    pub reads_failed: u64,
    /// Error completions sent to the scheduler (frontend gone or unknown).
    pub rerouted_to_scheduler: u64,
    /// Completions that could not be sent anywhere.
    pub undeliverable: u64,
    /// Batches that started after their `exec_at`.
    pub late_starts: u64,
    /// Messages from peers that the worker does not handle.
    pub ignored_messages: u64,
    /// Control messages (Register, Heartbeat) queued for the caller.
    pub control_messages: u64,
    /// Reports dropped because nobody popped them.
    pub reports_dropped: u64,
    /// Plans ignored because their batch id was not above every earlier
    /// plan's (a duplicated or replayed plan: never executed twice).
    pub duplicate_plans: u64,
    /// Plans refused on arrival because their epoch was older than the
    /// newest seen (reason `stale_epoch`): never executed.
    pub stale_plans: u64,
    /// Batches held but not started when a newer epoch was seen, dropped
    /// unexecuted (reason `superseded`): the new leader plans their tasks
    /// again (frontends resubmit what they still await).
    pub superseded_batches: u64,
}

/// Why a plan was not executed because of its epoch (metric label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceReason {
    /// It arrived with an epoch older than the newest seen.
    StaleEpoch,
    /// It was held, not started, when a newer epoch was seen.
    Superseded,
}

impl FenceReason {
    /// Stable snake_case name: metric label.
    pub const fn as_str(self) -> &'static str {
        match self {
            FenceReason::StaleEpoch => "stale_epoch",
            FenceReason::Superseded => "superseded",
        }
    }
}

/// A plan refused for its epoch, for the host's log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FencedPlan {
    /// The batch.
    pub batch_id: u64,
    /// Its epoch.
    pub epoch: u32,
    /// The newest epoch seen when it was refused.
    pub newest: u32,
    /// Why.
    pub reason: FenceReason,
}

/// Refusals kept for [`BatchWorker::pop_fenced`] (older ones are only
/// counted).
const FENCED_CAPACITY: usize = 64;

/// A scheduler message that is not a plan, handed to the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControlMessage {
    /// A registration, e.g. `Register{Frontend, fid, 0, endpoint}`: a
    /// frontend the backend should open a data connection to.
    Register(wire::Register),
    /// The scheduler's heartbeat.
    Heartbeat(wire::Heartbeat),
}

/// One finished batch, for observers and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchReport {
    /// Scheduler's batch id.
    pub batch_id: u64,
    /// Device.
    pub gpu: u32,
    /// Model.
    pub model: u32,
    /// When the plan arrived.
    pub received: Instant,
    /// Planned start on this process's clock.
    pub exec_at: Instant,
    /// When its inputs were in place and it was handed to its device
    /// (`None`: nothing ran).
    pub submitted: Option<Instant>,
    /// Actual start (`None`: nothing ran, every input failed).
    pub start: Option<Instant>,
    /// Actual finish.
    pub finish: Option<Instant>,
    /// Tasks answered with an output.
    pub ok: u32,
    /// Tasks answered with an error.
    pub failed: u32,
    /// The slowest successful input READ, post to completion.
    pub read_max: Duration,
    /// The planning scheduler's election epoch.
    pub epoch: u32,
}

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
}

/// The batch ids a worker has taken: the highest, and which of the
/// [`SeenBatches::SPAN`] ids below it. The scheduler numbers batches in
/// increasing order (with gaps: the ids are shared by every backend), so
/// an id already marked is a duplicate and an unmarked lower one is a plan
/// that was overtaken. An id more than `SPAN` below the highest is too old
/// to tell and is taken as a duplicate (a plan that late could not run in
/// time anyway). Fixed size: no allocation per plan.
#[derive(Debug, Default)]
struct SeenBatches {
    high: Option<u64>,
    bits: [u64; (SeenBatches::SPAN / 64) as usize],
}

impl SeenBatches {
    const SPAN: u64 = 1024;

    fn bit(id: u64) -> (usize, u64) {
        let i = id % Self::SPAN;
        ((i / 64) as usize, 1 << (i % 64))
    }

    /// Marks `id`; returns false if it was already taken (or is too old).
    fn insert(&mut self, id: u64) -> bool {
        let high = match self.high {
            None => id,
            Some(h) if id > h => {
                if id - h >= Self::SPAN {
                    self.bits = [0; (Self::SPAN / 64) as usize];
                } else {
                    for x in h + 1..id {
                        let (w, m) = Self::bit(x);
                        self.bits[w] &= !m;
                    }
                    let (w, m) = Self::bit(id);
                    self.bits[w] &= !m;
                }
                id
            }
            Some(h) if h - id >= Self::SPAN => return false,
            Some(h) => h,
        };
        self.high = Some(high);
        let (w, m) = Self::bit(id);
        if self.bits[w] & m != 0 {
            return false;
        }
        self.bits[w] |= m;
        true
    }
}

/// Messages taken from the scheduler per poll (bounds one poll's work).
const PLANS_PER_POLL: usize = 8;
/// Messages drained from each frontend per poll.
const FRONTEND_MSGS_PER_POLL: usize = 8;
/// Control messages held for the caller before the worker stops reading
/// from the scheduler.
pub const CONTROL_QUEUE_CAPACITY: usize = 64;
/// Messages of the worker's that the registration keeps when they arrive
/// before the Welcome ([`BatchWorker::push_early`]).
pub const EARLY_CAPACITY: usize = 256;

fn wr_id(slot: usize, generation: u32, task: usize) -> u64 {
    (u64::from(generation) << 40) | ((slot as u64 & 0xffff) << 24) | (task as u64 & 0xff_ffff)
}

fn split_wr_id(id: u64) -> (usize, u32, usize) {
    (
        ((id >> 24) & 0xffff) as usize,
        (id >> 40) as u32,
        (id & 0xff_ffff) as usize,
    )
}

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
            cfg,
        })
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

    // ---- 1. plans ---------------------------------------------------------

    fn take_plans(&mut self, now: Instant) -> Result<bool, WorkerError> {
        let mut any = false;
        if !self.taking_plans {
            return Ok(false);
        }
        for _ in 0..PLANS_PER_POLL {
            if self.free_slots == 0 || self.control.len() >= CONTROL_QUEUE_CAPACITY {
                break;
            }
            let n = if let Some(msg) = self.early.pop_front() {
                self.msg_in[..msg.len()].copy_from_slice(&msg);
                msg.len()
            } else {
                match self.scheduler.try_recv(&mut self.msg_in) {
                    Ok(Some(n)) => n,
                    Ok(None) => break,
                    Err(Error::PeerDisconnected) => return Err(WorkerError::SchedulerGone),
                    Err(e) => return Err(WorkerError::Transport(e)),
                }
            };
            any = true;
            self.scheduler_heard = now;
            let (head, tasks) = match wire::decode(&self.msg_in[..n]) {
                Ok(Message::BatchPlan(h, t)) => (h, t),
                Ok(Message::Register(r)) => {
                    self.control.push_back(ControlMessage::Register(r));
                    self.stats.control_messages += 1;
                    continue;
                }
                Ok(Message::Heartbeat(h)) => {
                    self.control.push_back(ControlMessage::Heartbeat(h));
                    self.stats.control_messages += 1;
                    continue;
                }
                Ok(_) => {
                    self.stats.ignored_messages += 1;
                    continue;
                }
                Err(e) => return Err(WorkerError::Transport(Error::Protocol(e))),
            };
            if head.epoch < self.epoch {
                self.stats.stale_plans += 1;
                let f = FencedPlan { batch_id: head.batch_id, epoch: head.epoch, newest: self.epoch, reason: FenceReason::StaleEpoch };
                self.note_fenced(f);
                continue;
            }
            if !self.seen_batches.insert(head.batch_id) {
                self.stats.duplicate_plans += 1;
                continue;
            }
            self.stats.plans += 1;
            let Some(si) = self.slots.iter().position(|s| s.phase == Phase::Free) else {
                break;
            };
            self.free_slots -= 1;
            let plan_ok = head.gpu_id < self.exec.devices()
                && self
                    .exec
                    .output_len(head.model_id)
                    .is_some_and(|l| l <= self.cfg.output_slot)
                && tasks.len() <= self.cfg.max_batch as usize;
            let s = &mut self.slots[si];
            s.generation = s.generation.wrapping_add(1) & 0xff_ffff;
            s.phase = Phase::Fetching;
            s.batch_id = head.batch_id;
            s.link = self.scheduler_link;
            s.epoch = head.epoch;
            s.run = Duration::from_nanos(head.run_ns);
            s.model = head.model_id;
            s.gpu = head.gpu_id;
            s.received = now;
            s.exec_at = (now + Duration::from_nanos(head.exec_in_ns)) - self.cfg.control_delay;
            s.tasks.clear();
            s.unresolved = 0;
            s.unposted = 0;
            s.outstanding_reads = 0;
            s.submitted = None;
            s.ran = 0;
            s.start = None;
            s.finish = None;
            s.exec_ok = false;
            s.read_max = Duration::ZERO;
            s.reads_ok = 0;
            s.send_cursor = 0;
            // An over-long plan keeps its first max_batch entries as tasks
            // so that each gets a failure completion; the rest are dropped
            // (counted) since there is no room to hold them.
            let cap = self.cfg.max_batch as usize;
            for t in tasks.iter().take(cap) {
                let fits = t.input.len <= self.cfg.input_slot;
                let phase = if plan_ok && fits {
                    s.unresolved += 1;
                    s.unposted += 1;
                    TaskPhase::Unposted
                } else {
                    TaskPhase::Failed(TaskStatus::ExecFailed)
                };
                s.tasks.push(TaskState {
                    task_id: t.task_id,
                    frontend: t.frontend_id,
                    input: t.input,
                    phase,
                    out_index: 0,
                    queued_us: t.queued_us,
                    posted_at: now,
                });
            }
            if tasks.len() > cap {
                self.stats.undeliverable += (tasks.len() - cap) as u64;
            }
            if s.unresolved == 0 {
                s.phase = Phase::Ready;
            }
            // A newer epoch fences the older ones' batches held (this one
            // is of the newer epoch itself).
            self.see_epoch(head.epoch);
        }
        Ok(any)
    }

    // ---- 2. READs ---------------------------------------------------------

    fn post_pending_reads(&mut self, now: Instant) -> bool {
        let mut any = false;
        for si in 0..self.slots.len() {
            if self.slots[si].phase != Phase::Fetching || self.slots[si].unposted == 0 {
                continue;
            }
            // One post_reads per frontend: group the unposted tasks by
            // frontend, first come first served.
            let mut from = 0;
            while from < self.slots[si].tasks.len() {
                let Some(first) = self.slots[si].tasks[from..]
                    .iter()
                    .position(|t| t.phase == TaskPhase::Unposted)
                else {
                    break;
                };
                let first = from + first;
                let fe = self.slots[si].tasks[first].frontend;
                any |= self.post_for_frontend(si, fe, first, now);
                from = first + 1;
            }
        }
        any
    }

    /// Posts the unposted READs of slot `si` from frontend `fe` (tasks at or
    /// after `first`). Returns whether anything changed.
    fn post_for_frontend(&mut self, si: usize, fe: u32, first: usize, now: Instant) -> bool {
        let cfg = self.cfg;
        let key = self.staging.key();
        let base = self.staging.addr_base();
        self.ops.clear();
        self.op_tasks.clear();
        let s = &self.slots[si];
        for (ti, t) in s.tasks.iter().enumerate().skip(first) {
            if t.frontend != fe || t.phase != TaskPhase::Unposted {
                continue;
            }
            self.ops.push(ReadOp {
                wr_id: wr_id(si, s.generation, ti),
                remote: t.input,
                local: LocalRef {
                    key,
                    len: cfg.input_slot,
                    offset: base + cfg.input_offset(si, ti),
                },
            });
            self.op_tasks.push(ti as u32);
        }
        let conn = self
            .frontends
            .get_mut(fe as usize)
            .and_then(|c| c.as_mut())
            .filter(|c| c.is_connected());
        let Some(conn) = conn else {
            // Unknown or departed frontend: its tasks fail now.
            for k in 0..self.op_tasks.len() {
                let ti = self.op_tasks[k] as usize;
                fail_task(&mut self.slots[si], ti, &mut self.stats);
            }
            finish_fetch_if_resolved(&mut self.slots[si]);
            return true;
        };
        let mut done = 0;
        let mut changed = false;
        while done < self.ops.len() {
            match conn.post_reads(&self.ops[done..]) {
                Ok(n) => {
                    for k in done..done + n {
                        let ti = self.op_tasks[k] as usize;
                        let s = &mut self.slots[si];
                        s.tasks[ti].phase = TaskPhase::Posted;
                        s.tasks[ti].posted_at = now;
                        s.unposted -= 1;
                        s.outstanding_reads += 1;
                    }
                    self.stats.reads_posted += n as u64;
                    changed |= n > 0;
                    done += n;
                    if n == 0 {
                        break;
                    }
                }
                Err(Error::QueueFull) => break,
                Err(Error::PeerDisconnected) => {
                    for k in done..self.ops.len() {
                        let ti = self.op_tasks[k] as usize;
                        fail_task(&mut self.slots[si], ti, &mut self.stats);
                    }
                    changed = true;
                    break;
                }
                Err(_) => {
                    // This READ alone is refused (too long, bad local ref).
                    let ti = self.op_tasks[done] as usize;
                    fail_task(&mut self.slots[si], ti, &mut self.stats);
                    done += 1;
                    changed = true;
                }
            }
        }
        finish_fetch_if_resolved(&mut self.slots[si]);
        changed
    }

    // ---- 3. READ completions ---------------------------------------------

    fn poll_frontends(&mut self, now: Instant) -> bool {
        let mut any = false;
        for k in 0..self.active_frontends.len() {
            let fi = self.active_frontends[k] as usize;
            let Some(conn) = self.frontends[fi].as_mut() else {
                continue;
            };
            // Drains (and ignores) anything the frontend sends us, so its
            // queue cannot grow; errors surface through READs and sends.
            for _ in 0..FRONTEND_MSGS_PER_POLL {
                match conn.try_recv(&mut self.msg_in) {
                    Ok(Some(_)) => self.stats.ignored_messages += 1,
                    _ => break,
                }
            }
            if conn.outstanding_reads() == 0 {
                let _ = conn.progress();
                continue;
            }
            loop {
                let n = conn.poll_completions(&mut self.completions).unwrap_or(0);
                for k in 0..n {
                    let c = self.completions[k];
                    handle_read_completion(
                        &mut self.slots,
                        &mut self.free_slots,
                        &mut self.stats,
                        c,
                        now,
                    );
                }
                any |= n > 0;
                if n < self.completions.len() {
                    break;
                }
            }
        }
        any
    }

    // ---- 4. fetch deadlines ----------------------------------------------

    fn expire_fetches(&mut self, now: Instant) -> bool {
        let mut any = false;
        for s in self.slots.iter_mut() {
            if s.phase != Phase::Fetching || now < s.exec_at + self.cfg.fetch_grace {
                continue;
            }
            for ti in 0..s.tasks.len() {
                if matches!(s.tasks[ti].phase, TaskPhase::Unposted | TaskPhase::Posted) {
                    fail_task(s, ti, &mut self.stats);
                }
            }
            finish_fetch_if_resolved(s);
            any = true;
        }
        any
    }

    // ---- 5. executor -----------------------------------------------------

    fn collect_finished(&mut self, now: Instant) -> bool {
        let mut any = false;
        loop {
            let n = self.exec.poll(now, &mut self.finished);
            for k in 0..n {
                let f = self.finished[k];
                let si = (f.tag & 0xffff) as usize;
                let generation = (f.tag >> 32) as u32;
                let Some(s) = self.slots.get_mut(si) else {
                    continue;
                };
                if s.generation != generation || s.phase != Phase::Executing {
                    continue;
                }
                s.start = Some(f.start);
                s.finish = Some(f.finish);
                s.exec_ok = f.ok;
                if f.start > s.exec_at {
                    self.stats.late_starts += 1;
                }
                self.stats.batches_executed += 1;
                s.phase = Phase::Sending;
            }
            any |= n > 0;
            if n < self.finished.len() {
                break;
            }
        }
        any
    }

    fn submit_ready(&mut self, now: Instant) -> Result<bool, WorkerError> {
        let mut any = false;
        loop {
            // Per device, the ready batch with the earliest exec_at.
            let mut pick: Option<usize> = None;
            for (i, s) in self.slots.iter().enumerate() {
                if s.phase != Phase::Ready {
                    continue;
                }
                let arrived = s.tasks.iter().any(|t| t.phase == TaskPhase::Arrived);
                if arrived && !self.exec.is_idle(s.gpu) {
                    continue;
                }
                if pick.is_none_or(|p| s.exec_at < self.slots[p].exec_at) {
                    pick = Some(i);
                }
            }
            let Some(si) = pick else {
                return Ok(any);
            };
            any = true;
            let cfg = self.cfg;
            let s = &mut self.slots[si];
            self.inputs.clear();
            for (ti, t) in s.tasks.iter_mut().enumerate() {
                if t.phase == TaskPhase::Arrived {
                    t.out_index = self.inputs.len() as u32;
                    self.inputs.push(InputRef {
                        offset: cfg.input_offset(si, ti),
                        len: t.input.len,
                    });
                }
            }
            if self.inputs.is_empty() {
                // Nothing to run: every task failed; answer them.
                s.phase = Phase::Sending;
                continue;
            }
            let job = Job {
                tag: (u64::from(s.generation) << 32) | si as u64,
                device: s.gpu,
                model: s.model,
                exec_at: if cfg.start_when_ready {
                    now.min(s.exec_at)
                } else {
                    s.exec_at
                },
                inputs: &self.inputs,
                output: OutputRef {
                    offset: cfg.output_offset(si),
                    stride: cfg.output_slot,
                },
            };
            match self.exec.submit(now, &job) {
                Ok(()) => {
                    s.phase = Phase::Executing;
                    s.submitted = Some(now);
                    s.ran = self.inputs.len() as u32;
                }
                Err(e) => return Err(WorkerError::Executor(e)),
            }
        }
    }

    // ---- 6. results ------------------------------------------------------

    fn send_results(&mut self, now: Instant) -> bool {
        let mut any = false;
        for si in 0..self.slots.len() {
            if self.slots[si].phase != Phase::Sending {
                continue;
            }
            while self.slots[si].send_cursor < self.slots[si].tasks.len() {
                let ti = self.slots[si].send_cursor;
                if !self.send_completion(si, ti, now) {
                    break;
                }
                self.slots[si].send_cursor += 1;
                any = true;
            }
            if self.slots[si].send_cursor < self.slots[si].tasks.len() {
                continue;
            }
            let s = &self.slots[si];
            let executed = s
                .tasks
                .iter()
                .filter(|t| t.phase == TaskPhase::Arrived)
                .count();
            // Relative to the send (no shared clock); a batch that never
            // ran reports 0 and 0.
            let (start_ago, finish_ago) = match (s.start, s.finish) {
                (Some(a), Some(b)) => (now.saturating_since(a), now.saturating_since(b.max(a))),
                _ => (Duration::ZERO, Duration::ZERO),
            };
            let done = BatchDone {
                batch_id: s.batch_id,
                start_ago_ns: start_ago.as_nanos(),
                finish_ago_ns: finish_ago.as_nanos(),
                read_max_ns: s.read_max.as_nanos(),
                gpu_id: s.gpu,
                count: executed as u32,
                reads: s.reads_ok,
                reserved: 0,
            };
            if s.link != self.scheduler_link {
                // Planned by a scheduler that is gone: its results went to
                // the frontends; the new one never planned this batch.
                self.finish_batch(si);
                any = true;
                continue;
            }
            let Ok(n) = wire::encode(&mut self.msg_out, &done) else {
                continue;
            };
            match self.scheduler.send(&self.msg_out[..n]) {
                Ok(()) => {}
                Err(Error::QueueFull) => continue,
                // A dead scheduler is reported by the next poll's progress.
                Err(_) => self.stats.undeliverable += 1,
            }
            any = true;
            self.finish_batch(si);
        }
        any
    }

    /// Sends task `ti`'s completion (at `now`); false if it must be
    /// retried later.
    fn send_completion(&mut self, si: usize, ti: usize, now: Instant) -> bool {
        let s = &self.slots[si];
        let t = s.tasks[ti];
        let out_len = self.exec.output_len(s.model).unwrap_or(0) as usize;
        let (status, inline_len) = match t.phase {
            TaskPhase::Arrived if s.exec_ok => (TaskStatus::Ok, out_len),
            TaskPhase::Arrived => (TaskStatus::ExecFailed, 0),
            TaskPhase::Failed(st) => (st, 0),
            // Unreachable by construction: a batch is sent only when every
            // task is resolved.
            TaskPhase::Unposted | TaskPhase::Posted => (TaskStatus::ExecFailed, 0),
        };
        let mut head = CompletionHead {
            task_id: t.task_id,
            status: status as u32,
            output_kind: OutputKind::None as u32,
            queued_us: t.queued_us,
            ..CompletionHead::default()
        };
        if let (TaskPhase::Arrived, true, Some(submitted), Some(start), Some(finish)) =
            (t.phase, s.exec_ok, s.submitted, s.start, s.finish)
        {
            // The execution this task was part of, for the frontend's
            // accounting (position 0 is the execution's leader).
            head.batch_size = s.ran;
            head.batch_index = t.out_index;
            head.input_ns = submitted.saturating_since(s.received).as_nanos();
            head.compute_ns = finish.saturating_since(start).as_nanos();
            head.since_start_ns = now.saturating_since(start).as_nanos();
        }
        if status == TaskStatus::Ok {
            head.output_kind = OutputKind::Inline as u32;
            let at = self.cfg.output_offset(si)
                + u64::from(t.out_index) * u64::from(self.cfg.output_slot);
            let buf = &mut self.out_bytes[..inline_len];
            if self.staging.region().read_at(at, buf).is_err() {
                head.output_kind = OutputKind::None as u32;
                head.status = TaskStatus::ExecFailed as u32;
            }
        }
        let inline = if head.output_kind == OutputKind::Inline as u32 {
            &self.out_bytes[..inline_len]
        } else {
            &[][..]
        };
        let Ok(n) = wire::encode_completion(&mut self.msg_out, &head, inline) else {
            self.stats.undeliverable += 1;
            return true;
        };
        let ok = head.status == TaskStatus::Ok as u32;
        // Mutation testing only (compiled out without the `mutations`
        // feature): count the task as answered without sending anything.
        if mutation::fires(Mutation::BackendOmitsCompletion) {
            self.stats.tasks_ok += 1;
            return true;
        }
        let to_frontend = self
            .frontends
            .get_mut(t.frontend as usize)
            .and_then(|c| c.as_mut())
            .filter(|c| c.is_connected());
        let sent = match to_frontend {
            Some(conn) => match conn.send(&self.msg_out[..n]) {
                Ok(()) => Ok(()),
                Err(Error::QueueFull) => return false,
                Err(e) => Err(e),
            },
            None => Err(Error::PeerDisconnected),
        };
        if sent.is_err() {
            // The frontend is gone: tell the scheduler so the task's outcome
            // is still recorded somewhere.
            match self.scheduler.send(&self.msg_out[..n]) {
                Ok(()) => self.stats.rerouted_to_scheduler += 1,
                Err(Error::QueueFull) => return false,
                Err(_) => self.stats.undeliverable += 1,
            }
        }
        if ok && sent.is_ok() {
            self.stats.tasks_ok += 1;
        } else {
            self.stats.tasks_failed += 1;
        }
        true
    }

    fn finish_batch(&mut self, si: usize) {
        let s = &mut self.slots[si];
        let ok = s
            .tasks
            .iter()
            .filter(|t| t.phase == TaskPhase::Arrived && s.exec_ok)
            .count() as u32;
        let report = BatchReport {
            batch_id: s.batch_id,
            gpu: s.gpu,
            model: s.model,
            received: s.received,
            exec_at: s.exec_at,
            submitted: s.submitted,
            start: s.start,
            finish: s.finish,
            ok,
            failed: s.tasks.len() as u32 - ok,
            read_max: s.read_max,
            epoch: s.epoch,
        };
        if s.outstanding_reads == 0 {
            s.phase = Phase::Free;
            self.free_slots += 1;
        } else {
            s.phase = Phase::Draining;
        }
        if self.reports.len() >= self.cfg.report_capacity as usize {
            self.reports.pop_front();
            self.stats.reports_dropped += 1;
        }
        if self.cfg.report_capacity > 0 {
            self.reports.push_back(report);
        }
    }
}

fn fail_task(s: &mut BatchSlot, ti: usize, stats: &mut WorkerStats) {
    let t = &mut s.tasks[ti];
    match t.phase {
        TaskPhase::Unposted => {
            s.unposted -= 1;
            s.unresolved -= 1;
        }
        TaskPhase::Posted => s.unresolved -= 1,
        _ => return,
    }
    t.phase = TaskPhase::Failed(TaskStatus::InputUnavailable);
    stats.reads_failed += 1;
}

fn finish_fetch_if_resolved(s: &mut BatchSlot) {
    if s.phase == Phase::Fetching && s.unresolved == 0 {
        s.phase = Phase::Ready;
    }
}

fn handle_read_completion(
    slots: &mut [BatchSlot],
    free_slots: &mut usize,
    stats: &mut WorkerStats,
    c: Completion,
    now: Instant,
) {
    let (si, generation, ti) = split_wr_id(c.wr_id);
    let Some(s) = slots.get_mut(si) else {
        return;
    };
    if s.generation != generation || ti >= s.tasks.len() || s.outstanding_reads == 0 {
        return;
    }
    s.outstanding_reads -= 1;
    if s.tasks[ti].phase == TaskPhase::Posted {
        if c.status.is_ok() && c.bytes == s.tasks[ti].input.len {
            s.tasks[ti].phase = TaskPhase::Arrived;
            s.unresolved -= 1;
            s.read_max = s.read_max.max(now.saturating_since(s.tasks[ti].posted_at));
            s.reads_ok += 1;
        } else {
            fail_task(s, ti, stats);
        }
        finish_fetch_if_resolved(s);
    }
    if s.phase == Phase::Draining && s.outstanding_reads == 0 {
        s.phase = Phase::Free;
        *free_slots += 1;
    }
}

#[cfg(test)]
mod seen_tests {
    use super::SeenBatches;

    #[test]
    fn seen_batches_take_each_id_once_and_accept_overtaken_ones() {
        let mut s = SeenBatches::default();
        assert!(s.insert(10));
        assert!(!s.insert(10), "duplicate");
        assert!(s.insert(14));
        assert!(s.insert(12), "overtaken by 14, still new");
        assert!(!s.insert(12));
        assert!(s.insert(10 + SeenBatches::SPAN + 5), "far ahead clears the window");
        assert!(!s.insert(14), "too old to tell: taken as a duplicate");
        assert!(s.insert(10 + SeenBatches::SPAN + 4));
        // The slot of an old id is reused by a new one in the window.
        let mut t = SeenBatches::default();
        assert!(t.insert(0));
        assert!(t.insert(SeenBatches::SPAN - 1));
        assert!(t.insert(SeenBatches::SPAN));
        assert!(!t.insert(SeenBatches::SPAN));
    }
}
