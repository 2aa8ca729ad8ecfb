//! A model repository in Triton's layout, and its `config.pbtxt` parser
//! (the only one in the tree: the backend's executor, `symphony profile`,
//! `symphony up` and the frontend's Triton surface all read models here).
//!
//! ```text
//! <repo>/<model>/config.pbtxt
//! <repo>/<model>/<version>/model.onnx     (or default_model_filename)
//! ```
//!
//! [`scan`] reads every model directory; a broken model (missing or
//! unreadable file, bad pbtxt, a field that is missing, out of range or
//! unsupported) is refused with a [`RepositoryError`] that names the file
//! and the field, and the other models still load. Checks that need the
//! ONNX graph itself (dims that disagree with the graph) are the
//! executor's, at load time, with the same kind of error.
//!
//! # How Triton's knobs map onto this scheduler's
//!
//! | `config.pbtxt` | here |
//! |---|---|
//! | `max_batch_size` | the largest batch the scheduler plans and the backend runs (the profile's cap) |
//! | `parameters { key: "slo_ms" }` | the model's SLO (default [`DEFAULT_SLO`]) |
//! | `instance_group.count` | recorded; batches a backend runs at once are its devices (`--gpus-per-backend N` on `symphony-backend` and `symphony up`), one scheduler GPU each, so the scheduler plans for them |
//! | `instance_group.kind` | `KIND_GPU`: the CUDA execution provider (feature `cuda`); otherwise CPU |
//! | `dynamic_batching.preferred_batch_size` | recorded, not used: the deferred scheduler sizes each batch from the deadlines and `l(b)`, which is what preferred sizes approximate |
//! | `dynamic_batching.max_queue_delay_microseconds` | recorded, not used: a request waits exactly as long as its deadline allows (deferred batching), never a fixed delay |
//! | `dynamic_batching.priority_levels`, `default_priority_level`, `default_queue_policy.max_queue_size` | the model's [`Admission`](crate::types::Admission) ([`DynamicBatching::admission`]): priority levels, the level of a request that names none, the bound of its queue (over it: refused as overloaded) |
//! | `version_policy` | which version directories load; requests name a version or get the newest loaded |

pub mod config;
pub mod pbtxt;
pub mod profile;

use std::path::{Path, PathBuf};
use std::time::Duration as StdDuration;

pub use config::{
    DataType, DynamicBatching, FieldError, InstanceGroup, InstanceKind, ModelConfig, TensorConfig, VersionPolicy,
};

/// The SLO of a model whose config has no `slo_ms` parameter.
pub const DEFAULT_SLO: StdDuration = StdDuration::from_millis(100);
/// The config file's name in a model directory.
pub const CONFIG_FILE: &str = "config.pbtxt";

/// Why a model (or the repository) was refused. Every variant names the
/// file; field errors name the field.
#[derive(Debug, thiserror::Error)]
pub enum RepositoryError {
    /// The repository root cannot be listed.
    #[error("{path}: cannot read the model repository: {source}")]
    Root {
        /// The root.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file is missing or unreadable.
    #[error("{path}: {what}")]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong (missing, unreadable, ...).
        what: String,
    },
    /// `config.pbtxt` is not valid text format.
    #[error("{path}: syntax error at {err}")]
    Syntax {
        /// The config file.
        path: PathBuf,
        /// Where and what.
        err: pbtxt::PbtxtError,
    },
    /// A field is missing, out of range or unsupported (also: the ONNX
    /// graph disagrees with it, found by the executor).
    #[error("{path}: field '{field}'{}: {what}", line_suffix(*.line))]
    Field {
        /// The file (config or model).
        path: PathBuf,
        /// Dotted field path, e.g. `input[0].dims`.
        field: String,
        /// Line in the config (0: not applicable).
        line: u32,
        /// What is wrong.
        what: String,
    },
}

fn line_suffix(line: u32) -> String {
    if line == 0 {
        String::new()
    } else {
        format!(" (line {line})")
    }
}

impl RepositoryError {
    /// A field error on `path`.
    pub fn field(path: &Path, field: impl Into<String>, what: impl Into<String>) -> Self {
        RepositoryError::Field {
            path: path.to_path_buf(),
            field: field.into(),
            line: 0,
            what: what.into(),
        }
    }
}

/// One loadable version of a model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelVersion {
    /// The version number (its directory name).
    pub version: u64,
    /// The model file.
    pub path: PathBuf,
}

/// A model that passed the repository's checks.
#[derive(Clone, Debug, PartialEq)]
pub struct RepoModel {
    /// The parsed config.
    pub config: ModelConfig,
    /// `<repo>/<model>/config.pbtxt`.
    pub config_path: PathBuf,
    /// The versions the version policy selects, ascending (never empty).
    pub versions: Vec<ModelVersion>,
}

