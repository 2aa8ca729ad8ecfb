//! On a virtual clock: a GPU whose batch is overdue stays out of
//! matchmaking until a report from it comes (or a grace more), and
//! a frontend that registers while backends serve has its tasks planned
//! only once every serving backend said its data link to it is up.

use super::*;

use dataplane::wire::{Message, RemoteRef};

/// l(b) = b + 5 ms, SLO 50 ms.
fn models() -> Vec<ModelSpec> {
    vec![ModelSpec::linear("a", 1.0, 5.0, 50.0).unwrap()]
}

fn ms(n: u64) -> Instant {
    Instant::from_nanos(n * 1_000_000)
}

fn plane() -> ControlPlane {
    let metrics = Arc::new(SchedulerMetrics::new(&models()));
    ControlPlane::new(models(), &[vec![0]], CoreConfig::default(), metrics).unwrap()
}

fn task(frontend: u32, n: u32) -> Task {
    Task {
        task_id: TaskId::new(frontend, 1, n).0,
        budget_ns: 40_000_000,
        model_id: 0,
        frontend_id: frontend,
        input: RemoteRef { key: 1, len: 16, offset: u64::from(n) * 16 },
        ..Default::default()
    }
}

/// What the plane sent since the last call, in order: "ready to B",
/// "plan to B of [frontends]" (one entry per frontend of its tasks).
fn sent(p: &mut ControlPlane) -> Vec<String> {
    let mut out = Vec::new();
    for (to, bytes) in p.outbox().iter() {
        let PeerId::Backend(b) = to else { continue };
        match wire::decode(bytes).expect("the plane sends valid messages") {
            Message::Drain(d) if d.stage() == Some(wire::DrainStage::Ready) => out.push(format!("ready to {b}")),
            Message::BatchPlan(_, tasks) => {
                let mut fronts: Vec<u32> = tasks.iter().map(|t| TaskId(t.task_id).frontend()).collect();
                fronts.dedup();
                out.push(format!("plan to {b} of {fronts:?}"));
            }
            _ => {}
        }
    }
    p.outbox().clear();
    out
}

/// Every batch planned since the last call: (batch, backend, GPU).
fn plans(p: &mut ControlPlane) -> Vec<(u64, u32, u32)> {
    let mut out = Vec::new();
    for (to, bytes) in p.outbox().iter() {
        if let (PeerId::Backend(b), Ok(Message::BatchPlan(h, _))) = (to, wire::decode(bytes)) {
            out.push((h.batch_id, b, h.gpu_id));
        }
    }
    p.outbox().clear();
    out
}

/// Runs the plane's timers (and gives up overdue batches) up to `until`.
fn run_until(p: &mut ControlPlane, now: &mut Instant, until: Instant) {
    for _ in 0..10_000 {
        let Some(t) = [p.poll_at(), p.next_expiry()].into_iter().flatten().min().filter(|&t| t <= until) else { break };
        *now = t.max(*now);
        p.expire_overdue(*now);
        p.on_wake(*now);
    }
    *now = until;
}

/// [`run_until`] `d` from `now`.
fn run_for(p: &mut ControlPlane, now: &mut Instant, d: Duration) {
    let until = *now + d;
    run_until(p, now, until);
}

fn report(batch: u64, gpu: u32) -> wire::BatchDone {
    wire::BatchDone { batch_id: batch, gpu_id: gpu, count: 1, start_ago_ns: 6_000_000, ..Default::default() }
}

/// Offers frontend 1's tasks `tasks`, one every 10 ms, reporting at once
/// each batch planned whose (index among those planned here, backend)
/// `reports` picks; every batch planned, in order.
fn serve(p: &mut ControlPlane, now: &mut Instant, tasks: std::ops::Range<u32>, reports: impl Fn(usize, u32) -> bool) -> Vec<(u64, u32, u32)> {
    let mut planned = Vec::new();
    for n in tasks {
        p.on_task(*now, 1, &task(1, n));
        run_until(p, now, *now + Duration::from_millis(10));
        for (batch, b, gpu) in plans(p) {
            if reports(planned.len(), b) {
                p.on_batch_done(*now, b, &report(batch, gpu));
            }
            planned.push((batch, b, gpu));
        }
    }
    planned
}

