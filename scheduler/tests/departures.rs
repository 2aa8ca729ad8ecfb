//! Deferred with each departure from Algorithm 1 switched (off, or the
//! off-by-default light-load rule on) still passes every invariant the
//! simulator checks (no livelock, no batch on a busy GPU, no request lost)
//! on small contended clusters.

use dataplane::time::Duration;
use scheduler::deferred::{Departure, DepartureSet};
use scheduler::policy::{build, PolicyConfig, PolicyKind};
use scheduler::sim::{simulate, Arrival, Popularity, RateSchedule, SimConfig, Workload};
use scheduler::zoo::Zoo;

fn cell(names: &[&str], gpus: u32, arrival: Arrival, rate_rps: f64) -> SimConfig {
    let models = Zoo::Gtx1080Ti.models().into_iter().filter(|m| names.contains(&m.name.as_str())).collect();
    SimConfig {
        models,
        gpus,
        workload: Workload { rate_rps, arrival, popularity: Popularity::Equal, schedule: RateSchedule::default() },
        duration: Duration::from_millis(1500),
        warmup: Duration::from_millis(200),
        seed: 3,
        trace: None,
        admission: Default::default(),
    }
}

#[test]
fn every_departure_switched_alone_keeps_the_simulator_s_invariants() {
    // Two and four models on 2 GPUs near and past saturation, Poisson and
    // Gamma(0.2): the RankThread's fallback (item 8) off once livelocked
    // here, its timer re-armed at a GPU time already past.
    let cells = [
        cell(&["ResNet50", "MobileNet"], 2, Arrival::Poisson, 1062.4),
        cell(&["ResNet50", "MobileNet"], 2, Arrival::Gamma(0.2), 1500.0),
        cell(&["ResNet50", "MobileNet", "Xception", "EfficientNetB0"], 2, Arrival::Gamma(0.5), 800.0),
    ];
    for d in Departure::ALL {
        let base = DepartureSet::default();
        let set = if base.has(d) { base.without(d) } else { base.with(d) };
        for (i, cfg) in cells.iter().enumerate() {
            assert!(!cfg.models.is_empty());
            let policy = PolicyConfig { departures: set, ..PolicyConfig::new(PolicyKind::Deferred) };
            let mut s = build(&cfg.models, cfg.gpus, &policy).expect("a policy");
            let r = simulate(cfg, s.as_mut()).unwrap_or_else(|e| panic!("{d} switched, cell {i}: {e}"));
            assert!(r.good > 0, "{d} switched, cell {i}: nothing served");
        }
    }
}
