//! The control plane driven on a virtual clock: registration, tasks to
//! plans, failing back, cancels, routing moves, the closed loop, the
//! pinned engine against the inline one, and the fence.

use super::*;

use std::sync::atomic::Ordering;

use dataplane::wire::MAX_FRONTENDS;

#[test]
fn task_budgets_are_clamped_to_a_minute() {
    let now = Instant::from_nanos(5);
    assert_eq!(task_deadline(now, 40_000_000), now + Duration::from_millis(40));
    assert_eq!(task_deadline(now, u64::MAX), now + MAX_TASK_BUDGET);
}

use dataplane::wire::{Message, RemoteRef};
use crate::runtime::{Drive, PinnedConfig};

fn models() -> Vec<ModelSpec> {
    vec![
        ModelSpec::linear("a", 1.0, 5.0, 50.0).unwrap(),
        ModelSpec::linear("b", 2.0, 5.0, 100.0).unwrap(),
    ]
}

fn plane(subclusters: &[Vec<u32>]) -> ControlPlane {
    let metrics = Arc::new(SchedulerMetrics::new(&models()));
    ControlPlane::new(models(), subclusters, CoreConfig::default(), metrics).unwrap()
}

/// The id of a frontend's `seq`-th task (its frontend field set).
/// Test task `n` of `frontend`: in staging slot `n`, as a frontend
/// numbers tasks in flight together (the duplicate filter goes by
/// slot: see `task_ids`).
fn tid(n: u64, frontend: u32) -> u64 {
    TaskId::new(frontend, 1, n as u32).0
}

fn task(id: u64, model: u32, frontend: u32) -> Task {
    Task {
        task_id: tid(id, frontend),
        budget_ns: 40_000_000,
        model_id: model,
        frontend_id: frontend,
        input: RemoteRef {
            key: 1,
            len: 16,
            offset: id * 16,
        },
        ..Default::default()
    }
}

/// Every message in the outbox, decoded, with its peer; clears it.
fn drain(p: &mut ControlPlane) -> Vec<(PeerId, String)> {
    let out = p
        .outbox()
        .iter()
        .map(|(to, b)| (to, format!("{:?}", wire::decode(b).expect("valid message"))))
        .collect();
    p.outbox().clear();
    out
}

fn run_until_quiet(p: &mut ControlPlane, from: Instant, limit: Instant) -> Instant {
    let mut now = from;
    while let Some(t) = p.poll_at() {
        if t > limit {
            break;
        }
        now = t.max(now);
        p.on_wake(now);
    }
    now
}

#[test]
fn registration_acks_announces_frontends_and_refuses_bad_peers() {
    let mut p = plane(&[vec![0, 1]]);
    let t0 = Instant::ZERO;
    p.frontend_joined(3, "fe3").unwrap();
    assert_eq!(p.frontend_joined(3, "again"), Err(Refusal::Duplicate(3)));
    assert_eq!(p.frontend_joined(MAX_FRONTENDS, "x"), Err(Refusal::BadId(MAX_FRONTENDS)));
    p.backend_joined(t0, 7, 2, &[0, 1], &[]).unwrap();
    assert_eq!(p.backend_joined(t0, 8, 1, &[0], &[]), Err(Refusal::NoSubCluster));
    assert_eq!(p.backend_joined(t0, 9, 1, &[0, 5], &[]), Err(Refusal::UnknownModel(5)));
    assert_eq!(p.backend_joined(t0, 9, 0, &[0, 1], &[]), Err(Refusal::NoGpus));
    p.frontend_joined(4, "fe4").unwrap();
    let msgs = drain(&mut p);
    let to_backend: Vec<&String> = msgs
        .iter()
        .filter(|(to, _)| *to == PeerId::Backend(7))
        .map(|(_, m)| m)
        .collect();
    assert_eq!(to_backend.len(), 3, "ack + fe3 + fe4: {to_backend:?}");
    assert!(to_backend[1].contains("id: 3"));
    assert!(to_backend[2].contains("id: 4"));
    assert_eq!(msgs.iter().filter(|(to, _)| *to == PeerId::Frontend(3)).count(), 1);
    assert_eq!(p.online_gpus(), 2);
}

