//! The command line of `symphony-scheduler` (its own options plus the
//! shell's [`CommonArgs`]) and its resolution into a [`SchedulerConfig`].
//! Loading (flags, `SYMPHONY_*` variables, `--config` file) is
//! [`node_shell::load`]'s.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use dataplane::control::TransportKind;
use dataplane::join::TOKEN_ENV;
use node_shell::{Common, CommonArgs, ConfigError};
use dataplane::time::Duration;

use super::engine::EngineKind;
use super::node::Membership;
use crate::runtime::PinnedConfig;
use crate::closed_loop::LoopConfig;
use crate::deferred::{CoreConfig, Departure, DepartureSet};
use crate::delay_watch::DelayWatchConfig;
use crate::netdelay::NetworkDelay;
use crate::zoo::{ModelListArgs, ModelSpec};

/// Command line of `symphony-scheduler`.
#[derive(Parser, Debug)]
#[command(name = "symphony-scheduler", about = "The Symphony centralized scheduler daemon")]
pub struct SchedulerArgs {
    /// Control address to listen on (tcp: HOST:PORT; shm: a socket path or
    /// "@name"; default: a fresh one, printed on the READY line).
    #[arg(long)]
    pub listen: Option<String>,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub model_list: ModelListArgs,
    /// A sub-cluster: comma-separated model names (repeatable) [default: one with every model].
    #[arg(long)]
    pub subcluster: Vec<String>,
    /// Network delay calibration (netbench calibrate's TOML); replaces
    /// --control-delay-us.
    #[arg(long)]
    pub network_delay: Option<PathBuf>,
    /// Narrowest schedulable window: this process's timer lateness bound, µs.
    #[arg(long, default_value_t = 2000.0)]
    pub min_window_us: f64,
    /// On shutdown, wait at most this long for batches in flight, ms.
    #[arg(long, default_value_t = 2000)]
    pub drain_ms: u64,
    /// Let any peer that reaches the port join, without a token (a test
    /// setup on a trusted host only).
    #[arg(long)]
    pub open_membership: bool,
    /// Most live frontends [default: 4096, the id bound].
    #[arg(long)]
    pub max_frontends: Option<usize>,
    /// Most live backends [default: the id bound].
    #[arg(long)]
    pub max_backends: Option<usize>,
    /// Most links registering at once [default: 256].
    #[arg(long)]
    pub max_registering: Option<usize>,
    /// Closed loop: correct GPU free times and plan with the profile
    /// ratios learned from backends' batch reports (`off`: the estimates
    /// are still kept and exported, scheduling is open loop).
    #[arg(long, value_enum, default_value_t = Switch::On)]
    pub closed_loop: Switch,
    /// Light load (deferred item 32): while a GPU idles, a batch whose
    /// model runs at a small share of a GPU, or whose deferral would buy
    /// little throughput, starts now instead of waiting toward its latest
    /// start (issue 54: the c=1 queue tax). `symphony up
    /// --model-repository` turns it on; off keeps Algorithm 1's deferral.
    #[arg(long, value_enum, default_value_t = Switch::Off)]
    pub light_load: Switch,
    /// Percentile of backends' per-input READ costs held against the
    /// delay bound.
    #[arg(long, default_value_t = 99.0)]
    pub read_bound_percentile: f64,
    /// Batch reports per delay-bound verdict.
    #[arg(long, default_value_t = 1000)]
    pub read_bound_window: u32,
    /// Raise the per-input delay bound to the observed READ tail when it
    /// exceeds it (never lowered automatically).
    #[arg(long)]
    pub adopt_read_bound: bool,
    /// Benchmark only (`symphony bench-cluster`, one host): take peers'
    /// clock stamps and stamp plans, comparing CLOCK_MONOTONIC readings
    /// across processes.
    #[arg(long)]
    pub bench_stamps: bool,
    /// Where the scheduling cores run: `pinned` (ModelThreads and a
    /// RankThread of their own, fed through rings) or `inline` (on the I/O
    /// thread).
    #[arg(long, value_enum, default_value_t = EngineKind::Pinned)]
    pub engine: EngineKind,
    /// ModelThreads per sub-cluster (pinned engine; at most one per model).
    #[arg(long, default_value_t = 1)]
    pub model_threads: usize,
    /// CPUs for the runtime's threads, in order: each sub-cluster's
    /// ModelThreads then its RankThread (comma-separated CPU ids; `none`:
    /// no pinning). Threads past the list run unpinned.
    #[arg(long, default_value = "none")]
    pub pin_cores: String,
    /// Where the RankThread runs (pinned engine): `own` thread, or
    /// `shared` with ModelThread 0 (one thread hand-off less per decision;
    /// for machines with few cores).
    #[arg(long, value_enum, default_value_t = RankThread::Shared)]
    pub rank_thread: RankThread,
    /// Most requests handed to a ModelThread and not yet taken by it (pinned
    /// engine); beyond, new tasks are refused at once as overloaded. Keeps
    /// the wait in front of the cores a few ms under overload instead of
    /// the ring's full 65,536 slots (a whole SLO and more: every task late).
    #[arg(long = "ingress-bound", default_value_t = crate::runtime::INGRESS_BOUND)]
    pub ingress_bound: usize,
    /// Most requests waiting per model queue (0: the built-in bound,
    /// 65,536); the excess is refused at once as overloaded (issue 17).
    #[arg(long, default_value_t = 0)]
    pub max_queue: u32,
    /// Priority levels of every model (1: none), the default level the
    /// lowest (a request naming no priority ranks last); a model's
    /// config.pbtxt under `--model-repository` overrides it (issue 17).
    #[arg(long, default_value_t = 1)]
    pub priority_levels: u16,
    /// Models with several priority levels: batches holding higher-level
    /// requests are planned to finish this long before their deadline, as
    /// far as lower-level requests go (`CoreConfig::priority_reserve`), µs:
    /// the timing slack the higher levels keep against a late start or a
    /// slow answer (no effect with one level).
    #[arg(long, default_value_t = 2000.0)]
    pub priority_reserve_us: f64,
    /// A Triton-layout model repository: each of its models' config.pbtxt
    /// `dynamic_batching` (priority levels, default level,
    /// `default_queue_policy.max_queue_size`) is that model's admission
    /// here; `--max-queue` bounds the models it leaves unbounded.
    #[arg(long = "model-repository")]
    pub model_repository: Option<std::path::PathBuf>,
    /// Hot standby (issue 18): etcd client endpoints, comma-separated. With
    /// them this scheduler stands for election and serves only while it
    /// leads; without, it leads alone (epoch 0), as the embedded default.
    #[arg(long)]
    pub etcd: Option<String>,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub etcd_tls: crate::election::EtcdTlsArgs,
    /// The leadership key in etcd (one per cluster).
    #[arg(long, default_value = "/symphony/scheduler/leader")]
    pub election_key: String,
    /// UDP address for leader/standby heartbeats (reachable by the other
    /// schedulers; port 0: any).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub election_listen: SocketAddr,
    /// Leader/standby heartbeat and lease renewal interval, ms.
    #[arg(long, default_value_t = 20)]
    pub election_heartbeat_ms: u64,
    /// A standby that hears nothing from the leader this long revokes its
    /// lease and takes over, ms.
    #[arg(long, default_value_t = 120)]
    pub failure_timeout_ms: u64,
    /// The etcd lease's time to live, ms (whole seconds in etcd): how long
    /// a leader cut off from etcd keeps serving before it steps down. Longer
    /// than etcd's own raft election (0.7-1.1 s measured with a 500 ms
    /// election timeout), so that losing one etcd member of three, even its
    /// raft leader, never costs the scheduler its leadership. Takeover after
    /// a crash does not wait for it (the standby revokes the lease).
    #[arg(long, default_value_t = 2000)]
    pub lease_ttl_ms: u64,
    /// Several active schedulers (issue 19): this scheduler's group in the
    /// routing table stored in etcd (needs --etcd; give --election-key a
    /// key of the group's own). It plans only the models the table gives
    /// its group at the newest revision it has read.
    #[arg(long)]
    pub group: Option<String>,
    /// The routing table's key in etcd.
    #[arg(long, default_value = crate::routes::DEFAULT_ROUTES_KEY)]
    pub routes_key: String,
    /// How often the routing table is re-read, ms.
    #[arg(long, default_value_t = 50)]
    pub routes_poll_ms: u64,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: CommonArgs,
}

