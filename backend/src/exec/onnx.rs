//! Real inference: ONNX Runtime (the `ort` crate, `load-dynamic`) over the
//! staging region the READs land in.
//!
//! **Zero copy.** A batch's input slots are contiguous in the staging
//! region (slot `i` at `slot_offset + i * input_slot`, see
//! [`crate::worker::WorkerConfig`]); when the slot size equals the model's
//! per-sample input bytes (how a single-model backend is configured:
//! `input_slot` = the model's sample size), the input tensor `[b, dims..]`
//! is a view over those slots: ONNX Runtime reads the bytes where the
//! READs put them ([`OnnxExecutor::bytes_copied`] stays 0, tested by the
//! pointer). When they are not contiguous (a backend serving models of
//! different input sizes sizes its slots for the largest one; a task whose
//! READ failed leaves a gap), the inputs are gathered into the device's
//! preallocated scratch buffer and the copied bytes are counted. Outputs
//! (small: a class score vector) are copied from ONNX Runtime's output
//! tensor into the output slots.
//!
//! **Devices.** A "device" is one batch running at a time: each has its own
//! thread and its own sessions (ONNX Runtime's `run` takes the session
//! mutably), so `devices` batches run concurrently, each with
//! `intra_threads` ONNX Runtime threads. A batch is handed to its thread at
//! `max(now, exec_at)` by [`Executor::poll`]; the thread reports the
//! measured run time, and `Finished` is `start + measured`. A completion
//! calls the waker ([`Executor::set_waker`]) so a host that sleeps
//! wakes up; without one, [`Executor::next_wakeup`] asks to be polled.
//!
//! **The runtime library** is found without any variable: the project's
//! `.venv/` (installed by `scripts/setup.sh` from the `onnxruntime==1.31.1`
//! wheel) next to the executable's or the working directory's ancestors or
//! the source tree; `SYMPHONY_ORT_DYLIB` (or `ORT_DYLIB_PATH`) overrides.
//!
//! **Warm-up** ([`OnnxOptions::warmup`], on by default): construction runs
//! every loaded session at its largest batch and at batch 1, so the first
//! batches the scheduler plans to finish just inside their deadlines do not
//! also pay ONNX Runtime's first-run costs (see docs/benchmarks.md, "Warm-up
//! at load").
//!
//! **A model that fails to load** (file unreadable, graph that disagrees
//! with `config.pbtxt`) does not stop the others: its batches finish with
//! `ok = false` and [`OnnxExecutor::load_error`] says why.
//!
//! **CUDA.** A backend whose models are all `KIND_GPU` runs them on the
//! graph engine of the CUDA executor instead ([`gpu_engine_serves`],
//! `exec/graph`; feature `cuda`). A `KIND_GPU` model in a mixed set here
//! uses ONNX Runtime's CUDA execution provider; without the feature, a GPU,
//! a driver or a CUDA build of ONNX Runtime, construction fails with
//! [`OnnxError::Cuda`] naming the cause.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration as StdDuration;

use dataplane::mem::Region;
use dataplane::time::{Duration, Instant};
use ort::memory::MemoryInfo;
use ort::session::{Session, SessionInputValue};
use ort::value::{DynTensorValueType, Shape, TensorElementType, TensorRefMut, ValueType};
use scheduler_core::repository::{DataType, InstanceKind, RepoModel, RepositoryError, TensorConfig};

use super::{check_job, ExecError, Executor, Finished, Job, OutputRef};

/// Environment variable naming `libonnxruntime.so` explicitly.
pub const DYLIB_ENV: &str = "SYMPHONY_ORT_DYLIB";

