//! Step 6: one completion per task, then the batch's `BatchDone`.

use dataplane::mutation::{self, Mutation};
use dataplane::time::{Duration, Instant};
use dataplane::transport::{Connection, Error};
use dataplane::wire::{self, BatchDone, CompletionHead, OutputKind, TaskStatus};

use super::{BatchReport, BatchWorker, Phase, TaskPhase};
use crate::exec::Executor;

impl<C: Connection, E: Executor> BatchWorker<C, E> {
    // ---- 6. results ------------------------------------------------------

    pub(super) fn send_results(&mut self, now: Instant) -> bool {
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
    pub(super) fn send_completion(&mut self, si: usize, ti: usize, now: Instant) -> bool {
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
            // The scheduler's capability for this task, handed back: the
            // frontend takes the completion only if it verifies for us.
            backend_id: self.backend_id,
            capability: t.capability,
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

    pub(super) fn finish_batch(&mut self, si: usize) {
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
