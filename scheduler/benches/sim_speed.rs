//! Simulator speed: simulated requests per second of wall time, one core.
//!
//! `cargo bench -p scheduler --bench sim_speed` prints a Markdown table
//! (median of 5 runs per row).

use dataplane::time::Duration;
use scheduler::policy::{build, PolicyConfig, PolicyKind};
use scheduler::sim::{simulate, SimConfig, Workload};
use scheduler::zoo::{ModelSpec, Zoo};
use std::time::Instant;

fn case(name: &str, models: Vec<ModelSpec>, gpus: u32, rate: f64, secs: u64, kind: PolicyKind) {
    let cfg = SimConfig {
        models,
        gpus,
        workload: Workload::poisson(rate),
        duration: Duration::from_millis(secs * 1000),
        warmup: Duration::from_millis(1000),
        seed: 1,
        trace: None,
        admission: Default::default(),
    };
    let mut rates = Vec::new();
    let mut requests = 0;
    for _ in 0..5 {
        let mut s = build(&cfg.models, cfg.gpus, &PolicyConfig::new(kind)).expect("policy");
        let t = Instant::now();
        let r = simulate(&cfg, s.as_mut()).expect("invariants hold");
        let wall = t.elapsed().as_secs_f64();
        requests = r.simulated_requests;
        rates.push(r.simulated_requests as f64 / wall);
    }
    rates.sort_by(f64::total_cmp);
    println!("| {name} | {kind} | {requests} | {:.2} M/s | {:.2} | {:.2} |", rates[2] / 1e6, rates[0] / 1e6, rates[4] / 1e6);
}

fn main() {
    // `cargo bench` passes `--bench`; accept and ignore arguments.
    println!("| workload | policy | simulated requests | median rate | min | max |\n|---|---|---:|---:|---:|---:|");
    let r50 = ModelSpec::linear("ResNet50", 1.053, 5.072, 25.0).expect("model");
    case("ResNet50, 8 GPUs, 5000 rps", vec![r50.clone()], 8, 5000.0, 200, PolicyKind::Deferred);
    let twenty: Vec<ModelSpec> = (0..20).map(|i| ModelSpec { name: format!("r{i}"), ..r50.clone() }).collect();
    case("20 x ResNet50, 64 GPUs, 40k rps", twenty, 64, 40_000.0, 30, PolicyKind::Deferred);
    case("A100 zoo (37), 64 GPUs, 17k rps", Zoo::A100.models(), 64, 17_000.0, 60, PolicyKind::Deferred);
    case("A100 zoo (37), 64 GPUs, 17k rps", Zoo::A100.models(), 64, 17_000.0, 60, PolicyKind::Eager);
}