/// Why the executor could not be built.
#[derive(Debug, thiserror::Error)]
pub enum OnnxError {
    /// The ONNX Runtime library was not found or did not load.
    #[error("ONNX Runtime: {0}")]
    Runtime(#[from] RuntimeLoadError),
    /// The CUDA execution provider cannot be used here: why, and ONNX
    /// Runtime's error when it gave one.
    #[error("CUDA execution provider refused: {why}{}", .source.as_ref().map(|e| format!(": {e}")).unwrap_or_default())]
    Cuda {
        /// Why, in words.
        why: &'static str,
        /// ONNX Runtime's error, if the refusal came from it.
        #[source]
        source: Option<ort::Error>,
    },
    /// A model's configuration cannot be served by this executor.
    #[error(transparent)]
    Model(#[from] RepositoryError),
    /// A device thread could not start.
    #[error("cannot start a device thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// Why `libonnxruntime.so` was not found.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DylibError {
    /// An environment variable names a file that does not exist.
    #[error("{var}={}: no such file", path.display())]
    NoSuchFile {
        /// The variable.
        var: &'static str,
        /// The path it names.
        path: PathBuf,
    },
    /// No variable set and no `.venv/` wheel found.
    #[error("libonnxruntime.so not found: run scripts/setup.sh (installs the onnxruntime==1.31.1 wheel into .venv/) or set {DYLIB_ENV}")]
    NotFound,
}

/// Why the ONNX Runtime library could not be loaded (kept for the
/// process: the library loads once).
#[derive(Clone, Debug, thiserror::Error)]
pub enum RuntimeLoadError {
    /// The library was not found.
    #[error(transparent)]
    Dylib(#[from] DylibError),
    /// The library did not load.
    #[error("cannot load {}: {source}", path.display())]
    Load {
        /// The library.
        path: PathBuf,
        /// Why the library did not load (shared: the failure is kept for
        /// the process).
        source: Arc<ort::LoadDynamicError>,
    },
    /// The environment could not be built.
    #[error("{}: {source}", path.display())]
    Environment {
        /// The library.
        path: PathBuf,
        /// ONNX Runtime's error (shared, as for `Load`).
        source: Arc<ort::Error>,
    },
}

/// Why one batch failed on a device thread (reported through
/// [`OnnxExecutor::last_error`]).
#[derive(Debug, thiserror::Error)]
enum RunError {
    #[error("no model {model}")]
    NoModel { model: u32 },
    #[error("model {model} is not loaded")]
    NotLoaded { model: String },
    #[error("model {model}: an input is not {bytes} bytes")]
    EmptyBatch { model: String, bytes: u32 },
    #[error("staging region: {0}")]
    Staging(#[from] dataplane::mem::MemError),
    #[error("scratch buffer too small")]
    ScratchTooSmall,
    #[error("misaligned input")]
    Misaligned,
    #[error("model {model}: {what}: {source}")]
    Ort { model: String, what: &'static str, source: ort::Error },
    #[error("model {model}: no output {output}")]
    NoOutput { model: String, output: String },
    #[error("model {model}: output is not a tensor")]
    NotATensor { model: String },
    #[error("model {model}: output type {ty}")]
    OutputType { model: String, ty: String },
    #[error("model {model}: output of {got:?} bytes, expected {want}")]
    OutputSize { model: String, got: Option<usize>, want: usize },
}

/// Which execution provider runs a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provider {
    /// ONNX Runtime's CPU provider.
    Cpu,
    /// The CUDA provider (feature `cuda`; refused without a GPU).
    Cuda,
}

/// One model as this executor serves it: one input, one output, fixed
/// per-sample shapes.
#[derive(Clone, Debug, PartialEq)]
pub struct OnnxModel {
    /// Model name.
    pub name: String,
    /// The `.onnx` file.
    pub path: PathBuf,
    /// Its `config.pbtxt` (for error messages).
    pub config_path: PathBuf,
    /// The input.
    pub input: TensorConfig,
    /// The output.
    pub output: TensorConfig,
    /// `max_batch_size` (0: the graph has no batch dim; batches of 1).
    pub max_batch_size: u32,
    /// Execution provider.
    pub provider: Provider,
}

impl OnnxModel {
    /// The servable form of a repository model (its newest version): one
    /// input and one output with fixed per-sample dims.
    pub fn from_repo(m: &RepoModel) -> Result<OnnxModel, RepositoryError> {
        let c = &m.config;
        let path = &m.config_path;
        if c.inputs.len() != 1 {
            return Err(RepositoryError::field(path, "input", "this executor serves models with exactly one input"));
        }
        if c.outputs.len() != 1 {
            return Err(RepositoryError::field(path, "output", "this executor serves models with exactly one output"));
        }
        for (kind, t) in [("input[0]", &c.inputs[0]), ("output[0]", &c.outputs[0])] {
            if t.sample_bytes().is_none_or(|b| b == 0 || b > u64::from(u32::MAX)) {
                return Err(RepositoryError::field(path, format!("{kind}.dims"), "variable (-1) or oversized dims are not served"));
            }
        }
        Ok(OnnxModel {
            name: c.name.clone(),
            path: m.latest().path.clone(),
            config_path: m.config_path.clone(),
            input: c.inputs[0].clone(),
            output: c.outputs[0].clone(),
            max_batch_size: c.max_batch_size,
            provider: match c.instance_group.kind {
                InstanceKind::Gpu => Provider::Cuda,
                InstanceKind::Cpu | InstanceKind::Auto => Provider::Cpu,
            },
        })
    }
    /// A stand-in for a model id this executor cannot serve (never loaded).
    fn unavailable(name: &str) -> OnnxModel {
        let t = TensorConfig { name: String::new(), data_type: DataType::U8, dims: vec![1], reshape: None };
        OnnxModel {
            name: name.to_string(),
            path: PathBuf::new(),
            config_path: PathBuf::new(),
            input: t.clone(),
            output: t,
            max_batch_size: 1,
            provider: Provider::Cpu,
        }
    }
    /// Input bytes of one sample.
    pub fn input_bytes(&self) -> u32 {
        self.input.sample_bytes().unwrap_or(0) as u32
    }
    /// Output bytes of one sample.
    pub fn output_bytes(&self) -> u32 {
        self.output.sample_bytes().unwrap_or(0) as u32
    }
    /// Largest batch one run takes.
    pub fn max_batch(&self) -> u32 {
        self.max_batch_size.max(1)
    }
}

/// Executor settings.
#[derive(Clone, Debug)]
pub struct OnnxOptions {
    /// Batches run at once (device threads). At least 1.
    pub devices: u32,
    /// ONNX Runtime intra-op threads per run (0: its default, one per core).
    pub intra_threads: usize,
    /// Let ONNX Runtime's idle threads spin (lower latency, burns cores
    /// that the transport and other devices may need).
    pub spin: bool,
    /// `libonnxruntime.so` to load (default: [`find_dylib`]).
    pub dylib: Option<PathBuf>,
    /// Run every loaded session once at its largest batch and once at
    /// batch 1 (zero inputs) before the executor is returned, so the
    /// first real batch does not pay ONNX Runtime's first-run costs
    /// (arena growth, kernel and memory planning; cuDNN's algorithm search
    /// on a GPU) on top of its profiled time. The scheduler plans a batch
    /// to finish just inside its deadline, so that cost lands as lateness
    /// (Triton's `model_warmup` does the same, opt-in). A model whose
    /// warm-up run fails is recorded as not loaded.
    pub warmup: bool,
}

impl Default for OnnxOptions {
    fn default() -> Self {
        OnnxOptions {
            devices: 1,
            intra_threads: 1,
            spin: false,
            dylib: None,
            warmup: true,
        }
    }
}

/// Finds `libonnxruntime.so` without the user's help: `SYMPHONY_ORT_DYLIB`
/// or `ORT_DYLIB_PATH` if set, else the `onnxruntime` wheel in a `.venv/`
/// of an ancestor of the executable, of the working directory, or of this
/// source tree.
pub fn find_dylib() -> Result<PathBuf, DylibError> {
    for var in [DYLIB_ENV, "ORT_DYLIB_PATH"] {
        if let Some(p) = std::env::var_os(var) {
            let path = PathBuf::from(p);
            return if path.is_file() { Ok(path) } else { Err(DylibError::NoSuchFile { var, path }) };
        }
    }
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        roots.extend(exe.ancestors().skip(1).map(Path::to_path_buf));
    }
    if let Ok(cwd) = std::env::current_dir() {
        roots.extend(cwd.ancestors().map(Path::to_path_buf));
    }
    roots.extend(Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().map(Path::to_path_buf));
    for root in &roots {
        if let Some(p) = venv_dylib(&root.join(".venv")) {
            return Ok(p);
        }
    }
    Err(DylibError::NotFound)
}

fn venv_dylib(venv: &Path) -> Option<PathBuf> {
    let lib = std::fs::read_dir(venv.join("lib")).ok()?;
    for py in lib.filter_map(|e| e.ok()) {
        let capi = py.path().join("site-packages/onnxruntime/capi");
        let Ok(files) = std::fs::read_dir(&capi) else { continue };
        let mut found: Vec<PathBuf> = files
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("libonnxruntime.so")))
            .collect();
        found.sort();
        if let Some(p) = found.pop() {
            return Some(p);
        }
    }
    None
}

/// The process's ONNX Runtime environment (the library loads once).
fn environment(dylib: Option<&Path>) -> Result<&'static ort::environment::Environment, OnnxError> {
    static ENV: OnceLock<Result<ort::environment::Environment, RuntimeLoadError>> = OnceLock::new();
    ENV.get_or_init(|| {
        let path = match dylib {
            Some(p) => p.to_path_buf(),
            None => find_dylib()?,
        };
        ort::init_from(&path)
            .map_err(|e| RuntimeLoadError::Load { path: path.clone(), source: Arc::new(e) })?
            .with_name("symphony")
            .build()
            .map_err(|e| RuntimeLoadError::Environment { path: path.clone(), source: Arc::new(e) })
    })
    .as_ref()
    .map_err(|e| OnnxError::Runtime(e.clone()))
}

