//! Input staging and completion routing.
//!
//! Every request in flight owns one fixed-size slot of a registered region
//! (its input, READ by a backend) and the pending cell with the same index
//! (where its outcome lands). The task id names both: frontend id, a
//! per-slot sequence number and the slot index ([`TaskId`]), so routing a completion is
//! one array index and a compare-and-swap, and a stale or duplicated
//! completion (older sequence, or a cell that already has its outcome) is
//! recognised and counted instead of being delivered to the wrong request.
//!
//! Once warm nothing here allocates or locks: free slots sit in a lock-free
//! bounded queue, outcomes are written into buffers preallocated per cell,
//! and the waiting request is woken through an [`AtomicWaker`].
//!
//! Cell life cycle (`state = seq << 3 | phase`):
//! `FREE -> WAITING` (staged) `-> WRITING -> DONE` (outcome written, the
//! ticket reads it and frees the slot). A ticket dropped before its outcome
//! (client gone) moves `WAITING -> ORPHANED`; the outcome, when it comes,
//! is counted and frees the slot. A ticket that gives up waiting moves
//! `WAITING -> EXPIRED` and counts a failure; a late outcome only frees the
//! slot. The slot is never reused while a backend may still READ it.
//!
//! A released slot's staged bytes are zeroed before it goes back on the
//! free list (issue 55): a READ of it afterwards, with a key obtained for
//! an earlier request, finds no earlier request's input.
//!
//! With a join token ([`Staging::require_capabilities`]) an outcome ends a
//! request only if the scheduler's capability for it verifies (issue 55):
//! a completion from a backend must name that backend and carry the
//! capability the scheduler signed for (that backend, this frontend, the
//! task, its input); a backend never sends a `Dropped`. From the scheduler's
//! link, unsigned failures are the scheduler's own answers; anything signed
//! (a completion it forwards for a backend) is checked alike. A refused
//! message changes nothing (the request still waits for the real answer)
//! and is counted ([`Counters::refused`]).

use crate::types::Execution;
use atomic_waker::AtomicWaker;
use crossbeam_queue::ArrayQueue;
use dataplane::capability::{CapabilityKey, Grant, CAPABILITY_LEN};
use dataplane::ids::{MAX_FRONTENDS, SEQ_MASK};
use dataplane::mutation::{self, Mutation};
use dataplane::mem::{MemError, Slot, SlotPool};
use dataplane::time::Duration;
use dataplane::transport::Registration;
use dataplane::wire::{self, CompletionHead, DropReason, Message, OutputKind, RemoteRef, Task, TaskId, TaskStatus};
use std::cell::UnsafeCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

const FREE: u64 = 0;
const WAITING: u64 = 1;
const WRITING: u64 = 2;
const DONE: u64 = 3;
const ORPHANED: u64 = 4;
const EXPIRED: u64 = 5;
/// The client cancelled: counted as cancelled at once; the slot stays in
/// use until the cluster's own outcome arrives (a backend may still READ
/// it), which is then discarded.
const CANCELLED: u64 = 6;
const PHASE_MASK: u64 = 7;

/// Most slots a [`Staging`] can have (the slot index is a task-id field).
pub use dataplane::ids::MAX_SLOTS;

/// Where a request stands ([`Staging::standing`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Its client waits for the outcome.
    Awaited,
    /// Its client is gone or cancelled; the slot waits for any outcome.
    GivenUp,
    /// Finished, or not a request of this staging area.
    Gone,
}

/// Sizes of a [`Staging`].
#[derive(Clone, Copy, Debug)]
pub struct StagingConfig {
    /// This frontend's id (below [`MAX_FRONTENDS`]; the frontend field of
    /// every task id).
    pub frontend_id: u16,
    /// Slots, i.e. the most requests in flight at once.
    pub slots: u32,
    /// Bytes per slot (at least the largest model input).
    pub slot_size: u32,
    /// Largest output accepted in a completion, bytes.
    pub max_output: u32,
}

/// Global outcome counters. Once quiet,
/// `accepted = succeeded + dropped + failed + cancelled`.
#[derive(Debug, Default)]
pub struct Counters {
    /// Requests staged and handed to the cluster.
    pub accepted: AtomicU64,
    /// Requests answered with a result.
    pub succeeded: AtomicU64,
    /// Requests dropped by the cluster (deadline, overload, ...).
    pub dropped: AtomicU64,
    /// Requests that ended in an error (backend failure, send failure,
    /// no outcome within the deadline plus grace).
    pub failed: AtomicU64,
    /// Requests their client cancelled before an outcome arrived.
    pub cancelled: AtomicU64,
    /// Requests refused before staging because every slot was in use.
    pub rejected_full: AtomicU64,
    /// Completions naming no request in flight (stale sequence, foreign
    /// frontend id, bad index).
    pub unroutable: AtomicU64,
    /// Second outcomes for a request that already had one.
    pub duplicates: AtomicU64,
    /// Outcomes that arrived after their request had given up waiting.
    pub late: AtomicU64,
    /// Outcomes refused because their capability did not verify for their
    /// sender (forged, or for a task planned to another backend), and
    /// `Dropped`s from backends; the request still waits.
    pub refused: AtomicU64,
}

/// A snapshot of [`Counters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CounterSnapshot {
    /// See [`Counters::accepted`].
    pub accepted: u64,
    /// See [`Counters::succeeded`].
    pub succeeded: u64,
    /// See [`Counters::dropped`].
    pub dropped: u64,
    /// See [`Counters::failed`].
    pub failed: u64,
    /// See [`Counters::cancelled`].
    pub cancelled: u64,
    /// See [`Counters::rejected_full`].
    pub rejected_full: u64,
    /// See [`Counters::unroutable`].
    pub unroutable: u64,
    /// See [`Counters::duplicates`].
    pub duplicates: u64,
    /// See [`Counters::late`].
    pub late: u64,
    /// See [`Counters::refused`].
    pub refused: u64,
}

