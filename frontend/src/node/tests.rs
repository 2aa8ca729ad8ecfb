//! The node against in-memory peers on one thread (the `sim` transport).

use super::*;
use crate::metrics::Metrics;
use crate::models::ModelCatalog;
use crate::service::{ClusterService, InferenceService, SubmitError};
use crate::staging::{Outcome, StagingConfig, Ticket};
use dataplane::mem::{Access, Region};
use dataplane::transport::sim::{FaultConfig, NodeId, SimConn, SimNet, SimPeer};
use dataplane::transport::Domain;
use dataplane::time::Duration;
use dataplane::wire::{CompletionHead, Message, OutputKind, Register, Role, TaskStatus, Welcome};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

// ---- what the tests read from and write to a peer's end ------------

trait PeerExt {
    fn put<M: wire::FixedMessage>(&mut self, m: &M);
    fn put_completion(&mut self, task_id: u64, out: &[u8]);
    /// Every task received, in order (from `Task` and `Tasks`).
    fn tasks(&mut self) -> Vec<Task>;
    /// The tasks of each task message received.
    fn task_messages(&mut self) -> Vec<Vec<Task>>;
    fn heartbeats(&mut self) -> usize;
}

impl PeerExt for SimPeer {
    fn put<M: wire::FixedMessage>(&mut self, m: &M) {
        self.send(m).unwrap();
    }
    fn put_completion(&mut self, task_id: u64, out: &[u8]) {
        let head = CompletionHead {
            task_id,
            status: TaskStatus::Ok as u32,
            output_kind: OutputKind::Inline as u32,
            ..CompletionHead::default()
        };
        self.send_encoded(|b| wire::encode_completion(b, &head, out))
            .unwrap();
    }
    fn tasks(&mut self) -> Vec<Task> {
        self.task_messages().into_iter().flatten().collect()
    }
    fn task_messages(&mut self) -> Vec<Vec<Task>> {
        self.take_all()
            .iter()
            .filter_map(|m| match wire::decode(m) {
                Ok(Message::Task(t)) => Some(vec![t]),
                Ok(Message::Tasks(list)) => Some(list.iter().collect()),
                _ => None,
            })
            .collect()
    }
    fn heartbeats(&mut self) -> usize {
        self.take_all()
            .iter()
            .filter(|m| matches!(wire::decode(m), Ok(Message::Heartbeat(_))))
            .count()
    }
}

// ---- a frontend on one thread: service, staging, node ---------------

const T0: Instant = Instant::from_nanos(1_000_000_000);
const MS: Duration = Duration::from_millis(1);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The fake scheduler's challenge (it asks for no token).
const NONCE: [u8; wire::NONCE_LEN] = [9; wire::NONCE_LEN];

/// The fake scheduler's welcome for a list of `models`.
fn welcome(models: u32) -> Welcome {
    Welcome::new(models, 0, 0)
}

const FRONTEND: NodeId = 5;
const SCHEDULER: NodeId = 0;
/// Every data link's other end (backends, or impostors).
const PEER: NodeId = 1;
/// With groups: group g's scheduler is node `SCHEDULER_B + g`.
const SCHEDULER_B: NodeId = 10;

/// The node under test, its service, and the network its links run
/// on (messages arrive at the instant they are sent).
struct Frontend {
    net: SimNet,
    node: FrontendNode<SimConn>,
    service: ClusterService<NetSink>,
}

fn frontend() -> Frontend {
    frontend_coalescing(DEFAULT_COALESCE, Duration::ZERO)
}

/// A frontend sending up to `coalesce` tasks per message, holding a
/// part batch up to `wait`.
fn frontend_coalescing(coalesce: usize, wait: Duration) -> Frontend {
    let specs = scheduler::zoo::cluster_models(
        "a100",
        "none",
        &["m0=1,1,500".to_string(), "m1=1,2,500".to_string()],
    )
    .unwrap();
    let catalog = ModelCatalog::with_default_tensors(&specs);
    let slot_size = catalog.max_input_bytes() as u32;
    let net = SimNet::new(0, FaultConfig::same_instant());
    let region = Region::anonymous(slot_size as usize * 8).unwrap();
    let staging = Staging::new(
        net.domain(FRONTEND)
            .register(&region, Access::REMOTE_READ)
            .unwrap(),
        StagingConfig {
            frontend_id: 5,
            slots: 8,
            slot_size,
            max_output: catalog.max_output_bytes() as u32,
        },
    )
    .unwrap();
    let (sink, tasks) = NetSink::new(4, None);
    let node = FrontendNode::new(
        FrontendNodeConfig {
            id: 5,
            data_endpoint: "mem:frontend-5".into(),
            models: 2,
            heartbeat: ms(100),
            dead_after: ms(1000),
            handshake_timeout: ms(5000),
            coalesce,
            coalesce_wait: wait,
        },
        staging.clone(),
        tasks,
    );
    let metrics = Arc::new(Metrics::new(&catalog));
    let service = ClusterService::new(Arc::new(catalog), staging, sink, metrics, ms(100))
        .with_ready(node.stats().ready.clone());
    Frontend { net, node, service }
}

