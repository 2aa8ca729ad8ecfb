//! Reports reproducing the figures and tables of docs/benchmarks.md. Each
//! prints Markdown on stdout; goodputs are medians over several seeds.
//!
//! This file holds what every report shares (the run shape, the
//! contenders, the error type) and the dispatch; the reports themselves
//! are grouped by subject: `paper` (Table 2, Figures 6a, 9, 2 and 10),
//! `network` (Figure 14), `fig13` (Figure 13), `live` (the live runtime's curve),
//! `deferral` (Figures 6b and 7: deferred against timeout and eager),
//! `quality` (Figures 11 and 12: scheduling quality) and `fig16` (Figure
//! 16: partitioning). The grid is `report_grid`'s, Figure 15
//! `report_fig15`'s.

mod deferral;
mod fig13;
mod fig16;
mod live;
mod network;
mod paper;
mod quality;

use dataplane::time::Duration;
use scheduler::deferred::Gather;
use scheduler::goodput::{search, GoodputError, GoodputSearch};
use scheduler::netdelay::DelayFileError;
use scheduler::policy::{build, PolicyConfig, PolicyError, PolicyKind};
use scheduler::runtime::RuntimeError;
use scheduler::sim::{simulate, Arrival, InvariantViolation, Popularity, RateSchedule, SimConfig, SimReport, Workload};
use scheduler::zoo::{ModelSpec, ZooError};
use std::path::{Path, PathBuf};

