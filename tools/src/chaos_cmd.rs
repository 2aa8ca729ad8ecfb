//! `symphony chaos`: one seed with a report, or many seeds with a summary.

use std::io::Write as _;

use dataplane::time::Duration;
use tools::chaos::sweep::{sweep, SweepSummary};
use tools::chaos::faults::UnknownFaultClass;
use tools::chaos::{run as run_one, ChaosConfig, ChaosError, ChaosReport, FaultSet, Mutation};

use crate::progress::Progress;

pub struct ChaosArgs {
    pub seed: u64,
    pub faults: String,
    pub duration_s: f64,
    pub frontends: usize,
    pub backends: usize,
    pub rate: f64,
    pub seeds: Option<u64>,
    pub threads: Option<usize>,
    pub mutation: Option<String>,
    pub json: bool,
    pub priority_mix: f64,
    pub cancel_share: f64,
    pub max_queue: u32,
    pub trace_task: Option<String>,
}

/// Why `symphony chaos` stopped or failed.
#[derive(Debug, thiserror::Error)]
pub enum ChaosCmdError {
    /// `--priority-mix` or `--cancel-share` outside [0, 1].
    #[error("{name} {value}: must be a share in [0, 1]")]
    Share {
        /// The flag.
        name: &'static str,
        /// The value given.
        value: f64,
    },
    /// `--faults` is wrong.
    #[error(transparent)]
    Faults(#[from] UnknownFaultClass),
    /// `--duration-s` out of range.
    #[error("--duration-s {value}: must be in (0, 3600]")]
    Duration {
        /// The value given.
        value: f64,
    },
    /// No frontend or no backend.
    #[error("--frontends and --backends must be at least 1 (got {frontends}, {backends})")]
    NoNodes {
        /// `--frontends`.
        frontends: usize,
        /// `--backends`.
        backends: usize,
    },
    /// `--trace-task` is not a task id.
    #[error("--trace-task {value}: must be a task id in hex (as a violation names it, e.g. 0x10000000100049)")]
    TraceTask {
        /// The value given.
        value: String,
    },
    /// `--rate` not positive.
    #[error("--rate {value}: must be positive")]
    Rate {
        /// The value given.
        value: f64,
    },
    /// `--mutation` names none.
    #[error("unknown mutation '{name}' (valid: {})", Mutation::ALL.iter().map(|m| m.as_str()).collect::<Vec<_>>().join(", "))]
    Mutation {
        /// The name given.
        name: String,
    },
    /// The run could not start.
    #[error(transparent)]
    Run(#[from] ChaosError),
    /// A seed broke an invariant.
    #[error("invariants broken; replay with: {replay}")]
    Broken {
        /// The command that replays the seed.
        replay: String,
    },
    /// A sweep had failing seeds or classes without hits.
    #[error("chaos sweep failed")]
    SweepFailed,
    /// The report could not be encoded.
    #[error("cannot encode the report: {0}")]
    Json(#[from] serde_json::Error),
}

fn config(a: &ChaosArgs) -> Result<ChaosConfig, ChaosCmdError> {
    let faults = FaultSet::parse(&a.faults)?;
    if !(a.duration_s > 0.0 && a.duration_s <= 3600.0) {
        return Err(ChaosCmdError::Duration { value: a.duration_s });
    }
    if a.frontends == 0 || a.backends == 0 {
        return Err(ChaosCmdError::NoNodes { frontends: a.frontends, backends: a.backends });
    }
    if !(a.rate > 0.0 && a.rate.is_finite()) {
        return Err(ChaosCmdError::Rate { value: a.rate });
    }
    let mutation = match &a.mutation {
        None => None,
        Some(m) => Some(Mutation::parse(m).ok_or_else(|| ChaosCmdError::Mutation { name: m.clone() })?),
    };
    let mut cfg = ChaosConfig::new(a.seed, faults, Duration::from_nanos((a.duration_s * 1e9) as u64));
    cfg.frontends = a.frontends;
    cfg.backends = a.backends;
    cfg.rate_rps = a.rate;
    cfg.mutation = mutation;
    for (name, v) in [("--priority-mix", a.priority_mix), ("--cancel-share", a.cancel_share)] {
        if !(0.0..=1.0).contains(&v) {
            return Err(ChaosCmdError::Share { name, value: v });
        }
    }
    cfg.priority_mix = a.priority_mix;
    cfg.cancel_share = a.cancel_share;
    cfg.max_queue = a.max_queue;
    if let Some(t) = &a.trace_task {
        let digits = t.strip_prefix("0x").unwrap_or(t);
        let id = u64::from_str_radix(digits, 16).map_err(|_| ChaosCmdError::TraceTask { value: t.clone() })?;
        cfg.trace_task = Some(id);
    }
    Ok(cfg)
}

pub fn run(a: &ChaosArgs) -> Result<(), ChaosCmdError> {
    let cfg = config(a)?;
    match a.seeds {
        None => one(&cfg, a.json),
        Some(n) => many(&cfg, n, a),
    }
}

fn print_report(r: &ChaosReport) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "seed {}  faults {}  virtual {:.1} s  trace {}", r.seed, r.fault_classes, r.virtual_s, r.trace_hash);
    let _ = writeln!(out, "accepted {}  succeeded {}  late {}  dropped {}  failed {}  cancelled {}  unaccounted {}", r.accepted, r.succeeded, r.late, r.dropped_total(), r.failed_total(), r.cancelled, r.unaccounted);
    let mut d: Vec<_> = r.dropped.iter().collect();
    d.sort();
    for (k, v) in d {
        let _ = writeln!(out, "  dropped {k}: {v}");
    }
    let mut f: Vec<_> = r.failed.iter().collect();
    f.sort();
    for (k, v) in f {
        let _ = writeln!(out, "  failed {k}: {v}");
    }
    let mut x: Vec<_> = r.faults.iter().collect();
    x.sort();
    for (k, v) in x {
        let _ = writeln!(out, "  fault {k}: {v} hits in flight");
    }
    let _ = writeln!(out, "batches {}", r.batches);
    for line in &r.trace {
        let _ = writeln!(out, "trace {line}");
    }
    for v in &r.violations {
        let _ = writeln!(out, "VIOLATION: {v}");
    }
    if !r.ok() {
        let _ = writeln!(out, "replay: {}", r.replay);
    }
}

fn one(cfg: &ChaosConfig, json: bool) -> Result<(), ChaosCmdError> {
    let r = run_one(cfg.clone())?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print_report(&r);
    }
    if r.ok() {
        Ok(())
    } else {
        Err(ChaosCmdError::Broken { replay: r.replay })
    }
}

fn many(cfg: &ChaosConfig, n: u64, a: &ChaosArgs) -> Result<(), ChaosCmdError> {
    let threads = a.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let bar = Progress::new("chaos", a.json);
    let s: SweepSummary = sweep(cfg, n, threads, &|done| bar.update(done as u32, n as u32, "seeds"))?;
    bar.finish();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        println!(
            "{} seeds from {} ({}): {} requests ({} fewest in a seed), {} succeeded, {} unaccounted, {} seeds failed",
            s.seeds, cfg.seed, cfg.faults.names(), s.accepted, s.min_requests, s.succeeded, s.unaccounted, s.failed_seeds
        );
        for (k, v) in &s.faults {
            println!("  fault {k}: {v} hits in flight");
        }
        if cfg.faults.failover() {
            println!("  plans fenced off by epoch: {}", s.fenced_plans);
        }
        for c in &s.classes_without_hits {
            println!("CLASS WITHOUT HITS: {c}");
        }
        for r in &s.failures {
            println!("seed {} failed: {}", r.seed, r.violations.join("; "));
            println!("  replay: {}", r.replay);
        }
    }
    if s.ok() {
        Ok(())
    } else {
        Err(ChaosCmdError::SweepFailed)
    }
}
