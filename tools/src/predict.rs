//! `symphony predict --model M --rate R --workers N [--zoo a100|1080ti] [--json]`
//! (or `--measure --model-repository models`: against ONNX Runtime, [`crate::serf_measure`]):
//! SERF's interference-aware M/D/c latency prediction
//! ([`scheduler::serf`]) for one zoo model served by `N` workers (GPUs),
//! each running up to `c` batches at once. Prints the predicted mean
//! latency for every `c` up to `--max-concurrency` and the best `c`.
//!
//! The per-`c` service times are, in order of preference: `--service-ms`
//! (measured `t_1,t_2,...`, as SERF profiles them), or a model of a GPU
//! from the zoo profile ([`scheduler::serf::service_times_from_profile`]:
//! `c` concurrent batches overlap like one batch of `c` times the size,
//! plus `--interference` per co-runner).

use std::path::PathBuf;

use scheduler::serf;
use scheduler::zoo::Zoo;

use crate::serf_measure::{self, MeasureConfig, MeasureError};
use serde::Serialize;

/// The options of `symphony predict`.
#[derive(clap::Args, Debug)]
pub struct PredictArgs {
    /// The model's name in the zoo.
    #[arg(long)]
    pub model: String,
    /// Total arrival rate, requests per second (Poisson).
    #[arg(long)]
    pub rate: f64,
    /// Workers (GPUs) sharing the rate equally.
    #[arg(long, default_value_t = 1)]
    pub workers: u32,
    /// Model zoo: a100 or 1080ti.
    #[arg(long, default_value = "a100")]
    pub zoo: String,
    /// Requests per batch (arrivals are batched in groups of this size).
    #[arg(long, default_value_t = 1)]
    pub batch: u32,
    /// Largest number of concurrent batches per worker to consider.
    #[arg(long = "max-concurrency", default_value_t = 4)]
    pub max_concurrency: usize,
    /// Slowdown each extra concurrent batch adds to every running one (fraction).
    #[arg(long, default_value_t = 0.1)]
    pub interference: f64,
    /// Measured service times t_1,t_2,... in ms (overrides the profile model).
    #[arg(long = "service-ms", value_delimiter = ',')]
    pub service_ms: Vec<f64>,
    /// Print JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Profile t_c on the ONNX Runtime executor, predict from it, and
    /// measure an open-loop run per c beside the prediction
    /// (see `serf_measure`); needs --model-repository.
    #[arg(long)]
    pub measure: bool,
    /// The Triton-layout repository of --measure (e.g. models/).
    #[arg(long = "model-repository")]
    pub model_repository: Option<PathBuf>,
    /// --measure: seconds of Poisson arrivals per c (beside --profile-s:
    /// a measurement's length, not the run's, hence its own name).
    #[arg(long = "measure-s", default_value_t = 40.0)]
    pub duration_s: f64,
    /// --measure: seconds of closed-loop profiling per t_i.
    #[arg(long = "profile-s", default_value_t = 8.0)]
    pub profile_s: f64,
    /// --measure: seed of the arrival stream.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// --measure: ONNX Runtime intra-op threads shared by the c concurrent
    /// batches (each gets max(1, budget / c); 0: this machine's cores).
    #[arg(long = "thread-budget", default_value_t = 0)]
    pub thread_budget: usize,
    /// --measure: rounds; each profiles and measures every c in turn for
    /// its share of --measure-s and --profile-s, so a change in the
    /// machine's speed falls on every c and on profile and run alike. The
    /// defaults (40 s, 8 s, 16 rounds: 2.5 s of arrivals per round) are
    /// the configuration validated in docs/benchmarks.md; with 4 rounds
    /// (10 s) the executor's speed on a shared VM drifted up to 13%
    /// between a profile and its run.
    #[arg(long, default_value_t = 16)]
    pub rounds: u32,
    /// --measure: how t_i is profiled: `load` (the i batches start
    /// together after the idle gaps the predicted Poisson load leaves: none
    /// for a fraction rho, else exponential at the batch rate), `idle`
    /// (after one service time of idleness, at least 5 ms) or `busy` (each
    /// of i devices resubmits as soon as it finishes: warm threads and
    /// caches).
    #[arg(long = "profile-from", value_enum, default_value_t = serf_measure::ProfileFrom::Load)]
    pub profile_from: serf_measure::ProfileFrom,
}

/// One row of the prediction table.
#[derive(Serialize)]
struct Row {
    concurrency: usize,
    service_time_ms: f64,
    utilisation: f64,
    wait_ms: f64,
    mean_service_ms: f64,
    mean_latency_ms: f64,
}

/// What `--json` prints.
#[derive(Serialize)]
struct Output {
    model: String,
    zoo: String,
    rate_rps: f64,
    workers: u32,
    batch: u32,
    batches_per_s_per_worker: f64,
    interference: Option<f64>,
    rows: Vec<Row>,
    best_concurrency: Option<usize>,
    best_latency_ms: Option<f64>,
}

