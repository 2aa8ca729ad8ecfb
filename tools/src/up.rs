//! `symphony up`: a local multi-process cluster (one scheduler, two
//! frontends, emulated-GPU backends; separate processes over the default
//! local transport), an open-loop HTTP workload from the model zoo for a
//! bounded time, and a summary next to the simulator's prediction for the
//! same workload and cluster. `--serve` keeps the cluster up for outside
//! clients instead. Also the end-to-end goodput search behind
//! `symphony report e2e`.

use std::path::PathBuf;
use std::time::{Duration as StdDuration, Instant as StdInstant};

use dataplane::control::{self, metric, parse_idle, ControlError, TransportKind};
use node_shell::{self as shell, LogArgs, LogFormat};
use dataplane::time::Duration;
use dataplane::wire::DropReason;
use frontend::loadgen::{self, LoadReport};
use frontend::models::ModelCatalog;
use scheduler::goodput::{search, GoodputSearch};
use scheduler::policy::{build, PolicyConfig, PolicyKind};
use scheduler::sim::{simulate, SimConfig, SimReport, Workload};
use scheduler::zoo::ModelSpec;
use tools::cluster::{ClusterSpec, LocalCluster};
use tracing::{info, warn};

use crate::plot::{self, WriteError};

/// What the local cluster is made of, shared by `up` and `e2e`.
#[derive(clap::Args, Clone, Debug)]
pub struct ClusterOpts {
    /// Model zoo: a100 or 1080ti.
    #[arg(long, default_value = "a100")]
    pub zoo: String,
    /// Extra model NAME=ALPHA_MS,BETA_MS,SLO_MS (repeatable).
    #[arg(long = "model")]
    pub extra: Vec<String>,
    /// Frontend processes.
    #[arg(long, default_value_t = 2)]
    pub frontends: u32,
    /// Backend processes.
    #[arg(long, default_value_t = 2)]
    pub backends: u32,
    /// Emulated GPUs per backend.
    #[arg(long = "gpus-per-backend", default_value_t = 1)]
    pub gpus_per_backend: u32,
    /// Transport between the daemons: shm, tcp, tcp-blocking, rdma.
    #[arg(long, default_value = "shm", value_parser = TransportKind::parse)]
    pub transport: TransportKind,
    /// Every daemon's --idle on this one host: spin, yield, park, wait,
    /// park:US (wait: no spinning, as several daemons share the cores).
    #[arg(long = "local-idle", default_value = "wait", value_parser = valid_idle)]
    pub idle: String,
    /// The scheduler's --control-delay-us on this one host (loopback), µs:
    /// the delay it charges and announces, which the backends adopt.
    #[arg(long = "local-control-delay-us", default_value_t = 200)]
    pub control_delay_us: u32,
    /// The frontends' --return-margin-us on this one host, µs: the part of
    /// each request's budget kept for the way back.
    #[arg(long = "local-return-margin-us", default_value_t = 700)]
    pub return_margin_us: u32,
    /// The scheduler's --min-window-us on this one host, µs: its narrowest
    /// schedulable window.
    #[arg(long = "local-min-window-us", default_value_t = 1000)]
    pub min_window_us: u32,
    /// Seed of the workload.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Serve the real ONNX models of this Triton-layout repository (see
    /// scripts/fetch-models.sh) with the profiles `symphony profile` wrote
    /// into REPO/profile.json; the backends run them with ONNX Runtime.
    /// Implies --serve (the zoo workload's reference outputs do not apply).
    #[arg(long = "model-repository")]
    pub model_repository: Option<PathBuf>,
    /// TLS certificate chain (PEM) the frontends serve HTTP and gRPC with
    /// (with --tls-key; only with --serve: the built-in load speaks plain HTTP).
    #[arg(long = "tls-cert", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM) of --tls-cert.
    #[arg(long = "tls-key", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// TLS on the daemons' tcp links (--transport tcp or tcp-blocking):
    /// mutual TLS with a throwaway CA and certificate made at start
    /// (written 0600 beside the daemons' logs).
    #[arg(long = "link-tls")]
    pub link_tls: bool,
    /// File holding the admin token that model control and the repository
    /// index need on the frontends (as the frontend's --admin-token-file;
    /// without it those calls are refused).
    #[arg(long = "admin-token-file")]
    pub admin_token_file: Option<PathBuf>,
    /// Most requests waiting per model at the scheduler (0: unbounded); the
    /// excess is refused at once as overloaded.
    #[arg(long = "max-queue", default_value_t = 0)]
    pub max_queue: u32,
    /// Two priority levels (issue 17): the scheduler gets
    /// `--priority-levels 2` and this share of the load is sent with
    /// `priority` 1 (high), the rest with 2 (low); the report gives each
    /// class's bad rate.
    #[arg(long = "priority-mix", value_parser = share)]
    pub priority_mix: Option<f64>,
    /// With `--priority-mix`: the scheduler's `--priority-reserve-us`.
    #[arg(long = "priority-reserve-us", default_value_t = 2000)]
    pub priority_reserve_us: u32,
    /// This command's and every daemon's log options.
    #[command(flatten)]
    pub log: LogArgs,
}

/// A share in [0, 1].
fn share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("{s}: must be a number in [0, 1]")),
    }
}

/// An idle strategy's name, checked by the daemons' own parser (the name
/// itself is handed to them).
fn valid_idle(s: &str) -> Result<String, ControlError> {
    parse_idle(s).map(|_| s.to_string())
}

