//! Top-level partitioning of models over sub-clusters (the Symphony arXiv
//! paper's Appendix A).
//!
//! Each sub-cluster's backends load every model of the sub-cluster, so the
//! sum of the models' static memory plus the largest dynamic (runtime)
//! memory must fit one GPU. Within that, the request rate and the static
//! memory of the sub-clusters are balanced: the objective is
//! `ΔR + w·ΔS`, the largest deviation of a sub-cluster's rate from the mean
//! plus `w` times the largest deviation of its static memory (MiB) from the
//! mean. A re-partition from a previous assignment moves at most `C_max`
//! worth of models: moving a model costs its static size (the paper's
//! `c_ij = s_i/2` for the unload plus the load).
//!
//! - [`greedy`]: the heuristic for any size: LPT by rate with memory
//!   feasibility, then a seeded iterated local search of moves and swaps.
//! - [`milp`]: the exact MILP through `good_lp` and the pure-Rust microlp
//!   solver, for small instances.
//! - [`instance`]: seeded instances as the paper builds them (variants of
//!   zoo models, exponential rates) and the memory table.

pub mod greedy;
pub mod instance;
pub mod milp;

use serde::Serialize;

/// Bytes per MiB: the solvers work in MiB to keep numbers well scaled.
pub const MIB: f64 = 1024.0 * 1024.0;

/// One model to place.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModelLoad {
    /// Unique name (a previous assignment is matched by it).
    pub name: String,
    /// Request rate, requests per second.
    pub rate: f64,
    /// Weights resident while the model is loaded, bytes.
    pub static_bytes: u64,
    /// Extra memory while the model's largest batch runs, bytes.
    pub dynamic_bytes: u64,
}

/// One partitioning problem.
#[derive(Clone, Debug, PartialEq)]
pub struct Problem {
    /// The models.
    pub models: Vec<ModelLoad>,
    /// Number of sub-clusters `l`.
    pub sub_clusters: usize,
    /// GPU memory of every backend of a sub-cluster (`S_max`), bytes.
    pub memory_bytes: u64,
    /// Optional bound on a sub-cluster's total rate (`R_max`).
    pub rate_max: Option<f64>,
    /// Weight of memory balance against rate balance, relative: the
    /// objective's `w` is `memory_weight · R̄ / S̄`, so 1.0 weighs a relative
    /// deviation of memory like the same relative deviation of rate.
    pub memory_weight: f64,
    /// The current sub-cluster of each model (same order as `models`);
    /// `None` for a model that is new. `None` as a whole: a first partition.
    pub previous: Option<Vec<Option<usize>>>,
    /// Largest total static size of models moved away from `previous`,
    /// bytes (`C_max`); `None`: unbounded.
    pub c_max_bytes: Option<u64>,
}

/// Why a problem has no answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PartitionError {
    /// A malformed problem.
    #[error("invalid problem: {0}")]
    Invalid(String),
    /// One model alone does not fit a GPU.
    #[error("model {name} needs {need_mib:.0} MiB (static + dynamic) but a GPU has {capacity_mib:.0} MiB")]
    ModelTooLarge {
        /// The model.
        name: String,
        /// Its static plus dynamic size, MiB.
        need_mib: f64,
        /// The GPU's memory, MiB.
        capacity_mib: f64,
    },
    /// No assignment satisfies the memory, rate and `C_max` constraints
    /// (proven by the exact solver, or none found by the heuristic).
    #[error("no feasible assignment: {0}")]
    Infeasible(String),
    /// The MILP solver failed or ran out of time without a solution.
    #[error("MILP solver: {0}")]
    Solver(#[source] good_lp::ResolutionError),
}

/// A model → sub-cluster assignment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Assignment {
    /// `sub_cluster[i]`: the sub-cluster of model `i`.
    pub sub_cluster: Vec<usize>,
}

