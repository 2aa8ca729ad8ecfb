//! With scheduler groups (issue 19): the routing table as the node uses it,
//! and the router over it. Each task goes to its model's owner group's
//! link; tasks with no registered owner, and those a group answered
//! `moved`, wait in the held table and are offered again (resubmitted with
//! the budget left) when the table changes, a link registers, or every
//! [`MOVED_RETRY`] while any waits. Cancellations go to the group their
//! task was sent to.

use super::config::{BURST, HOLD_SWEEP, MOVED_RETRY};
use super::link::SchedLink;
use super::sink::TaskQueue;
use super::held::HeldTasks;
use crate::staging::Staging;
use dataplane::time::Instant;
use dataplane::transport::Connection;
use dataplane::wire::{self, Task};
use std::sync::atomic::Ordering;

/// The routing table and what waits on it.
pub(super) struct Router {
    /// The newest revision handed to the node (0: none yet).
    pub revision: u64,
    /// The owner group of each model id (`None`: no owner in the table).
    owners: Vec<Option<u16>>,
    /// A resubmission pass is to begin (a table, a registration or a
    /// `moved` answer).
    pub repass: bool,
    /// A task taken from the queue whose group's link had no room.
    pub unsent: Option<Task>,
    /// A group answered `moved` for a task this table sent it: the table
    /// may be old (the node's `take_stale_table`).
    pub stale: bool,
}

impl Router {
    /// A router for `models` model ids, with no table yet.
    pub fn new(models: usize) -> Self {
        Router { revision: 0, owners: vec![None; models], repass: false, unsent: None, stale: false }
    }

    /// The table at `revision` (`owners[m]`: model `m`'s group; a missing
    /// entry or one naming no group under `groups`: no owner). Ignored
    /// unless newer than the one followed; returns whether it was taken.
    pub fn handle_routes(&mut self, revision: u64, owners: &[Option<u16>], groups: usize) -> bool {
        if revision <= self.revision {
            return false;
        }
        self.revision = revision;
        for (m, o) in self.owners.iter_mut().enumerate() {
            *o = owners.get(m).copied().flatten().filter(|&g| usize::from(g) < groups);
        }
        self.repass = true;
        true
    }

    /// Every MOVED_RETRY while tasks wait, answers those past their
    /// deadline and offers the rest again; resubmissions and new tasks go
    /// to their owner's link (`out`), or wait in the held table while it
    /// has no registered link. `sweep_at` is the held table's next sweep.
    pub fn dispatch<C: Connection>(
        &mut self,
        now: Instant,
        links: &mut [SchedLink<C>],
        held: &mut HeldTasks,
        queue: &TaskQueue,
        staging: &Staging,
        sweep_at: &mut Option<Instant>,
    ) -> bool {
        let mut work = false;
        if sweep_at.is_some_and(|t| t <= now) {
            let (ended, waiting) = held.sweep(now, staging);
            work |= ended > 0;
            *sweep_at = (waiting > 0).then(|| now.saturating_add(MOVED_RETRY));
            self.repass |= waiting > 0;
        }
        if std::mem::take(&mut self.repass) {
            held.begin_resubmit();
        }
        let room = |links: &[SchedLink<C>], g: u16| links.get(usize::from(g)).is_some_and(SchedLink::has_room);
        for _ in 0..BURST {
            if !held.resubmitting() {
                break;
            }
            let owners = &self.owners;
            let Some((t, g)) = held.next_resubmit(now, staging, self.revision, |m, pinned| {
                pinned.or_else(|| owners.get(m as usize).copied().flatten()).filter(|&g| room(links, g))
            }) else {
                break;
            };
            links[usize::from(g)].outbox.out.push_back(t);
            work = true;
        }
        for _ in 0..BURST {
            let Some(t) = self.unsent.take().or_else(|| queue.tasks.pop()) else { break };
            work = true;
            match self.owners.get(t.model_id as usize).copied().flatten() {
                Some(g) if room(links, g) => links[usize::from(g)].outbox.out.push_back(t),
                Some(g) if links[usize::from(g)].registered() => {
                    self.unsent = Some(t);
                    break;
                }
                _ => {
                    held.hold(&t, now);
                    sweep_at.get_or_insert(now.saturating_add(HOLD_SWEEP));
                }
            }
        }
        work
    }
}

/// With groups: cancellations, each to the group its task was sent to
/// (best effort: one the link has no room for, or whose task is not at a
/// registered group, is not sent; the task then ends by its deadline, or
/// is answered cancelled when it would be resubmitted).
pub(super) fn send_cancels<C: Connection>(
    links: &mut [SchedLink<C>],
    held: &HeldTasks,
    queue: &TaskQueue,
    buf: &mut [u8],
) -> bool {
    let stats = &queue.stats;
    let mut work = false;
    for _ in 0..BURST {
        let Some(task_id) = queue.cancels.pop() else { break };
        work = true;
        let link = held.group_of(task_id).and_then(|g| links.get_mut(usize::from(g))).filter(|l| l.registered());
        let sent = link.and_then(|l| l.conn.as_mut()).is_some_and(|conn| {
            wire::encode(buf, &wire::Cancel { task_id }).is_ok_and(|n| conn.send(&buf[..n]).is_ok())
        });
        let counter = if sent { &stats.cancels_sent } else { &stats.cancels_unsent };
        counter.fetch_add(1, Ordering::Relaxed);
    }
    work
}
