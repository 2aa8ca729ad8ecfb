//! The tasks a frontend holds across the loss of its scheduler.
//!
//! With failover on, every task the frontend sends is also kept here, by
//! staging slot, with its absolute deadline (a copy of a fixed-size
//! record into a table allocated once: nothing per request). When the
//! scheduler goes away the requests stay in flight; once a scheduler
//! (restarted, or the newly elected leader) acknowledges the frontend
//! again, every task whose client still waits is sent again with the
//! budget it has left. A task that cannot be held within its deadline is
//! answered as overloaded (503 with `Retry-After`). An entry needs no
//! removal when its request ends: the staging area says whether the
//! request is still awaited ([`Staging::standing`]), and the slot's next
//! request overwrites it.

use crate::staging::{RoutedOutcome, Staging, Standing};
use dataplane::ids::TaskId;
use dataplane::time::{Duration, Instant};
use dataplane::wire::{DropReason, Task};

#[derive(Clone, Copy, Default)]
struct HeldTask {
    task: Task,
    deadline: Instant,
    /// Whether this entry was ever written (slot tables start empty).
    used: bool,
}

/// The held tasks (see the module docs).
pub struct HeldTasks {
    table: Box<[HeldTask]>,
    /// Next entry to resubmit; `table.len()` when no pass is under way.
    cursor: usize,
}

impl std::fmt::Debug for HeldTasks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldTasks").field("slots", &self.table.len()).field("cursor", &self.cursor).finish()
    }
}

impl HeldTasks {
    /// A table for `slots` staging slots.
    pub fn new(slots: usize) -> Self {
        HeldTasks { table: vec![HeldTask::default(); slots].into_boxed_slice(), cursor: slots }
    }

    /// Keeps `task`, whose budget counts from `now`.
    pub fn record(&mut self, task: &Task, now: Instant) {
        let slot = TaskId(task.task_id).slot() as usize;
        if let Some(e) = self.table.get_mut(slot) {
            *e = HeldTask {
                task: *task,
                deadline: now.saturating_add(Duration::from_nanos(task.budget_ns)),
                used: true,
            };
        }
    }

    /// Starts a pass that resubmits every held task still awaited.
    pub fn begin_resubmit(&mut self) {
        self.cursor = 0;
    }

    /// Whether a resubmission pass is under way.
    pub fn resubmitting(&self) -> bool {
        self.cursor < self.table.len()
    }

    /// The next task of the pass, its budget what is left at `now`.
    /// Requests given up are freed and those past their deadline answered
    /// as overloaded on the way; both are skipped.
    pub fn next_resubmit(&mut self, now: Instant, staging: &Staging) -> Option<Task> {
        while self.cursor < self.table.len() {
            let i = self.cursor;
            self.cursor += 1;
            if let Some(task) = settle(&mut self.table[i], now, staging) {
                return Some(task);
            }
        }
        None
    }

    /// Answers every held request that can no longer meet its deadline
    /// (overloaded) and frees those given up; returns how many it ended.
    /// O(slots): for a timer while no scheduler is linked.
    pub fn sweep(&mut self, now: Instant, staging: &Staging) -> usize {
        let mut ended = 0;
        for e in self.table.iter_mut().filter(|e| e.used) {
            // Past its deadline or no longer awaited: settling ends it.
            if e.deadline <= now || staging.standing(e.task.task_id) != Standing::Awaited {
                let _ = settle(e, now, staging);
                ended += 1;
            }
        }
        ended
    }
}

/// What becomes of held entry `e` at `now`: the task to send (budget what
/// is left) if its request is still awaited and in time; otherwise the
/// request is ended or forgotten and the entry emptied.
fn settle(e: &mut HeldTask, now: Instant, staging: &Staging) -> Option<Task> {
    if !e.used {
        return None;
    }
    let id = e.task.task_id;
    match staging.standing(id) {
        Standing::Awaited if e.deadline > now => {
            let mut t = e.task;
            t.budget_ns = e.deadline.saturating_since(now).as_nanos();
            return Some(t);
        }
        Standing::Awaited => {
            staging.route(id, RoutedOutcome::Dropped(DropReason::Overloaded));
        }
        Standing::GivenUp => {
            staging.route(id, RoutedOutcome::Dropped(DropReason::Cancelled));
        }
        Standing::Gone => {}
    }
    e.used = false;
    None
}