impl CounterSnapshot {
    /// Whether every accepted request has exactly one terminal outcome.
    pub fn balanced(&self) -> bool {
        self.accepted == self.succeeded + self.dropped + self.failed + self.cancelled
    }
}

impl Counters {
    /// Reads every counter.
    pub fn snapshot(&self) -> CounterSnapshot {
        let l = |a: &AtomicU64| a.load(Ordering::SeqCst);
        CounterSnapshot {
            accepted: l(&self.accepted),
            succeeded: l(&self.succeeded),
            dropped: l(&self.dropped),
            failed: l(&self.failed),
            cancelled: l(&self.cancelled),
            rejected_full: l(&self.rejected_full),
            unroutable: l(&self.unroutable),
            duplicates: l(&self.duplicates),
            late: l(&self.late),
            refused: l(&self.refused),
        }
    }
}

/// Per-request scheduling parameters (Triton's `priority` and `timeout`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestOptions {
    /// Priority level, 1 = highest; 0 = the model's default.
    pub priority: u32,
    /// The request's own timeout. When shorter than the budget it becomes
    /// the budget, and the task is flagged so that running out of it is
    /// answered as [`DropReason::Timeout`].
    pub timeout: Option<Duration>,
}

/// The terminal outcome of one request, as the cluster reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoutedOutcome<'a> {
    /// Ran; the output bytes.
    Ok(&'a [u8]),
    /// Dropped by the scheduler.
    Dropped(DropReason),
    /// Failed at the backend.
    Failed(TaskStatus),
}

/// The outcome a waiting request receives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The output bytes.
    Ok(Vec<u8>),
    /// Dropped, with the reason.
    Dropped(DropReason),
    /// Failed at the backend.
    Failed(TaskStatus),
    /// No outcome arrived within the deadline plus grace.
    TimedOut,
}

/// What [`Staging::route`] did with an outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteResult {
    /// Delivered to the waiting request.
    Delivered,
    /// The request's client had gone; counted and the slot freed.
    Orphaned,
    /// The request had given up; the slot is freed.
    Late,
    /// No such request in flight.
    Unroutable,
    /// The request already had its outcome.
    Duplicate,
    /// The message's capability did not verify for its sender: not
    /// delivered (the request still waits), counted.
    Refused,
}

/// Who handed over a message to route ([`Staging::route_message_from`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sender {
    /// The scheduler's link: its own answers and completions it forwards.
    Scheduler,
    /// The data link of this backend (it proved its id when it joined).
    Backend(u32),
}

/// Why a request could not be staged.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    /// Every slot is in use.
    #[error("every staging slot is in use")]
    Full,
    /// The input is larger than a slot.
    #[error("input larger than a staging slot")]
    TooLarge,
    /// The input could not be written into its slot.
    #[error("staging memory: {0}")]
    Memory(#[source] MemError),
    /// The registration refused the slot's remote reference.
    #[error("staging memory: {0}")]
    Reference(#[source] dataplane::transport::Error),
}

struct CellOut {
    /// 0 ok, 1 dropped, 2 failed.
    kind: u32,
    code: u32,
    len: usize,
    bytes: Box<[u8]>,
    /// The execution the task was part of, as its backend reported it.
    exec: Option<Execution>,
}

struct Cell {
    state: AtomicU64,
    waker: AtomicWaker,
    out: UnsafeCell<CellOut>,
}

/// Staging slots and the pending cells that route outcomes back.
pub struct Staging {
    reg: Registration,
    cells: Box<[Cell]>,
    offsets: Box<[u64]>,
    /// Bytes staged in each slot (zeroed when it is released).
    staged: Box<[AtomicU32]>,
    free: ArrayQueue<u32>,
    slot_size: u32,
    max_output: usize,
    frontend_id: u16,
    counters: Counters,
    /// Set: outcomes must carry a verifying capability (see the module docs).
    capabilities: OnceLock<CapabilityKey>,
    // Owns the slots for the life of the staging area.
    _slots: Vec<Slot>,
    _pool: SlotPool,
}

// SAFETY: `CellOut` is only touched by the one party the cell's phase
// designates (the router in WRITING, the ticket in DONE, or whoever moved
// it to FREE), and phase changes are acquire/release atomics.
unsafe impl Sync for Staging {}

impl std::fmt::Debug for Staging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Staging")
            .field("slots", &self.cells.len())
            .field("free", &self.free.len())
            .field("slot_size", &self.slot_size)
            .finish()
    }
}

impl Staging {
    /// Carves `cfg.slots` slots of `cfg.slot_size` bytes from the start of
    /// the registered region (registered with REMOTE_READ by the daemon's
    /// transport domain) and preallocates every pending cell.
    pub fn new(reg: Registration, cfg: StagingConfig) -> Result<Arc<Staging>, MemError> {
        if cfg.slots == 0 || cfg.slots > MAX_SLOTS {
            return Err(MemError::Unsupported("staging slots must be 1..=2^20"));
        }
        if u32::from(cfg.frontend_id) >= MAX_FRONTENDS {
            return Err(MemError::Unsupported(
                "frontend ids must be below MAX_FRONTENDS",
            ));
        }
        let mut pool = SlotPool::new(reg.region().clone(), 0, cfg.slot_size, cfg.slots)?;
        let free = ArrayQueue::new(cfg.slots as usize);
        let mut slots = Vec::with_capacity(cfg.slots as usize);
        let mut offsets = vec![0u64; cfg.slots as usize];
        while let Some(s) = pool.alloc() {
            offsets[s.index() as usize] = s.offset();
            let _ = free.push(s.index());
            slots.push(s);
        }
        let cells = (0..cfg.slots)
            .map(|_| Cell {
                state: AtomicU64::new(FREE),
                waker: AtomicWaker::new(),
                out: UnsafeCell::new(CellOut {
                    kind: 0,
                    code: 0,
                    len: 0,
                    bytes: vec![0u8; cfg.max_output as usize].into_boxed_slice(),
                    exec: None,
                }),
            })
            .collect();
        Ok(Arc::new(Staging {
            reg,
            cells,
            offsets: offsets.into_boxed_slice(),
            staged: (0..cfg.slots).map(|_| AtomicU32::new(0)).collect(),
            free,
            slot_size: cfg.slot_size,
            max_output: cfg.max_output as usize,
            frontend_id: cfg.frontend_id,
            counters: Counters::default(),
            capabilities: OnceLock::new(),
            _slots: slots,
            _pool: pool,
        }))
    }

