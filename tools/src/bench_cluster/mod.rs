//! `symphony bench-cluster`: what the scheduler daemon ingests through the
//! real wire protocol. The scheduler runs as a child process (`symphony
//! daemon scheduler`, as `symphony up` starts it: `tools::cluster::spawn`,
//! a fresh join token in its environment); synthetic frontends and
//! backends run in two further child processes (`symphony daemon
//! bench-frontends|bench-backends`, [`frontends`], [`backends`]) that
//! register with the real handshake and speak the real messages over a
//! dataplane transport. Frontends send tasks open loop at the offered
//! rate; backends hold each planned batch on an emulated GPU for its
//! profiled time and report it. The in-process runtime
//! (`symphony bench-scheduler`) then runs the same workload in this
//! process, for the ratio.
//!
//! Lags across processes compare `CLOCK_MONOTONIC` readings, which the
//! processes of one host share: the frontends and the scheduler exchange
//! benchmark-only `BenchStamp` messages for that (the scheduler's
//! `--bench-stamps`); production never compares clocks across processes.

mod backends;
mod frontends;
pub mod layout;
mod peer;
mod reference;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration as StdDuration, Instant as StdInstant};

use clap::Parser as _;
use dataplane::control::{self, metric, TransportKind, WithDomain};
use dataplane::join::JoinToken;
use dataplane::transport::Domain;
use dataplane::wire::DropReason;
use scheduler::daemon::engine::EngineKind;
use tools::cluster::{spawn, ClusterSpec, Daemon};

use backends::BackendsReport;
use frontends::FrontendsReport;
use layout::LayoutPlan;
use reference::Side;
use peer::{LagUs, PeerArgs};

