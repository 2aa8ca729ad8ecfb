//! The frontend's side of the authenticated registration: against the
//! real scheduler node (right, wrong and missing token) and against a
//! hand-written scheduler of another wire version, over the `sim`
//! transport.

use super::*;
use crate::staging::StagingConfig;
use dataplane::join::{JoinToken, NonceSource};
use dataplane::mem::{Access, Region};
use dataplane::time::Duration;
use dataplane::transport::sim::{FaultConfig, SimConn, SimNet, SimPeer};
use dataplane::transport::{Domain, Listener, Registration};
use dataplane::wire::{Challenge, RefuseReason, Refused, Welcome};
use scheduler::daemon::metrics::SchedulerMetrics;
use scheduler::daemon::node::{Membership, NodeConfig, SchedulerNode};
use scheduler::daemon::plane::ControlPlane;

const TOKEN: &[u8] = b"frontend test token, long enough";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn token(t: &[u8]) -> JoinToken {
    JoinToken::new(t).unwrap()
}

/// A frontend node (id 5, two models) holding `token`.
fn frontend(token: Option<JoinToken>) -> FrontendNode<SimConn> {
    let region = Region::anonymous(64 * 8).unwrap();
    let staging = Staging::new(
        Registration::new(1, region, Access::REMOTE_READ, 0),
        StagingConfig { frontend_id: 5, slots: 8, slot_size: 64, max_output: 64 },
    )
    .unwrap();
    let (_sink, tasks) = NetSink::new(4, None);
    FrontendNode::new(
        FrontendNodeConfig {
            id: 5,
            data_endpoint: "sim:frontend-5".into(),
            models: 2,
            heartbeat: ms(100),
            dead_after: ms(1000),
            handshake_timeout: ms(1000),
            coalesce: crate::node::DEFAULT_COALESCE,
            coalesce_wait: Duration::ZERO,
        },
        staging,
        tasks,
    )
    .with_join_token(token)
}

/// The real scheduler node (two models) requiring [`TOKEN`].
fn scheduler_node() -> SchedulerNode<SimConn> {
    let models = scheduler::zoo::cluster_models("a100", "none", &["m0=1,1,500".into(), "m1=1,2,500".into()]).unwrap();
    let metrics = Arc::new(SchedulerMetrics::new(&models));
    let plane = ControlPlane::new(models, &[vec![0, 1]], Default::default(), metrics).unwrap();
    SchedulerNode::new(plane, NodeConfig::default())
        .with_membership(Membership { nonces: NonceSource::Seeded(5), ..Membership::with_token(token(TOKEN)) })
}

/// Runs the scheduler and the frontend together for `ms` virtual
/// milliseconds; returns the frontend's events.
fn run(net: &SimNet, sched: &mut SchedulerNode<SimConn>, fe: &mut FrontendNode<SimConn>, from: Instant, ms: u64) -> Vec<FrontendEvent> {
    let mut now = from;
    for _ in 0..ms {
        net.set_now(now);
        while sched.poll(now) | fe.poll(now) {}
        now += Duration::from_millis(1);
    }
    std::iter::from_fn(|| fe.poll_event()).collect()
}

fn connect(net: &SimNet, fe: &mut FrontendNode<SimConn>, sched: &mut SchedulerNode<SimConn>) {
    let mut listener = net.domain(0).listen("sim:scheduler").unwrap();
    fe.handle_scheduler_link(Instant::ZERO, net.domain(1).connect("sim:scheduler", Duration::ZERO).unwrap());
    sched.handle_connection(Instant::ZERO, listener.accept(Duration::ZERO).unwrap());
}

fn refused_total(sched: &SchedulerNode<SimConn>, r: RefuseReason) -> u64 {
    sched.plane().metrics().refused[r.index()].get()
}

