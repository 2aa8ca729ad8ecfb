//! `symphony partition`: draws a seeded instance (variants of zoo models
//! with exponential rates, as the paper's Appendix A.2), partitions it over
//! sub-clusters with `scheduler::partition`, and prints the balance, the
//! memory per sub-cluster, the objective and what moved.

use scheduler::partition::instance::{generate, gpu_memory_bytes, profile_memory, zoo_memory, InstanceSpec, ModelMemory};
use scheduler::partition::{milp, partition, Method, Problem, Solution, MIB};
use scheduler::repository::profile::ProfileFile;
use scheduler::zoo::Zoo;
use scheduler::partition::PartitionError;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Why `symphony partition` stopped.
#[derive(Debug, thiserror::Error)]
pub enum PartitionCmdError {
    /// An option is invalid (the message names it).
    #[error("{0}")]
    Usage(String),
    /// The instance cannot be partitioned (or built).
    #[error(transparent)]
    Partition(#[from] PartitionError),
    /// A file given by `--zoo` or `--from` is unusable.
    #[error("{option} {path}: {why}")]
    File {
        /// The option naming it.
        option: &'static str,
        /// The file.
        path: String,
        /// Why.
        why: String,
    },
    /// The JSON output cannot be encoded.
    #[error("cannot encode the result: {0}")]
    Json(#[from] serde_json::Error),
}

fn usage(m: impl Into<String>) -> PartitionCmdError {
    PartitionCmdError::Usage(m.into())
}

fn file_err(option: &'static str, path: impl std::fmt::Display, why: impl std::fmt::Display) -> PartitionCmdError {
    PartitionCmdError::File { option, path: path.to_string(), why: why.to_string() }
}

/// Arguments of `symphony partition`.
#[derive(clap::Args, Debug)]
pub struct PartitionArgs {
    /// Number of models (variants of randomly chosen zoo models).
    #[arg(long = "model-count", default_value_t = 800)]
    pub models: usize,
    /// Number of sub-clusters.
    #[arg(long = "sub-clusters", default_value_t = 20)]
    pub sub_clusters: usize,
    /// At most this much static model memory (MiB) may move away from --from's assignment.
    #[arg(long = "c-max")]
    pub c_max_mib: Option<f64>,
    /// A previous assignment: the JSON this command printed with --json (models matched by name).
    #[arg(long)]
    pub from: Option<PathBuf>,
    /// Model memory: a100 or 1080ti (the zoo with scheduler/data/zoo-memory.csv), or a `symphony profile` JSON file.
    #[arg(long, default_value = "a100")]
    pub zoo: String,
    /// GPU memory of a backend, GiB (default: 40 for a100, 11 for 1080ti; required with a profile file).
    #[arg(long = "gpu-memory-gib")]
    pub gpu_memory_gib: Option<f64>,
    /// Optional bound on a sub-cluster's request rate (R_max), requests/s.
    #[arg(long = "rate-max")]
    pub rate_max: Option<f64>,
    /// Weight of memory balance against rate balance (1 = equal weight for equal relative deviation).
    #[arg(long = "memory-weight", default_value_t = 1.0)]
    pub memory_weight: f64,
    /// Mean request rate of a model, requests/s.
    #[arg(long = "mean-rate", default_value_t = 100.0)]
    pub mean_rate: f64,
    /// Seed of the instance's models (and the search).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Seed of the rates (default: --seed); change it alone to re-partition the same models under new rates.
    #[arg(long = "rate-seed")]
    pub rate_seed: Option<u64>,
    /// Also solve the MILP exactly (small instances), within this many seconds.
    #[arg(long = "exact-s")]
    pub exact_s: Option<f64>,
    /// Print JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Runs the command.
pub fn run(a: &PartitionArgs) -> Result<(), PartitionCmdError> {
    let (base, default_gib) = match a.zoo.to_ascii_lowercase().as_str() {
        "a100" | "1080ti" => {
            let zoo = Zoo::parse(&a.zoo).map_err(|e| usage(format!("--zoo: {e}")))?;
            (zoo_memory(zoo)?, Some(gpu_memory_bytes(zoo) as f64 / (1u64 << 30) as f64))
        }
        _ => (load_profile(&a.zoo)?, None),
    };
    let gib = a.gpu_memory_gib.or(default_gib).ok_or_else(|| usage("--zoo FILE needs --gpu-memory-gib"))?;
    if !(gib.is_finite() && gib > 0.0) {
        return Err(usage(format!("--gpu-memory-gib must be > 0, got {gib}")));
    }
    let spec = InstanceSpec { models: a.models, mean_rate: a.mean_rate, seed: a.seed, rate_seed: a.rate_seed.unwrap_or(a.seed) };
    let models = generate(&base, &spec)?;
    let previous = a.from.as_ref().map(|f| load_previous(f, &models)).transpose()?;
    let c_max_bytes = match a.c_max_mib {
        Some(c) if !(c.is_finite() && c >= 0.0) => return Err(usage(format!("--c-max must be >= 0 MiB, got {c}"))),
        Some(c) => Some((c * MIB) as u64),
        None => None,
    };
    let problem = Problem {
        models,
        sub_clusters: a.sub_clusters,
        memory_bytes: (gib * (1u64 << 30) as f64) as u64,
        rate_max: a.rate_max,
        memory_weight: a.memory_weight,
        previous,
        c_max_bytes,
    };
    let started = Instant::now();
    let heuristic = partition(&problem, a.seed)?;
    let heuristic_s = started.elapsed().as_secs_f64();
    let mut exact: Option<(Solution, f64)> = None;
    if let Some(limit) = a.exact_s {
        let t = Instant::now();
        let e = milp::solve(&problem, Some(Duration::from_secs_f64(limit.max(0.0))), Some(&heuristic.assignment))?;
        let method = if e.proven_optimal { Method::ExactOptimal } else { Method::ExactTimeLimit };
        let evaluation = problem.evaluate(&e.assignment);
        exact = Some((Solution { method, assignment: e.assignment, evaluation }, t.elapsed().as_secs_f64()));
    }
    // The answer: the exact solver's when it is better.
    let (best, best_s) = match &exact {
        Some((e, s)) if e.evaluation.feasible && e.evaluation.objective < heuristic.evaluation.objective => (e, *s),
        _ => (&heuristic, heuristic_s),
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&to_json(&problem, best, best_s, &heuristic, heuristic_s, exact.as_ref()))?);
    } else {
        print_text(&problem, best, best_s, &heuristic, exact.as_ref());
    }
    Ok(())
}

fn load_profile(path: &str) -> Result<Vec<ModelMemory>, PartitionCmdError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| file_err("--zoo", path, format!("not a100, 1080ti or a readable file ({e})")))?;
    let file: ProfileFile = serde_json::from_str(&text)
        .map_err(|e| file_err("--zoo", path, format!("not a `symphony profile` JSON file: {e}")))?;
    if file.models.is_empty() {
        return Err(file_err("--zoo", path, "no models"));
    }
    Ok(profile_memory(&file))
}