impl Frontend {
    fn submit(&self) -> Result<Ticket, SubmitError> {
        let len = self.service.catalog().by_id(0).unwrap().input.byte_len() as usize;
        self.service.submit(0, &vec![1u8; len], ms(400), Default::default())
    }
    fn events(&mut self) -> Vec<FrontendEvent> {
        std::iter::from_fn(|| self.node.poll_event()).collect()
    }
    /// Moves the clock to `now` and polls the node once.
    fn poll(&mut self, now: Instant) -> bool {
        self.net.set_now(now);
        self.node.poll(now)
    }
    /// A new link from this frontend to `peer`: ours, theirs.
    fn link(&self, peer: NodeId) -> (SimConn, SimPeer) {
        let (ours, theirs) = self.net.link(FRONTEND, peer).unwrap();
        (ours, SimPeer::new(theirs))
    }
    /// Hands over a scheduler link and completes the handshake at `T0`;
    /// returns the scheduler's end.
    fn registered(&mut self) -> SimPeer {
        self.registered_at(T0)
    }
    /// [`registered`](Self::registered) at `now`.
    fn registered_at(&mut self, now: Instant) -> SimPeer {
        let (ours, mut sched) = self.link(SCHEDULER);
        self.node.handle_scheduler_link(now, ours);
        sched.challenge(NONCE).unwrap();
        assert!(self.poll(now));
        assert!(sched.take_join().is_some());
        sched.put(&welcome(2));
        assert!(self.poll(now));
        assert_eq!(self.events(), [FrontendEvent::Registered { group: 0, models: 2 }]);
        sched.take_all();
        sched
    }
    /// [`registered`](Self::registered) on a link whose send queue
    /// holds `capacity` unread messages.
    fn registered_with_capacity(&mut self, capacity: usize) -> SimPeer {
        let (mut ours, mut sched) = self.link(SCHEDULER);
        ours.set_send_capacity(Some(capacity));
        self.node.handle_scheduler_link(T0, ours);
        sched.challenge(NONCE).unwrap();
        assert!(self.poll(T0));
        assert!(sched.take_join().is_some());
        sched.put(&welcome(2));
        assert!(self.poll(T0));
        assert_eq!(self.events(), [FrontendEvent::Registered { group: 0, models: 2 }]);
        sched.take_all();
        sched
    }
    /// With groups: group `g`'s scheduler link (its own peer node),
    /// registered at `now`; returns the scheduler's end.
    fn registered_group(&mut self, now: Instant, g: usize) -> SimPeer {
        let (ours, mut sched) = self.link(SCHEDULER_B + g as NodeId);
        self.node.handle_group_link(now, g, ours);
        sched.challenge(NONCE).unwrap();
        assert!(self.poll(now));
        assert!(sched.take_join().is_some());
        sched.put(&welcome(2));
        assert!(self.poll(now));
        assert_eq!(self.events(), [FrontendEvent::Registered { group: g as u16, models: 2 }]);
        sched.take_all();
        sched
    }
    /// A request for model `m`.
    fn submit_model(&self, m: u32) -> Ticket {
        let len = self.service.catalog().by_id(m).unwrap().input.byte_len() as usize;
        self.service.submit(m, &vec![1u8; len], ms(400), Default::default()).unwrap()
    }
    /// Hands over a data link that registers as backend `id`.
    fn backend(&mut self, now: Instant, id: u32) -> SimPeer {
        let (ours, mut theirs) = self.link(PEER);
        self.node.handle_backend_link(now, ours);
        theirs.put(&Register::new(Role::Backend, id, 1, ""));
        assert!(self.poll(now));
        theirs
    }
}

fn poll_now(t: &mut Ticket) -> Poll<Outcome> {
    Pin::new(t).poll(&mut Context::from_waker(std::task::Waker::noop()))
}

// ---- tests ----------------------------------------------------------

#[test]
fn registers_then_opens_the_sink_and_heartbeats_once_per_interval() {
    let mut f = frontend();
    assert!(!f.service.ready());
    assert_eq!(
        f.submit().unwrap_err(),
        SubmitError::SendFailed("not registered with the scheduler".into())
    );
    assert_eq!(f.node.poll_at(), None);

    let (ours, mut sched) = f.link(SCHEDULER);
    f.node.handle_scheduler_link(T0, ours);
    assert_eq!(f.node.poll_at(), Some(T0 + ms(5000)));
    // It answers the challenge with its Join (no token: no MAC).
    sched.challenge(NONCE).unwrap();
    assert!(f.poll(T0));
    let sent = sched.take_all();
    assert_eq!(sent.len(), 1);
    match wire::decode(&sent[0]) {
        Ok(Message::Join(j)) => {
            assert_eq!(j.role(), Some(Role::Frontend));
            assert_eq!((j.id, j.count, j.endpoint()), (5, 0, "mem:frontend-5"));
            assert!(!j.has_mac());
        }
        other => panic!("{other:?}"),
    }
    // Nothing until the ack; a heartbeat first is fine.
    assert!(!f.poll(T0));
    assert!(!f.node.is_registered());
    sched.put(&wire::Heartbeat {
        seq: 1,
        role: Role::Scheduler as u32,
        id: 0,
    });
    sched.put(&welcome(2));
    assert!(f.poll(T0 + MS));
    assert_eq!(f.events(), [FrontendEvent::Registered { group: 0, models: 2 }]);
    assert!(f.node.is_registered() && f.service.ready());
    assert!(f.node.stats().ready.load(Ordering::Relaxed));

    // The first heartbeat is due at once; time standing still sends no
    // second one, and an earlier `now` counts as the latest seen.
    assert_eq!(f.node.poll_at(), Some(T0 + MS));
    f.poll(T0 + MS);
    f.poll(T0 + MS);
    f.poll(T0);
    assert_eq!(sched.heartbeats(), 1);
    assert_eq!(f.node.poll_at(), Some(T0 + MS + ms(100)));
    f.poll(T0 + MS + ms(100));
    assert_eq!(sched.heartbeats(), 1);
    assert!(f.events().is_empty());
}