/// Why `up` or `e2e` failed.
#[derive(Debug, thiserror::Error)]
pub enum UpError {
    /// A bad option (found before any daemon starts).
    #[error("{0}")]
    Usage(String),
    /// The model selection does not resolve against the zoo (a bad
    /// option too; the zoo's error).
    #[error(transparent)]
    Models(#[from] scheduler::zoo::ZooError),
    /// The cluster, the load or the simulation failed (its error, or a
    /// message where the failure is a finding of `up`'s own).
    #[error(transparent)]
    Run(Box<dyn std::error::Error + Send + Sync>),
    /// This executable's path is unknown (needed to start the daemons).
    #[error("cannot find my own executable: {0}")]
    OwnExe(#[source] std::io::Error),
    /// A file cannot be written.
    #[error(transparent)]
    Write(#[from] WriteError),
    /// The stop signals cannot be installed.
    #[error(transparent)]
    Signals(#[from] ControlError),
    /// The accounting or routing checks failed after a run.
    #[error("accounting or routing check failed (see above)")]
    Check,
}

/// An error of the code `up` drives (the cluster, the load generator, the
/// simulator), kept as the source, or a message of `up`'s own.
pub(crate) fn run_err(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> UpError {
    UpError::Run(e.into())
}

fn write_err(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> UpError + '_ {
    move |source| UpError::Write(WriteError { action: "write", path: path.to_path_buf(), source })
}

/// `symphony up` options.
pub struct UpArgs {
    pub models: String,
    pub cluster: ClusterOpts,
    pub load: f64,
    pub rate: Option<f64>,
    pub duration_s: f64,
    pub serve: bool,
    pub plot: Option<PathBuf>,
    pub json: bool,
}

/// The cluster spec `up` and the e2e report start.
pub fn spec(models: &str, o: &ClusterOpts) -> Result<ClusterSpec, UpError> {
    // The transport and idle names were checked by the daemons' own
    // parsers when the command line was read, before any child starts.
    let exe = std::env::current_exe().map_err(UpError::OwnExe)?;
    let mut s = ClusterSpec::new(exe, &o.zoo, models);
    s.extra = o.extra.clone();
    s.frontends = o.frontends;
    s.backends = o.backends;
    s.gpus_per_backend = o.gpus_per_backend;
    s.transport = o.transport.name().to_string();
    s.idle = o.idle.clone();
    s.control_delay_us = o.control_delay_us;
    s.return_margin_us = o.return_margin_us;
    s.min_window_us = o.min_window_us;
    s.log_dir = Some(std::env::temp_dir().join(format!("{LOG_DIR_PREFIX}{}", std::process::id())));
    // A request's outcome is due at its SLO: a late answer is a failure,
    // not a slow success, so the client's 200s are the goodput.
    s.frontend_flags = vec!["--grace-ms".into(), "0".into()];
    if let Some(repo) = &o.model_repository {
        let repo = repo.display().to_string();
        s.backend_flags.extend(["--executor".into(), "onnx".into(), "--model-repository".into(), repo.clone()]);
        s.frontend_flags.extend(["--model-repository".into(), repo.clone()]);
        // The scheduler takes each model's admission (priority levels,
        // queue bound) and batch cap (max_batch_size) from the same
        // config.pbtxt files. Light load: a real model's client at low
        // concurrency should not wait for a batch that cannot form in time
        // while its executor idles (issue 54).
        s.scheduler_flags.extend(["--model-repository".into(), repo, "--light-load".into(), "on".into()]);
    }
    if let (Some(cert), Some(key)) = (&o.tls_cert, &o.tls_key) {
        s.frontend_flags.extend(["--tls-cert".into(), cert.display().to_string(), "--tls-key".into(), key.display().to_string()]);
    }
    if o.link_tls {
        if !matches!(o.transport, TransportKind::Tcp | TransportKind::TcpBlocking) {
            return Err(UpError::Usage(format!("--link-tls: TLS is for tcp links, not --transport {}", o.transport.name())));
        }
        let dir = s.log_dir.clone().unwrap_or_else(std::env::temp_dir);
        let flags = tools::throwaway_tls::throwaway(&dir).map_err(run_err)?.to_flags();
        for role in [&mut s.scheduler_flags, &mut s.frontend_flags, &mut s.backend_flags] {
            role.extend(flags.iter().cloned());
        }
    }
    if let Some(f) = &o.admin_token_file {
        s.frontend_flags.extend(["--admin-token-file".into(), f.display().to_string()]);
    }
    if o.max_queue > 0 {
        s.scheduler_flags.extend(["--max-queue".into(), o.max_queue.to_string()]);
    }
    if o.priority_mix.is_some() {
        s.scheduler_flags.extend(["--priority-levels".into(), "2".into(), "--priority-reserve-us".into(), o.priority_reserve_us.to_string()]);
    }
    // The daemons log as this command does.
    let format = match o.log.log_format {
        LogFormat::Human => "human",
        LogFormat::Json => "json",
    };
    for flags in [&mut s.scheduler_flags, &mut s.frontend_flags, &mut s.backend_flags] {
        flags.extend(["--log-format".into(), format.into(), "--log-level".into(), o.log.log_level.clone()]);
    }
    Ok(s)
}

/// The cluster's models for `--model-repository`: every loadable model of
/// the repository that REPO/profile.json profiles, as
/// `NAME=ALPHA_MS,BETA_MS,SLO_MS` (the SLO from its config.pbtxt).
pub fn repository_models(repo: &std::path::Path) -> Result<Vec<String>, UpError> {
    use scheduler::repository::{self, profile::ProfileFile};
    let scanned = repository::scan(repo).map_err(run_err)?;
    for e in &scanned.refused {
        warn!(error = %e, "model repository: refused");
    }
    let profiles = ProfileFile::load(repo).map_err(run_err)?;
    let mut out = Vec::new();
    for m in &scanned.models {
        match profiles.model(m.name()) {
            Some(p) => out.push(format!("{}={},{},{}", m.name(), p.alpha_ms.max(0.0), p.beta_ms.max(0.0), m.slo().as_secs_f64() * 1e3)),
            None => warn!(model = %m.name(), profiles = %ProfileFile::path(repo).display(), "not profiled (run symphony profile); not served"),
        }
    }
    if out.is_empty() {
        return Err(UpError::Usage(format!("{}: no profiled, loadable model", repo.display())));
    }
    Ok(out)
}

/// The simulator's view of the same workload and cluster.
pub fn sim_config(models: &[ModelSpec], gpus: u32, rate: f64, secs: f64, seed: u64) -> SimConfig {
    SimConfig {
        models: models.to_vec(),
        gpus,
        workload: Workload::poisson(rate),
        duration: Duration::from_secs_f64(secs.max(5.0)),
        warmup: Duration::from_secs_f64(1.0),
        seed,
        trace: None,
        admission: Default::default(),
    }
}

/// The scheduler-only goodput (the paper's "(s)") of the cluster.
pub fn sim_goodput(models: &[ModelSpec], gpus: u32, seed: u64) -> Result<f64, UpError> {
    let policy = PolicyConfig::new(PolicyKind::Deferred);
    let found = search(&sim_config(models, gpus, 0.0, 10.0, seed), &policy, &GoodputSearch::default(), &mut |_, _, _, _| {});
    Ok(found.map_err(run_err)?.goodput_rps)
}

/// One end-to-end load run and what the daemons counted during it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct E2eRun {
    pub offered_rps: f64,
    pub sent: u64,
    pub ok: u64,
    pub goodput_rps: f64,
    pub bad_rate: f64,
    /// Worst per-model bad rate, from the frontends' per-model counters.
    pub worst_model_bad_rate: f64,
    pub median_batch: f64,
    pub mean_batch: f64,
    pub gpu_busy_fraction: f64,
    pub latency_ok_ms: [f64; 5],
    pub wrong_client: u64,
    pub wrong_output: u64,
    /// Client-side: correct answers after the SLO (as the client measured
    /// it), 503s (dropped, or no outcome by the deadline) and 5xx (failed
    /// at a backend).
    pub late: u64,
    pub unavailable: u64,
    pub server_errors: u64,
    pub accounted: bool,
    pub advice_add_gpus: f64,
    pub advice_remove_gpus: f64,
    /// Where the bad requests went: dropped by the scheduler (deadline
    /// unmeetable, or given up early by the policy),
    /// dropped for other reasons, failed at the frontends (outcome after
    /// the deadline, or a backend failure), and batches that started late
    /// at the backends.
    pub scheduler_deadline_drops: f64,
    pub frontend_dropped: f64,
    pub frontend_failed: f64,
    pub backend_late_starts: f64,
    pub backend_batches: f64,
    /// Batches of each size during the run, (size, count), sizes with none left out.
    pub batch_sizes: Vec<(u32, f64)>,
    /// Where executed requests spent their time: mean µs per stage
    /// (`frontend::metrics::Stage`), in order, over all models and frontends.
    pub stage_mean_us: Vec<(String, f64)>,
    /// Their mean end-to-end time at the frontends, µs (the stages' sum).
    pub executed_mean_us: f64,
    /// Input READs the backends posted, and those that failed (one READ per
    /// input: tests/softroce checks it over verbs).
    pub backend_reads_posted: f64,
    pub backend_read_failures: f64,
    /// With a priority mix: the high (`priority` 1) then the low class's
    /// outcomes as the client saw them; empty without.
    pub priority_classes: Vec<PriorityClass>,
}

/// One priority class's outcomes in an [`E2eRun`].
#[derive(Clone, Debug, serde::Serialize)]
pub struct PriorityClass {
    pub priority: u32,
    pub sent: u64,
    pub ok: u64,
    pub late: u64,
    pub unavailable: u64,
    pub other: u64,
    pub bad_rate: f64,
    /// Where the class's requests went, from the daemons' per-level
    /// counters between the run's scrapes: tasks the scheduler dispatched,
    /// its drops by reason (reasons with none left out), the frontends'
    /// outcomes (`late`: a result after the budget as the frontend measured
    /// it), and the executed requests' mean µs per stage.
    pub scheduler_dispatched: f64,
    pub scheduler_drops: Vec<(String, f64)>,
    pub frontend_outcomes: Vec<(String, f64)>,
    pub stage_mean_us: Vec<(String, f64)>,
}

struct Scrape {
    sched: String,
    fronts: Vec<String>,
    backs: Vec<String>,
}

fn scrape(c: &LocalCluster) -> Result<Scrape, UpError> {
    Ok(Scrape {
        sched: c.scheduler.metrics().map_err(run_err)?,
        fronts: c.frontends.iter().map(|f| f.metrics()).collect::<Result<_, _>>().map_err(run_err)?,
        // A backend killed on purpose has no metrics: count it as empty.
        backs: c.backends.iter().map(|b| b.metrics().unwrap_or_default()).collect(),
    })
}

fn sum_delta(after: &[String], before: &[String], name: &str) -> f64 {
    after.iter().zip(before).map(|(a, b)| m(a, name) - m(b, name)).sum()
}

fn m(text: &str, name: &str) -> f64 {
    metric(text, name).unwrap_or(0.0)
}

/// Batches of each size between two scrapes (from the exact per-size counts).
fn batch_sizes(before: &str, after: &str) -> Vec<(u32, f64)> {
    scheduler::daemon::metrics::EXACT_BATCH_SIZES
        .map(|b| {
            let name = format!("symphony_batches_of_size{{size=\"{b}\"}}");
            (b, m(after, &name) - m(before, &name))
        })
        .filter(|&(_, c)| c > 0.0)
        .collect()
}

/// The batch size the median request ran in, between two scrapes (the
/// simulator's definition of "median batch").
fn median_batch(before: &str, after: &str) -> f64 {
    let counts = batch_sizes(before, after);
    let total: f64 = counts.iter().map(|&(b, c)| f64::from(b) * c).sum();
    let mut acc = 0.0;
    for (b, c) in counts {
        acc += f64::from(b) * c;
        if total > 0.0 && acc * 2.0 >= total {
            return f64::from(b);
        }
    }
    0.0
}

/// Mean µs per stage of the requests executed between two scrapes of the
/// frontends, and their mean end-to-end time.
fn stage_means(models: &[ModelSpec], before: &[String], after: &[String]) -> (Vec<(String, f64)>, f64) {
    let total = |family: &str, labels: &dyn Fn(&str) -> String| -> f64 {
        models.iter().map(|s| sum_delta(after, before, &format!("{family}{{{}}}", labels(&s.name)))).sum()
    };
    let count = total("symphony_executed_request_duration_us_count", &|m| format!("model=\"{m}\""));
    let mean = |sum: f64| if count > 0.0 { sum / count } else { 0.0 };
    let stages = frontend::metrics::Stage::ALL
        .iter()
        .map(|st| {
            let sum = total("symphony_stage_duration_us_sum", &|m| format!("model=\"{m}\",stage=\"{}\"", st.as_str()));
            (st.as_str().to_string(), mean(sum))
        })
        .collect();
    (stages, mean(total("symphony_executed_request_duration_us_sum", &|m| format!("model=\"{m}\""))))
}

/// One priority level's view between two scrapes (requests sent with
/// `priority`, which is also their scheduler level when the model has that
/// many): the scheduler's dispatched tasks and drops by reason, the
/// frontends' outcomes, and the executed requests' mean µs per stage.
#[allow(clippy::type_complexity)]
fn level_view(models: &[ModelSpec], before: &Scrape, after: &Scrape, priority: u32) -> (f64, Vec<(String, f64)>, Vec<(String, f64)>, Vec<(String, f64)>) {
    let level = priority.to_string();
    let sched = |name: String| m(&after.sched, &name) - m(&before.sched, &name);
    let dispatched = sched(format!("symphony_tasks_dispatched_by_level_total{{level=\"{level}\"}}"));
    let drops = DropReason::ALL
        .iter()
        .map(|r| (r.as_str().to_string(), sched(format!("symphony_tasks_dropped_by_level_total{{level=\"{level}\",reason=\"{}\"}}", r.as_str()))))
        .filter(|(_, n)| *n > 0.0)
        .collect();
    let label = frontend::metrics::level_label(priority).to_string();
    let fronts = |family: &str, second: &str, value: &str| -> f64 {
        models
            .iter()
            .map(|s| sum_delta(&after.fronts, &before.fronts, &format!("{family}{{model=\"{}\",level=\"{label}\",{second}=\"{value}\"}}", s.name)))
            .sum()
    };
    let outcomes = frontend::metrics::LevelOutcome::labels()
        .map(|o| {
            let n = fronts("symphony_requests_by_level_total", "outcome", &o);
            (o, n)
        })
        .filter(|(_, n)| *n > 0.0)
        .collect();
    let count = fronts("symphony_stage_duration_by_level_us_count", "stage", frontend::metrics::Stage::Network.as_str());
    let stages = frontend::metrics::Stage::ALL
        .iter()
        .map(|st| {
            let sum = fronts("symphony_stage_duration_by_level_us_sum", "stage", st.as_str());
            (st.as_str().to_string(), if count > 0.0 { sum / count } else { 0.0 })
        })
        .collect();
    (dispatched, drops, outcomes, stages)
}

/// The per-stage line of a run.
pub fn stage_line(e: &E2eRun) -> String {
    let parts: Vec<String> = e.stage_mean_us.iter().map(|(name, us)| format!("{name} {us:.0}")).collect();
    format!("per-stage mean of executed requests (us): {} = end to end {:.0}", parts.join(" + "), e.executed_mean_us)
}

/// Offers `rate` rps (Poisson, equal split over `models`) for `secs` to
/// the cluster's frontends and measures it.
/// With `priority_mix`, that share is sent at priority 1, the rest at 2.
pub fn run_load(c: &LocalCluster, models: &[ModelSpec], rate: f64, secs: f64, seed: u64, priority_mix: Option<f64>) -> Result<E2eRun, UpError> {
    let catalog = ModelCatalog::with_default_tensors(models);
    let mut cfg = tools::cluster::load_config(models, c.http_addrs().map_err(run_err)?, rate, secs, seed);
    cfg.priority_mix = priority_mix;
    let before = scrape(c)?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().map_err(run_err)?;
    let r: LoadReport = rt.block_on(loadgen::run(cfg)).map_err(run_err)?;
    let after = scrape_settled(c)?;
    let worst = worst_model_bad_rate(&catalog, &before, &after);
    let delta = |name: &str| m(&after.sched, name) - m(&before.sched, name);
    let online = delta("symphony_gpu_online_ns_total");
    let busy = if online > 0.0 { (delta("symphony_planned_busy_ns_total") / online).min(1.0) } else { 0.0 };
    let batches = delta("symphony_batch_size_count");
    let accounted = after.fronts.iter().all(|f| balanced(f));
    let bad_rate = if r.sent > 0 { 1.0 - r.ok as f64 / r.sent as f64 } else { 0.0 };
    let gpus = m(&after.sched, "symphony_gpus_online") as u32;
    let (stage_mean_us, executed_mean_us) = stage_means(models, &before.fronts, &after.fronts);
    let advice = scheduler::sim::AutoscaleAdvice::new(gpus, bad_rate, 1.0 - busy, 0.01);
    Ok(E2eRun {
        offered_rps: rate,
        sent: r.sent,
        ok: r.ok,
        goodput_rps: r.goodput_rps(),
        bad_rate,
        worst_model_bad_rate: worst,
        median_batch: median_batch(&before.sched, &after.sched),
        mean_batch: if batches > 0.0 { delta("symphony_batch_size_sum") / batches } else { 0.0 },
        gpu_busy_fraction: busy,
        latency_ok_ms: r.latency_ms,
        wrong_client: r.wrong_id,
        wrong_output: r.wrong_output,
        late: r.late,
        unavailable: r.unavailable,
        server_errors: r.server_errors,
        accounted,
        advice_add_gpus: advice.add_gpus,
        advice_remove_gpus: advice.remove_gpus,
        scheduler_deadline_drops: [DropReason::DeadlineUnmeetable, DropReason::EarlyDrop]
            .iter()
            .map(|r| delta(&format!("symphony_tasks_dropped_total{{reason=\"{}\"}}", r.as_str())))
            .sum(),
        frontend_dropped: sum_delta(&after.fronts, &before.fronts, "symphony_requests_dropped_total"),
        frontend_failed: sum_delta(&after.fronts, &before.fronts, "symphony_requests_failed_total"),
        backend_late_starts: sum_delta(&after.backs, &before.backs, "symphony_backend_late_starts_total"),
        backend_batches: sum_delta(&after.backs, &before.backs, "symphony_backend_batches_executed_total"),
        batch_sizes: batch_sizes(&before.sched, &after.sched),
        stage_mean_us,
        executed_mean_us,
        backend_reads_posted: sum_delta(&after.backs, &before.backs, "symphony_backend_reads_posted_total"),
        backend_read_failures: sum_delta(&after.backs, &before.backs, "symphony_backend_read_failures_total"),
        priority_classes: match priority_mix {
            None => Vec::new(),
            Some(_) => priority_classes(models, &r, &before, &after),
        },
    })
}

/// Whether a frontend's metrics `text` account for every accepted request
/// (succeeded, dropped or failed).
fn balanced(text: &str) -> bool {
    m(text, "symphony_requests_accepted_total")
        == m(text, "symphony_requests_succeeded_total") + m(text, "symphony_requests_dropped_total") + m(text, "symphony_requests_failed_total")
}

/// The cluster's metrics once the last outcomes landed in the daemons'
/// counters (every frontend balanced), or after 5 s.
fn scrape_settled(c: &LocalCluster) -> Result<Scrape, UpError> {
    let quiet_by = StdInstant::now() + StdDuration::from_secs(5);
    loop {
        let s = scrape(c)?;
        if s.fronts.iter().all(|f| balanced(f)) || StdInstant::now() >= quiet_by {
            return Ok(s);
        }
        std::thread::sleep(StdDuration::from_millis(20));
    }
}

/// The largest share of failed inferences of one model between the scrapes.
fn worst_model_bad_rate(catalog: &ModelCatalog, before: &Scrape, after: &Scrape) -> f64 {
    let mut worst: f64 = 0.0;
    for e in catalog.entries() {
        let ok_name = format!("nv_inference_request_success{{model=\"{}\",version=\"1\"}}", e.spec.name);
        let fail_name = format!("nv_inference_request_failure{{model=\"{}\",version=\"1\"}}", e.spec.name);
        let d = |name: &str| -> f64 { after.fronts.iter().zip(&before.fronts).map(|(a, b)| m(a, name) - m(b, name)).sum() };
        let (ok, fail) = (d(&ok_name), d(&fail_name));
        if ok + fail > 0.0 {
            worst = worst.max(fail / (ok + fail));
        }
    }
    worst
}

/// Each priority class's outcomes at the client and in the daemons.
fn priority_classes(models: &[ModelSpec], r: &LoadReport, before: &Scrape, after: &Scrape) -> Vec<PriorityClass> {
    (1u32..)
        .zip(&r.classes)
        .map(|(priority, c)| {
            let (scheduler_dispatched, scheduler_drops, frontend_outcomes, stage_mean_us) = level_view(models, before, after, priority);
            PriorityClass {
                priority,
                sent: c.sent,
                ok: c.ok,
                late: c.late,
                unavailable: c.unavailable,
                other: c.other,
                bad_rate: c.bad_rate(),
                scheduler_dispatched,
                scheduler_drops,
                frontend_outcomes,
                stage_mean_us,
            }
        })
        .collect()
}

fn advice_text(add: f64, remove: f64) -> String {
    if add > 0.0 {
        format!("add {add:.1}")
    } else {
        format!("remove {remove:.1}")
    }
}

/// Runs `body` with the daemons' log directory of `spec`: stale log
/// directories of dead `up`/`e2e` processes are removed first, and this
/// run's own is removed when the run succeeds (kept, and named, when it
/// fails), so nothing is left in the temporary directory.
pub(crate) fn with_logs<T>(spec: &ClusterSpec, body: impl FnOnce() -> Result<T, UpError>) -> Result<T, UpError> {
    dataplane::mem::sweep_stale_files(&std::env::temp_dir(), &[LOG_DIR_PREFIX]);
    let r = body();
    if let Some(dir) = &spec.log_dir {
        match &r {
            Ok(_) => {
                let _ = std::fs::remove_dir_all(dir);
            }
            Err(_) if dir.exists() => warn!(dir = %dir.display(), "the daemons' logs are kept"),
            Err(_) => {}
        }
    }
    r
}

/// Log directories are `<tmp>/symphony-up-<pid>`.
const LOG_DIR_PREFIX: &str = "symphony-up-";

pub fn run(a: &UpArgs) -> Result<(), UpError> {
    shell::logging::init(&a.cluster.log);
    if let Some(repo) = &a.cluster.model_repository {
        if !a.cluster.extra.is_empty() {
            return Err(UpError::Usage("--model-repository serves the repository's models: no --model".into()));
        }
        let mut cluster = a.cluster.clone();
        cluster.extra = repository_models(repo)?;
        let real = UpArgs { models: "none".into(), cluster, load: a.load, rate: a.rate, duration_s: a.duration_s, serve: true, plot: a.plot.clone(), json: a.json };
        return start_and_run(&real);
    }
    start_and_run(a)
}

fn start_and_run(a: &UpArgs) -> Result<(), UpError> {
    let spec = spec(&a.models, &a.cluster)?;
    with_logs(&spec, || run_with(a, spec.clone()))
}

/// Checks the options `clap` could not (before any child starts).
fn check(a: &UpArgs) -> Result<Vec<ModelSpec>, UpError> {
    let models = scheduler::zoo::cluster_models(&a.cluster.zoo, &a.models, &a.cluster.extra)?;
    if a.cluster.frontends == 0 || a.cluster.backends == 0 || a.cluster.gpus_per_backend == 0 {
        return Err(UpError::Usage("need at least one frontend, one backend and one GPU per backend".into()));
    }
    if !(a.duration_s.is_finite() && a.duration_s > 0.0 && a.duration_s <= 3600.0) {
        return Err(UpError::Usage("--duration-s must be in (0, 3600]".into()));
    }
    if !(a.load.is_finite() && a.load > 0.0 && a.load <= 4.0) {
        return Err(UpError::Usage("--load must be in (0, 4] (a fraction of the simulated goodput)".into()));
    }
    if a.cluster.tls_cert.is_some() && !a.serve {
        return Err(UpError::Usage("--tls-cert/--tls-key need --serve (the built-in load generator speaks plain HTTP)".into()));
    }
    Ok(models)
}

/// What runs the batches, for the start banner: a repository's models run
/// for real (the GPU graph engine when every model is `KIND_GPU`,
/// otherwise onnxruntime, `exec::onnx`); without one, GPUs are emulated.
fn executors_banner(a: &UpArgs) -> &'static str {
    if a.cluster.model_repository.is_some() {
        "the repository's models (all KIND_GPU: the GPU graph engine; otherwise onnxruntime)"
    } else {
        "emulated GPUs"
    }
}

fn run_with(a: &UpArgs, mut spec: ClusterSpec) -> Result<(), UpError> {
    let models = check(a)?;
    control::install_stop_signals()?;
    let gpus = a.cluster.backends * a.cluster.gpus_per_backend;
    if a.serve {
        // Outside clients measure their own latency; answer a late result
        // rather than turning it into an error (`spec` puts `--grace-ms 0`
        // first; the model-repository flags after it stay).
        spec.frontend_flags.drain(0..2);
    }
    info!(
        frontends = a.cluster.frontends,
        backends = a.cluster.backends,
        gpus_per_backend = a.cluster.gpus_per_backend,
        transport = %a.cluster.transport.name(),
        models = models.len(),
        zoo = %a.cluster.zoo,
        logs = %spec.log_dir.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
        executors = executors_banner(a),
        "starting a local cluster"
    );
    let cluster = LocalCluster::start(&spec).map_err(run_err)?;
    if a.serve {
        return serve(cluster, &spec);
    }
    info!(gpus, "finding the simulated (scheduler-only) goodput");
    let s_goodput = sim_goodput(&models, gpus, a.cluster.seed)?;
    let rate = a.rate.unwrap_or(s_goodput * a.load);
    info!(rate_rps = rate, duration_s = a.duration_s, simulated_goodput_rps = s_goodput, "offering load over HTTP");
    let run = run_load(&cluster, &models, rate, a.duration_s, a.cluster.seed, a.cluster.priority_mix);
    let stopped = cluster.stop().map_err(run_err);
    let e = run?;
    stopped?;
    let mut sched = build(&models, gpus, &PolicyConfig::new(PolicyKind::Deferred)).map_err(run_err)?;
    let sim: SimReport = simulate(&sim_config(&models, gpus, rate, a.duration_s, a.cluster.seed), sched.as_mut()).map_err(run_err)?;
    write_figures(a, &e, &sim)?;
    if a.json {
        let v = serde_json::json!({ "simulated_goodput_rps": s_goodput, "e2e": e, "simulated": sim });
        println!("{}", serde_json::to_string_pretty(&v).map_err(run_err)?);
        return Ok(());
    }
    print_report(a, models.len(), rate, s_goodput, &e, &sim);
    if e.wrong_client > 0 || e.wrong_output > 0 || !e.accounted {
        return Err(UpError::Check);
    }
    Ok(())
}

/// `up --serve`: prints every address a client or tool needs, one per
/// line (`<what>: <url>`, for people and scripts), and where the join
/// token is (never the token itself); serves until Ctrl-C.
fn serve(mut cluster: LocalCluster, spec: &ClusterSpec) -> Result<(), UpError> {
    let token_file = write_join_token(&cluster, spec)?;
    let addr = |d: &tools::cluster::Daemon, key| d.addr(key).map_err(run_err);
    let scheme = if spec.frontend_flags.iter().any(|f| f == "--tls-cert") { "https" } else { "http" };
    for (i, f) in cluster.frontends.iter().enumerate() {
        println!("frontend {}: {scheme}://{}", i + 1, addr(f, "http")?);
    }
    for (i, f) in cluster.frontends.iter().enumerate() {
        println!("frontend {} grpc: {}", i + 1, addr(f, "grpc")?);
    }
    for (i, f) in cluster.frontends.iter().enumerate() {
        println!("frontend {} metrics: http://{}/metrics", i + 1, addr(f, "metrics")?);
    }
    for (i, b) in cluster.backends.iter().enumerate() {
        println!("backend {} metrics: http://{}/metrics", i + 1, addr(b, "metrics")?);
    }
    println!("scheduler metrics: http://{}/metrics", addr(&cluster.scheduler, "metrics")?);
    println!("scheduler control: {}", cluster.scheduler.ready.get("control").map_or("", String::as_str));
    println!("join token: {}", token_file.display());
    println!("(KServe v2 on each frontend, HTTP and gRPC: /v2/health/ready, /v2/models/<name>/infer, /v2/models/<name>/stats; terms: docs/glossary.md)");
    println!("serving; Ctrl-C stops every process");
    use std::io::Write;
    let _ = std::io::stdout().flush();
    while !control::stop_requested() {
        for d in cluster.frontends.iter_mut().chain(cluster.backends.iter_mut()) {
            if let Some(s) = d.try_exit() {
                return Err(run_err(format!("{} exited ({s})", d.name)));
            }
        }
        // The frontends and backends outlive their scheduler (they hold
        // their work and reconnect): a scheduler that dies is restarted on
        // the same control address, where they find it again.
        if let Some(s) = cluster.scheduler.try_exit() {
            warn!("the scheduler exited ({s}); restarting it on the same control address");
            cluster.restart_scheduler(spec).map_err(run_err)?;
            println!("scheduler restarted; metrics: http://{}/metrics", addr(&cluster.scheduler, "metrics")?);
        }
        std::thread::sleep(StdDuration::from_millis(50));
    }
    info!("stopping");
    cluster.stop().map_err(run_err)
}

/// Writes the cluster's join token, readable by this user only, into the
/// run's directory (removed with it), for a daemon started by hand to
/// join with `--join-token-file`.
fn write_join_token(cluster: &LocalCluster, spec: &ClusterSpec) -> Result<PathBuf, UpError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = spec.log_dir.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&dir).map_err(write_err(&dir))?;
    let path = dir.join("join-token");
    let text = cluster.join_token.as_text().ok_or_else(|| run_err("the join token is not text"))?;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(write_err(&path))?;
    Ok(path)
}

/// The batch-size and latency figures (in --plot, by default ./symphony-up:
/// the logs' temporary directory is removed when the run ends).
fn write_figures(a: &UpArgs, e: &E2eRun, sim: &SimReport) -> Result<(), UpError> {
    let dir = a.plot.clone().unwrap_or_else(|| PathBuf::from("symphony-up"));
    std::fs::create_dir_all(&dir).map_err(write_err(&dir))?;
    let fraction = |v: Vec<(f64, f64)>| {
        let total: f64 = v.iter().map(|p| p.1 * p.0).sum::<f64>().max(1.0);
        v.into_iter().map(|(b, c)| (b, b * c / total)).collect::<Vec<_>>()
    };
    let e2e_sizes = fraction(e.batch_sizes.iter().map(|&(b, c)| (f64::from(b), c)).collect());
    let sim_sizes = fraction(sim.batch_size_histogram.iter().map(|b| (b[0] as f64, b[1] as f64 / b[0].max(1) as f64)).collect());
    let path = dir.join("up_batch_sizes.svg");
    let series = [
        plot::Series { label: "end-to-end".into(), points: e2e_sizes },
        plot::Series { label: "simulated".into(), points: sim_sizes },
    ];
    std::fs::write(&path, plot::lines("Requests by the size of the batch they ran in", "batch size", "fraction of requests", &series)).map_err(write_err(&path))?;
    let lat = [e.latency_ok_ms[0], e.latency_ok_ms[1], e.latency_ok_ms[2], e.latency_ok_ms[3]];
    let data: Vec<(f64, f64)> = [50.0, 90.0, 99.0, 99.9].iter().zip(lat).map(|(p, v)| (*p, v)).collect();
    let path2 = dir.join("up_latency.svg");
    std::fs::write(&path2, plot::lines("End-to-end latency of successful requests", "percentile", "ms", &[plot::Series { label: "end-to-end".into(), points: data }]))
        .map_err(write_err(&path2))?;
    info!(batch_sizes = %path.display(), latency = %path2.display(), "figures written");
    Ok(())
}

/// The end-to-end run next to the simulated one, on stdout.
fn print_report(a: &UpArgs, models: usize, rate: f64, s_goodput: f64, e: &E2eRun, sim: &SimReport) {
    println!("local cluster: scheduler + {} frontends + {} backends x {} emulated GPUs ({}), {} models, {} s", a.cluster.frontends, a.cluster.backends, a.cluster.gpus_per_backend, a.cluster.transport.name(), models, a.duration_s);
    println!("{:<26} {:>14} {:>14}", "", "end-to-end", "simulated");
    println!("{:<26} {:>14.0} {:>14.0}", "requested load (rps)", rate, rate);
    println!("{:<26} {:>14.0} {:>14.0}", "offered load (rps)", e.offered_rps, sim.measured_offered_rps);
    println!("{:<26} {:>14.0} {:>14.0}", "goodput (rps)", e.goodput_rps, sim.good_rps);
    println!("{:<26} {:>13.3}% {:>13.3}%", "bad rate", e.bad_rate * 100.0, sim.bad_rate * 100.0);
    println!("{:<26} {:>14} {:>14}", "median batch", e.median_batch, sim.median_batch);
    println!("{:<26} {:>13.1}% {:>13.1}%", "GPU idle fraction", (1.0 - e.gpu_busy_fraction) * 100.0, sim.gpu_idle_fraction * 100.0);
    println!("{:<26} {:>14} {:>14}", "autoscaling advice", advice_text(e.advice_add_gpus, e.advice_remove_gpus), advice_text(sim.autoscale.add_gpus, sim.autoscale.remove_gpus));
    println!(
        "latency of successes (ms): p50 {:.1} p99 {:.1} p99.9 {:.1}; wrong client {}, wrong output {}; every request accounted for: {}",
        e.latency_ok_ms[0], e.latency_ok_ms[2], e.latency_ok_ms[3], e.wrong_client, e.wrong_output, e.accounted
    );
    println!(
        "bad requests: {:.0} dropped by the scheduler at their deadline, {:.0} dropped in all, {:.0} failed at the frontends (late or lost), {} answered after the SLO as the client saw it; {:.0} of {:.0} batches started late",
        e.scheduler_deadline_drops, e.frontend_dropped, e.frontend_failed, e.late, e.backend_late_starts, e.backend_batches
    );
    for c in &e.priority_classes {
        println!(
            "priority {} ({}): {} sent, {} ok, {} late, {} 503, {} other: bad rate {:.3}%",
            c.priority,
            if c.priority == 1 { "high" } else { "low" },
            c.sent,
            c.ok,
            c.late,
            c.unavailable,
            c.other,
            c.bad_rate * 100.0
        );
        let pairs = |v: &[(String, f64)]| v.iter().map(|(k, n)| format!("{k} {n:.0}")).collect::<Vec<_>>().join(", ");
        println!(
            "  scheduler: {:.0} dispatched, dropped: [{}]; frontends: [{}]; per-stage mean (us): {}",
            c.scheduler_dispatched,
            pairs(&c.scheduler_drops),
            pairs(&c.frontend_outcomes),
            pairs(&c.stage_mean_us)
        );
    }
    println!("{}", stage_line(e));
    println!("scheduler-only goodput of this cluster (simulated): {s_goodput:.0} rps");
}

/// `symphony e2e` options.
pub struct E2eArgs {
    pub models: String,
    pub cluster: ClusterOpts,
    pub run_s: f64,
    pub steps: u32,
    pub trials: u32,
    pub json: bool,
}

/// CPU seconds (user + system) a process has used, from /proc.
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0.0 };
    // Fields after the command name (which may contain spaces) start after ')'.
    let rest = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the full line: 12 and 13 here.
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (ticks(11) + ticks(12)) / hz.max(1.0)
}