impl RepoModel {
    /// The model's name.
    pub fn name(&self) -> &str {
        &self.config.name
    }
    /// The newest selected version (what an unversioned request gets).
    pub fn latest(&self) -> &ModelVersion {
        // `versions` is never empty (checked by `load_model`).
        &self.versions[self.versions.len() - 1]
    }
    /// The SLO (the `slo_ms` parameter, else [`DEFAULT_SLO`]).
    pub fn slo(&self) -> StdDuration {
        self.config.slo.unwrap_or(DEFAULT_SLO)
    }
}

/// The result of scanning a repository: the models that load, and why the
/// others do not.
#[derive(Debug, Default)]
pub struct Repository {
    /// The repository root.
    pub root: PathBuf,
    /// Loadable models, by name.
    pub models: Vec<RepoModel>,
    /// Refused models (or files), one error each.
    pub refused: Vec<RepositoryError>,
}

impl Repository {
    /// The model named `name`.
    pub fn model(&self, name: &str) -> Option<&RepoModel> {
        self.models.iter().find(|m| m.config.name == name)
    }
    /// Keeps only the models in `names` (in that order); names that are not
    /// loadable models become errors.
    pub fn select(&mut self, names: &[String]) {
        let mut kept = Vec::with_capacity(names.len());
        for n in names {
            match self.models.iter().position(|m| &m.config.name == n) {
                Some(i) => kept.push(self.models.swap_remove(i)),
                None => self.refused.push(RepositoryError::File {
                    path: self.root.join(n),
                    what: "no such loadable model in the repository".into(),
                }),
            }
        }
        self.models = kept;
    }
}

/// Scans `root`: every subdirectory is a model. Hidden directories are
/// skipped. Models are sorted by name (model ids are stable).
pub fn scan(root: &Path) -> Result<Repository, RepositoryError> {
    let entries = std::fs::read_dir(root).map_err(|source| RepositoryError::Root {
        path: root.to_path_buf(),
        source,
    })?;
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| e.path())
        .collect();
    dirs.sort();
    let mut repo = Repository {
        root: root.to_path_buf(),
        ..Repository::default()
    };
    for dir in dirs {
        match load_model(&dir) {
            Ok(m) => repo.models.push(m),
            Err(e) => repo.refused.push(e),
        }
    }
    Ok(repo)
}

/// Reads one model directory.
pub fn load_model(dir: &Path) -> Result<RepoModel, RepositoryError> {
    let dir_name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| RepositoryError::File {
            path: dir.to_path_buf(),
            what: "model directory name is not UTF-8".into(),
        })?;
    let config_path = dir.join(CONFIG_FILE);
    let text = std::fs::read(&config_path).map_err(|e| RepositoryError::File {
        path: config_path.clone(),
        what: if e.kind() == std::io::ErrorKind::NotFound {
            "missing".into()
        } else {
            format!("cannot read: {e}")
        },
    })?;
    let text = String::from_utf8(text).map_err(|_| RepositoryError::File {
        path: config_path.clone(),
        what: "not UTF-8 text".into(),
    })?;
    let tree = pbtxt::parse(&text).map_err(|err| RepositoryError::Syntax {
        path: config_path.clone(),
        err,
    })?;
    let config = config::from_message(&tree, dir_name).map_err(|e| RepositoryError::Field {
        path: config_path.clone(),
        field: e.field,
        line: e.line,
        what: e.what,
    })?;
    let versions = versions(dir, &config)?;
    Ok(RepoModel {
        config,
        config_path,
        versions,
    })
}

/// The version directories the policy selects, each with its model file.
fn versions(dir: &Path, config: &ModelConfig) -> Result<Vec<ModelVersion>, RepositoryError> {
    let mut found: Vec<u64> = std::fs::read_dir(dir)
        .map_err(|e| RepositoryError::File {
            path: dir.to_path_buf(),
            what: format!("cannot list: {e}"),
        })?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u64>().ok()))
        .collect();
    found.sort_unstable();
    let selected: Vec<u64> = match &config.version_policy {
        VersionPolicy::All => found.clone(),
        VersionPolicy::Latest(n) => found.iter().rev().take(*n as usize).rev().copied().collect(),
        VersionPolicy::Specific(v) => {
            if let Some(missing) = v.iter().find(|v| !found.contains(v)) {
                return Err(RepositoryError::File {
                    path: dir.join(missing.to_string()).join(&config.default_model_filename),
                    what: "missing (named by version_policy.specific)".into(),
                });
            }
            let mut v = v.clone();
            v.sort_unstable();
            v.dedup();
            v
        }
    };
    if selected.is_empty() {
        return Err(RepositoryError::File {
            path: dir.join("1").join(&config.default_model_filename),
            what: "missing: no version directory (<model>/<version>/...)".into(),
        });
    }
    selected
        .into_iter()
        .map(|version| {
            let path = dir.join(version.to_string()).join(&config.default_model_filename);
            if path.is_file() {
                Ok(ModelVersion { version, path })
            } else {
                Err(RepositoryError::File {
                    path,
                    what: "missing model file".into(),
                })
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;
