//! `symphony up --autoscale`: the local cluster under a load whose rate
//! follows `--schedule` (fractions of the peak rate over time), with the
//! autoscale controller ([`tools::autoscale`]) adding backend processes
//! and draining them (SIGTERM, their graceful leave) as the load changes.
//!
//! The peak rate is `--rate`, or `--autoscale-peak-load` (0.6) times the simulated
//! (scheduler-only) goodput of the peak-sized cluster:
//! `--autoscale-max-backends` backends. The run starts with `--backends`
//! backends (within the bounds); the controller reads the scheduler's
//! signals every `--autoscale-interval-ms`.
//!
//! The report: GPUs over time (each controller tick), GPU-seconds used
//! (a backend's GPUs count from its start to its exit, draining
//! included, within the load's window) against the peak-sized cluster's
//! over the same window, the bad rate (1 − ok/sent as the client saw it)
//! per schedule phase and over the run, `lost` (requests the client got
//! no classified answer for) and `unaccounted` (requests a frontend
//! accepted and never settled), and the fewest and most backends.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration as StdDuration;

use dataplane::time::{Instant, MonotonicClock};
use frontend::loadgen::{LoadReport, BIN};
use scheduler::sim::RateSchedule;
use scheduler::zoo::ModelSpec;
use serde::Serialize;
use tools::autoscale::local::{LocalBackends, MemberChange};
use tools::autoscale::{Controller, ControllerFlags, SchedulerMetrics, Tick};
use tools::cluster::LocalCluster;
use tracing::info;

use crate::up::{run_err, sim_goodput, spec, with_logs, ClusterOpts, UpError};

/// The options of `up --autoscale`.
#[derive(clap::Args, Clone, Debug)]
pub struct AutoscaleOpts {
    /// Autoscale the backends under a changing load (see --schedule): the
    /// controller starts backend processes and drains them by SIGTERM.
    #[arg(long)]
    pub autoscale: bool,
    /// The load's rate over time with --autoscale, as SECONDS:FRACTION,...
    /// of the peak rate (e.g. 0:0.2,20:1.0,40:0.3; none: the peak rate).
    #[arg(long)]
    pub schedule: Option<String>,
    /// The controller's flags (with --autoscale).
    #[command(flatten)]
    pub controller: ControllerFlags,
    /// With --autoscale: the peak rate as a fraction of the simulated
    /// goodput of the peak-sized cluster (instead of --load; --rate wins).
    #[arg(long = "autoscale-peak-load", default_value_t = 0.6)]
    pub peak_load: f64,
}

/// One controller tick, for the report.
#[derive(Clone, Debug, Serialize)]
pub struct TickRow {
    /// Seconds into the load.
    pub t_s: f64,
    /// Backends serving, joining, draining when it decided.
    pub serving: usize,
    pub joining: usize,
    pub draining: usize,
    /// The interval's signals.
    pub bad_rate: f64,
    pub idle_fraction: f64,
    /// The scheduler's demand gauge, GPUs (the target's signal; None
    /// before its first interval).
    pub demand_gpus: Option<f64>,
    /// GPUs added, and drained.
    pub added: u32,
    pub drained: usize,
}

/// One phase of the schedule.
#[derive(Clone, Debug, Serialize)]
pub struct Phase {
    pub from_s: f64,
    pub to_s: f64,
    /// Fraction of the peak rate.
    pub fraction: f64,
    pub sent: u64,
    pub ok: u64,
    pub bad_rate: f64,
}

/// What `up --autoscale` measured.
#[derive(Clone, Debug, Serialize)]
pub struct AutoscaleRun {
    pub peak_rate_rps: f64,
    pub duration_s: f64,
    pub gpus_per_backend: u32,
    pub backends_min: usize,
    pub backends_max: usize,
    pub gpu_seconds: f64,
    pub peak_gpu_seconds: f64,
    /// `gpu_seconds / peak_gpu_seconds`.
    pub gpu_seconds_share: f64,
    pub sent: u64,
    pub ok: u64,
    pub bad_rate: f64,
    pub phases: Vec<Phase>,
    /// Requests the client got no classified answer for.
    pub lost: u64,
    /// Requests the frontends accepted and never settled.
    pub unaccounted: f64,
    pub backends_added: usize,
    pub backends_drained: usize,
    /// Drained backends that did not exit 0, and backends that died.
    pub unclean_exits: usize,
    /// Each added backend's process start to registration, ms.
    pub register_ms: Vec<f64>,
    pub ticks: Vec<TickRow>,
    /// The load generator's report.
    pub load: String,
}

