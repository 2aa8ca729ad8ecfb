//! The task ledger: every task the plane holds, from its arrival to its
//! one answer. Waiting tasks and the duplicate filter (`task_ids`), the
//! batches sent and not reported done with their expiry moments, and the
//! tasks handed back to another scheduler group (so that a late copy of
//! one is not taken again). Inputs carry `now`; nothing here sends: the
//! ledger says what ended, and the plane answers it.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use dataplane::time::{Duration, Instant};

use super::{IdHasher, IdMap, DEFAULT_BATCH_GRACE};
use crate::daemon::metrics::MessageRefusal;
use crate::daemon::task_ids::{Handle, TaskMeta, TaskTable};
use crate::types::GpuId;

/// A batch sent to a backend and not yet reported done.
pub(super) struct InFlight {
    pub(super) backend: u32,
    /// (task id, frontend id)
    pub(super) tasks: Vec<(u64, u32)>,
    pub(super) subcluster: usize,
    /// Sub-cluster GPU id, and the GPU's index at the backend.
    pub(super) gpu: GpuId,
    pub(super) local_gpu: u32,
    /// Local model id in the sub-cluster.
    pub(super) model: u32,
    /// Its planned start and finish on the GPU.
    pub(super) exec_at: Instant,
    pub(super) finish_at: Instant,
}

/// Where a batch reported done ran.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Finished {
    pub(super) subcluster: usize,
    /// Sub-cluster GPU id, and the GPU's index at its backend.
    pub(super) gpu: GpuId,
    pub(super) local_gpu: u32,
    /// Local model id in the sub-cluster.
    pub(super) model: u32,
    /// Reported after it was given up (its tasks were failed back): its
    /// planned start and finish, which the closed loop no longer holds.
    pub(super) late: Option<(Instant, Instant)>,
}

/// Batches given up (overdue past the grace) whose reports are still
/// taken, to learn from: the most recent this many. A backend lagging
/// past the grace reports its batches in plan order soon after; older
/// ones are refused as unknown, as before the ring existed.
pub(super) const EXPIRED_RING: usize = 256;

/// A batch not reported this long after its planned finish (or twice its
/// planned run, if longer) makes its GPU suspect: the GPU is held out of
/// matchmaking until a report from it comes (see `links`), long before
/// the batch itself is given up at the grace. A stalled GPU is not fed
/// for the whole grace; a report merely late brings it back at once.
pub(super) const SUSPECT_AFTER: Duration = Duration::from_millis(20);

/// A batch given up, in the ring of [`EXPIRED_RING`].
#[derive(Clone, Copy, Debug)]
struct Expired {
    batch: u64,
    backend: u32,
    finished: Finished,
}

/// The ledger (see the module docs).
pub(super) struct TaskLedger {
    /// Waiting tasks and the duplicate filter (see `task_ids`).
    ids: TaskTable,
    inflight: IdMap<InFlight>,
    /// (planned finish + grace, batch id) of batches in flight; entries of
    /// batches already reported are removed lazily.
    expiries: BinaryHeap<Reverse<(Instant, u64)>>,
    /// (when its GPU becomes suspect, batch id) of batches in flight (see
    /// [`SUSPECT_AFTER`]); removed lazily as `expiries`.
    suspects: BinaryHeap<Reverse<(Instant, u64)>>,
    batch_grace: Duration,
    /// The batches given up most recently (a fixed ring; `expired_next`
    /// is where the next one goes).
    expired: Vec<Option<Expired>>,
    expired_next: usize,
    spare_task_lists: Vec<Vec<(u64, u32)>>,
    next_batch: u64,
    /// Tasks handed back as moved, by id: the attempt handed back. A later
    /// copy of that attempt (a duplicated message) is ignored; the next
    /// attempt (the frontend's resubmission, after a move back) is new.
    handed_back: IdMap<u16>,
    /// When each entry of `handed_back` may be forgotten (its deadline),
    /// with its attempt.
    handed_back_expiry: BinaryHeap<Reverse<(Instant, u64, u16)>>,
    duplicate_tasks: u64,
}

