//! The models a frontend serves: each scheduler [`ModelSpec`] plus the
//! tensors its API declares.

use crate::tensor::{DataType, TensorSpec};
pub use dataplane::reference::{DEFAULT_INPUT_BYTES, DEFAULT_OUTPUT_BYTES};
use scheduler_core::zoo::ModelSpec;
use std::collections::HashMap;
use std::time::Duration;

/// What the frontend does with a request the cluster drops because it
/// cannot finish by its deadline (`deadline_unmeetable`, `early_drop`) or
/// fails for a cause of its own (see [`Resend`]).
/// Per model: `parameters { key: "late_answers" value { string_value:
/// "serve" | "refuse" } }` in its config.pbtxt, and for `serve` the bound
/// `late_answers_max_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LateAnswers {
    /// Answer the drop at once, as an error (HTTP 503 / gRPC UNAVAILABLE
    /// with the reason): the paper's early refusal, so a client can go
    /// elsewhere while there is time. The zoo's models.
    Refuse,
    /// Queue it again with a fresh SLO and answer it late, as Triton
    /// answers a request that waited past any delay (its default queue
    /// policy has no timeout), until it has waited `max_wait` in all;
    /// then it is refused as above. Its answer counts as late (outcome
    /// `late` per level), never as good. Memory stays bounded: a waiting
    /// request holds one staging slot, as on its first try. The default
    /// of a model-repository model.
    Serve {
        /// The longest a request is kept, from its arrival.
        max_wait: Duration,
    },
}

/// Why a request of a model that serves late answers is sent again: the
/// ends of a try that are the cluster's doing, not the request's, so a
/// later try can change them. Other ends are answered as they are: the
/// model failing on its backend (`ExecFailed`: a model that failed to
/// load fails every try, and a resend would multiply its load), the
/// admission bound (`overloaded`: a resend would defeat it), the client's
/// own timeout or cancel, a shutdown, an unknown model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resend {
    /// Dropped for its deadline (`deadline_unmeetable`, `early_drop`).
    Deadline,
    /// Its batch was given up by the scheduler (overdue past the grace
    /// after a host stall, or its backend left).
    Abandoned,
    /// Its backend could not fetch its input (a data link not up yet).
    InputUnavailable,
}

impl Resend {
    /// Every cause, in counter order.
    pub const ALL: [Resend; 3] = [Resend::Deadline, Resend::Abandoned, Resend::InputUnavailable];
    /// Its `cause` label.
    pub const fn as_str(self) -> &'static str {
        match self {
            Resend::Deadline => "deadline",
            Resend::Abandoned => "abandoned",
            Resend::InputUnavailable => "input_unavailable",
        }
    }
}

/// Parameter choosing [`LateAnswers`].
pub const LATE_ANSWERS_KEY: &str = "late_answers";
/// Parameter bounding [`LateAnswers::Serve`]'s wait, milliseconds.
pub const LATE_ANSWERS_MAX_KEY: &str = "late_answers_max_ms";
/// [`LateAnswers::Serve`]'s default bound, in SLOs ...
pub const LATE_ANSWERS_MAX_SLOS: u32 = 10;
/// ... and at least this: on a busy host a 20 ms model's 200 ms was
/// shorter than a stall, and perf_analyzer aborts on the refusal (Triton's
/// default queue policy waits without a bound).
pub const LATE_ANSWERS_MAX_FLOOR: Duration = Duration::from_secs(5);

/// The default bound of a model whose SLO is `slo`.
fn default_late_bound(slo: Duration) -> Duration {
    slo.saturating_mul(LATE_ANSWERS_MAX_SLOS).max(LATE_ANSWERS_MAX_FLOOR)
}