/// `--rank-thread`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RankThread {
    /// A thread of its own.
    Own,
    /// On ModelThread 0's thread.
    Shared,
}

/// An on/off option.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Switch {
    /// Enabled.
    On,
    /// Disabled.
    Off,
}

/// The control delay bound when neither a calibration nor
/// `--control-delay-us` gives one.
pub const DEFAULT_CONTROL_DELAY: Duration = Duration::from_micros(1000);

/// The resolved configuration.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Listen address.
    pub listen: String,
    /// Transport.
    pub transport: TransportKind,
    /// Models (global id = index).
    pub models: Vec<ModelSpec>,
    /// Sub-clusters as lists of global model ids.
    pub subclusters: Vec<Vec<u32>>,
    /// Scheduling core configuration (delay and min window included).
    pub core: CoreConfig,
    /// Heartbeat interval.
    pub heartbeat: Duration,
    /// Silence that makes a peer dead.
    pub dead_after: Duration,
    /// Idle strategy.
    pub idle: dataplane::idle::IdleStrategy,
    /// Metrics address.
    pub metrics: SocketAddr,
    /// Shutdown drain bound.
    pub drain: Duration,
    /// The join token and the registration limits.
    pub membership: Membership,
    /// The closed loop over backends' batch reports.
    pub closed_loop: LoopConfig,
    /// The online check of the delay bound against observed READs.
    pub delay_watch: DelayWatchConfig,
    /// Benchmark-only clock stamps (`--bench-stamps`).
    pub bench_stamps: bool,
    /// Where the scheduling cores run.
    pub engine: EngineKind,
    /// The pinned engine's threads, cores and idle strategy (the shell's
    /// `--idle`).
    pub pinned: PinnedConfig,
    /// Each model's admission (by global model id): its config.pbtxt's
    /// under `--model-repository`, else `--max-queue`'s bound.
    pub admissions: Vec<crate::types::Admission>,
    /// Hot standby: the election (`--etcd`); `None`: lead alone.
    pub election: Option<super::ha::ElectionConfig>,
    /// Several active schedulers: this one's group and where the routing
    /// table is (`--group`); `None`: it owns every model.
    pub routes: Option<super::routes_watch::RoutesConfig>,
}

