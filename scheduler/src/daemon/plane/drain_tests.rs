//! Draining on a virtual clock: a backend that says it drains gets no new
//! plan, its planned batches still run and are reported, it is released
//! only once none is in flight, and its leave then fails nothing back; a
//! seeded workload with drains, crashes mid-drain and joins answers every
//! task exactly once.

use super::*;

use dataplane::wire::{Message, RemoteRef};
use rand::{Rng, SeedableRng};

fn models() -> Vec<ModelSpec> {
    vec![ModelSpec::linear("a", 1.0, 5.0, 50.0).unwrap(), ModelSpec::linear("b", 2.0, 5.0, 100.0).unwrap()]
}

fn plane() -> ControlPlane {
    let metrics = Arc::new(SchedulerMetrics::new(&models()));
    ControlPlane::new(models(), &[vec![0, 1]], CoreConfig::default(), metrics).unwrap()
}

fn task(n: u32, model: u32, frontend: u32) -> Task {
    Task {
        task_id: TaskId::new(frontend, 1, n).0,
        budget_ns: 40_000_000,
        model_id: model,
        frontend_id: frontend,
        input: RemoteRef { key: 1, len: 16, offset: u64::from(n) * 16 },
        ..Default::default()
    }
}

/// What the plane sent, decoded: plans as (backend, batch id, task ids),
/// task outcomes to frontends as (task id, what), drain releases by
/// backend.
#[derive(Default)]
struct Sent {
    plans: Vec<(u32, u64, Vec<u64>)>,
    answers: Vec<(u64, String)>,
    released: Vec<u32>,
}

fn take(p: &mut ControlPlane, sent: &mut Sent) {
    for (to, bytes) in p.outbox().iter() {
        match (to, wire::decode(bytes).expect("the plane sends valid messages")) {
            (PeerId::Backend(b), Message::BatchPlan(h, tasks)) => {
                sent.plans.push((b, h.batch_id, tasks.iter().map(|t| t.task_id).collect()));
            }
            (PeerId::Backend(b), Message::Drain(d)) => {
                assert_eq!((d.backend_id, d.stage()), (b, Some(wire::DrainStage::Released)));
                sent.released.push(b);
            }
            (PeerId::Frontend(_), Message::Completion(h, _)) => sent.answers.push((h.task_id, format!("failed {}", h.status))),
            (PeerId::Frontend(_), Message::Dropped(d)) => sent.answers.push((d.task_id, format!("dropped {}", d.reason))),
            _ => {}
        }
    }
    p.outbox().clear();
}

/// Runs the plane's timers up to `until`.
fn advance(p: &mut ControlPlane, now: &mut Instant, until: Instant) {
    while let Some(t) = p.poll_at().filter(|&t| t <= until) {
        *now = t.max(*now);
        p.on_wake(*now);
    }
    *now = until;
}

fn done(batch_id: u64) -> wire::BatchDone {
    wire::BatchDone { batch_id, count: 1, ..Default::default() }
}