/// One run of `rate` rps on a fresh cluster: the measurement, whether it
/// passes (client and every model at most 1% bad), a line on stderr and a
/// JSON record in `runs`.
fn e2e_trial(spec: &ClusterSpec, models: &[ModelSpec], rate: f64, secs: f64, seed: u64, runs: &mut Vec<serde_json::Value>) -> Result<(E2eRun, bool), UpError> {
    let cluster = LocalCluster::start(spec).map_err(run_err)?;
    let pids: Vec<(String, u32)> = std::iter::once(&cluster.scheduler)
        .chain(&cluster.frontends)
        .chain(&cluster.backends)
        .map(|d| (d.name.clone(), d.pid()))
        .collect();
    let cpu0: Vec<f64> = pids.iter().map(|(_, p)| cpu_seconds(*p)).collect();
    let me0 = cpu_seconds(std::process::id());
    let r = run_load(&cluster, models, rate, secs, seed, None)?;
    let cpu: Vec<f64> = pids.iter().zip(&cpu0).map(|((_, p), c0)| (cpu_seconds(*p) - c0) / secs).collect();
    let me = (cpu_seconds(std::process::id()) - me0) / secs;
    cluster.stop().map_err(run_err)?;
    let pass = r.bad_rate <= 0.01 && r.worst_model_bad_rate <= 0.01;
    info!(
        rate_rps = rate,
        goodput_rps = r.goodput_rps,
        bad_rate = r.bad_rate,
        worst_model_bad_rate = r.worst_model_bad_rate,
        scheduler_deadline_drops = r.scheduler_deadline_drops,
        frontend_failed = r.frontend_failed,
        late_at_client = r.late,
        late_batches = r.backend_late_starts,
        batches = r.backend_batches,
        median_batch = r.median_batch,
        gpu_busy_fraction = r.gpu_busy_fraction,
        p99_ms = r.latency_ok_ms[2],
        pass,
        cpu_cores_loadgen = me,
        cpu_cores = %pids.iter().zip(&cpu).map(|((n, _), c)| format!("{n} {c:.2}")).collect::<Vec<_>>().join(", "),
        "trial"
    );
    runs.push(serde_json::json!({
        "rate": rate, "seed": seed, "run": r, "pass": pass, "cpu_cores_loadgen": me,
        "cpu_cores": pids.iter().zip(&cpu).map(|((n, _), c)| (n.clone(), *c)).collect::<std::collections::BTreeMap<_, _>>(),
    }));
    Ok((r, pass))
}