    /// The outcome counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }
    /// Slots not in use.
    pub fn free_slots(&self) -> usize {
        self.free.len()
    }
    /// Total slots.
    pub fn capacity(&self) -> usize {
        self.cells.len()
    }
    /// The registration the slots live in.
    pub fn registration(&self) -> &Registration {
        &self.reg
    }

    /// From now on an outcome must carry a capability that verifies under
    /// `key` (see the module docs). Set once: a later call changes nothing
    /// and returns false.
    pub fn require_capabilities(&self, key: CapabilityKey) -> bool {
        self.capabilities.set(key).is_ok()
    }

    /// This frontend's id (capabilities name it).
    pub fn frontend_id(&self) -> u32 {
        u32::from(self.frontend_id)
    }

    /// Copies `input` into a free slot and returns the task to send (with
    /// `budget` as its remaining budget) and the ticket that resolves to
    /// its outcome. Counts the request as accepted: from here on it ends
    /// in exactly one outcome.
    pub fn stage(
        self: &Arc<Self>,
        model_id: u32,
        input: &[u8],
        budget: Duration,
    ) -> Result<(Task, Ticket), StageError> {
        self.stage_with(model_id, input, budget, RequestOptions::default())
    }

    /// [`stage`](Self::stage) with a priority and a timeout: the timeout
    /// is folded into the budget (one deadline crosses the wire; see
    /// [`wire::TASK_BUDGET_IS_TIMEOUT`]).
    pub fn stage_with(
        self: &Arc<Self>,
        model_id: u32,
        input: &[u8],
        budget: Duration,
        options: RequestOptions,
    ) -> Result<(Task, Ticket), StageError> {
        if input.len() > self.slot_size as usize {
            return Err(StageError::TooLarge);
        }
        let Some(index) = self.free.pop() else {
            self.counters.rejected_full.fetch_add(1, Ordering::Relaxed);
            return Err(StageError::Full);
        };
        let offset = self.offsets[index as usize];
        let cell = &self.cells[index as usize];
        let put_back = |e: StageError| {
            self.clear(index);
            let _ = self.free.push(index);
            e
        };
        // Recorded first, so that any byte written is cleared on release.
        self.staged[index as usize].store(input.len() as u32, Ordering::Relaxed);
        self.reg
            .region()
            .write_at(offset, input)
            .map_err(|e| put_back(StageError::Memory(e)))?;
        let remote = self
            .reg
            .remote_ref(offset, input.len() as u32)
            .map_err(|e| put_back(StageError::Reference(e)))?;
        let seq = ((cell.state.load(Ordering::Acquire) >> 3) + 1) & SEQ_MASK;
        cell.state.store(seq << 3 | WAITING, Ordering::Release);
        self.counters.accepted.fetch_add(1, Ordering::SeqCst);
        let (budget, flags) = match options.timeout {
            Some(t) if t < budget => (t, wire::TASK_BUDGET_IS_TIMEOUT),
            _ => (budget, 0),
        };
        let task = Task {
            task_id: self.task_id(seq, index).get(),
            budget_ns: budget.as_nanos(),
            model_id,
            frontend_id: u32::from(self.frontend_id),
            input: remote,
            priority: options.priority,
            flags,
        };
        Ok((
            task,
            Ticket {
                staging: self.clone(),
                index,
                seq,
                finished: false,
                exec: None,
                cancelled: false,
            },
        ))
    }

    /// The id of sequence `seq` of slot `index` of this frontend.
    fn task_id(&self, seq: u64, index: u32) -> TaskId {
        TaskId::new(u32::from(self.frontend_id), seq, index)
    }

    /// Zeroes what slot `index` holds of its last request.
    fn clear(&self, index: u32) {
        let i = index as usize;
        let len = self.staged[i].swap(0, Ordering::Relaxed) as usize;
        // In bounds by construction (the slot's offset, at most its size).
        let cleared = self.reg.region().zero_at(self.offsets[i], len);
        debug_assert!(cleared.is_ok(), "slot {index} out of its region");
    }

    fn release(&self, index: u32, seq: u64) {
        self.clear(index);
        self.cells[index as usize]
            .state
            .store(seq << 3 | FREE, Ordering::Release);
        // Cannot fail: each index is in the queue at most once and the
        // queue holds every index.
        let _ = self.free.push(index);
    }

    fn count(&self, o: &RoutedOutcome<'_>) {
        let c = match o {
            RoutedOutcome::Ok(_) => &self.counters.succeeded,
            RoutedOutcome::Dropped(_) => &self.counters.dropped,
            RoutedOutcome::Failed(_) => &self.counters.failed,
        };
        c.fetch_add(1, Ordering::SeqCst);
    }

    /// Delivers the outcome of task `task_id`. Exactly one outcome per
    /// request is counted and delivered; anything else is classified.
    pub fn route(&self, task_id: u64, outcome: RoutedOutcome<'_>) -> RouteResult {
        self.route_executed(task_id, outcome, None)
    }