/// Why `symphony predict` stopped.
#[derive(Debug, thiserror::Error)]
pub enum PredictError {
    /// An option is out of range.
    #[error("predict: --rate, --measure-s and --profile-s must be positive, --workers, --batch and --max-concurrency at least 1")]
    Range,
    /// No such model in the zoo.
    #[error("predict: no model '{model}' in the {zoo} zoo")]
    UnknownModel {
        /// The model asked for.
        model: String,
        /// The zoo.
        zoo: String,
    },
    /// The zoo is unknown.
    #[error(transparent)]
    Zoo(#[from] scheduler::zoo::ZooError),
    /// `--measure` without `--model-repository`.
    #[error("predict --measure needs --model-repository (and --workers 1)")]
    MeasureNeedsRepository,
    /// The measurement failed.
    #[error(transparent)]
    Measure(#[from] MeasureError),
    /// The JSON output cannot be encoded.
    #[error("cannot encode the prediction: {0}")]
    Json(#[from] serde_json::Error),
}

pub fn run(a: &PredictArgs) -> Result<(), PredictError> {
    if !(a.rate > 0.0 && a.rate.is_finite()) || a.workers == 0 || a.batch == 0 || a.max_concurrency == 0 {
        return Err(PredictError::Range);
    }
    if a.measure {
        return run_measure(a);
    }
    let zoo = Zoo::parse(&a.zoo)?;
    let spec = zoo
        .models()
        .into_iter()
        .find(|m| m.name.eq_ignore_ascii_case(&a.model))
        .ok_or_else(|| PredictError::UnknownModel { model: a.model.clone(), zoo: a.zoo.clone() })?;
    let (service_s, interference) = if a.service_ms.is_empty() {
        let profile = &spec.profile;
        // Beyond the profile's largest batch, extend it linearly (the zoo profiles are linear).
        let (alpha, beta) = profile.linear_coefficients().unwrap_or((0.0, profile.latency(1).as_millis_f64()));
        let l = |b: u32| (alpha * f64::from(b) + beta) / 1e3;
        (serf::service_times_from_profile(l, a.batch, a.max_concurrency, a.interference), Some(a.interference))
    } else {
        (a.service_ms.iter().map(|t| t / 1e3).collect(), None)
    };
    let lambda = a.rate / f64::from(a.workers) / f64::from(a.batch);
    let (preds, best) = serf::table(&service_s, lambda);
    let rows: Vec<Row> = preds
        .iter()
        .map(|p| Row {
            concurrency: p.concurrency,
            service_time_ms: service_s[p.concurrency - 1] * 1e3,
            utilisation: p.utilisation,
            wait_ms: p.wait_s * 1e3,
            mean_service_ms: p.service_s * 1e3,
            mean_latency_ms: p.latency_s * 1e3,
        })
        .collect();
    let out = Output {
        model: spec.name.clone(),
        zoo: a.zoo.clone(),
        rate_rps: a.rate,
        workers: a.workers,
        batch: a.batch,
        batches_per_s_per_worker: lambda,
        interference,
        best_concurrency: best.map(|i| rows[i].concurrency),
        best_latency_ms: best.map(|i| rows[i].mean_latency_ms),
        rows,
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "SERF M/D_interf/c: {} ({}), {:.1} rps over {} workers, batch {}: {:.2} batches/s per worker",
        out.model, out.zoo, out.rate_rps, out.workers, out.batch, lambda
    );
    println!("| c | t_c (ms) | utilisation | wait (ms) | service (ms) | mean latency (ms) |\n|---:|---:|---:|---:|---:|---:|");
    for r in &out.rows {
        println!(
            "| {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} |",
            r.concurrency, r.service_time_ms, r.utilisation, r.wait_ms, r.mean_service_ms, r.mean_latency_ms
        );
    }
    match (out.best_concurrency, out.best_latency_ms) {
        (Some(c), Some(l)) => println!("best concurrency per worker: {c} (mean latency {l:.3} ms)"),
        _ => println!("no stable configuration: the rate exceeds every c's capacity"),
    }
    Ok(())
}

/// `--measure`: SERF's prediction from t_c profiled on the ONNX Runtime
/// executor, beside an open-loop measurement per c.
fn run_measure(a: &PredictArgs) -> Result<(), PredictError> {
    let Some(repo) = a.model_repository.clone().filter(|_| a.workers == 1) else {
        return Err(PredictError::MeasureNeedsRepository);
    };
    if !(a.duration_s > 0.0 && a.duration_s.is_finite() && a.profile_s > 0.0 && a.profile_s.is_finite()) {
        return Err(PredictError::Range);
    }
    let thread_budget = if a.thread_budget == 0 { std::thread::available_parallelism().map_or(1, |n| n.get()) } else { a.thread_budget };
    let cfg = MeasureConfig {
        model_repository: repo,
        model: a.model.clone(),
        rate_rps: a.rate,
        batch: a.batch,
        max_concurrency: a.max_concurrency,
        duration_s: a.duration_s,
        profile_s: a.profile_s,
        seed: a.seed,
        thread_budget,
        rounds: a.rounds,
        profile_from: a.profile_from,
    };
    let report = serf_measure::measure(&cfg)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        serf_measure::print(&report);
    }
    Ok(())
}
