//! Command-line arguments shared by the simulation commands, and their
//! translation into simulator and policy configurations.

use clap::Args;
use dataplane::idle::IdleStrategy;
use dataplane::time::Duration;
use scheduler::baselines::nexus::held_to_nexus_batches;
use scheduler::deferred::Gather;
use scheduler::netdelay::{DelayFileError, NetworkDelay};
use scheduler::deferred::{Departure, DepartureSet};
use scheduler::policy::{PolicyConfig, PolicyError, PolicyKind};
use scheduler::sim::workload::WorkloadParseError;
use scheduler::sim::{Arrival, Popularity, RateSchedule, SimAdmission, SimConfig, Workload};
use scheduler::zoo::{parse_model_arg, parse_zoo_csv, ModelSpec, Zoo, ZooError, ZooSelection};

/// Why the simulation commands' arguments were refused; each variant names
/// the flag or file and the value.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A file named by a flag cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// `--zoo-file` is not a zoo CSV.
    #[error("{path}: {source}")]
    ZooFile {
        /// The file.
        path: String,
        /// Where and what.
        source: ZooError,
    },
    /// `--network-delay` is not a delay file.
    #[error("{path}: {source}")]
    DelayFile {
        /// The file.
        path: String,
        /// What.
        source: DelayFileError,
    },
    /// `--zoo`, `--models` or `--model` is wrong.
    #[error(transparent)]
    Zoo(#[from] ZooError),
    /// No model given.
    #[error("no models: give --zoo 1080ti|a100, --zoo-file FILE or --model NAME=ALPHA_MS,BETA_MS,SLO_MS")]
    NoModels,
    /// `--policy` is wrong.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// `--departures-off` or `--departures-on` names no departure.
    #[error("unknown departure '{name}' (one of: {known})")]
    Departure {
        /// The name given.
        name: String,
        /// The names known.
        known: String,
    },
    /// `--gather` is wrong.
    #[error("unknown gather '{value}' (lazy or early)")]
    Gather {
        /// The value given.
        value: String,
    },
    /// `--arrival`, `--popularity` or `--schedule` is wrong.
    #[error(transparent)]
    Workload(#[from] WorkloadParseError),
    /// `--idle` is not a strategy.
    #[error("unknown idle strategy '{value}' (spin, yield, park)")]
    Idle {
        /// The value given.
        value: String,
    },
    /// A number out of its range.
    #[error("{flag} must be {rule}, got {value}")]
    OutOfRange {
        /// The flag.
        flag: &'static str,
        /// Its range, in words.
        rule: &'static str,
        /// The value given.
        value: f64,
    },
}

/// Parses `--gather`: `lazy` or `early`.
pub fn parse_gather(value: &str) -> Result<Gather, CliError> {
    match value {
        "lazy" => Ok(Gather::Lazy),
        "early" => Ok(Gather::Early),
        other => Err(CliError::Gather { value: other.to_string() }),
    }
}

/// Parses the in-process runtime's `--idle`: `spin`, `yield` or `park`.
pub fn parse_idle(value: &str) -> Result<IdleStrategy, CliError> {
    match value {
        "spin" => Ok(IdleStrategy::Spin),
        "yield" => Ok(IdleStrategy::SpinThenYield { spins: 1000 }),
        "park" => Ok(IdleStrategy::GENTLE),
        other => Err(CliError::Idle { value: other.to_string() }),
    }
}

/// `Err` unless `ok`.
pub fn check(ok: bool, flag: &'static str, rule: &'static str, value: f64) -> Result<(), CliError> {
    if ok {
        Ok(())
    } else {
        Err(CliError::OutOfRange { flag, rule, value })
    }
}

/// Cluster, models, workload and policy.
#[derive(Args, Debug, Clone)]
pub struct ClusterArgs {
    /// Scheduling policy: deferred, eager, eager-early, eager-latest-start,
    /// eager-latest-start-early, clockwork, clockwork-any, clockwork-paper,
    /// shepherd, shepherd-flex (Flex without preemption), timeout, nexus,
    /// algorithm1 (the paper's Algorithm 1 as written).
    #[arg(long, default_value = "deferred")]
    pub policy: String,
    /// Batch gathering of the deferred policy: lazy or early.
    #[arg(long, default_value = "early")]
    pub gather: String,
    /// Number of emulated GPUs.
    #[arg(long, default_value_t = 8)]
    pub gpus: u32,
    /// Arrival process: poisson, uniform, gamma:SHAPE.
    #[arg(long, default_value = "poisson")]
    pub arrival: String,
    /// Popularity across models: equal or zipf:S.
    #[arg(long, default_value = "equal")]
    pub popularity: String,
    /// Rate schedule as SECONDS:MULTIPLIER,... (piecewise constant).
    #[arg(long)]
    pub schedule: Option<String>,
    /// Seed of all randomness.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Simulated seconds of arrivals.
    #[arg(long = "duration-s", default_value_t = 10.0)]
    pub duration_s: f64,
    /// Seconds at the start that are not measured (default: 10% of the duration, at most 2 s).
    #[arg(long = "warmup-s")]
    pub warmup_s: Option<f64>,
    /// Timeout policy's k, milliseconds: one for every model, or one per model in model order (as `report grid` prints them).
    #[arg(long = "timeout-ms", value_delimiter = ',', default_value = "5")]
    pub timeout_ms: Vec<f64>,
    /// Model zoo: 1080ti or a100.
    #[arg(long)]
    pub zoo: Option<String>,
    /// Models of the zoo (or of --zoo-file): all, strong, weak, or NAME,NAME,... (`--zoo-models`: the old spelling, kept hidden for one release).
    #[arg(long = "models", alias = "zoo-models", default_value = "all")]
    pub zoo_models: String,
    /// A zoo CSV file (name,alpha_ms,beta_ms,slo_ms) instead of an embedded zoo.
    #[arg(long = "zoo-file")]
    pub zoo_file: Option<String>,
    /// A model as NAME=ALPHA_MS,BETA_MS,SLO_MS (repeatable).
    #[arg(long = "model")]
    pub model: Vec<String>,
    /// Repeat the model list this many times (e.g. 10 copies of one profile).
    #[arg(long = "model-copies", default_value_t = 1)]
    pub model_copies: u32,
    /// Network delay calibration file (TOML from `netbench calibrate`).
    #[arg(long = "network-delay")]
    pub network_delay: Option<String>,
    /// Network delay d_ctrl in microseconds (overrides the file).
    #[arg(long = "d-ctrl-us")]
    pub d_ctrl_us: Option<f64>,
    /// Network delay d_data in microseconds per input (overrides the file).
    #[arg(long = "d-data-us")]
    pub d_data_us: Option<f64>,
    /// Deferred: the simulated scheduler's narrowest schedulable window, µs (0: a simulation has no timer lateness; the daemon's --min-window-us is its process's).
    #[arg(long = "sim-min-window-us", default_value_t = 0.0)]
    pub min_window_us: f64,
    /// Deferred: the window is at least this many expected inter-arrival gaps wide (0 = the paper's plain frontrun).
    #[arg(long = "window-gaps", default_value_t = scheduler::deferred::DEFAULT_WINDOW_GAPS)]
    pub window_gaps: f64,
    /// Deferred early drop: drop a head only when it would force a batch whose throughput per GPU is below this fraction of the target batch's (the shortfall widens with the squared CV of the arrival gaps when above 1).
    #[arg(long = "early-drop-fraction", default_value_t = scheduler::deferred::DEFAULT_EARLY_DROP_FRACTION)]
    pub early_drop_fraction: f64,
    /// Deferred: stop deferring once the batch runs within this fraction of the best throughput per GPU the arrival rate (early drop's target batch) and the SLO allow.
    #[arg(long = "efficiency-slack", default_value_t = scheduler::deferred::DEFAULT_EFFICIENCY_SLACK)]
    pub efficiency_slack: f64,
    /// Deferred: these departures from Algorithm 1 off, comma-separated (names as `report ablation` prints them; docs/decisions.md says what each does).
    #[arg(long = "departures-off", default_value = "")]
    pub departures_off: String,
    /// Deferred: these departures on besides the default set (light-load is the one off by default).
    #[arg(long = "departures-on", default_value = "")]
    pub departures_on: String,
    /// Share of requests at priority 1 (high); the rest at priority 2 (0 = no priorities).
    #[arg(long = "priority-mix", default_value_t = 0.0)]
    pub priority_mix: f64,
    /// Every model's queue bound: a request over it is refused at once (0 = unbounded).
    #[arg(long = "max-queue", default_value_t = 0)]
    pub max_queue: u32,
    /// Nexus: number of routing frontends.
    #[arg(long = "nexus-frontends", default_value_t = 1)]
    pub nexus_frontends: u32,
    /// Nexus: no backup GPUs (overflow stays on the routed GPU, as in the paper's description).
    #[arg(long = "nexus-no-backups")]
    pub nexus_no_backups: bool,
    /// Nexus: plan on the fewest GPUs and leave the others idle (Nexus's own objective), instead of scaling the planned rates up to the whole cluster.
    #[arg(long = "nexus-fewest-gpus")]
    pub nexus_fewest_gpus: bool,
    /// Hold every model's batch to Nexus's largest (the largest that runs within half the SLO), for any policy: a bound on what a scheduler bound to Nexus's batches can do.
    #[arg(long = "nexus-batch-cap")]
    pub nexus_batch_cap: bool,
}

impl ClusterArgs {
    /// The models named by `--zoo`/`--zoo-file`/`--model`.
    pub fn models(&self) -> Result<Vec<ModelSpec>, CliError> {
        let mut models = Vec::new();
        if let Some(path) = &self.zoo_file {
            let text = std::fs::read_to_string(path).map_err(|source| CliError::Read { path: path.clone(), source })?;
            let all = parse_zoo_csv(&text).map_err(|source| CliError::ZooFile { path: path.clone(), source })?;
            models.extend(ZooSelection::parse(&self.zoo_models).select(all)?);
        }
        if let Some(z) = &self.zoo {
            let zoo = Zoo::parse(z)?;
            models.extend(ZooSelection::parse(&self.zoo_models).select(zoo.models())?);
        }
        for m in &self.model {
            models.push(parse_model_arg(m)?);
        }
        if models.is_empty() {
            return Err(CliError::NoModels);
        }
        if self.nexus_batch_cap {
            models = held_to_nexus_batches(&models);
        }
        if self.model_copies > 1 {
            let base = models.clone();
            models.clear();
            for c in 0..self.model_copies {
                for m in &base {
                    let mut m = m.clone();
                    m.name = format!("{}#{c}", m.name);
                    models.push(m);
                }
            }
        }
        Ok(models)
    }

    /// The network delay bound.
    pub fn delay(&self) -> Result<NetworkDelay, CliError> {
        let mut d = match &self.network_delay {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| CliError::Read { path: path.clone(), source })?;
                NetworkDelay::from_toml(&text).map_err(|source| CliError::DelayFile { path: path.clone(), source })?
            }
            None => NetworkDelay::ZERO,
        };
        if let Some(us) = self.d_ctrl_us {
            d.d_ctrl = Duration::from_secs_f64(us.max(0.0) * 1e-6);
        }
        if let Some(us) = self.d_data_us {
            d.d_data = Duration::from_secs_f64(us.max(0.0) * 1e-6);
        }
        Ok(d)
    }

    /// The policy configuration.
    pub fn policy(&self) -> Result<PolicyConfig, CliError> {
        let mut p = PolicyConfig::new(PolicyKind::parse(&self.policy)?);
        p.gather = parse_gather(&self.gather)?;
        for &k in &self.timeout_ms {
            check(k.is_finite() && k >= 0.0, "--timeout-ms", ">= 0", k)?;
        }
        let ks: Vec<Duration> = self.timeout_ms.iter().map(|&k| Duration::from_millis_f64(k)).collect();
        p.timeout = ks.first().copied().unwrap_or(p.timeout);
        if ks.len() > 1 {
            p.timeouts = ks;
        }
        p.delay = self.delay()?;
        p.nexus_frontends = self.nexus_frontends.max(1);
        p.nexus_backups = !self.nexus_no_backups;
        p.nexus_fill_cluster = !self.nexus_fewest_gpus;
        check(self.min_window_us.is_finite() && self.min_window_us >= 0.0, "--sim-min-window-us", ">= 0", self.min_window_us)?;
        p.min_window = Duration::from_secs_f64(self.min_window_us * 1e-6);
        check(self.window_gaps.is_finite() && self.window_gaps >= 0.0, "--window-gaps", ">= 0", self.window_gaps)?;
        p.window_gaps = self.window_gaps;
        let f = self.early_drop_fraction;
        check(f.is_finite() && (0.0..=1.0).contains(&f), "--early-drop-fraction", "within [0, 1]", f)?;
        p.early_drop_fraction = self.early_drop_fraction;
        let s = self.efficiency_slack;
        check(s.is_finite() && (0.0..1.0).contains(&s), "--efficiency-slack", "within [0, 1)", s)?;
        p.efficiency_slack = self.efficiency_slack;
        let on = departures_named(&self.departures_on)?.iter().fold(DepartureSet::default(), |s, d| s.with(*d));
        p.departures = departures_named(&self.departures_off)?.iter().fold(on, |s, d| s.without(*d));
        Ok(p)
    }

    /// The simulator configuration at total rate `rate_rps`.
    pub fn sim(&self, rate_rps: f64) -> Result<SimConfig, CliError> {
        check(self.gpus > 0, "--gpus", "at least 1", f64::from(self.gpus))?;
        check(self.duration_s.is_finite() && self.duration_s > 0.0, "--duration-s", "> 0", self.duration_s)?;
        check(rate_rps.is_finite() && rate_rps >= 0.0, "--rate", ">= 0", rate_rps)?;
        let warmup = self.warmup_s.unwrap_or((self.duration_s * 0.1).min(2.0));
        check(warmup.is_finite() && warmup >= 0.0 && warmup < self.duration_s, "--warmup-s", ">= 0 and shorter than the duration", warmup)?;
        let schedule = match &self.schedule {
            Some(s) => RateSchedule::parse(s)?,
            None => RateSchedule::default(),
        };
        check((0.0..=1.0).contains(&self.priority_mix), "--priority-mix", "a share in [0, 1]", self.priority_mix)?;
        Ok(SimConfig {
            models: self.models()?,
            gpus: self.gpus,
            workload: Workload {
                rate_rps,
                arrival: Arrival::parse(&self.arrival)?,
                popularity: Popularity::parse(&self.popularity)?,
                schedule,
            },
            duration: Duration::from_secs_f64(self.duration_s),
            warmup: Duration::from_secs_f64(warmup),
            seed: self.seed,
            trace: None,
            admission: SimAdmission { priority_mix: self.priority_mix, max_queue: self.max_queue },
        })
    }
}

/// The departures named in `list` (comma-separated; empty names skipped).
fn departures_named(list: &str) -> Result<Vec<Departure>, CliError> {
    let known = || Departure::ALL.iter().map(|d| d.name()).collect::<Vec<_>>().join(", ");
    list.split(',').map(str::trim).filter(|n| !n.is_empty()).map(|n| Departure::parse(n).ok_or_else(|| CliError::Departure { name: n.to_string(), known: known() })).collect()
}

/// The default departure set with those named in `list` off.
pub fn departures_off(list: &str) -> Result<DepartureSet, CliError> {
    Ok(departures_named(list)?.iter().fold(DepartureSet::default(), |s, d| s.without(*d)))
}