/// Runs until `got` holds a plan (adding those made meanwhile).
fn until_planned(p: &mut ControlPlane, now: &mut Instant, mut got: Vec<(u64, u32, u32)>) -> Vec<(u64, u32, u32)> {
    for _ in 0..100 {
        if !got.is_empty() {
            break;
        }
        run_for(p, now, Duration::from_millis(1));
        got.extend(plans(p));
    }
    got
}

/// Runs until the next batch in flight is overdue (its GPU suspect, or
/// the batch given up).
fn until_overdue(p: &mut ControlPlane, now: &mut Instant) {
    let t = p.next_expiry().expect("a batch in flight");
    run_until(p, now, t);
}

#[test]
fn a_gpu_whose_batch_is_overdue_is_planned_again_only_after_it_reports() {
    let mut p = plane();
    p.set_batch_grace(Duration::from_millis(100));
    let mut now = Instant::ZERO;
    p.frontend_joined(1, "fe1").unwrap();
    p.backend_joined(now, 10, 1, &[0], &[]).unwrap();
    p.backend_joined(now, 11, 1, &[0], &[]).unwrap();
    p.outbox().clear();
    // One task: planned on backend 10's GPU (the lower id), never reported.
    let first = serve(&mut p, &mut now, 0..1, |_, _| false);
    let first = until_planned(&mut p, &mut now, first);
    assert_eq!(first.iter().map(|x| (x.1, x.2)).collect::<Vec<_>>(), [(10, 0)]);
    assert_eq!(held_metrics(&p), (0, 0));
    until_overdue(&mut p, &mut now);
    assert_eq!(p.online_gpus(), 1, "overdue: backend 10's GPU is held out");
    assert_eq!(held_metrics(&p), (1, 1), "held now, once ever");
    assert_eq!(p.batches_in_flight(), 1, "long before the batch is given up");
    // Work meanwhile goes to backend 11 only, also once the batch is given
    // up.
    let meanwhile = serve(&mut p, &mut now, 1..9, |_, b| b == 11);
    for _ in 0..3 {
        if p.batches_in_flight() > 0 {
            until_overdue(&mut p, &mut now);
        }
    }
    assert_eq!(p.batches_in_flight(), 0, "given up");
    let meanwhile: Vec<_> = meanwhile.into_iter().chain(serve(&mut p, &mut now, 9..15, |_, b| b == 11)).collect();
    assert!(!meanwhile.is_empty() && meanwhile.iter().all(|x| x.1 == 11), "{meanwhile:?}");
    // Its late report brings it back.
    p.on_batch_done(now, 10, &report(first[0].0, 0));
    assert_eq!(p.online_gpus(), 2);
    assert_eq!(held_metrics(&p).0, 0, "back in matchmaking: none held");
    assert_eq!(p.metrics().late_batch_reports.get(), 1);
    // No report at all: held once given up, back at the bound.
    let again = serve(&mut p, &mut now, 15..40, |_, b| b == 11);
    assert!(again.iter().any(|x| x.1 == 10), "backend 10 is planned again: {again:?}");
    let mut online = Vec::new();
    for _ in 0..60 {
        run_for(&mut p, &mut now, Duration::from_millis(10));
        online.push(p.online_gpus());
    }
    assert!(online.contains(&1) && online.last() == Some(&2), "{online:?}");
    let (now_held, ever) = held_metrics(&p);
    assert!(now_held == 0 && ever >= 2, "held again once given up, back at the bound: {now_held}, {ever}");
}

/// (`symphony_gpus_held`, `symphony_gpu_holds_total`) as `/metrics` shows them.
fn held_metrics(p: &ControlPlane) -> (u64, u64) {
    let text = p.metrics().registry().encode();
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{name} not in /metrics:\n{text}")) as u64
    };
    (value("symphony_gpus_held"), value("symphony_gpu_holds_total"))
}

#[test]
fn a_lost_report_does_not_hold_a_gpu_that_reported_a_later_batch_nor_does_a_drained_one_return() {
    let mut p = plane();
    p.set_batch_grace(Duration::from_millis(100));
    let mut now = Instant::ZERO;
    p.frontend_joined(1, "fe1").unwrap();
    p.backend_joined(now, 10, 1, &[0], &[]).unwrap();
    p.outbox().clear();
    // Every report but the first's comes (the first is lost).
    let planned = serve(&mut p, &mut now, 0..30, |i, _| i > 0);
    assert!(planned.len() >= 3, "{planned:?}");
    run_for(&mut p, &mut now, Duration::from_millis(300));
    assert_eq!(p.batches_in_flight(), 0);
    assert_eq!(p.online_gpus(), 1, "a later batch was reported: the GPU works");
    // Given up, held, then drained: its late report does not bring it back.
    let last = serve(&mut p, &mut now, 100..101, |_, _| false);
    let last = until_planned(&mut p, &mut now, last);
    until_overdue(&mut p, &mut now);
    assert_eq!(p.online_gpus(), 0);
    p.backend_draining(now, 10);
    p.on_batch_done(now, 10, &report(last[0].0, 0));
    run_for(&mut p, &mut now, Duration::from_millis(300));
    assert_eq!(p.online_gpus(), 0);
}