#[test]
fn a_draining_backend_gets_no_new_plan_is_released_after_its_last_report_and_leaves_without_fail_back() {
    let mut p = plane();
    let mut sent = Sent::default();
    let mut now = Instant::ZERO;
    p.frontend_joined(1, "fe").unwrap();
    p.backend_joined(now, 10, 1, &[0, 1], &[]).unwrap();
    p.backend_joined(now, 11, 1, &[0, 1], &[]).unwrap();
    take(&mut p, &mut sent);
    // Enough load that both GPUs get batches.
    for n in 0..40 {
        p.on_task(now, 1, &task(n, n % 2, 1));
    }
    while !sent.plans.iter().any(|pl| pl.0 == 10) || !sent.plans.iter().any(|pl| pl.0 == 11) {
        let t = p.poll_at().expect("tasks wait");
        now = t.max(now);
        p.on_wake(now);
        take(&mut p, &mut sent);
    }
    let planned_to_10: Vec<u64> = sent.plans.iter().filter(|pl| pl.0 == 10).map(|pl| pl.1).collect();
    assert_eq!(p.online_gpus(), 2);
    p.backend_draining(now, 10);
    take(&mut p, &mut sent);
    assert_eq!(p.online_gpus(), 1, "its GPU left matchmaking");
    assert_eq!(p.draining_backends(), 1);
    assert!(sent.released.is_empty(), "batches planned to it are still in flight");
    // A repeated notice changes nothing while batches are in flight.
    p.backend_draining(now, 10);
    take(&mut p, &mut sent);
    assert!(sent.released.is_empty());
    let plans_before = sent.plans.len();
    for n in 40..80 {
        p.on_task(now, 1, &task(n, n % 2, 1));
    }
    let end = now + Duration::from_millis(300);
    advance(&mut p, &mut now, end);
    take(&mut p, &mut sent);
    assert!(sent.plans[plans_before..].iter().all(|pl| pl.0 == 11), "no plan to the draining backend");
    assert!(sent.plans.len() > plans_before);
    // Its batches are reported one by one; the release follows the last.
    for (k, &batch) in planned_to_10.iter().enumerate() {
        assert!(sent.released.is_empty(), "released before batch {k} was reported");
        p.on_batch_done(now, 10, &done(batch));
        take(&mut p, &mut sent);
    }
    assert_eq!(sent.released, [10]);
    // A notice that crosses the release is answered again.
    p.backend_draining(now, 10);
    take(&mut p, &mut sent);
    assert_eq!(sent.released, [10, 10]);
    let deaths = p.metrics().backend_deaths.get();
    p.backend_left(now, 10);
    take(&mut p, &mut sent);
    assert!(sent.answers.iter().all(|a| !a.1.starts_with("failed")), "nothing failed back: {:?}", sent.answers);
    assert_eq!((p.metrics().backends_drained.get(), p.metrics().backend_deaths.get()), (1, deaths));
    assert_eq!((p.draining_backends(), p.peers().1), (0, 1));
}

#[test]
fn a_draining_backend_with_nothing_in_flight_is_released_at_once_and_an_unknown_one_is_ignored() {
    let mut p = plane();
    let mut sent = Sent::default();
    let now = Instant::ZERO;
    p.backend_joined(now, 10, 2, &[0, 1], &[]).unwrap();
    take(&mut p, &mut sent);
    p.backend_draining(now, 99);
    p.backend_draining(now, 10);
    take(&mut p, &mut sent);
    assert_eq!(sent.released, [10]);
    assert_eq!(p.online_gpus(), 0);
}

#[test]
fn a_fenced_draining_backend_stays_out_of_matchmaking_when_the_fence_lifts() {
    let mut p = plane();
    let now = Instant::ZERO;
    p.fence();
    p.backend_joined(now, 10, 1, &[0, 1], &[]).unwrap();
    p.backend_joined(now, 11, 1, &[0, 1], &[]).unwrap();
    p.backend_draining(now, 10);
    p.lift_fence(now);
    assert_eq!(p.online_gpus(), 1);
}

