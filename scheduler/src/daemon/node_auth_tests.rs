//! The authenticated registration of [`SchedulerNode`]: join token,
//! versions, limits, and that nothing a refused peer sent reaches the
//! plane. Peers are hand-written over the `sim` transport.

use super::*;
use crate::deferred::CoreConfig;
use crate::netdelay::NetworkDelay;
use crate::zoo::ModelSpec;
use dataplane::join::{JoinToken, NonceSource};
use dataplane::transport::sim::{FaultConfig, SimConn, SimNet};
use dataplane::transport::{Domain, Listener};
use dataplane::wire::{Kind, RemoteRef, Task, Welcome, HEADER_LEN, MAGIC};

const TOKEN: &[u8] = b"the cluster's sixteen-plus byte token";
const D_CTRL: Duration = Duration::from_micros(250);

struct World {
    net: SimNet,
    node: SchedulerNode<SimConn>,
    listener: dataplane::transport::sim::SimListener,
    now: Instant,
    next_peer: u32,
}

/// A hand-written peer: its link and a buffer.
struct Peer {
    conn: SimConn,
    buf: Vec<u8>,
}

impl Peer {
    fn send<M: wire::FixedMessage>(&mut self, m: &M) {
        let n = wire::encode(&mut self.buf, m).unwrap();
        self.conn.send(&self.buf[..n]).unwrap();
    }
    fn send_raw(&mut self, bytes: &[u8]) {
        self.conn.send(bytes).unwrap();
    }
    /// Every message received (heartbeats left out), re-encoded as Debug
    /// text; `Err` text once the link is gone.
    fn received(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        loop {
            match self.conn.try_recv(&mut self.buf) {
                Ok(Some(n)) => match wire::decode(&self.buf[..n]) {
                    Ok(Message::Heartbeat(_)) => {}
                    Ok(m) => out.push(format!("{m:?}")),
                    Err(e) => out.push(format!("undecodable {e:?}")),
                },
                Ok(None) => return out,
                Err(e) => {
                    out.push(format!("gone: {e}"));
                    return out;
                }
            }
        }
    }
    /// The challenge's nonce (the first message).
    fn nonce(&mut self) -> [u8; wire::NONCE_LEN] {
        take_nonce(&mut self.conn)
    }
    /// The refusal that ended the link.
    fn refusal(&mut self) -> Refused {
        loop {
            let n = self.conn.try_recv(&mut self.buf).unwrap().expect("a refusal");
            if let Ok(Message::Refused(r)) = wire::decode(&self.buf[..n]) {
                return r;
            }
        }
    }
}

impl World {
    fn new(membership: Membership) -> World {
        let net = SimNet::new(7, FaultConfig::default());
        let models = vec![ModelSpec::linear("a", 1.0, 5.0, 50.0).unwrap()];
        let metrics = Arc::new(SchedulerMetrics::new(&models));
        let core = CoreConfig { delay: NetworkDelay { d_ctrl: D_CTRL, d_data: Duration::ZERO }, ..CoreConfig::default() };
        let plane = ControlPlane::new(models, &[vec![0]], core, metrics).unwrap();
        let node = SchedulerNode::new(plane, NodeConfig::default()).with_membership(membership);
        let listener = net.domain(0).listen("sim:scheduler").unwrap();
        World { net, node, listener, now: Instant::ZERO, next_peer: 1 }
    }

    fn with_token() -> World {
        World::new(Membership { nonces: NonceSource::Seeded(3), ..Membership::with_token(JoinToken::new(TOKEN).unwrap()) })
    }

    /// A new link, accepted by the scheduler, its challenge delivered.
    fn connect(&mut self) -> Peer {
        let conn = self.net.domain(self.next_peer).connect("sim:scheduler", Duration::ZERO).unwrap();
        self.next_peer += 1;
        let accepted = self.listener.accept(Duration::ZERO).unwrap();
        self.node.handle_connection(self.now, accepted);
        self.step(5);
        Peer { conn, buf: vec![0; wire::MAX_MESSAGE_LEN] }
    }

    /// `ms` milliseconds of polls, 1 ms apart.
    fn step(&mut self, ms: u64) {
        for _ in 0..ms {
            while self.node.poll(self.now) {}
            self.now += Duration::from_millis(1);
            self.net.set_now(self.now);
        }
        while self.node.poll(self.now) {}
    }

    fn events(&mut self) -> Vec<String> {
        std::iter::from_fn(|| self.node.poll_event()).map(|e| e.to_string()).collect()
    }

    fn refused(&self, r: RefuseReason) -> u64 {
        self.node.plane().metrics().refused[r.index()].get()
    }
}