impl SchedulerArgs {
    /// Checks every scheduler option; `common` is the resolved shared part.
    pub fn resolve(self, common: Common) -> Result<SchedulerConfig, ConfigError> {
        let mut models = self.model_list.resolve().map_err(|e| ConfigError::invalid(ModelListArgs::FLAGS, e))?;
        let subclusters = subclusters(&self.subcluster, &models)?;
        let delay = match &self.network_delay {
            Some(p) => {
                let bad = |why: String| ConfigError::invalid("network-delay", format!("{}: {why}", p.display()));
                let text = std::fs::read_to_string(p).map_err(|e| bad(e.to_string()))?;
                NetworkDelay::from_toml(&text).map_err(|e| bad(e.to_string()))?
            }
            None => NetworkDelay {
                d_ctrl: common.control_delay.unwrap_or(DEFAULT_CONTROL_DELAY),
                d_data: Duration::ZERO,
            },
        };
        let w = self.min_window_us;
        if !(w.is_finite() && (0.0..=1e6).contains(&w)) {
            return Err(ConfigError::invalid("min-window-us", format!("{w}: must be in [0, 1e6]")));
        }
        let r = self.priority_reserve_us;
        if !(r.is_finite() && (0.0..=1e6).contains(&r)) {
            return Err(ConfigError::invalid("priority-reserve-us", format!("{r}: must be in [0, 1e6]")));
        }
        let core = CoreConfig {
            delay,
            min_window: Duration::from_nanos((w * 1000.0) as u64),
            priority_reserve: Duration::from_nanos((r * 1000.0) as u64),
            departures: match self.light_load {
                Switch::On => DepartureSet::default().with(Departure::LightLoad),
                Switch::Off => DepartureSet::default(),
            },
            ..CoreConfig::default()
        };
        let membership = self.membership(&common)?;
        let p = self.read_bound_percentile;
        if !(p.is_finite() && p > 0.0 && p <= 100.0) {
            return Err(ConfigError::invalid("read-bound-percentile", format!("{p}: must be in (0, 100]")));
        }
        if self.read_bound_window == 0 {
            return Err(ConfigError::invalid("read-bound-window", "must be at least 1"));
        }
        let closed_loop = LoopConfig { enabled: self.closed_loop == Switch::On, ..LoopConfig::default() };
        let delay_watch = DelayWatchConfig { percentile: p, window: self.read_bound_window, adopt: self.adopt_read_bound };
        if !(2..=crate::runtime::INGRESS_SLOTS).contains(&self.ingress_bound) {
            return Err(ConfigError::invalid("ingress-bound", format!("{}: must be 2..={}", self.ingress_bound, crate::runtime::INGRESS_SLOTS)));
        }
        if !(1..=256).contains(&self.model_threads) {
            return Err(ConfigError::invalid("model-threads", format!("{}: must be 1..=256", self.model_threads)));
        }
        if self.priority_levels == 0 {
            return Err(ConfigError::invalid("priority-levels", "must be at least 1"));
        }
        let default = crate::types::Admission { levels: self.priority_levels, default_level: self.priority_levels, max_queue: self.max_queue };
        let admissions = apply_repository(&mut models, default, self.model_repository.as_deref())?;
        let election = self.election(&common)?;
        let routes = match (&self.group, &election) {
            (None, _) => None,
            (Some(_), None) => return Err(ConfigError::invalid("group", "a scheduler group reads the routing table from etcd: give --etcd")),
            (Some(_), Some(_)) if self.routes_poll_ms == 0 => return Err(ConfigError::invalid("routes-poll-ms", "must be positive")),
            (Some(group), Some(e)) => Some(super::routes_watch::RoutesConfig {
                endpoints: e.endpoints.clone(),
                group: group.clone(),
                key: self.routes_key.clone(),
                poll: Duration::from_millis(self.routes_poll_ms),
                tls: e.tls.clone(),
            }),
        };
        let pinned = PinnedConfig {
            model_threads: self.model_threads,
            cores: pin_cores(&self.pin_cores)?,
            idle: common.idle,
            shared_rank: self.rank_thread == RankThread::Shared,
            ingress_bound: self.ingress_bound,
        };
        Ok(SchedulerConfig {
            listen: self
                .listen
                .unwrap_or_else(|| common.transport.ephemeral_listen("127.0.0.1")),
            transport: common.transport,
            models,
            subclusters,
            core,
            heartbeat: common.heartbeat,
            dead_after: common.dead_after,
            idle: common.idle,
            metrics: common.metrics,
            drain: Duration::from_millis(self.drain_ms),
            membership,
            closed_loop,
            delay_watch,
            bench_stamps: self.bench_stamps,
            engine: self.engine,
            pinned,
            admissions,
            routes,
            election,
        })
    }