/// Whether a backend's repository models run on the CUDA executor's graph
/// engine (issue 51) instead of ONNX Runtime: every model it holds is
/// `KIND_GPU` (and there is one). Mixed CPU and GPU sets stay on ONNX
/// Runtime, whose CUDA provider is used where its library exists.
pub fn gpu_engine_serves(slots: &[Result<OnnxModel, (String, String)>]) -> bool {
    let held: Vec<&OnnxModel> = slots.iter().filter_map(|s| s.as_ref().ok()).collect();
    !held.is_empty() && held.iter().all(|m| m.provider == Provider::Cuda)
}

/// Loads and checks one model for one device.
fn load_session(m: &OnnxModel, opts: &OnnxOptions, env: &ort::environment::Environment) -> Result<Session, OnnxError> {
    let model_err = |field: &str, what: String| OnnxError::Model(RepositoryError::field(&m.path, field, what));
    let opt_err = |e: ort::Error<ort::session::builder::SessionBuilder>| model_err("session options", e.to_string());
    let b = Session::builder(env).map_err(|e| model_err("session", e.to_string()))?;
    let b = b.with_intra_threads(opts.intra_threads).map_err(opt_err)?;
    let b = b.with_inter_threads(1).map_err(opt_err)?;
    let b = b.with_intra_op_spinning(opts.spin).map_err(opt_err)?;
    let mut b = b.with_inter_op_spinning(false).map_err(opt_err)?;
    if m.provider == Provider::Cuda {
        b = cuda_provider(b)?;
    }
    let session = b.commit_from_file(&m.path).map_err(|e| {
        OnnxError::Model(RepositoryError::File {
            path: m.path.clone(),
            what: format!("ONNX Runtime cannot load it: {e}"),
        })
    })?;
    check_outlet(m, "input[0]", &m.input, session.inputs().iter().map(|o| (o.name(), o.dtype())))?;
    check_outlet(m, "output[0]", &m.output, session.outputs().iter().map(|o| (o.name(), o.dtype())))?;
    Ok(session)
}

