//! A local multi-process cluster: one `symphony-scheduler`, F
//! `symphony-frontend`s and B `symphony-backend`s (emulated GPUs), each a
//! child process of this one (`symphony daemon <role> ...`), over one
//! transport. Used by `symphony up`, the end-to-end report and the
//! multi-process integration test.
//!
//! Each daemon prints one `READY key=value ...` line on stdout when it is
//! up; this module waits for it (bounded), then waits until the scheduler's
//! `/metrics` shows every peer registered. Children get `--exit-with-parent`
//! so that none outlives this process, and [`LocalCluster`]'s `Drop` kills
//! whatever is still running. Every cluster has its own random join token,
//! handed to the children in their environment (`SYMPHONY_JOIN_TOKEN`),
//! never on a command line.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use dataplane::control::{http_get, metric};
use dataplane::join::{JoinToken, TOKEN_ENV};
use frontend::loadgen::{LoadConfig, LoadModel, LoadReport};
use frontend::models::ModelCatalog;
use scheduler::sim::Workload;
use scheduler::zoo::ModelSpec;

/// Runs `cfg` to its end on a one-worker runtime of its own (the load
/// generator beside a cluster of processes: tests, `up --groups`).
pub fn run_load(cfg: LoadConfig) -> Result<LoadReport, RunLoadError> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    Ok(rt.block_on(frontend::loadgen::run(cfg))?)
}