/// Takes the challenge that opens every link (the first message a peer
/// gets), checking its versions; its nonce. The peer's side of the
/// handshake for both test modules.
pub(super) fn take_nonce(conn: &mut SimConn) -> [u8; wire::NONCE_LEN] {
    let mut buf = [0u8; wire::MAX_MESSAGE_LEN];
    let n = conn.try_recv(&mut buf).unwrap().expect("a challenge first");
    match wire::decode(&buf[..n]).unwrap() {
        Message::Challenge(c) => {
            assert_eq!((c.scheduler_version, c.oldest_version), (wire::VERSION, wire::OLDEST_PEER_VERSION));
            c.nonce
        }
        m => panic!("first message {m:?}"),
    }
}

fn signed(token: &[u8], nonce: &[u8; wire::NONCE_LEN], j: Join) -> Join {
    j.with_mac(JoinToken::new(token).unwrap().sign(nonce, wire::VERSION, &j))
}

#[test]
fn a_peer_with_the_token_joins_and_is_told_the_control_delay() {
    let mut w = World::with_token();
    let mut fe = w.connect();
    let nonce = fe.nonce();
    let join = signed(TOKEN, &nonce, Join::new(Role::Frontend, 1, 0, "fe1").with_nonce([4; wire::NONCE_LEN]));
    fe.send(&join);
    w.step(5);
    assert_eq!(w.events(), ["frontend 1 registered"]);
    let got = fe.received();
    // The scheduler proves the token back: its Welcome answers this Join.
    let token = JoinToken::new(TOKEN).unwrap();
    let welcome = Welcome::new(1, 0, D_CTRL.as_nanos());
    let welcome = Welcome { mac: token.sign_welcome(&nonce, &join, &welcome), ..welcome };
    assert!(token.verify_welcome(&nonce, &join, &welcome));
    assert_eq!(got, [format!("{:?}", Message::Welcome(welcome))]);
    let mut be = w.connect();
    let nonce = be.nonce();
    be.send(&signed(TOKEN, &nonce, Join::new(Role::Backend, 7, 2, "")));
    let n = wire::encode_models(&mut be.buf, &[0]).unwrap();
    let models = be.buf[..n].to_vec();
    be.send_raw(&models);
    w.step(5);
    assert_eq!(w.events(), ["backend 7 registered"]);
    assert_eq!(w.node.plane().online_gpus(), 2);
    assert!(RefuseReason::ALL.iter().all(|&r| w.refused(r) == 0));
}

#[test]
fn a_wrong_or_missing_token_is_refused_counted_and_leaves_no_trace() {
    let mut w = World::with_token();
    // A wrong token, then its Models and a task: none of it may count.
    let mut wrong = w.connect();
    let nonce = wrong.nonce();
    wrong.send(&signed(b"not the cluster's token at all", &nonce, Join::new(Role::Backend, 7, 4, "")));
    let n = wire::encode_models(&mut wrong.buf, &[0]).unwrap();
    let models = wrong.buf[..n].to_vec();
    wrong.send_raw(&models);
    // No token at all.
    let mut missing = w.connect();
    missing.nonce();
    missing.send(&Join::new(Role::Frontend, 2, 0, "fe2"));
    missing.send(&Task { task_id: 2 << 52, budget_ns: 1 << 30, model_id: 0, frontend_id: 2, input: RemoteRef::default(), ..Default::default() });
    // A MAC made for another nonce (a replayed answer).
    let mut replay = w.connect();
    replay.nonce();
    replay.send(&signed(TOKEN, &nonce, Join::new(Role::Backend, 8, 1, "")));
    w.step(10);
    let ev = w.events();
    assert_eq!(
        ev,
        [
            "registration refused: backend 7: its join token is not this cluster's [bad_token]",
            "registration refused: frontend 2: it has no join token (give it --join-token-file or SYMPHONY_JOIN_TOKEN) [no_token]",
            "registration refused: backend 8: its join token is not this cluster's [bad_token]",
        ]
    );
    assert_eq!((w.refused(RefuseReason::BadToken), w.refused(RefuseReason::NoToken)), (2, 1));
    assert_eq!(wrong.refusal().reason(), Some(RefuseReason::BadToken));
    let r = missing.refusal();
    assert_eq!(r.reason(), Some(RefuseReason::NoToken));
    assert!(r.to_string().contains("no join token"), "{r}");
    assert_eq!(w.node.plane().peers(), (0, 0));
    assert_eq!(w.node.plane().online_gpus(), 0);
    assert_eq!(w.node.plane().metrics().tasks_received.get(), 0);
    // The refused links are closed once the refusal had its time.
    w.step(200);
    assert!(wrong.received().last().is_some_and(|m| m.starts_with("gone")));
    assert!(missing.received().last().is_some_and(|m| m.starts_with("gone")));
    // The cluster still takes a good peer.
    let mut good = w.connect();
    let nonce = good.nonce();
    good.send(&signed(TOKEN, &nonce, Join::new(Role::Backend, 7, 1, "")));
    good.send_raw(&models);
    w.step(5);
    assert_eq!(w.events(), ["backend 7 registered"]);
}