#[test]
fn tasks_become_plans_on_the_owning_backend_and_a_dead_backend_fails_its_batches_back() {
    let mut p = plane(&[vec![0], vec![1]]);
    let t0 = Instant::ZERO;
    p.frontend_joined(1, "fe").unwrap();
    p.backend_joined(t0, 10, 1, &[0], &[]).unwrap();
    p.backend_joined(t0, 11, 1, &[1], &[]).unwrap();
    drain(&mut p);
    for i in 0..4 {
        p.on_task(t0, 1, &task(100 + i, 0, 1));
        p.on_task(t0, 1, &task(200 + i, 1, 1));
    }
    // A task naming another frontend is refused without an answer.
    p.on_task(t0, 1, &task(300, 0, 2));
    let now = run_until_quiet(&mut p, t0, t0 + Duration::from_millis(200));
    let msgs = drain(&mut p);
    let plans: Vec<&(PeerId, String)> =
        msgs.iter().filter(|(_, m)| m.starts_with("BatchPlan")).collect();
    assert!(plans.iter().any(|(to, m)| *to == PeerId::Backend(10) && m.contains("model_id: 0")));
    assert!(plans.iter().any(|(to, m)| *to == PeerId::Backend(11) && m.contains("model_id: 1")));
    assert!(plans.iter().all(|(to, m)| (*to == PeerId::Backend(10)) == m.contains("model_id: 0")));
    assert_eq!(p.waiting_tasks(), 0);
    let inflight = p.batches_in_flight();
    assert!(inflight >= 2);
    // Backend 11 dies before reporting: each of its tasks fails back once.
    p.backend_left(now, 11);
    let msgs = drain(&mut p);
    let failed: Vec<&String> = msgs
        .iter()
        .filter(|(to, m)| *to == PeerId::Frontend(1) && m.contains("status: 3"))
        .map(|(_, m)| m)
        .collect();
    assert_eq!(failed.len(), 4, "{msgs:?}");
    for i in 0..4 {
        assert!(failed.iter().any(|m| m.contains(&format!("task_id: {}", tid(200 + i, 1)))));
    }
    assert_eq!(p.online_gpus(), 1);
    // New tasks of model 1 now wait with no GPU and are dropped at their deadline.
    p.on_task(now, 1, &task(400, 1, 1));
    run_until_quiet(&mut p, now, now + Duration::from_secs_f64(1.0));
    let msgs = drain(&mut p);
    assert!(msgs.iter().any(|(_, m)| m.starts_with("Dropped") && m.contains(&format!("task_id: {}", tid(400, 1)))), "{msgs:?}");
}

#[test]
fn a_repeated_task_is_ignored_while_its_original_can_run_and_forgotten_after() {
    let mut p = plane(&[vec![0]]);
    let t0 = Instant::ZERO;
    p.frontend_joined(1, "fe").unwrap();
    p.backend_joined(t0, 10, 1, &[0], &[]).unwrap();
    drain(&mut p);
    p.on_task(t0, 1, &task(7, 0, 1));
    p.on_task(t0, 1, &task(7, 0, 1));
    let mut now = t0;
    while p.batches_in_flight() == 0 {
        now = p.poll_at().expect("a timer until the task is planned");
        p.on_wake(now);
    }
    assert!(now < t0 + Duration::from_millis(40), "planned before its deadline");
    // A copy that arrives after the original was planned is still a copy.
    p.on_task(now, 1, &task(7, 0, 1));
    run_until_quiet(&mut p, now, now + Duration::from_millis(100));
    let plans = drain(&mut p).iter().filter(|(_, m)| m.starts_with("BatchPlan")).count();
    assert_eq!(plans, 1);
    assert_eq!(p.duplicate_tasks(), 2);
    // Past the original's deadline the id is forgotten (ids are reused
    // only with a new sequence number, so nothing old comes back).
    let later = t0 + Duration::from_millis(500);
    p.on_task(later, 1, &task(7, 0, 1));
    assert_eq!(p.duplicate_tasks(), 2);
}

#[test]
fn stop_drops_waiting_tasks_and_refuses_new_ones() {
    let mut p = plane(&[vec![0, 1]]);
    let t0 = Instant::ZERO;
    p.frontend_joined(1, "fe").unwrap();
    drain(&mut p);
    p.on_task(t0, 1, &task(1, 0, 1));
    p.on_task(t0, 1, &task(2, 5, 1));
    p.stop();
    p.on_task(t0, 1, &task(3, 0, 1));
    let msgs = drain(&mut p);
    let reasons: Vec<(u64, u32)> = p_decode_drops(&msgs);
    assert!(reasons.contains(&(tid(2, 1), DropReason::UnknownModel as u32)));
    assert!(reasons.contains(&(tid(1, 1), DropReason::Shutdown as u32)));
    assert!(reasons.contains(&(tid(3, 1), DropReason::Shutdown as u32)));
}

