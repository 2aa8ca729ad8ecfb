//! The node with readiness from its host (as the daemon runs it over shm
//! and tcp): a pass reads only the links the host saw readable and those
//! touched since they were last armed, and a sleep arms only the touched
//! ones. The links are `sim` links given a wait fd; the test plays the
//! host's epoll.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use super::*;
use crate::deferred::CoreConfig;
use crate::zoo::ModelSpec;
use dataplane::transport::sim::{FaultConfig, SimConn, SimNet, SimPeer};
use dataplane::transport::{Completion, ReadOp};
use dataplane::wire::{RemoteRef, Task};

/// A `sim` link with a wait fd, as an shm link: `unread` plays the ring
/// (the test sets it when the peer sends, a receive that finds nothing
/// clears it), the test plays the fd (it reports new input on an armed
/// link), and the arms are counted.
struct WithFd {
    conn: SimConn,
    unread: Arc<AtomicBool>,
    arms: Arc<AtomicU32>,
}

impl Connection for WithFd {
    fn send(&mut self, msg: &[u8]) -> Result<(), Error> {
        self.conn.send(msg)
    }
    fn try_recv(&mut self, buf: &mut [u8]) -> Result<Option<usize>, Error> {
        let got = self.conn.try_recv(buf)?;
        if got.is_none() {
            self.unread.store(false, Ordering::Relaxed);
        }
        Ok(got)
    }
    fn post_read(&mut self, op: &ReadOp) -> Result<(), Error> {
        self.conn.post_read(op)
    }
    fn poll_completions(&mut self, out: &mut [Completion]) -> Result<usize, Error> {
        self.conn.poll_completions(out)
    }
    fn progress(&mut self) -> Result<(), Error> {
        self.conn.progress()
    }
    fn outstanding_reads(&self) -> usize {
        self.conn.outstanding_reads()
    }
    fn max_outstanding_reads(&self) -> usize {
        self.conn.max_outstanding_reads()
    }
    fn is_connected(&self) -> bool {
        self.conn.is_connected()
    }
    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(-1)
    }
    fn arm_wait(&self) -> bool {
        self.arms.fetch_add(1, Ordering::Relaxed);
        !self.may_hold_input()
    }
    fn may_hold_input(&self) -> bool {
        self.unread.load(Ordering::Relaxed)
    }
}

fn task(frontend: u32, id: u64) -> Task {
    Task {
        task_id: wire::TaskId::new(frontend, id, 0).0,
        budget_ns: 40_000_000,
        model_id: 0,
        frontend_id: frontend,
        input: RemoteRef { key: 1, len: 16, offset: 0 },
        ..Default::default()
    }
}

/// A node on a `sim` net, links with wait fds, and the count of arms.
struct Host {
    node: SchedulerNode<WithFd>,
    net: SimNet,
    arms: Arc<AtomicU32>,
}

impl Host {
    fn new() -> Self {
        let models = vec![ModelSpec::linear("a", 1.0, 5.0, 50.0).unwrap()];
        let metrics = Arc::new(SchedulerMetrics::new(&models));
        let plane = ControlPlane::new(models, &[vec![0]], CoreConfig::default(), metrics).unwrap();
        let node = SchedulerNode::new(plane, NodeConfig::default());
        Host { node, net: SimNet::new(0, FaultConfig::same_instant()), arms: Arc::new(AtomicU32::new(0)) }
    }

    /// A new link: the peer's end (its challenge taken) and the link's
    /// ring flag.
    fn connect(&mut self) -> (SimPeer, Arc<AtomicBool>) {
        let (conn, theirs) = self.net.link(0, 1).unwrap();
        let unread = Arc::new(AtomicBool::new(true));
        self.node.handle_connection(Instant::ZERO, WithFd { conn, unread: unread.clone(), arms: self.arms.clone() });
        self.node.poll(Instant::ZERO);
        let mut peer = SimPeer::new(theirs);
        super::auth_tests::take_nonce(&mut peer.link);
        (peer, unread)
    }

    /// Settles the registrations, then returns each link's key (in
    /// connection order) and starts reporting readiness (none so far).
    fn registered(&mut self, peers: (usize, usize)) -> Vec<u64> {
        let node = &mut self.node;
        assert!(self.net.settle(Instant::ZERO, 100, |t| node.poll(t)), "registration settles");
        assert_eq!(self.node.plane().peers(), peers);
        let mut keys = Vec::new();
        self.node.for_each_conn(|key, _| keys.push(key));
        self.node.set_readable([]);
        keys
    }

