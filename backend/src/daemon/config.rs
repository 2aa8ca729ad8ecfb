//! Command line of `symphony-backend` (its own options plus the shell's
//! [`CommonArgs`], loaded by [`node_shell::load`]: flags,
//! `SYMPHONY_*` variables, the `--config` file) and its resolution into a
//! checked [`BackendConfig`], so a bad configuration is one clear message
//! before anything starts.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use dataplane::control::TransportKind;
use dataplane::idle::IdleStrategy;
use dataplane::join::JoinToken;
use node_shell::{Common, CommonArgs, ConfigError};
use dataplane::time::Duration;
use dataplane::wire;
use scheduler_core::zoo::ModelListArgs;
use scheduler_core::repository;
use scheduler_core::zoo::ModelSpec;

use crate::exec::onnx::OnnxModel;

/// The default tensors' sizes, defined once for frontends and backends: an
/// input slot must hold the largest input any frontend stages.
pub use dataplane::reference::{DEFAULT_INPUT_BYTES, DEFAULT_OUTPUT_BYTES};

/// Frontend ids are below `MAX_FRONTENDS` and backend ids below
/// `MAX_BACKENDS` on every daemon (the task-id layout fixes the first).
pub use dataplane::ids::{MAX_BACKENDS, MAX_FRONTENDS};

/// Command line of `symphony-backend`.
#[derive(Parser, Debug)]
#[command(
    name = "symphony-backend",
    about = "Symphony backend: runs the batches the scheduler plans on this process's GPUs"
)]
pub struct BackendArgs {
    /// This backend's id (unique among live backends, < 65536).
    #[arg(long, default_value_t = 0)]
    pub id: u32,
    /// The scheduler's control address (transport address). Required.
    #[arg(long)]
    pub scheduler: Option<String>,
    /// GPUs of this backend (emulated devices, or CUDA ordinals 0..N): as
    /// `symphony up --gpus-per-backend`, the same count under the same name.
    #[arg(long = "gpus-per-backend", default_value_t = 1)]
    pub gpus: u32,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub model_list: ModelListArgs,
    /// Models this backend holds, of the cluster's --models: all or NAME,NAME,...
    #[arg(long = "serve-models", default_value = "all")]
    pub serve: String,
    /// Executor: emulated, onnx (real models from --model-repository) or
    /// cuda (needs the `cuda` feature).
    #[arg(long, value_enum, default_value_t = ExecutorKind::Emulated)]
    pub executor: ExecutorKind,
    /// Triton-layout model repository the onnx executor serves from (the
    /// cluster's models are looked up in it by name).
    #[arg(long)]
    pub model_repository: Option<PathBuf>,
    /// ONNX Runtime intra-op threads per batch (onnx executor).
    #[arg(long, default_value_t = 1)]
    pub intra_threads: usize,
    /// Skip the warm-up runs (each model at its largest batch and at 1,
    /// before the backend registers): the first batches then pay ONNX
    /// Runtime's first-run costs on top of their profiled time (onnx
    /// executor).
    #[arg(long)]
    pub no_warmup: bool,
    /// Largest batch. Default: the largest profile batch of the served
    /// models, at most 512.
    #[arg(long)]
    pub max_batch: Option<u32>,
    /// Batch buffers (batches held at once over all GPUs). Default 3 per GPU.
    #[arg(long)]
    pub batch_slots: Option<u32>,
    /// How long after the planned start missing inputs are waited for, µs.
    #[arg(long, default_value_t = 5000)]
    pub fetch_grace_us: u64,
    /// When a batch starts: `ready` (as soon as its inputs are in and its
    /// device is idle, possibly before the plan's start) or `planned` (not
    /// before the plan's start).
    #[arg(long, value_enum, default_value_t = StartAt::Ready)]
    pub start_at: StartAt,
    /// Bytes of one input slot. Default 64 (the frontend's FP32 [1,16] input).
    #[arg(long)]
    pub input_bytes: Option<u32>,
    /// Output bytes of every model. Default 40 (the frontend's FP32 [1,10] output).
    #[arg(long)]
    pub output_bytes: Option<u32>,
    /// How long to retry connecting to the scheduler or a frontend, ms.
    #[arg(long, default_value_t = 5000)]
    pub connect_timeout_ms: u64,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: CommonArgs,
}