    /// [`route`](Self::route), with the execution the task was part of
    /// (the waiting request reads it with [`Ticket::execution`]).
    pub fn route_executed(
        &self,
        task_id: u64,
        outcome: RoutedOutcome<'_>,
        exec: Option<Execution>,
    ) -> RouteResult {
        let id = TaskId(task_id);
        let (seq, index) = (id.seq(), id.slot());
        let Some(cell) = self
            .cells
            .get(index as usize)
            .filter(|_| id.frontend() == u32::from(self.frontend_id))
        else {
            self.counters.unroutable.fetch_add(1, Ordering::Relaxed);
            return RouteResult::Unroutable;
        };
        // An output too long for the cell is a backend failure.
        let outcome = match outcome {
            RoutedOutcome::Ok(b) if b.len() > self.max_output => {
                RoutedOutcome::Failed(TaskStatus::ExecFailed)
            }
            o => o,
        };
        loop {
            let s = cell.state.load(Ordering::Acquire);
            if (s >> 3) & SEQ_MASK != seq || s & PHASE_MASK == FREE {
                self.counters.unroutable.fetch_add(1, Ordering::Relaxed);
                return RouteResult::Unroutable;
            }
            let base = s & !PHASE_MASK;
            match s & PHASE_MASK {
                WAITING => {
                    if cell
                        .state
                        .compare_exchange(s, base | WRITING, Ordering::AcqRel, Ordering::Acquire)
                        .is_err()
                    {
                        continue;
                    }
                    // SAFETY: in WRITING only this router touches the outcome.
                    let out = unsafe { &mut *cell.out.get() };
                    out.exec = exec;
                    match outcome {
                        RoutedOutcome::Ok(b) => {
                            out.kind = 0;
                            out.len = b.len();
                            out.bytes[..b.len()].copy_from_slice(b);
                        }
                        RoutedOutcome::Dropped(r) => {
                            out.kind = 1;
                            out.code = r.code();
                        }
                        RoutedOutcome::Failed(st) => {
                            out.kind = 2;
                            out.code = st as u32;
                        }
                    }
                    self.count(&outcome);
                    // Mutation testing only (compiled out without the
                    // `mutations` feature): answer this request a second time.
                    if mutation::fires(Mutation::FrontendAnswersTwice) {
                        self.count(&outcome);
                    }
                    cell.state.store(base | DONE, Ordering::Release);
                    cell.waker.wake();
                    return RouteResult::Delivered;
                }
                ORPHANED => {
                    if cell
                        .state
                        .compare_exchange(s, base | WRITING, Ordering::AcqRel, Ordering::Acquire)
                        .is_err()
                    {
                        continue;
                    }
                    self.count(&outcome);
                    self.release(index, seq);
                    return RouteResult::Orphaned;
                }
                EXPIRED | CANCELLED => {
                    if cell
                        .state
                        .compare_exchange(s, base | WRITING, Ordering::AcqRel, Ordering::Acquire)
                        .is_err()
                    {
                        continue;
                    }
                    if s & PHASE_MASK == EXPIRED {
                        self.counters.late.fetch_add(1, Ordering::Relaxed);
                    }
                    self.release(index, seq);
                    return RouteResult::Late;
                }
                _ => {
                    self.counters.duplicates.fetch_add(1, Ordering::Relaxed);
                    return RouteResult::Duplicate;
                }
            }
        }
    }

    /// Routes a decoded wire message: a [`Message::Completion`] (inline or
    /// no output) or a [`Message::Dropped`]. Other kinds, unknown status or
    /// reason codes and remote outputs (which need a READ this frontend
    /// does not do) are refused with an error; a completion for a known
    /// task with an unusable output still ends that task (as failed).
    pub fn route_message(&self, msg: &Message<'_>) -> Result<RouteResult, wire::WireError> {
        self.route_message_from(msg, Sender::Scheduler)
    }

    /// [`route_message`](Self::route_message) of a message `from` that
    /// sender: with capabilities required, one that does not verify is
    /// refused (see the module docs).
    pub fn route_message_from(&self, msg: &Message<'_>, from: Sender) -> Result<RouteResult, wire::WireError> {
        match *msg {
            Message::Completion(head, inline) => {
                let status = TaskStatus::from_u32(head.status)
                    .ok_or(wire::WireError::BadValue("task status"))?;
                if !self.admits(&head, status, from) {
                    self.counters.refused.fetch_add(1, Ordering::Relaxed);
                    return Ok(RouteResult::Refused);
                }
                let outcome = match (status, OutputKind::from_u32(head.output_kind)) {
                    (TaskStatus::Ok, Some(OutputKind::Inline)) => RoutedOutcome::Ok(inline),
                    (TaskStatus::Ok, Some(OutputKind::None)) => RoutedOutcome::Ok(&[]),
                    (TaskStatus::Ok, _) => RoutedOutcome::Failed(TaskStatus::ExecFailed),
                    (st, _) => RoutedOutcome::Failed(st),
                };
                Ok(self.route_executed(head.task_id, outcome, Execution::from_head(&head)))
            }
            Message::Dropped(d) => {
                let reason = DropReason::from_u32(d.reason)
                    .ok_or(wire::WireError::BadValue("drop reason"))?;
                // Only the scheduler drops tasks.
                if matches!(from, Sender::Backend(_)) && self.capabilities.get().is_some() {
                    self.counters.refused.fetch_add(1, Ordering::Relaxed);
                    return Ok(RouteResult::Refused);
                }
                Ok(self.route(d.task_id, RoutedOutcome::Dropped(reason)))
            }
            _ => Err(wire::WireError::BadValue("not a completion or drop")),
        }
    }