/// Checks the options, starts the cluster, runs the load with the
/// controller, prints the report.
pub fn run(models: &str, cluster: &ClusterOpts, o: &AutoscaleOpts, rate: Option<f64>, duration_s: f64, json: bool) -> Result<(), UpError> {
    node_shell::logging::init(&cluster.log);
    let specs = scheduler::zoo::cluster_models(&cluster.zoo, models, &cluster.extra)?;
    let schedule = match &o.schedule {
        Some(s) => RateSchedule::parse(s).map_err(|e| UpError::Usage(format!("--schedule: {e}")))?,
        None => RateSchedule::default(),
    };
    let c = &o.controller;
    c.config(1).map_err(UpError::Usage)?;
    if c.max_backends > 64 {
        return Err(UpError::Usage("--autoscale wants --autoscale-max-backends <= 64 (local processes)".into()));
    }
    if !(duration_s.is_finite() && duration_s > 0.0 && duration_s <= 3600.0) {
        return Err(UpError::Usage("--duration-s must be in (0, 3600]".into()));
    }
    let mut opts = cluster.clone();
    opts.backends = cluster.backends.clamp(c.min_backends, c.max_backends);
    let s = spec(models, &opts)?;
    let peak_gpus = c.max_backends * opts.gpus_per_backend;
    let peak_rate = match rate {
        Some(r) => r,
        None => o.peak_load * sim_goodput(&specs, peak_gpus, opts.seed)?,
    };
    let r = with_logs(&s, || run_cluster(&s, &specs, o, schedule, peak_rate, duration_s, opts.seed))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r).map_err(run_err)?);
    } else {
        print_report(&r);
    }
    if r.lost > 0 || r.unaccounted != 0.0 {
        return Err(UpError::Check);
    }
    Ok(())
}

fn run_cluster(
    s: &tools::cluster::ClusterSpec,
    specs: &[ModelSpec],
    o: &AutoscaleOpts,
    schedule: RateSchedule,
    peak_rate: f64,
    duration_s: f64,
    seed: u64,
) -> Result<AutoscaleRun, UpError> {
    let mut cluster = LocalCluster::start(s).map_err(run_err)?;
    let control = cluster.scheduler_addrs.join(",");
    let running = std::mem::take(&mut cluster.backends);
    let provider = LocalBackends::new(s, &control, &cluster.join_token, running, o.controller.max_backends);
    let sources = cluster.schedulers().map(|d| d.addr("metrics")).collect::<Result<Vec<_>, _>>().map_err(run_err)?;
    let cfg = o.controller.config(s.gpus_per_backend).map_err(UpError::Usage)?;
    let mut controller = Controller::new(cfg, provider, SchedulerMetrics::new(sources));
    let mut load_cfg = tools::cluster::load_config(specs, cluster.http_addrs().map_err(run_err)?, peak_rate, duration_s, seed);
    load_cfg.workload.schedule = schedule.clone();
    info!(peak_rate_rps = peak_rate, duration_s, schedule = ?schedule.steps, "offering the scheduled load; autoscaling");
    let done = AtomicBool::new(false);
    let clock = MonotonicClock::new();
    let mut ticks: Vec<(Tick, (usize, usize, usize))> = Vec::new();
    let load = std::thread::scope(|scope| {
        let h = scope.spawn(|| {
            let r = tools::cluster::run_load(load_cfg);
            done.store(true, Ordering::Release);
            r
        });
        let stop = || done.load(Ordering::Acquire);
        let mut on_tick = |t: &Tick, p: &LocalBackends| ticks.push((t.clone(), p.phases()));
        controller.run(&clock, &stop, &mut on_tick);
        h.join()
    });
    let end = clock.now();
    let load = load.map_err(|_| UpError::Usage("the load generator panicked".into()))?.map_err(run_err)?;
    let mut provider = controller.into_provider();
    // Backends still draining finish (bounded) before the accounting.
    provider.wait_drained(StdDuration::from_secs(30), &|| clock.now());
    let unaccounted = settled_unaccounted(&cluster);
    let summary = summarise(&provider, &ticks, end, s.gpus_per_backend, o.controller.max_backends, &load, &schedule, peak_rate, duration_s);
    let (live, exited) = provider.into_daemons();
    cluster.backends = live;
    cluster.backends.extend(exited);
    cluster.stop().map_err(run_err)?;
    Ok(AutoscaleRun { unaccounted, ..summary })
}

