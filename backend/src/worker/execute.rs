//! Step 5: ready batches onto their devices, finished ones off.

use dataplane::time::{Duration, Instant};
use dataplane::transport::Connection;

use dataplane::wire::TaskStatus;

use super::{BatchSlot, BatchWorker, Phase, TaskPhase, WorkerError};
use crate::exec::{Executor, InputRef, Job, OutputRef};

/// A batch counts as a late start (`WorkerStats::late_starts`) only when
/// it started more than this after its planned `exec_at`: the backend's
/// loop sees an executor's readiness and its clock a few microseconds
/// apart, so counting every nanosecond made nearly every batch "late".
/// The whole distribution is the histogram
/// `symphony_backend_start_lateness_us`.
pub const LATE_START_THRESHOLD: Duration = Duration::from_micros(100);

impl<C: Connection, E: Executor> BatchWorker<C, E> {
    // ---- 5. executor -----------------------------------------------------

    pub(super) fn collect_finished(&mut self, now: Instant) -> bool {
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
                if !f.ok {
                    self.failures.failed(s.model, s.ran, self.exec.last_error());
                }
                if f.start.saturating_since(s.exec_at) > LATE_START_THRESHOLD {
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

    pub(super) fn submit_ready(&mut self, now: Instant) -> Result<bool, WorkerError> {
        let mut any = false;
        loop {
            // Per device, the ready batch with the earliest exec_at; first
            // any the scheduler has given up, whose device does not matter.
            let mut pick: Option<usize> = None;
            let mut given_up = false;
            for (i, s) in self.slots.iter().enumerate() {
                if s.phase != Phase::Ready {
                    continue;
                }
                if self.given_up(s, now) {
                    (pick, given_up) = (Some(i), true);
                    break;
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
            if given_up {
                self.skip(si);
                continue;
            }
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

    /// Whether the scheduler has given batch `s` up by `now`: it did not
    /// start by its planned end plus the scheduler's grace (and the control
    /// delay bound: this clock may run that far ahead of the plan's).
    fn given_up(&self, s: &BatchSlot, now: Instant) -> bool {
        self.plan_grace.is_some_and(|grace| now > s.exec_at + s.run + grace + self.cfg.control_delay)
    }

    /// Skips batch `si` unexecuted: its fetched tasks are answered
    /// `Abandoned` (the scheduler has failed them back already; a
    /// frontend keeps the first answer), and its `BatchDone` reports
    /// nothing run.
    fn skip(&mut self, si: usize) {
        let s = &mut self.slots[si];
        for t in &mut s.tasks {
            if t.phase == TaskPhase::Arrived {
                t.phase = TaskPhase::Failed(TaskStatus::Abandoned);
            }
        }
        s.phase = Phase::Sending;
        self.stats.plans_skipped += 1;
    }
}