    /// Whether completion `head` (of `status`) from `from` may end its
    /// task: always without a key; with one, a backend's must name it and
    /// every signed one must verify. A completion for no request in flight
    /// passes (routing counts it and changes nothing).
    fn admits(&self, head: &CompletionHead, status: TaskStatus, from: Sender) -> bool {
        let Some(key) = self.capabilities.get() else {
            return true;
        };
        let unsigned = head.capability == [0u8; CAPABILITY_LEN];
        match from {
            // The scheduler's own answers: a batch that will not finish.
            Sender::Scheduler if unsigned => return status != TaskStatus::Ok,
            Sender::Backend(id) if head.backend_id != id => return false,
            _ => {}
        }
        let Some(input) = self.input_of(head.task_id) else {
            return true;
        };
        let grant = Grant { backend: head.backend_id, frontend: u32::from(self.frontend_id), task: head.task_id, input };
        key.verify(&grant, &head.capability)
    }

    /// The input of task `task_id` as the scheduler was told it (the
    /// staged bytes of its slot), while its slot holds it; none otherwise.
    fn input_of(&self, task_id: u64) -> Option<RemoteRef> {
        let id = TaskId(task_id);
        if id.frontend() != u32::from(self.frontend_id) {
            return None;
        }
        let i = id.slot() as usize;
        let s = self.cells.get(i)?.state.load(Ordering::Acquire);
        if (s >> 3) & SEQ_MASK != id.seq() || s & PHASE_MASK == FREE {
            return None;
        }
        let len = self.staged.get(i)?.load(Ordering::Relaxed);
        self.reg.remote_ref(*self.offsets.get(i)?, len).ok()
    }

    /// Ends every request still waiting for its outcome (including those
    /// whose client has gone) with `outcome`, through [`route`](Self::route)
    /// so each is still counted exactly once; returns how many it ended. For
    /// when the cluster is gone (the scheduler died): nothing else will
    /// answer them. O(slots); not for the hot path.
    pub fn end_in_flight(&self, outcome: RoutedOutcome<'_>) -> usize {
        let mut ended = 0;
        for (index, cell) in self.cells.iter().enumerate() {
            let s = cell.state.load(Ordering::Acquire);
            if s & PHASE_MASK == CANCELLED {
                // Its client was answered; nothing else will free the slot.
                let id = self.task_id((s >> 3) & SEQ_MASK, index as u32);
                let _ = self.route(id.get(), outcome);
            } else if matches!(s & PHASE_MASK, WAITING | ORPHANED) {
                let id = self.task_id((s >> 3) & SEQ_MASK, index as u32);
                if matches!(
                    self.route(id.get(), outcome),
                    RouteResult::Delivered | RouteResult::Orphaned
                ) {
                    ended += 1;
                }
            }
        }
        ended
    }

    /// Where request `task_id` stands, for a frontend deciding what to do
    /// with a task it holds after losing its scheduler: still awaited
    /// (resubmit it), given up by its client (free the slot), or finished
    /// or unknown (forget it). Not for the hot path.
    pub fn standing(&self, task_id: u64) -> Standing {
        let id = TaskId(task_id);
        let Some(cell) = self
            .cells
            .get(id.slot() as usize)
            .filter(|_| id.frontend() == u32::from(self.frontend_id))
        else {
            return Standing::Gone;
        };
        let s = cell.state.load(Ordering::Acquire);
        if (s >> 3) & SEQ_MASK != id.seq() {
            return Standing::Gone;
        }
        match s & PHASE_MASK {
            WAITING => Standing::Awaited,
            ORPHANED | CANCELLED => Standing::GivenUp,
            _ => Standing::Gone,
        }
    }

    /// Requests staged and not yet finished (their slots are in use).
    pub fn in_flight(&self) -> usize {
        self.cells.len() - self.free.len()
    }

    fn take_done(&self, index: u32, seq: u64) -> (Outcome, Option<Execution>) {
        let cell = &self.cells[index as usize];
        // SAFETY: the phase is DONE with our sequence: the router finished
        // writing (release store, acquired by our load) and only we read.
        let out = unsafe { &*cell.out.get() };
        let o = match out.kind {
            0 => Outcome::Ok(out.bytes[..out.len].to_vec()),
            1 => Outcome::Dropped(DropReason::from_u32(out.code).unwrap_or(DropReason::Overloaded)),
            _ => Outcome::Failed(TaskStatus::from_u32(out.code).unwrap_or(TaskStatus::ExecFailed)),
        };
        let exec = out.exec;
        self.release(index, seq);
        (o, exec)
    }

