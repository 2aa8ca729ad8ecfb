//! Command line and config file of `symphony-backend`.
//!
//! One struct serves both: clap reads the flags, serde reads the TOML file
//! (keys = long flag names with '_' for '-'), and [`Args::resolve`] merges
//! them (a flag overrides the file) and checks every value, so a bad
//! configuration is one clear message before anything starts.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use dataplane::control::{parse_idle, TransportKind};
use dataplane::idle::IdleStrategy;
use dataplane::join::JoinToken;
use dataplane::time::Duration;
use dataplane::wire;
use scheduler::zoo::{cluster_models, ModelSpec};
use scheduler::repository;
use serde::Deserialize;

use crate::exec::onnx::OnnxModel;

/// The default tensors' sizes, defined once for frontends and backends: an
/// input slot must hold the largest input any frontend stages.
pub use dataplane::reference::{DEFAULT_INPUT_BYTES, DEFAULT_OUTPUT_BYTES};

/// Frontend ids are below `MAX_FRONTENDS` and backend ids below
/// `MAX_BACKENDS` on every daemon (the task-id layout fixes the first).
pub use dataplane::ids::{MAX_BACKENDS, MAX_FRONTENDS};

/// Flags of `symphony-backend` (every one may also be a key of the
/// `--config` file).
#[derive(Parser, Debug, Default, Deserialize)]
#[command(
    name = "symphony-backend",
    about = "Symphony backend: runs the batches the scheduler plans on this process's GPUs"
)]
#[serde(default, deny_unknown_fields)]
pub struct Args {
    /// TOML file with any of these options (keys as the long flag names,
    /// '_' for '-'); flags override it.
    #[arg(long)]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// This backend's id (unique among live backends, < 65536). Default 0.
    #[arg(long)]
    pub id: Option<u32>,
    /// The scheduler's control address (transport address). Required.
    #[arg(long)]
    pub scheduler: Option<String>,
    /// Transport: shm, tcp, tcp-blocking or rdma. Default shm.
    #[arg(long)]
    pub transport: Option<String>,
    /// Idle strategy of the poll loop: spin, yield, park, park:US. Default park:100.
    #[arg(long)]
    pub idle: Option<String>,
    /// Address of the Prometheus /metrics endpoint. Default 127.0.0.1:0.
    #[arg(long)]
    pub metrics: Option<String>,
    /// Exit (SIGTERM) when the parent process dies.
    #[arg(long)]
    pub exit_with_parent: bool,
    /// Heartbeat interval to the scheduler, ms. Default 100.
    #[arg(long)]
    pub heartbeat_ms: Option<u64>,
    /// The scheduler is dead after this much silence, ms. Default 1000.
    #[arg(long)]
    pub dead_after_ms: Option<u64>,
    /// GPUs (emulated devices, or CUDA ordinals 0..N) in this process. Default 1.
    #[arg(long)]
    pub gpus: Option<u32>,
    /// Model zoo of the cluster model list: a100 or 1080ti. Default a100
    /// (as every daemon: the lists must match).
    #[arg(long)]
    pub zoo: Option<String>,
    /// Zoo selection: all, strong, weak, none or NAME,NAME,... Default all.
    #[arg(long)]
    pub models: Option<String>,
    /// Extra model NAME=ALPHA_MS,BETA_MS,SLO_MS, after the zoo's (repeatable).
    #[arg(long)]
    pub model: Vec<String>,
    /// Models this backend holds: all or NAME,NAME,... Default all.
    #[arg(long)]
    pub serve: Option<String>,
    /// Executor: emulated, onnx (real models from --model-repository) or
    /// cuda (needs the `cuda` feature). Default emulated.
    #[arg(long)]
    pub executor: Option<String>,
    /// Triton-layout model repository the onnx executor serves from (the
    /// cluster's models are looked up in it by name).
    #[arg(long)]
    pub model_repository: Option<PathBuf>,
    /// ONNX Runtime intra-op threads per batch (onnx executor). Default 1.
    #[arg(long)]
    pub intra_threads: Option<usize>,
    /// Largest batch. Default: the largest profile batch of the served
    /// models, at most 512.
    #[arg(long)]
    pub max_batch: Option<u32>,
    /// Batch buffers (batches held at once over all GPUs). Default 3 per GPU.
    #[arg(long)]
    pub batch_slots: Option<u32>,
    /// One-way control delay bound subtracted from a plan's exec_in, us.
    /// Default: the bound the scheduler announces at registration (this
    /// flag overrides it; the log says which is in force).
    #[arg(long)]
    pub control_delay_us: Option<u64>,
    /// File holding the cluster's join token (else the environment's
    /// SYMPHONY_JOIN_TOKEN; never a flag's value).
    #[arg(long)]
    pub join_token_file: Option<PathBuf>,
    /// How long after the planned start missing inputs are waited for, us. Default 5000.
    #[arg(long)]
    pub fetch_grace_us: Option<u64>,
    /// When a batch starts: `ready` (as soon as its inputs are in and its
    /// device is idle, possibly before the plan's start) or `planned` (not
    /// before the plan's start). Default ready.
    #[arg(long)]
    pub start_at: Option<String>,
    /// Bytes of one input slot. Default 64 (the frontend's FP32 [1,16] input).
    #[arg(long)]
    pub input_bytes: Option<u32>,
    /// Output bytes of every model. Default 40 (the frontend's FP32 [1,10] output).
    #[arg(long)]
    pub output_bytes: Option<u32>,
    /// How long to retry connecting to the scheduler or a frontend, ms. Default 5000.
    #[arg(long)]
    pub connect_timeout_ms: Option<u64>,
}