/// Which executor runs the batches.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecutorKind {
    /// Emulated GPUs (exact `l(b)`, one timer queue).
    Emulated,
    /// Real models through ONNX Runtime (`--model-repository`).
    Onnx,
    /// Real GPUs through CUDA (feature `cuda`).
    Cuda,
}

impl ExecutorKind {
    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            ExecutorKind::Emulated => "emulated",
            ExecutorKind::Onnx => "onnx",
            ExecutorKind::Cuda => "cuda",
        }
    }
}

/// When a batch starts.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartAt {
    /// As soon as its inputs are in and its device is idle.
    Ready,
    /// Not before the plan's start.
    Planned,
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
    /// Run the executor's warm-up batches at load.
    pub warmup: bool,
}

/// A checked configuration.
#[derive(Clone, Debug)]
pub struct BackendConfig {
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

/// Batch and slot sizes.
struct Sizes {
    max_batch: u32,
    batch_slots: u32,
    input_bytes: u32,
    output_bytes: u32,
}

impl BackendArgs {
    /// Checks every backend option; `common` is the resolved shared part.
    pub fn resolve(self, common: Common) -> Result<BackendConfig, ConfigError> {
        if self.id >= MAX_BACKENDS {
            return Err(ConfigError::invalid("id", format!("{}: backend ids must be < {MAX_BACKENDS}", self.id)));
        }
        let scheduler = self.scheduler.clone().ok_or(ConfigError::Missing {
            option: "scheduler",
            what: "the scheduler's control address",
        })?;
        if self.gpus == 0 || self.gpus > 65536 {
            return Err(ConfigError::invalid("gpus-per-backend", format!("{}: must be 1..=65536", self.gpus)));
        }
        let models = self.model_list.resolve().map_err(|e| ConfigError::invalid(ModelListArgs::FLAGS, e))?;
        let served = served_ids(&models, &self.serve)?;
        let onnx = match (self.executor, &self.model_repository) {
            (ExecutorKind::Onnx, Some(repo)) => Some(onnx_setup(repo, &models, &served, self.intra_threads, !self.no_warmup)?),
            (ExecutorKind::Onnx, None) => {
                return Err(ConfigError::invalid("executor", "onnx needs --model-repository DIR"))
            }
            (_, Some(_)) => {
                return Err(ConfigError::invalid("model-repository", "is for --executor onnx"))
            }
            _ => None,
        };
        let sizes = self.sizes(&models, &served, onnx.as_ref())?;
        Ok(BackendConfig {
            id: self.id,
            scheduler,
            transport: common.transport,
            idle: common.idle,
            metrics: common.metrics,
            heartbeat: common.heartbeat,
            dead_after: common.dead_after,
            gpus: self.gpus,
            models,
            served,
            executor: self.executor,
            onnx,
            max_batch: sizes.max_batch,
            batch_slots: sizes.batch_slots,
            control_delay: common.control_delay,
            join_token: common.join_token,
            fetch_grace: Duration::from_micros(self.fetch_grace_us),
            start_when_ready: self.start_at == StartAt::Ready,
            input_bytes: sizes.input_bytes,
            output_bytes: sizes.output_bytes,
            connect_timeout: Duration::from_millis(self.connect_timeout_ms),
        })
    }