#[test]
fn cancels_timeouts_and_queue_bounds_answer_the_frontend_with_their_reason() {
    let mut p = plane(&[vec![0, 1]]);
    let t0 = Instant::ZERO;
    p.frontend_joined(1, "fe").unwrap();
    p.frontend_joined(2, "fe2").unwrap();
    drain(&mut p);
    p.set_admission(0, crate::deferred::Admission { levels: 2, default_level: 2, max_queue: 2 });
    // No backend: every task waits.
    p.on_task(t0, 1, &task(1, 0, 1));
    p.on_task(t0, 1, &Task { budget_ns: 10_000_000, flags: wire::TASK_BUDGET_IS_TIMEOUT, ..task(2, 0, 1) });
    p.on_task(t0, 1, &task(3, 0, 1));
    assert_eq!(p_decode_drops(&drain(&mut p)), [(tid(3, 1), DropReason::Overloaded as u32)]);
    // Another frontend cannot cancel it; an unknown id changes nothing.
    p.on_cancel(t0, 2, &wire::Cancel { task_id: tid(1, 1) });
    p.on_cancel(t0, 1, &wire::Cancel { task_id: tid(9, 1) });
    assert!(drain(&mut p).is_empty());
    assert_eq!(p.waiting_tasks(), 2);
    p.on_cancel(t0, 1, &wire::Cancel { task_id: tid(1, 1) });
    assert_eq!(p_decode_drops(&drain(&mut p)), [(tid(1, 1), DropReason::Cancelled as u32)]);
    assert_eq!(p.waiting_tasks(), 1);
    // The timed task ends by its 10 ms, as a timeout.
    let mut now = t0;
    while let Some(t) = p.poll_at().filter(|&t| t <= t0 + Duration::from_millis(10)) {
        now = t;
        p.on_wake(now);
    }
    assert_eq!(p_decode_drops(&drain(&mut p)), [(tid(2, 1), DropReason::Timeout as u32)]);
    assert!(now <= t0 + Duration::from_millis(10));
    assert_eq!(p.waiting_tasks(), 0);
    // Counted at their level: the default (lowest) one, 2.
    let text = p.metrics.encode();
    let by_level = |level: u32, reason: DropReason| {
        dataplane::control::metric(&text, &format!("symphony_tasks_dropped_by_level_total{{level=\"{level}\",reason=\"{}\"}}", reason.as_str()))
    };
    for r in [DropReason::Overloaded, DropReason::Cancelled, DropReason::Timeout] {
        assert_eq!((by_level(2, r), by_level(1, r)), (Some(1.0), Some(0.0)), "{r:?}");
    }
}

fn routes(revision: u64, a: &[&str], b: &[&str]) -> crate::routes::RouteTable {
    let g = |name: &str, models: &[&str]| crate::routes::RouteGroup {
        name: name.into(),
        election_key: format!("/k/{name}"),
        schedulers: vec![],
        models: models.iter().map(|m| m.to_string()).collect(),
        backends: vec![],
    };
    crate::routes::RouteTable { revision, groups: vec![g("a", a), g("b", b)] }
}

#[test]
fn a_model_moved_away_hands_its_queued_tasks_back_and_refuses_new_ones() {
    let mut p = plane(&[vec![0, 1]]);
    let t0 = Instant::ZERO;
    p.frontend_joined(1, "fe").unwrap();
    drain(&mut p);
    // No backend: every task waits.
    p.on_task(t0, 1, &task(1, 0, 1));
    p.on_task(t0, 1, &task(2, 1, 1));
    p.on_task(t0, 1, &task(3, 0, 1));
    assert!(p.set_routes(t0, &routes(1, &["a", "b"], &[]), "a"));
    assert!(drain(&mut p).is_empty(), "it owns both");
    // Revision 2 moves model "a" (id 0) to group b.
    assert!(p.set_routes(t0, &routes(2, &["b"], &["a"]), "a"));
    let mut moved = p_decode_drops(&drain(&mut p));
    moved.sort_unstable();
    assert_eq!(moved, [(tid(1, 1), DropReason::Moved as u32), (tid(3, 1), DropReason::Moved as u32)]);
    assert_eq!(p.waiting_tasks(), 1, "model b's task stays");
    p.on_task(t0, 1, &task(4, 0, 1));
    assert_eq!(p_decode_drops(&drain(&mut p)), [(tid(4, 1), DropReason::Moved as u32)]);
    // An older or equal revision arriving late changes nothing.
    assert!(!p.set_routes(t0, &routes(1, &["a", "b"], &[]), "a"));
    assert!(!p.owns(0) && p.owns(1) && p.route_revision() == 2);
    let text = p.metrics.encode();
    assert!(text.contains("moved"), "drops by reason count moved");
    // Model "a" comes back: a late copy of a task's attempt handed
    // back is ignored; its next attempt (the frontend's resubmission,
    // same id) is a new submission, not a duplicate.
    assert!(p.set_routes(t0, &routes(3, &["a", "b"], &[]), "a"));
    let dups = p.duplicate_tasks();
    p.on_task(t0, 1, &task(1, 0, 1));
    assert_eq!(p.duplicate_tasks(), dups + 1, "a copy of attempt 0, handed back");
    assert_eq!(p.waiting_tasks(), 1);
    p.on_task(t0, 1, &task(1, 0, 1).with_attempt(1));
    assert!(drain(&mut p).is_empty(), "taken, not answered");
    assert_eq!(p.waiting_tasks(), 2, "task 1 waits again beside model b's");
}