/// Which executor runs the batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecutorKind {
    /// Emulated GPUs (exact `l(b)`, one timer queue).
    Emulated,
    /// Real GPUs through CUDA (feature `cuda`).
    Cuda,
    /// Real models through ONNX Runtime (`--model-repository`).
    Onnx,
}

/// What the onnx executor serves: per cluster model id, the repository
/// model or why it cannot be served here.
#[derive(Clone, Debug)]
pub struct OnnxSetup {
    /// The repository.
    pub repository: PathBuf,
    /// Per model id.
    pub slots: Vec<Result<OnnxModel, (String, String)>>,
    /// ONNX Runtime intra-op threads per batch.
    pub intra_threads: usize,
}

/// A checked configuration.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Backend id.
    pub id: u32,
    /// Scheduler control address.
    pub scheduler: String,
    /// Transport.
    pub transport: TransportKind,
    /// Idle strategy of the poll loop.
    pub idle: IdleStrategy,
    /// Metrics endpoint address.
    pub metrics: SocketAddr,
    /// Whether to die with the parent.
    pub exit_with_parent: bool,
    /// Heartbeat interval.
    pub heartbeat: Duration,
    /// Scheduler silence that means it is dead.
    pub dead_after: Duration,
    /// GPUs.
    pub gpus: u32,
    /// The cluster model list (model id = index).
    pub models: Vec<ModelSpec>,
    /// Ids of the models this backend holds.
    pub served: Vec<u32>,
    /// Executor.
    pub executor: ExecutorKind,
    /// The onnx executor's models (with `ExecutorKind::Onnx`).
    pub onnx: Option<OnnxSetup>,
    /// Largest batch.
    pub max_batch: u32,
    /// Batch buffers.
    pub batch_slots: u32,
    /// Control delay bound override (`None`: the scheduler's announced one).
    pub control_delay: Option<Duration>,
    /// The cluster's join token, if any.
    pub join_token: Option<JoinToken>,
    /// Fetch grace.
    pub fetch_grace: Duration,
    /// Start batches when ready rather than at their planned start.
    pub start_when_ready: bool,
    /// Input slot bytes.
    pub input_bytes: u32,
    /// Output bytes per input.
    pub output_bytes: u32,
    /// Connect retry window.
    pub connect_timeout: Duration,
}

/// Staging regions above this are refused as a configuration mistake.
const MAX_STAGING_BYTES: u64 = 16 << 30;

impl Args {
    /// Parses a command line (`args[0]` is the program name).
    pub fn parse_from_args(args: &[String]) -> Result<Args, clap::Error> {
        Args::try_parse_from(args)
    }