#[test]
fn a_closed_link_a_model_mismatch_or_no_ack_in_time_is_a_refusal() {
    let mut f = frontend();
    // The scheduler hangs up: refused (duplicate id?).
    let (ours, sched) = f.link(SCHEDULER);
    f.node.handle_scheduler_link(T0, ours);
    f.poll(T0);
    drop(sched);
    f.poll(T0);
    match f.events().as_slice() {
        [FrontendEvent::Refused { why, .. }] => assert!(why.contains("refused"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(
        f.node.take_closed_link().is_some(),
        "the link is handed back"
    );
    assert_eq!(f.node.poll_at(), None);

    // Another model count.
    let (ours, mut sched) = f.link(SCHEDULER);
    f.node.handle_scheduler_link(T0, ours);
    sched.challenge(NONCE).unwrap();
    f.poll(T0);
    sched.put(&welcome(3));
    f.poll(T0);
    match f.events().as_slice() {
        [FrontendEvent::Refused { why, .. }] => assert!(why.contains("same --zoo"), "{why}"),
        other => panic!("{other:?}"),
    }

    // Silence after the Join: refused when the clock jumps to the
    // handshake deadline.
    let (ours, mut sched) = f.link(SCHEDULER);
    f.node.handle_scheduler_link(T0, ours);
    sched.challenge(NONCE).unwrap();
    f.poll(T0);
    assert!(sched.take_join().is_some());
    let deadline = f.node.poll_at().unwrap();
    assert_eq!(deadline, T0 + ms(5000));
    f.poll(deadline.saturating_sub(Duration::from_nanos(1)));
    assert!(f.events().is_empty());
    f.poll(deadline);
    match f.events().as_slice() {
        [FrontendEvent::Refused { why, .. }] => {
            assert!(
                why.contains("did not acknowledge") && why.contains("5 s"),
                "{why}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert!(!f.node.is_registered() && !f.service.ready());
}

#[test]
fn queued_tasks_leave_as_one_tasks_message_and_a_lone_task_as_a_task() {
    let mut f = frontend();
    let mut sched = f.registered();
    let tickets: Vec<Ticket> = (0..3).map(|_| f.submit().unwrap()).collect();
    let ids: Vec<u64> = tickets.iter().map(Ticket::task_id).collect();
    assert!(f.poll(T0));
    let raw: Vec<Vec<u8>> =
        sched.take_all().into_iter().filter(|m| !matches!(wire::decode(m), Ok(Message::Heartbeat(_)))).collect();
    assert_eq!(raw.len(), 1, "one message for the pass");
    match wire::decode(&raw[0]) {
        Ok(Message::Tasks(list)) => assert_eq!(list.iter().map(|t| t.task_id).collect::<Vec<_>>(), ids),
        other => panic!("{other:?}"),
    }
    assert_eq!(f.node.stats().tasks_sent.load(Ordering::Relaxed), 3);
    assert_eq!(f.node.stats().task_messages_sent.load(Ordering::Relaxed), 1);
    let lone = f.submit().unwrap();
    let id = lone.task_id();
    assert!(f.poll(T0));
    let raw = sched.take_all();
    assert!(matches!(wire::decode(&raw[0]), Ok(Message::Task(t)) if t.task_id == id), "a lone task is a Task");
    assert!(!f.poll(T0), "nothing staged");
}

#[test]
fn a_batch_the_send_queue_has_no_room_for_stays_staged_and_leaves_once_in_order() {
    let mut f = frontend_coalescing(2, Duration::ZERO);
    let mut sched = f.registered_with_capacity(1);
    let tickets: Vec<Ticket> = (0..4).map(|_| f.submit().unwrap()).collect();
    let ids: Vec<u64> = tickets.iter().map(Ticket::task_id).collect();
    assert!(f.poll(T0));
    assert_eq!(f.node.stats().tasks_sent.load(Ordering::Relaxed), 2);
    // Still no room: nothing leaves, nothing is lost.
    f.poll(T0);
    assert_eq!(f.node.poll_at(), Some(T0 + ms(100)), "a full queue sets no timer (the heartbeat's)");
    assert_eq!(ids_of(&sched.task_messages()), [ids[..2].to_vec()]);
    assert!(f.poll(T0));
    assert_eq!(ids_of(&sched.task_messages()), [ids[2..].to_vec()]);
    assert_eq!(f.node.stats().tasks_sent.load(Ordering::Relaxed), 4);
    assert_eq!(f.node.stats().task_messages_sent.load(Ordering::Relaxed), 2, "a refused message is not counted");
    assert!(!f.poll(T0));
    assert!(sched.tasks().is_empty(), "each task once");
}

fn ids_of(msgs: &[Vec<Task>]) -> Vec<Vec<u64>> {
    msgs.iter().map(|m| m.iter().map(|t| t.task_id).collect()).collect()
}

#[test]
fn with_a_hold_window_a_part_batch_waits_for_it_and_a_full_one_does_not() {
    let wait = Duration::from_micros(50);
    let mut f = frontend_coalescing(3, wait);
    let mut sched = f.registered();
    let ta = f.submit().unwrap();
    let a = ta.task_id();
    f.poll(T0);
    assert!(sched.tasks().is_empty(), "held for the window");
    assert_eq!(f.node.poll_at(), Some(T0 + wait));
    let tb = f.submit().unwrap();
    let b = tb.task_id();
    f.poll(T0 + Duration::from_micros(20));
    assert!(sched.tasks().is_empty(), "the window counts from the oldest");
    assert_eq!(f.node.poll_at(), Some(T0 + wait));
    assert!(f.poll(T0 + wait));
    assert_eq!(ids_of(&sched.task_messages()), [vec![a, b]]);
    assert_eq!(f.node.poll_at(), Some(T0 + ms(100)), "no window without staged tasks");
    let tickets: Vec<Ticket> = (0..3).map(|_| f.submit().unwrap()).collect();
    let ids: Vec<u64> = tickets.iter().map(Ticket::task_id).collect();
    assert!(f.poll(T0 + wait));
    assert_eq!(sched.tasks().iter().map(|t| t.task_id).collect::<Vec<_>>(), ids, "a full batch leaves at once");
}

#[test]
fn a_task_goes_out_and_its_drop_reaches_the_ticket() {
    let mut f = frontend();
    let mut sched = f.registered();
    let mut ticket = f.submit().unwrap();
    assert!(f.node.has_queued_tasks());
    assert!(f.poll(T0));
    let tasks = sched.tasks();
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0].task_id, ticket.task_id());
    assert_eq!((tasks[0].model_id, tasks[0].frontend_id), (0, 5));
    assert_eq!(f.node.stats().tasks_sent.load(Ordering::Relaxed), 1);
    assert!(poll_now(&mut ticket).is_pending());

    sched.put(&wire::Dropped {
        task_id: ticket.task_id(),
        reason: DropReason::Overloaded as u32,
        reserved: 0,
    });
    assert!(f.poll(T0));
    assert_eq!(
        poll_now(&mut ticket),
        Poll::Ready(Outcome::Dropped(DropReason::Overloaded))
    );
    let c = f.service.counters();
    assert!(c.balanced() && (c.accepted, c.dropped) == (1, 1), "{c:?}");
}

#[test]
fn a_cancel_answers_at_once_goes_to_the_scheduler_and_the_slot_frees_with_the_outcome() {
    let mut f = frontend();
    let mut sched = f.registered();
    let mut queued = f.submit().unwrap();
    let mut planned = f.submit().unwrap();
    assert!(f.poll(T0));
    assert_eq!(sched.tasks().len(), 2);

    assert!(f.service.sink().cancel(&mut queued));
    assert_eq!(
        poll_now(&mut queued),
        Poll::Ready(Outcome::Dropped(DropReason::Cancelled))
    );
    assert!(f.node.has_queued_tasks());
    assert!(f.poll(T0));
    let cancels: Vec<u64> = sched
        .take_all()
        .iter()
        .filter_map(|m| match wire::decode(m) {
            Ok(Message::Cancel(c)) => Some(c.task_id),
            _ => None,
        })
        .collect();
    assert_eq!(cancels, [queued.task_id()]);
    assert_eq!(f.node.stats().cancels_sent.load(Ordering::Relaxed), 1);
    // The slot is held until the scheduler's answer (a backend might
    // still READ it), which is then discarded.
    assert_eq!(f.node.staging().in_flight(), 2);
    sched.put(&wire::Dropped {
        task_id: queued.task_id(),
        reason: DropReason::Cancelled as u32,
        reserved: 0,
    });
    assert!(f.poll(T0));
    assert_eq!(f.node.staging().in_flight(), 1);

    // Already planned: the backend's result comes and is discarded.
    let mut backend = f.backend(T0, 9);
    assert!(f.service.sink().cancel(&mut planned));
    backend.put_completion(planned.task_id(), b"output");
    f.poll(T0);
    assert_eq!(f.node.staging().in_flight(), 0);
    let c = f.service.counters();
    assert!(c.balanced(), "{c:?}");
    assert_eq!((c.accepted, c.cancelled, c.succeeded, c.dropped, c.late), (2, 2, 0, 0, 0), "{c:?}");

    // Too late to cancel: the outcome is already here and still yields.
    let mut done = f.submit().unwrap();
    f.poll(T0);
    sched.put(&wire::Dropped {
        task_id: done.task_id(),
        reason: DropReason::Overloaded as u32,
        reserved: 0,
    });
    f.poll(T0);
    assert!(!f.service.sink().cancel(&mut done));
    assert_eq!(
        poll_now(&mut done),
        Poll::Ready(Outcome::Dropped(DropReason::Overloaded))
    );
    assert!(f.service.counters().balanced());
}

#[test]
fn a_backend_completion_is_delivered_once_and_a_duplicate_is_counted() {
    let mut f = frontend();
    let mut sched = f.registered();
    let mut backend = f.backend(T0, 9);
    assert_eq!(f.events(), [FrontendEvent::BackendJoined(9)]);
    assert_eq!(f.node.stats().backends.load(Ordering::Relaxed), 1);

    let mut ticket = f.submit().unwrap();
    f.poll(T0);
    let id = sched.tasks()[0].task_id;
    // Delivered twice by the network: one outcome, one duplicate.
    backend.put_completion(id, b"output");
    backend.put_completion(id, b"output");
    assert!(f.poll(T0));
    assert_eq!(
        poll_now(&mut ticket),
        Poll::Ready(Outcome::Ok(b"output".to_vec()))
    );
    drop(ticket);
    // A third copy after the slot is free names nothing in flight.
    backend.put_completion(id, b"output");
    f.poll(T0);
    let c = f.service.counters();
    assert_eq!(
        (c.accepted, c.succeeded, c.duplicates, c.unroutable),
        (1, 1, 1, 1),
        "{c:?}"
    );
    assert!(c.balanced());
    assert_eq!(f.node.stats().bad_messages.load(Ordering::Relaxed), 0);
    assert!(f.events().is_empty());
}

#[test]
fn with_failover_requests_outlive_the_scheduler_and_are_resent_with_the_budget_left() {
    let mut f = frontend();
    f.node = std::mem::replace(&mut f.node, frontend().node).with_failover(true);
    assert!(f.node.failover());
    let sched = f.registered();
    let mut sent: Vec<Ticket> = (0..2).map(|_| f.submit().unwrap()).collect();
    f.poll(T0);
    let cancelled = f.submit().unwrap();
    f.poll(T0);
    drop(cancelled); // its client has gone: never resent
    let queued = f.submit().unwrap(); // not sent yet
    drop(sched);
    assert!(f.poll(T0 + MS));
    assert!(matches!(
        f.events().as_slice(),
        [FrontendEvent::SchedulerLost { why, .. }] if why.contains("sending a task")
    ));
    assert!(f.node.take_closed_link().is_some());
    assert!(!f.service.ready(), "not ready while no scheduler is linked");
    for t in &mut sent {
        assert_eq!(poll_now(t), Poll::Pending, "held, not ended");
    }
    // Taken while the scheduler is away; held too.
    let during = f.submit().unwrap();
    f.poll(T0 + ms(2));
    assert!(f.node.poll_at().is_some(), "the sweep is timed");
    let back = T0 + ms(100);
    let mut sched = f.registered_at(back);
    assert!(f.service.ready());
    f.poll(back);
    let resent = sched.tasks();
    let ids: Vec<u64> = resent.iter().map(|t| t.task_id).collect();
    let want: Vec<u64> = [&sent[0], &sent[1], &queued, &during].iter().map(|t| t.task_id()).collect();
    assert_eq!(ids.len(), 4, "{resent:?}");
    for id in &want {
        assert!(ids.contains(id), "{id:x} resent");
    }
    let first = resent.iter().find(|t| t.task_id == want[0]).unwrap();
    let late = resent.iter().find(|t| t.task_id == want[3]).unwrap();
    assert!(first.budget_ns < late.budget_ns, "the budget left counts from the first send");
    assert!(first.budget_ns <= ms(400).as_nanos() - ms(100).as_nanos());
    let c = f.service.counters();
    // The request given up is ended (freeing its slot), not resent.
    assert_eq!((c.accepted, c.dropped, c.failed), (5, 1, 0), "{c:?}");
}

// ---- scheduler groups (issue 19) -------------------------------------

fn grouped() -> Frontend {
    let mut f = frontend();
    f.node = std::mem::replace(&mut f.node, frontend().node).with_groups(2);
    assert!(f.node.failover(), "groups imply holding tasks");
    f
}

/// A group's `moved` answer to submission `attempt` of `task_id`.
fn moved(task_id: u64, attempt: u16) -> wire::Dropped {
    wire::Dropped { task_id, reason: DropReason::Moved as u32, reserved: u32::from(attempt) }
}

#[test]
fn with_groups_each_task_goes_to_its_owner_and_a_moved_one_is_resubmitted_with_the_budget_left() {
    let mut f = grouped();
    assert!(f.node.handle_routes(1, &[Some(0), Some(1)]));
    assert!(!f.node.handle_routes(1, &[Some(1), Some(1)]), "the same revision again is ignored");
    let mut a = f.registered_group(T0, 0);
    let mut b = f.registered_group(T0, 1);
    let (mut t0, t1) = (f.submit_model(0), f.submit_model(1));
    f.poll(T0);
    assert_eq!(a.tasks().iter().map(|t| t.task_id).collect::<Vec<_>>(), [t0.task_id()]);
    assert_eq!(b.tasks().iter().map(|t| t.task_id).collect::<Vec<_>>(), [t1.task_id()]);
    // Model 0 moves to group 1; group 0 hands its task back.
    let at = T0 + ms(10);
    assert!(f.node.handle_routes(2, &[Some(1), Some(1)]));
    a.put(&moved(t0.task_id(), 0));
    f.poll(at);
    f.poll(at);
    assert!(poll_now(&mut t0).is_pending(), "taken back, not ended");
    let resent = b.tasks();
    assert_eq!(resent.len(), 1, "{resent:?}");
    assert_eq!(resent[0].task_id, t0.task_id());
    assert_eq!(resent[0].budget_ns, ms(390).as_nanos(), "the budget left, same deadline");
    assert!(a.tasks().is_empty());
    assert_eq!(f.node.stats().moved_taken_back.load(Ordering::Relaxed), 1);
    assert!(!f.node.take_stale_table(), "sent by an older table: this one is not stale");
    // Its new owner answers: the one outcome reaches the ticket.
    b.put(&wire::Dropped { task_id: t0.task_id(), reason: DropReason::Overloaded as u32, reserved: 0 });
    f.poll(at);
    assert_eq!(poll_now(&mut t0), Poll::Ready(Outcome::Dropped(DropReason::Overloaded)));
    // New tasks of model 0 now go to group 1.
    let t2 = f.submit_model(0);
    f.poll(at);
    assert_eq!(b.tasks().iter().map(|t| t.task_id).collect::<Vec<_>>(), [t2.task_id()]);
}

#[test]
fn with_groups_each_group_gets_one_batch_and_a_task_of_a_batch_answered_moved_is_resubmitted_alone() {
    let mut f = grouped();
    assert!(f.node.handle_routes(1, &[Some(0), Some(1)]));
    let mut a = f.registered_group(T0, 0);
    let mut b = f.registered_group(T0, 1);
    let mut t = [f.submit_model(0), f.submit_model(1), f.submit_model(0), f.submit_model(1)];
    f.poll(T0);
    let ids = |x: &[usize], t: &[Ticket]| vec![x.iter().map(|&i| t[i].task_id()).collect::<Vec<_>>()];
    assert_eq!(ids_of(&a.task_messages()), ids(&[0, 2], &t), "one batch per group, in order");
    assert_eq!(ids_of(&b.task_messages()), ids(&[1, 3], &t));
    // Model 0 moves to group 1; group 0 hands back one task of its batch.
    let at = T0 + ms(10);
    assert!(f.node.handle_routes(2, &[Some(1), Some(1)]));
    a.put(&moved(t[2].task_id(), 0));
    f.poll(at);
    f.poll(at);
    assert!(poll_now(&mut t[2]).is_pending(), "taken back, not ended");
    assert_eq!(ids_of(&b.task_messages()), ids(&[2], &t), "only the task handed back");
    assert!(a.tasks().is_empty());
    assert_eq!(f.node.stats().moved_taken_back.load(Ordering::Relaxed), 1);
    assert_eq!(f.node.stats().tasks_sent.load(Ordering::Relaxed), 5);
}

#[test]
fn with_groups_a_task_refused_by_the_owner_its_table_names_waits_for_a_change_or_its_retry_then_its_deadline() {
    let mut f = grouped();
    f.node.handle_routes(1, &[Some(0), Some(1)]);
    let mut a = f.registered_group(T0, 0);
    let mut b = f.registered_group(T0, 1);
    let mut t0 = f.submit_model(0);
    f.poll(T0);
    assert_eq!(a.tasks().len(), 1);
    // Group 0 says moved, but the frontend's table (revision 1) still
    // names it: nothing goes out before the retry time...
    a.put(&moved(t0.task_id(), 0));
    f.poll(T0);
    assert!(f.node.take_stale_table(), "the host may read the table now");
    assert!(!f.node.take_stale_table(), "once");
    f.poll(T0 + ms(2));
    assert!(a.tasks().is_empty() && b.tasks().is_empty());
    // ...then it is offered to the owner again (the owner may have
    // applied the revision late).
    let retry = T0 + MOVED_RETRY + ms(10);
    f.poll(retry);
    f.poll(retry);
    assert_eq!(a.tasks().iter().map(|t| t.task_id).collect::<Vec<_>>(), [t0.task_id()]);
    // Refused again; a new table sends it to group 1 at once.
    a.put(&moved(t0.task_id(), 1));
    f.poll(retry);
    assert!(f.node.handle_routes(2, &[Some(1), Some(1)]));
    f.poll(retry);
    f.poll(retry);
    assert_eq!(b.tasks().iter().map(|t| t.task_id).collect::<Vec<_>>(), [t0.task_id()]);
    b.put(&wire::Dropped { task_id: t0.task_id(), reason: DropReason::Overloaded as u32, reserved: 0 });
    f.poll(retry);
    assert_eq!(poll_now(&mut t0), Poll::Ready(Outcome::Dropped(DropReason::Overloaded)));
    // A group that keeps refusing: the task is offered again every
    // retry until its deadline, then ends as dropped `moved`, once.
    let mut t1 = f.submit_model(1);
    let mut at = retry;
    let mut offers = 0;
    while at < retry + ms(500) {
        f.poll(at);
        for t in b.tasks() {
            assert_eq!(t.task_id, t1.task_id());
            offers += 1;
            b.put(&moved(t.task_id, t.attempt()));
        }
        at += ms(5);
    }
    assert!((20..=100).contains(&offers), "{offers} offers in 400 ms");
    assert_eq!(poll_now(&mut t1), Poll::Ready(Outcome::Dropped(DropReason::Moved)));
    let c = f.service.counters();
    assert!(c.balanced(), "{c:?}");
}

#[test]
fn with_groups_losing_one_group_holds_its_tasks_for_its_next_link_and_cancels_go_to_the_tasks_group() {
    let mut f = grouped();
    // Before the first table, tasks wait (the sink opens at the first
    // registration).
    let mut a = f.registered_group(T0, 0);
    let early = f.submit_model(0);
    f.poll(T0);
    assert!(a.tasks().is_empty(), "no table yet");
    f.node.handle_routes(1, &[Some(0), Some(1)]);
    f.poll(T0);
    assert_eq!(a.tasks().iter().map(|t| t.task_id).collect::<Vec<_>>(), [early.task_id()]);
    let b = f.registered_group(T0, 1);
    let mut t1 = f.submit_model(1);
    f.poll(T0);
    drop(b);
    let t0 = f.submit_model(0);
    f.poll(T0 + MS);
    assert!(matches!(f.events().as_slice(), [FrontendEvent::SchedulerLost { group: 1, .. }]));
    assert!(f.service.ready(), "group 0 still serves");
    assert_eq!(a.tasks().iter().map(|t| t.task_id).collect::<Vec<_>>(), [t0.task_id()]);
    assert!(poll_now(&mut t1).is_pending(), "held for group 1");
    let mut b = f.registered_group(T0 + ms(50), 1);
    f.poll(T0 + ms(50));
    let resent = b.tasks();
    assert_eq!(resent.iter().map(|t| t.task_id).collect::<Vec<_>>(), [t1.task_id()]);
    assert_eq!(resent[0].budget_ns, ms(350).as_nanos());
    // A cancel goes to the group that has the task.
    let mut t0 = t0;
    assert!(f.service.cancel(&mut t0));
    f.poll(T0 + ms(50));
    let cancels = |p: &mut SimPeer| p.take_all().iter().filter(|m| matches!(wire::decode(m), Ok(Message::Cancel(_)))).count();
    assert_eq!((cancels(&mut a), cancels(&mut b)), (1, 0));
    assert_eq!(f.node.stats().cancels_sent.load(Ordering::Relaxed), 1);
}

/// A group the table adds after the start: the node grows a link for
/// it, and tasks of a model the table gives it wait for that link.
#[test]
fn with_groups_a_group_added_later_gets_a_link_and_its_models_tasks() {
    let mut f = grouped();
    assert!(f.node.handle_routes(1, &[Some(0), Some(0)]));
    let mut a = f.registered_group(T0, 0);
    assert_eq!(f.node.add_group(), Some(2));
    assert_eq!(f.node.groups(), 3);
    assert!(f.node.handle_routes(2, &[Some(0), Some(2)]));
    let (t0, t1) = (f.submit_model(0), f.submit_model(1));
    f.poll(T0);
    assert_eq!(a.tasks().iter().map(|x| x.task_id).collect::<Vec<_>>(), [t0.task_id()]);
    let at = T0 + ms(5);
    let mut c = f.registered_group(at, 2);
    f.poll(at);
    assert_eq!(c.tasks().iter().map(|x| x.task_id).collect::<Vec<_>>(), [t1.task_id()], "held until the new group's link registered");
    let mut plain = frontend();
    assert_eq!(plain.node.add_group(), None, "without groups there is one scheduler");
    plain.poll(T0);
}

/// A task at a group whose link is lost goes back to that group, not
/// to the model's new owner: the lost scheduler may have sent it in a
/// batch its group's backends still run. Only that group's `moved`
/// sends it on.
#[test]
fn with_groups_a_task_lost_with_its_groups_link_goes_back_to_that_group_even_after_its_model_moved() {
    let mut f = grouped();
    assert!(f.node.handle_routes(1, &[Some(0), Some(1)]));
    let a = f.registered_group(T0, 0);
    let mut b = f.registered_group(T0, 1);
    let mut t = f.submit_model(0);
    f.poll(T0);
    drop(a);
    assert!(f.node.handle_routes(2, &[Some(1), Some(1)]), "model 0 moves to group 1");
    for i in 1..=20 {
        f.poll(T0 + ms(i));
    }
    assert!(b.tasks().is_empty(), "not sent to the new owner while its group's link is down");
    assert!(poll_now(&mut t).is_pending(), "held");
    assert!(matches!(f.events().as_slice(), [FrontendEvent::SchedulerLost { group: 0, .. }]));
    let at = T0 + ms(30);
    let mut a = f.registered_group(at, 0);
    f.poll(at);
    let resent = a.tasks();
    assert_eq!(resent.iter().map(|x| (x.task_id, x.attempt())).collect::<Vec<_>>(), [(t.task_id(), 1)], "back to its group, as its next attempt");
    // A copy of an answer to the first attempt is stale: ignored.
    a.put(&moved(t.task_id(), 0));
    f.poll(at);
    f.poll(at);
    assert!(b.tasks().is_empty() && poll_now(&mut t).is_pending());
    // Group 0's next scheduler does not own model 0 any more: its
    // `moved` sends the task to group 1.
    a.put(&moved(t.task_id(), 1));
    f.poll(at);
    f.poll(at);
    assert!(!f.node.take_stale_table(), "its table names another group: not stale");
    assert_eq!(b.tasks().iter().map(|x| x.task_id).collect::<Vec<_>>(), [t.task_id()]);
    // A new task of model 0 goes to its owner at once.
    let t2 = f.submit_model(0);
    f.poll(at);
    assert_eq!(b.tasks().iter().map(|x| x.task_id).collect::<Vec<_>>(), [t2.task_id()]);
    assert!(a.tasks().is_empty());
}

#[test]
fn with_failover_a_request_that_cannot_be_held_within_its_deadline_is_answered_overloaded() {
    let mut f = frontend();
    f.node = std::mem::replace(&mut f.node, frontend().node).with_failover(true);
    let sched = f.registered();
    let mut t = f.submit().unwrap();
    f.poll(T0);
    drop(sched);
    f.poll(T0 + MS);
    assert_eq!(poll_now(&mut t), Poll::Pending);
    let mut now = T0 + MS;
    let outcome = loop {
        if let Poll::Ready(o) = poll_now(&mut t) {
            break o;
        }
        assert!(now < T0 + ms(1000), "never answered");
        now = f.node.poll_at().unwrap();
        f.poll(now);
    };
    assert_eq!(outcome, Outcome::Dropped(DropReason::Overloaded));
    assert!(now <= T0 + ms(400) + HOLD_SWEEP + MS, "answered within a sweep of its deadline: {now:?}");
    let c = f.service.counters();
    assert!(c.balanced(), "{c:?}");
    assert_eq!(f.node.staging().in_flight(), 0);
}

#[test]
fn losing_the_scheduler_ends_every_request_in_flight_once() {
    let mut f = frontend();
    let sched = f.registered();
    let mut sent: Vec<Ticket> = (0..2).map(|_| f.submit().unwrap()).collect();
    f.poll(T0);
    let orphan = f.submit().unwrap();
    f.poll(T0);
    drop(orphan); // its client has gone
    let mut queued = f.submit().unwrap(); // not sent yet
    drop(sched);

    // The queued task's send finds the link gone.
    assert!(f.poll(T0 + MS));
    assert!(matches!(
        f.events().as_slice(),
        [FrontendEvent::SchedulerLost { why, .. }] if why.contains("sending a task")
    ));
    for t in sent.iter_mut().chain([&mut queued]) {
        assert_eq!(
            poll_now(t),
            Poll::Ready(Outcome::Dropped(DropReason::Shutdown))
        );
    }
    let c = f.service.counters();
    assert_eq!((c.accepted, c.dropped, c.duplicates), (4, 4, 0), "{c:?}");
    assert!(c.balanced());
    assert!(f.node.take_closed_link().is_some());

    // Nothing more happens: no second event, no second outcome; new
    // requests are refused at once.
    f.poll(T0 + ms(5000));
    assert!(f.events().is_empty());
    assert!(!f.node.is_registered() && !f.service.ready());
    assert_eq!(f.node.poll_at(), None);
    assert!(matches!(f.submit(), Err(SubmitError::SendFailed(_))));
    let c = f.service.counters();
    assert_eq!((c.accepted, c.dropped, c.failed), (5, 4, 1), "{c:?}");
    assert!(c.balanced());
    assert_eq!(f.node.staging().in_flight(), 0);
}

#[test]
fn a_silent_scheduler_is_lost_just_past_the_timeout_on_a_jumping_clock() {
    let mut f = frontend();
    let mut sched = f.registered();
    let mut ticket = f.submit().unwrap();
    // Jump from deadline to deadline, as a virtual clock does.
    let mut polls = 0;
    let lost_at = loop {
        let at = f.node.poll_at().expect("a timer while registered");
        f.poll(at);
        polls += 1;
        if !f.events().is_empty() {
            break at;
        }
        assert!(polls < 100);
    };
    assert_eq!(lost_at, T0 + ms(1000) + Duration::from_nanos(1));
    // Heartbeats at 0, 100, ..., 1000 ms.
    assert_eq!(sched.heartbeats(), 11);
    assert_eq!(
        poll_now(&mut ticket),
        Poll::Ready(Outcome::Dropped(DropReason::Shutdown))
    );
    assert!(!f.node.is_registered());
}

#[test]
fn data_links_must_register_as_backends_in_time() {
    // (No scheduler link: its liveness would end it as the clock jumps.)
    let mut f = frontend();
    // Registers as something else.
    let (ours, mut other) = f.link(PEER);
    f.node.handle_backend_link(T0, ours);
    other.put(&Register::new(Role::Frontend, 1, 0, ""));
    // Sends something else first.
    let (ours, mut chatty) = f.link(PEER);
    f.node.handle_backend_link(T0, ours);
    chatty.put(&wire::Heartbeat {
        seq: 1,
        role: Role::Backend as u32,
        id: 3,
    });
    f.poll(T0);
    let why: Vec<String> = f
        .events()
        .into_iter()
        .map(|e| match e {
            FrontendEvent::LinkRefused { why } => why,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(why.len(), 2);
    assert!(why.iter().any(|w| w.contains("not a backend")), "{why:?}");
    assert!(
        why.iter().any(|w| w.contains("without Register")),
        "{why:?}"
    );
    assert_eq!(
        std::iter::from_fn(|| f.node.take_closed_link()).count(),
        2,
        "refused links are handed back"
    );

    // Silent: refused at its handshake deadline.
    let (ours, _silent) = f.link(PEER);
    f.node.handle_backend_link(T0 + MS, ours);
    let mut n = 0;
    f.node.for_each_conn(|_| n += 1);
    assert_eq!(n, 1, "the silent link");
    f.poll(T0 + ms(5000));
    assert!(f.events().is_empty(), "not yet");
    f.poll(T0 + MS + ms(5000));
    assert!(matches!(
        f.events().as_slice(),
        [FrontendEvent::LinkRefused { why }] if why.contains("without Register")
    ));

    // A backend that reconnects replaces its old link; one that sends
    // garbage is lost.
    let _old = f.backend(T0, 9);
    let mut new = f.backend(T0, 9);
    assert_eq!(
        f.events(),
        [
            FrontendEvent::BackendJoined(9),
            FrontendEvent::BackendJoined(9)
        ]
    );
    assert!(f.node.take_closed_link().is_some(), "the replaced link");
    assert_eq!(f.node.stats().backends.load(Ordering::Relaxed), 1);
    new.link.send(&[0xff; 16]).unwrap();
    f.poll(T0);
    assert!(matches!(
        f.events().as_slice(),
        [FrontendEvent::BackendLost { id: 9, why }] if why.contains("malformed")
    ));
    let s = f.node.stats();
    assert_eq!(s.backends.load(Ordering::Relaxed), 0);
    assert_eq!(s.backends_lost.load(Ordering::Relaxed), 1);
    assert_eq!(s.bad_messages.load(Ordering::Relaxed), 1);
}

#[test]
fn a_drain_sends_what_is_queued_then_shutdown_ends_the_rest() {
    let mut f = frontend();
    let mut sched = f.registered();
    let mut first = f.submit().unwrap();
    let mut second = f.submit().unwrap();
    f.node.begin_drain();
    assert!(!f.service.ready());
    assert_eq!(
        f.submit().unwrap_err(),
        SubmitError::SendFailed("the frontend is shutting down".into())
    );
    assert!(!f.node.drained());
    f.poll(T0);
    let tasks = sched.tasks();
    assert_eq!(tasks.len(), 2, "queued tasks still go out");
    sched.put(&wire::Dropped {
        task_id: tasks[0].task_id,
        reason: DropReason::Overloaded as u32,
        reserved: 0,
    });
    f.poll(T0);
    assert_eq!(
        poll_now(&mut first),
        Poll::Ready(Outcome::Dropped(DropReason::Overloaded))
    );
    assert!(!f.node.drained(), "one request is still in flight");
    f.node.shutdown();
    assert_eq!(
        poll_now(&mut second),
        Poll::Ready(Outcome::Dropped(DropReason::Shutdown))
    );
    assert!(f.node.drained());
    let c = f.service.counters();
    assert!(c.balanced() && c.accepted == 3 && c.failed == 1, "{c:?}");
    assert_eq!(f.node.into_links().len(), 1, "the scheduler link");
}
