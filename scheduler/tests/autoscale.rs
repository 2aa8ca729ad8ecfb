//! The autoscaler acting on simulated clusters of zoo models, through the
//! public API: GPUs follow the load, drains lose nothing, runs repeat.

use dataplane::time::Duration;
use scheduler::autoscale::AutoscaleConfig;
use scheduler::policy::{PolicyConfig, PolicyKind};
use scheduler::policy::build;
use scheduler::sim::autoscaled::{simulate_elastic, ElasticConfig, ElasticReport};
use scheduler::sim::{RateSchedule, Workload};
use scheduler::zoo::{ModelSpec, Zoo};

fn models() -> Vec<ModelSpec> {
    Zoo::A100.models().into_iter().step_by(6).take(6).collect()
}

/// Six A100 models, 2,000 rps each at the peak, low–high–low.
fn config(kind_max_gpus: u32) -> ElasticConfig {
    let schedule = RateSchedule::parse("0:0.2,20:1.0,40:0.2").unwrap();
    let models = models();
    ElasticConfig {
        workloads: models.iter().map(|_| Workload { schedule: schedule.clone(), ..Workload::poisson(2000.0) }).collect(),
        models,
        max_gpus: kind_max_gpus,
        initial_gpus: 4,
        duration: Duration::from_secs_f64(60.0),
        seed: 11,
        join_time: Duration::from_secs_f64(1.0),
        interval: Duration::from_secs_f64(0.5),
        autoscale: Some(AutoscaleConfig {
            stabilisation: Duration::from_secs_f64(3.0),
            cooldown: Duration::from_secs_f64(1.0),
            max_gpus: kind_max_gpus,
            max_step: 8,
            ..AutoscaleConfig::default()
        }),
    }
}

fn run(kind: PolicyKind, cfg: &ElasticConfig) -> ElasticReport {
    let mut s = build(&cfg.models, cfg.max_gpus, &PolicyConfig::new(kind)).unwrap();
    simulate_elastic(cfg, s.as_mut()).unwrap()
}

fn mean_in_use(rep: &ElasticReport, from: f64, to: f64) -> f64 {
    let rows: Vec<f64> = rep.epochs.iter().filter(|e| e.t_s > from && e.t_s <= to).map(|e| e.gpus_in_use).collect();
    rows.iter().sum::<f64>() / rows.len() as f64
}

#[test]
fn deferred_gpus_follow_the_load_and_drains_lose_nothing() {
    let cfg = config(32);
    let rep = run(PolicyKind::Deferred, &cfg);
    assert!(rep.acting);
    let (low, high, low_again) = (mean_in_use(&rep, 10.0, 20.0), mean_in_use(&rep, 30.0, 40.0), mean_in_use(&rep, 50.0, 60.0));
    // Deferred spreads a little over the GPUs it has, so the way down is
    // slower than the way up (the idle signal underestimates the slack).
    assert!(high > 2.0 * low && high > 1.5 * low_again, "GPUs in use {low:.1} / {high:.1} / {low_again:.1}");
    assert!(rep.added > 0 && rep.drained > 0);
    // Every arrival was served once or dropped (the simulator checks it
    // per request and fails the run otherwise); after the settling time
    // of each change few are bad.
    let s = &rep.summary;
    assert_eq!(s.offered, s.good + s.dropped + s.late);
    let settled: Vec<_> = rep.epochs.iter().filter(|e| (e.t_s % 20.0) >= 5.0).collect();
    let (good, bad): (u64, u64) = settled.iter().fold((0, 0), |(g, b), e| (g + e.good.iter().sum::<u64>(), b + e.bad.iter().sum::<u64>()));
    assert!((bad as f64) < 0.01 * (good + bad) as f64, "settled bad {bad} of {}", good + bad);
    // Far fewer GPU-seconds than the largest cluster all along.
    assert!(rep.gpu_seconds < 0.6 * 32.0 * 60.0, "{}", rep.gpu_seconds);
}

#[test]
fn an_elastic_run_repeats_exactly() {
    let mut cfg = config(16);
    cfg.duration = Duration::from_secs_f64(30.0);
    let (a, b) = (run(PolicyKind::Deferred, &cfg), run(PolicyKind::Deferred, &cfg));
    assert_eq!(a.epochs, b.epochs);
    assert_eq!(a.gpu_seconds, b.gpu_seconds);
}

#[test]
fn eager_and_clockwork_run_under_the_same_autoscaler() {
    let mut cfg = config(16);
    cfg.duration = Duration::from_secs_f64(30.0);
    for kind in [PolicyKind::Eager, PolicyKind::Clockwork] {
        let rep = run(kind, &cfg);
        assert_eq!(rep.summary.offered, rep.summary.good + rep.summary.dropped + rep.summary.late);
        assert!(rep.epochs.iter().any(|e| e.advice_remove > 0.0 || e.advice_add > 0.0), "{kind}: no advice");
        if !rep.acting {
            // Without the membership hook the cluster stays at its largest.
            assert!(rep.epochs.iter().all(|e| e.serving == 16), "{kind}");
        }
    }
}