/// Seeded runs (the harness's ownership invariant at the plane): tasks
/// of two models arrive while the table moves model 0 in and out of
/// this group at random times. After a revision that takes a model
/// away, no plan of it leaves the plane, and every task ends exactly
/// once: in one plan or one drop.
#[test]
fn under_random_moves_no_plan_of_a_lost_model_leaves_and_every_task_ends_once() {
    use rand::{Rng, SeedableRng};
    for seed in 0..300u64 {
        let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(seed);
        let mut p = plane(&[vec![0, 1]]);
        let t0 = Instant::ZERO;
        p.frontend_joined(1, "fe").unwrap();
        p.backend_joined(t0, 10, 2, &[0, 1], &[]).unwrap();
        drain(&mut p);
        let mut ends: HashMap<u64, u32> = HashMap::new();
        let mut sent = 0u64;
        let mut revision = 0;
        let mut now = t0;
        let account = |p: &mut ControlPlane, ends: &mut HashMap<u64, u32>| {
            let owned = [p.owns(0), p.owns(1)];
            for (_, b) in p.outbox().iter() {
                match wire::decode(b) {
                    Ok(Message::BatchPlan(head, tasks)) => {
                        assert!(owned[head.model_id as usize], "seed {seed}: a plan of model {} after it moved away", head.model_id);
                        for t in tasks.iter() {
                            *ends.entry(t.task_id).or_default() += 1;
                        }
                    }
                    Ok(Message::Dropped(d)) => *ends.entry(d.task_id).or_default() += 1,
                    _ => {}
                }
            }
            p.outbox().clear();
        };
        for step in 0..400u64 {
            now += Duration::from_micros(rng.random_range(100..2_000));
            if rng.random_bool(0.03) {
                revision += 1;
                let table = if rng.random_bool(0.5) { routes(revision, &["a", "b"], &[]) } else { routes(revision, &["b"], &["a"]) };
                p.set_routes(now, &table, "a");
                account(&mut p, &mut ends);
            }
            let model = rng.random_range(0..2u32);
            p.on_task(now, 1, &task(step, model, 1));
            sent += 1;
            while let Some(t) = p.poll_at().filter(|&t| t <= now) {
                p.on_wake(t.max(now));
            }
            account(&mut p, &mut ends);
        }
        run_until_quiet(&mut p, now, now + Duration::from_millis(1000));
        account(&mut p, &mut ends);
        assert_eq!(ends.len() as u64, sent, "seed {seed}: every task ended");
        assert!(ends.values().all(|&n| n == 1), "seed {seed}: a task ended twice");
        assert_eq!(p.waiting_tasks(), 0);
    }
}

fn p_decode_drops(msgs: &[(PeerId, String)]) -> Vec<(u64, u32)> {
    msgs.iter()
        .filter_map(|(_, m)| {
            let id = m.split("task_id: ").nth(1)?.split(',').next()?.parse().ok()?;
            let r = m.split("reason: ").nth(1)?.split(',').next()?.parse().ok()?;
            Some((id, r))
        })
        .collect()
}

#[test]
fn reports_of_unknown_batches_and_tasks_naming_another_frontend_are_refused_and_counted() {
    let mut p = plane(&[vec![0, 1]]);
    let t0 = Instant::ZERO;
    p.frontend_joined(1, "fe").unwrap();
    p.backend_joined(t0, 10, 1, &[0, 1], &[]).unwrap();
    drain(&mut p);
    // The id's own frontend field says 2, the message says 1.
    let mut forged = task(5, 0, 1);
    forged.task_id = tid(5, 2);
    p.on_task(t0, 1, &forged);
    assert_eq!(p.waiting_tasks(), 0);
    p.on_batch_done(t0, 10, &wire::BatchDone { batch_id: 77, ..Default::default() });
    let refused = |p: &ControlPlane, r: MessageRefusal| p.metrics().closed_loop.refused_messages[r.index()].load(Ordering::Relaxed);
    assert_eq!(refused(&p, MessageRefusal::FrontendMismatch), 1);
    assert_eq!(refused(&p, MessageRefusal::UnknownBatch), 1);
    assert!(p.metrics().encode().contains("symphony_messages_refused_total{reason=\"unknown_batch\"} 1"));
}

