//! Light load without a latency tax (issue 54 item 3), in the simulator:
//! the PP-OCR classifier's profile (`symphony profile` on the reference
//! CPU: `l(b)` = 0.5013 ms per request plus 0.0678 ms, SLO 20 ms from its
//! config.pbtxt) on one GPU at a tenth of its capacity, where nothing is
//! worth deferring for, and one perf_analyzer-style client in a closed
//! loop (concurrency 1). Deferred with the light-load departure must keep
//! its p99 within 1.2x of eager's (the bar against Triton, whose
//! batcher with a 0 µs delay is eager), and must not slow the closed loop.

use dataplane::time::{Duration, Instant};
use scheduler::deferred::{Departure, DepartureSet};
use scheduler::policy::{build, PolicyConfig, PolicyKind};
use scheduler::sim::workload::Workload;
use scheduler::sim::{simulate, SimConfig};
use scheduler::types::{Actions, Request};
use scheduler::zoo::ModelSpec;

fn ppocr() -> ModelSpec {
    ModelSpec::linear("ppocr_cls", 0.5013, 0.0678, 20.0).expect("a valid profile")
}

fn deferred(set: DepartureSet) -> PolicyConfig {
    PolicyConfig { departures: set, ..PolicyConfig::new(PolicyKind::Deferred) }
}

fn light_on() -> DepartureSet {
    DepartureSet::default().with(Departure::LightLoad)
}

/// p99 (ms) of an open Poisson loop at `rate` on one GPU.
fn open_p99(policy: &PolicyConfig, rate: f64, seed: u64) -> f64 {
    let cfg = SimConfig {
        models: vec![ppocr()],
        gpus: 1,
        workload: Workload::poisson(rate),
        duration: Duration::from_secs_f64(20.0),
        warmup: Duration::from_secs_f64(1.0),
        seed,
        trace: None,
        admission: Default::default(),
    };
    let mut s = build(&cfg.models, 1, policy).expect("builds");
    let r = simulate(&cfg, s.as_mut()).expect("no invariant broken");
    assert_eq!(r.bad_rate, 0.0, "nothing is late at a tenth of capacity");
    r.p99_ms
}

/// Mean time (ms) from a request's arrival to its batch's start, one
/// client in a closed loop on one GPU: each request is sent 300 µs after
/// the previous answer, 2000 of them.
fn closed_loop_wait_ms(policy: &PolicyConfig) -> f64 {
    let mut s = build(&[ppocr()], 1, policy).expect("builds");
    let mut out = Actions::default();
    let mut send = Instant::from_nanos(1_000_000);
    let mut running: Option<Instant> = None;
    let (mut waited, mut done) = (Duration::ZERO, 0u32);
    let mut sent_at = Instant::ZERO;
    let mut id = 0u64;
    let mut outstanding = false;
    for _ in 0..1_000_000 {
        if done == 2000 {
            break;
        }
        let wake = s.poll_at().unwrap_or(Instant::NEVER);
        let next_send = if outstanding { Instant::NEVER } else { send };
        let now = next_send.min(running.unwrap_or(Instant::NEVER)).min(wake);
        if running == Some(now) {
            running = None;
            outstanding = false;
            done += 1;
            send = now + Duration::from_micros(300);
            s.on_batch_done(now, 0, &mut out);
        } else if next_send == now {
            s.on_request(now, Request::new(id, 0, now, now + Duration::from_millis(20)), &mut out);
            id += 1;
            sent_at = now;
            outstanding = true;
        } else {
            s.on_wake(now, &mut out);
        }
        for b in &out.batches {
            waited += b.exec_at.saturating_since(sent_at);
            running = Some(b.finish_at);
        }
        assert!(out.drops.is_empty(), "a lone request on an idle GPU is never dropped");
        out.clear();
    }
    assert_eq!(done, 2000, "the loop ran to the end");
    waited.as_nanos() as f64 / 1e6 / f64::from(done)
}

#[test]
fn a_tenth_of_capacity_costs_no_latency_tax() {
    // Capacity on one GPU within the SLO: about 1950 requests/s.
    let rate = 195.0;
    let eager = PolicyConfig::new(PolicyKind::Eager);
    for seed in [1, 2] {
        let e = open_p99(&eager, rate, seed);
        let d = open_p99(&deferred(DepartureSet::default()), rate, seed);
        let l = open_p99(&deferred(light_on()), rate, seed);
        eprintln!("seed {seed}: p99 eager {e:.3} ms, deferred {d:.3} ms, deferred + light-load {l:.3} ms");
        assert!(l <= 1.2 * e, "seed {seed}: light-load p99 {l:.3} ms against eager's {e:.3} ms");
    }
}

#[test]
fn a_lone_closed_loop_client_does_not_wait() {
    let e = closed_loop_wait_ms(&PolicyConfig::new(PolicyKind::Eager));
    let d = closed_loop_wait_ms(&deferred(DepartureSet::default()));
    let l = closed_loop_wait_ms(&deferred(light_on()));
    eprintln!("closed loop c=1, mean wait to start: eager {e:.3} ms, deferred {d:.3} ms, deferred + light-load {l:.3} ms");
    assert!(l <= e + 0.05, "light-load waits {l:.3} ms per request, eager {e:.3} ms");
}