    fn received(&self) -> u64 {
        self.node.plane().metrics().tasks_received.get()
    }
}

#[test]
fn with_readiness_a_pass_reads_touched_or_readable_links_and_a_sleep_arms_only_touched_ones() {
    let mut host = Host::new();
    let ((mut fe, fe_unread), (mut be, _)) = (host.connect(), host.connect());
    fe.send(&Join::new(Role::Frontend, 1, 0, "fe1")).unwrap();
    be.send(&Join::new(Role::Backend, 7, 1, "")).unwrap();
    be.send_encoded(|buf| wire::encode_models(buf, &[0])).unwrap();
    let fe_key = host.registered((1, 1))[0];
    let (_, _) = (fe.take_all(), be.take_all());
    let (node, arms) = (&mut host.node, &host.arms);
    assert!(node.arm_waits());
    assert_eq!(arms.load(Ordering::Relaxed), 2, "both links were touched since they joined");
    assert!(node.arm_waits());
    assert_eq!(arms.load(Ordering::Relaxed), 2, "a link armed and untouched since stays armed");

    fe.send(&task(1, 1)).unwrap();
    fe_unread.store(true, Ordering::Relaxed);
    host.node.set_readable([]);
    host.node.poll(Instant::ZERO);
    assert_eq!(host.received(), 0, "an armed link is read once its fd says so, not before");
    host.node.set_readable([fe_key]);
    host.node.poll(Instant::ZERO);
    assert_eq!(host.received(), 1);

    // Drained since its arm: its peer wakes nobody, the link is read
    // because it says it holds input.
    fe.send(&task(1, 2)).unwrap();
    fe_unread.store(true, Ordering::Relaxed);
    host.node.set_readable([]);
    host.node.poll(Instant::ZERO);
    assert_eq!(host.received(), 2);
    let backend_touched = !be.take_all().is_empty();
    assert!(host.node.arm_waits());
    assert_eq!(host.arms.load(Ordering::Relaxed), 3 + u32::from(backend_touched), "only the links touched since are armed again");
}

/// Readiness that reports a link once per publish (the shm doorbell's
/// pending bit), not for as long as it holds bytes (a readable fd): a
/// frontend that a full poll cut off is read by the very next pass,
/// though nothing reports it again (its producer, its ring full, rings
/// no more). Before the fix it waited for the node's next send to it
/// (a heartbeat, 100 ms later).
#[test]
fn a_link_cut_off_by_a_full_poll_is_read_next_pass_without_being_reported_again() {
    let mut host = Host::new();
    let ((mut first, first_unread), (mut second, second_unread), (mut be, _)) = (host.connect(), host.connect(), host.connect());
    first.send(&Join::new(Role::Frontend, 1, 0, "fe1")).unwrap();
    second.send(&Join::new(Role::Frontend, 2, 0, "fe2")).unwrap();
    be.send(&Join::new(Role::Backend, 7, 1, "")).unwrap();
    be.send_encoded(|buf| wire::encode_models(buf, &[0])).unwrap();
    let keys = host.registered((2, 1));
    assert!(host.node.arm_waits(), "every link armed: the host may sleep");

    let extra = 10;
    for i in 1..=TASKS_PER_POLL as u64 + extra {
        first.send(&task(1, i)).unwrap();
    }
    for i in 1..=3 {
        second.send(&task(2, i)).unwrap();
    }
    first_unread.store(true, Ordering::Relaxed);
    second_unread.store(true, Ordering::Relaxed);
    // Both links reported, once.
    host.node.set_readable([keys[0], keys[1]]);
    assert!(host.node.poll(Instant::ZERO), "a cut poll is busy: the host polls again at once");
    assert_eq!(host.received(), TASKS_PER_POLL as u64, "the first frontend filled the poll");
    host.node.set_readable([]);
    host.node.poll(Instant::ZERO);
    assert_eq!(host.received(), TASKS_PER_POLL as u64 + extra + 3, "the cut-off frontend, and the rest of the first, in the next pass");
    assert!(host.node.arm_waits(), "all read: the host may sleep");
    assert_eq!(host.node.plane().metrics().protocol_errors.get(), 0);
}