#[test]
fn a_late_report_corrects_the_gpu_and_teaches_its_speed() {
    let mut p = plane(&[vec![0]]);
    let t0 = Instant::ZERO;
    p.frontend_joined(1, "fe").unwrap();
    p.backend_joined(t0, 10, 1, &[0], &[]).unwrap();
    drain(&mut p);
    let mut now = t0;
    let mut reported = 0;
    for round in 0..20u64 {
        p.on_task(now, 1, &task(round, 0, 1));
        while p.batches_in_flight() == 0 {
            now = p.poll_at().expect("a timer until the task is planned").max(now);
            p.on_wake(now);
        }
        let plan = drain(&mut p).into_iter().find(|(_, m)| m.starts_with("BatchPlan")).expect("a plan");
        let batch_id: u64 = plan.1.split("batch_id: ").nth(1).and_then(|v| v.split(',').next()).and_then(|v| v.parse().ok()).unwrap();
        // l(1) = 6 ms at profile; the GPU takes 9 ms, reported as it ends.
        now += Duration::from_millis(9);
        p.on_batch_done(now, 10, &wire::BatchDone { batch_id, start_ago_ns: 9_000_000, count: 1, ..Default::default() });
        reported += 1;
    }
    assert_eq!(reported, 20);
    let ratio = p.gpu_ratio(10, 0).expect("backend 10 is live");
    assert_eq!(ratio.samples(), 20);
    assert!((ratio.value() - 1.5).abs() < 0.01, "{ratio:?}");
    let e = p.model_estimate(10, 0, 0).unwrap();
    let (a, b) = e.alpha_beta_ms.unwrap();
    assert!((a - 1.5).abs() < 0.02 && (b - 7.5).abs() < 0.1, "{e:?}");
    p.publish_estimates(now);
    let text = p.metrics().encode();
    assert!(text.contains("symphony_gpu_speed_ratio{backend=\"10\",gpu=\"0\"} 1.4"), "{text}");
}

/// Drives a plane through a seeded workload on a virtual clock: two
/// frontends, two backends (one leaves half-way), tasks of both
/// models at random gaps, some cancelled, batches reported done late
/// (closed-loop corrections). Returns every message sent, in order.
fn recorded_workload(p: &mut ControlPlane) -> Vec<(PeerId, Vec<u8>)> {
    let mut sent = Vec::new();
    let take = |p: &mut ControlPlane, sent: &mut Vec<(PeerId, Vec<u8>)>| {
        sent.extend(p.outbox().iter().map(|(to, b)| (to, b.to_vec())));
        p.outbox().clear();
    };
    let t0 = Instant::ZERO;
    p.frontend_joined(1, "fe1").unwrap();
    p.frontend_joined(2, "fe2").unwrap();
    p.backend_joined(t0, 10, 2, &[0, 1], &[]).unwrap();
    p.backend_joined(t0, 11, 1, &[0, 1], &[]).unwrap();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut now = t0;
    let mut inflight: Vec<(Instant, u32, u64, u32)> = Vec::new();
    for i in 0..400u64 {
        let at = now + Duration::from_micros(next() % 900);
        // Timers and reports due before the next arrival, in time order.
        loop {
            let report = inflight.iter().map(|r| r.0).min();
            let t = [p.poll_at(), report].into_iter().flatten().filter(|&t| t <= at).min();
            let Some(t) = t else { break };
            now = t.max(now);
            if report == Some(t) {
                let k = inflight.iter().position(|r| r.0 == t).unwrap();
                let (_, backend, batch_id, count) = inflight.swap_remove(k);
                let done = wire::BatchDone { batch_id, start_ago_ns: 7_000_000, count, ..Default::default() };
                p.on_batch_done(now, backend, &done);
            } else {
                p.on_wake(now);
            }
            for (to, b) in p.outbox().iter() {
                if let (PeerId::Backend(be), Ok(Message::BatchPlan(h, _))) = (to, wire::decode(b)) {
                    inflight.push((now + Duration::from_nanos(h.exec_in_ns) + Duration::from_millis(7), be, h.batch_id, h.count));
                }
            }
            take(p, &mut sent);
        }
        now = at;
        let f = 1 + (i % 2) as u32;
        p.on_task(now, f, &task(i, (next() % 2) as u32, f));
        if i % 37 == 5 {
            p.on_cancel(now, f, &wire::Cancel { task_id: tid(i, f) });
        }
        if i == 200 {
            p.backend_left(now, 11);
        }
        for (to, b) in p.outbox().iter() {
            if let (PeerId::Backend(be), Ok(Message::BatchPlan(h, _))) = (to, wire::decode(b)) {
                inflight.push((now + Duration::from_nanos(h.exec_in_ns) + Duration::from_millis(7), be, h.batch_id, h.count));
            }
        }
        take(p, &mut sent);
    }
    run_until_quiet(p, now, now + Duration::from_secs_f64(1.0));
    take(p, &mut sent);
    sent
}