#[cfg(feature = "cuda")]
fn cuda_provider(b: ort::session::builder::SessionBuilder) -> Result<ort::session::builder::SessionBuilder, OnnxError> {
    use ort::ep::ExecutionProvider;
    let ep = ort::ep::CUDA::default();
    match ort::ep::CUDA::is_available() {
        Ok(true) => {}
        Ok(false) => {
            return Err(OnnxError::Cuda {
                why: "this ONNX Runtime build has no CUDA provider (the CPU wheel; install onnxruntime-gpu and a driver)",
                source: None,
            })
        }
        Err(e) => {
            return Err(OnnxError::Cuda { why: "cannot tell whether the CUDA provider is available", source: Some(e) })
        }
    }
    b.with_execution_providers([ep.build().error_on_failure()])
        .map_err(|e| OnnxError::Cuda { why: "no usable GPU or driver", source: Some(ort::Error::from(e)) })
}

#[cfg(not(feature = "cuda"))]
fn cuda_provider(_b: ort::session::builder::SessionBuilder) -> Result<ort::session::builder::SessionBuilder, OnnxError> {
    Err(OnnxError::Cuda {
        why: "a KIND_GPU model needs the backend built with `--features cuda` (and a GPU)",
        source: None,
    })
}

fn element_type(d: DataType) -> TensorElementType {
    match d {
        DataType::Bool => TensorElementType::Bool,
        DataType::U8 => TensorElementType::Uint8,
        DataType::U16 => TensorElementType::Uint16,
        DataType::U32 => TensorElementType::Uint32,
        DataType::U64 => TensorElementType::Uint64,
        DataType::I8 => TensorElementType::Int8,
        DataType::I16 => TensorElementType::Int16,
        DataType::I32 => TensorElementType::Int32,
        DataType::I64 => TensorElementType::Int64,
        DataType::F32 => TensorElementType::Float32,
        DataType::F64 => TensorElementType::Float64,
    }
}

/// The graph's tensor named like the config's must have its element type
/// and agree on every fixed dim (the batch dim included).
fn check_outlet<'a>(
    m: &OnnxModel,
    field: &str,
    want: &TensorConfig,
    mut outlets: impl Iterator<Item = (&'a str, &'a ValueType)>,
) -> Result<(), OnnxError> {
    let err = |f: &str, what: String| OnnxError::Model(RepositoryError::field(&m.config_path, format!("{field}.{f}"), what));
    let Some((_, ty)) = outlets.find(|(n, _)| *n == want.name) else {
        return Err(err("name", format!("the graph {} has no tensor '{}'", m.path.display(), want.name)));
    };
    let ValueType::Tensor { ty, shape, .. } = ty else {
        return Err(err("name", format!("'{}' is not a tensor in the graph", want.name)));
    };
    if *ty != element_type(want.data_type) {
        return Err(err("data_type", format!("{} but the graph says {ty:?}", want.data_type.triton_name())));
    }
    let graph: Vec<i64> = shape.iter().copied().collect();
    let mut config: Vec<i64> = Vec::with_capacity(graph.len());
    if m.max_batch_size > 0 {
        config.push(-1);
    }
    config.extend_from_slice(want.model_dims());
    let agree = graph.len() == config.len()
        && graph.iter().zip(&config).enumerate().all(|(i, (&g, &c))| {
            if i == 0 && m.max_batch_size > 0 {
                // A fixed batch dim cannot take batches up to max_batch_size.
                g < 0 || (m.max_batch_size == 1 && g == 1)
            } else {
                g < 0 || g == c
            }
        });
    if !agree {
        return Err(err(
            "dims",
            format!("config {:?} (max_batch_size {}) disagrees with the graph's {graph:?}", want.model_dims(), m.max_batch_size),
        ));
    }
    Ok(())
}

/// Where a run's input comes from.
enum InputSource {
    /// `[b, ..]` starting at this staging offset (zero copy).
    Staging(u64),
    /// Gathered into the device's scratch buffer (moved to the thread and
    /// back: no allocation).
    Scratch(Vec<u8>),
}

struct RunRequest {
    model: u32,
    batch: u32,
    input: InputSource,
    /// Where the outputs go (`None`: a warm-up run; discarded).
    output: Option<OutputRef>,
}

/// One warm-up run ([`OnnxOptions::warmup`]), as measured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WarmupRun {
    /// Device thread.
    pub device: u32,
    /// Model id.
    pub model: u32,
    /// Batch size.
    pub batch: u32,
    /// How long the run took.
    pub elapsed: StdDuration,
}

