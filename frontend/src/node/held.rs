//! The tasks a frontend holds across the loss of its scheduler, and (with
//! several scheduler groups) across a model's move to another group.
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
//!
//! With scheduler groups (issue 19) an entry also says which group it was
//! sent to and at which routing revision. A task a group answers `moved`
//! waits here ([`HeldTasks::moved`]) until the frontend's table is newer
//! than the one it was sent by, or a short retry time has passed (the new
//! owner may not have applied the table yet), then goes to its owner with
//! the budget left; past its deadline it is answered dropped `moved`.
//!
//! A task whose group's link is lost while it is at that group goes back
//! to the *same* group (its next leader, or the same scheduler once the
//! link is back), never straight to another owner by the table: the lost
//! scheduler may already have sent it in a batch that a backend of its
//! group still runs, and only that group's next term fences those batches
//! (a newer epoch supersedes them; the new term plans nothing at first).
//! If the group no longer owns the model, it answers `moved`, and the
//! task goes on to its owner from there.

use crate::staging::{RoutedOutcome, Staging, Standing};
use dataplane::ids::TaskId;
use dataplane::time::{Duration, Instant};
use dataplane::wire::{DropReason, Task};

/// Where a held task stands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Wait {
    /// At its group's scheduler (or queued toward its link).
    #[default]
    Sent,
    /// To send once a link to its owner is registered (its link was lost,
    /// or none was up when it came).
    Ready,
    /// Answered `moved`: to send once the table is newer than `rev`, or
    /// from `retry_at`.
    Moved { rev: u64, retry_at: Instant },
    /// At its group when that group's link was lost: to send to the same
    /// group once it has a registered link (see the module docs).
    Lost,
}

#[derive(Clone, Copy, Default)]
struct HeldTask {
    task: Task,
    deadline: Instant,
    /// Whether this entry was ever written (slot tables start empty).
    used: bool,
    /// The group it was sent to, and the routing revision it was sent by
    /// (0 when it went back to its group after a lost link: no table
    /// chose that group, so any table names its owner better).
    group: u16,
    rev: u64,
    /// Being resent to its group after a lost link (see `rev`).
    pinned: bool,
    wait: Wait,
}