#[test]
fn the_pinned_engine_in_lockstep_sends_exactly_what_the_inline_engine_sends() {
    let inline = recorded_workload(&mut plane(&[vec![0, 1]]));
    let mut p = plane(&[vec![0, 1]]);
    let cfg = PinnedConfig { model_threads: 1, ..PinnedConfig::default() };
    let layout = p.set_engine(EngineKind::Pinned, &cfg, Drive::Lockstep).unwrap();
    assert_eq!(layout.len(), 2, "a ModelThread and the RankThread: {layout:?}");
    let shared = PinnedConfig { shared_rank: true, ..cfg.clone() };
    assert_eq!(plane(&[vec![0, 1]]).set_engine(EngineKind::Pinned, &shared, Drive::Lockstep).unwrap().len(), 1);
    let pinned = recorded_workload(&mut p);
    let plans = inline.iter().filter(|(_, b)| matches!(wire::decode(b), Ok(Message::BatchPlan(..)))).count();
    let drops = inline.iter().filter(|(_, b)| matches!(wire::decode(b), Ok(Message::Dropped(_)))).count();
    assert!(plans > 10 && drops > 0, "a workload that plans and drops: {plans} plans, {drops} drops");
    assert_eq!(inline.len(), pinned.len());
    for (i, (a, b)) in inline.iter().zip(&pinned).enumerate() {
        assert_eq!(a, b, "message {i} differs");
    }
}

#[test]
fn the_pinned_engine_on_threads_answers_every_task_once() {
    for shared_rank in [false, true] {
        pinned_threads_answer_every_task_once(shared_rank);
    }
}

fn pinned_threads_answer_every_task_once(shared_rank: bool) {
    let mut p = plane(&[vec![0], vec![1]]);
    let clock = dataplane::time::MonotonicClock::new();
    let cfg = PinnedConfig { model_threads: 2, shared_rank, ..PinnedConfig::default() };
    let layout = p.set_engine(EngineKind::Pinned, &cfg, Drive::Threads { clock, notify: None }).unwrap();
    let names: Vec<&str> = layout.iter().map(|t| t.thread.as_str()).collect();
    match shared_rank {
        false => assert_eq!(names, ["sched0-model-0", "sched0-rank", "sched1-model-0", "sched1-rank"]),
        true => assert_eq!(names, ["sched0-model-0", "sched1-model-0"]),
    }
    p.frontend_joined(1, "fe").unwrap();
    p.backend_joined(clock.now(), 10, 2, &[0], &[]).unwrap();
    p.backend_joined(clock.now(), 11, 2, &[1], &[]).unwrap();
    p.outbox().clear();
    const TASKS: u64 = 300;
    for i in 0..TASKS {
        p.on_task(clock.now(), 1, &task(i, (i % 2) as u32, 1));
    }
    p.on_cancel(clock.now(), 1, &wire::Cancel { task_id: tid(TASKS - 1, 1) });
    let mut answered = std::collections::HashMap::new();
    // Bounded by the tasks' 40 ms budget: by then each is planned or dropped.
    let give_up = clock.now() + Duration::from_secs_f64(5.0);
    while (answered.len() as u64) < TASKS && clock.now() < give_up {
        if !p.collect(clock.now()) {
            std::thread::yield_now();
        }
        for (_, b) in p.outbox().iter() {
            match wire::decode(b) {
                Ok(Message::BatchPlan(_, list)) => list.iter().for_each(|t| *answered.entry(t.task_id).or_insert(0) += 1),
                Ok(Message::Dropped(d)) => *answered.entry(d.task_id).or_insert(0) += 1,
                _ => {}
            }
        }
        p.outbox().clear();
    }
    assert_eq!(answered.len() as u64, TASKS, "every task planned or dropped");
    assert!(answered.values().all(|&n| n == 1), "none twice");
    assert_eq!(p.waiting_tasks(), 0);
    assert_eq!(p.overlapping_plans(), 0);
}

#[test]
fn outbox_messages_decode() {
    let mut o = Outbox::new();
    o.push(PeerId::Frontend(1), |b| wire::encode(b, &wire::Heartbeat { seq: 1, role: 3, id: 0 }));
    assert_eq!(o.len(), 1);
    let (_, b) = o.iter().next().unwrap();
    assert!(matches!(wire::decode(b), Ok(Message::Heartbeat(_))));
}