/// The end-to-end goodput search: the highest offered rate at which the
/// real daemons keep the client's bad rate and every model's bad rate at
/// or under 1%, next to the simulated scheduler-only goodput of the same
/// workload and cluster.
pub fn e2e(a: &E2eArgs) -> Result<(), UpError> {
    shell::logging::init(&a.cluster.log);
    if a.cluster.model_repository.is_some() {
        return Err(UpError::Usage("symphony e2e drives the emulated zoo models; --model-repository is for symphony up".into()));
    }
    if a.cluster.tls_cert.is_some() {
        return Err(UpError::Usage("symphony e2e's load generator speaks plain HTTP; --tls-cert is for symphony up --serve".into()));
    }
    let models = scheduler::zoo::cluster_models(&a.cluster.zoo, &a.models, &a.cluster.extra)?;
    let gpus = a.cluster.backends * a.cluster.gpus_per_backend;
    info!(models = %a.models, gpus, "symphony e2e: finding the simulated goodput");
    let s = sim_goodput(&models, gpus, a.cluster.seed)?;
    let spec = spec(&a.models, &a.cluster)?;
    with_logs(&spec, || e2e_with(a, &spec, &models, s))
}

fn e2e_with(a: &E2eArgs, spec: &ClusterSpec, models: &[ModelSpec], s: f64) -> Result<(), UpError> {
    // Bisection between a passing and a failing rate, starting around s.
    let (mut lo, mut hi) = (0.0f64, s * 1.1);
    let mut best: Option<E2eRun> = None;
    let mut runs = Vec::new();
    let mut rate = s;
    for step in 0..a.steps.max(1) {
        // Each rate is tried `trials` times, each on a fresh cluster (a run
        // must not inherit the backlog or connection pools of the one
        // before); the rate passes when the median trial does. One trial's
        // verdict swings on a single burst of OS preemption on 2 shared cores.
        let mut verdicts = Vec::new();
        for trial in 0..a.trials.max(1) {
            let seed = a.cluster.seed + u64::from(step) * 100 + u64::from(trial);
            let (r, pass) = e2e_trial(spec, models, rate, a.run_s, seed, &mut runs)?;
            verdicts.push((pass, r));
        }
        let passes = verdicts.iter().filter(|v| v.0).count();
        let pass = passes * 2 > verdicts.len();
        info!(rate_rps = rate, passes, trials = verdicts.len(), pass, "rate tried");
        if pass {
            lo = rate;
            best = verdicts.into_iter().find(|v| v.0).map(|v| v.1);
        } else {
            hi = rate;
        }
        rate = if hi.is_finite() { (lo + hi) / 2.0 } else { rate * 1.2 };
    }
    let e = best.as_ref().map(|b| b.offered_rps).unwrap_or(0.0);
    // The daemons and the load generator are separate processes, none pinned.
    let machine = dataplane::machine::facts(
        ["scheduler daemon", "frontend daemons", "backend daemons", "HTTP load generator"].into_iter().map(dataplane::machine::Placement::unpinned).collect(),
    );
    if a.json {
        let machine: serde_json::Value = serde_json::from_str(&machine.to_json()).map_err(run_err)?;
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({"simulated_goodput_rps": s, "e2e_goodput_rps": e, "ratio": e / s, "runs": runs, "machine": machine})).map_err(run_err)?);
    } else {
        println!("{}", machine.text());
        println!(
            "{} ({} zoo), {} frontends, {} backends x {} GPUs over {}: end-to-end goodput {e:.0} rps, scheduler-only (simulated) {s:.0} rps, e/s = {:.3}",
            a.models, a.cluster.zoo, a.cluster.frontends, a.cluster.backends, a.cluster.gpus_per_backend, a.cluster.transport.name(), e / s
        );
        if let Some(b) = &best {
            println!("at {e:.0} rps, {}", stage_line(b));
        }
    }
    Ok(())
}