    /// The election options, checked (`None` without `--etcd`).
    fn election(&self, common: &Common) -> Result<Option<super::ha::ElectionConfig>, ConfigError> {
        let Some(list) = &self.etcd else {
            if self.etcd_tls.etcd_ca.is_some() || self.etcd_tls.etcd_cert.is_some() {
                return Err(ConfigError::invalid("etcd-ca", "TLS settings for etcd without --etcd"));
            }
            return Ok(None);
        };
        let endpoints = dataplane::reconnect::split_addrs(list);
        if endpoints.is_empty() {
            return Err(ConfigError::invalid("etcd", "no endpoint given"));
        }
        let (hb, ft, ttl) = (self.election_heartbeat_ms, self.failure_timeout_ms, self.lease_ttl_ms);
        if hb == 0 || ft <= 2 * hb || ttl <= ft + hb {
            return Err(ConfigError::invalid(
                "failure-timeout-ms",
                format!("heartbeat {hb} ms, failure timeout {ft} ms, lease {ttl} ms: need 0 < 2 x heartbeat < failure timeout < lease - heartbeat"),
            ));
        }
        // Peers find a new leader by its address: it must be fixed, not a
        // fresh one picked at start.
        match &self.listen {
            Some(l) if !l.ends_with(":0") => {}
            _ => {
                return Err(ConfigError::invalid(
                    "listen",
                    format!("--etcd needs a fixed --listen address (peers are given every scheduler's), transport {}", common.transport.name()),
                ))
            }
        }
        Ok(Some(super::ha::ElectionConfig {
            endpoints,
            key: self.election_key.clone(),
            listen: self.election_listen,
            heartbeat: Duration::from_millis(hb),
            failure_timeout: Duration::from_millis(ft),
            lease_ttl: Duration::from_millis(ttl),
            tls: self.etcd_tls.load().map_err(|(flag, why)| ConfigError::invalid(flag, why))?,
        }))
    }