/// A new term hands a task to another group (answers `moved`) only
/// once its fence has lifted and the GPUs its backends reported busy
/// (with the previous term's batches, which may hold that task) have
/// freed; a task it queued and a table then took away waits the same.
#[test]
fn a_new_term_answers_moved_only_after_its_fence_and_the_reported_busy_gpus() {
    let mut p = plane(&[vec![0, 1]]);
    let t0 = Instant::ZERO;
    p.set_epoch(4);
    p.fence();
    p.await_routes();
    assert!(p.set_routes(t0, &routes(2, &["b"], &["a"]), "a"), "model a (id 0) is group b's");
    p.frontend_joined(1, "fe1").unwrap();
    let busy = [wire::GpuBusy { busy_ns: 20_000_000, gpu_id: 0, batches: 1 }];
    p.backend_joined(t0, 10, 1, &[0, 1], &busy).unwrap();
    let _ = drain(&mut p);
    p.on_task(t0, 1, &task(1, 0, 1));
    p.on_task(t0, 1, &task(2, 1, 1));
    assert!(p_decode_drops(&drain(&mut p)).is_empty(), "fenced: nothing handed over");
    // Model b (id 1) moves away too while task 2 waits in its queue.
    assert!(p.set_routes(t0, &routes(3, &[], &["a", "b"]), "a"));
    assert!(p_decode_drops(&drain(&mut p)).is_empty(), "still fenced");
    let t1 = t0 + Duration::from_millis(5);
    p.lift_fence(t1);
    assert!(p_decode_drops(&drain(&mut p)).is_empty(), "GPU 0 is busy until 20 ms");
    let release = t0 + Duration::from_millis(20);
    assert_eq!(p.poll_at(), Some(release));
    p.on_wake(release - Duration::from_nanos(1));
    assert!(p_decode_drops(&drain(&mut p)).is_empty());
    p.on_wake(release);
    let mut moved = p_decode_drops(&drain(&mut p));
    moved.sort_unstable();
    assert_eq!(moved, [(tid(1, 1), DropReason::Moved as u32), (tid(2, 1), DropReason::Moved as u32)]);
    // From now on a task of a model it does not own is answered at once.
    p.on_task(release, 1, &task(3, 0, 1));
    assert_eq!(p_decode_drops(&drain(&mut p)), [(tid(3, 1), DropReason::Moved as u32)]);
}

/// A frontend that lost its link resubmits what it had sent; a task
/// already planned before its model moved away is in a batch that
/// still runs, so the repeat is ignored (a duplicate), not answered
/// `moved` (which would send it to the new owner as well).
#[test]
fn a_repeat_of_a_task_planned_before_its_model_moved_away_is_ignored() {
    let mut p = plane(&[vec![0, 1]]);
    let t0 = Instant::ZERO;
    assert!(p.set_routes(t0, &routes(1, &["a", "b"], &[]), "a"));
    p.frontend_joined(1, "fe1").unwrap();
    p.backend_joined(t0, 10, 1, &[0, 1], &[]).unwrap();
    p.on_task(t0, 1, &task(1, 0, 1));
    run_until_quiet(&mut p, t0, t0 + Duration::from_millis(100));
    let plans = drain(&mut p).into_iter().filter(|(_, m)| m.starts_with("BatchPlan")).count();
    assert_eq!(plans, 1, "task 1 is planned and sent");
    assert!(p.set_routes(t0, &routes(2, &["b"], &["a"]), "a"));
    let before = p.duplicate_tasks();
    p.on_task(t0, 1, &task(1, 0, 1));
    assert!(p_decode_drops(&drain(&mut p)).is_empty(), "not handed to group b");
    assert_eq!(p.duplicate_tasks(), before + 1);
    // A task it never had is answered moved.
    p.on_task(t0, 1, &task(2, 0, 1));
    assert_eq!(p_decode_drops(&drain(&mut p)), [(tid(2, 1), DropReason::Moved as u32)]);
}

#[test]
fn a_fence_holds_joining_gpus_out_until_lifted_and_forgets_a_backend_that_left() {
    let mut p = plane(&[vec![0, 1]]);
    let t0 = Instant::ZERO;
    p.set_epoch(4);
    p.fence();
    p.frontend_joined(1, "fe1").unwrap();
    p.backend_joined(t0, 10, 1, &[0, 1], &[]).unwrap();
    p.backend_joined(t0, 11, 2, &[0, 1], &[]).unwrap();
    assert_eq!(p.online_gpus(), 0, "held by the fence");
    p.on_task(t0, 1, &task(1, 0, 1));
    let _ = drain(&mut p);
    p.backend_left(t0, 10);
    let t1 = t0 + Duration::from_millis(5);
    p.lift_fence(t1);
    assert!(!p.fenced());
    assert_eq!(p.online_gpus(), 2, "backend 11's GPUs only");
    run_until_quiet(&mut p, t1, t1 + Duration::from_millis(100));
    let plans: Vec<_> = drain(&mut p).into_iter().filter(|(_, m)| m.starts_with("BatchPlan")).collect();
    assert_eq!(plans.len(), 1, "the queued task runs once the fence lifts: {plans:?}");
    assert!(plans[0].1.contains("epoch: 4") && plans[0].0 == PeerId::Backend(11), "{plans:?}");
}

