//! `symphony bench-scheduler`: the scheduler-only capacity test.

use dataplane::idle::IdleStrategy;
use crate::cli::{parse_idle, CliError};
use dataplane::time::Duration;
use scheduler::deferred::CoreConfig;
use scheduler::runtime::{run_live, LiveConfig, LiveReport, RuntimeConfig, RuntimeError};
use scheduler::sim::Workload;
use scheduler::zoo::{parse_model_arg, ModelSpec, ZooError};

pub struct BenchArgs {
    pub models: usize,
    pub gpus: u32,
    pub model_threads: usize,
    pub rate: String,
    pub duration_s: f64,
    pub profile: String,
    pub idle: String,
    pub pin: bool,
    pub seed: u64,
    pub json: bool,
}

/// The `--rate max` pass criteria.
const MAX_LAG_P999_US: f64 = 100.0;
const MAX_BAD_RATE: f64 = 0.01;
/// Runs per `--rate max` probe (the median decides).
const PROBE_RUNS: usize = 3;

fn passes(r: &LiveReport) -> bool {
    r.dispatch_lag.p999_us <= MAX_LAG_P999_US && r.bad_rate <= MAX_BAD_RATE && r.violations == 0 && r.accounted
}

/// Why the capacity test stopped.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A count is zero.
    #[error("--profile-copies, --gpus and --model-threads must be at least 1 (got {models}, {gpus}, {model_threads})")]
    ZeroCount {
        /// `--models`.
        models: usize,
        /// `--gpus`.
        gpus: u32,
        /// `--model-threads`.
        model_threads: usize,
    },
    /// `--duration-s` out of range.
    #[error("--duration-s must be in (0, 3600], got {value}")]
    Duration {
        /// The value given.
        value: f64,
    },
    /// `--profile` is not `ALPHA_MS,BETA_MS,SLO_MS`.
    #[error("--profile: {0}")]
    Profile(#[source] ZooError),
    /// `--idle` is wrong.
    #[error(transparent)]
    Idle(#[from] CliError),
    /// `--rate` is neither a positive number nor `max`.
    #[error("--rate '{value}': a number > 0 or max")]
    Rate {
        /// The value given.
        value: String,
    },
    /// The runtime failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// `--rate max` found no passing rate.
    #[error("no rate passed (even 250k rps); try fewer GPUs or models, or check the machine's load")]
    NoRatePassed,
    /// The emulated GPUs saw a batch overlap another.
    #[error(transparent)]
    Violations(#[from] EmulatedViolations),
    /// The report could not be encoded.
    #[error("cannot encode the report: {0}")]
    Json(#[from] serde_json::Error),
}

/// The emulated GPUs of a live run saw a batch overlap another.
#[derive(Debug, thiserror::Error)]
#[error("emulated GPUs saw {count} violations: {first:?}")]
pub struct EmulatedViolations {
    /// How many.
    pub count: u64,
    /// The first, described.
    pub first: Option<String>,
}

impl EmulatedViolations {
    /// `Err` when the run saw any.
    pub fn check(report: &LiveReport) -> Result<(), Self> {
        if report.violations > 0 {
            return Err(EmulatedViolations { count: report.violations, first: report.first_violation.clone() });
        }
        Ok(())
    }
}

/// The machine's facts with the in-process runtime's layout (`LiveConfig::pin`:
/// ModelThread i on the i-th CPU this process may use, the RankThread — which
/// the load generator and the emulated GPUs share — on the next; unpinned:
/// wherever the kernel puts them).
pub fn runtime_machine(model_threads: usize, pin: bool) -> dataplane::machine::MachineFacts {
    use dataplane::machine::Placement;
    let cpus = crate::bench_cluster::layout::usable_cpus();
    let on = |i: usize| if pin && !cpus.is_empty() { vec![cpus[i % cpus.len()]] } else { Vec::new() };
    let mut layout: Vec<Placement> = (0..model_threads.max(1)).map(|i| Placement::new(format!("ModelThread {i}"), on(i))).collect();
    layout.push(Placement::new("RankThread + load generator + emulated GPUs", on(model_threads.max(1))));
    dataplane::machine::facts(layout)
}

/// One `--rate max` probe: `(rate, passed, lag p99.9 us, bad rate)`.
type Probe = (f64, bool, f64, f64);

/// One run of the in-process runtime on `a`'s workload at `rate` (what
/// `bench-cluster` compares the daemon with).
pub fn live_report(a: &BenchArgs, rate: f64) -> Result<LiveReport, BenchError> {
    let (models, idle) = check(a)?;
    live(a, &models, idle, rate)
}

/// Checks `a`; its models and idle strategy.
fn check(a: &BenchArgs) -> Result<(Vec<ModelSpec>, IdleStrategy), BenchError> {
    if a.models == 0 || a.gpus == 0 || a.model_threads == 0 {
        return Err(BenchError::ZeroCount { models: a.models, gpus: a.gpus, model_threads: a.model_threads });
    }
    if !(a.duration_s.is_finite() && a.duration_s > 0.0 && a.duration_s <= 3600.0) {
        return Err(BenchError::Duration { value: a.duration_s });
    }
    let base = parse_model_arg(&format!("model={}", a.profile)).map_err(BenchError::Profile)?;
    let models = (0..a.models).map(|i| ModelSpec { name: format!("model{i}"), ..base.clone() }).collect();
    Ok((models, parse_idle(&a.idle)?))
}

fn live(a: &BenchArgs, models: &[ModelSpec], idle: IdleStrategy, rate: f64) -> Result<LiveReport, BenchError> {
    Ok(run_live(&LiveConfig {
        runtime: RuntimeConfig { models: models.to_vec(), gpus: a.gpus, model_threads: a.model_threads, core: CoreConfig::default(), ring_capacity: 1 << 16 },
        workload: Workload::poisson(rate),
        duration: Duration::from_secs_f64(a.duration_s),
        seed: a.seed,
        idle,
        pin: a.pin,
    })?)
}

/// `--rate max` on `a`'s workload: the best passing run (what `report
/// fig13` plots per ModelThread count).
pub fn max_rate(a: &BenchArgs) -> Result<LiveReport, BenchError> {
    let (models, idle) = check(a)?;
    let (report, _) = search_max(&|rate: f64| live(a, &models, idle, rate))?;
    Ok(report)
}

pub fn run(a: &BenchArgs) -> Result<(), BenchError> {
    let (models, idle) = check(a)?;
    let live = |rate: f64| live(a, &models, idle, rate);
    let (report, probes) = if a.rate == "max" {
        search_max(&live)?
    } else {
        let rate: f64 = a.rate.parse().map_err(|_| BenchError::Rate { value: a.rate.clone() })?;
        if !(rate.is_finite() && rate > 0.0) {
            return Err(BenchError::Rate { value: a.rate.clone() });
        }
        (live(rate)?, Vec::new())
    };
    EmulatedViolations::check(&report)?;
    if a.json {
        let mut v = serde_json::to_value(&report)?;
        v["machine"] = serde_json::from_str(&runtime_machine(a.model_threads, a.pin).to_json())?;
        if !probes.is_empty() {
            v["probes"] = serde_json::json!(probes);
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!("{}", runtime_machine(a.model_threads, a.pin).text());
        print_report(&report);
    }
    Ok(())
}

/// `--rate max`: one probe = the median of PROBE_RUNS runs (a shared
/// machine stalls a pinned thread for a scheduler tick now and then, which
/// decides a single run's p99.9). Rates double from 250k while at most one
/// probe in a row fails, then the gap above the best pass is bisected.
fn search_max(live: &dyn Fn(f64) -> Result<LiveReport, BenchError>) -> Result<(LiveReport, Vec<Probe>), BenchError> {
    let mut probes: Vec<Probe> = Vec::new();
    let probe = |rate: f64, probes: &mut Vec<Probe>| -> Result<(bool, LiveReport), BenchError> {
        let mut runs = Vec::with_capacity(PROBE_RUNS);
        for _ in 0..PROBE_RUNS {
            runs.push(live(rate)?);
        }
        runs.sort_by(|x, y| x.dispatch_lag.p999_us.total_cmp(&y.dispatch_lag.p999_us));
        let r = runs.swap_remove(PROBE_RUNS / 2);
        let ok = passes(&r);
        tracing::info!("{:>10.0} rps: median lag p99.9 {:>8.1} us, bad {:.3}%  {}", rate, r.dispatch_lag.p999_us, r.bad_rate * 100.0, if ok { "ok" } else { "fail" });
        probes.push((rate, ok, r.dispatch_lag.p999_us, r.bad_rate));
        Ok((ok, r))
    };
    let mut best: Option<LiveReport> = None;
    let mut fail_above: Option<f64> = None;
    let (mut rate, mut fails) = (250_000.0, 0);
    while rate <= 32e6 && fails < 2 {
        let (ok, r) = probe(rate, &mut probes)?;
        if ok {
            best = Some(r);
            fails = 0;
            fail_above = None;
        } else {
            fails += 1;
            fail_above.get_or_insert(rate);
        }
        rate *= 2.0;
    }
    let mut lo = best.as_ref().map_or(0.0, |r| r.offered_rps);
    let mut hi = fail_above.unwrap_or(lo * 2.0);
    for _ in 0..3 {
        if lo <= 0.0 || hi - lo <= 0.02 * hi {
            break;
        }
        let mid = 0.5 * (lo + hi);
        let (ok, r) = probe(mid, &mut probes)?;
        if ok {
            lo = mid;
            best = Some(r);
        } else {
            hi = mid;
        }
    }
    Ok((best.ok_or(BenchError::NoRatePassed)?, probes))
}

fn print_report(r: &LiveReport) {
    println!("{} models, {} GPUs, {} ModelThread(s){}", r.models, r.gpus, r.model_threads, if r.pinned { ", pinned" } else { "" });
    println!("sustained {:.0} rps ({:.0} per ModelThread core), bad rate {:.3}%, mean batch {:.1}", r.sustained_rps, r.rps_per_model_thread, r.bad_rate * 100.0, r.mean_batch);
    let l = &r.dispatch_lag;
    println!("dispatch lag us: p50 {:.1}  p99 {:.1}  p99.9 {:.1}  p99.99 {:.1}  max {:.1}", l.p50_us, l.p99_us, l.p999_us, l.p9999_us, l.max_us);
    println!("RankThread: {:.0} events/s, utilisation {:.1}%; ModelThread utilisation {:?}", r.rank_events_per_s, r.rank_utilisation * 100.0, r.model_thread_utilisation.iter().map(|u| format!("{:.0}%", u * 100.0)).collect::<Vec<_>>());
    println!("CPU {:.0} ns/request; ingress lag p99.9 {:.1} us; accounted {}", r.cpu_ns_per_request, r.ingress_lag.p999_us, r.accounted);
}
