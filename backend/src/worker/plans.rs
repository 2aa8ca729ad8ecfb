//! Step 1: batch plans (and control messages) from the scheduler.

use dataplane::time::{Duration, Instant};
use dataplane::transport::{Connection, Error};
use dataplane::wire::{self, BatchPlanHead, BatchTasks, Message, TaskStatus};

use super::{
    BatchSlot, BatchWorker, ControlMessage, FenceReason, FencedPlan, Phase, TaskPhase, TaskState,
    WorkerConfig, WorkerError, CONTROL_QUEUE_CAPACITY,
};
use crate::exec::Executor;

/// Messages taken from the scheduler per poll (bounds one poll's work).
const PLANS_PER_POLL: usize = 8;

impl<C: Connection, E: Executor> BatchWorker<C, E> {
    pub(super) fn take_plans(&mut self, now: Instant) -> Result<bool, WorkerError> {
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
                Ok(Message::Drain(d)) => {
                    self.control.push_back(ControlMessage::Drain(d));
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
            let dropped = self.slots[si].start_plan(&head, &tasks, self.scheduler_link, plan_ok, &self.cfg, now);
            self.stats.undeliverable += dropped as u64;
            // A newer epoch fences the older ones' batches held (this one
            // is of the newer epoch itself).
            self.see_epoch(head.epoch);
        }
        Ok(any)
    }
}

impl BatchSlot {
    /// Takes a plan into this free slot at `now`: its tasks wait for their
    /// READs (or fail at once when the plan or their input does not fit).
    /// An over-long plan keeps its first `max_batch` entries as tasks so
    /// that each gets a failure completion; returns how many entries beyond
    /// those were dropped, since there is no room to hold them.
    fn start_plan(
        &mut self,
        head: &BatchPlanHead,
        tasks: &BatchTasks<'_>,
        link: u32,
        plan_ok: bool,
        cfg: &WorkerConfig,
        now: Instant,
    ) -> usize {
        self.generation = self.generation.wrapping_add(1) & 0xff_ffff;
        self.phase = Phase::Fetching;
        self.batch_id = head.batch_id;
        self.link = link;
        self.epoch = head.epoch;
        self.run = Duration::from_nanos(head.run_ns);
        self.model = head.model_id;
        self.gpu = head.gpu_id;
        self.received = now;
        self.exec_at = (now + Duration::from_nanos(head.exec_in_ns)) - cfg.control_delay;
        self.tasks.clear();
        self.unresolved = 0;
        self.unposted = 0;
        self.outstanding_reads = 0;
        self.submitted = None;
        self.ran = 0;
        self.start = None;
        self.finish = None;
        self.exec_ok = false;
        self.read_max = Duration::ZERO;
        self.reads_ok = 0;
        self.send_cursor = 0;
        let cap = cfg.max_batch as usize;
        for t in tasks.iter().take(cap) {
            let fits = t.input.len <= cfg.input_slot;
            let phase = if plan_ok && fits {
                self.unresolved += 1;
                self.unposted += 1;
                TaskPhase::Unposted
            } else {
                TaskPhase::Failed(TaskStatus::ExecFailed)
            };
            self.tasks.push(TaskState {
                task_id: t.task_id,
                frontend: t.frontend_id,
                input: t.input,
                phase,
                out_index: 0,
                queued_us: t.queued_us,
                capability: t.capability,
                posted_at: now,
            });
        }
        if self.unresolved == 0 {
            self.phase = Phase::Ready;
        }
        tasks.len().saturating_sub(cap)
    }
}
