//! The exact partitioner: Appendix A's MILP through `good_lp` with the
//! pure-Rust microlp solver (no system libraries). For small instances: the
//! branch and bound grows exponentially with models × sub-clusters.
//!
//! Variables: `x_ij ∈ {0,1}` (model `i` in sub-cluster `j`), `ΔR, ΔS ≥ 0`,
//! and `D_j ≥ d_i·x_ij`, the largest dynamic size in `j` (the paper's
//! `max_i d_i x_ij`, linearised). Constraints (4)–(8) and (10); with no
//! previous assignment the sub-clusters are interchangeable, so model `i`
//! may only use sub-clusters `0..=i` (a symmetry cut that keeps one of
//! every group of equivalent solutions).

use std::time::Duration;

use good_lp::{constraint, microlp, variable, Expression, ProblemVariables, ResolutionError, Solution as _, SolutionStatus, SolverModel, Variable, WithInitialSolution, WithTimeLimit};

use super::{Assignment, PartitionError, Problem, MIB};

/// The MILP's answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Exact {
    /// The assignment.
    pub assignment: Assignment,
    /// The solver proved it optimal (otherwise its time limit ran out).
    pub proven_optimal: bool,
}

/// Solves `p` exactly, within `time_limit` if given. `warm_start` (a
/// feasible assignment, e.g. the heuristic's) gives branch and bound an
/// incumbent from the start.
pub fn solve(p: &Problem, time_limit: Option<Duration>, warm_start: Option<&Assignment>) -> Result<Exact, PartitionError> {
    p.validate()?;
    let (n, k) = (p.models.len(), p.sub_clusters);
    let symmetric = p.previous.is_none();
    let allowed = |i: usize, j: usize| !symmetric || j <= i;
    let mut vars = ProblemVariables::new();
    let mut init: Vec<(Variable, f64)> = Vec::new();
    let relabelled = warm_start.map(|a| if symmetric { first_use_order(a) } else { a.clone() });
    let warm = relabelled.as_ref().filter(|a| a.sub_cluster.len() == n && (0..n).all(|i| allowed(i, a.sub_cluster[i])));
    let x: Vec<Vec<Option<Variable>>> = (0..n)
        .map(|i| {
            (0..k)
                .map(|j| {
                    allowed(i, j).then(|| {
                        let v = vars.add(variable().binary());
                        if let Some(a) = warm {
                            init.push((v, f64::from(u8::from(a.sub_cluster[i] == j))));
                        }
                        v
                    })
                })
                .collect()
        })
        .collect();
    let dr = vars.add(variable().min(0.0));
    let ds = vars.add(variable().min(0.0));
    let dmax: Vec<Variable> = (0..k).map(|_| vars.add(variable().min(0.0))).collect();
    let objective: Expression = dr + p.w() * ds;
    let mut model = vars.minimise(objective.clone()).using(microlp);
    let (rbar, sbar, cap) = (p.mean_rate(), p.mean_static_mib(), p.memory_bytes as f64 / MIB);
    let size = |i: usize| p.models[i].static_bytes as f64 / MIB;
    let dynamic = |i: usize| p.models[i].dynamic_bytes as f64 / MIB;
    // (8): every model in exactly one sub-cluster.
    for row in &x {
        let sum: Expression = row.iter().flatten().map(|&v| Expression::from(v)).sum();
        model = model.with(constraint!(sum == 1.0));
    }
    for j in 0..k {
        let col: Vec<(usize, Variable)> = (0..n).filter_map(|i| x[i][j].map(|v| (i, v))).collect();
        let rate: Expression = col.iter().map(|&(i, v)| p.models[i].rate * v).sum();
        let stat: Expression = col.iter().map(|&(i, v)| size(i) * v).sum();
        // (6), (7): deviations from the means.
        model = model.with(constraint!(rate.clone() - rbar <= dr));
        model = model.with(constraint!(rbar - rate.clone() <= dr));
        model = model.with(constraint!(stat.clone() - sbar <= ds));
        model = model.with(constraint!(sbar - stat.clone() <= ds));
        // (4): the optional rate bound.
        if let Some(rmax) = p.rate_max {
            model = model.with(constraint!(rate <= rmax));
        }
        // (5): static plus the largest dynamic size fits a GPU.
        for &(i, v) in &col {
            if dynamic(i) > 0.0 {
                model = model.with(constraint!(dynamic(i) * v <= dmax[j]));
            }
        }
        model = model.with(constraint!(stat + dmax[j] <= cap));
    }
    // (10): at most C_max of static size moves away from the previous assignment.
    if let (Some(c_max), Some(prev)) = (p.c_max_bytes, &p.previous) {
        let mut moved = Expression::from(0.0);
        for (i, pj) in prev.iter().enumerate() {
            if let Some(v) = pj.and_then(|j| x[i][j]) {
                moved += size(i) - size(i) * v;
            }
        }
        model = model.with(constraint!(moved <= c_max as f64 / MIB));
    }
    if let Some(t) = time_limit {
        model = model.with_time_limit(t.as_secs_f64());
    }
    if let Some(a) = warm {
        let e = p.evaluate(a);
        if e.feasible {
            init.push((dr, e.delta_rate));
            init.push((ds, e.delta_static_mib));
            for (j, &d) in dmax.iter().enumerate() {
                let m = (0..n).filter(|&i| a.sub_cluster[i] == j).map(dynamic).fold(0.0, f64::max);
                init.push((d, m));
            }
            model = model.with_initial_solution(init);
        }
    }
    let sol = model.solve().map_err(|e| match e {
        ResolutionError::Infeasible => PartitionError::Infeasible("the MILP is infeasible (memory, R_max or C_max)".into()),
        other => PartitionError::Solver(other),
    })?;
    let proven_optimal = matches!(sol.status(), SolutionStatus::Optimal);
    let sub_cluster = x
        .iter()
        .map(|row| {
            row.iter()
                .enumerate()
                .filter_map(|(j, v)| v.map(|v| (j, sol.value(v))))
                .max_by(|a, b| a.1.total_cmp(&b.1))
                .map_or(0, |(j, _)| j)
        })
        .collect();
    Ok(Exact { assignment: Assignment { sub_cluster }, proven_optimal })
}

/// The same partition with sub-clusters numbered in the order models first
/// use them, so that it passes the symmetry cut (model `i` in `0..=i`).
fn first_use_order(a: &Assignment) -> Assignment {
    let mut label: Vec<Option<usize>> = Vec::new();
    let mut next = 0;
    let sub_cluster = a
        .sub_cluster
        .iter()
        .map(|&j| {
            if label.len() <= j {
                label.resize(j + 1, None);
            }
            *label[j].get_or_insert_with(|| {
                next += 1;
                next - 1
            })
        })
        .collect();
    Assignment { sub_cluster }
}