/// Why `symphony bench-cluster` (or one of its peer processes) stopped.
#[derive(Debug, thiserror::Error)]
pub enum BenchClusterError {
    /// A daemon or peer process failed to start or stop.
    #[error(transparent)]
    Cluster(#[from] tools::cluster::ClusterError),
    /// No join token could be made.
    #[error(transparent)]
    Join(#[from] dataplane::join::JoinError),
    /// The in-process comparison run failed.
    #[error(transparent)]
    Bench(#[from] crate::bench::BenchError),
    /// The transport could not be opened.
    #[error(transparent)]
    Control(#[from] dataplane::control::ControlError),
    /// The JSON report cannot be encoded or decoded.
    #[error("report: {0}")]
    Json(#[from] serde_json::Error),
    /// A message could not be encoded.
    #[error(transparent)]
    Wire(#[from] dataplane::wire::WireError),
    /// The `--profile` model does not parse.
    #[error(transparent)]
    Profile(#[from] scheduler::zoo::ZooError),
    /// A step failed because of another error, which it keeps as its
    /// source: what was being done (and by which peer), then the error.
    #[error("{what}: {source}")]
    Caused {
        /// What was being done (e.g. `frontend 3: the scheduler link failed`).
        what: String,
        /// The error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// An option, the peers' protocol or the accounting went wrong (the
    /// message says which).
    #[error("{0}")]
    Peer(String),
}

impl BenchClusterError {
    /// `Caused` by an error while doing `what`.
    pub fn caused<E: std::error::Error + Send + Sync + 'static>(what: impl Into<String>) -> impl FnOnce(E) -> Self {
        let what = what.into();
        move |source| BenchClusterError::Caused { what, source: Box::new(source) }
    }
}

/// `symphony bench-cluster` options.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchClusterArgs {
    /// Transport between the processes: shm or tcp.
    #[arg(long, default_value = "shm", value_parser = shm_or_tcp)]
    pub transport: TransportKind,
    /// Offered tasks/s (required unless --find-max: a capacity test states
    /// its load).
    #[arg(long, required_unless_present = "find_max")]
    pub rate: Option<f64>,
    /// Instead of --rate: a ladder of short runs (doubling from 25k while
    /// the bad rate stays <= 1%), bounded to under 2 minutes.
    #[arg(long = "find-max")]
    pub find_max: bool,
    /// Seconds of load per run (a `max` ladder caps each rung at 2).
    #[arg(long = "duration-s", default_value_t = 10.0)]
    pub duration_s: f64,
    /// Frontend links to the scheduler, all from one synthetic peer
    /// process (links, not frontend processes as `up`'s --frontends).
    #[arg(long = "frontend-links", default_value_t = 64)]
    pub frontends: u32,
    /// Backend links to the scheduler, all from one synthetic peer process.
    #[arg(long = "backend-links", default_value_t = 256)]
    pub backends: u32,
    /// Emulated GPUs in total, spread over the backend links (required
    /// unless --gpus-per-backend: a capacity test states its size).
    #[arg(long, required_unless_present = "gpus_per_backend")]
    pub gpus: Option<u32>,
    /// Emulated GPUs per backend (replaces --gpus).
    #[arg(long = "gpus-per-backend")]
    pub gpus_per_backend: Option<u32>,
    /// Models: this many copies of --profile, as for bench-scheduler.
    #[arg(long = "profile-copies", default_value_t = 20)]
    pub models: u32,
    /// Model profile ALPHA_MS,BETA_MS,SLO_MS, as for bench-scheduler.
    #[arg(long, default_value = "0.1,5,50")]
    pub profile: String,
    /// The scheduler daemon's --idle on this one host: spin, yield, park, wait, park:US.
    #[arg(long = "local-idle", default_value = "wait")]
    pub idle: String,
    /// Frontends send at most this many tasks per message (1: one `Task`
    /// message per task; more: batched `Tasks` messages). Batched by
    /// default, as the production wire is (item 2: frontends
    /// coalesce submissions).
    #[arg(long, default_value_t = 16)]
    pub coalesce: u32,
    /// Longest a task waits for its batch at a frontend, µs (the frontend
    /// daemon's --coalesce-us, which defaults to 0).
    #[arg(long = "frontend-coalesce-us", default_value_t = 50)]
    pub coalesce_us: u64,
    /// The scheduler's --control-delay-us on this one host, µs (as `symphony
    /// up --local-control-delay-us`): a plan that takes longer to reach its
    /// backend starts late.
    #[arg(long = "local-control-delay-us", default_value_t = 200)]
    pub control_delay_us: u32,
    /// The frontends refuse (and count) an arrival they reach more than this
    /// late instead of sending it with its budget spent; 0: send everything.
    #[arg(long = "frontend-max-lag-us", default_value_t = 10_000)]
    pub frontend_max_lag_us: u64,
    /// A frontend link whose oldest message not yet read by the scheduler
    /// has waited longer than this (µs) refuses further tasks, counted as
    /// `frontend_queue_full`, instead of queueing them behind a saturated
    /// scheduler (issue 14: overload is refused, never buffered without
    /// bound); 0: queue up to the transport's buffers. Default: a tenth
    /// of the default SLO (50 ms). Over tcp "read" means sent by the
    /// frontend's kernel: what the scheduler's socket holds unread is not
    /// seen (see `Connection::send_progress`).
    #[arg(long = "frontend-queue-budget-us", default_value_t = 5_000)]
    pub frontend_queue_budget_us: u64,
    /// Every Nth task carries a clock stamp (ingress lag samples).
    #[arg(long = "stamp-every", default_value_t = 16)]
    pub stamp_every: u64,
    /// The scheduler's engines, comma-separated (inline, pinned, auto): each
    /// is run in turn on the same workload and reported side by side; the
    /// top-level figures are the last one's. `auto`: pinned when this host
    /// has a core for each of the runtime's threads and for the two peer
    /// processes, inline otherwise (`EngineKind::auto`).
    #[arg(long = "engines", default_value = "auto", value_delimiter = ',')]
    pub engine: Vec<String>,
    /// The scheduler's ModelThreads (pinned engine).
    #[arg(long = "model-threads", default_value_t = 1)]
    pub model_threads: u32,
    /// The scheduler's --pin-cores (pinned engine): CPU ids or none.
    #[arg(long = "pin-cores", default_value = "none")]
    pub pin_cores: String,
    /// Thread-to-core layout: `none` (as --engines and --pin-cores say; the
    /// peers unpinned) or `auto` (each busy thread — the scheduler's
    /// ModelThreads, RankThread and I/O thread, the frontends' generator,
    /// the backends — on a core of its own when this host has them; replaces
    /// --engines and --pin-cores). The plan is printed.
    #[arg(long, default_value = "none", value_parser = ["none", "auto"])]
    pub layout: String,
    /// Run the backend peer process under `SCHED_FIFO` at this priority
    /// (1-99; 0: the default policy). The backends sleep between plans; on
    /// a host with fewer cores than busy processes (this 2-core VM: the
    /// scheduler and the frontends each keep a core busy at 2 M tasks/s)
    /// the kernel wakes them up to a 4 ms tick late, which is the dispatch
    /// lag's tail. A real-time process that sleeps when idle takes the
    /// core at once and gives it back (docs/benchmarks.md). Needs root or
    /// `CAP_SYS_NICE`; refused with a message otherwise.
    #[arg(long = "backend-rt-priority", default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=99))]
    pub backend_rt_priority: u8,
    /// TLS on every link (--transport tcp only): mutual TLS with a
    /// throwaway CA and certificate made at start, as `up --link-tls`.
    #[arg(long = "link-tls")]
    pub link_tls: bool,
    /// Seed of the arrivals.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

fn shm_or_tcp(s: &str) -> Result<TransportKind, BenchClusterError> {
    match TransportKind::parse(s)? {
        k @ (TransportKind::Shm | TransportKind::Tcp) => Ok(k),
        _ => Err(BenchClusterError::Peer(format!("'{s}': bench-cluster runs over shm or tcp"))),
    }
}

/// One run's figures.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ClusterRun {
    pub offered_rps: f64,
    /// Tasks planned onto a GPU whose batch finished by its earliest
    /// deadline at the backend (starting on the plan's arrival when that is
    /// after its planned start), per second of load.
    pub tasks_per_s: f64,
    /// 1 - good / offered (drops anywhere, batches finished late, tasks never planned).
    pub bad_rate: f64,
    pub offered: u64,
    pub sent: u64,
    pub received: u64,
    /// Tasks the scheduler planned onto a GPU.
    pub planned: u64,
    /// Tasks of plans the backends received.
    pub delivered: u64,
    /// Tasks of batches that finished after their earliest deadline.
    pub late: u64,
    /// Plans that reached their backend after their planned start.
    pub late_plans: u64,
    pub drops: Vec<(String, u64)>,
    pub ingress_lag: LagUs,
    pub dispatch_lag: LagUs,
    /// The dispatch lag's first part: planned dispatch moment -> plan
    /// encoded at the scheduler.
    pub decision_lag: LagUs,
    /// Planned dispatch moment -> plan handed to the backend's link (the
    /// dispatch lag less transit and the backend's wake-up).
    pub send_lag: LagUs,
    /// The frontends' own lag (intended arrival -> sent): above a few µs the
    /// load generator, not the scheduler, is behind.
    pub generator_lag: LagUs,
    /// Tasks the scheduler took that are neither planned nor dropped.
    /// `accounted`: none such, every task sent was taken, and every
    /// planned task reached its backend.
    pub unaccounted: i64,
    /// The frontends' bound on the tasks they sent that never left them
    /// (`FrontendsReport::unsent_at_exit`); the count lost is among `drops`.
    pub unsent_bound: u64,
    pub accounted: bool,
    /// CPU time over wall time of each process during the load (1.0 = one core).
    pub cpu_busy: CpuBusy,
    /// The scheduler process's CPU time (user + system, all threads) from
    /// the start of the load until it settled, over the tasks it took (ns).
    pub scheduler_cpu_ns_per_task: f64,
    /// The scheduler's poll loop over the tasks it took (its whole life:
    /// the load dominates).
    pub poll: PollTurns,
}

/// The scheduler daemon's poll loop per task taken (`symphony_poll_*`).
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct PollTurns {
    /// Turns of the loop.
    pub passes_per_task: f64,
    /// Idle turns that went to sleep (each a wake-up later).
    pub sleeps_per_task: f64,
    /// Idle turns that spun toward a timer too near to sleep for.
    pub timer_spins_per_task: f64,
}

/// CPU time over wall time per process (1.0 = one core busy).
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct CpuBusy {
    pub scheduler: f64,
    pub frontends: f64,
    pub backends: f64,
}

pub fn run(a: &BenchClusterArgs) -> Result<(), BenchClusterError> {
    if a.frontends == 0 || a.backends == 0 || a.models == 0 {
        return Err(BenchClusterError::Peer("--frontend-links, --backend-links and --profile-copies must be at least 1".into()));
    }
    if !(a.duration_s.is_finite() && a.duration_s > 0.0 && a.duration_s <= 600.0) {
        return Err(BenchClusterError::Peer("--duration-s must be in (0, 600]".into()));
    }
    control::parse_idle(&a.idle)?;
    let gpus = match (a.gpus_per_backend, a.gpus) {
        (Some(g), _) => g.saturating_mul(a.backends),
        (None, Some(g)) => g,
        (None, None) => return Err(BenchClusterError::Peer("--gpus or --gpus-per-backend is required".into())),
    };
    if gpus < a.backends {
        return Err(BenchClusterError::Peer(format!("{gpus} GPUs for {} backends: every backend needs one", a.backends)));
    }
    if a.engine.is_empty() || a.engine.iter().any(|e| e != "inline" && e != "pinned" && e != "auto") {
        return Err(BenchClusterError::Peer(format!("--engine {:?}: inline, pinned and/or auto", a.engine)));
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // The frontends and backends processes load the host beside the daemon.
    let auto = EngineKind::auto(cores, a.model_threads as usize, 2);
    let planned = (a.layout == "auto").then(|| layout::plan(&layout::usable_cpus(), a.model_threads as usize));
    let engine_note = match &planned {
        Some(p) => Some(format!("--layout auto: {}", p.why)),
        None => a.engine.iter().any(|e| e == "auto").then(|| format!("auto = {} ({cores} cores; pinned needs {} model threads + rank + I/O + 2 peers)", auto.name(), a.model_threads)),
    };
    let engines: Vec<String> = match &planned {
        Some(p) => vec![p.engine.name().to_string()],
        None => a.engine.iter().map(|e| if e == "auto" { auto.name().to_string() } else { e.clone() }).collect(),
    };
    let a = &BenchClusterArgs { engine: engines, pin_cores: planned.as_ref().map_or_else(|| a.pin_cores.clone(), LayoutPlan::pin_cores), ..a.clone() };
    let mut by_engine = Vec::new();
    for engine in &a.engine {
        let one = BenchClusterArgs { engine: vec![engine.clone()], ..a.clone() };
        let plan = planned.clone().unwrap_or_else(|| layout::stated(if engine == "pinned" { EngineKind::Pinned } else { EngineKind::Inline }, &a.pin_cores));
        if planned.is_some() || !a.json {
            tracing::info!("layout: {}", dataplane::machine::facts(plan.placements(a.model_threads as usize)).text());
        }
        let run = if a.find_max {
            ladder(&one, gpus, &plan)?
        } else {
            let rate = a.rate.unwrap_or(0.0);
            if !(rate.is_finite() && rate > 0.0) {
                return Err(BenchClusterError::Peer("--rate must be > 0".into()));
            }
            (cluster_run(&one, gpus, rate, a.duration_s, &plan)?, Vec::new())
        };
        by_engine.push((engine.clone(), plan, run));
    }
    let (plan, (best, probes)) = by_engine.last().map(|(_, p, r)| (p.clone(), r.clone())).ok_or(BenchClusterError::Peer("no engine".into()))?;
    let duration = if a.find_max { LADDER_RUN_S.min(a.duration_s) } else { a.duration_s };
    let reference = reference::run(a, gpus, duration, best.offered_rps)?;
    let machine = dataplane::machine::facts(plan.placements(a.model_threads as usize));
    let out = Outcome { a, gpus, engine_note: engine_note.as_deref(), by_engine: &by_engine, best: &best, probes: &probes, reference: &reference, machine: &machine };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&out.json()?)?);
    } else {
        out.print();
    }
    for (engine, _, (r, _)) in &by_engine {
        if !r.accounted {
            return Err(BenchClusterError::Peer(format!(
                "engine {engine}: accounting failed: offered {}, sent {}, taken {}, unsent at exit {} (frontends' bound {}), planned {}, delivered {}, neither planned nor dropped {}",
                r.offered, r.sent, r.received, r.sent.saturating_sub(r.received), r.unsent_bound, r.planned, r.delivered, r.unaccounted
            )));
        }
    }
    Ok(())
}

/// Each engine's run: (engine, its layout, (run, ladder probes)).
type EngineRun = (String, LayoutPlan, (ClusterRun, Vec<Probe>));

/// What `bench-cluster` reports.
struct Outcome<'a> {
    a: &'a BenchClusterArgs,
    gpus: u32,
    engine_note: Option<&'a str>,
    by_engine: &'a [EngineRun],
    best: &'a ClusterRun,
    probes: &'a [Probe],
    reference: &'a reference::Reference,
    machine: &'a dataplane::machine::MachineFacts,
}

impl Outcome<'_> {
    fn daemon(&self) -> Side {
        Side { tasks_per_s: self.best.tasks_per_s, bad_rate: self.best.bad_rate }
    }

    fn json(&self) -> Result<serde_json::Value, BenchClusterError> {
        let (a, best) = (self.a, self.best);
        let mut v = serde_json::json!({
            "tasks_per_s": best.tasks_per_s,
            "bad_rate": best.bad_rate,
            "scheduler_cpu_ns_per_task": best.scheduler_cpu_ns_per_task,
            "ingress_lag_p99_9_us": best.ingress_lag.p99_9_us,
            "dispatch_lag_p99_9_us": best.dispatch_lag.p99_9_us,
            "transport": a.transport.name(),
            "frontends": a.frontends,
            "backends": a.backends,
            "gpus": self.gpus,
            "run": best,
            "in_process": self.reference.at_offered,
            "probes": self.probes,
            "engine": a.engine.last(),
            "engine_auto": self.engine_note,
            "layout": a.layout,
            "backend_rt_priority": a.backend_rt_priority,
            "machine": serde_json::from_str::<serde_json::Value>(&self.machine.to_json())?,
            "by_engine": self.by_engine.iter().map(|(e, plan, (r, p))| serde_json::json!({"engine": e, "pin_cores": plan.pin_cores(), "run": r, "probes": p})).collect::<Vec<_>>(),
        });
        if let Some(m) = v.as_object_mut() {
            m.extend(reference::comparison_json(self.daemon(), self.reference));
        }
        Ok(v)
    }

    fn print(&self) {
        let a = self.a;
        println!("{}", self.machine.text());
        for (engine, _, (r, _)) in self.by_engine {
            println!(
                "engine {engine:>6}: accepted {:>10.0} tasks/s, bad {:.3}%, ingress lag p99.9 {:.1} us, dispatch lag p99.9 {:.1} us, scheduler CPU {:.2} cores, {:.0} ns per task; per task {:.3} loop turns, {:.4} sleeps, {:.3} timer spins",
                r.tasks_per_s,
                r.bad_rate * 100.0,
                r.ingress_lag.p99_9_us,
                r.dispatch_lag.p99_9_us,
                r.cpu_busy.scheduler,
                r.scheduler_cpu_ns_per_task,
                r.poll.passes_per_task,
                r.poll.sleeps_per_task,
                r.poll.timer_spins_per_task
            );
        }
        let r = self.best;
        println!(
            "{} frontends, {} backends, {} GPUs over {}; {} models; engine {}{}",
            a.frontends,
            a.backends,
            self.gpus,
            a.transport.name(),
            a.models,
            a.engine.last().map_or("", String::as_str),
            self.engine_note.map_or(String::new(), |n| format!(" ({n})"))
        );
        println!("offered {:.0} tasks/s; accepted {:.0} tasks/s; bad rate {:.3}%", r.offered_rps, r.tasks_per_s, r.bad_rate * 100.0);
        for (name, l) in [
            ("ingress lag", &r.ingress_lag),
            ("dispatch lag", &r.dispatch_lag),
            ("  decided", &r.decision_lag),
            ("  sent", &r.send_lag),
            ("generator lag", &r.generator_lag),
        ] {
            println!("{name:>13} us: p50 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}  ({} samples)", l.p50_us, l.p99_us, l.p99_9_us, l.max_us, l.samples);
        }
        let drops: Vec<String> = r.drops.iter().filter(|(_, n)| *n > 0).map(|(k, n)| format!("{k} {n}")).collect();
        println!("drops: {}; tasks finished late {}; plans after their planned start {}; accounted {}", if drops.is_empty() { "none".into() } else { drops.join(", ") }, r.late, r.late_plans, r.accounted);
        let c = r.cpu_busy;
        println!("CPU busy (cores): scheduler {:.2}, frontends {:.2}, backends {:.2}", c.scheduler, c.frontends, c.backends);
        println!("{}", reference::comparison_text(self.daemon(), self.reference));
    }
}

/// One ladder rung: (offered rate, passed, tasks/s, bad rate).
type Probe = (f64, bool, f64, f64);

/// Seconds per rung of the `--rate max` ladder.
const LADDER_RUN_S: f64 = 2.0;
/// The ladder stops starting rungs after this long.
const LADDER_BUDGET: StdDuration = StdDuration::from_secs(90);

/// Doubles the rate from 25k while the bad rate stays within 1%; returns
/// the best passing run and every probe (rate, passed, tasks/s, bad rate).
fn ladder(a: &BenchClusterArgs, gpus: u32, plan: &LayoutPlan) -> Result<(ClusterRun, Vec<Probe>), BenchClusterError> {
    let began = StdInstant::now();
    let secs = LADDER_RUN_S.min(a.duration_s);
    let mut probes = Vec::new();
    let mut best: Option<ClusterRun> = None;
    let mut rate = 25_000.0;
    while rate <= 8e6 && began.elapsed() < LADDER_BUDGET {
        let r = cluster_run(a, gpus, rate, secs, plan)?;
        let ok = r.bad_rate <= 0.01 && r.accounted;
        tracing::info!("  {rate:>10.0} tasks/s offered: accepted {:>10.0}/s, bad {:.3}%  {}", r.tasks_per_s, r.bad_rate * 100.0, if ok { "ok" } else { "fail" });
        probes.push((rate, ok, r.tasks_per_s, r.bad_rate));
        if !ok {
            break;
        }
        best = Some(r);
        rate *= 2.0;
    }
    Ok((best.ok_or(BenchClusterError::Peer("no rate passed (not even 25k tasks/s)".into()))?, probes))
}

/// Starts the scheduler and both peer processes, offers `rate` for
/// `secs`, stops everything and gathers the figures.
fn cluster_run(a: &BenchClusterArgs, gpus: u32, rate: f64, secs: f64, plan: &LayoutPlan) -> Result<ClusterRun, BenchClusterError> {
    let exe = std::env::current_exe().map_err(BenchClusterError::caused("cannot find my own executable"))?;
    let dir = std::env::temp_dir().join(format!("symphony-bench-cluster-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(BenchClusterError::caused(dir.display().to_string()))?;
    let mut spec = ClusterSpec::new(exe, "a100", "none");
    spec.extra = (0..a.models).map(|i| format!("model{i}={}", a.profile)).collect();
    spec.transport = a.transport.name().into();
    spec.idle = a.idle.clone();
    spec.log_dir = Some(dir.clone());
    spec.control_delay_us = a.control_delay_us;
    let token = JoinToken::generate()?;
    let deadline = StdInstant::now() + StdDuration::from_secs(60);
    let mut sched_args = vec!["--transport".into(), spec.transport.clone(), "--idle".into(), spec.idle.clone(), "--exit-with-parent".into()];
    sched_args.extend(spec.model_flags());
    sched_args.extend(
        ["--bench-stamps", "--max-registering", "4096", "--control-delay-us", &spec.control_delay_us.to_string(), "--min-window-us", &spec.min_window_us.to_string()]
            .map(String::from),
    );
    let engine = a.engine.last().map_or("pinned", String::as_str);
    sched_args.extend(["--engine", engine, "--model-threads", &a.model_threads.to_string(), "--pin-cores", &a.pin_cores].map(String::from));
    let link_tls = match a.link_tls {
        true => tools::throwaway_tls::throwaway(&dir).map_err(BenchClusterError::caused("--link-tls"))?.to_flags(),
        false => Vec::new(),
    };
    sched_args.extend(link_tls.iter().cloned());
    let mut sched = spawn(&spec, "scheduler", "scheduler", sched_args, Some(&token), deadline)?;
    let control_addr = sched.ready.get("control").cloned().ok_or(BenchClusterError::Peer("scheduler: no control address on its READY line".into()))?;
    let peer_args = |peers: u32, report: &Path, cpu: Option<usize>| -> Vec<String> {
        let mut v: Vec<String> = vec![
            "--transport".into(),
            spec.transport.clone(),
            "--scheduler".into(),
            control_addr.clone(),
            "--peers".into(),
            peers.to_string(),
            "--models".into(),
            a.models.to_string(),
            "--profile".into(),
            a.profile.clone(),
            "--report".into(),
            report.display().to_string(),
            "--exit-with-parent".into(),
        ];
        v.extend(["--seed".into(), a.seed.to_string()]);
        v.extend(link_tls.iter().cloned());
        v.extend(cpu.map(|c| ["--pin-cpu".into(), c.to_string()]).into_iter().flatten());
        v
    };
    let back_report = dir.join("backends.json");
    let front_report = dir.join("frontends.json");
    let mut args = peer_args(a.backends, &back_report, plan.backends);
    args.extend(["--gpus".into(), gpus.to_string(), "--rt-priority".into(), a.backend_rt_priority.to_string()]);
    let mut backs = spawn(&spec, "bench-backends", "bench-backends", args, Some(&token), deadline)?;
    let mut args = peer_args(a.frontends, &front_report, plan.frontends);
    args.extend(["--rate".into(), rate.to_string(), "--duration-s".into(), secs.to_string(), "--stamp-every".into(), a.stamp_every.to_string()]);
    args.extend(["--coalesce".into(), a.coalesce.to_string(), "--coalesce-us".into(), a.coalesce_us.to_string()]);
    args.extend(["--max-lag-us".into(), a.frontend_max_lag_us.to_string()]);
    args.extend(["--queue-budget-us".into(), a.frontend_queue_budget_us.to_string()]);
    let mut fronts = spawn(&spec, "bench-frontends", "bench-frontends", args, Some(&token), deadline)?;
    let sched_cpu_at_start = (StdInstant::now(), cpu_s_of(sched.pid()));
    // The frontends write their report and keep their links open until
    // told to stop (see `frontends::linger`), so the scheduler can read all
    // it was sent before settling.
    let reported_by = StdInstant::now() + StdDuration::from_secs_f64(secs + 60.0);
    while !front_report.exists() && fronts.try_exit().is_none() && StdInstant::now() < reported_by {
        std::thread::sleep(StdDuration::from_millis(20));
    }
    let fr: Result<FrontendsReport, BenchClusterError> = read_report(&front_report);
    let metrics = settled(&sched, fr.as_ref().map_or((0, 0), |r| (r.sent, r.unsent_at_exit)));
    // (CPU seconds, wall seconds) of the scheduler from the load's start until it settled.
    let sched_cpu = match (sched_cpu_at_start, cpu_s_of(sched.pid())) {
        ((t, Some(c0)), Some(c1)) => (c1 - c0, t.elapsed().as_secs_f64().max(1e-3)),
        _ => (0.0, 1.0),
    };
    // The backends read the last plans the scheduler sent.
    std::thread::sleep(StdDuration::from_millis(200));
    let stop = |d: &mut Daemon| {
        if d.try_exit().is_none() {
            d.signal(libc::SIGTERM);
        }
        d.wait_or_kill(StdDuration::from_secs(15))
    };
    let front_exit = stop(&mut fronts);
    let back_exit = stop(&mut backs);
    let _ = stop(&mut sched);
    let logs = |name: &str| format!("see {}", dir.join(format!("{name}.log")).display());
    match front_exit {
        Ok(s) if s.success() => {}
        Ok(s) => return Err(BenchClusterError::Peer(format!("bench-frontends exited with {s}; {}", logs("bench-frontends")))),
        Err(e) => return Err(BenchClusterError::caused(format!("stopping bench-frontends ({})", logs("bench-frontends")))(e)),
    }
    match back_exit {
        Ok(s) if s.success() => {}
        Ok(s) => return Err(BenchClusterError::Peer(format!("bench-backends exited with {s}; {}", logs("bench-backends")))),
        Err(e) => return Err(BenchClusterError::caused(format!("stopping bench-backends ({})", logs("bench-backends")))(e)),
    }
    let metrics = metrics?;
    let fr = fr?;
    let br: BackendsReport = read_report(&back_report)?;
    let _ = std::fs::remove_dir_all(&dir);
    let mut run = figures(rate, secs, &metrics, &fr, &br);
    run.cpu_busy = CpuBusy { scheduler: sched_cpu.0 / sched_cpu.1, frontends: fr.cpu_busy, backends: br.cpu_busy };
    run.scheduler_cpu_ns_per_task = if run.received > 0 { sched_cpu.0 * 1e9 / run.received as f64 } else { 0.0 };
    Ok(run)
}

/// The scheduler's metrics once it has taken the `sent` tasks and
/// planned or dropped each (a loaded scheduler is behind its peers), or
/// after 10 s. `sent` is (tasks sent, of those at most this many never
/// left the frontends): when some never left, once the count taken has
/// stopped growing (for [`SETTLED_QUIET`]) within that bound.
fn settled(sched: &Daemon, (sent, unsent): (u64, u64)) -> Result<String, BenchClusterError> {
    let until = StdInstant::now() + StdDuration::from_secs(10);
    let mut last = (u64::MAX, StdInstant::now());
    loop {
        let text = sched.metrics()?;
        let m = |name: &str| metric(&text, name).unwrap_or(0.0) as u64;
        let received = m("symphony_tasks_received_total");
        let ended = m("symphony_batch_size_sum") + sched_drops(&text);
        if received != last.0 {
            last = (received, StdInstant::now());
        }
        let quiet = last.1.elapsed() >= SETTLED_QUIET && received + unsent >= sent;
        if ((received >= sent || quiet) && ended >= received) || StdInstant::now() >= until {
            return Ok(text);
        }
        std::thread::sleep(StdDuration::from_millis(20));
    }
}

/// How long the scheduler's count of tasks taken must stand still before
/// the tasks still missing count as lost with the frontends' exit.
const SETTLED_QUIET: StdDuration = StdDuration::from_millis(300);

/// Tasks the scheduler dropped, every reason.
fn sched_drops(text: &str) -> u64 {
    DropReason::ALL
        .iter()
        .map(|r| metric(text, &format!("symphony_tasks_dropped_total{{reason=\"{}\"}}", r.as_str())).unwrap_or(0.0) as u64)
        .sum()
}

/// CPU seconds (user + system) process `pid` has used, from /proc.
fn cpu_s_of(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (hz > 0.0).then(|| ticks / hz)
}

fn read_report<T: serde::de::DeserializeOwned>(path: &PathBuf) -> Result<T, BenchClusterError> {
    let text = std::fs::read_to_string(path).map_err(BenchClusterError::caused(path.display().to_string()))?;
    serde_json::from_str(&text).map_err(BenchClusterError::caused(path.display().to_string()))
}

/// The run's figures from the scheduler's metrics and the peers' reports.
fn figures(rate: f64, secs: f64, metrics: &str, fr: &FrontendsReport, br: &BackendsReport) -> ClusterRun {
    let m = |name: &str| metric(metrics, name).unwrap_or(0.0) as u64;
    let received = m("symphony_tasks_received_total");
    let mut drops: Vec<(String, u64)> = DropReason::ALL
        .iter()
        .map(|r| (r.as_str().to_string(), m(&format!("symphony_tasks_dropped_total{{reason=\"{}\"}}", r.as_str()))))
        .collect();
    let sched_drops: u64 = drops.iter().map(|(_, n)| n).sum();
    let planned = m("symphony_batch_size_sum");
    drops.push(("frontend_queue_full".into(), fr.queue_full));
    drops.push(("frontend_refused_late".into(), fr.refused_late));
    // Sent, never taken by the scheduler: lost with the frontends' exit
    // (the drain bound passed with them still queued), which they bound.
    let unsent_at_exit = fr.sent.saturating_sub(received);
    drops.push(("frontend_unsent_at_exit".into(), unsent_at_exit));
    drops.push(("protocol_error".into(), m("symphony_protocol_errors_total")));
    let good = br.tasks.saturating_sub(br.late_tasks);
    let unaccounted = received as i64 - planned as i64 - sched_drops as i64;
    let per_task = |n: u64| if received > 0 { n as f64 / received as f64 } else { 0.0 };
    ClusterRun {
        offered_rps: rate,
        tasks_per_s: good as f64 / secs,
        bad_rate: if fr.offered > 0 { 1.0 - good as f64 / fr.offered as f64 } else { 0.0 },
        offered: fr.offered,
        sent: fr.sent,
        received,
        planned,
        delivered: br.tasks,
        late: br.late_tasks,
        late_plans: br.late_plans,
        drops,
        ingress_lag: bucket_quantiles(metrics, "symphony_bench_ingress_lag_us"),
        dispatch_lag: br.dispatch_lag,
        decision_lag: bucket_quantiles(metrics, "symphony_bench_decision_lag_us"),
        send_lag: bucket_quantiles(metrics, "symphony_bench_send_lag_us"),
        generator_lag: fr.send_lag,
        unaccounted,
        unsent_bound: fr.unsent_at_exit,
        accounted: unaccounted == 0
            && fr.sent == received + unsent_at_exit
            && unsent_at_exit <= fr.unsent_at_exit
            && fr.offered == fr.sent + fr.queue_full + fr.refused_late && br.tasks == planned,
        cpu_busy: CpuBusy::default(),
        scheduler_cpu_ns_per_task: 0.0,
        poll: PollTurns {
            passes_per_task: per_task(m("symphony_poll_passes_total")),
            sleeps_per_task: per_task(m("symphony_poll_sleeps_total")),
            timer_spins_per_task: per_task(m("symphony_poll_timer_spins_total")),
        },
    }
}

/// Quantiles of a cumulative `NAME_bucket{le="US"}` histogram (each the
/// upper bound of the bucket that holds it).
fn bucket_quantiles(text: &str, name: &str) -> LagUs {
    let prefix = format!("{name}_bucket{{le=\"");
    let buckets: Vec<(f64, u64)> = text
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter_map(|rest| {
            let (le, count) = rest.split_once("\"} ")?;
            Some((le.parse::<f64>().ok()?, count.trim().parse::<u64>().ok()?))
        })
        .collect();
    let total = buckets.last().map_or(0, |&(_, c)| c);
    if total == 0 {
        return LagUs::default();
    }
    let q = |p: f64| {
        let want = (p * total as f64).ceil().max(1.0) as u64;
        buckets.iter().find(|&&(_, c)| c >= want).map_or(0.0, |&(le, _)| le)
    };
    LagUs { samples: total, p50_us: q(0.5), p99_us: q(0.99), p99_9_us: q(0.999), max_us: q(1.0) }
}

/// `symphony daemon bench-frontends|bench-backends ARGS`: one synthetic
/// peer process (started by `bench-cluster`).
pub fn peer_main(role: &str, argv: Vec<String>) -> ExitCode {
    let a = match PeerArgs::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(2);
        }
    };
    if a.exit_with_parent {
        control::terminate_with_parent();
    }
    if let Err(e) = control::install_stop_signals() {
        eprintln!("{role}: {e}");
        return ExitCode::from(1);
    }
    if a.rt_priority > 0 {
        // Before any thread starts: threads inherit the policy.
        if let Err(e) = peer::set_realtime_fifo(a.rt_priority) {
            eprintln!("{role}: SCHED_FIFO at priority {}: {e} (needs root or CAP_SYS_NICE)", a.rt_priority);
            return ExitCode::from(1);
        }
    }
    if let Some(cpu) = a.pin_cpu {
        // Before any thread starts, as above: `bench-cluster --layout auto`.
        if let Err(e) = layout::pin_self(cpu) {
            eprintln!("{role}: pinning to CPU {cpu}: {e}");
            return ExitCode::from(1);
        }
    }
    if let Err(e) = a.link_tls.select(a.transport) {
        eprintln!("{role}: {e}");
        return ExitCode::from(2);
    }
    let res = control::with_domain(a.transport, Peer { frontends: role == "bench-frontends", args: a }).map_err(BenchClusterError::from).and_then(|r| r);
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{role}: {e}");
            ExitCode::from(1)
        }
    }
}

