//! Steps 2 to 4: input READs posted, their completions, fetch deadlines.

use dataplane::capability::ReadGrant;
use dataplane::mem::LocalRef;
use dataplane::time::Instant;
use dataplane::transport::{Completion, Connection, Error, ReadOp};
use dataplane::wire::TaskStatus;

use super::{BatchSlot, BatchWorker, Phase, TaskPhase, WorkerStats};
use crate::exec::Executor;

/// Messages drained from each frontend per poll.
const FRONTEND_MSGS_PER_POLL: usize = 8;

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
    // ---- 2. READs ---------------------------------------------------------

    pub(super) fn post_pending_reads(&mut self, now: Instant) -> bool {
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
    pub(super) fn post_for_frontend(&mut self, si: usize, fe: u32, first: usize, now: Instant) -> bool {
        let cfg = self.cfg;
        let key = self.staging.key();
        let base = self.staging.addr_base();
        self.ops.clear();
        self.grants.clear();
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
            // On tcp the frontend serves the READ only with the plan's
            // capability for this task (issue 55).
            self.grants.push(ReadGrant { task: t.task_id, capability: t.capability });
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
            match conn.post_granted_reads(&self.ops[done..], &self.grants[done..]) {
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

    pub(super) fn poll_frontends(&mut self, now: Instant) -> bool {
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

    pub(super) fn expire_fetches(&mut self, now: Instant) -> bool {
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