struct RunDone {
    device: u32,
    ok: bool,
    elapsed: StdDuration,
    /// The input tensor's data pointer (the zero-copy check).
    data_ptr: usize,
    scratch: Option<Vec<u8>>,
    error: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DeviceState {
    Idle,
    /// Submitted, handed over at `at`.
    Pending { at: Instant },
    /// Running since `start`.
    Running { start: Instant },
    /// Finished but not yet reported (the `out` buffer was full).
    Done,
}

struct Device {
    state: DeviceState,
    tag: u64,
    batch: u32,
    model: u32,
    input: InputSourceKind,
    output: OutputRef,
    to_thread: Option<SyncSender<RunRequest>>,
    thread: Option<JoinHandle<()>>,
    scratch: Option<Vec<u8>>,
    finished: Finished,
    last_data_ptr: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum InputSourceKind {
    Staging(u64),
    Scratch,
}

/// Called by a device thread when a batch finishes.
pub type Waker = Arc<dyn Fn() + Send + Sync>;

/// ONNX Runtime over the staging region; see the module docs.
pub struct OnnxExecutor {
    staging: Arc<Region>,
    models: Vec<OnnxModel>,
    load_errors: Vec<Option<String>>,
    max_batch: u32,
    devices: Vec<Device>,
    done: Receiver<RunDone>,
    /// A completion taken by [`OnnxExecutor::wait`], reported by `poll`.
    stash: Option<RunDone>,
    waker: Arc<OnceLock<Waker>>,
    bytes_copied: Arc<AtomicU64>,
    last_error: Option<String>,
    warmup: Vec<WarmupRun>,
}

impl std::fmt::Debug for OnnxExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnnxExecutor")
            .field("models", &self.models.iter().map(|m| &m.name).collect::<Vec<_>>())
            .field("devices", &self.devices.len())
            .finish()
    }
}

impl OnnxExecutor {
    /// Loads `models` (indexed by model id) on `opts.devices` device
    /// threads over `staging`. A model that fails to load is recorded
    /// ([`OnnxExecutor::load_error`]) and the others serve; a missing
    /// runtime library or a refused CUDA provider fails the whole call.
    pub fn new(staging: Arc<Region>, models: Vec<OnnxModel>, opts: &OnnxOptions) -> Result<Self, OnnxError> {
        Self::with_slots(staging, models.into_iter().map(Ok).collect(), opts)
    }

    /// As [`OnnxExecutor::new`], with model ids that cannot be served
    /// (`Err((name, why))`: not in the repository, refused by it, not held
    /// by this backend): their batches fail and `load_error` says why.
    pub fn with_slots(
        staging: Arc<Region>,
        slots: Vec<Result<OnnxModel, (String, String)>>,
        opts: &OnnxOptions,
    ) -> Result<Self, OnnxError> {
        let env = environment(opts.dylib.as_deref())?;
        let mut load_errors: Vec<Option<String>> = Vec::with_capacity(slots.len());
        let models: Vec<OnnxModel> = slots
            .into_iter()
            .map(|s| match s {
                Ok(m) => {
                    load_errors.push(None);
                    m
                }
                Err((name, why)) => {
                    load_errors.push(Some(why));
                    OnnxModel::unavailable(&name)
                }
            })
            .collect();
        let ndev = opts.devices.max(1);
        let max_batch = models.iter().map(OnnxModel::max_batch).max().unwrap_or(1);
        let max_input = models.iter().map(|m| u64::from(m.input_bytes()) * u64::from(m.max_batch())).max().unwrap_or(0);
        // Sessions per device; a model that fails on device 0 is not
        // retried on the others.
        let mut per_device: Vec<Vec<Option<Session>>> = Vec::with_capacity(ndev as usize);
        for _ in 0..ndev {
            let mut sessions = Vec::with_capacity(models.len());
            for (i, m) in models.iter().enumerate() {
                if load_errors[i].is_some() {
                    sessions.push(None);
                    continue;
                }
                match load_session(m, opts, env) {
                    Ok(s) => sessions.push(Some(s)),
                    Err(e @ (OnnxError::Cuda { .. } | OnnxError::Runtime(_))) => return Err(e),
                    Err(e) => {
                        load_errors[i] = Some(e.to_string());
                        sessions.push(None);
                    }
                }
            }
            per_device.push(sessions);
        }
        let (done_tx, done) = mpsc::sync_channel::<RunDone>(ndev as usize);
        let waker: Arc<OnceLock<Waker>> = Arc::new(OnceLock::new());
        let mut devices = Vec::with_capacity(ndev as usize);
        let mut warmup = Vec::new();
        for (d, sessions) in per_device.into_iter().enumerate() {
            let (tx, rx) = mpsc::sync_channel::<RunRequest>(1);
            let mut ctx = DeviceThread {
                device: d as u32,
                staging: staging.clone(),
                models: models.clone(),
                sessions,
                done: done_tx.clone(),
                waker: waker.clone(),
            };
            let mut scratch = vec![0u8; max_input as usize];
            if opts.warmup {
                scratch = ctx.warm_up(scratch, &mut load_errors, &mut warmup);
            }
            let thread = std::thread::Builder::new()
                .name(format!("onnx-dev{d}"))
                .spawn(move || ctx.run(rx))
                .map_err(OnnxError::Thread)?;
            devices.push(Device {
                state: DeviceState::Idle,
                tag: 0,
                batch: 0,
                model: 0,
                input: InputSourceKind::Scratch,
                output: OutputRef::default(),
                to_thread: Some(tx),
                thread: Some(thread),
                scratch: Some(scratch),
                finished: Finished::default(),
                last_data_ptr: 0,
            });
        }
        Ok(OnnxExecutor {
            staging,
            models,
            load_errors,
            max_batch,
            devices,
            done,
            stash: None,
            waker,
            bytes_copied: Arc::new(AtomicU64::new(0)),
            last_error: None,
            warmup,
        })
    }

