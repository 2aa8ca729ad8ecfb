//! Every policy keeps the simulator's invariants (no request lost or served
//! twice, no GPU running two batches at once, no batch mixing models, no
//! batch dispatched that would finish late) across seeds and workloads, and
//! accounts for every request. The simulator checks the invariants on every
//! action and returns an error on a violation.

use dataplane::time::Duration;
use proptest::prelude::*;
use scheduler::deferred::Gather;
use scheduler::netdelay::NetworkDelay;
use scheduler::policy::{build, PolicyConfig, PolicyKind};
use scheduler::sim::{simulate, Arrival, Popularity, RateSchedule, SimConfig, Workload};
use scheduler::zoo::ModelSpec;

fn arrival() -> impl Strategy<Value = Arrival> {
    prop_oneof![Just(Arrival::Poisson), Just(Arrival::Uniform), (0.1f64..1.5).prop_map(Arrival::Gamma)]
}

fn model() -> impl Strategy<Value = (f64, f64, f64)> {
    // alpha, beta in ms; SLO as a multiple of l(1) large enough for batch >= 1.
    (0.05f64..5.0, 0.1f64..20.0, 1.2f64..6.0).prop_map(|(a, b, k)| (a, b, (a + b) * k))
}

fn config() -> impl Strategy<Value = (SimConfig, f64)> {
    (
        proptest::collection::vec(model(), 1..5),
        1u32..7,
        arrival(),
        prop_oneof![Just(Popularity::Equal), (0.5f64..1.5).prop_map(Popularity::Zipf)],
        0.2f64..2.5,
        any::<u64>(),
        prop_oneof![Just(None), Just(Some("0:1,0.5:2,1:0.3"))],
    )
        .prop_map(|(ms, gpus, arrival, popularity, load, seed, sched)| {
            let models: Vec<ModelSpec> = ms
                .iter()
                .enumerate()
                .map(|(i, &(a, b, slo))| ModelSpec::linear(&format!("m{i}"), a, b, slo).unwrap())
                .collect();
            let mut cfg = SimConfig {
                models,
                gpus,
                workload: Workload {
                    rate_rps: 0.0,
                    arrival,
                    popularity,
                    schedule: sched.map(|s| RateSchedule::parse(s).unwrap()).unwrap_or_default(),
                },
                duration: Duration::from_millis(1_500),
                warmup: Duration::from_millis(100),
                seed,
                trace: None,
                admission: Default::default(),
            };
            let capacity = scheduler::goodput::ideal_throughput(&cfg);
            cfg.workload.rate_rps = capacity * load;
            (cfg, load)
        })
}

fn policies() -> Vec<PolicyConfig> {
    let mut out = Vec::new();
    for kind in PolicyKind::ALL {
        for gather in [Gather::Lazy, Gather::Early] {
            let mut p = PolicyConfig::new(kind);
            p.gather = gather;
            out.push(p);
        }
    }
    let mut delayed = PolicyConfig::new(PolicyKind::Deferred);
    delayed.delay = NetworkDelay { d_ctrl: Duration::from_micros(300), d_data: Duration::from_micros(40) };
    out.push(delayed);
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn every_policy_keeps_the_invariants((cfg, _load) in config()) {
        for p in policies() {
            let mut s = build(&cfg.models, cfg.gpus, &p).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let r = simulate(&cfg, s.as_mut()).map_err(|e| TestCaseError::fail(format!("{:?}: {e}", p.kind)))?;
            prop_assert_eq!(r.good + r.dropped + r.late, r.offered, "{:?} loses requests", p.kind);
            prop_assert_eq!(r.late, 0, "{:?} dispatched late batches", p.kind);
            prop_assert!(r.gpu_idle_fraction >= -1e-9 && r.gpu_idle_fraction <= 1.0 + 1e-9);
            let per_model: u64 = r.models.iter().map(|m| m.offered).sum();
            prop_assert_eq!(per_model, r.offered);
            for m in &r.models {
                prop_assert_eq!(m.drops_by_reason.values().sum::<u64>(), m.dropped, "{:?}: {} drops by reason", p.kind, m.name);
            }
        }
    }

    #[test]
    fn same_seed_same_output((cfg, _load) in config()) {
        for p in policies() {
            let run = || -> Result<String, TestCaseError> {
                let mut s = build(&cfg.models, cfg.gpus, &p).map_err(|e| TestCaseError::fail(e.to_string()))?;
                let r = simulate(&cfg, s.as_mut()).map_err(|e| TestCaseError::fail(e.to_string()))?;
                serde_json::to_string(&r).map_err(|e| TestCaseError::fail(e.to_string()))
            };
            prop_assert_eq!(run()?, run()?);
        }
    }
}
