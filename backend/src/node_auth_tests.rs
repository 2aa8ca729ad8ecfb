//! The backend's side of the authenticated registration, against the real
//! scheduler node over the `sim` transport: the token, the announced
//! control delay (and its override), and that a refused backend's models
//! never reach the scheduler.

use super::*;
use crate::exec::ExecModel;
use crate::worker::WorkerConfig;
use crate::EmulatedExecutor;
use std::sync::Arc;
use dataplane::join::{JoinToken, NonceSource};
use dataplane::mem::{Access, Region};
use dataplane::transport::sim::{FaultConfig, SimConn, SimNet};
use dataplane::transport::{Domain, Listener, Registration};
use dataplane::wire::RefuseReason;
use scheduler::daemon::metrics::SchedulerMetrics;
use scheduler::daemon::node::{Membership, NodeConfig, SchedulerNode};
use scheduler::daemon::plane::ControlPlane;
use scheduler::deferred::CoreConfig;
use scheduler::netdelay::NetworkDelay;
use scheduler::profile::LatencyProfile;

const TOKEN: &[u8] = b"backend test token, long enough";
const D_CTRL: Duration = Duration::from_micros(300);

type Node = BackendNode<SimConn, EmulatedExecutor>;

fn token(t: &[u8]) -> JoinToken {
    JoinToken::new(t).unwrap()
}

fn config() -> BackendNodeConfig {
    BackendNodeConfig {
        id: 4,
        gpus: 2,
        served: vec![0],
        cluster_models: 1,
        max_frontends: 8,
        heartbeat: Duration::from_millis(100),
        dead_after: Duration::from_millis(1000),
        handshake_timeout: Duration::from_millis(1000),
        replace_timeout: Duration::from_millis(100),
        drain_timeout: Duration::from_millis(100),
    }
}

/// The real scheduler (one model, `d_ctrl` = [`D_CTRL`]) requiring
/// [`TOKEN`], and a backend connected to it.
fn pair(net: &SimNet, held: Option<JoinToken>, delay_override: Option<Duration>) -> (SchedulerNode<SimConn>, Node) {
    let models = vec![scheduler::zoo::ModelSpec::linear("m0", 1.0, 1.0, 500.0).unwrap()];
    let metrics = Arc::new(SchedulerMetrics::new(&models));
    let core = CoreConfig { delay: NetworkDelay { d_ctrl: D_CTRL, d_data: Duration::ZERO }, ..CoreConfig::default() };
    let plane = ControlPlane::new(models, &[vec![0]], core, metrics).unwrap();
    let mut sched = SchedulerNode::new(plane, NodeConfig::default())
        .with_membership(Membership { nonces: NonceSource::Seeded(4), ..Membership::with_token(token(TOKEN)) });
    let mut listener = net.domain(0).listen("sim:scheduler").unwrap();
    let conn = net.domain(1).connect("sim:scheduler", Duration::ZERO).unwrap();
    sched.handle_connection(Instant::ZERO, listener.accept(Duration::ZERO).unwrap());
    let wcfg = WorkerConfig { max_batch: 4, input_slot: 16, output_slot: 16, batch_slots: 2, max_frontends: 8, ..WorkerConfig::default() };
    let staging = Region::anonymous(wcfg.staging_bytes() as usize).unwrap();
    let reg = Registration::new(1, staging.clone(), Access::LOCAL_WRITE, 0);
    let exec = EmulatedExecutor::new(
        staging,
        2,
        4,
        vec![ExecModel { profile: LatencyProfile::linear(0.2, 1.0, 64).unwrap(), output_len: 16 }],
    );
    let worker = BatchWorker::new(wcfg, exec, reg, conn).unwrap();
    let node = BackendNode::new(config(), worker).with_join_token(held).with_control_delay_override(delay_override);
    (sched, node)
}

/// Both nodes for `ms` virtual milliseconds; the backend's events.
fn run(net: &SimNet, sched: &mut SchedulerNode<SimConn>, be: &mut Node, ms: u64) -> Vec<BackendEvent> {
    let mut now = Instant::ZERO;
    for _ in 0..ms {
        net.set_now(now);
        while sched.poll(now) | be.poll(now) {}
        now += Duration::from_millis(1);
    }
    std::iter::from_fn(|| be.poll_event()).collect()
}

/// Registered, then through the join gate at once (no frontend to link).
const REGISTERED_AND_READY: [BackendEvent; 2] = [BackendEvent::Registered, BackendEvent::Ready { after: Duration::ZERO, missing: 0 }];

#[test]
fn a_backend_with_the_token_registers_and_uses_the_announced_control_delay() {
    let net = SimNet::new(1, FaultConfig::default());
    let (mut sched, mut be) = pair(&net, Some(token(TOKEN)), None);
    assert_eq!(run(&net, &mut sched, &mut be, 20), REGISTERED_AND_READY);
    let d = be.control_delay().unwrap();
    assert_eq!(d, ControlDelay { bound: D_CTRL, announced: D_CTRL, overridden: false });
    assert_eq!(be.worker().control_delay(), D_CTRL);
    assert_eq!(d.to_string(), "control delay bound 300 µs (announced by the scheduler)");
    assert_eq!(sched.plane().online_gpus(), 2);

    let net = SimNet::new(2, FaultConfig::default());
    let override_ = Duration::from_micros(40);
    let (mut sched, mut be) = pair(&net, Some(token(TOKEN)), Some(override_));
    assert_eq!(run(&net, &mut sched, &mut be, 20), REGISTERED_AND_READY);
    assert_eq!(be.worker().control_delay(), override_);
    assert!(be.control_delay().unwrap().to_string().contains("override; the scheduler announced 300 µs"));
}

#[test]
fn a_backend_with_a_wrong_or_no_token_is_refused_and_its_gpus_never_join() {
    for (held, reason) in [(Some(token(b"the token of another cluster")), RefuseReason::BadToken), (None, RefuseReason::NoToken)] {
        let net = SimNet::new(3, FaultConfig::default());
        let (mut sched, mut be) = pair(&net, held, None);
        let ev = run(&net, &mut sched, &mut be, 20);
        let [BackendEvent::Refused { why }] = &ev[..] else { panic!("{ev:?}") };
        assert!(why.starts_with(&format!("the scheduler refused the registration of backend 4: {reason} ")), "{why}");
        assert!(be.drained(), "a refused backend does nothing more");
        assert!(!be.registered());
        assert_eq!(sched.plane().metrics().refused[reason.index()].get(), 1);
        assert_eq!((sched.plane().peers(), sched.plane().online_gpus()), ((0, 0), 0));
        let sched_events: Vec<String> = std::iter::from_fn(|| sched.poll_event()).map(|e| e.to_string()).collect();
        assert!(sched_events[0].starts_with("registration refused: backend 4: "), "{sched_events:?}");
    }
}