    /// Waits (briefly: the router is inside a short copy) for a WRITING
    /// cell to become DONE.
    fn wait_written(&self, index: u32, seq: u64) {
        let cell = &self.cells[index as usize];
        for i in 0u32.. {
            if cell.state.load(Ordering::Acquire) == (seq << 3 | DONE) {
                return;
            }
            if i < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// Resolves to the outcome of one staged request. Dropping it before then
/// leaves the outcome to be counted when it arrives (the slot stays in use
/// until then, since a backend may still READ it).
#[derive(Debug)]
pub struct Ticket {
    staging: Arc<Staging>,
    index: u32,
    seq: u64,
    finished: bool,
    exec: Option<Execution>,
    /// [`Ticket::cancel`] succeeded.
    cancelled: bool,
}

impl Ticket {
    /// The execution the request was part of, once its outcome is in
    /// (`None` before, or when it was not executed).
    pub fn execution(&self) -> Option<Execution> {
        self.exec
    }

    /// The task id.
    pub fn task_id(&self) -> u64 {
        self.staging.task_id(self.seq, self.index).get()
    }

    /// Ends the wait now: if the outcome is already here it is returned,
    /// otherwise the request counts as failed and resolves to
    /// [`Outcome::TimedOut`] (a late outcome only frees the slot).
    pub fn expire(&mut self) -> Outcome {
        if self.finished {
            return Outcome::TimedOut;
        }
        self.finished = true;
        let cell = &self.staging.cells[self.index as usize];
        let waiting = self.seq << 3 | WAITING;
        match cell.state.compare_exchange(
            waiting,
            self.seq << 3 | EXPIRED,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => {
                self.staging.counters.failed.fetch_add(1, Ordering::SeqCst);
                Outcome::TimedOut
            }
            Err(_) => {
                self.staging.wait_written(self.index, self.seq);
                let (o, exec) = self.staging.take_done(self.index, self.seq);
                self.exec = exec;
                o
            }
        }
    }

    /// The client gives the request up: unless its outcome is already here
    /// (then `false`, and the ticket still yields it), it resolves now to
    /// `Outcome::Dropped(DropReason::Cancelled)` and counts as cancelled
    /// (not as dropped). The slot stays in use
    /// until the cluster's outcome for the task arrives (a backend may still
    /// READ it); that outcome is discarded. Tell the scheduler with
    /// `NetSink::cancel` so a queued task leaves its queue at once.
    pub fn cancel(&mut self) -> bool {
        if self.finished {
            return false;
        }
        let cell = &self.staging.cells[self.index as usize];
        let waiting = self.seq << 3 | WAITING;
        if cell
            .state
            .compare_exchange(waiting, self.seq << 3 | CANCELLED, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        self.finished = true;
        self.cancelled = true;
        self.staging.counters.cancelled.fetch_add(1, Ordering::SeqCst);
        true
    }

    /// Moves this request's slot from waiting to `next` (one of the slot
    /// states); false if it was not waiting (an outcome is in or being
    /// written).
    fn leave_waiting(&self, next: u64) -> bool {
        let cell = &self.staging.cells[self.index as usize];
        cell.state
            .compare_exchange(self.seq << 3 | WAITING, self.seq << 3 | next, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Ends the request as failed without waiting (its task could not be
    /// sent). The slot is freed at once: nobody will READ it.
    pub fn fail_unsent(mut self) {
        if self.leave_waiting(WRITING) {
            self.staging.counters.failed.fetch_add(1, Ordering::SeqCst);
            self.staging.release(self.index, self.seq);
            self.finished = true;
        }
        // Otherwise an outcome raced in (impossible for an unsent task);
        // Drop handles it.
    }
}

impl Future for Ticket {
    type Output = Outcome;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Outcome> {
        if self.cancelled {
            return Poll::Ready(Outcome::Dropped(DropReason::Cancelled));
        }
        if self.finished {
            return Poll::Ready(Outcome::TimedOut);
        }
        let cell = &self.staging.cells[self.index as usize];
        cell.waker.register(cx.waker());
        if cell.state.load(Ordering::Acquire) == (self.seq << 3 | DONE) {
            self.finished = true;
            let (o, exec) = self.staging.take_done(self.index, self.seq);
            self.exec = exec;
            return Poll::Ready(o);
        }
        Poll::Pending
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        if !self.leave_waiting(ORPHANED) {
            // The outcome is here or being written: it was counted; free.
            self.staging.wait_written(self.index, self.seq);
            let _ = self.staging.take_done(self.index, self.seq);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane::mem::{Access, Region};

    fn staging(slots: u32) -> Arc<Staging> {
        let region = Region::anonymous(64 * slots as usize).unwrap();
        let reg = Registration::new(1, region, Access::REMOTE_READ, 0);
        Staging::new(
            reg,
            StagingConfig {
                frontend_id: 7,
                slots,
                slot_size: 64,
                max_output: 16,
            },
        )
        .unwrap()
    }

    #[test]
    fn frontend_ids_outside_the_task_id_field_are_refused() {
        let cfg = |frontend_id| StagingConfig {
            frontend_id,
            slots: 1,
            slot_size: 64,
            max_output: 16,
        };
        let reg = || Registration::new(1, Region::anonymous(64).unwrap(), Access::REMOTE_READ, 0);
        assert!(Staging::new(reg(), cfg((MAX_FRONTENDS - 1) as u16)).is_ok());
        assert!(Staging::new(reg(), cfg(MAX_FRONTENDS as u16)).is_err());
    }

    fn poll_now(t: &mut Ticket) -> Poll<Outcome> {
        let w = std::task::Waker::noop();
        Pin::new(t).poll(&mut Context::from_waker(w))
    }

    /// Slot bytes as a backend's READ would see them.
    fn slot_bytes(s: &Staging, task: &Task) -> Vec<u8> {
        let mut out = vec![0u8; 64];
        s.registration().region().read_at(task.input.offset, &mut out).unwrap();
        out
    }

    #[test]
    fn a_released_slot_holds_none_of_its_requests_bytes() {
        let s = staging(2);
        let secret = b"an earlier client's input tensor";
        // Answered and read by its client.
        let (task, mut t) = s.stage(0, secret, Duration::from_millis(5)).unwrap();
        assert_eq!(&slot_bytes(&s, &task)[..secret.len()], secret);
        s.route(task.task_id, RoutedOutcome::Ok(b"x"));
        assert!(matches!(poll_now(&mut t), Poll::Ready(Outcome::Ok(_))));
        assert_eq!(slot_bytes(&s, &task), vec![0u8; 64], "answered");
        // Client gone first, outcome later.
        let (task, t) = s.stage(0, secret, Duration::from_millis(5)).unwrap();
        drop(t);
        assert_eq!(&slot_bytes(&s, &task)[..secret.len()], secret, "in use until the outcome");
        s.route(task.task_id, RoutedOutcome::Failed(TaskStatus::ExecFailed));
        assert_eq!(slot_bytes(&s, &task), vec![0u8; 64], "orphaned");
        // Never sent.
        let (task, t) = s.stage(0, secret, Duration::from_millis(5)).unwrap();
        t.fail_unsent();
        assert_eq!(slot_bytes(&s, &task), vec![0u8; 64], "unsent");
        assert_eq!(s.free_slots(), 2);
    }

    #[test]
    fn only_a_completion_signed_for_its_sender_ends_its_task() {
        use dataplane::capability::{CapabilityKey, Grant};
        use dataplane::join::JoinToken;
        let key = CapabilityKey::from_token(&JoinToken::new(b"correct horse battery staple").unwrap());
        let s = staging(4);
        assert!(s.require_capabilities(key.clone()));
        assert!(!s.require_capabilities(key.clone()), "set once");
        let (task, mut t) = s.stage(0, b"input", Duration::from_millis(5)).unwrap();
        // The scheduler planned the task to backend 1.
        let grant = Grant { backend: 1, frontend: task.frontend_id, task: task.task_id, input: task.input };
        let signed = wire::CompletionHead {
            task_id: task.task_id,
            status: TaskStatus::Ok as u32,
            output_kind: OutputKind::Inline as u32,
            backend_id: 1,
            capability: key.sign(&grant),
            ..wire::CompletionHead::default()
        };
        let route = |head: wire::CompletionHead, from: Sender| {
            let mut buf = [0u8; 256];
            let n = wire::encode_completion(&mut buf, &head, b"out").unwrap();
            s.route_message_from(&wire::decode(&buf[..n]).unwrap(), from).unwrap()
        };
        // Backend 2 answers backend 1's task: with backend 1's capability
        // under its own name, under backend 1's name, or with a guess.
        let forged = [
            (wire::CompletionHead { backend_id: 2, ..signed }, "its own id, another's capability"),
            (signed, "another backend's id on its own link"),
            (wire::CompletionHead { backend_id: 2, capability: [7u8; 16], ..signed }, "a guessed capability"),
            (wire::CompletionHead { backend_id: 2, capability: [0u8; 16], ..signed }, "no capability"),
        ];
        for (head, what) in forged {
            assert_eq!(route(head, Sender::Backend(2)), RouteResult::Refused, "{what}");
        }
        // A forwarded forgery and an unsigned success through the
        // scheduler's link; a backend's Dropped.
        let unsigned_ok = wire::CompletionHead { capability: [0u8; 16], ..signed };
        assert_eq!(route(wire::CompletionHead { backend_id: 2, ..signed }, Sender::Scheduler), RouteResult::Refused);
        assert_eq!(route(unsigned_ok, Sender::Scheduler), RouteResult::Refused);
        let drop = wire::Dropped { task_id: task.task_id, reason: DropReason::Overloaded.code(), reserved: 0 };
        assert_eq!(s.route_message_from(&Message::Dropped(drop), Sender::Backend(1)).unwrap(), RouteResult::Refused);
        assert_eq!(s.counters().snapshot().refused, 7, "each refusal counted");
        assert!(poll_now(&mut t).is_pending(), "the request still waits");
        // The real answer lands.
        assert_eq!(route(signed, Sender::Backend(1)), RouteResult::Delivered);
        assert!(matches!(poll_now(&mut t), Poll::Ready(Outcome::Ok(ref b)) if b == b"out"));
        // The scheduler's own answer (an unsigned failure) is taken.
        let (task, mut t) = s.stage(0, b"input", Duration::from_millis(5)).unwrap();
        let failed = wire::CompletionHead { task_id: task.task_id, status: TaskStatus::ExecFailed as u32, ..wire::CompletionHead::default() };
        assert_eq!(route_none(&s, failed), RouteResult::Delivered);
        assert!(matches!(poll_now(&mut t), Poll::Ready(Outcome::Failed(TaskStatus::ExecFailed))));
        let c = s.counters().snapshot();
        assert_eq!((c.refused, c.succeeded, c.failed), (7, 1, 1));
        assert!(c.balanced());
    }

    /// Routes `head` (no output) as the scheduler's.
    fn route_none(s: &Staging, head: wire::CompletionHead) -> RouteResult {
        let mut buf = [0u8; 256];
        let n = wire::encode_completion(&mut buf, &head, &[]).unwrap();
        s.route_message_from(&wire::decode(&buf[..n]).unwrap(), Sender::Scheduler).unwrap()
    }

    #[test]
    fn end_in_flight_ends_waiting_and_orphaned_requests_once() {
        let s = staging(4);
        let (_, mut waiting) = s.stage(0, b"a", Duration::from_millis(5)).unwrap();
        let (_, orphan) = s.stage(0, b"b", Duration::from_millis(5)).unwrap();
        drop(orphan);
        let (done, mut answered) = s.stage(0, b"c", Duration::from_millis(5)).unwrap();
        assert_eq!(
            s.route(done.task_id, RoutedOutcome::Ok(b"x")),
            RouteResult::Delivered
        );
        assert_eq!(s.in_flight(), 3);
        let gone = RoutedOutcome::Dropped(DropReason::Shutdown);
        assert_eq!(s.end_in_flight(gone), 2);
        assert_eq!(s.end_in_flight(gone), 0, "a second pass finds nothing");
        assert_eq!(
            poll_now(&mut waiting),
            Poll::Ready(Outcome::Dropped(DropReason::Shutdown))
        );
        assert_eq!(
            poll_now(&mut answered),
            Poll::Ready(Outcome::Ok(b"x".to_vec()))
        );
        let c = s.counters().snapshot();
        assert!(c.balanced(), "{c:?}");
        assert_eq!((c.accepted, c.succeeded, c.dropped), (3, 1, 2));
        assert_eq!(s.in_flight(), 0);
    }

    #[test]
    fn outcomes_route_once_and_stale_ids_are_refused() {
        let s = staging(2);
        let (task, mut t) = s.stage(3, b"abc", Duration::from_millis(5)).unwrap();
        assert_eq!(task.input.len, 3);
        let mut b = [0u8; 3];
        s.registration()
            .region()
            .read_at(task.input.offset, &mut b)
            .unwrap();
        assert_eq!(&b, b"abc");
        assert!(poll_now(&mut t).is_pending());
        assert_eq!(
            s.route(task.task_id, RoutedOutcome::Ok(b"out")),
            RouteResult::Delivered
        );
        assert_eq!(
            s.route(task.task_id, RoutedOutcome::Ok(b"out")),
            RouteResult::Duplicate
        );
        assert_eq!(poll_now(&mut t), Poll::Ready(Outcome::Ok(b"out".to_vec())));
        drop(t);
        // The slot is free again; the old id is stale.
        assert_eq!(
            s.route(task.task_id, RoutedOutcome::Ok(b"x")),
            RouteResult::Unroutable
        );
        let (task2, mut t2) = s.stage(3, b"d", Duration::ZERO).unwrap();
        assert_ne!(task2.task_id, task.task_id);
        let id2 = task2.id();
        assert_eq!(id2.frontend(), 7, "task ids carry the frontend id");
        let foreign = TaskId::new(8, id2.seq(), id2.slot());
        assert_eq!(
            s.route(foreign.get(), RoutedOutcome::Ok(b"")),
            RouteResult::Unroutable
        );
        assert_eq!(
            s.route(
                task2.task_id,
                RoutedOutcome::Dropped(DropReason::DeadlineUnmeetable)
            ),
            RouteResult::Delivered
        );
        assert_eq!(
            poll_now(&mut t2),
            Poll::Ready(Outcome::Dropped(DropReason::DeadlineUnmeetable))
        );
        let c = s.counters().snapshot();
        assert_eq!(
            (
                c.accepted,
                c.succeeded,
                c.dropped,
                c.duplicates,
                c.unroutable
            ),
            (2, 1, 1, 1, 2)
        );
        assert!(c.balanced());
    }

    #[test]
    fn orphaned_expired_and_full_requests_keep_the_counters_balanced() {
        let s = staging(2);
        let (a, ta) = s.stage(0, b"a", Duration::ZERO).unwrap();
        let (b, mut tb) = s.stage(0, b"b", Duration::ZERO).unwrap();
        assert!(matches!(
            s.stage(0, b"c", Duration::ZERO),
            Err(StageError::Full)
        ));
        drop(ta);
        assert_eq!(
            s.free_slots(),
            0,
            "an orphaned slot stays in use until its outcome"
        );
        assert_eq!(
            s.route(a.task_id, RoutedOutcome::Failed(TaskStatus::ExecFailed)),
            RouteResult::Orphaned
        );
        assert_eq!(tb.expire(), Outcome::TimedOut);
        assert_eq!(s.free_slots(), 1);
        assert_eq!(
            s.route(b.task_id, RoutedOutcome::Ok(b"late")),
            RouteResult::Late
        );
        assert_eq!(s.free_slots(), 2);
        // An output longer than the cell's buffer fails the request.
        let (c, mut tc) = s.stage(0, b"c", Duration::ZERO).unwrap();
        s.route(c.task_id, RoutedOutcome::Ok(&[0u8; 17]));
        assert_eq!(
            poll_now(&mut tc),
            Poll::Ready(Outcome::Failed(TaskStatus::ExecFailed))
        );
        let snap = s.counters().snapshot();
        assert_eq!(
            (snap.accepted, snap.failed, snap.late, snap.rejected_full),
            (3, 3, 1, 1)
        );
        assert!(snap.balanced());
        assert!(matches!(
            s.stage(0, &[0u8; 65], Duration::ZERO),
            Err(StageError::TooLarge)
        ));
    }

    #[test]
    fn racing_outcomes_expiries_and_hang_ups_lose_nothing() {
        // One thread stages and then waits, gives up or hangs up; another
        // routes each outcome (sometimes twice). Seeded choices, bounded.
        let s = staging(8);
        let (tx, rx) = std::sync::mpsc::channel::<u64>();
        let router = {
            let s = s.clone();
            std::thread::spawn(move || {
                let (mut n, mut seconds) = (0u64, 0u64);
                while let Ok(id) = rx.recv() {
                    n += 1;
                    let o = match n % 3 {
                        0 => RoutedOutcome::Ok(b"out"),
                        1 => RoutedOutcome::Dropped(DropReason::DeadlineUnmeetable),
                        _ => RoutedOutcome::Failed(TaskStatus::ExecFailed),
                    };
                    let first = s.route(id, o);
                    assert!(
                        matches!(
                            first,
                            RouteResult::Delivered | RouteResult::Orphaned | RouteResult::Late
                        ),
                        "{first:?}"
                    );
                    if n % 7 == 0 {
                        seconds += 1;
                        let second = s.route(id, o);
                        // Still held: a duplicate; already freed: unroutable.
                        assert!(
                            matches!(second, RouteResult::Duplicate | RouteResult::Unroutable),
                            "{second:?}"
                        );
                    }
                }
                seconds
            })
        };
        let mut x: u64 = 0x1234_5678;
        let mut staged = 0u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let (task, mut t) = match s.stage(0, b"in", Duration::ZERO) {
                Ok(v) => v,
                Err(StageError::Full) => {
                    std::thread::yield_now();
                    continue;
                }
                Err(e) => panic!("{e}"),
            };
            staged += 1;
            tx.send(task.task_id).unwrap();
            match x % 3 {
                0 => drop(t),
                1 => {
                    let _ = t.expire();
                }
                _ => {
                    while poll_now(&mut t).is_pending() {
                        std::thread::yield_now();
                    }
                }
            }
        }
        drop(tx);
        let seconds = router.join().unwrap();
        let c = s.counters().snapshot();
        assert_eq!(c.accepted, staged);
        assert!(c.balanced(), "{c:?}");
        assert_eq!(c.unroutable + c.duplicates, seconds, "{c:?}");
        assert_eq!(s.free_slots(), s.capacity(), "every slot came back");
    }
}