    /// Reads the `--config` file (if any) under these flags.
    pub fn with_config_file(self) -> Result<Args, String> {
        let Some(path) = &self.config else {
            return Ok(self);
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
        let file: Args =
            toml::from_str(&text).map_err(|e| format!("config file {}: {e}", path.display()))?;
        Ok(self.over(file))
    }

    /// These flags over `file`'s values.
    fn over(self, file: Args) -> Args {
        Args {
            config: self.config,
            id: self.id.or(file.id),
            scheduler: self.scheduler.or(file.scheduler),
            transport: self.transport.or(file.transport),
            idle: self.idle.or(file.idle),
            metrics: self.metrics.or(file.metrics),
            exit_with_parent: self.exit_with_parent || file.exit_with_parent,
            heartbeat_ms: self.heartbeat_ms.or(file.heartbeat_ms),
            dead_after_ms: self.dead_after_ms.or(file.dead_after_ms),
            gpus: self.gpus.or(file.gpus),
            zoo: self.zoo.or(file.zoo),
            models: self.models.or(file.models),
            model: if self.model.is_empty() {
                file.model
            } else {
                self.model
            },
            serve: self.serve.or(file.serve),
            executor: self.executor.or(file.executor),
            model_repository: self.model_repository.or(file.model_repository),
            intra_threads: self.intra_threads.or(file.intra_threads),
            max_batch: self.max_batch.or(file.max_batch),
            batch_slots: self.batch_slots.or(file.batch_slots),
            control_delay_us: self.control_delay_us.or(file.control_delay_us),
            join_token_file: self.join_token_file.or(file.join_token_file),
            fetch_grace_us: self.fetch_grace_us.or(file.fetch_grace_us),
            start_at: self.start_at.or(file.start_at),
            input_bytes: self.input_bytes.or(file.input_bytes),
            output_bytes: self.output_bytes.or(file.output_bytes),
            connect_timeout_ms: self.connect_timeout_ms.or(file.connect_timeout_ms),
        }
    }

    /// Applies defaults and checks every value.
    pub fn resolve(self) -> Result<Settings, String> {
        let id = self.id.unwrap_or(0);
        if id >= MAX_BACKENDS {
            return Err(format!("--id {id}: backend ids must be < {MAX_BACKENDS}"));
        }
        let scheduler = self
            .scheduler
            .ok_or("missing --scheduler ADDR (the scheduler's control address)")?;
        let transport = TransportKind::parse(self.transport.as_deref().unwrap_or("shm"))?;
        let idle = parse_idle(self.idle.as_deref().unwrap_or("park"))?;
        let metrics_text = self.metrics.as_deref().unwrap_or("127.0.0.1:0");
        let metrics: SocketAddr = metrics_text
            .parse()
            .map_err(|_| format!("--metrics '{metrics_text}': expected HOST:PORT (IP address)"))?;
        let heartbeat_ms = self.heartbeat_ms.unwrap_or(100);
        let dead_after_ms = self.dead_after_ms.unwrap_or(1000);
        if heartbeat_ms == 0 || dead_after_ms <= heartbeat_ms {
            return Err(format!(
                "--heartbeat-ms {heartbeat_ms} / --dead-after-ms {dead_after_ms}: need 0 < heartbeat < dead-after"
            ));
        }
        let gpus = self.gpus.unwrap_or(1);
        if gpus == 0 || gpus > 65536 {
            return Err(format!("--gpus {gpus}: must be 1..=65536"));
        }
        let models = cluster_models(
            self.zoo.as_deref().unwrap_or("a100"),
            self.models.as_deref().unwrap_or("all"),
            &self.model,
        )?;
        let served = served_ids(&models, self.serve.as_deref().unwrap_or("all"))?;
        let executor = match self.executor.as_deref().unwrap_or("emulated") {
            "emulated" => ExecutorKind::Emulated,
            "cuda" => ExecutorKind::Cuda,
            "onnx" => ExecutorKind::Onnx,
            other => return Err(format!("unknown executor '{other}' (emulated, onnx, cuda)")),
        };
        let onnx = match (executor, &self.model_repository) {
            (ExecutorKind::Onnx, Some(repo)) => Some(onnx_setup(repo, &models, &served, self.intra_threads.unwrap_or(1))?),
            (ExecutorKind::Onnx, None) => return Err("--executor onnx needs --model-repository DIR".into()),
            (_, Some(_)) => return Err("--model-repository is for --executor onnx".into()),
            _ => None,
        };
        // The onnx executor's sizes come from the served models: an input
        // slot of exactly one sample keeps a single-model backend zero copy.
        let served_onnx = || onnx.iter().flat_map(|o| o.slots.iter()).filter_map(|s| s.as_ref().ok());
        let onnx_input = served_onnx().map(OnnxModel::input_bytes).max();
        let onnx_output = served_onnx().map(OnnxModel::output_bytes).max();
        let onnx_batch = served_onnx().map(OnnxModel::max_batch).max();
        let profile_max = served
            .iter()
            .map(|&m| models[m as usize].profile.max_batch())
            .max()
            .unwrap_or(1);
        let max_batch = self
            .max_batch
            .or(onnx_batch)
            .unwrap_or(profile_max.min(wire::MAX_BATCH_TASKS as u32));
        if max_batch == 0 || max_batch as usize > wire::MAX_BATCH_TASKS {
            return Err(format!(
                "--max-batch {max_batch}: must be 1..={}",
                wire::MAX_BATCH_TASKS
            ));
        }
        let batch_slots = self
            .batch_slots
            .unwrap_or(gpus.saturating_mul(3).min(0xffff));
        if batch_slots == 0 || batch_slots > 0xffff {
            return Err(format!("--batch-slots {batch_slots}: must be 1..=65535"));
        }
        let input_bytes = self.input_bytes.or(onnx_input).unwrap_or(DEFAULT_INPUT_BYTES);
        if input_bytes == 0 {
            return Err("--input-bytes must be positive".into());
        }
        let output_bytes = self.output_bytes.or(onnx_output).unwrap_or(DEFAULT_OUTPUT_BYTES);
        if output_bytes == 0 || output_bytes as usize > wire::MAX_INLINE_OUTPUT {
            return Err(format!(
                "--output-bytes {output_bytes}: must be 1..={} (outputs travel inline)",
                wire::MAX_INLINE_OUTPUT
            ));
        }
        let staging = u64::from(max_batch)
            * (u64::from(input_bytes) + u64::from(output_bytes))
            * u64::from(batch_slots);
        if staging > MAX_STAGING_BYTES {
            return Err(format!(
                "staging would need {staging} bytes (max-batch x (input+output bytes) x batch-slots); at most {MAX_STAGING_BYTES}"
            ));
        }
        Ok(Settings {
            id,
            scheduler,
            transport,
            idle,
            metrics,
            exit_with_parent: self.exit_with_parent,
            heartbeat: Duration::from_millis(heartbeat_ms),
            dead_after: Duration::from_millis(dead_after_ms),
            gpus,
            models,
            served,
            executor,
            onnx,
            max_batch,
            batch_slots,
            control_delay: self.control_delay_us.map(Duration::from_micros),
            join_token: JoinToken::from_file_or_env(self.join_token_file.as_deref())?,
            fetch_grace: Duration::from_micros(self.fetch_grace_us.unwrap_or(5_000)),
            start_when_ready: match self.start_at.as_deref().unwrap_or("ready") {
                "ready" => true,
                "planned" => false,
                other => return Err(format!("--start-at {other}: expected ready or planned")),
            },
            input_bytes,
            output_bytes,
            connect_timeout: Duration::from_millis(self.connect_timeout_ms.unwrap_or(5_000)),
        })
    }
}

/// Looks every served model up in the repository by name. A model that is
/// missing or refused there is recorded (its batches fail with the reason)
/// and the others serve; the refusals are printed once here.
fn onnx_setup(repo: &std::path::Path, models: &[ModelSpec], served: &[u32], intra_threads: usize) -> Result<OnnxSetup, String> {
    let scanned = repository::scan(repo).map_err(|e| e.to_string())?;
    for e in &scanned.refused {
        eprintln!("symphony-backend: model repository: refused: {e}");
    }
    let slots = models
        .iter()
        .enumerate()
        .map(|(id, spec)| {
            let name = spec.name.clone();
            if !served.contains(&(id as u32)) {
                return Err((name, "not served by this backend".to_string()));
            }
            match scanned.model(&spec.name) {
                Some(m) => OnnxModel::from_repo(m).map_err(|e| (name, e.to_string())),
                None => {
                    let why = scanned
                        .refused
                        .iter()
                        .map(ToString::to_string)
                        .find(|e| e.contains(&format!("/{}/", spec.name)))
                        .unwrap_or_else(|| format!("no model '{}' in {}", spec.name, repo.display()));
                    Err((name, why))
                }
            }
        })
        .collect();
    Ok(OnnxSetup { repository: repo.to_path_buf(), slots, intra_threads })
}

/// Ids of the models named by `--serve` (`all` or NAME,NAME,...; names are
/// case-insensitive; the first model of a name is taken).
pub fn served_ids(models: &[ModelSpec], serve: &str) -> Result<Vec<u32>, String> {
    if serve.eq_ignore_ascii_case("all") {
        return Ok((0..models.len() as u32).collect());
    }
    let mut ids = Vec::new();
    for name in serve.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let id = models
            .iter()
            .position(|m| m.name.eq_ignore_ascii_case(name))
            .ok_or_else(|| format!("--serve: no model named '{name}' in the cluster model list"))?
            as u32;
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    if ids.is_empty() {
        return Err("--serve: empty model list (give all or NAME,NAME,...)".into());
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Args {
        let mut all = vec!["symphony-backend".to_string()];
        all.extend(v.iter().map(|s| s.to_string()));
        Args::parse_from_args(&all).unwrap()
    }

    #[test]
    fn defaults_and_model_lists() {
        let s = args(&[
            "--scheduler",
            "x",
            "--zoo",
            "a100",
            "--models",
            "ResNet50,DenseNet121",
        ])
        .resolve()
        .unwrap();
        assert_eq!(s.models.len(), 2);
        assert_eq!(s.served, vec![0, 1]);
        assert_eq!(
            (s.gpus, s.batch_slots, s.input_bytes, s.output_bytes),
            (1, 3, 64, 40)
        );
        assert_eq!(s.transport, TransportKind::Shm);
        let s = args(&[
            "--scheduler",
            "x",
            "--models",
            "none",
            "--model",
            "a=1,2,50",
            "--model",
            "b=1,2,50",
            "--serve",
            "B",
            "--gpus",
            "4",
        ])
        .resolve()
        .unwrap();
        assert_eq!(s.served, vec![1]);
        assert_eq!(s.batch_slots, 12);
        assert!(s.max_batch >= 1 && s.max_batch <= 512);
    }

    #[test]
    fn bad_values_are_refused_with_a_reason() {
        let bad = [
            (vec!["--model", "a=1,2,50"], "missing --scheduler"),
            (vec!["--scheduler", "x", "--models", "none"], "no models"),
            (
                vec!["--scheduler", "x", "--model", "a=1,2,50", "--gpus", "0"],
                "--gpus",
            ),
            (
                vec!["--scheduler", "x", "--model", "a=1,2,50", "--serve", "zz"],
                "no model named",
            ),
            (
                vec![
                    "--scheduler",
                    "x",
                    "--model",
                    "a=1,2,50",
                    "--transport",
                    "udp",
                ],
                "unknown transport",
            ),
            (
                vec![
                    "--scheduler",
                    "x",
                    "--model",
                    "a=1,2,50",
                    "--executor",
                    "tpu",
                ],
                "unknown executor",
            ),
            (
                vec![
                    "--scheduler",
                    "x",
                    "--model",
                    "a=1,2,50",
                    "--max-batch",
                    "513",
                ],
                "--max-batch",
            ),
            (vec!["--scheduler", "x", "--zoo", "v100"], "unknown zoo"),
            (
                vec!["--scheduler", "x", "--model", "a=1,2,50", "--id", "65536"],
                "--id",
            ),
        ];
        for (v, want) in bad {
            let e = args(&v).resolve().unwrap_err();
            assert!(e.contains(want), "{v:?}: '{e}' lacks '{want}'");
        }
    }

    #[test]
    fn flags_override_the_config_file() {
        let file: Args = toml::from_str(
            "scheduler = \"file-addr\"\ngpus = 3\nmodels = \"none\"\nmodel = [\"a=1,2,50\"]\nexit_with_parent = true\n",
        )
        .unwrap();
        let s = args(&["--gpus", "2"]).over(file).resolve().unwrap();
        assert_eq!(
            (s.scheduler.as_str(), s.gpus, s.models.len()),
            ("file-addr", 2, 1)
        );
        assert!(s.exit_with_parent);
        assert!(
            toml::from_str::<Args>("gpu = 3\n").is_err(),
            "unknown keys are refused"
        );
    }
}
