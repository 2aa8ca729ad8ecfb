//! The live runtime's capacity curve over models and GPUs.

use super::ReportError;
use dataplane::idle::IdleStrategy;
use dataplane::time::Duration;
use scheduler::deferred::CoreConfig;
use scheduler::runtime::{run_live, LiveConfig, LiveReport, RuntimeConfig};
use scheduler::sim::Workload;
use scheduler::zoo::ModelSpec;

/// The live runtime over models and GPUs: 1 ModelThread + 1 RankThread,
/// spinning and pinned; each point offered min(4M rps, 80% of the emulated
/// cluster's capacity) so the GPUs are never the bottleneck.
pub(super) fn live_curve(quick: bool) -> Result<(), ReportError> {
    let base = ModelSpec::linear("m", 0.1, 5.0, 50.0)?;
    let per_gpu = base.profile.throughput_rps(base.profile.max_batch());
    let secs = if quick { 2.0 } else { 5.0 };
    println!("Live runtime, 1 ModelThread + 1 RankThread (pinned, spinning), emulated GPUs (profile 0.1 b + 5 ms, SLO 50 ms), {secs} s per point.\n");
    println!("| models | GPUs | offered (rps) | sustained (rps) | bad rate | lag p50 / p99 / p99.9 / max (us) | RankThread events/s | RankThread util. | ModelThread util. | CPU ns/req |");
    println!("|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|");
    for &models in &[10usize, 100, 1000] {
        for &gpus in &[8u32, 100, 1000, 10_000] {
            let rate = (0.8 * per_gpu * f64::from(gpus)).min(4e6);
            let specs: Vec<ModelSpec> = (0..models).map(|i| ModelSpec { name: format!("m{i}"), ..base.clone() }).collect();
            let r = run_live(&LiveConfig {
                runtime: RuntimeConfig { models: specs, gpus, model_threads: 1, core: CoreConfig::default(), ring_capacity: 1 << 16 },
                workload: Workload::poisson(rate),
                duration: Duration::from_secs_f64(secs),
                seed: 1,
                idle: IdleStrategy::Spin,
                pin: true,
            })?;
            print_point(models, gpus, rate, &r);
        }
    }
    Ok(())
}

fn print_point(models: usize, gpus: u32, rate: f64, r: &LiveReport) {
    let l = &r.dispatch_lag;
    println!(
        "| {models} | {gpus} | {rate:.0} | {:.0} | {:.3}% | {:.1} / {:.1} / {:.1} / {:.0} | {:.0} | {:.1}% | {:.0}% | {:.0} |",
        r.sustained_rps,
        r.bad_rate * 100.0,
        l.p50_us,
        l.p99_us,
        l.p999_us,
        l.max_us,
        r.rank_events_per_s,
        r.rank_utilisation * 100.0,
        r.model_thread_utilisation.first().copied().unwrap_or(0.0) * 100.0,
        r.cpu_ns_per_request
    );
}