/// The previous sub-cluster of each model, by name, from an earlier `--json` output.
fn load_previous(path: &PathBuf, models: &[scheduler::partition::ModelLoad]) -> Result<Vec<Option<usize>>, PartitionCmdError> {
    let text = std::fs::read_to_string(path).map_err(|e| file_err("--from", path.display(), e))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| file_err("--from", path.display(), e))?;
    let rows = v["assignment"]
        .as_array()
        .ok_or_else(|| file_err("--from", path.display(), "no \"assignment\" array (use the output of --json)"))?;
    let mut by_name = std::collections::HashMap::new();
    for r in rows {
        let (Some(name), Some(j)) = (r["model"].as_str(), r["sub_cluster"].as_u64()) else {
            return Err(file_err("--from", path.display(), "assignment entries need \"model\" and \"sub_cluster\""));
        };
        by_name.insert(name.to_string(), j as usize);
    }
    Ok(models.iter().map(|m| by_name.get(&m.name).copied()).collect())
}

fn to_json(p: &Problem, best: &Solution, best_s: f64, heuristic: &Solution, heuristic_s: f64, exact: Option<&(Solution, f64)>) -> serde_json::Value {
    let e = &best.evaluation;
    let sub_clusters: Vec<serde_json::Value> = (0..p.sub_clusters)
        .map(|j| {
            serde_json::json!({
                "sub_cluster": j,
                "models": e.model_count[j],
                "rate": e.rate[j],
                "static_bytes": e.static_bytes[j],
                "memory_used_bytes": e.memory_used_bytes[j],
                "memory_capacity_bytes": p.memory_bytes,
            })
        })
        .collect();
    let assignment: Vec<serde_json::Value> = p
        .models
        .iter()
        .zip(&best.assignment.sub_cluster)
        .map(|(m, &j)| serde_json::json!({"model": m.name, "rate": m.rate, "static_bytes": m.static_bytes, "dynamic_bytes": m.dynamic_bytes, "sub_cluster": j}))
        .collect();
    let mut v = serde_json::json!({
        "models": p.models.len(),
        "sub_clusters": p.sub_clusters,
        "method": best.method,
        "objective": e.objective,
        "delta_rate": e.delta_rate,
        "delta_static_mib": e.delta_static_mib,
        "w": p.w(),
        "imbalance": e.imbalance,
        "memory_imbalance": e.memory_imbalance,
        "rate_spread": e.rate_spread,
        "memory_spread": e.memory_spread,
        "feasible": e.feasible,
        "within_memory": e.memory_used_bytes.iter().all(|&u| u <= p.memory_bytes),
        "moved": {
            "models": e.moved.iter().map(|&i| p.models[i].name.clone()).collect::<Vec<_>>(),
            "count": e.moved.len(),
            "bytes": e.moved_bytes,
            "c_max_bytes": p.c_max_bytes,
        },
        "elapsed_s": best_s,
        "heuristic": {"objective": heuristic.evaluation.objective, "elapsed_s": heuristic_s},
        "sub_cluster": sub_clusters,
        "assignment": assignment,
    });
    if let Some((x, s)) = exact {
        v["exact"] = serde_json::json!({"objective": x.evaluation.objective, "proven_optimal": x.method == Method::ExactOptimal, "elapsed_s": s});
    }
    v
}

