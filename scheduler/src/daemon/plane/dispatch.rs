//! Dispatch: the one translation of the plane's decisions into wire
//! messages (acknowledgements, announcements, drops, failed-back tasks,
//! forwarded completions, batch plans), written into the [`Outbox`] in
//! the order they are decided. It owns the outbox and counts what it
//! sends or cannot deliver; it decides nothing: whether a frontend is
//! live is the caller's (membership's) word.
//!
//! With a join token every planned task carries a capability
//! ([`dataplane::capability`]): the scheduler's MAC over (backend, frontend,
//! task, input), which the backend hands back in the task's completion and
//! the frontend checks, so a member backend cannot answer a task planned to
//! another one. Without a token (open membership) tasks go unsigned.

use std::sync::Arc;

use dataplane::capability::{Capability, CapabilityKey, Grant, CAPABILITY_LEN};
use dataplane::time::Instant;
use dataplane::wire::{
    self, BatchPlanHead, BatchPlanWriter, BatchTask, BenchStamp, CompletionHead, DropReason, OutputKind, Register, Role,
    TaskStatus,
};

use super::ledger::TaskLedger;
use super::outbox::{Outbox, PeerId};
use crate::daemon::metrics::SchedulerMetrics;
use crate::types::Request;

/// Messages out (see the module docs).
pub(super) struct Dispatch {
    out: Outbox,
    metrics: Arc<SchedulerMetrics>,
    /// Signs each planned task; none: open membership (tasks unsigned).
    capabilities: Option<CapabilityKey>,
}

impl Dispatch {
    pub(super) fn new(metrics: Arc<SchedulerMetrics>) -> Self {
        Dispatch { out: Outbox::new(), metrics, capabilities: None }
    }

    /// Planned tasks are signed with `key` from now on (none: unsigned).
    pub(super) fn set_capability_key(&mut self, key: Option<CapabilityKey>) {
        self.capabilities = key;
    }

    /// The messages waiting to be sent.
    pub(super) fn outbox(&mut self) -> &mut Outbox {
        &mut self.out
    }

    /// A registration's acknowledgement: the model count, the epoch and
    /// `d_ctrl`.
    pub(super) fn welcome(&mut self, to: PeerId, welcome: &wire::Welcome) {
        self.out.push(to, |b| wire::encode(b, welcome));
    }

    /// Tells `backend` where frontend `frontend` takes READs.
    pub(super) fn announce_frontend(&mut self, backend: u32, frontend: u32, endpoint: &str) {
        let r = Register::new(Role::Frontend, frontend, 0, endpoint);
        self.out.push(PeerId::Backend(backend), |b| wire::encode(b, &r));
    }

    /// A task of a batch that will not finish goes back to its frontend
    /// as abandoned (`live`: the frontend is registered): the batch, not
    /// the task, failed, so a frontend may try the task again.
    pub(super) fn fail_back(&mut self, task: u64, frontend: u32, live: bool) {
        self.metrics.failed_back.inc();
        if !live {
            self.metrics.undeliverable.inc();
            return;
        }
        let head = CompletionHead {
            task_id: task,
            status: TaskStatus::Abandoned as u32,
            output_kind: OutputKind::None as u32,
            ..CompletionHead::default()
        };
        self.out.push(PeerId::Frontend(frontend), |b| wire::encode_completion(b, &head, &[]));
    }

    /// A `Dropped` to `frontend` (`live`: it is registered); `attempt` is
    /// named only by a moved answer (the wire's `reserved` word, zero
    /// otherwise).
    pub(super) fn drop(&mut self, task: u64, frontend: u32, reason: DropReason, attempt: u16, live: bool) {
        self.metrics.count_drop(reason);
        if !live {
            self.metrics.undeliverable.inc();
            return;
        }
        let d = wire::Dropped { task_id: task, reason: reason.code(), reserved: u32::from(attempt) };
        self.out.push(PeerId::Frontend(frontend), |b| wire::encode(b, &d));
    }