impl LateAnswers {
    /// The choice of a repository model whose SLO is `slo` and whose
    /// config.pbtxt has `parameters` (key, value): serve late unless
    /// `late_answers` says `refuse`; the bound `late_answers_max_ms` or
    /// [`LATE_ANSWERS_MAX_SLOS`] SLOs, at least [`LATE_ANSWERS_MAX_FLOOR`].
    /// A value it cannot read is an error
    /// naming the parameter.
    pub fn from_parameters(parameters: &[(String, String)], slo: Duration) -> Result<Self, String> {
        let value = |key: &str| parameters.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.trim());
        let max_wait = match value(LATE_ANSWERS_MAX_KEY) {
            None => default_late_bound(slo),
            Some(v) => match v.parse::<f64>() {
                Ok(ms) if ms.is_finite() && ms > 0.0 && ms <= 3_600_000.0 => Duration::from_secs_f64(ms / 1e3),
                _ => return Err(format!("parameters[{LATE_ANSWERS_MAX_KEY}]: {v:?} is not a number of milliseconds in (0, 3600000]")),
            },
        };
        match value(LATE_ANSWERS_KEY) {
            None | Some("serve") => Ok(LateAnswers::Serve { max_wait }),
            Some("refuse") => Ok(LateAnswers::Refuse),
            Some(v) => Err(format!("parameters[{LATE_ANSWERS_KEY}]: {v:?} is neither \"serve\" nor \"refuse\"")),
        }
    }
}

/// Default declared input: `INPUT0`, FP32 `[1, 16]`
/// ([`DEFAULT_INPUT_BYTES`]). Small on purpose: the
/// zoo models' real inputs (e.g. FP32 `[1,3,224,224]`, 602 KB) would make
/// every test and load run mostly a JSON-parsing benchmark.
pub fn default_input() -> TensorSpec {
    TensorSpec::new(
        "INPUT0",
        DataType::F32,
        &[1, u64::from(DEFAULT_INPUT_BYTES) / 4],
    )
}

/// Default declared output: `OUTPUT0`, UINT8 `[1, 40]`, filled by
/// [`crate::tensor::reference_output`] (arbitrary bytes: an integer type
/// keeps every value representable in JSON). 40 bytes is
/// [`DEFAULT_OUTPUT_BYTES`], what backends must produce per input.
pub fn default_output() -> TensorSpec {
    TensorSpec::new(
        "OUTPUT0",
        DataType::U8,
        &[1, u64::from(DEFAULT_OUTPUT_BYTES)],
    )
}

/// One served model.
#[derive(Clone, Debug)]
pub struct ModelEntry {
    /// Dense id (index in the catalog; the scheduler's model id).
    pub id: u32,
    /// Scheduling facts: name, profile, SLO.
    pub spec: ModelSpec,
    /// The one input tensor.
    pub input: TensorSpec,
    /// The one output tensor.
    pub output: TensorSpec,
    /// Version string reported in metadata.
    pub version: String,
    /// Platform string reported in metadata.
    pub platform: String,
}

/// The served models, by id and by name.
#[derive(Clone, Debug, Default)]
pub struct ModelCatalog {
    entries: Vec<ModelEntry>,
    by_name: HashMap<String, u32>,
    /// Each model's [`LateAnswers`], by id.
    late: Vec<LateAnswers>,
}

impl ModelCatalog {
    /// A catalog of `specs` (id = index) with the default tensors.
    pub fn with_default_tensors(specs: &[ModelSpec]) -> Self {
        let mut c = ModelCatalog::default();
        for s in specs {
            c.push(s.clone(), default_input(), default_output());
        }
        c
    }

    /// A catalog of `specs` (id = index) whose models found by name in a
    /// Triton-layout repository (with one input and one output of fixed
    /// dims) declare the repository's tensors, shape `[1, dims..]` per
    /// request, platform and newest version; the others keep the default
    /// tensors (a backend cannot run them: their requests fail with an
    /// execution error).
    pub fn with_repository(specs: &[ModelSpec], repo: &scheduler_core::repository::Repository) -> Self {
        let mut c = ModelCatalog::default();
        for s in specs {
            let found = repo.model(&s.name).and_then(|m| {
                let cfg = &m.config;
                let tensor = |t: &scheduler_core::repository::TensorConfig| {
                    let dims: Option<Vec<u64>> = std::iter::once(1i64)
                        .chain(t.dims.iter().copied())
                        .map(|d| u64::try_from(d).ok())
                        .collect();
                    Some(TensorSpec::new(
                        &t.name,
                        t.data_type,
                        &dims?,
                    ))
                };
                match (cfg.inputs.as_slice(), cfg.outputs.as_slice()) {
                    ([i], [o]) => Some((
                        tensor(i)?,
                        tensor(o)?,
                        m.latest().version,
                        cfg.platform.clone(),
                        late_answers_of(m),
                    )),
                    _ => None,
                }
            });
            match found {
                Some((input, output, version, platform, late)) => {
                    let id = c.push(s.clone(), input, output);
                    c.late[id as usize] = late;
                    let e = &mut c.entries[id as usize];
                    e.version = version.to_string();
                    e.platform = if platform.is_empty() {
                        "onnxruntime_onnx".into()
                    } else {
                        platform
                    };
                }
                None => {
                    c.push(s.clone(), default_input(), default_output());
                }
            }
        }
        c
    }

