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

fn task(id: u64) -> Task {
    Task {
        task_id: wire::TaskId::new(1, id, 0).0,
        budget_ns: 40_000_000,
        model_id: 0,
        frontend_id: 1,
        input: RemoteRef { key: 1, len: 16, offset: 0 },
        ..Default::default()
    }
}

#[test]
fn with_readiness_a_pass_reads_touched_or_readable_links_and_a_sleep_arms_only_touched_ones() {
    let models = vec![ModelSpec::linear("a", 1.0, 5.0, 50.0).unwrap()];
    let metrics = Arc::new(SchedulerMetrics::new(&models));
    let plane = ControlPlane::new(models, &[vec![0]], CoreConfig::default(), metrics).unwrap();
    let mut node = SchedulerNode::new(plane, NodeConfig::default());
    let net = SimNet::new(0, FaultConfig::same_instant());
    let arms = Arc::new(AtomicU32::new(0));
    let t0 = Instant::ZERO;
    let connect = |node: &mut SchedulerNode<WithFd>| {
        let (conn, theirs) = net.link(0, 1).unwrap();
        let unread = Arc::new(AtomicBool::new(true));
        node.handle_connection(t0, WithFd { conn, unread: unread.clone(), arms: arms.clone() });
        node.poll(t0);
        let mut peer = SimPeer::new(theirs);
        super::auth_tests::take_nonce(&mut peer.link);
        (peer, unread)
    };
    let ((mut fe, fe_unread), (mut be, _)) = (connect(&mut node), connect(&mut node));
    fe.send(&Join::new(Role::Frontend, 1, 0, "fe1")).unwrap();
    be.send(&Join::new(Role::Backend, 7, 1, "")).unwrap();
    be.send_encoded(|buf| wire::encode_models(buf, &[0])).unwrap();
    assert!(net.settle(t0, 100, |t| node.poll(t)), "registration settles");
    assert_eq!(node.plane().peers(), (1, 1));
    let mut keys = Vec::new();
    node.for_each_conn(|key, _| keys.push(key));
    let fe_key = keys[0];
    let (_, _) = (fe.take_all(), be.take_all());
    let received = |node: &SchedulerNode<WithFd>| node.plane().metrics().tasks_received.get();

    // From here on the host reports readiness, none so far.
    node.set_readable([]);
    assert!(node.arm_waits());
    assert_eq!(arms.load(Ordering::Relaxed), 2, "both links were touched since they joined");
    assert!(node.arm_waits());
    assert_eq!(arms.load(Ordering::Relaxed), 2, "a link armed and untouched since stays armed");

    fe.send(&task(1)).unwrap();
    fe_unread.store(true, Ordering::Relaxed);
    node.set_readable([]);
    node.poll(t0);
    assert_eq!(received(&node), 0, "an armed link is read once its fd says so, not before");
    node.set_readable([fe_key]);
    node.poll(t0);
    assert_eq!(received(&node), 1);

    // Drained since its arm: its peer wakes nobody, the link is read
    // because it says it holds input.
    fe.send(&task(2)).unwrap();
    fe_unread.store(true, Ordering::Relaxed);
    node.set_readable([]);
    node.poll(t0);
    assert_eq!(received(&node), 2);
    let backend_touched = !be.take_all().is_empty();
    assert!(node.arm_waits());
    assert_eq!(arms.load(Ordering::Relaxed), 3 + u32::from(backend_touched), "only the links touched since are armed again");
}