    /// Batch and slot sizes: the flags, else (onnx) the served models'
    /// own, else the defaults; an input slot of exactly one sample keeps a
    /// single-model onnx backend zero copy.
    fn sizes(&self, models: &[ModelSpec], served: &[u32], onnx: Option<&OnnxSetup>) -> Result<Sizes, ConfigError> {
        let served_onnx = || onnx.iter().flat_map(|o| o.slots.iter()).filter_map(|s| s.as_ref().ok());
        let profile_max = served
            .iter()
            .map(|&m| models[m as usize].profile.max_batch())
            .max()
            .unwrap_or(1);
        let max_batch = self
            .max_batch
            .or(served_onnx().map(OnnxModel::max_batch).max())
            .unwrap_or(profile_max.min(wire::MAX_BATCH_TASKS as u32));
        if max_batch == 0 || max_batch as usize > wire::MAX_BATCH_TASKS {
            return Err(ConfigError::invalid("max-batch", format!("{max_batch}: must be 1..={}", wire::MAX_BATCH_TASKS)));
        }
        let batch_slots = self.batch_slots.unwrap_or(self.gpus.saturating_mul(3).min(0xffff));
        if batch_slots == 0 || batch_slots > 0xffff {
            return Err(ConfigError::invalid("batch-slots", format!("{batch_slots}: must be 1..=65535")));
        }
        let input_bytes = self
            .input_bytes
            .or(served_onnx().map(OnnxModel::input_bytes).max())
            .unwrap_or(DEFAULT_INPUT_BYTES);
        if input_bytes == 0 {
            return Err(ConfigError::invalid("input-bytes", "must be positive"));
        }
        let output_bytes = self
            .output_bytes
            .or(served_onnx().map(OnnxModel::output_bytes).max())
            .unwrap_or(DEFAULT_OUTPUT_BYTES);
        if output_bytes == 0 || output_bytes as usize > wire::MAX_INLINE_OUTPUT {
            return Err(ConfigError::invalid(
                "output-bytes",
                format!("{output_bytes}: must be 1..={} (outputs travel inline)", wire::MAX_INLINE_OUTPUT),
            ));
        }
        let staging = u64::from(max_batch) * (u64::from(input_bytes) + u64::from(output_bytes)) * u64::from(batch_slots);
        if staging > MAX_STAGING_BYTES {
            return Err(ConfigError::invalid(
                "max-batch",
                format!("staging would need {staging} bytes (max-batch x (input+output bytes) x batch-slots); at most {MAX_STAGING_BYTES}"),
            ));
        }
        Ok(Sizes { max_batch, batch_slots, input_bytes, output_bytes })
    }
}

/// Looks every served model up in the repository by name. A model that is
/// missing or refused there is recorded (its batches fail with the reason)
/// and the others serve; the refusals are printed once here.
fn onnx_setup(
    repo: &std::path::Path,
    models: &[ModelSpec],
    served: &[u32],
    intra_threads: usize,
    warmup: bool,
) -> Result<OnnxSetup, ConfigError> {
    let scanned = repository::scan(repo).map_err(|e| ConfigError::invalid("model-repository", e))?;
    for e in &scanned.refused {
        tracing::warn!(error = %e, "model repository: refused");
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
    Ok(OnnxSetup { repository: repo.to_path_buf(), slots, intra_threads, warmup })
}

/// Ids of the models named by `--serve-models` (`all` or NAME,NAME,...; names are
/// case-insensitive; the first model of a name is taken).
pub fn served_ids(models: &[ModelSpec], serve: &str) -> Result<Vec<u32>, ConfigError> {
    if serve.eq_ignore_ascii_case("all") {
        return Ok((0..models.len() as u32).collect());
    }
    let mut ids = Vec::new();
    for name in serve.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let id = models
            .iter()
            .position(|m| m.name.eq_ignore_ascii_case(name))
            .ok_or_else(|| ConfigError::invalid("serve-models", format!("no model named '{name}' in the cluster model list")))?
            as u32;
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    if ids.is_empty() {
        return Err(ConfigError::invalid("serve-models", "empty model list (give all or NAME,NAME,...)"));
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(v: &[&str]) -> Result<BackendConfig, ConfigError> {
        let mut all = vec!["symphony-backend".to_string()];
        all.extend(v.iter().map(|s| s.to_string()));
        let args: BackendArgs = node_shell::load_from(all, &|_| None)?;
        let common = args.common.resolve()?;
        args.resolve(common)
    }

    #[test]
    fn defaults_and_model_lists() {
        let s = resolve(&["--scheduler", "x", "--zoo", "a100", "--models", "ResNet50,DenseNet121"]).unwrap();
        assert_eq!(s.models.len(), 2);
        assert_eq!(s.served, vec![0, 1]);
        assert_eq!((s.gpus, s.batch_slots, s.input_bytes, s.output_bytes), (1, 3, 64, 40));
        assert_eq!(s.transport, TransportKind::Shm);
        assert_eq!(s.control_delay, None, "the scheduler's announced bound by default");
        let s = resolve(&[
            "--scheduler", "x", "--models", "none", "--model", "a=1,2,50", "--model", "b=1,2,50", "--serve-models", "B", "--gpus-per-backend", "4",
            "--control-delay-us", "50",
        ])
        .unwrap();
        assert_eq!(s.served, vec![1]);
        assert_eq!(s.batch_slots, 12);
        assert!(s.max_batch >= 1 && s.max_batch <= 512);
        assert_eq!(s.control_delay, Some(Duration::from_micros(50)));
    }

    #[test]
    fn bad_values_are_refused_with_a_reason() {
        let bad = [
            (vec!["--model", "a=1,2,50"], "--scheduler is required"),
            (vec!["--scheduler", "x", "--models", "none"], "no models"),
            (vec!["--scheduler", "x", "--model", "a=1,2,50", "--gpus-per-backend", "0"], "--gpus-per-backend"),
            (vec!["--scheduler", "x", "--model", "a=1,2,50", "--serve-models", "zz"], "no model named"),
            (vec!["--scheduler", "x", "--model", "a=1,2,50", "--transport", "udp"], "unknown transport 'udp' (shm, tcp, tcp-blocking, rdma)"),
            (vec!["--scheduler", "x", "--model", "a=1,2,50", "--executor", "tpu"], "[possible values: emulated, onnx, cuda]"),
            (vec!["--scheduler", "x", "--model", "a=1,2,50", "--max-batch", "513"], "--max-batch"),
            (vec!["--scheduler", "x", "--zoo", "v100"], "unknown zoo"),
            (vec!["--scheduler", "x", "--model", "a=1,2,50", "--id", "65536"], "--id"),
            (vec!["--scheduler", "x", "--model", "a=1,2,50", "--start-at", "soon"], "[possible values: ready, planned]"),
        ];
        for (v, want) in bad {
            let e = resolve(&v).unwrap_err().to_string();
            assert!(e.contains(want), "{v:?}: '{e}' lacks '{want}'");
        }
    }

    #[test]
    fn flags_override_the_config_file() {
        let path = std::env::temp_dir().join(format!("symphony-backend-config-test-{}.toml", std::process::id()));
        std::fs::write(
            &path,
            "scheduler = \"file-addr\"\ngpus_per_backend = 3\nmodels = \"none\"\nmodel = [\"a=1,2,50\"]\nexit_with_parent = true\n",
        )
        .unwrap();
        let file = path.to_str().unwrap();
        let s = resolve(&["--config", file, "--gpus-per-backend", "2"]).unwrap();
        assert_eq!((s.scheduler.as_str(), s.gpus, s.models.len()), ("file-addr", 2, 1));
        std::fs::write(&path, "gpu = 3\n").unwrap();
        let e = resolve(&["--config", file]).unwrap_err().to_string();
        assert!(e.contains("unknown key `gpu`"), "unknown keys are refused: {e}");
        let _ = std::fs::remove_file(path);
    }
}
