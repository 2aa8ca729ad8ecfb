//! The paper's worked example (section 3.3, Figures 4 and 5): one model with
//! `l(b) = b + 5`, SLO 12, three GPUs, request `i` arriving at `0.75 (i-1)`
//! (time units are milliseconds here).

use crate::cli::{parse_gather, CliError};
use dataplane::time::{Duration, Instant};
use scheduler::policy::{build, PolicyConfig, PolicyError, PolicyKind};
use scheduler::sim::{simulate_observed, BatchObserver, InvariantViolation, SimConfig, Workload};
use scheduler::types::{GpuId, Request};
use scheduler::zoo::{ModelSpec, ZooError};
use serde::Serialize;

#[derive(Serialize)]
struct Dispatch {
    decided_ms: f64,
    exec_ms: f64,
    finish_ms: f64,
    gpu: GpuId,
    batch: usize,
    requests: Vec<u64>,
}

#[derive(Serialize, Default)]
struct Trace {
    dispatches: Vec<Dispatch>,
    dropped: Vec<u64>,
}

impl BatchObserver for Trace {
    fn on_batch(&mut self, now: Instant, gpu: GpuId, _model: u32, exec_at: Instant, members: &[Request]) {
        let n = members.len();
        self.dispatches.push(Dispatch {
            decided_ms: now.as_millis_f64(),
            exec_ms: exec_at.as_millis_f64(),
            finish_ms: (exec_at + Duration::from_millis(5 + n as u64)).as_millis_f64(),
            gpu,
            batch: n,
            requests: members.iter().map(|r| r.id).collect(),
        });
    }
    fn on_drop(&mut self, _now: Instant, req: &Request) {
        self.dropped.push(req.id);
    }
}

/// Why the worked example could not be replayed.
#[derive(Debug, thiserror::Error)]
pub enum ExampleError {
    /// `--policy` or `--gather` is wrong.
    #[error(transparent)]
    Cli(#[from] CliError),
    /// The example's model is invalid (a bug).
    #[error(transparent)]
    Zoo(#[from] ZooError),
    /// The policy could not be built.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The run broke an invariant.
    #[error(transparent)]
    Simulation(#[from] InvariantViolation),
    /// The trace could not be encoded.
    #[error("cannot encode the trace: {0}")]
    Json(#[from] serde_json::Error),
}

pub fn run(policy: &str, skip: &[u32], requests: u32, gather: &str, json: bool) -> Result<(), ExampleError> {
    let model = ModelSpec::linear("example", 1.0, 5.0, 12.0)?;
    let mut trace = Vec::new();
    // Request numbers are 1-based as in the paper; the sim numbers arrivals
    // from 0, so keep a map back to the paper's numbering.
    let mut numbers = Vec::new();
    for i in 1..=requests {
        if !skip.contains(&i) {
            trace.push((Instant::from_nanos(u64::from(i - 1) * 750_000), 0u32));
            numbers.push(u64::from(i));
        }
    }
    let last = trace.last().map_or(Instant::ZERO, |t| t.0);
    let cfg = SimConfig {
        models: vec![model],
        gpus: 3,
        workload: Workload::poisson(0.0),
        duration: last.saturating_since(Instant::ZERO) + Duration::from_millis(1),
        warmup: Duration::ZERO,
        seed: 0,
        trace: Some(trace),
        admission: Default::default(),
    };
    let mut pc = PolicyConfig::new(PolicyKind::parse(policy).map_err(CliError::from)?);
    pc.gather = parse_gather(gather)?;
    let mut sched = build(&cfg.models, cfg.gpus, &pc)?;
    let mut obs = Trace::default();
    let report = simulate_observed(&cfg, sched.as_mut(), &mut obs)?;
    for d in &mut obs.dispatches {
        for r in &mut d.requests {
            *r = numbers[*r as usize];
        }
    }
    for r in &mut obs.dropped {
        *r = numbers[*r as usize];
    }
    if json {
        let v = serde_json::json!({ "policy": policy, "skip": skip, "trace": obs, "good": report.good, "dropped": report.dropped });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("worked example: policy {policy}, 3 GPUs, l(b)=b+5, SLO 12, R_i at 0.75(i-1){}", if skip.is_empty() { String::new() } else { format!(", skipping {skip:?}") });
    println!("{:>8} {:>8} {:>8} {:>4} {:>5}  requests", "decided", "start", "finish", "GPU", "batch");
    for d in &obs.dispatches {
        let ids: Vec<String> = d.requests.iter().map(|r| format!("R{r}")).collect();
        println!("{:>8.2} {:>8.2} {:>8.2} {:>4} {:>5}  {}", d.decided_ms, d.exec_ms, d.finish_ms, d.gpu + 1, d.batch, ids.join(" "));
    }
    let dropped: Vec<String> = obs.dropped.iter().map(|r| format!("R{r}")).collect();
    println!("served {}  dropped {} {}", report.good, report.dropped, dropped.join(" "));
    Ok(())
}
