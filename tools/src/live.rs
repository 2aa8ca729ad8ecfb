//! `symphony live`: the in-process live runtime (ModelThreads and a
//! RankThread over SPSC rings) with emulated GPUs on the real clock,
//! next to the simulator on the same workload (scheduler-only capacity).
//! The emulated GPUs occupy a device for exactly the profiled time and an
//! open-loop generator offers the load; the summary shows how far real
//! threads and clocks are from the model. `symphony up` is the multi-process
//! cluster with HTTP frontends and backends.

use crate::bench::EmulatedViolations;
use crate::cli::{check, parse_idle, CliError};
use crate::plot;
use dataplane::idle::IdleStrategy;
use dataplane::time::Duration;
use scheduler::deferred::CoreConfig;
use scheduler::goodput::{search, GoodputError, GoodputSearch};
use scheduler::policy::{build, PolicyConfig, PolicyError, PolicyKind};
use scheduler::runtime::{run_live, LiveConfig, LiveReport, RuntimeConfig, RuntimeError};
use scheduler::sim::{simulate, InvariantViolation, SimConfig, SimReport, Workload};
use scheduler::zoo::{Zoo, ZooError, ZooSelection};
use std::path::PathBuf;

pub struct LiveArgs {
    pub zoo: String,
    pub zoo_models: String,
    pub gpus: u32,
    pub load: f64,
    pub duration_s: f64,
    pub model_threads: usize,
    pub idle: String,
    pub plot: Option<PathBuf>,
    pub json: bool,
}

/// Why `symphony live` stopped.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    /// `--zoo` or `--models` is wrong.
    #[error(transparent)]
    Zoo(#[from] ZooError),
    /// Nothing to schedule.
    #[error("need at least one model and one GPU (got {models} models, {gpus} GPUs)")]
    EmptyCluster {
        /// Models selected.
        models: usize,
        /// `--gpus`.
        gpus: u32,
    },
    /// A flag is wrong (`--idle`, `--duration-s`, `--load`).
    #[error(transparent)]
    Cli(#[from] CliError),
    /// The simulated goodput search failed.
    #[error(transparent)]
    Goodput(#[from] GoodputError),
    /// The policy could not be built.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The simulated run broke an invariant.
    #[error(transparent)]
    Simulation(#[from] InvariantViolation),
    /// The live runtime failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The emulated GPUs saw a batch overlap another.
    #[error(transparent)]
    Violations(#[from] EmulatedViolations),
    /// A figure could not be written.
    #[error(transparent)]
    Plot(#[from] plot::WriteError),
    /// The report could not be encoded.
    #[error("cannot encode the report: {0}")]
    Json(#[from] serde_json::Error),
}

pub fn run(a: &LiveArgs) -> Result<(), LiveError> {
    let models = ZooSelection::parse(&a.zoo_models).select(Zoo::parse(&a.zoo)?.models())?;
    if models.is_empty() || a.gpus == 0 {
        return Err(LiveError::EmptyCluster { models: models.len(), gpus: a.gpus });
    }
    check(a.duration_s.is_finite() && a.duration_s > 0.0 && a.duration_s <= 3600.0, "--duration-s", "in (0, 3600]", a.duration_s)?;
    check(a.load.is_finite() && a.load > 0.0 && a.load <= 4.0, "--load", "in (0, 4] (a fraction of the simulated goodput)", a.load)?;
    let idle = parse_idle(&a.idle)?;
    let secs = a.duration_s;
    let sim_cfg = SimConfig {
        models: models.clone(),
        gpus: a.gpus,
        workload: Workload::poisson(0.0),
        duration: Duration::from_secs_f64(secs.max(5.0)),
        warmup: Duration::from_secs_f64(1.0),
        seed: 1,
        trace: None,
        admission: Default::default(),
    };
    let policy = PolicyConfig::new(PolicyKind::Deferred);
    tracing::info!("{} models ({} zoo), {} emulated GPUs; finding the simulated goodput...", models.len(), a.zoo, a.gpus);
    let goodput = search(&sim_cfg, &policy, &GoodputSearch::default(), &mut |_, _, _, _| {})?.goodput_rps;
    let rate = goodput * a.load;
    let mut at_rate = sim_cfg.clone();
    at_rate.workload.rate_rps = rate;
    let mut sched = build(&models, a.gpus, &policy)?;
    let predicted = simulate(&at_rate, sched.as_mut())?;
    tracing::info!("running the live cluster at {rate:.0} rps ({:.0}% of the simulated goodput {goodput:.0}) for {secs} s...", a.load * 100.0);
    let live = run_live(&LiveConfig {
        runtime: RuntimeConfig { models: models.clone(), gpus: a.gpus, model_threads: a.model_threads.max(1), core: CoreConfig::default(), ring_capacity: 1 << 16 },
        workload: Workload::poisson(rate),
        duration: Duration::from_secs_f64(secs),
        seed: 1,
        idle,
        pin: matches!(idle, IdleStrategy::Spin),
    })?;
    EmulatedViolations::check(&live)?;
    if let Some(dir) = &a.plot {
        let svg = plot::batch_sizes("Batch size distribution (simulated, same workload)", &predicted.batch_size_histogram);
        plot::write_svg(dir, "batch_sizes.svg", &svg)?;
    }
    if a.json {
        let machine: serde_json::Value = serde_json::from_str(&crate::bench::runtime_machine(live.model_threads, matches!(idle, IdleStrategy::Spin)).to_json())?;
        let v = serde_json::json!({ "offered_rps": rate, "simulated_goodput_rps": goodput, "live": live, "simulated": predicted, "machine": machine });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!("{}", crate::bench::runtime_machine(live.model_threads, matches!(idle, IdleStrategy::Spin)).text());
        print_comparison(&live, &predicted, secs);
    }
    Ok(())
}

fn print_comparison(live: &LiveReport, predicted: &SimReport, secs: f64) {
    println!("local cluster: {} models, {} emulated GPUs, {} ModelThread(s) + 1 RankThread, {secs} s", live.models, live.gpus, live.model_threads);
    println!("{:<26} {:>14} {:>14}", "", "live", "simulated");
    println!("{:<26} {:>14.0} {:>14.0}", "offered load (rps)", live.sustained_rps, predicted.measured_offered_rps);
    println!("{:<26} {:>14.0} {:>14.0}", "goodput (rps)", live.goodput_rps, predicted.good_rps);
    println!("{:<26} {:>13.3}% {:>13.3}%", "bad rate", live.bad_rate * 100.0, predicted.bad_rate * 100.0);
    println!("{:<26} {:>14} {:>14}", "median batch", live.median_batch, predicted.median_batch);
    println!("{:<26} {:>13.1}% {:>13.1}%", "GPU idle fraction", (1.0 - live.gpu_busy_fraction) * 100.0, predicted.gpu_idle_fraction * 100.0);
    println!(
        "{:<26} {:>14} {:>14}",
        "autoscaling advice",
        advice(&live.autoscale),
        advice(&predicted.autoscale)
    );
    println!("dispatch lag p99.9 {:.1} us; every request accounted for: {}", live.dispatch_lag.p999_us, live.accounted);
}

fn advice(a: &scheduler::sim::AutoscaleAdvice) -> String {
    if a.add_gpus > 0.0 {
        format!("add {:.1}", a.add_gpus)
    } else {
        format!("remove {:.1}", a.remove_gpus)
    }
}