    /// The join token (or open membership) and the registration limits.
    fn membership(&self, common: &Common) -> Result<Membership, ConfigError> {
        let mut m = match (common.join_token.clone(), self.open_membership) {
            (Some(_), true) => {
                return Err(ConfigError::invalid(
                    "open-membership",
                    "a join token and --open-membership exclude each other",
                ))
            }
            (Some(t), false) => Membership::with_token(t),
            (None, true) => Membership::open(),
            (None, false) => {
                return Err(ConfigError::invalid(
                    "join-token-file",
                    format!("no join token: give --join-token-file PATH or set {TOKEN_ENV} (or --open-membership to let any peer join)"),
                ))
            }
        };
        let limit = |v: Option<usize>, name: &str, default: usize, max: usize| match v {
            None => Ok(default),
            Some(n) if (1..=max).contains(&n) => Ok(n),
            Some(n) => Err(ConfigError::invalid(name, format!("{n}: must be 1..={max}"))),
        };
        m.max_frontends = limit(self.max_frontends, "max-frontends", m.max_frontends, m.max_frontends)?;
        m.max_backends = limit(self.max_backends, "max-backends", m.max_backends, m.max_backends)?;
        m.max_pending = limit(self.max_registering, "max-registering", m.max_pending, 65536)?;
        Ok(m)
    }
}

/// `--pin-cores`: CPU ids, or `none`.
fn pin_cores(list: &str) -> Result<Vec<usize>, ConfigError> {
    let list = list.trim();
    if list.is_empty() || list == "none" {
        return Ok(Vec::new());
    }
    list.split(',')
        .map(|c| {
            c.trim()
                .parse::<usize>()
                .ok()
                .filter(|&c| c < 1024)
                .ok_or_else(|| ConfigError::invalid("pin-cores", format!("'{c}': want CPU ids (0..1024) separated by commas, or none")))
        })
        .collect()
}

/// Each model's admission: `default` (levels and queue bound), and a model
/// of `repo` named like one of `models` takes its config.pbtxt's
/// `dynamic_batching` (keeping `default`'s bound where that sets none) and
/// has its profile capped at the config's `max_batch_size` (at least 1): the
/// backends' executors refuse larger batches, so a plan above it would fail
/// every request in it (issue 54). A repository that cannot be read is
/// refused; a model the repository refuses (broken config) keeps the
/// defaults, as the frontends and backends will not serve it either.
fn apply_repository(models: &mut [ModelSpec], default: crate::types::Admission, repo: Option<&std::path::Path>) -> Result<Vec<crate::types::Admission>, ConfigError> {
    let max_queue = default.max_queue;
    let mut out = vec![default; models.len()];
    let Some(repo) = repo else { return Ok(out) };
    let scanned = crate::repository::scan(repo).map_err(|e| ConfigError::invalid("model-repository", e.to_string()))?;
    for m in &scanned.models {
        let Some(i) = models.iter().position(|s| s.name == m.name()) else { continue };
        let spec = &mut models[i];
        spec.profile = spec.profile.clone().capped(m.config.max_batch_size.max(1));
        let Some(db) = &m.config.dynamic_batching else { continue };
        let mut a = db.admission();
        if a.max_queue == 0 {
            a.max_queue = max_queue;
        }
        out[i] = a;
    }
    Ok(out)
}