#[test]
fn the_right_token_registers_and_a_wrong_or_missing_one_is_refused_with_the_reason() {
    for (held, want) in [
        (Some(token(TOKEN)), None),
        (Some(token(b"some other cluster's token")), Some(RefuseReason::BadToken)),
        (None, Some(RefuseReason::NoToken)),
    ] {
        let net = SimNet::new(1, FaultConfig::default());
        let mut sched = scheduler_node();
        let mut fe = frontend(held);
        connect(&net, &mut fe, &mut sched);
        let ev = run(&net, &mut sched, &mut fe, Instant::ZERO, 20);
        match want {
            None => {
                assert_eq!(ev, [FrontendEvent::Registered { group: 0, models: 2 }]);
                assert!(fe.is_registered());
                assert_eq!(sched.plane().peers(), (1, 0));
            }
            Some(reason) => {
                let [FrontendEvent::Refused { why, .. }] = &ev[..] else { panic!("{ev:?}") };
                let v = wire::VERSION;
                let head = format!("the scheduler refused the registration of frontend 5: {reason} (scheduler wire version {v}, ours {v}): ");
                assert!(why.starts_with(&head), "{why}");
                assert!(!fe.is_registered());
                assert_eq!(refused_total(&sched, reason), 1);
                assert_eq!(sched.plane().peers(), (0, 0));
            }
        }
    }
}

/// A hand-written scheduler end: sends raw bytes.
fn send_raw(conn: &mut SimConn, bytes: &[u8]) {
    conn.send(bytes).unwrap();
}

/// `msg` encoded with its header's version set to `version`.
fn with_version<M: wire::FixedMessage>(msg: &M, version: u16) -> Vec<u8> {
    let mut buf = vec![0u8; wire::MAX_MESSAGE_LEN];
    let n = wire::encode(&mut buf, msg).unwrap();
    buf.truncate(n);
    buf[4..6].copy_from_slice(&version.to_le_bytes());
    buf
}

#[test]
fn a_scheduler_of_another_version_is_named_with_both_versions() {
    let future = wire::VERSION + 1;
    // It refuses us with its (frozen-layout) refusal ...
    let net = SimNet::new(2, FaultConfig::default());
    let mut listener = net.domain(0).listen("sim:scheduler").unwrap();
    let mut fe = frontend(Some(token(TOKEN)));
    fe.handle_scheduler_link(Instant::ZERO, net.domain(1).connect("sim:scheduler", Duration::ZERO).unwrap());
    let mut sched = SimPeer::new(listener.accept(Duration::ZERO).unwrap());
    let challenge = Challenge { oldest_version: future, scheduler_version: future, ..Challenge::new([1; wire::NONCE_LEN], true) };
    send_raw(&mut sched.link, &with_version(&challenge, future));
    let mut now = Instant::ZERO;
    let mut joined = None;
    for _ in 0..10 {
        net.set_now(now);
        fe.poll(now);
        joined = joined.or(sched.take_join());
        now += ms(1);
    }
    let Some(j) = joined else { panic!("no Join") };
    assert!(j.has_mac() && j.id == 5, "it answers with its own version's Join");
    let refusal = Refused { scheduler_version: future, ..Refused::new(RefuseReason::Version, wire::VERSION, "it speaks an older version") };
    send_raw(&mut sched.link, &with_version(&refusal, future));
    for _ in 0..5 {
        net.set_now(now);
        fe.poll(now);
        now += ms(1);
    }
    let ev: Vec<_> = std::iter::from_fn(|| fe.poll_event()).collect();
    let [FrontendEvent::Refused { why, .. }] = &ev[..] else { panic!("{ev:?}") };
    assert!(why.contains(&format!("version (scheduler wire version {future}, ours {})", wire::VERSION)), "{why}");

    // ... or it answers with a message only its version knows.
    let net = SimNet::new(3, FaultConfig::default());
    let mut listener = net.domain(0).listen("sim:scheduler").unwrap();
    let mut fe = frontend(Some(token(TOKEN)));
    fe.handle_scheduler_link(Instant::ZERO, net.domain(1).connect("sim:scheduler", Duration::ZERO).unwrap());
    let mut sched = listener.accept(Duration::ZERO).unwrap();
    send_raw(&mut sched, &with_version(&Challenge::new([1; wire::NONCE_LEN], true), future));
    send_raw(&mut sched, &with_version(&Welcome::new(2, 0, 0), future));
    let mut now = Instant::ZERO;
    for _ in 0..10 {
        net.set_now(now);
        fe.poll(now);
        now += ms(1);
    }
    let ev: Vec<_> = std::iter::from_fn(|| fe.poll_event()).collect();
    let want = format!("the scheduler speaks wire version {future}, this frontend {}", wire::VERSION);
    assert!(matches!(&ev[..], [FrontendEvent::Refused { why, .. }] if why.starts_with(&want)), "{ev:?}");
}