/// What a `moved` answer was to the held table ([`HeldTasks::moved`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MovedAnswer {
    /// Taken back for its owner; the routing revision it was sent by.
    TakenBack(u64),
    /// An answer to an earlier attempt than the one at a group now (a
    /// duplicated or late message): ignored.
    Stale,
    /// No such task is held: its outcome goes to the staging area as is.
    Unknown,
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

    fn put(&mut self, task: &Task, now: Instant, group: u16, rev: u64, wait: Wait) {
        let slot = TaskId(task.task_id).slot() as usize;
        if let Some(e) = self.table.get_mut(slot) {
            *e = HeldTask {
                task: *task,
                deadline: now.saturating_add(Duration::from_nanos(task.budget_ns)),
                used: true,
                group,
                rev,
                pinned: false,
                wait,
            };
        }
    }

    /// Keeps `task`, sent at `now` to `group` by routing revision `rev`.
    pub fn sent(&mut self, task: &Task, now: Instant, group: u16, rev: u64) {
        let slot = TaskId(task.task_id).slot() as usize;
        let pinned = self.table.get(slot).is_some_and(|e| e.used && e.task.task_id == task.task_id && e.pinned);
        self.put(task, now, group, if pinned { 0 } else { rev }, Wait::Sent);
    }

    /// Keeps `task`, whose budget counts from `now`, to send once a link
    /// to its owner is registered.
    pub fn hold(&mut self, task: &Task, now: Instant) {
        self.put(task, now, 0, 0, Wait::Ready);
    }

    /// `group`'s link is gone: what was sent to it is to send again, to
    /// the same group. O(slots), once per loss.
    pub fn link_lost(&mut self, group: u16) {
        for e in self.table.iter_mut().filter(|e| e.used && e.wait == Wait::Sent && e.group == group) {
            e.wait = Wait::Lost;
        }
    }

    /// Attempt `attempt` of `task_id` was answered `moved` at `now`: it
    /// waits (see the module docs), retried from `now + retry` at the
    /// latest, as its next attempt.
    pub fn moved(&mut self, task_id: u64, attempt: u16, now: Instant, retry: Duration) -> MovedAnswer {
        let Some(e) = self.table.get_mut(TaskId(task_id).slot() as usize) else { return MovedAnswer::Unknown };
        if !e.used || e.task.task_id != task_id {
            return MovedAnswer::Unknown;
        }
        if e.wait != Wait::Sent || e.task.attempt() != attempt {
            return MovedAnswer::Stale;
        }
        e.wait = Wait::Moved { rev: e.rev, retry_at: now.saturating_add(retry) };
        MovedAnswer::TakenBack(e.rev)
    }

    /// The group `task_id` was sent to, if it is at one.
    pub fn group_of(&self, task_id: u64) -> Option<u16> {
        let e = self.table.get(TaskId(task_id).slot() as usize)?;
        (e.used && e.task.task_id == task_id && e.wait == Wait::Sent).then_some(e.group)
    }

    /// Starts a pass that resubmits every held task still awaited.
    pub fn begin_resubmit(&mut self) {
        self.cursor = 0;
    }

    /// Whether a resubmission pass is under way.
    pub fn resubmitting(&self) -> bool {
        self.cursor < self.table.len()
    }

    /// The next task of the pass, its budget what is left at `now`, and
    /// the group `route(model, pinned)` sends it to (`None`: no registered
    /// link with room now; the task stays held). `pinned` is the group a
    /// task lost with its link must go back to; `None` lets the route
    /// follow the table. A task answered `moved` is due
    /// only once `revision` is newer than the one it was sent by, or its
    /// retry time has come. Requests given up are freed and those past
    /// their deadline answered on the way; both are skipped. The task
    /// returned counts as sent to its group.
    pub fn next_resubmit(
        &mut self,
        now: Instant,
        staging: &Staging,
        revision: u64,
        mut route: impl FnMut(u32, Option<u16>) -> Option<u16>,
    ) -> Option<(Task, u16)> {
        while self.cursor < self.table.len() {
            let i = self.cursor;
            self.cursor += 1;
            let e = &mut self.table[i];
            let due = match e.wait {
                Wait::Sent => false,
                Wait::Ready | Wait::Lost => true,
                Wait::Moved { rev, retry_at } => revision > rev || now >= retry_at,
            };
            if !due {
                // Still answered when past its deadline (no sweep needed).
                if e.wait != Wait::Sent {
                    let _ = settle(e, now, staging);
                }
                continue;
            }
            let model = e.task.model_id;
            let pinned = (e.wait == Wait::Lost).then_some(e.group);
            if let Some(task) = settle(e, now, staging) {
                if let Some(g) = route(model, pinned) {
                    // Sent before (not only held): its next submission.
                    let resent = matches!(e.wait, Wait::Lost | Wait::Moved { .. });
                    let task = if resent { task.with_attempt(task.attempt().wrapping_add(1)) } else { task };
                    e.task = e.task.with_attempt(task.attempt());
                    e.wait = Wait::Sent;
                    e.group = g;
                    e.pinned = pinned.is_some();
                    return Some((task, g));
                }
            }
        }
        None
    }

    /// Answers every held request (not at a scheduler) that can no longer
    /// meet its deadline and frees those given up; returns how many it
    /// ended and how many still wait. O(slots): for a timer while
    /// requests wait.
    pub fn sweep(&mut self, now: Instant, staging: &Staging) -> (usize, usize) {
        let (mut ended, mut waiting) = (0, 0);
        for e in self.table.iter_mut().filter(|e| e.used && e.wait != Wait::Sent) {
            // Past its deadline or no longer awaited: settling ends it.
            if e.deadline <= now || staging.standing(e.task.task_id) != Standing::Awaited {
                let _ = settle(e, now, staging);
                ended += 1;
            } else {
                waiting += 1;
            }
        }
        (ended, waiting)
    }
}

/// What becomes of held entry `e` at `now`: the task to send (budget what
/// is left) if its request is still awaited and in time; otherwise the
/// request is ended (overloaded, or `moved` if a group handed it back) or
/// forgotten and the entry emptied.
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
            let reason = if matches!(e.wait, Wait::Moved { .. }) { DropReason::Moved } else { DropReason::Overloaded };
            staging.route(id, RoutedOutcome::Dropped(reason));
        }
        Standing::GivenUp => {
            staging.route(id, RoutedOutcome::Dropped(DropReason::Cancelled));
        }
        Standing::Gone => {}
    }
    e.used = false;
    None
}