struct Peer {
    frontends: bool,
    args: PeerArgs,
}

impl WithDomain for Peer {
    type Out = Result<(), BenchClusterError>;
    fn run<D: Domain>(self, domain: D) -> Result<(), BenchClusterError> {
        if self.frontends {
            frontends::run(domain, self.args)
        } else {
            backends::run(domain, self.args)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_quantiles_take_the_upper_bound_holding_the_rank() {
        let text = "x_bucket{le=\"3\"} 10\nx_bucket{le=\"7\"} 990\nx_bucket{le=\"4095\"} 1000\nx_bucket{le=\"+Inf\"} 1000\nx_count 1000\n";
        let l = bucket_quantiles(text, "x");
        assert_eq!(l.samples, 1000);
        assert_eq!(l.p50_us, 7.0);
        assert_eq!(l.p99_us, 7.0);
        assert_eq!(l.p99_9_us, 4095.0);
        assert_eq!(bucket_quantiles("", "x").samples, 0);
    }

    #[test]
    fn gpus_are_spread_over_backends() {
        let total: u32 = (0..256).map(|i| peer::gpus_of(i, 256, 1000)).sum();
        assert_eq!(total, 1000);
        assert_eq!(peer::gpus_of(0, 256, 1000), 4);
        assert_eq!(peer::gpus_of(255, 256, 1000), 3);
    }
}