/// Why a report stopped.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// No report of that name.
    #[error("unknown report '{name}' (table2, fig6a, fig6b, fig7, fig9, fig2, fig10, fig11, fig12, grid, fig13, fig14, fig15, live-curve, fig16)")]
    Unknown {
        /// The name given.
        name: String,
    },
    /// A model of the report is invalid.
    #[error(transparent)]
    Zoo(#[from] ZooError),
    /// A partitioning instance failed.
    #[error(transparent)]
    Partition(#[from] scheduler::partition::PartitionError),
    /// A policy could not be built.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// A goodput search failed.
    #[error(transparent)]
    Goodput(#[from] GoodputError),
    /// A simulated run broke an invariant.
    #[error(transparent)]
    Simulation(#[from] InvariantViolation),
    /// The live runtime failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// A scheduler-only capacity search failed.
    #[error(transparent)]
    Bench(#[from] Box<crate::bench::BenchError>),
    /// A calibration file cannot be read.
    #[error("{}: {source}", path.display())]
    ReadCalibration {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A calibration file is not a delay file.
    #[error("{}: {source}", path.display())]
    Calibration {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        source: DelayFileError,
    },
    /// An SVG figure (or its directory) cannot be written.
    #[error(transparent)]
    Svg(#[from] crate::plot::WriteError),
    /// A report's JSON cannot be written.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

/// Shape of the runs behind one number.
#[derive(Clone)]
struct Setup {
    models: Vec<ModelSpec>,
    gpus: u32,
    arrival: Arrival,
    popularity: Popularity,
    duration_s: f64,
    seeds: Vec<u64>,
    /// The goodput search's knobs (the default unless a report needs many
    /// searches and says so).
    knobs: GoodputSearch,
}

impl Setup {
    fn new(models: Vec<ModelSpec>, gpus: u32, quick: bool) -> Self {
        Setup {
            models,
            gpus,
            arrival: Arrival::Poisson,
            popularity: Popularity::Equal,
            duration_s: if quick { 10.0 } else { 30.0 },
            seeds: if quick { vec![1] } else { vec![1, 2, 3] },
            knobs: GoodputSearch::default(),
        }
    }

    /// What a report's header says of the runs: the seeds (so a re-run
    /// with them gives the same numbers) and the run length.
    fn runs_note(&self) -> String {
        format!("simulator, seeds {:?} (goodput: the median over them), {} s runs", self.seeds, self.duration_s)
    }

    fn sim(&self, rate: f64, seed: u64) -> SimConfig {
        SimConfig {
            models: self.models.clone(),
            gpus: self.gpus,
            workload: Workload { rate_rps: rate, arrival: self.arrival, popularity: self.popularity.clone(), schedule: RateSchedule::default() },
            duration: Duration::from_secs_f64(self.duration_s),
            warmup: Duration::from_secs_f64((self.duration_s * 0.1).min(2.0)),
            seed,
            trace: None,
            admission: Default::default(),
        }
    }

    /// Median goodput over the seeds, and the run at goodput of the median seed.
    fn goodput(&self, policy: &PolicyConfig) -> Result<(f64, Option<SimReport>), ReportError> {
        let mut results = Vec::new();
        for &seed in &self.seeds {
            let r = search(&self.sim(0.0, seed), policy, &self.knobs, &mut |_, _, _, _| {})?;
            results.push((r.goodput_rps, r.at_goodput));
        }
        results.sort_by(|a, b| a.0.total_cmp(&b.0));
        Ok(results.swap_remove(results.len() / 2))
    }

    fn run(&self, rate: f64, policy: &PolicyConfig) -> Result<SimReport, ReportError> {
        self.run_seed(rate, self.seeds[0], policy)
    }

    fn run_seed(&self, rate: f64, seed: u64, policy: &PolicyConfig) -> Result<SimReport, ReportError> {
        let cfg = self.sim(rate, seed);
        let mut s = build(&cfg.models, cfg.gpus, policy)?;
        Ok(simulate(&cfg, s.as_mut())?)
    }
}

fn policy(kind: PolicyKind, gather: Gather) -> PolicyConfig {
    let mut p = PolicyConfig::new(kind);
    p.gather = gather;
    p
}

/// The policies every comparison runs, with their report labels.
fn contenders() -> Vec<(String, PolicyConfig)> {
    vec![
        ("deferred (early drop)".into(), policy(PolicyKind::Deferred, Gather::Early)),
        ("deferred (lazy drop)".into(), policy(PolicyKind::Deferred, Gather::Lazy)),
        ("clockwork".into(), policy(PolicyKind::Clockwork, Gather::Lazy)),
        ("clockwork-any".into(), policy(PolicyKind::ClockworkAny, Gather::Lazy)),
        ("shepherd".into(), policy(PolicyKind::Shepherd, Gather::Lazy)),
        ("nexus".into(), policy(PolicyKind::Nexus, Gather::Early)),
        ("timeout (k=5 ms)".into(), policy(PolicyKind::Timeout, Gather::Lazy)),
        ("eager (EDF)".into(), policy(PolicyKind::Eager, Gather::Lazy)),
    ]
}

/// `count` copies of `m` named `NAME#i`.
fn copies(m: &ModelSpec, count: usize) -> Vec<ModelSpec> {
    (0..count).map(|i| ModelSpec { name: format!("{}#{i}", m.name), ..m.clone() }).collect()
}

/// The Markdown header row and separator of a table with a first column
/// `first` and one right-aligned column per label.
fn print_table_header(first: &str, labels: &[String]) {
    println!("| {first} | {} |", labels.join(" | "));
    println!("|---|{}", "---:|".repeat(labels.len()));
}

/// `report fig13 [--json]`: Figure 13 (`model_threads` as for [`run`]).
pub fn fig13(quick: bool, json: bool, model_threads: &[usize], plot_dir: Option<&Path>) -> Result<(), ReportError> {
    fig13::fig13(quick, model_threads, plot_dir, json)
}

/// `model_threads`: the ModelThread counts of Figure 13 (empty: 1 up to
/// the machine's cores, at least 2).
pub fn run(name: &str, quick: bool, plot_dir: Option<&Path>, model_threads: &[usize]) -> Result<(), ReportError> {
    match name {
        "table2" => paper::table2(quick),
        "fig6a" => paper::fig6a(quick),
        "fig6b" => deferral::fig6b(quick, plot_dir),
        "fig7" => deferral::fig7(quick, plot_dir),
        "fig11" => quality::fig11(quick, plot_dir),
        "fig12" => quality::fig12(quick, plot_dir),
        "fig9" => paper::fig9(quick),
        "fig2" => paper::fig2(quick, plot_dir),
        "fig10" => paper::fig10(quick),
        "fig13" => fig13::fig13(quick, model_threads, plot_dir, false),
        "fig14" => network::fig14(quick),
        "live-curve" => live::live_curve(quick),
        "fig16" => fig16::run(quick, plot_dir),
        other => Err(ReportError::Unknown { name: other.to_string() }),
    }
}