/// A seeded workload: tasks at random gaps, backends draining (some
/// crashing before their release, some reporting late past the grace),
/// new backends joining; every backend reports each batch it was sent
/// after a random delay unless it crashed. Every task gets exactly one
/// answer (a plan's completion stands for the result), none is planned
/// twice, and a backend that left released had nothing failed back.
#[test]
fn seeded_drains_crashes_and_joins_answer_every_task_once() {
    // (drains begun, backends released and gone, crashes while draining)
    let mut seen = (0, 0, 0);
    for seed in 0..40u64 {
        let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(seed);
        let mut p = plane();
        p.set_batch_grace(Duration::from_millis(50));
        let mut sent = Sent::default();
        let mut now = Instant::ZERO;
        p.frontend_joined(1, "fe").unwrap();
        let mut live: Vec<u32> = vec![10, 11, 12];
        for &b in &live {
            p.backend_joined(now, b, 1, &[0, 1], &[]).unwrap();
        }
        let mut next_backend = 13u32;
        // (when the report is due, backend, batch)
        let mut reports: Vec<(Instant, u32, u64)> = Vec::new();
        let mut seen_plans = 0;
        let mut submitted = Vec::new();
        let mut released_left = Vec::new();
        // Batches reported after the grace (failed back at expiry).
        let mut late_batches = Vec::new();
        for n in 0..600u32 {
            now += Duration::from_micros(rng.random_range(100..1500));
            let target = now;
            advance(&mut p, &mut now, target);
            p.on_task(now, 1, &task(n, n % 2, 1));
            submitted.push(TaskId::new(1, 1, n).0);
            take(&mut p, &mut sent);
            for pl in &sent.plans[seen_plans..] {
                // A crashed backend never reports; a slow one after the grace.
                let late = if rng.random_bool(0.05) {
                    late_batches.push(pl.1);
                    200
                } else {
                    rng.random_range(5..20)
                };
                reports.push((now + Duration::from_millis(late), pl.0, pl.1));
            }
            seen_plans = sent.plans.len();
            reports.sort_unstable();
            while reports.first().is_some_and(|r| r.0 <= now) {
                let (_, b, batch) = reports.remove(0);
                if live.contains(&b) {
                    p.on_batch_done(now, b, &done(batch));
                }
            }
            p.expire_overdue(now);
            take(&mut p, &mut sent);
            // Released: the backend leaves.
            for &b in &sent.released {
                if let Some(i) = live.iter().position(|&x| x == b) {
                    live.remove(i);
                    p.backend_left(now, b);
                    released_left.push(b);
                }
            }
            sent.released.clear();
            match rng.random_range(0..200) {
                0 if live.len() > 1 => {
                    let b = live[rng.random_range(0..live.len())];
                    p.backend_draining(now, b);
                    seen.0 += 1;
                }
                1 if live.len() > 1 => {
                    // A crash, possibly mid-drain: its batches fail back.
                    let b = live.remove(rng.random_range(0..live.len()));
                    seen.2 += usize::from(p.members.drain_of(b) == Drain::Draining);
                    p.backend_left(now, b);
                }
                2 if live.len() < 5 => {
                    p.backend_joined(now, next_backend, 1, &[0, 1], &[]).unwrap();
                    live.push(next_backend);
                    next_backend += 1;
                }
                _ => {}
            }
        }
        // Quiet: every report comes, everything overdue expires.
        for (_, b, batch) in std::mem::take(&mut reports) {
            if live.contains(&b) {
                p.on_batch_done(now, b, &done(batch));
            }
        }
        let end = now + Duration::from_millis(2000);
        advance(&mut p, &mut now, end);
        p.expire_overdue(now);
        take(&mut p, &mut sent);
        let mut outcomes: HashMap<u64, u32> = HashMap::new();
        for (t, _) in &sent.answers {
            *outcomes.entry(*t).or_default() += 1;
        }
        let mut planned: HashMap<u64, u32> = HashMap::new();
        for pl in &sent.plans {
            for &t in &pl.2 {
                *planned.entry(t).or_default() += 1;
            }
        }
        for t in &submitted {
            let (o, pl) = (outcomes.get(t).copied().unwrap_or(0), planned.get(t).copied().unwrap_or(0));
            assert!(pl <= 1, "seed {seed}: task {t:x} planned {pl} times");
            // Planned and not failed back: its result is the answer.
            assert!(o + pl >= 1 && o <= 1, "seed {seed}: task {t:x}: {o} answers, planned {pl}");
        }
        // Released backends' batches were all reported: none failed back
        // (but one that overran the grace, as for any backend).
        for pl in sent.plans.iter().filter(|pl| released_left.contains(&pl.0) && !late_batches.contains(&pl.1)) {
            for t in &pl.2 {
                assert!(
                    !sent.answers.iter().any(|a| a.0 == *t && a.1.starts_with("failed")),
                    "seed {seed}: task {t:x} of released backend {} failed back",
                    pl.0
                );
            }
        }
        assert_eq!(p.batches_in_flight(), 0, "seed {seed}");
        seen.1 += released_left.len();
    }
    assert!(seen.0 >= 40 && seen.1 >= 20 && seen.2 >= 1, "the workload exercised too little: {seen:?}");
}