    /// The warm-up runs made at construction, in order (empty with
    /// [`OnnxOptions::warmup`] off).
    pub fn warmup_runs(&self) -> &[WarmupRun] {
        &self.warmup
    }

    /// The served models (by model id).
    pub fn models(&self) -> &[OnnxModel] {
        &self.models
    }

    /// Why model `model` did not load (`None`: it serves).
    pub fn load_error(&self, model: u32) -> Option<&str> {
        self.load_errors.get(model as usize).and_then(|e| e.as_deref())
    }

    /// Input bytes gathered into scratch buffers instead of being read in
    /// place (0 when every batch's inputs were contiguous).
    pub fn bytes_copied(&self) -> u64 {
        self.bytes_copied.load(Ordering::Relaxed)
    }

    /// The data pointer of the input tensor of `device`'s last batch.
    pub fn last_input_ptr(&self, device: u32) -> Option<usize> {
        self.devices.get(device as usize).map(|d| d.last_data_ptr)
    }

    /// The last run failure's message (if any).
    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    /// Blocks until a running batch finishes or `timeout` passes; the
    /// completion is reported by the next [`Executor::poll`]. For callers
    /// with nothing else to do (tests, `symphony profile`).
    pub fn wait(&mut self, timeout: StdDuration) -> bool {
        if self.stash.is_some() {
            return true;
        }
        match self.done.recv_timeout(timeout) {
            Ok(d) => {
                self.stash = Some(d);
                true
            }
            Err(_) => false,
        }
    }

    fn dispatch(&mut self, now: Instant, d: usize) {
        let dev = &mut self.devices[d];
        let input = match dev.input {
            InputSourceKind::Staging(off) => Some(InputSource::Staging(off)),
            // The scratch buffer is back whenever the device is idle; a
            // missing one (its thread died mid-run) fails the batch.
            InputSourceKind::Scratch => dev.scratch.take().map(InputSource::Scratch),
        };
        let sent = input.is_some_and(|input| {
            let req = RunRequest {
                model: dev.model,
                batch: dev.batch,
                input,
                output: Some(dev.output),
            };
            dev.to_thread.as_ref().is_some_and(|tx| tx.send(req).is_ok())
        });
        if sent {
            dev.state = DeviceState::Running { start: now };
        } else {
            // The thread is gone (it panicked): the batch fails.
            dev.finished = Finished {
                tag: dev.tag,
                device: d as u32,
                batch: dev.batch,
                start: now,
                finish: now,
                ok: false,
            };
            dev.state = DeviceState::Done;
        }
    }

    fn complete(&mut self, r: RunDone) {
        let Some(dev) = self.devices.get_mut(r.device as usize) else { return };
        let DeviceState::Running { start } = dev.state else { return };
        if r.scratch.is_some() {
            dev.scratch = r.scratch;
        }
        dev.last_data_ptr = r.data_ptr;
        if let Some(e) = r.error {
            self.last_error = Some(e);
        }
        let took = Duration::from_nanos(u64::try_from(r.elapsed.as_nanos()).unwrap_or(u64::MAX));
        dev.finished = Finished {
            tag: dev.tag,
            device: r.device,
            batch: dev.batch,
            start,
            finish: start + took,
            ok: r.ok,
        };
        dev.state = DeviceState::Done;
    }
}

impl Drop for OnnxExecutor {
    fn drop(&mut self) {
        for d in &mut self.devices {
            // Closing the channel ends the thread after its current run.
            d.to_thread = None;
        }
        for d in &mut self.devices {
            if let Some(t) = d.thread.take() {
                let _ = t.join();
            }
        }
    }
}

impl Executor for OnnxExecutor {
    fn devices(&self) -> u32 {
        self.devices.len() as u32
    }

    fn max_batch(&self) -> u32 {
        self.max_batch
    }

    fn output_len(&self, model: u32) -> Option<u32> {
        self.models.get(model as usize).map(OnnxModel::output_bytes)
    }

    fn is_idle(&self, device: u32) -> bool {
        self.devices.get(device as usize).is_some_and(|d| d.state == DeviceState::Idle)
    }