/// A frontend holding the token takes nothing from a Welcome that does not
/// prove it: unsigned (an open scheduler, or one that took the address),
/// forged, another cluster's, or one signed for another Join of ours (a
/// replay). Each is refused and counted; the real scheduler is then
/// registered with.
#[test]
fn a_welcome_that_does_not_prove_the_token_is_refused_and_counted() {
    let ours = token(TOKEN);
    let nonce = [1; wire::NONCE_LEN];
    for case in 0..4u8 {
        let net = SimNet::new(4, FaultConfig::default());
        let mut listener = net.domain(0).listen("sim:scheduler").unwrap();
        let mut fe = frontend(Some(ours.clone())).with_join_nonces(NonceSource::Seeded(u64::from(case)));
        fe.handle_scheduler_link(Instant::ZERO, net.domain(1).connect("sim:scheduler", Duration::ZERO).unwrap());
        let mut sched = SimPeer::new(listener.accept(Duration::ZERO).unwrap());
        drop(listener);
        sched.challenge(nonce).unwrap();
        let mut now = Instant::ZERO;
        let mut joined = None;
        for _ in 0..5 {
            net.set_now(now);
            fe.poll(now);
            joined = joined.or(sched.take_join());
            now += ms(1);
        }
        let Some(join) = joined else { panic!("no Join") };
        assert_ne!(join.nonce, [0; wire::NONCE_LEN], "a fresh nonce of ours");
        let w = Welcome::new(2, u32::MAX, 0);
        let mac = match case {
            0 => [0; wire::MAC_LEN],
            1 => [0xa5; wire::MAC_LEN],
            2 => token(b"some other cluster's token").sign_welcome(&nonce, &join, &w),
            _ => ours.sign_welcome(&nonce, &join.with_nonce([2; wire::NONCE_LEN]), &w),
        };
        sched.send(&Welcome { mac, ..w }).unwrap();
        for _ in 0..5 {
            net.set_now(now);
            fe.poll(now);
            now += ms(1);
        }
        let ev: Vec<_> = std::iter::from_fn(|| fe.poll_event()).collect();
        let want = "the scheduler's Welcome to frontend 5 does not prove the join token";
        assert!(matches!(&ev[..], [FrontendEvent::Refused { why, .. }] if why.starts_with(want)), "case {case}: {ev:?}");
        assert!(!fe.is_registered());
        assert_eq!(fe.forged_welcomes(), 1);

        // The real scheduler next: its Welcome proves the token.
        let mut real = scheduler_node();
        connect(&net, &mut fe, &mut real);
        assert_eq!(run(&net, &mut real, &mut fe, now, 20), [FrontendEvent::Registered { group: 0, models: 2 }]);
        assert_eq!(fe.forged_welcomes(), 1);
    }
}

/// A data link handed to `fe` at time zero: the backend's end and the
/// nonce of the challenge it got.
fn data_link(net: &SimNet, fe: &mut FrontendNode<SimConn>) -> (SimPeer, [u8; wire::NONCE_LEN]) {
    let (ours, theirs) = net.link(5, 1).unwrap();
    fe.handle_backend_link(Instant::ZERO, ours);
    let mut peer = SimPeer::new(theirs);
    let got = peer.take_all();
    let [first] = &got[..] else { panic!("one challenge expected, got {got:?}") };
    let Ok(wire::Message::Challenge(c)) = wire::decode(first) else { panic!("not a challenge: {first:?}") };
    assert!(c.token_required());
    (peer, c.nonce)
}

/// A `Join{role}` of id 7 signed with `t` for `nonce`.
fn signed(t: &JoinToken, role: wire::Role, nonce: [u8; wire::NONCE_LEN]) -> wire::Join {
    let j = wire::Join::new(role, 7, 1, "");
    j.with_mac(t.sign(&nonce, wire::VERSION, &j))
}