impl TaskLedger {
    pub(super) fn new() -> Self {
        TaskLedger {
            ids: TaskTable::new(),
            inflight: IdMap::with_capacity_and_hasher(1024, IdHasher::default()),
            expiries: BinaryHeap::with_capacity(1024),
            suspects: BinaryHeap::with_capacity(1024),
            batch_grace: DEFAULT_BATCH_GRACE,
            expired: vec![None; EXPIRED_RING],
            expired_next: 0,
            spare_task_lists: Vec::new(),
            next_batch: 1,
            handed_back: IdMap::default(),
            handed_back_expiry: BinaryHeap::new(),
            duplicate_tasks: 0,
        }
    }

    // --- waiting tasks -------------------------------------------------

    /// Tasks waiting.
    pub(super) fn waiting_len(&self) -> usize {
        self.ids.waiting_len()
    }

    /// A frontend registered (again): it numbers its tasks from the start.
    pub(super) fn frontend_registered(&mut self, frontend: u32) {
        self.ids.frontend_registered(frontend);
    }

    /// A task offered at `now`, held until `deadline`: its handle for the
    /// cores, or None if it is a repeat.
    pub(super) fn offer(&mut self, id: u64, now: Instant, deadline: Instant, meta: TaskMeta) -> Option<Handle> {
        self.ids.offer(id, now, deadline, meta).1
    }

    /// Whether a copy of `id` offered at `now` would be ignored as a
    /// repeat.
    pub(super) fn seen(&self, id: u64, now: Instant) -> bool {
        self.ids.seen(id, now)
    }

    /// The waiting task `id`: its handle and meta.
    pub(super) fn waiting(&self, id: u64) -> Option<(Handle, TaskMeta)> {
        self.ids.waiting(id)
    }

    /// The task under `handle` leaves the waiting set (planned or
    /// dropped): its id and meta, if it still waited.
    pub(super) fn take(&mut self, handle: Handle) -> Option<(u64, TaskMeta)> {
        self.ids.take(handle)
    }

    /// The waiting tasks of the models `lost` marks, as (id, handle,
    /// model), in id order.
    pub(super) fn waiting_of(&self, lost: &[bool]) -> Vec<(u64, Handle, u32)> {
        let mut queued: Vec<(u64, Handle, u32)> = self
            .ids
            .iter_waiting()
            .filter(|(_, _, m)| lost.get(m.model as usize).copied().unwrap_or(false))
            .map(|(handle, id, m)| (id, handle, m.model))
            .collect();
        queued.sort_unstable();
        queued
    }

    /// Every waiting task leaves: (id, frontend), in id order (a run is
    /// reproducible).
    pub(super) fn drain_waiting(&mut self) -> Vec<(u64, u32)> {
        let mut waiting: Vec<(u64, u32)> = self.ids.drain_waiting().into_iter().map(|(id, m)| (id, m.frontend)).collect();
        waiting.sort_unstable();
        waiting
    }

    // --- duplicates and tasks handed back --------------------------------

    /// A task message ignored as a copy of one already taken or handed
    /// back.
    pub(super) fn count_duplicate(&mut self) {
        self.duplicate_tasks += 1;
    }

    /// Task messages ignored as repeats.
    pub(super) fn duplicate_tasks(&self) -> u64 {
        self.duplicate_tasks
    }

    /// Whether `attempt` of `task` is a copy of an attempt already handed
    /// back (forgetting those whose deadline passed at `now`). A newer
    /// attempt clears the record: it is a new submission.
    pub(super) fn is_handed_back_copy(&mut self, now: Instant, task: u64, attempt: u16) -> bool {
        self.forget_handed_back(now);
        if self.handed_back.is_empty() {
            // Empty unless tasks were handed back as moved: no hash per
            // task otherwise.
            return false;
        }
        match self.handed_back.get(&task) {
            Some(&a) if attempt <= a => true,
            Some(_) => {
                self.handed_back.remove(&task);
                false
            }
            None => false,
        }
    }

    /// `task`'s `attempt` is handed back to its frontend: the filter lets
    /// go of it, and a copy of this attempt is refused until `deadline`.
    pub(super) fn hand_back(&mut self, task: u64, attempt: u16, deadline: Instant) {
        self.ids.forget(task);
        self.handed_back.insert(task, attempt);
        self.handed_back_expiry.push(Reverse((deadline, task, attempt)));
    }

