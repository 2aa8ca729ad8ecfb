//! The join gate on a virtual clock: a backend that reports its readiness
//! is sent the frontends' announcements, then `Drain{Ready}`; nothing is
//! planned to it until it answers `Drain{Ready}`, and then its GPUs serve;
//! the wait is recorded, and the per-backend family the autoscaler reads
//! lists it only while its GPUs are in matchmaking.

use super::*;

use dataplane::control::metric;
use dataplane::wire::{Message, RemoteRef};

fn models() -> Vec<ModelSpec> {
    vec![ModelSpec::linear("a", 1.0, 5.0, 50.0).unwrap()]
}

fn plane() -> ControlPlane {
    let metrics = Arc::new(SchedulerMetrics::new(&models()));
    ControlPlane::new(models(), &[vec![0]], CoreConfig::default(), metrics).unwrap()
}

fn task(n: u32) -> Task {
    Task {
        task_id: TaskId::new(1, 1, n).0,
        budget_ns: 40_000_000,
        model_id: 0,
        frontend_id: 1,
        input: RemoteRef { key: 1, len: 16, offset: u64::from(n) * 16 },
        ..Default::default()
    }
}

/// What went to backend `b`, in order: "announce F", "ready", "plan".
fn sent_to(p: &mut ControlPlane, b: u32) -> Vec<String> {
    let mut out = Vec::new();
    for (to, bytes) in p.outbox().iter() {
        if to != PeerId::Backend(b) {
            continue;
        }
        match wire::decode(bytes).expect("the plane sends valid messages") {
            Message::Register(r) => out.push(format!("announce {}", r.id)),
            Message::Drain(d) if d.stage() == Some(wire::DrainStage::Ready) && d.backend_id == b => out.push("ready".into()),
            Message::BatchPlan(..) => out.push("plan".into()),
            _ => {}
        }
    }
    p.outbox().clear();
    out
}

/// The plane's `/metrics` text.
fn scrape(p: &ControlPlane) -> String {
    p.metrics().registry().encode()
}

/// Offers tasks and runs the timers for 100 ms; the messages to backend 10.
fn offer_load(p: &mut ControlPlane, now: &mut Instant, from: u32) -> Vec<String> {
    for n in from..from + 20 {
        p.on_task(*now, 1, &task(n));
    }
    let until = *now + Duration::from_millis(100);
    while let Some(t) = p.poll_at().filter(|&t| t <= until) {
        *now = t.max(*now);
        p.on_wake(*now);
    }
    *now = until;
    sent_to(p, 10)
}

#[test]
fn a_gated_backend_serves_only_once_it_reports_its_data_links_up() {
    let mut p = plane();
    let mut now = Instant::ZERO;
    p.frontend_joined(1, "fe1").unwrap();
    p.frontend_joined(2, "fe2").unwrap();
    p.outbox().clear();
    p.backend_registered(now, 10, 1, &[0], &[], true).unwrap();
    // The announcements, then the request: "those were all".
    assert_eq!(sent_to(&mut p, 10), ["announce 1", "announce 2", "ready"]);
    assert_eq!(p.online_gpus(), 0, "behind the gate");
    assert_eq!(metric(&scrape(&p), "symphony_backend_planned_busy_ns{backend=\"10\"}"), None);
    // Tasks wait (or drop at their deadlines): nothing is planned to it.
    assert!(!offer_load(&mut p, &mut now, 0).contains(&"plan".to_string()));
    // A Ready from another, unknown backend changes nothing.
    p.backend_ready(now, 11);
    assert_eq!(p.online_gpus(), 0);
    now += Duration::from_millis(7);
    p.backend_ready(now, 10);
    assert_eq!(p.online_gpus(), 1);
    let text = scrape(&p);
    assert_eq!(metric(&text, "symphony_backend_join_ms_count"), Some(1.0));
    // Registered at 0, ready 107 ms later (the 100 ms of load, then 7).
    assert_eq!(metric(&text, "symphony_backend_join_ms_sum"), Some(107.0));
    assert_eq!(metric(&text, "symphony_backend_planned_busy_ns{backend=\"10\"}"), Some(0.0));
    assert!(offer_load(&mut p, &mut now, 100).contains(&"plan".to_string()));
    let busy = metric(&scrape(&p), "symphony_backend_planned_busy_ns{backend=\"10\"}").unwrap();
    assert!(busy > 0.0, "its planned busy time counts: {busy}");
    // A repeated Ready changes nothing (no second join recorded).
    p.backend_ready(now, 10);
    assert_eq!(metric(&scrape(&p), "symphony_backend_join_ms_count"), Some(1.0));
    // Draining takes it out of the family the autoscaler reads.
    p.backend_draining(now, 10);
    assert_eq!(metric(&scrape(&p), "symphony_backend_planned_busy_ns{backend=\"10\"}"), None);
}

#[test]
fn a_backend_that_does_not_report_readiness_serves_at_once_and_a_draining_one_never_passes_the_gate() {
    let mut p = plane();
    let now = Instant::ZERO;
    p.frontend_joined(1, "fe1").unwrap();
    p.outbox().clear();
    p.backend_joined(now, 10, 1, &[0], &[]).unwrap();
    assert_eq!(sent_to(&mut p, 10), ["announce 1"], "no request without the flag");
    assert_eq!(p.online_gpus(), 1);
    assert_eq!(metric(&scrape(&p), "symphony_backend_planned_busy_ns{backend=\"10\"}"), Some(0.0));
    // Gated, then told to drain before its links came up: never serves.
    p.backend_registered(now, 11, 1, &[0], &[], true).unwrap();
    p.backend_draining(now, 11);
    p.backend_ready(now, 11);
    assert_eq!(p.online_gpus(), 1);
    assert_eq!(metric(&scrape(&p), "symphony_backend_join_ms_count"), Some(0.0));
    // Leaving takes a serving one out of the family.
    p.backend_left(now, 10);
    assert_eq!(metric(&scrape(&p), "symphony_backend_planned_busy_ns{backend=\"10\"}"), None);
}