/// The delay bound has one owner: a READ tail the watch adopts becomes
/// the `d_data` the plane reports, the metrics show and the cores charge
/// (a later plan of the same batch size leaves earlier by the difference
/// it adds to `delay(b)`), while `d_ctrl`, announced in every `Welcome`,
/// stays as configured.
#[test]
fn an_adopted_read_tail_is_the_one_bound_the_plane_reports_and_charges() {
    let mut p = plane(&[vec![0]]);
    let configured = p.delay();
    p.set_delay_watch("sim", DelayWatchConfig { percentile: 99.0, window: 1, adopt: true });
    let t0 = Instant::ZERO;
    p.frontend_joined(1, "fe").unwrap();
    p.backend_joined(t0, 10, 1, &[0], &[]).unwrap();
    drain(&mut p);
    // The first task's plan, under the configured bound.
    let lead = |p: &mut ControlPlane, n: u64, now: Instant| -> (u64, u64) {
        p.on_task(now, 1, &task(n, 0, 1));
        let mut t = now;
        while p.batches_in_flight() == 0 {
            t = p.poll_at().expect("a timer until the task is planned").max(t);
            p.on_wake(t);
        }
        let plan = drain(p).into_iter().find(|(_, m)| m.starts_with("BatchPlan")).expect("a plan").1;
        let field = |name: &str| plan.split(&format!("{name}: ")).nth(1).and_then(|v| v.split(',').next()).and_then(|v| v.parse::<u64>().ok()).unwrap();
        // How long before its deadline the batch was planned to start.
        let exec_at = t.as_nanos() + field("exec_in_ns");
        (field("batch_id"), (now.as_nanos() + 40_000_000).saturating_sub(exec_at))
    };
    let (first, lead_before) = lead(&mut p, 1, t0);
    // Its report: one READ of 3 ms, above the configured d_data (0).
    let now = t0 + Duration::from_millis(60);
    p.on_batch_done(now, 10, &wire::BatchDone { batch_id: first, start_ago_ns: 6_000_000, count: 1, read_max_ns: 3_000_000, reads: 1, ..Default::default() });
    let Some(Verdict::Adopted { old, new }) = p.take_delay_verdict() else { panic!("the watch adopts the tail") };
    assert_eq!(old, configured.d_data);
    assert!(new.as_nanos().abs_diff(3_000_000) <= 3_000, "{new:?}");
    assert_eq!(p.delay(), NetworkDelay { d_data: new, ..configured });
    assert_eq!(p.control_delay(), configured.d_ctrl);
    assert_eq!(p.metrics().closed_loop.read_bound_ns.load(Ordering::Relaxed), new.as_nanos());
    // A batch of one now starts `d_data` earlier before its deadline.
    let (_, lead_after) = lead(&mut p, 2, now);
    assert!(lead_after >= lead_before + new.as_nanos() - 1_000, "before {lead_before} ns, after {lead_after} ns");
}

/// Benchmark stamps read the host clock the host hands in, never one of
/// the plane's own: with a stopped test clock every lag is exact.
#[test]
fn bench_stamps_read_the_clock_the_host_hands_in() {
    use std::sync::atomic::AtomicU64;
    static HOST_NS: AtomicU64 = AtomicU64::new(0);
    fn host_clock() -> u64 {
        HOST_NS.load(Ordering::Relaxed)
    }
    let mut p = plane(&[vec![0]]);
    let origin = 1_000_000_000;
    p.set_bench_stamps(Some(origin), host_clock);
    let t0 = Instant::ZERO;
    p.frontend_joined(1, "fe").unwrap();
    p.backend_joined(t0, 10, 1, &[0], &[]).unwrap();
    drain(&mut p);
    // Sent at host 1.000 s, queued at host 1.000250 s: 250 µs of ingress.
    HOST_NS.store(origin + 250_000, Ordering::Relaxed);
    p.on_bench_stamp(1, &BenchStamp { at_ns: origin, ..Default::default() });
    p.on_task(t0, 1, &task(1, 0, 1));
    let m = p.metrics().clone();
    assert_eq!(m.bench_ingress_lag.count(), 1);
    let mut now = t0;
    while p.batches_in_flight() == 0 {
        now = p.poll_at().expect("a timer until the task is planned").max(now);
        p.on_wake(now);
    }
    assert_eq!(m.bench_decision_lag.count(), 1);
    let msgs: Vec<_> = p.outbox().iter().map(|(to, b)| (to, wire::decode(b).map(|m| format!("{m:?}")).unwrap_or_default())).collect();
    let stamp = msgs.iter().position(|(_, m)| m.starts_with("BenchStamp")).expect("a stamp");
    assert!(msgs[stamp + 1].1.starts_with("BatchPlan"), "the stamp precedes its plan: {msgs:?}");
    assert!(msgs[stamp].1.contains(&format!("at_ns: {}", origin + now.as_nanos())), "{msgs:?}");
    p.outbox_sent();
    assert_eq!(m.bench_send_lag.count(), 1);
    // Nothing stamped is left: a second hand-over records nothing.
    p.outbox_sent();
    assert_eq!(m.bench_send_lag.count(), 1);
    let text = m.encode();
    assert!(text.contains("symphony_bench_ingress_lag_us_sum 250.0"), "{text}");
    assert!(text.contains("symphony_bench_ingress_lag_us_bucket{le=\"249.0\"} 0"), "{text}");
}
