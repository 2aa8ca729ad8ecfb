//! The scheduler's closed loop and its delay-bound watch, in the
//! deterministic harness (virtual time, the `sim` network, the real
//! nodes): issue 14's acceptance for both.

use dataplane::time::Duration;
use scheduler::closed_loop::LoopConfig;
use scheduler::delay_watch::DelayWatchConfig;
use scheduler::netdelay::NetworkDelay;
use tools::chaos::{run, ChaosConfig, ChaosReport, FaultSet};

/// 8 GPUs (one per backend); the default cluster's two models.
fn eight_gpus(seed: u64, rate_rps: f64, duration: Duration) -> ChaosConfig {
    let mut cfg = ChaosConfig::new(seed, FaultSet::NONE, duration);
    cfg.backends = 8;
    cfg.gpus_per_backend = 1;
    cfg.rate_rps = rate_rps;
    cfg
}

/// Late, dropped or failed over sent.
fn bad_rate(r: &ChaosReport) -> f64 {
    (r.late + r.dropped_total() + r.failed_total()) as f64 / r.accepted.max(1) as f64
}

/// 80% of the 8-GPU cluster's capacity: at profile it keeps the bad rate
/// under 1% up to about 5000 requests/s (0.8% at 5000, 8% at 6000:
/// `symphony chaos --faults none --backends 8 --rate R`).
const RATE_80_PERCENT: f64 = 0.8 * 5000.0;

#[test]
fn one_gpu_1_5x_slower_than_its_profile_is_learned_and_scheduled_around() {
    let base = eight_gpus(11, RATE_80_PERCENT, Duration::from_millis(4000));
    // GPU 0 of backend slot 0: the lowest id, so the busiest at this load.
    let slow = ChaosConfig { gpu_slowdowns: vec![(0, 0, 1.5)], ..base.clone() };
    let on = run(ChaosConfig { closed_loop: LoopConfig::default(), ..slow.clone() }).unwrap();
    let off = run(ChaosConfig { closed_loop: LoopConfig::off(), ..slow }).unwrap();
    for r in [&on, &off] {
        assert!(r.ok(), "{:?}", r.violations);
        assert!(r.accepted > 15_000, "{}", r.accepted);
    }
    let (bad_on, bad_off) = (bad_rate(&on), bad_rate(&off));
    eprintln!("bad rate: loop on {bad_on:.4}, off {bad_off:.4}; speeds {:?}", on.gpu_speed);
    assert!(bad_on <= 0.01, "loop on: bad rate {bad_on} > 1%: {on:?}");
    assert!(bad_on <= bad_off / 5.0, "loop on {bad_on} is not a fifth of loop off {bad_off}");
    // Backend slot 0 registered first: id 1.
    let est = on.gpu_speed["backend1/gpu0"];
    assert!((est / 1.5 - 1.0).abs() <= 0.05, "estimate {est} not within 5% of 1.5: {:?}", on.gpu_speed);
    for (k, v) in &on.gpu_speed {
        if k != "backend1/gpu0" {
            assert_eq!(*v, 1.0, "{k} runs exactly at its profile");
        }
    }
}

#[test]
fn at_profile_the_loop_changes_no_decision() {
    // The emulated GPUs run exactly l(b): every report agrees with its
    // plan, so the loop on and off send the very same messages.
    let base = eight_gpus(5, RATE_80_PERCENT, Duration::from_millis(1500));
    let on = run(ChaosConfig { closed_loop: LoopConfig::default(), ..base.clone() }).unwrap();
    let off = run(ChaosConfig { closed_loop: LoopConfig::off(), ..base }).unwrap();
    assert!(on.ok() && off.ok(), "{:?} {:?}", on.violations, off.violations);
    assert_eq!(on.trace_hash, off.trace_hash);
    assert_eq!((on.succeeded, on.late, on.batches), (off.succeeded, off.late, off.batches));
    assert!(on.gpu_speed.values().all(|&v| v == 1.0), "{:?}", on.gpu_speed);
}

/// A cluster whose per-input READ bound is 100 µs, checked at p99 every 50
/// batches, at a low load (small batches: the bound per input is tightest).
fn watched(read_delay: Duration) -> ChaosReport {
    let mut cfg = eight_gpus(3, 400.0, Duration::from_millis(1500));
    cfg.delay = NetworkDelay { d_ctrl: Duration::from_micros(200), d_data: Duration::from_micros(100) };
    cfg.delay_watch = DelayWatchConfig { percentile: 99.0, window: 50, adopt: false };
    cfg.read_delay = read_delay;
    let r = run(cfg).unwrap();
    assert!(r.ok(), "{:?}", r.violations);
    r
}

#[test]
fn the_delay_bound_alarm_fires_when_the_read_tail_exceeds_the_bound_and_not_otherwise() {
    // The sim network's READs take 30 µs: within 100 µs per input.
    let calm = watched(Duration::from_micros(30));
    assert_eq!(calm.delay_alarms, 0, "tail {} ns", calm.read_tail_ns);
    assert!(calm.read_tail_ns > 0 && calm.read_tail_ns <= 100_000, "{}", calm.read_tail_ns);
    // The fabric degrades: 400 µs READs, far above the bound for the
    // small batches of this load.
    let slow = watched(Duration::from_micros(400));
    assert!(slow.delay_alarms >= 1, "tail {} ns", slow.read_tail_ns);
    assert!(slow.read_tail_ns > 100_000, "{}", slow.read_tail_ns);
}