    fn submit(&mut self, now: Instant, job: &Job<'_>) -> Result<(), ExecError> {
        let model = self.models.get(job.model as usize).ok_or(ExecError::NoSuchModel(job.model))?;
        let dev = self.devices.get(job.device as usize).ok_or(ExecError::NoSuchDevice(job.device))?;
        if dev.state != DeviceState::Idle {
            return Err(ExecError::DeviceBusy { device: job.device });
        }
        check_job(job, self.staging.len(), self.max_batch, model.output_bytes())?;
        let sample = model.input_bytes();
        // A batch that cannot run is accepted and fails (batch 0): the
        // worker answers its tasks with an execution error and goes on.
        let refused = if let Some(e) = &self.load_errors[job.model as usize] {
            Some(format!("model {} is not loaded: {e}", model.name))
        } else if job.inputs.len() > model.max_batch() as usize {
            Some(format!("model {}: batch {} above max_batch_size {}", model.name, job.inputs.len(), model.max_batch()))
        } else if job.inputs.iter().any(|r| r.len != sample) {
            Some(format!("model {}: an input is not {sample} bytes", model.name))
        } else {
            None
        };
        let first = job.inputs[0].offset;
        let elem = model.input.data_type.size();
        let contiguous = job
            .inputs
            .iter()
            .enumerate()
            .all(|(i, r)| r.offset == first + i as u64 * u64::from(sample));
        let aligned = (self.staging.as_ptr() as usize + first as usize).is_multiple_of(elem as usize);
        let input = if contiguous && aligned {
            InputSourceKind::Staging(first)
        } else {
            if refused.is_none() {
                let d = &mut self.devices[job.device as usize];
                if let Some(scratch) = d.scratch.as_mut() {
                    for (i, r) in job.inputs.iter().enumerate() {
                        let at = i * sample as usize;
                        if self.staging.read_at(r.offset, &mut scratch[at..at + sample as usize]).is_err() {
                            return Err(ExecError::BadJob("input outside the staging region"));
                        }
                    }
                    self.bytes_copied.fetch_add(u64::from(sample) * job.inputs.len() as u64, Ordering::Relaxed);
                }
            }
            InputSourceKind::Scratch
        };
        let d = &mut self.devices[job.device as usize];
        d.tag = job.tag;
        d.model = job.model;
        d.batch = if refused.is_some() { 0 } else { job.inputs.len() as u32 };
        d.input = input;
        d.output = job.output;
        d.state = DeviceState::Pending { at: now.max(job.exec_at) };
        if refused.is_some() {
            self.last_error = refused;
        }
        Ok(())
    }

    fn poll(&mut self, now: Instant, out: &mut [Finished]) -> usize {
        if let Some(r) = self.stash.take() {
            self.complete(r);
        }
        while let Ok(r) = self.done.try_recv() {
            self.complete(r);
        }
        for d in 0..self.devices.len() {
            if let DeviceState::Pending { at } = self.devices[d].state {
                if at <= now {
                    self.dispatch(now, d);
                }
            }
        }
        let mut n = 0;
        for d in &mut self.devices {
            if n == out.len() {
                break;
            }
            if d.state == DeviceState::Done {
                let mut f = d.finished;
                if d.batch == 0 {
                    f.ok = false;
                    f.batch = 0;
                }
                out[n] = f;
                n += 1;
                d.state = DeviceState::Idle;
            }
        }
        n
    }

    fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    /// Sets the function device threads call when a batch finishes (once).
    fn set_waker(&self, waker: Waker) {
        let _ = self.waker.set(waker);
    }

    fn next_wakeup(&self) -> Option<Instant> {
        let waker = self.waker.get().is_some();
        self.devices
            .iter()
            .filter_map(|d| match d.state {
                DeviceState::Pending { at } => Some(at),
                DeviceState::Done => Some(Instant::ZERO),
                // A completion wakes the host through the waker; without
                // one the host must poll.
                DeviceState::Running { start } if !waker => Some(start),
                _ => None,
            })
            .min()
    }
}

/// What a device thread owns.
struct DeviceThread {
    device: u32,
    staging: Arc<Region>,
    models: Vec<OnnxModel>,
    sessions: Vec<Option<Session>>,
    done: SyncSender<RunDone>,
    waker: Arc<OnceLock<Waker>>,
}

impl DeviceThread {
    /// [`OnnxOptions::warmup`]: each loaded model at its largest batch,
    /// then at batch 1, zero inputs in `scratch` (returned for the device
    /// to keep), outputs discarded. A failed run unloads the model
    /// (`load_errors` says why). Runs on the constructing thread, before
    /// this device thread exists.
    fn warm_up(&mut self, scratch: Vec<u8>, load_errors: &mut [Option<String>], runs: &mut Vec<WarmupRun>) -> Vec<u8> {
        let mut req = RunRequest { model: 0, batch: 0, input: InputSource::Scratch(scratch), output: None };
        let largest: Vec<u32> = self.models.iter().map(OnnxModel::max_batch).collect();
        for (model, (error, &largest)) in load_errors.iter_mut().zip(&largest).enumerate() {
            let sizes = [largest, 1];
            for &batch in &sizes[..if largest > 1 { 2 } else { 1 }] {
                if error.is_some() {
                    break;
                }
                req.model = model as u32;
                req.batch = batch;
                let t0 = std::time::Instant::now();
                match self.run_one(&mut req) {
                    Ok(_) => runs.push(WarmupRun { device: self.device, model: model as u32, batch, elapsed: t0.elapsed() }),
                    Err(e) => {
                        *error = Some(format!("warm-up run at batch {batch} failed: {e}"));
                        self.sessions[model] = None;
                    }
                }
            }
        }
        match req.input {
            InputSource::Scratch(s) => s,
            InputSource::Staging(_) => Vec::new(),
        }
    }