/// Why [`run_load`] produced no report.
#[derive(Debug, thiserror::Error)]
pub enum RunLoadError {
    /// The load generator's runtime could not start.
    #[error("load generator runtime: {0}")]
    Runtime(#[from] std::io::Error),
    /// The load generator failed.
    #[error(transparent)]
    Load(#[from] frontend::loadgen::LoadError),
}

/// An open-loop HTTP load of `rate` rps (Poisson, equal split over
/// `models`, whose ids are their indices) for `secs` against `targets`,
/// with the frontends' default tensors; each model's SLO is the client's
/// deadline (a later 200 is counted `late`).
pub fn load_config(models: &[ModelSpec], targets: Vec<SocketAddr>, rate: f64, secs: f64, seed: u64) -> LoadConfig {
    let catalog = ModelCatalog::with_default_tensors(models);
    let (input, output) = catalog
        .by_id(0)
        .map(|e| ((e.input.byte_len() / 4) as usize, e.output.byte_len() as usize))
        .unwrap_or((0, 0));
    LoadConfig {
        targets,
        // A correct answer after the model's SLO (as this client measures
        // it, HTTP included) is late, not good.
        models: catalog
            .entries()
            .iter()
            .enumerate()
            .map(|(i, e)| LoadModel::new(&e.spec.name, i as u32).with_slo(std::time::Duration::from_nanos(e.spec.slo.as_nanos())))
            .collect(),
        input_elements: input,
        output_bytes: output,
        workload: Workload::poisson(rate),
        duration: dataplane::time::Duration::from_secs_f64(secs),
        max_requests: u64::MAX,
        max_in_flight: 8192,
        seed,
        timeout_us: None,
        priority_mix: None,
    }
}

/// What to start.
#[derive(Clone, Debug)]
pub struct ClusterSpec {
    /// The `symphony` executable (its `daemon` subcommand runs the roles).
    pub exe: PathBuf,
    /// Transport name (shm, tcp, tcp-blocking, rdma).
    pub transport: String,
    /// Zoo table.
    pub zoo: String,
    /// Zoo selection (the cluster's model list).
    pub models: String,
    /// Extra models NAME=ALPHA_MS,BETA_MS,SLO_MS.
    pub extra: Vec<String>,
    /// Frontend processes.
    pub frontends: u32,
    /// Backend processes.
    pub backends: u32,
    /// Emulated GPUs per backend.
    pub gpus_per_backend: u32,
    /// Idle strategy of every daemon.
    pub idle: String,
    /// Extra flags per role.
    pub scheduler_flags: Vec<String>,
    /// Extra flags for every frontend.
    pub frontend_flags: Vec<String>,
    /// Extra flags for every backend.
    pub backend_flags: Vec<String>,
    /// Where the daemons' stderr goes (one file per daemon); `None`
    /// inherits this process's stderr.
    pub log_dir: Option<PathBuf>,
    /// Bound on start-up (READY lines and registration).
    pub start_timeout: Duration,
    /// The control delay the scheduler charges and announces to the
    /// backends, which subtract it (µs); a plan's trip over shm between
    /// awake processes takes tens.
    pub control_delay_us: u32,
    /// The cluster's join token (`None`: a fresh random one per start).
    pub join_token: Option<JoinToken>,
    /// Part of each budget the frontends keep for the way back (µs).
    pub return_margin_us: u32,
    /// The scheduler's narrowest window (µs): its timer lateness bound.
    pub min_window_us: u32,
    /// Schedulers: 1 leads alone (the embedded default); 2 or more stand
    /// for election through a local etcd (hot standby, issue 18).
    pub schedulers: u32,
    /// Members of that local etcd (1 or 3).
    pub etcd_members: u32,
}

impl ClusterSpec {
    /// Where daemon `name`'s stderr goes (`log_dir/<name>.log`; none: inherited).
    pub fn log_path(&self, name: &str) -> Option<PathBuf> {
        self.log_dir.as_ref().map(|dir| dir.join(format!("{name}.log")))
    }

    /// Defaults: shm, `wait` idle, 2 frontends, 2 backends x 1 GPU.
    pub fn new(exe: PathBuf, zoo: &str, models: &str) -> Self {
        ClusterSpec {
            exe,
            transport: "shm".into(),
            zoo: zoo.into(),
            models: models.into(),
            extra: Vec::new(),
            frontends: 2,
            backends: 2,
            gpus_per_backend: 1,
            idle: "wait".into(),
            scheduler_flags: Vec::new(),
            frontend_flags: Vec::new(),
            backend_flags: Vec::new(),
            log_dir: None,
            start_timeout: Duration::from_secs(30),
            control_delay_us: 200,
            join_token: None,
            return_margin_us: 700,
            min_window_us: 1000,
            schedulers: 1,
            etcd_members: 1,
        }
    }

    /// The model-list flags every daemon of the cluster gets.
    pub fn model_flags(&self) -> Vec<String> {
        let mut v = vec![
            "--zoo".into(),
            self.zoo.clone(),
            "--models".into(),
            self.models.clone(),
        ];
        for m in &self.extra {
            v.push("--model".into());
            v.push(m.clone());
        }
        v
    }
}

/// Why a daemon or the cluster did not start, answer or stop cleanly.
/// Every variant names the daemon ("scheduler", "frontend-1", ...).
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The local etcd for the schedulers' election did not start (or a
    /// scheduler has none).
    #[error("local etcd: {0}")]
    Etcd(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// Its READY line lacks a key.
    #[error("{daemon}: no '{key}' on its READY line")]
    NoReadyKey {
        /// The daemon.
        daemon: String,
        /// The key.
        key: String,
    },
    /// A READY value is not a socket address.
    #[error("{daemon}: bad {key} address '{value}': {source}")]
    BadAddress {
        /// The daemon.
        daemon: String,
        /// The key.
        key: String,
        /// The value.
        value: String,
        /// The parse error.
        source: std::net::AddrParseError,
    },
    /// Its `/metrics` did not answer.
    #[error("{daemon}: {source}")]
    Metrics {
        /// The daemon.
        daemon: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// It could not be reaped.
    #[error("{daemon}: cannot reap it: {source}")]
    Reap {
        /// The daemon.
        daemon: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// It did not exit in time and was killed.
    #[error("{daemon} did not exit within {timeout:?}; killed")]
    NoExit {
        /// The daemon.
        daemon: String,
        /// How long it had.
        timeout: Duration,
    },
    /// It exited unsuccessfully.
    #[error("{daemon} exited with {status}")]
    ExitedWith {
        /// The daemon.
        daemon: String,
        /// Its exit status.
        status: ExitStatus,
    },
    /// The cluster's join token could not be made.
    #[error("join token: {0}")]
    JoinToken(#[source] dataplane::join::JoinError),
    /// The join token cannot be passed in the environment.
    #[error("the join token is not text")]
    TokenNotText,
    /// Its log file cannot be created.
    #[error("{}: {source}", path.display())]
    LogFile {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// It could not be started.
    #[error("cannot start {daemon} ({}): {source}", exe.display())]
    Start {
        /// The daemon.
        daemon: String,
        /// The executable.
        exe: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Its stdout pipe is missing.
    #[error("{daemon}: no stdout pipe")]
    NoStdout {
        /// The daemon.
        daemon: String,
    },
    /// The thread reading its stdout could not start.
    #[error("{daemon}: cannot start its stdout reader: {source}")]
    Reader {
        /// The daemon.
        daemon: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// It exited before its READY line.
    #[error("{daemon} exited before it was ready ({status}); see its log")]
    ExitedEarly {
        /// The daemon.
        daemon: String,
        /// Its exit status.
        status: ExitStatus,
    },
    /// No READY line before the deadline.
    #[error("{daemon} was not ready in time; see its log")]
    NotReady {
        /// The daemon.
        daemon: String,
    },
    /// Not every peer registered before the deadline.
    #[error("registration incomplete: {frontends} of {want_frontends} frontends, {backends} of {want_backends} backends")]
    Registration {
        /// Frontends the scheduler reports (-1: none reported).
        frontends: f64,
        /// Frontends started.
        want_frontends: u32,
        /// Backends the scheduler reports (-1: none reported).
        backends: f64,
        /// Backends started.
        want_backends: u32,
    },
    /// Registered backends' GPUs did not all pass the join gate in time.
    #[error("{online} of {want} GPUs in matchmaking (-1: not reported)")]
    GpusOnline {
        /// GPUs the scheduler reports in matchmaking.
        online: f64,
        /// GPUs the backends brought.
        want: u32,
    },
    /// A frontend's data links from the backends were not all up in time.
    #[error("frontend {frontend} has {links} of {want} backend data links (-1: not reported)")]
    DataLinks {
        /// The frontend (1-based, as its id).
        frontend: u32,
        /// Links it reports.
        links: f64,
        /// Backends started.
        want: u32,
    },
    /// Daemons that did not stop cleanly.
    #[error("{}", problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Unclean {
        /// One error per such daemon.
        problems: Vec<ClusterError>,
    },
}


/// One running daemon.
#[derive(Debug)]
pub struct Daemon {
    /// "scheduler", "frontend-1", "backend-2", ...
    pub name: String,
    child: Child,
    /// The key=value pairs of its READY line.
    pub ready: HashMap<String, String>,
    exited: Option<ExitStatus>,
}

impl Daemon {
    /// A READY value parsed as a socket address.
    pub fn addr(&self, key: &str) -> Result<SocketAddr, ClusterError> {
        let v = self
            .ready
            .get(key)
            .ok_or_else(|| ClusterError::NoReadyKey { daemon: self.name.clone(), key: key.to_string() })?;
        v.parse().map_err(|source| ClusterError::BadAddress {
            daemon: self.name.clone(),
            key: key.to_string(),
            value: v.clone(),
            source,
        })
    }
    /// Its `/metrics` text.
    pub fn metrics(&self) -> Result<String, ClusterError> {
        let a = self.addr("metrics")?;
        http_get(a, "/metrics", Duration::from_secs(5)).map_err(|source| ClusterError::Metrics { daemon: self.name.clone(), source })
    }
    /// Process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
    /// Sends `sig` (e.g. `libc::SIGTERM`).
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid; no memory effects.
        let _ = unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
    }
    /// Kills it with SIGKILL (a crash, as far as its peers can tell) and
    /// reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        if let Ok(s) = self.child.wait() {
            self.exited = Some(s);
        }
    }
    /// Whether it has exited (and how), without blocking.
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().ok().flatten();
        }
        self.exited
    }
    /// Waits up to `timeout` for it to exit; kills it after that.
    pub fn wait_or_kill(&mut self, timeout: Duration) -> Result<ExitStatus, ClusterError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.try_exit() {
                return Ok(s);
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let s = self.child.wait().map_err(|source| ClusterError::Reap { daemon: self.name.clone(), source })?;
                self.exited = Some(s);
                return Err(ClusterError::NoExit { daemon: self.name.clone(), timeout });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// A running local cluster.
#[derive(Debug)]
pub struct LocalCluster {
    /// The join token its daemons prove.
    pub join_token: JoinToken,
    /// The scheduler (with hot standbys: scheduler 1, leading or not).
    pub scheduler: Daemon,
    /// Schedulers 2.. (hot standbys; empty without an election).
    pub standbys: Vec<Daemon>,
    /// Every scheduler's control address, in order (what peers walk).
    pub scheduler_addrs: Vec<String>,
    /// The local etcd the schedulers stand for election in.
    pub etcd: Option<scheduler::election::LocalEtcd>,
    /// Each scheduler's command line (to bring a killed one back).
    scheduler_cmds: Vec<Vec<String>>,
    /// Frontends, by id - 1.
    pub frontends: Vec<Daemon>,
    /// Backends, by id - 1.
    pub backends: Vec<Daemon>,
}

/// Starts `symphony daemon <role> <args>` with `token` in its environment
/// (none: without any token, also not one this process inherited) and
/// waits (until `deadline`) for its READY line; its stderr goes to
/// `spec.log_dir/<name>.log` if set.
pub fn spawn(
    spec: &ClusterSpec,
    name: &str,
    role: &str,
    args: Vec<String>,
    token: Option<&JoinToken>,
    deadline: Instant,
) -> Result<Daemon, ClusterError> {
    let mut cmd = daemon_command(spec, name, role, &args, token)?;
    let mut child = cmd.spawn().map_err(|source| ClusterError::Start {
        daemon: name.to_string(),
        exe: spec.exe.clone(),
        source,
    })?;
    let stdout = child.stdout.take().ok_or_else(|| ClusterError::NoStdout { daemon: name.to_string() })?;
    let (tx, rx) = mpsc::channel();
    // Reads the READY line, then keeps draining stdout so the child never
    // blocks on a full pipe.
    std::thread::Builder::new()
        .name(format!("{name}-stdout"))
        .spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if !sent && line.starts_with("READY") {
                    let _ = tx.send(line);
                    sent = true;
                }
            }
        })
        .map_err(|source| ClusterError::Reader { daemon: name.to_string(), source })?;
    let mut d = Daemon {
        name: name.to_string(),
        child,
        ready: HashMap::new(),
        exited: None,
    };
    d.ready = wait_ready(&mut d, &rx, deadline)?;
    Ok(d)
}

/// The command line, environment and stdio of one daemon.
fn daemon_command(spec: &ClusterSpec, name: &str, role: &str, args: &[String], token: Option<&JoinToken>) -> Result<Command, ClusterError> {
    let mut cmd = Command::new(&spec.exe);
    cmd.arg("daemon").arg(role).args(args);
    match token.map(|t| t.as_text().ok_or(ClusterError::TokenNotText)) {
        Some(t) => cmd.env(TOKEN_ENV, t?),
        None => cmd.env_remove(TOKEN_ENV),
    };
    cmd.stdin(Stdio::null()).stdout(Stdio::piped());
    match spec.log_path(name) {
        Some(path) => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|source| ClusterError::LogFile { path: dir.to_path_buf(), source })?;
            }
            let f = std::fs::File::create(&path).map_err(|source| ClusterError::LogFile { path, source })?;
            cmd.stderr(f);
        }
        None => {
            cmd.stderr(Stdio::inherit());
        }
    }
    Ok(cmd)
}