    /// Adds a model with explicit tensors; returns its id. The output's
    /// bytes are [`crate::tensor::reference_output`] of the input.
    /// A duplicate name shadows nothing: the first one keeps the name.
    pub fn push(&mut self, spec: ModelSpec, input: TensorSpec, output: TensorSpec) -> u32 {
        let id = self.entries.len() as u32;
        self.by_name.entry(spec.name.clone()).or_insert(id);
        self.entries.push(ModelEntry {
            id,
            spec,
            input,
            output,
            version: "1".into(),
            platform: "symphony_emulated".into(),
        });
        self.late.push(LateAnswers::Refuse);
        id
    }

    /// What model `id` does with a request that cannot meet its deadline
    /// ([`LateAnswers::Refuse`] for an id outside the catalog).
    pub fn late_answers(&self, id: u32) -> LateAnswers {
        self.late.get(id as usize).copied().unwrap_or(LateAnswers::Refuse)
    }

    /// Sets model `id`'s [`LateAnswers`]; false if there is no such model.
    pub fn set_late_answers(&mut self, id: u32, late: LateAnswers) -> bool {
        match self.late.get_mut(id as usize) {
            Some(l) => {
                *l = late;
                true
            }
            None => false,
        }
    }

    /// The model named `name`.
    pub fn by_name(&self, name: &str) -> Option<&ModelEntry> {
        self.by_name
            .get(name)
            .and_then(|&i| self.entries.get(i as usize))
    }
    /// The model with id `id`.
    pub fn by_id(&self, id: u32) -> Option<&ModelEntry> {
        self.entries.get(id as usize)
    }
    /// Every model, by id.
    pub fn entries(&self) -> &[ModelEntry] {
        &self.entries
    }
    /// The scheduler specs, by id.
    pub fn specs(&self) -> Vec<ModelSpec> {
        self.entries.iter().map(|e| e.spec.clone()).collect()
    }
    /// The largest input of any model, bytes (the staging slot size needed).
    pub fn max_input_bytes(&self) -> u64 {
        self.entries
            .iter()
            .map(|e| e.input.byte_len())
            .max()
            .unwrap_or(0)
    }
    /// The largest output of any model, bytes.
    pub fn max_output_bytes(&self) -> u64 {
        self.entries
            .iter()
            .map(|e| e.output.byte_len())
            .max()
            .unwrap_or(0)
    }
}

/// A repository model's [`LateAnswers`]; a parameter it cannot read
/// leaves the default (serve late, the default bound) and is
/// logged, as the model itself still serves.
fn late_answers_of(m: &scheduler_core::repository::RepoModel) -> LateAnswers {
    LateAnswers::from_parameters(&m.config.parameters, m.slo()).unwrap_or_else(|e| {
        tracing::warn!(model = m.name(), "{}: {e}; serving late answers by default", m.config_path.display());
        LateAnswers::Serve { max_wait: default_late_bound(m.slo()) }
    })
}

/// Which catalog models take requests (the model-control extension's
/// load/unload, explicit mode): all loaded at start. An unloaded model's
/// new requests are refused as unavailable, and the requests still waiting
/// for their outcome are woken ([`unloaded`](Self::unloaded)) and answered
/// as unloaded. Loading only re-enables a model of the catalog (the
/// cluster's model list is fixed when it forms).
#[derive(Debug)]
pub struct ModelStates {
    loaded: Box<[std::sync::atomic::AtomicBool]>,
    /// Woken when the model of the same index is unloaded.
    unloads: Box<[tokio::sync::Notify]>,
}