/// Requests the frontends accepted and did not settle, once settled
/// (every frontend balanced) or after 10 s.
fn settled_unaccounted(c: &LocalCluster) -> f64 {
    let until = std::time::Instant::now() + StdDuration::from_secs(10);
    loop {
        let open: f64 = c.frontend_outcomes().iter().map(|[a, s, d, f]| a - s - d - f).sum();
        if open == 0.0 || std::time::Instant::now() >= until {
            return open;
        }
        std::thread::sleep(StdDuration::from_millis(50));
    }
}

/// GPU-seconds of the backends within `[0, end]` of the controller's
/// clock: each from its start (0 for those up before) to its exit.
fn gpu_seconds(p: &LocalBackends, end: Instant, gpus_per_backend: u32) -> f64 {
    let mut started: Vec<(u32, Instant)> = Vec::new();
    let mut total = 0.0;
    let mut initial: Vec<u32> = Vec::new();
    for e in p.events() {
        match e.what {
            MemberChange::Started { .. } => started.push((e.backend, e.at)),
            MemberChange::Exited { .. } => {
                let from = match started.iter().position(|&(b, _)| b == e.backend) {
                    Some(i) => started.swap_remove(i).1,
                    None => {
                        initial.push(e.backend);
                        Instant::ZERO
                    }
                };
                total += e.at.min(end).saturating_since(from).as_secs_f64();
            }
            _ => {}
        }
    }
    // Still running at the end: those started, and the initial ones that
    // never exited.
    total += started.iter().map(|&(_, at)| end.saturating_since(at).as_secs_f64()).sum::<f64>();
    let initial_running = p.initial_backends().iter().filter(|b| !initial.contains(b)).count();
    total += initial_running as f64 * secs(end);
    total * f64::from(gpus_per_backend)
}

#[allow(clippy::too_many_arguments)]
fn summarise(
    p: &LocalBackends,
    ticks: &[(Tick, (usize, usize, usize))],
    end: Instant,
    gpus_per_backend: u32,
    max_backends: u32,
    load: &LoadReport,
    schedule: &RateSchedule,
    peak_rate: f64,
    duration_s: f64,
) -> AutoscaleRun {
    let rows: Vec<TickRow> = ticks
        .iter()
        .map(|(t, (joining, serving, draining))| TickRow {
            t_s: secs(t.at),
            serving: *serving,
            joining: *joining,
            draining: *draining,
            bad_rate: t.interval.signals.bad_rate,
            idle_fraction: t.interval.signals.idle_fraction,
            demand_gpus: t.interval.signals.demand_gpus,
            added: t.decision.add,
            drained: t.decision.drain.len(),
        })
        .collect();
    let counts = rows.iter().map(|r| r.serving + r.joining + r.draining).chain(std::iter::once(p.initial_backends().len()));
    let (backends_min, backends_max) = counts.fold((usize::MAX, 0), |(lo, hi), n| (lo.min(n), hi.max(n)));
    let gpu_s = gpu_seconds(p, end, gpus_per_backend);
    let peak_gpu_s = f64::from(max_backends * gpus_per_backend) * secs(end);
    let count = |f: &dyn Fn(&MemberChange) -> bool| p.events().iter().filter(|e| f(&e.what)).count();
    AutoscaleRun {
        peak_rate_rps: peak_rate,
        duration_s,
        gpus_per_backend,
        backends_min,
        backends_max,
        gpu_seconds: gpu_s,
        peak_gpu_seconds: peak_gpu_s,
        gpu_seconds_share: if peak_gpu_s > 0.0 { gpu_s / peak_gpu_s } else { 0.0 },
        sent: load.sent,
        ok: load.ok,
        bad_rate: if load.sent > 0 { 1.0 - load.ok as f64 / load.sent as f64 } else { 0.0 },
        phases: phases(load, schedule, duration_s),
        lost: load.sent.saturating_sub(classified(load)),
        unaccounted: 0.0,
        backends_added: count(&|c| matches!(c, MemberChange::Started { .. })),
        backends_drained: count(&|c| matches!(c, MemberChange::Exited { drained: true, clean: true })),
        unclean_exits: count(&|c| matches!(c, MemberChange::Exited { clean: false, .. } | MemberChange::Exited { drained: false, .. })),
        register_ms: p.events().iter().filter_map(|e| if let MemberChange::Started { register_ms } = e.what { Some(register_ms) } else { None }).collect(),
        ticks: rows,
        load: load.to_string(),
    }
}