/// `--subcluster` lists as global model ids (default: one with every model).
fn subclusters(groups: &[String], models: &[ModelSpec]) -> Result<Vec<Vec<u32>>, ConfigError> {
    if groups.is_empty() {
        return Ok(vec![(0..models.len() as u32).collect()]);
    }
    groups
        .iter()
        .map(|g| {
            g.split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(|n| {
                    models
                        .iter()
                        .position(|m| m.name == n)
                        .map(|i| i as u32)
                        .ok_or_else(|| ConfigError::invalid("subcluster", format!("unknown model '{n}'")))
                })
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Admission;

    fn write_model(root: &std::path::Path, name: &str, dynamic_batching: &str) {
        let dir = root.join(name);
        std::fs::create_dir_all(dir.join("1")).unwrap();
        std::fs::write(dir.join("1").join("model.onnx"), b"not read here").unwrap();
        let config = format!(
            "name: \"{name}\"\nplatform: \"onnxruntime_onnx\"\nmax_batch_size: 8\n\
             input [ {{ name: \"x\", data_type: TYPE_FP32, dims: [ 4 ] }} ]\n\
             output [ {{ name: \"y\", data_type: TYPE_FP32, dims: [ 2 ] }} ]\n{dynamic_batching}\n"
        );
        std::fs::write(dir.join("config.pbtxt"), config).unwrap();
    }

    #[test]
    fn each_model_takes_its_admission_from_the_repository_and_max_queue_fills_the_rest() {
        let root = std::env::temp_dir().join(format!("symphony-sched-admission-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        write_model(&root, "bounded", "dynamic_batching { priority_levels: 2 default_priority_level: 2 default_queue_policy { max_queue_size: 64 } }");
        write_model(&root, "levels", "dynamic_batching { priority_levels: 3 }");
        write_model(&root, "plain", "");
        write_model(&root, "unknown", "dynamic_batching { default_queue_policy { max_queue_size: 5 } }");
        let mut models: Vec<ModelSpec> = ["bounded", "levels", "plain", "absent"]
            .iter()
            .map(|n| ModelSpec::linear(n, 1.0, 2.0, 50.0).unwrap())
            .collect();
        let got = apply_repository(&mut models, Admission { max_queue: 16, ..Admission::default() }, Some(&root)).unwrap();
        let bounded = |max_queue| Admission { max_queue, ..Admission::default() };
        assert_eq!(got[0], Admission { levels: 2, default_level: 2, max_queue: 64 });
        assert_eq!(got[1], Admission { levels: 3, default_level: 3, max_queue: 16 });
        assert_eq!(got[2], bounded(16));
        assert_eq!(got[3], bounded(16));
        assert_eq!(apply_repository(&mut models, Admission::default(), None).unwrap(), vec![Admission::default(); 4]);
        let two = Admission { levels: 2, default_level: 2, max_queue: 0 };
        assert_eq!(apply_repository(&mut models, two, None).unwrap(), vec![two; 4]);
        assert!(apply_repository(&mut models, Admission::default(), Some(&root.join("missing"))).is_err());
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// The largest batch of each model the deferred scheduler dispatches
    /// under an overload of `specs` on one GPU (seeded, virtual time).
    fn largest_batches(specs: &[ModelSpec]) -> Vec<usize> {
        struct Largest(Vec<usize>);
        impl crate::sim::BatchObserver for Largest {
            fn on_batch(&mut self, _: dataplane::time::Instant, _: crate::types::GpuId, model: u32, _: dataplane::time::Instant, members: &[crate::types::Request]) {
                let seen = &mut self.0[model as usize];
                *seen = (*seen).max(members.len());
            }
        }
        let cfg = crate::sim::SimConfig {
            models: specs.to_vec(),
            gpus: 1,
            workload: crate::sim::Workload::poisson(20_000.0),
            duration: Duration::from_millis(500),
            warmup: Duration::from_millis(50),
            seed: 54,
            trace: None,
            admission: Default::default(),
        };
        let policy = crate::policy::PolicyConfig::new(crate::policy::PolicyKind::Deferred);
        let mut sched = crate::policy::build(specs, 1, &policy).unwrap();
        let mut seen = Largest(vec![0; specs.len()]);
        crate::sim::simulate_observed(&cfg, sched.as_mut(), &mut seen).unwrap();
        seen.0
    }

    #[test]
    fn a_repository_model_never_gets_a_batch_above_its_max_batch_size() {
        let root = std::env::temp_dir().join(format!("symphony-sched-max-batch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        write_model(&root, "capped", "");
        // l(b) = 0.1b + 0.1 ms under a 100 ms SLO: the SLO alone allows
        // batches far above the config's max_batch_size of 8.
        let generous = ModelSpec::linear("capped", 0.1, 0.1, 100.0).unwrap();
        assert!(generous.profile.max_batch() > 8);
        // Without the repository, the overload forms batches above 8 ...
        assert!(largest_batches(std::slice::from_ref(&generous))[0] > 8);
        // ... and with it, the profile and every dispatched batch stop at 8.
        let mut models = vec![generous];
        apply_repository(&mut models, Admission::default(), Some(&root)).unwrap();
        assert_eq!(models[0].profile.max_batch(), 8);
        assert_eq!(largest_batches(&models), vec![8]);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