    /// Forgets the tasks handed back whose deadline has passed.
    fn forget_handed_back(&mut self, now: Instant) {
        while let Some(&Reverse((t, id, attempt))) = self.handed_back_expiry.peek() {
            if t > now {
                break;
            }
            self.handed_back_expiry.pop();
            // A newer attempt handed back since has its own expiry.
            if self.handed_back.get(&id) == Some(&attempt) {
                self.handed_back.remove(&id);
            }
        }
    }

    // --- batches in flight ------------------------------------------------

    /// How long after a batch's planned finish its `BatchDone` is waited
    /// for.
    pub(super) fn set_batch_grace(&mut self, grace: Duration) {
        self.batch_grace = grace;
    }

    /// How long after a batch's planned finish its `BatchDone` is waited
    /// for.
    pub(super) fn batch_grace(&self) -> Duration {
        self.batch_grace
    }

    /// Batches sent and not reported done.
    pub(super) fn in_flight(&self) -> usize {
        self.inflight.len()
    }

    /// The id of the next batch planned.
    pub(super) fn next_batch_id(&mut self) -> u64 {
        let id = self.next_batch;
        self.next_batch += 1;
        id
    }

    /// An empty task list for a batch's record (recycled storage).
    pub(super) fn task_list(&mut self) -> Vec<(u64, u32)> {
        self.spare_task_lists.pop().unwrap_or_default()
    }

    /// A batch was sent: it is in flight until reported done, or until
    /// the grace after `finish_at`.
    pub(super) fn sent(&mut self, batch: u64, record: InFlight, finish_at: Instant) {
        let run = finish_at.saturating_since(record.exec_at);
        let suspect = finish_at + SUSPECT_AFTER.max(run + run);
        self.inflight.insert(batch, record);
        self.expiries.push(Reverse((finish_at + self.batch_grace, batch)));
        if suspect < finish_at + self.batch_grace {
            self.suspects.push(Reverse((suspect, batch)));
        }
    }

    /// The next batch in flight whose GPU became suspect by `now`: (batch,
    /// backend, GPU index at the backend).
    pub(super) fn pop_suspect(&mut self, now: Instant) -> Option<(u64, u32, u32)> {
        while let Some(&Reverse((t, batch))) = self.suspects.peek() {
            if t > now {
                return None;
            }
            self.suspects.pop();
            if let Some(f) = self.inflight.get(&batch) {
                return Some((batch, f.backend, f.local_gpu));
            }
        }
        None
    }

    /// Backend `from` reported `batch` done: where it ran, or why the
    /// report is refused (not in flight nor recently given up, or another
    /// backend's). A batch given up is taken once, as late.
    pub(super) fn finish(&mut self, batch: u64, from: u32) -> Result<Finished, MessageRefusal> {
        match self.inflight.get(&batch) {
            None => return self.finish_late(batch, from),
            Some(f) if f.backend != from => return Err(MessageRefusal::WrongBackend),
            Some(_) => {}
        }
        let f = self.inflight.remove(&batch).ok_or(MessageRefusal::UnknownBatch)?;
        let finished = Finished { subcluster: f.subcluster, gpu: f.gpu, local_gpu: f.local_gpu, model: f.model, late: None };
        self.recycle(f.tasks);
        self.trim_expiries();
        Ok(finished)
    }

    /// The report of a batch in the ring of those given up: taken out of
    /// it (a copy of the report is refused), or refused.
    fn finish_late(&mut self, batch: u64, from: u32) -> Result<Finished, MessageRefusal> {
        let slot = self.expired.iter_mut().find(|e| e.is_some_and(|e| e.batch == batch)).ok_or(MessageRefusal::UnknownBatch)?;
        match *slot {
            Some(e) if e.backend == from => {
                *slot = None;
                Ok(e.finished)
            }
            _ => Err(MessageRefusal::WrongBackend),
        }
    }

    /// `batch`, given up, goes into the ring (over its oldest entry).
    fn remember_expired(&mut self, batch: u64, f: &InFlight) {
        let finished = Finished {
            subcluster: f.subcluster,
            gpu: f.gpu,
            local_gpu: f.local_gpu,
            model: f.model,
            late: Some((f.exec_at, f.finish_at)),
        };
        self.expired[self.expired_next] = Some(Expired { batch, backend: f.backend, finished });
        self.expired_next = (self.expired_next + 1) % EXPIRED_RING;
    }