/// How good an assignment is, and whether it is allowed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Evaluation {
    /// Total rate per sub-cluster.
    pub rate: Vec<f64>,
    /// Static memory per sub-cluster, bytes.
    pub static_bytes: Vec<u64>,
    /// Static plus the largest dynamic memory per sub-cluster, bytes (what
    /// must fit `memory_bytes`).
    pub memory_used_bytes: Vec<u64>,
    /// Number of models per sub-cluster.
    pub model_count: Vec<usize>,
    /// `ΔR`: largest |rate − mean rate|.
    pub delta_rate: f64,
    /// `ΔS`: largest |static − mean static|, MiB.
    pub delta_static_mib: f64,
    /// `ΔR + w·ΔS`.
    pub objective: f64,
    /// `ΔR / R̄`: the largest relative deviation of a sub-cluster's rate.
    pub imbalance: f64,
    /// `ΔS / S̄`.
    pub memory_imbalance: f64,
    /// The paper's imbalance factor for rate: (max − min) / mean.
    pub rate_spread: f64,
    /// The paper's imbalance factor for static memory: (max − min) / mean.
    pub memory_spread: f64,
    /// Models whose sub-cluster differs from `previous`.
    pub moved: Vec<usize>,
    /// Their total static size, bytes (compared with `C_max`).
    pub moved_bytes: u64,
    /// Every sub-cluster within memory and rate bounds, and `C_max` kept.
    pub feasible: bool,
}

impl Problem {
    /// Mean rate per sub-cluster `R̄`.
    pub fn mean_rate(&self) -> f64 {
        self.models.iter().map(|m| m.rate).sum::<f64>() / self.sub_clusters.max(1) as f64
    }

    /// Mean static memory per sub-cluster `S̄`, MiB.
    pub fn mean_static_mib(&self) -> f64 {
        self.models.iter().map(|m| m.static_bytes as f64 / MIB).sum::<f64>() / self.sub_clusters.max(1) as f64
    }

    /// The objective's `w` (rate units per MiB).
    pub fn w(&self) -> f64 {
        let s = self.mean_static_mib();
        if s > 0.0 {
            self.memory_weight * self.mean_rate() / s
        } else {
            0.0
        }
    }

    /// Checks the problem's shape and the constraints one model alone
    /// decides.
    pub fn validate(&self) -> Result<(), PartitionError> {
        if self.sub_clusters == 0 {
            return Err(PartitionError::Invalid("at least one sub-cluster".into()));
        }
        if self.models.is_empty() {
            return Err(PartitionError::Invalid("no models".into()));
        }
        if !(self.memory_weight.is_finite() && self.memory_weight >= 0.0) {
            return Err(PartitionError::Invalid(format!("memory weight must be >= 0, got {}", self.memory_weight)));
        }
        let cap = self.memory_bytes as f64 / MIB;
        for m in &self.models {
            if !(m.rate.is_finite() && m.rate >= 0.0) {
                return Err(PartitionError::Invalid(format!("model {}: rate must be >= 0, got {}", m.name, m.rate)));
            }
            let need = (m.static_bytes.saturating_add(m.dynamic_bytes)) as f64 / MIB;
            if need > cap {
                return Err(PartitionError::ModelTooLarge { name: m.name.clone(), need_mib: need, capacity_mib: cap });
            }
            if let Some(rmax) = self.rate_max {
                if m.rate > rmax {
                    return Err(PartitionError::Infeasible(format!("model {} alone has rate {:.1} > R_max {rmax:.1}", m.name, m.rate)));
                }
            }
        }
        if let Some(prev) = &self.previous {
            if prev.len() != self.models.len() {
                return Err(PartitionError::Invalid(format!("previous assignment has {} entries for {} models", prev.len(), self.models.len())));
            }
            if let Some(j) = prev.iter().flatten().find(|&&j| j >= self.sub_clusters) {
                return Err(PartitionError::Invalid(format!("previous assignment names sub-cluster {j} of {}", self.sub_clusters)));
            }
        }
        let total_static: u64 = self.models.iter().map(|m| m.static_bytes).sum();
        if total_static > self.memory_bytes.saturating_mul(self.sub_clusters as u64) {
            return Err(PartitionError::Infeasible(format!(
                "the models' static memory ({:.0} MiB) exceeds {} sub-clusters x {cap:.0} MiB",
                total_static as f64 / MIB,
                self.sub_clusters
            )));
        }
        Ok(())
    }

