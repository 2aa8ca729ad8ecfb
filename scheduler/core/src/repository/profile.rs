//! The measured-profile file `symphony profile` writes into a model
//! repository (`<repo>/profile.json`) and `symphony up --model-repository`
//! loads: per model the fitted `l(b) = alpha_ms * b + beta_ms`, the fit's
//! quality, the memory the partitioner needs, and the measured latencies.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::zoo::{ModelSpec, ZooError};

/// The file's name inside a repository.
pub const PROFILE_FILE: &str = "profile.json";

/// Why `profile.json` could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ProfileFileError {
    /// Missing or unreadable (usually: not profiled yet).
    #[error("{}: {source} (run `symphony profile --model-repository {}`)", path.display(), repo.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Its repository.
        repo: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Not the file's JSON form.
    #[error("{}: {source}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// Where and what.
        source: serde_json::Error,
    },
}


/// Median and p99 latency of one batch size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BatchLatency {
    /// Batch size.
    pub batch: u32,
    /// Median, ms.
    pub p50: f64,
    /// 99th percentile, ms.
    pub p99: f64,
}

/// One model's measured profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelProfile {
    /// Model name.
    pub name: String,
    /// Per-item cost, ms.
    pub alpha_ms: f64,
    /// Fixed cost per batch, ms.
    pub beta_ms: f64,
    /// Coefficient of determination of the fit on the medians.
    pub r2: f64,
    /// Largest |fit - median| over the batch sizes, ms.
    pub worst_residual_ms: f64,
    /// Resident memory the loaded model adds, bytes.
    pub memory_static_bytes: u64,
    /// Peak resident memory while running the largest batch, bytes above
    /// the process's baseline.
    pub memory_peak_bytes: u64,
    /// Measured latencies per batch size.
    pub latency_ms: Vec<BatchLatency>,
    /// The first run of the freshly loaded model, at batch 1, ms: what a
    /// first request would pay without the backends' warm-up runs at load
    /// (absent from files written before it was measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_run_ms: Option<f64>,
}

/// The whole file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProfileFile {
    /// Profiled models.
    pub models: Vec<ModelProfile>,
}

impl ProfileFile {
    /// `<repo>/profile.json`.
    pub fn path(repo: &Path) -> PathBuf {
        repo.join(PROFILE_FILE)
    }
    /// Reads `<repo>/profile.json`.
    pub fn load(repo: &Path) -> Result<ProfileFile, ProfileFileError> {
        let path = Self::path(repo);
        let text = std::fs::read_to_string(&path).map_err(|source| ProfileFileError::Read { path: path.clone(), repo: repo.to_path_buf(), source })?;
        serde_json::from_str(&text).map_err(|source| ProfileFileError::Parse { path, source })
    }
    /// The profile of `name`.
    pub fn model(&self, name: &str) -> Option<&ModelProfile> {
        self.models.iter().find(|m| m.name == name)
    }
}

impl ModelProfile {
    /// The scheduler's model: the fitted linear profile, capped at
    /// `max_batch`, with `slo`.
    pub fn spec(&self, slo: std::time::Duration, max_batch: u32) -> Result<ModelSpec, ZooError> {
        let mut s = ModelSpec::linear(&self.name, self.alpha_ms.max(0.0), self.beta_ms.max(0.0), slo.as_secs_f64() * 1e3)?;
        s.profile = s.profile.capped(max_batch.max(1));
        Ok(s)
    }
}