    /// When the earliest batch in flight becomes overdue (may be the
    /// deadline of a batch already reported: then expiring finds nothing).
    pub(super) fn next_expiry(&self) -> Option<Instant> {
        let expiry = self.expiries.peek().map(|Reverse((t, _))| *t);
        let suspect = self.suspects.peek().map(|Reverse((t, _))| *t);
        expiry.into_iter().chain(suspect).min()
    }

    /// The next batch overdue at `now`, removed from flight (and kept in
    /// the ring of batches given up, whose late report is still learned
    /// from): (batch id, record). Give its tasks back with
    /// [`recycle`](Self::recycle).
    pub(super) fn pop_overdue(&mut self, now: Instant) -> Option<(u64, InFlight)> {
        while let Some(&Reverse((t, batch))) = self.expiries.peek() {
            if t > now {
                return None;
            }
            self.expiries.pop();
            if let Some(f) = self.inflight.remove(&batch) {
                self.remember_expired(batch, &f);
                return Some((batch, f));
            }
        }
        None
    }

    /// Every batch in flight on `backend`, removed from flight, in batch
    /// order (a run is reproducible). Give their task lists back with
    /// [`recycle`](Self::recycle), then [`trim_expiries`](Self::trim_expiries).
    pub(super) fn take_backend(&mut self, backend: u32) -> Vec<InFlight> {
        let mut dead: Vec<u64> = self.inflight.iter().filter(|(_, f)| f.backend == backend).map(|(&k, _)| k).collect();
        dead.sort_unstable();
        dead.into_iter().filter_map(|batch| self.inflight.remove(&batch)).collect()
    }

    /// Whether any batch in flight is on `backend` (a scan: asked only
    /// about a draining backend, per report or expiry of its batches).
    pub(super) fn holds_backend(&self, backend: u32) -> bool {
        self.inflight.values().any(|f| f.backend == backend)
    }

    /// Drops expiry entries of batches no longer in flight from the top of
    /// the heap, so that [`next_expiry`](Self::next_expiry) stays tight.
    pub(super) fn trim_expiries(&mut self) {
        for heap in [&mut self.expiries, &mut self.suspects] {
            while let Some(&Reverse((_, batch))) = heap.peek() {
                if self.inflight.contains_key(&batch) {
                    break;
                }
                heap.pop();
            }
        }
    }

    /// A batch record's task list, kept for the next batch.
    pub(super) fn recycle(&mut self, mut v: Vec<(u64, u32)>) {
        v.clear();
        self.spare_task_lists.push(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(backend: u32, at_ms: u64) -> InFlight {
        let exec_at = Instant::from_nanos(at_ms * 1_000_000);
        InFlight {
            backend,
            tasks: vec![(at_ms, 1)],
            subcluster: 0,
            gpu: 0,
            local_gpu: 0,
            model: 0,
            exec_at,
            finish_at: exec_at + Duration::from_millis(1),
        }
    }

    #[test]
    fn the_last_batches_given_up_are_taken_once_as_late_and_older_ones_refused() {
        let mut l = TaskLedger::new();
        l.set_batch_grace(Duration::from_millis(5));
        let n = EXPIRED_RING as u64 + 10;
        for batch in 1..=n {
            l.sent(batch, record(7, batch), Instant::from_nanos(batch * 1_000_000));
        }
        let mut expired = 0;
        while let Some((_, f)) = l.pop_overdue(Instant::from_nanos(10_000_000_000)) {
            l.recycle(f.tasks);
            expired += 1;
        }
        assert_eq!((expired, l.in_flight()), (n, 0));
        // The oldest ten fell out of the ring: unknown, as before it.
        assert_eq!(l.finish(10, 7), Err(MessageRefusal::UnknownBatch));
        let at = |ms: u64| Instant::from_nanos(ms * 1_000_000);
        assert_eq!(l.finish(11, 8), Err(MessageRefusal::WrongBackend), "another backend's report");
        let f = l.finish(11, 7).unwrap();
        assert_eq!(f.late, Some((at(11), at(12))));
        assert_eq!(l.finish(11, 7), Err(MessageRefusal::UnknownBatch), "taken once");
        assert_eq!(l.finish(n, 7).unwrap().late, Some((at(n), at(n + 1))));
        assert_eq!(l.finish(n + 1, 7), Err(MessageRefusal::UnknownBatch), "never planned");
    }
}