/// Seconds of the controller's clock.
fn secs(t: Instant) -> f64 {
    t.saturating_since(Instant::ZERO).as_secs_f64()
}

/// Requests with a classified answer.
fn classified(r: &LoadReport) -> u64 {
    r.ok + r.late + r.wrong_output + r.wrong_id + r.unavailable + r.client_errors + r.server_errors + r.transport_errors
}

/// The bad rate of each schedule phase, from the load's 250 ms bins (by
/// intended send time).
fn phases(load: &LoadReport, schedule: &RateSchedule, duration_s: f64) -> Vec<Phase> {
    let mut bounds: Vec<(f64, f64)> = schedule.steps.iter().map(|(t, m)| (t.as_secs_f64(), *m)).filter(|&(t, _)| t < duration_s).collect();
    if bounds.first().is_none_or(|&(t, _)| t > 0.0) {
        bounds.insert(0, (0.0, 1.0));
    }
    let bin_s = BIN.as_secs_f64();
    bounds
        .iter()
        .enumerate()
        .map(|(i, &(from, fraction))| {
            let to = bounds.get(i + 1).map_or(duration_s, |&(t, _)| t);
            let inside = |k: usize| {
                let t = k as f64 * bin_s;
                t >= from - 1e-9 && t < to - 1e-9
            };
            let (sent, ok) = load.bins.iter().enumerate().filter(|&(k, _)| inside(k)).fold((0, 0), |(s, o), (_, b)| (s + b.sent, o + b.ok));
            Phase { from_s: from, to_s: to, fraction, sent, ok, bad_rate: if sent > 0 { 1.0 - ok as f64 / sent as f64 } else { 0.0 } }
        })
        .collect()
}

fn print_report(r: &AutoscaleRun) {
    println!("autoscaled local cluster: peak {:.0} rps for {:.0} s; backends {}..{} ({} GPU each)", r.peak_rate_rps, r.duration_s, r.backends_min, r.backends_max, r.gpus_per_backend);
    println!("{:>7} {:>8} {:>8} {:>9} {:>9} {:>7} {:>7} {:>6} {:>7}", "t (s)", "serving", "joining", "draining", "bad rate", "idle", "demand", "added", "drained");
    for t in &r.ticks {
        let demand = t.demand_gpus.map_or_else(|| "-".to_string(), |d| format!("{d:.2}"));
        println!("{:>7.1} {:>8} {:>8} {:>9} {:>8.2}% {:>6.0}% {:>7} {:>6} {:>7}", t.t_s, t.serving, t.joining, t.draining, t.bad_rate * 100.0, t.idle_fraction * 100.0, demand, t.added, t.drained);
    }
    for p in &r.phases {
        println!("phase {:>5.1}-{:<5.1} s at {:>3.0}% of peak: {} sent, {} ok, bad rate {:.2}%", p.from_s, p.to_s, p.fraction * 100.0, p.sent, p.ok, p.bad_rate * 100.0);
    }
    println!("bad rate over the run: {:.2}% ({} of {} not ok)", r.bad_rate * 100.0, r.sent - r.ok.min(r.sent), r.sent);
    println!("GPU-seconds: {:.1} used, {:.1} for a cluster sized for the peak ({:.0}%)", r.gpu_seconds, r.peak_gpu_seconds, r.gpu_seconds_share * 100.0);
    println!("backends added {}, drained {}, unclean exits {}; lost {}, unaccounted {}", r.backends_added, r.backends_drained, r.unclean_exits, r.lost, r.unaccounted);
    println!("load: {}", r.load);
}
