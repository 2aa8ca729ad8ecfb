//! The models a frontend serves: each scheduler [`ModelSpec`] plus the
//! tensors its API declares.

use crate::tensor::{DataType, TensorSpec};
pub use dataplane::reference::{DEFAULT_INPUT_BYTES, DEFAULT_OUTPUT_BYTES};
use scheduler::zoo::ModelSpec;
use std::collections::HashMap;

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
    pub fn with_repository(specs: &[ModelSpec], repo: &scheduler::repository::Repository) -> Self {
        let mut c = ModelCatalog::default();
        for s in specs {
            let found = repo.model(&s.name).and_then(|m| {
                let cfg = &m.config;
                let tensor = |t: &scheduler::repository::TensorConfig| {
                    let dims: Option<Vec<u64>> = std::iter::once(1i64)
                        .chain(t.dims.iter().copied())
                        .map(|d| u64::try_from(d).ok())
                        .collect();
                    Some(TensorSpec::new(
                        &t.name,
                        DataType::parse(t.data_type.kserve_name())?,
                        &dims?,
                    ))
                };
                match (cfg.inputs.as_slice(), cfg.outputs.as_slice()) {
                    ([i], [o]) => Some((
                        tensor(i)?,
                        tensor(o)?,
                        m.latest().version,
                        cfg.platform.clone(),
                    )),
                    _ => None,
                }
            });
            match found {
                Some((input, output, version, platform)) => {
                    let id = c.push(s.clone(), input, output);
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
        id
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

/// Which catalog models take requests (the model-control extension's
/// load/unload, explicit mode): all loaded at start. An unloaded model's
/// new requests are refused as unavailable; requests already accepted
/// finish normally. Loading only re-enables a model of the catalog (the
/// cluster's model list is fixed when it forms).
#[derive(Debug)]
pub struct ModelStates {
    loaded: Box<[std::sync::atomic::AtomicBool]>,
}

impl ModelStates {
    /// Every model of `catalog` loaded.
    pub fn all_loaded(catalog: &ModelCatalog) -> Self {
        ModelStates {
            loaded: catalog
                .entries()
                .iter()
                .map(|_| std::sync::atomic::AtomicBool::new(true))
                .collect(),
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
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_tensors_have_the_sizes_backends_assume() {
        assert_eq!(default_input().byte_len(), u64::from(DEFAULT_INPUT_BYTES));
        assert_eq!(default_output().byte_len(), u64::from(DEFAULT_OUTPUT_BYTES));
    }
}