#[test]
fn a_peer_of_another_version_is_refused_naming_both_versions() {
    let mut w = World::with_token();
    let mut future = w.connect();
    let nonce = future.nonce();
    // A later version's Join: its header says VERSION + 1 and its body is
    // whatever that version defines, beginning with role and id.
    let j = signed(TOKEN, &nonce, Join::new(Role::Backend, 9, 1, ""));
    let n = wire::encode(&mut future.buf, &j).unwrap();
    let mut bytes = future.buf[..n].to_vec();
    bytes[4..6].copy_from_slice(&(wire::VERSION + 1).to_le_bytes());
    bytes.extend_from_slice(&[0xee; 8]);
    let len = (bytes.len() - HEADER_LEN) as u32;
    bytes[8..12].copy_from_slice(&len.to_le_bytes());
    future.send_raw(&bytes);
    // A version-1 peer: it spoke first with its Register.
    let mut old = w.connect();
    let mut v1 = [0u8; HEADER_LEN + 80];
    v1[..4].copy_from_slice(&MAGIC.to_le_bytes());
    v1[4..6].copy_from_slice(&1u16.to_le_bytes());
    v1[6..8].copy_from_slice(&(Kind::Register as u16).to_le_bytes());
    v1[8..12].copy_from_slice(&80u32.to_le_bytes());
    v1[HEADER_LEN..HEADER_LEN + 8].copy_from_slice(&[1, 0, 0, 0, 4, 0, 0, 0]);
    old.send_raw(&v1);
    w.step(10);
    let v = wire::VERSION;
    assert_eq!(
        w.events(),
        [
            format!("registration refused: backend 9: it speaks wire version {}; this scheduler speaks {v} and accepts {v}..={v} [version]", v + 1),
            format!("registration refused: frontend 4: it speaks wire version 1; this scheduler speaks {v} and accepts {v}..={v} [version]"),
        ]
    );
    assert_eq!(w.refused(RefuseReason::Version), 2);
    let r = future.refusal();
    assert_eq!((r.reason(), r.scheduler_version, r.peer_version), (Some(RefuseReason::Version), v, v + 1));
    assert!(r.to_string().starts_with(&format!("version (scheduler wire version {v}, ours {})", v + 1)), "{r}");
    assert_eq!(w.node.plane().peers(), (0, 0));
}

#[test]
fn garbage_out_of_order_messages_and_limits_are_refused_with_their_reason() {
    let mut w = World::new(Membership {
        max_backends: 1,
        max_pending: 3,
        nonces: NonceSource::Seeded(1),
        ..Membership::open()
    });
    let mut first = w.connect();
    first.nonce();
    first.send(&Join::new(Role::Backend, 1, 1, ""));
    let n = wire::encode_models(&mut first.buf, &[0]).unwrap();
    let models = first.buf[..n].to_vec();
    first.send_raw(&models);
    w.step(5);
    assert_eq!(w.events(), ["backend 1 registered"]);
    // Open membership: no MAC needed, but the limit holds.
    let mut second = w.connect();
    second.nonce();
    second.send(&Join::new(Role::Backend, 2, 1, ""));
    let mut early = w.connect();
    early.nonce();
    early.send(&wire::BatchDone { batch_id: 1, ..wire::BatchDone::default() });
    let mut garbage = w.connect();
    garbage.nonce();
    garbage.send_raw(&[0xab; 40]);
    w.step(5);
    let ev = w.events();
    assert_eq!(ev.len(), 3, "{ev:?}");
    assert!(ev[0].starts_with("registration refused: backend 2: 1 peers of its role") && ev[0].ends_with("[full]"), "{ev:?}");
    assert!(ev[1].ends_with("a BatchDone out of the registration's order [malformed]"), "{ev:?}");
    assert!(ev[2].contains("an unidentified peer: a registration that does not decode") && ev[2].ends_with("[malformed]"), "{ev:?}");
    assert_eq!((w.refused(RefuseReason::Full), w.refused(RefuseReason::Malformed)), (1, 2));
    assert_eq!(w.node.plane().peers(), (0, 1));
    // Beyond the bound, the oldest registering link makes room (issue 55):
    // idle connections cannot lock a peer with the token out.
    let mut held: Vec<Peer> = (0..3).map(|_| w.connect()).collect();
    let mut late = w.connect();
    assert_eq!(held[0].refusal().reason(), Some(RefuseReason::Full));
    assert_eq!(w.refused(RefuseReason::Full), 2);
    // The newcomer was admitted: it got its challenge.
    late.nonce();
    drop(held);
    drop(late);
    w.step(5);
    // A silent link is refused when its handshake time is up.
    let mut silent = w.connect();
    w.step(NodeConfig::default().handshake_timeout.as_nanos() / 1_000_000 + 2);
    assert_eq!(silent.refusal().reason(), Some(RefuseReason::Timeout));
    assert!(w.refused(RefuseReason::Timeout) >= 1);
}