#[test]
fn with_a_token_only_a_data_link_answering_its_own_challenge_is_a_backend() {
    use dataplane::join::DATA_LINK_LABEL;
    let net = SimNet::new(1, FaultConfig::same_instant());
    let mut fe = frontend(Some(token(TOKEN))).with_data_link_nonces(NonceSource::Seeded(9));
    let data = token(TOKEN).for_purpose(DATA_LINK_LABEL);
    let (mut good, good_nonce) = data_link(&net, &mut fe);
    let (mut wrong, n) = data_link(&net, &mut fe);
    wrong.send(&signed(&token(b"some other cluster's token").for_purpose(DATA_LINK_LABEL), wire::Role::Backend, n)).unwrap();
    // A scheduler-link answer (the cluster token itself) is not a data-link one.
    let (mut relayed, n) = data_link(&net, &mut fe);
    relayed.send(&signed(&token(TOKEN), wire::Role::Backend, n)).unwrap();
    // The good link's answer replayed on another link (another nonce).
    let (mut replay, n) = data_link(&net, &mut fe);
    assert_ne!(n, good_nonce, "every link its own nonce");
    replay.send(&signed(&data, wire::Role::Backend, good_nonce)).unwrap();
    let (mut not_backend, n) = data_link(&net, &mut fe);
    not_backend.send(&signed(&data, wire::Role::Frontend, n)).unwrap();
    let (mut unsigned, _) = data_link(&net, &mut fe);
    unsigned.send(&wire::Register::new(wire::Role::Backend, 7, 1, "")).unwrap();
    let (_silent, _) = data_link(&net, &mut fe);
    good.send(&signed(&data, wire::Role::Backend, good_nonce)).unwrap();
    fe.poll(Instant::ZERO);
    let ev: Vec<FrontendEvent> = std::iter::from_fn(|| fe.poll_event()).collect();
    let why: Vec<&str> = ev
        .iter()
        .filter_map(|e| match e {
            FrontendEvent::LinkRefused { why } => Some(why.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(ev.iter().filter(|e| **e == FrontendEvent::BackendJoined(7)).count(), 1, "{ev:?}");
    assert_eq!(why.len(), 5, "{ev:?}");
    assert_eq!(why.iter().filter(|w| w.contains("does not answer our challenge")).count(), 3, "{why:?}");
    assert_eq!(why.iter().filter(|w| w.contains("not a backend")).count(), 1, "{why:?}");
    assert_eq!(why.iter().filter(|w| w.contains("unsigned Register")).count(), 1, "{why:?}");
    assert_eq!(std::iter::from_fn(|| fe.take_closed_link()).count(), 5, "refused links are handed back");
    assert_eq!(fe.stats().backends.load(Ordering::Relaxed), 1, "only the good link");
    assert_eq!(fe.stats().data_links_refused.load(Ordering::Relaxed), 5, "each refusal counted");
    // Silence: refused at the handshake deadline (1 s).
    fe.poll(Instant::ZERO + ms(1000));
    let ev: Vec<FrontendEvent> = std::iter::from_fn(|| fe.poll_event()).collect();
    assert!(matches!(&ev[..], [FrontendEvent::LinkRefused { why }] if why.contains("without Register")), "{ev:?}");
    assert_eq!(fe.stats().backends.load(Ordering::Relaxed), 1);
    assert_eq!(fe.stats().data_links_refused.load(Ordering::Relaxed), 6);
}

#[test]
fn idle_data_links_past_the_bound_evict_the_oldest_and_a_backend_still_joins() {
    use dataplane::join::DATA_LINK_LABEL;
    let net = SimNet::new(1, FaultConfig::same_instant());
    let mut fe = frontend(Some(token(TOKEN))).with_data_link_nonces(NonceSource::Seeded(3));
    let idle = data::MAX_HANDSHAKING + 10;
    let _idle: Vec<_> = (0..idle).map(|_| data_link(&net, &mut fe)).collect();
    assert_eq!(fe.stats().data_links_refused.load(Ordering::Relaxed), 10, "one eviction per link past the bound");
    assert_eq!(std::iter::from_fn(|| fe.take_closed_link()).count(), 10, "evicted links are handed back");
    let (mut good, nonce) = data_link(&net, &mut fe);
    good.send(&signed(&token(TOKEN).for_purpose(DATA_LINK_LABEL), wire::Role::Backend, nonce)).unwrap();
    fe.poll(Instant::ZERO);
    let ev: Vec<FrontendEvent> = std::iter::from_fn(|| fe.poll_event()).collect();
    assert_eq!(ev.iter().filter(|e| **e == FrontendEvent::BackendJoined(7)).count(), 1, "{ev:?}");
    assert_eq!(ev.iter().filter(|e| matches!(e, FrontendEvent::LinkRefused { why } if why.contains("evicted"))).count(), 11);
    assert_eq!(fe.stats().backends.load(Ordering::Relaxed), 1);
}

#[test]
fn without_a_token_a_data_link_registers_unchallenged() {
    let net = SimNet::new(1, FaultConfig::same_instant());
    let mut fe = frontend(None);
    let (ours, theirs) = net.link(5, 1).unwrap();
    fe.handle_backend_link(Instant::ZERO, ours);
    let mut peer = SimPeer::new(theirs);
    assert!(peer.take_all().is_empty(), "no challenge in open membership");
    peer.send(&wire::Register::new(wire::Role::Backend, 7, 1, "")).unwrap();
    fe.poll(Instant::ZERO);
    let ev: Vec<FrontendEvent> = std::iter::from_fn(|| fe.poll_event()).collect();
    assert_eq!(ev, [FrontendEvent::BackendJoined(7)]);
}

#[test]
fn a_backend_answering_a_task_planned_to_another_is_refused_and_the_real_answer_lands() {
    use crate::staging::Outcome;
    use dataplane::capability::{CapabilityKey, Grant};
    use dataplane::join::DATA_LINK_LABEL;
    let net = SimNet::new(1, FaultConfig::same_instant());
    let mut fe = frontend(Some(token(TOKEN))).with_data_link_nonces(NonceSource::Seeded(11));
    let data = token(TOKEN).for_purpose(DATA_LINK_LABEL);
    // Backends 7 and 8 join (each answers its own challenge).
    let mut join = |id: u32| {
        let (mut peer, nonce) = data_link(&net, &mut fe);
        let j = wire::Join::new(wire::Role::Backend, id, 1, "");
        peer.send(&j.with_mac(data.sign(&nonce, wire::VERSION, &j))).unwrap();
        peer
    };
    let (mut seven, mut eight) = (join(7), join(8));
    fe.poll(Instant::ZERO);
    assert_eq!(fe.stats().backends.load(Ordering::Relaxed), 2);
    // A task the scheduler planned to backend 7.
    let (task, mut ticket) = fe.staging().stage(0, b"input", ms(50)).unwrap();
    let key = CapabilityKey::from_token(&token(TOKEN));
    let grant = Grant { backend: 7, frontend: task.frontend_id, task: task.task_id, input: task.input };
    let answer = |backend_id: u32, capability| wire::CompletionHead {
        task_id: task.task_id,
        status: wire::TaskStatus::Ok as u32,
        output_kind: wire::OutputKind::Inline as u32,
        backend_id,
        capability,
        ..wire::CompletionHead::default()
    };
    let send = |peer: &mut SimPeer, head: wire::CompletionHead, out: &'static [u8]| {
        peer.send_encoded(|b| wire::encode_completion(b, &head, out)).unwrap();
    };
    // Backend 8 forges: with 7's capability under its own id, under 7's
    // id, and with a guess.
    send(&mut eight, answer(8, key.sign(&grant)), b"forged");
    send(&mut eight, answer(7, key.sign(&grant)), b"forged");
    send(&mut eight, answer(8, [1u8; 16]), b"forged");
    fe.poll(Instant::ZERO);
    assert_eq!(fe.staging().counters().snapshot().refused, 3, "each forgery refused and counted");
    assert!(poll_now(&mut ticket).is_pending(), "the request still waits");
    assert_eq!(fe.stats().backends.load(Ordering::Relaxed), 2, "a refused completion does not cost the link");
    send(&mut seven, answer(7, key.sign(&grant)), b"real");
    fe.poll(Instant::ZERO);
    assert!(matches!(poll_now(&mut ticket), std::task::Poll::Ready(Outcome::Ok(ref b)) if b == b"real"));
    let c = fe.staging().counters().snapshot();
    assert_eq!((c.refused, c.succeeded), (3, 1));
}

fn poll_now(t: &mut crate::staging::Ticket) -> std::task::Poll<crate::staging::Outcome> {
    use std::future::Future;
    std::pin::Pin::new(t).poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
}