/// Waits (until `deadline`) for `d`'s READY line; returns its key=value
/// pairs. A daemon that exits first, or is late (then killed), is an error.
fn wait_ready(d: &mut Daemon, rx: &mpsc::Receiver<String>, deadline: Instant) -> Result<HashMap<String, String>, ClusterError> {
    loop {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(50)) {
            return Ok(line
                .split_whitespace()
                .skip(1)
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect());
        }
        if let Some(status) = d.try_exit() {
            return Err(ClusterError::ExitedEarly { daemon: d.name.clone(), status });
        }
        if Instant::now() >= deadline {
            let _ = d.child.kill();
            let _ = d.child.wait();
            return Err(ClusterError::NotReady { daemon: d.name.clone() });
        }
    }
}

/// Every daemon's flags: transport, idle strategy, models, then `extra`.
fn common_args(spec: &ClusterSpec, extra: &[String]) -> Vec<String> {
    let mut v = vec![
        "--transport".to_string(),
        spec.transport.clone(),
        "--idle".into(),
        spec.idle.clone(),
        "--exit-with-parent".into(),
    ];
    v.extend(spec.model_flags());
    v.extend(extra.iter().cloned());
    v
}

/// Backend `id`'s flags, registering with the schedulers at `control`
/// (comma-separated).
pub fn backend_args(spec: &ClusterSpec, id: u32, control: &str) -> Vec<String> {
    let mut v = common_args(spec, &spec.backend_flags);
    v.extend(["--id".into(), id.to_string(), "--scheduler".into(), control.to_string()]);
    v.extend(["--gpus-per-backend".into(), spec.gpus_per_backend.to_string()]);
    v
}