    /// The previous sub-cluster of model `i`, if any.
    pub fn previous_of(&self, i: usize) -> Option<usize> {
        self.previous.as_ref().and_then(|p| p.get(i).copied().flatten())
    }

    /// Evaluates `a` against this problem.
    pub fn evaluate(&self, a: &Assignment) -> Evaluation {
        let k = self.sub_clusters;
        let mut rate = vec![0.0; k];
        let mut static_bytes = vec![0u64; k];
        let mut max_dyn = vec![0u64; k];
        let mut model_count = vec![0usize; k];
        let mut moved = Vec::new();
        let mut moved_bytes = 0u64;
        let mut in_range = a.sub_cluster.len() == self.models.len();
        for (i, (m, &j)) in self.models.iter().zip(&a.sub_cluster).enumerate() {
            if j >= k {
                in_range = false;
                continue;
            }
            rate[j] += m.rate;
            static_bytes[j] += m.static_bytes;
            max_dyn[j] = max_dyn[j].max(m.dynamic_bytes);
            model_count[j] += 1;
            if self.previous_of(i).is_some_and(|p| p != j) {
                moved.push(i);
                moved_bytes += m.static_bytes;
            }
        }
        let memory_used_bytes: Vec<u64> = static_bytes.iter().zip(&max_dyn).map(|(s, d)| s + d).collect();
        let static_mib: Vec<f64> = static_bytes.iter().map(|&s| s as f64 / MIB).collect();
        let (rbar, sbar) = (self.mean_rate(), self.mean_static_mib());
        let delta_rate = max_abs_dev(&rate, rbar);
        let delta_static_mib = max_abs_dev(&static_mib, sbar);
        let feasible = in_range
            && memory_used_bytes.iter().all(|&u| u <= self.memory_bytes)
            && self.rate_max.is_none_or(|rmax| rate.iter().all(|&r| r <= rmax + 1e-9))
            && self.c_max_bytes.is_none_or(|c| moved_bytes <= c);
        Evaluation {
            objective: delta_rate + self.w() * delta_static_mib,
            imbalance: ratio(delta_rate, rbar),
            memory_imbalance: ratio(delta_static_mib, sbar),
            rate_spread: ratio(spread(&rate), rbar),
            memory_spread: ratio(spread(&static_mib), sbar),
            rate,
            static_bytes,
            memory_used_bytes,
            model_count,
            delta_rate,
            delta_static_mib,
            moved,
            moved_bytes,
            feasible,
        }
    }
}

fn max_abs_dev(v: &[f64], mean: f64) -> f64 {
    v.iter().map(|x| (x - mean).abs()).fold(0.0, f64::max)
}

fn spread(v: &[f64]) -> f64 {
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    if v.is_empty() {
        0.0
    } else {
        max - min
    }
}

fn ratio(x: f64, mean: f64) -> f64 {
    if mean > 0.0 {
        x / mean
    } else {
        0.0
    }
}

/// Which solver produced an assignment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// Greedy start plus local search.
    Heuristic,
    /// The MILP, solved to proven optimality.
    ExactOptimal,
    /// The MILP's best solution when its time limit ran out.
    ExactTimeLimit,
}

/// An assignment with its evaluation.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Solution {
    /// Who found it.
    pub method: Method,
    /// The assignment.
    pub assignment: Assignment,
    /// Its evaluation.
    pub evaluation: Evaluation,
}

/// Partitions `problem` with the heuristic (any size), deterministic for a
/// given `seed`.
pub fn partition(problem: &Problem, seed: u64) -> Result<Solution, PartitionError> {
    let assignment = greedy::solve(problem, &greedy::Options::for_problem(problem, seed))?;
    let evaluation = problem.evaluate(&assignment);
    Ok(Solution { method: Method::Heuristic, assignment, evaluation })
}

#[cfg(test)]
mod tests;
