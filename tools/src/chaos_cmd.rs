//! `symphony chaos`: one seed with a report, or many seeds with a summary.

use std::io::Write as _;

use dataplane::time::Duration;
use tools::chaos::sweep::{sweep, SweepSummary};
use tools::chaos::{run as run_one, ChaosConfig, ChaosReport, FaultSet, Mutation};

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
}

fn config(a: &ChaosArgs) -> Result<ChaosConfig, String> {
    let faults = FaultSet::parse(&a.faults)?;
    if !(a.duration_s > 0.0 && a.duration_s <= 3600.0) {
        return Err(format!("--duration-s {}: must be in (0, 3600]", a.duration_s));
    }
    if a.frontends == 0 || a.backends == 0 {
        return Err("--frontends and --backends must be at least 1".into());
    }
    if !(a.rate > 0.0 && a.rate.is_finite()) {
        return Err(format!("--rate {}: must be positive", a.rate));
    }
    let mutation = match &a.mutation {
        None => None,
        Some(m) => Some(Mutation::parse(m).ok_or_else(|| {
            let names: Vec<_> = Mutation::ALL.iter().map(|m| m.as_str()).collect();
            format!("unknown mutation '{m}' (valid: {})", names.join(", "))
        })?),
    };
    let mut cfg = ChaosConfig::new(a.seed, faults, Duration::from_nanos((a.duration_s * 1e9) as u64));
    cfg.frontends = a.frontends;
    cfg.backends = a.backends;
    cfg.rate_rps = a.rate;
    cfg.mutation = mutation;
    for (name, v) in [("--priority-mix", a.priority_mix), ("--cancel-share", a.cancel_share)] {
        if !(0.0..=1.0).contains(&v) {
            return Err(format!("{name} {v}: must be a share in [0, 1]"));
        }
    }
    cfg.priority_mix = a.priority_mix;
    cfg.cancel_share = a.cancel_share;
    cfg.max_queue = a.max_queue;
    Ok(cfg)
}

pub fn run(a: &ChaosArgs) -> Result<(), String> {
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
    for v in &r.violations {
        let _ = writeln!(out, "VIOLATION: {v}");
    }
    if !r.ok() {
        let _ = writeln!(out, "replay: {}", r.replay);
    }
}

fn one(cfg: &ChaosConfig, json: bool) -> Result<(), String> {
    let r = run_one(cfg.clone())?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r).map_err(|e| e.to_string())?);
    } else {
        print_report(&r);
    }
    if r.ok() {
        Ok(())
    } else {
        Err(format!("invariants broken; replay with: {}", r.replay))
    }
}

fn many(cfg: &ChaosConfig, n: u64, a: &ChaosArgs) -> Result<(), String> {
    let threads = a.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let bar = Progress::new("chaos", a.json);
    let s: SweepSummary = sweep(cfg, n, threads, &|done| bar.update(done as u32, n as u32, "seeds"))?;
    bar.finish();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&s).map_err(|e| e.to_string())?);
    } else {
        println!(
            "{} seeds from {} ({}): {} requests ({} fewest in a seed), {} succeeded, {} unaccounted, {} seeds failed",
            s.seeds, cfg.seed, cfg.faults.names(), s.accepted, s.min_requests, s.succeeded, s.unaccounted, s.failed_seeds
        );
        for (k, v) in &s.faults {
            println!("  fault {k}: {v} hits in flight");
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
        Err("chaos sweep failed".into())
    }
}