    fn run(mut self, rx: Receiver<RunRequest>) {
        for mut req in rx {
            let t0 = std::time::Instant::now();
            let result = self.run_one(&mut req);
            let elapsed = t0.elapsed();
            let (ok, data_ptr, error) = match result {
                Ok(ptr) => (true, ptr, None),
                Err(e) => (false, 0, Some(e.to_string())),
            };
            let scratch = match req.input {
                InputSource::Scratch(s) => Some(s),
                InputSource::Staging(_) => None,
            };
            let done = RunDone {
                device: self.device,
                ok,
                elapsed,
                data_ptr,
                scratch,
                error,
            };
            if self.done.send(done).is_err() {
                return;
            }
            if let Some(w) = self.waker.get() {
                w();
            }
        }
    }

    /// Runs one batch; returns the input tensor's data pointer.
    fn run_one(&mut self, req: &mut RunRequest) -> Result<usize, RunError> {
        let b = req.batch;
        let Some(m) = self.models.get(req.model as usize) else {
            return Err(RunError::NoModel { model: req.model });
        };
        let Some(Some(session)) = self.sessions.get_mut(req.model as usize) else {
            return Err(RunError::NotLoaded { model: m.name.clone() });
        };
        if b == 0 {
            return Err(RunError::EmptyBatch { model: m.name.clone(), bytes: m.input_bytes() });
        }
        let ort_err = |what: &'static str| move |source: ort::Error| RunError::Ort { model: m.name.clone(), what, source };
        let sample = m.input.sample_bytes().unwrap_or(0) as usize;
        let total = sample * b as usize;
        let ptr: *mut u8 = match &mut req.input {
            InputSource::Staging(off) => {
                self.staging.check(*off, total)?;
                // SAFETY: `check` proved `off..off+total` lies inside the
                // region, whose mapping lives as long as `self.staging`.
                unsafe { self.staging.as_ptr().add(*off as usize) }
            }
            InputSource::Scratch(s) => {
                if s.len() < total {
                    return Err(RunError::ScratchTooSmall);
                }
                s.as_mut_ptr()
            }
        };
        let batch_dim = (m.max_batch_size > 0).then_some(i64::from(b));
        let shape = Shape::new(batch_dim.into_iter().chain(m.input.model_dims().iter().copied()));
        let info = MemoryInfo::default();
        macro_rules! view {
            ($t:ty) => {{
                // SAFETY: `ptr` addresses `total` = b * sample bytes (checked
                // above), aligned for the element type (checked at submit
                // for staging; Vec<u8> scratch is re-checked below), and the
                // executor does not touch this batch's inputs until the run
                // is reported (the Executor contract); the view lives only
                // within this function.
                let t = unsafe { TensorRefMut::<$t>::from_raw(info.clone(), ptr.cast(), shape) }.map_err(ort_err("input view"))?;
                let p = t.data_ptr() as usize;
                (SessionInputValue::from(t.into_dyn()), p)
            }};
        }
        if !(ptr as usize).is_multiple_of(m.input.data_type.size() as usize) {
            return Err(RunError::Misaligned);
        }
        let (value, data_ptr) = match m.input.data_type {
            DataType::Bool => view!(bool),
            DataType::U8 => view!(u8),
            DataType::U16 => view!(u16),
            DataType::U32 => view!(u32),
            DataType::U64 => view!(u64),
            DataType::I8 => view!(i8),
            DataType::I16 => view!(i16),
            DataType::I32 => view!(i32),
            DataType::I64 => view!(i64),
            DataType::F32 => view!(f32),
            DataType::F64 => view!(f64),
        };
        let mut outputs = session.run([value]).map_err(ort_err("run failed"))?;
        let out = outputs
            .remove(&m.output.name)
            .ok_or_else(|| RunError::NoOutput { model: m.name.clone(), output: m.output.name.clone() })?
            .downcast::<DynTensorValueType>()
            .map_err(ort_err("output"))?;
        let out_len = m.output.sample_bytes().unwrap_or(0) as usize;
        let want = out_len * b as usize;
        let ValueType::Tensor { shape, ty, .. } = out.dtype() else {
            return Err(RunError::NotATensor { model: m.name.clone() });
        };
        if *ty != element_type(m.output.data_type) {
            return Err(RunError::OutputType { model: m.name.clone(), ty: format!("{ty:?}") });
        }
        let got = shape.iter().try_fold(m.output.data_type.size() as usize, |a, &d| usize::try_from(d).ok().map(|d| a * d));
        if got != Some(want) {
            return Err(RunError::OutputSize { model: m.name.clone(), got, want });
        }
        let src = out.data_ptr().cast::<u8>();
        // SAFETY: ONNX Runtime's CPU output tensor holds `want` bytes
        // (its shape times the element size, checked above) at `src`,
        // valid while `outputs` lives.
        let bytes = unsafe { std::slice::from_raw_parts(src, want) };
        if let Some(o) = req.output {
            for i in 0..b as usize {
                let at = o.offset + i as u64 * u64::from(o.stride);
                self.staging.write_at(at, &bytes[i * out_len..(i + 1) * out_len])?;
            }
        }
        Ok(data_ptr)
    }
}
