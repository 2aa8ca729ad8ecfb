//! Goodput of every policy on the Symphony paper's Table 2 setups: one
//! model (ResNet50 or InceptionResNetV2) on 8 GPUs, Poisson arrivals.
//!
//! `cargo run --release -p scheduler --example baseline_goodput [SECONDS]`

use dataplane::time::Duration;
use scheduler::goodput::{search, GoodputSearch};
use scheduler::policy::{build, PolicyConfig, PolicyKind};
use scheduler::sim::{simulate, SimConfig, Workload};
use scheduler::zoo::ModelSpec;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let secs: u64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(30);
    let setups = [("ResNet50", 1.053, 5.072, 25.0), ("InceptionResNetV2", 5.090, 18.368, 70.0)];
    for (name, alpha, beta, slo) in setups {
        let model = ModelSpec::linear(name, alpha, beta, slo)?;
        let base = SimConfig {
            models: vec![model],
            gpus: 8,
            workload: Workload::poisson(0.0),
            duration: Duration::from_millis(secs * 1000),
            warmup: Duration::from_millis(2000),
            seed: 1,
            trace: None,
            admission: Default::default(),
        };
        let mut deferred_goodput = 0.0;
        for kind in [PolicyKind::Deferred, PolicyKind::Clockwork, PolicyKind::Shepherd, PolicyKind::Nexus] {
            let policy = PolicyConfig::new(kind);
            let r = search(&base, &policy, &GoodputSearch::default(), &mut |_, _, _, _| {})?;
            let (median, idle) = r.at_goodput.as_ref().map_or((0, 0.0), |a| (a.median_batch, a.gpu_idle_fraction));
            println!("{name:18} {kind:9} goodput {:7.0} r/s  median batch {median:2}  idle {:.2}", r.goodput_rps, idle);
            if kind == PolicyKind::Deferred {
                deferred_goodput = r.goodput_rps;
            }
        }
        // Every policy at half of deferred's goodput.
        for kind in [PolicyKind::Deferred, PolicyKind::Clockwork, PolicyKind::Shepherd, PolicyKind::Nexus] {
            let mut cfg = base.clone();
            cfg.workload.rate_rps = deferred_goodput / 2.0;
            let mut sched = build(&cfg.models, cfg.gpus, &PolicyConfig::new(kind))?;
            let r = simulate(&cfg, sched.as_mut())?;
            println!(
                "{name:18} {kind:9} at {:5.0} r/s: idle {:.3}  median batch {:2}  bad {:.4}",
                cfg.workload.rate_rps, r.gpu_idle_fraction, r.median_batch, r.max_model_bad_rate
            );
        }
    }
    Ok(())
}