    /// A completion a backend could not deliver, forwarded to its
    /// frontend (`live`: registered; otherwise counted undeliverable).
    /// With capabilities on, an unsigned one is not forwarded (counted
    /// undeliverable): only the scheduler's own answers are unsigned, and
    /// the frontend takes those (failures) from this link unchecked.
    pub(super) fn forward(&mut self, frontend: u32, msg: &[u8], live: bool, signed: bool) {
        if !live || (self.capabilities.is_some() && !signed) {
            self.metrics.undeliverable.inc();
            return;
        }
        self.metrics.forwarded.inc();
        self.out.push(PeerId::Frontend(frontend), |b| {
            let n = msg.len();
            b.get_mut(..n).ok_or(wire::WireError::BufferTooSmall)?.copy_from_slice(msg);
            Ok(n)
        });
    }

    /// Benchmark only: the stamp that precedes a plan.
    pub(super) fn bench_stamp(&mut self, backend: u32, stamp: &BenchStamp) {
        self.out.push(PeerId::Backend(backend), |buf| wire::encode(buf, stamp));
    }

    /// A batch plan to `backend`: every member still waiting in the
    /// ledger leaves it and is written into the plan, and its (task,
    /// frontend) is appended to `list` (the batch's record).
    pub(super) fn plan(
        &mut self,
        now: Instant,
        backend: u32,
        head: &BatchPlanHead,
        members: &[Request],
        ledger: &mut TaskLedger,
        list: &mut Vec<(u64, u32)>,
    ) {
        let key = self.capabilities.as_ref();
        self.out.push(PeerId::Backend(backend), |buf| {
            let mut w = BatchPlanWriter::new(buf, head)?;
            for r in members {
                if let Some((id, m)) = ledger.take(r.id) {
                    let grant = Grant { backend, frontend: m.frontend, task: id, input: m.input };
                    w.push(&BatchTask {
                        task_id: id,
                        frontend_id: m.frontend,
                        queued_us: queued_us(now, r.arrival),
                        input: m.input,
                        capability: sign(key, &grant),
                    })?;
                    list.push((id, m.frontend));
                }
            }
            Ok(w.finish())
        });
    }
}

/// `grant`'s capability under `key` (zero without one).
fn sign(key: Option<&CapabilityKey>, grant: &Grant) -> Capability {
    key.map_or([0u8; CAPABILITY_LEN], |k| k.sign(grant))
}

/// A task's time from its ingress to `now` (its plan's sending), µs, as
/// [`BatchTask::queued_us`] carries it.
fn queued_us(now: Instant, arrival: Instant) -> u32 {
    u32::try_from(now.saturating_since(arrival).as_nanos() / 1_000).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane::join::JoinToken;

    fn completion(capability: Capability) -> Vec<u8> {
        let head = CompletionHead { task_id: 5, backend_id: 2, capability, ..CompletionHead::default() };
        let mut buf = vec![0u8; 256];
        let n = wire::encode_completion(&mut buf, &head, &[]).unwrap();
        buf.truncate(n);
        buf
    }

    #[test]
    fn with_a_key_only_signed_completions_are_forwarded() {
        let metrics = Arc::new(SchedulerMetrics::new(&[]));
        let mut d = Dispatch::new(metrics.clone());
        // Open membership: forwarded as it came.
        d.forward(1, &completion([0u8; CAPABILITY_LEN]), true, false);
        assert_eq!(d.outbox().len(), 1);
        d.outbox().clear();
        let key = CapabilityKey::from_token(&JoinToken::new(b"correct horse battery staple").unwrap());
        d.set_capability_key(Some(key.clone()));
        d.forward(1, &completion([0u8; CAPABILITY_LEN]), true, false);
        assert!(d.outbox().is_empty(), "an unsigned completion is the scheduler's own kind: not relayed");
        assert_eq!(metrics.undeliverable.get(), 1);
        // Signed (the frontend checks the capability itself).
        d.forward(1, &completion([9u8; CAPABILITY_LEN]), true, true);
        assert_eq!(d.outbox().len(), 1);
        assert_eq!(metrics.forwarded.get(), 2);
    }

    #[test]
    fn tasks_are_signed_for_their_backend_and_input_only_with_a_key() {
        let key = CapabilityKey::from_token(&JoinToken::new(b"correct horse battery staple").unwrap());
        let g = Grant { backend: 2, frontend: 1, task: 5, input: wire::RemoteRef { key: 3, len: 8, offset: 64 } };
        assert_eq!(sign(None, &g), [0u8; CAPABILITY_LEN]);
        let cap = sign(Some(&key), &g);
        assert!(key.verify(&g, &cap));
        assert!(!key.verify(&Grant { backend: 3, ..g }, &cap));
    }
}