/// The scheduler's flags (without `--listen`).
fn scheduler_args(spec: &ClusterSpec) -> Vec<String> {
    let mut v = common_args(spec, &spec.scheduler_flags);
    v.extend([
        "--control-delay-us".into(),
        spec.control_delay_us.to_string(),
        "--min-window-us".into(),
        spec.min_window_us.to_string(),
    ]);
    v
}

/// Starts a local etcd and `spec.schedulers` schedulers standing for
/// election in it, each on a fixed control address of its own (peers are
/// given all of them) and a heartbeat socket on an ephemeral port.
#[allow(clippy::type_complexity)]
fn start_schedulers_ha(
    spec: &ClusterSpec,
    token: &JoinToken,
    deadline: Instant,
) -> Result<(Daemon, Vec<Daemon>, Option<scheduler::election::LocalEtcd>, Vec<Vec<String>>), ClusterError> {
    let etcd_err = ClusterError::Etcd;
    let etcd = scheduler::election::LocalEtcd::start(spec.etcd_members.max(1) as usize, deadline.saturating_duration_since(Instant::now()))
        .map_err(|e| etcd_err(e.into()))?;
    let endpoints = etcd.endpoints().join(",");
    let mut daemons = Vec::new();
    let mut cmds = Vec::new();
    for k in 1..=spec.schedulers {
        let listen = match spec.transport.as_str() {
            "shm" => format!("@symphony-{}-{}-sched-{k}", std::process::id(), unique()),
            _ => {
                let port = dataplane::control::unused_port().map_err(|e| etcd_err(e.into()))?;
                format!("127.0.0.1:{port}")
            }
        };
        let mut args = scheduler_args(spec);
        args.extend(["--listen".into(), listen, "--etcd".into(), endpoints.clone()]);
        let name = scheduler_name(k as usize - 1);
        cmds.push(args.clone());
        daemons.push(spawn(spec, &name, "scheduler", args, Some(token), deadline)?);
    }
    let mut it = daemons.into_iter();
    let first = it.next().ok_or_else(|| etcd_err("no scheduler".into()))?;
    Ok((first, it.collect(), Some(etcd), cmds))
}