#[test]
fn a_frontend_joining_a_running_cluster_is_planned_only_once_the_backends_linked_it() {
    let mut p = plane();
    let mut now = Instant::ZERO;
    p.frontend_joined(1, "fe1").unwrap();
    // Two gated backends past the gate, one test peer without the flag.
    for b in [10, 11] {
        p.backend_registered(now, b, 1, &[0], &[], true).unwrap();
        p.backend_ready(now, b);
    }
    p.backend_joined(now, 12, 1, &[0], &[]).unwrap();
    p.outbox().clear();
    p.frontend_joined(2, "fe2").unwrap();
    assert_eq!(sent(&mut p), ["ready to 10", "ready to 11"], "asked after the announcement");
    // Frontend 3 joins before the answers: asked once those come.
    p.frontend_joined(3, "fe3").unwrap();
    assert_eq!(sent(&mut p), Vec::<String>::new());
    for n in 0..5 {
        for f in [1, 2] {
            p.on_task(now, f, &task(f, n));
        }
    }
    assert_eq!(p.waiting_tasks(), 5, "frontend 2's tasks are held");
    now = ms(5);
    p.backend_ready(now, 10);
    assert_eq!(sent(&mut p), ["ready to 10"], "asked again for frontend 3");
    assert_eq!(p.waiting_tasks(), 5, "backend 11 has not answered");
    p.backend_ready(now, 11);
    assert_eq!(sent(&mut p), ["ready to 11"]);
    assert_eq!(p.waiting_tasks(), 10, "frontend 2's tasks are taken now");
    run_until(&mut p, &mut now, ms(60));
    let planned = sent(&mut p);
    assert!(planned.iter().any(|s| s.split(" of ").nth(1).is_some_and(|f| f.contains('2'))), "{planned:?}");
    assert_eq!(p.waiting_tasks(), 0);
    // Frontend 3 waits for both second answers; backend 11 leaves.
    for n in 0..5 {
        p.on_task(now, 3, &task(3, n));
    }
    p.backend_ready(now, 10);
    assert_eq!(p.waiting_tasks(), 0);
    p.backend_left(now, 11);
    run_until(&mut p, &mut now, ms(120));
    assert!(sent(&mut p).iter().any(|s| s.ends_with("of [3]")), "linked by 10, and 11 left");
}

#[test]
fn a_frontend_whose_links_are_never_reported_is_planned_after_the_bound_and_its_held_tasks_go_with_it() {
    let mut p = plane();
    let mut now = Instant::ZERO;
    p.backend_registered(now, 10, 1, &[0], &[], true).unwrap();
    p.backend_ready(now, 10);
    p.frontend_joined(1, "fe1").unwrap();
    p.frontend_joined(2, "fe2").unwrap();
    p.outbox().clear();
    // Frontend 2 leaves with a task held: it goes; frontend 1's wait ends
    // at the bound from its first task (the answer was lost).
    p.on_task(now, 2, &task(2, 0));
    p.frontend_left(2);
    now = ms(500);
    let long = Task { budget_ns: 5_000_000_000, ..task(1, 0) };
    p.on_task(now, 1, &long);
    run_until(&mut p, &mut now, ms(1400));
    assert_eq!(p.waiting_tasks(), 0, "held");
    run_until(&mut p, &mut now, ms(1600));
    assert_eq!(p.waiting_tasks(), 1, "taken at the bound");
    // Shutdown answers what is still held.
    p.frontend_joined(3, "fe3").unwrap();
    p.outbox().clear();
    p.on_task(now, 3, &task(3, 0));
    assert_eq!(p.waiting_tasks(), 1);
    p.stop();
    let dropped = p.outbox().iter().filter(|(to, _)| *to == PeerId::Frontend(3)).count();
    assert_eq!(dropped, 1);
}