impl ModelStates {
    /// Every model of `catalog` loaded.
    pub fn all_loaded(catalog: &ModelCatalog) -> Self {
        let n = catalog.entries().len();
        ModelStates {
            loaded: (0..n).map(|_| std::sync::atomic::AtomicBool::new(true)).collect(),
            unloads: (0..n).map(|_| tokio::sync::Notify::new()).collect(),
        }
    }
    /// Whether model `id` takes requests.
    pub fn is_loaded(&self, id: u32) -> bool {
        self.loaded
            .get(id as usize)
            .is_some_and(|l| l.load(std::sync::atomic::Ordering::Acquire))
    }
    /// Loads (`true`) or unloads model `id`; false if there is no such model.
    pub fn set_loaded(&self, id: u32, loaded: bool) -> bool {
        match self.loaded.get(id as usize) {
            Some(l) => {
                l.store(loaded, std::sync::atomic::Ordering::Release);
                if !loaded {
                    if let Some(n) = self.unloads.get(id as usize) {
                        n.notify_waiters();
                    }
                }
                true
            }
            None => false,
        }
    }
    /// Completes once model `id` is unloaded (at once if it is); never for
    /// a model outside the catalog. No allocation: a request's wait
    /// selects on it.
    pub async fn unloaded(&self, id: u32) {
        let Some(unloads) = self.unloads.get(id as usize) else {
            return std::future::pending().await;
        };
        loop {
            let notified = unloads.notified();
            tokio::pin!(notified);
            // Registered before the flag is read, so an unload between the
            // read and the await still wakes this waiter.
            notified.as_mut().enable();
            if !self.is_loaded(id) {
                return;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_unload_wakes_the_waiters_of_that_model_only() {
        let catalog = ModelCatalog::with_default_tensors(&[
            scheduler_core::zoo::ModelSpec::linear("a", 1.0, 1.0, 50.0).unwrap(),
            scheduler_core::zoo::ModelSpec::linear("b", 1.0, 1.0, 50.0).unwrap(),
        ]);
        let states = std::sync::Arc::new(ModelStates::all_loaded(&catalog));
        let (a, b) = (states.clone(), states.clone());
        let wait_a = tokio::spawn(async move { a.unloaded(0).await });
        let wait_b = tokio::spawn(async move { b.unloaded(1).await });
        tokio::task::yield_now().await;
        assert!(states.set_loaded(0, false));
        wait_a.await.unwrap();
        assert!(!wait_b.is_finished());
        assert!(states.set_loaded(0, true));
        assert!(states.set_loaded(1, false));
        wait_b.await.unwrap();
        // Already unloaded: at once.
        states.unloaded(1).await;
    }

    #[test]
    fn late_answers_read_from_parameters_default_to_serving_ten_slos_or_five_seconds() {
        let slo = Duration::from_millis(20);
        let p = |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>();
        assert_eq!(LateAnswers::from_parameters(&p(&[]), slo), Ok(LateAnswers::Serve { max_wait: Duration::from_secs(5) }));
        assert_eq!(
            LateAnswers::from_parameters(&p(&[]), Duration::from_secs(1)),
            Ok(LateAnswers::Serve { max_wait: Duration::from_secs(10) })
        );
        assert_eq!(LateAnswers::from_parameters(&p(&[("late_answers", "refuse")]), slo), Ok(LateAnswers::Refuse));
        assert_eq!(
            LateAnswers::from_parameters(&p(&[("late_answers", " serve "), ("late_answers_max_ms", "1500")]), slo),
            Ok(LateAnswers::Serve { max_wait: Duration::from_millis(1500) })
        );
        for bad in [("late_answers", "queue"), ("late_answers_max_ms", "-1"), ("late_answers_max_ms", "NaN"), ("late_answers_max_ms", "1e99")] {
            let e = LateAnswers::from_parameters(&p(&[bad]), slo).unwrap_err();
            assert!(e.contains(bad.0), "{e}");
        }
        let c = ModelCatalog::with_default_tensors(&[scheduler_core::zoo::ModelSpec::linear("a", 1.0, 1.0, 50.0).unwrap()]);
        assert_eq!(c.late_answers(0), LateAnswers::Refuse, "the zoo's models refuse early");
        assert_eq!(c.late_answers(9), LateAnswers::Refuse);
    }

    #[test]
    fn default_tensors_have_the_sizes_backends_assume() {
        assert_eq!(default_input().byte_len(), u64::from(DEFAULT_INPUT_BYTES));
        assert_eq!(default_output().byte_len(), u64::from(DEFAULT_OUTPUT_BYTES));
    }
}