/// Scheduler `i`'s name (0-based): "scheduler", "scheduler-2", ...
fn scheduler_name(i: usize) -> String {
    if i == 0 {
        "scheduler".to_string()
    } else {
        format!("scheduler-{}", i + 1)
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl LocalCluster {
    /// Kills the scheduler (SIGKILL, if still running) and starts a new
    /// one listening on the same control address, so the frontends and
    /// backends, which outlive it, reconnect and register again.
    pub fn restart_scheduler(&mut self, spec: &ClusterSpec) -> Result<(), ClusterError> {
        let control = self
            .scheduler
            .ready
            .get("control")
            .cloned()
            .ok_or_else(|| ClusterError::NoReadyKey { daemon: "scheduler".into(), key: "control".into() })?;
        self.scheduler.kill();
        let mut args = scheduler_args(spec);
        args.extend(["--listen".into(), control]);
        let deadline = Instant::now() + spec.start_timeout;
        self.scheduler = spawn(spec, "scheduler", "scheduler", args, Some(&self.join_token), deadline)?;
        Ok(())
    }

    /// Starts the scheduler, then the backends and frontends, and waits
    /// until every peer is registered.
    pub fn start(spec: &ClusterSpec) -> Result<LocalCluster, ClusterError> {
        let deadline = Instant::now() + spec.start_timeout;
        let token = match &spec.join_token {
            Some(t) => t.clone(),
            None => JoinToken::generate().map_err(ClusterError::JoinToken)?,
        };
        let common = |extra: &[String]| common_args(spec, extra);
        let (scheduler, standbys, etcd, scheduler_cmds) = if spec.schedulers >= 2 {
            start_schedulers_ha(spec, &token, deadline)?
        } else {
            (spawn(spec, "scheduler", "scheduler", scheduler_args(spec), Some(&token), deadline)?, Vec::new(), None, Vec::new())
        };
        let scheduler_addrs = std::iter::once(&scheduler)
            .chain(&standbys)
            .map(|d| {
                d.ready
                    .get("control")
                    .cloned()
                    .ok_or_else(|| ClusterError::NoReadyKey { daemon: d.name.clone(), key: "control".into() })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let control = scheduler_addrs.join(",");
        let mut cluster = LocalCluster {
            join_token: token,
            scheduler,
            standbys,
            scheduler_addrs,
            etcd,
            scheduler_cmds,
            frontends: Vec::new(),
            backends: Vec::new(),
        };
        if spec.schedulers >= 2 {
            cluster.wait_leader(deadline)?;
        }
        for b in 1..=spec.backends {
            // Plans say "start in exec_in" from the moment the scheduler
            // sent them; the backend starts that long after receipt minus
            // the control delay the scheduler charged and announced.
            let args = backend_args(spec, b, &control);
            let d = spawn(spec, &format!("backend-{b}"), "backend", args, Some(&cluster.join_token), deadline)?;
            cluster.backends.push(d);
        }
        for f in 1..=spec.frontends {
            let mut args = common(&spec.frontend_flags);
            args.extend(["--return-margin-us".into(), spec.return_margin_us.to_string()]);
            args.extend([
                "--id".into(),
                f.to_string(),
                "--scheduler".into(),
                control.clone(),
            ]);
            let d = spawn(spec, &format!("frontend-{f}"), "frontend", args, Some(&cluster.join_token), deadline)?;
            cluster.frontends.push(d);
        }
        cluster.wait_registered(spec.frontends, spec.backends, deadline)?;
        cluster.wait_gpus_online(spec.backends * spec.gpus_per_backend, deadline)?;
        cluster.wait_data_links(spec.backends, deadline)?;
        Ok(cluster)
    }

    /// Waits until every frontend has a data link from `backends` backends
    /// (`symphony_frontend_backends`). The backends start first, so they
    /// pass the join gate with no frontend announced and their GPUs are in
    /// matchmaking before a frontend registers; a task planned to a backend
    /// whose link to its frontend is not up yet cannot have its input
    /// fetched (seen as a 500 in drain_live when the host was loaded).
    pub fn wait_data_links(&self, backends: u32, deadline: Instant) -> Result<(), ClusterError> {
        for (i, f) in self.frontends.iter().enumerate() {
            loop {
                let links = metric(&f.metrics()?, "symphony_frontend_backends").unwrap_or(-1.0);
                if links >= f64::from(backends) {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(ClusterError::DataLinks { frontend: i as u32 + 1, links, want: backends });
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }

    /// Waits until the scheduler reports `f` frontends and `b` backends.
    /// Registered is not yet serving: a backend's GPUs join matchmaking
    /// only once its data links are up (the join gate), so a caller about
    /// to send load waits with [`Self::wait_gpus_online`] too.
    pub fn wait_registered(&self, f: u32, b: u32, deadline: Instant) -> Result<(), ClusterError> {
        loop {
            let m = self.leader().metrics()?;
            let got = (
                metric(&m, "symphony_frontends").unwrap_or(-1.0),
                metric(&m, "symphony_backends").unwrap_or(-1.0),
            );
            if got == (f64::from(f), f64::from(b)) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(ClusterError::Registration { frontends: got.0, want_frontends: f, backends: got.1, want_backends: b });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until the leader has `gpus` GPUs in matchmaking (past the
    /// join gate), so requests sent now find a GPU to plan on.
    pub fn wait_gpus_online(&self, gpus: u32, deadline: Instant) -> Result<(), ClusterError> {
        loop {
            let online = metric(&self.leader().metrics()?, "symphony_gpus_online").unwrap_or(-1.0);
            if online >= f64::from(gpus) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(ClusterError::GpusOnline { online, want: gpus });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Every scheduler, leading or standing by, in order.
    pub fn schedulers(&self) -> impl Iterator<Item = &Daemon> {
        std::iter::once(&self.scheduler).chain(&self.standbys)
    }

    /// Scheduler `i` (0: [`Self::scheduler`]).
    pub fn scheduler_mut(&mut self, i: usize) -> Option<&mut Daemon> {
        match i {
            0 => Some(&mut self.scheduler),
            i => self.standbys.get_mut(i - 1),
        }
    }

    /// Starts scheduler `i` again with its first command line (killed
    /// first if it still runs): a hot standby comes back as a standby.
    pub fn respawn_scheduler(&mut self, i: usize, spec: &ClusterSpec) -> Result<(), ClusterError> {
        let args = self
            .scheduler_cmds
            .get(i)
            .cloned()
            .ok_or_else(|| ClusterError::Etcd(format!("scheduler {i} was not started with an election").into()))?;
        let token = self.join_token.clone();
        let deadline = Instant::now() + spec.start_timeout;
        let name = scheduler_name(i);
        let slot = self.scheduler_mut(i).ok_or_else(|| ClusterError::Etcd(format!("no scheduler {i}").into()))?;
        slot.kill();
        *slot = spawn(spec, &name, "scheduler", args, Some(&token), deadline)?;
        Ok(())
    }

    /// Which scheduler leads and in which term, from their `/metrics`
    /// (the largest `symphony_scheduler_leader_epoch`; a scheduler that
    /// cannot be read does not lead). Without standbys: scheduler 0.
    pub fn leader_index(&self) -> Option<(usize, u64)> {
        if self.standbys.is_empty() {
            return Some((0, 0));
        }
        self.schedulers()
            .enumerate()
            .filter_map(|(i, d)| {
                // Briefly: a stopped (SIGSTOP) scheduler must not stall this.
                let m = http_get(d.addr("metrics").ok()?, "/metrics", Duration::from_millis(300)).ok()?;
                let e = metric(&m, "symphony_scheduler_leader_epoch")?;
                (e > 0.0).then_some((i, e as u64))
            })
            .max_by_key(|(_, e)| *e)
    }

    /// The leading scheduler (scheduler 0 if none can be told).
    pub fn leader(&self) -> &Daemon {
        let i = self.leader_index().map_or(0, |(i, _)| i);
        self.schedulers().nth(i).unwrap_or(&self.scheduler)
    }

    /// Waits until some scheduler leads.
    pub fn wait_leader(&self, deadline: Instant) -> Result<(usize, u64), ClusterError> {
        loop {
            if let Some(l) = self.leader_index() {
                return Ok(l);
            }
            if Instant::now() >= deadline {
                return Err(ClusterError::NotReady { daemon: "a leading scheduler".into() });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The frontends' HTTP addresses.
    pub fn http_addrs(&self) -> Result<Vec<SocketAddr>, ClusterError> {
        self.frontends.iter().map(|f| f.addr("http")).collect()
    }

    /// Each frontend's request outcomes from its `/metrics`: accepted,
    /// succeeded, dropped, failed (NaN where a frontend cannot be read).
    pub fn frontend_outcomes(&self) -> Vec<[f64; 4]> {
        const NAMES: [&str; 4] = [
            "symphony_requests_accepted_total",
            "symphony_requests_succeeded_total",
            "symphony_requests_dropped_total",
            "symphony_requests_failed_total",
        ];
        self.frontends
            .iter()
            .map(|f| {
                let text = f.metrics().ok();
                NAMES.map(|n| text.as_deref().and_then(|t| metric(t, n)).unwrap_or(f64::NAN))
            })
            .collect()
    }

    /// Stops everything: frontends first (they answer what is in flight),
    /// then the scheduler and the backends together (the scheduler drops
    /// what waits; backends finish the batches in hand). Returns an error
    /// naming every daemon that did not exit cleanly (a backend killed on
    /// purpose earlier is not checked).
    pub fn stop(mut self) -> Result<(), ClusterError> {
        let mut problems = Vec::new();
        let check = |d: &mut Daemon, problems: &mut Vec<ClusterError>| match d.wait_or_kill(Duration::from_secs(15)) {
            Ok(s) if s.success() => {}
            Ok(status) => problems.push(ClusterError::ExitedWith { daemon: d.name.clone(), status }),
            Err(e) => problems.push(e),
        };
        for f in &self.frontends {
            f.signal(libc::SIGTERM);
        }
        for f in &mut self.frontends {
            check(f, &mut problems);
        }
        let running: Vec<bool> = self.backends.iter_mut().map(|b| b.try_exit().is_none()).collect();
        let schedulers_up: Vec<bool> = std::iter::once(&mut self.scheduler).chain(&mut self.standbys).map(|d| d.try_exit().is_none()).collect();
        for s in std::iter::once(&self.scheduler).chain(&self.standbys) {
            s.signal(libc::SIGTERM);
        }
        for (b, up) in self.backends.iter().zip(&running) {
            if *up {
                b.signal(libc::SIGTERM);
            }
        }
        for (s, up) in std::iter::once(&mut self.scheduler).chain(&mut self.standbys).zip(schedulers_up) {
            // One killed on purpose (a failover run) is not checked.
            if up {
                check(s, &mut problems);
            }
        }
        for (b, up) in self.backends.iter_mut().zip(running) {
            if up {
                check(b, &mut problems);
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ClusterError::Unclean { problems })
        }
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for d in self
            .frontends
            .iter_mut()
            .chain(self.backends.iter_mut())
            .chain(std::iter::once(&mut self.scheduler))
            .chain(self.standbys.iter_mut())
        {
            if d.try_exit().is_none() {
                let _ = d.child.kill();
                let _ = d.child.wait();
            }
        }
    }
}