fn print_text(p: &Problem, best: &Solution, best_s: f64, heuristic: &Solution, exact: Option<&(Solution, f64)>) {
    let e = &best.evaluation;
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    println!(
        "{} models over {} sub-clusters (GPU memory {:.1} GiB), {:?} in {:.3} s",
        p.models.len(),
        p.sub_clusters,
        gib(p.memory_bytes),
        best.method,
        best_s
    );
    println!("{:>4} {:>7} {:>10} {:>11} {:>15}", "sub", "models", "rate", "static GiB", "used/capacity");
    for j in 0..p.sub_clusters {
        println!(
            "{:>4} {:>7} {:>10.1} {:>11.2} {:>14.1}%",
            j,
            e.model_count[j],
            e.rate[j],
            gib(e.static_bytes[j]),
            e.memory_used_bytes[j] as f64 / p.memory_bytes as f64 * 100.0
        );
    }
    println!(
        "imbalance: rate {:.4} (max |R-mean|/mean), memory {:.4}; paper's (max-min)/avg: rate {:.4}, memory {:.4}",
        e.imbalance, e.memory_imbalance, e.rate_spread, e.memory_spread
    );
    println!("objective ΔR + w·ΔS = {:.3} + {:.4}·{:.1} MiB = {:.3}", e.delta_rate, p.w(), e.delta_static_mib, e.objective);
    match p.c_max_bytes {
        Some(c) => println!("moved {} models, {:.0} MiB (C_max {:.0} MiB)", e.moved.len(), e.moved_bytes as f64 / MIB, c as f64 / MIB),
        None => println!("moved {} models, {:.0} MiB", e.moved.len(), e.moved_bytes as f64 / MIB),
    }
    if let Some((x, s)) = exact {
        println!(
            "exact MILP: objective {:.3} ({}) in {:.3} s; heuristic {:.3}",
            x.evaluation.objective,
            if x.method == Method::ExactOptimal { "proven optimal" } else { "time limit" },
            s,
            heuristic.evaluation.objective
        );
    }
    if !e.feasible {
        println!("WARNING: not feasible");
    }
}
