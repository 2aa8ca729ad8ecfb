use super::instance::{generate, gpu_memory_bytes, zoo_memory, InstanceSpec};
use super::*;
use crate::zoo::Zoo;

const GIB: u64 = 1 << 30;

fn model(name: &str, rate: f64, static_mib: u64, dynamic_mib: u64) -> ModelLoad {
    ModelLoad { name: name.into(), rate, static_bytes: static_mib << 20, dynamic_bytes: dynamic_mib << 20 }
}

fn problem(models: Vec<ModelLoad>, k: usize, memory_bytes: u64) -> Problem {
    Problem { models, sub_clusters: k, memory_bytes, rate_max: None, memory_weight: 1.0, previous: None, c_max_bytes: None }
}

/// A seeded small instance whose memory bound binds: each GPU holds about
/// 1.25x its share of the static memory plus the largest dynamic size.
fn small(seed: u64, n: usize, k: usize) -> Problem {
    let base = zoo_memory(Zoo::A100).unwrap();
    let models = generate(&base, &InstanceSpec { models: n, mean_rate: 100.0, seed, rate_seed: seed }).unwrap();
    let total: u64 = models.iter().map(|m| m.static_bytes).sum();
    let need = models.iter().map(|m| m.static_bytes + m.dynamic_bytes).max().unwrap();
    let max_dyn = models.iter().map(|m| m.dynamic_bytes).max().unwrap();
    let cap = (total / k as u64 * 5 / 4 + max_dyn).max(need);
    problem(models, k, cap)
}

/// `p` as a re-partition: the previous assignment is the heuristic's for
/// other rates, and at most `c_max_fraction` of the static memory may move.
fn repartition(mut p: Problem, rate_seed: u64, c_max_fraction: f64) -> Problem {
    let first = partition(&p, 7).unwrap();
    // Only the rates are redrawn; names and sizes stay.
    let base = zoo_memory(Zoo::A100).unwrap();
    let redrawn = generate(&base, &InstanceSpec { models: p.models.len(), mean_rate: 100.0, seed: 0, rate_seed }).unwrap();
    for (m, r) in p.models.iter_mut().zip(redrawn) {
        m.rate = r.rate;
    }
    let total: u64 = p.models.iter().map(|m| m.static_bytes).sum();
    p.previous = Some(first.assignment.sub_cluster.iter().map(|&j| Some(j)).collect());
    p.c_max_bytes = Some((total as f64 * c_max_fraction) as u64);
    p
}

fn assert_allowed(p: &Problem, e: &Evaluation, what: &str) {
    assert!(e.feasible, "{what}: infeasible {e:?}");
    for &u in &e.memory_used_bytes {
        assert!(u <= p.memory_bytes, "{what}: memory {u} > {}", p.memory_bytes);
    }
    if let Some(c) = p.c_max_bytes {
        assert!(e.moved_bytes <= c, "{what}: moved {} > C_max {c}", e.moved_bytes);
    }
}

#[test]
fn heuristic_is_within_one_percent_of_mean_rate_of_the_proven_optimum() {
    let mut worst_gap = 0.0f64;
    for seed in 1..=20u64 {
        let n = 8 + (seed as usize % 5); // 8..=12 models
        let k = if seed % 4 == 0 { 2 } else { 3 };
        let mut p = small(seed, n, k);
        if seed % 2 == 0 {
            p = repartition(p, seed + 100, 0.15);
        }
        let h = partition(&p, seed).unwrap();
        assert_allowed(&p, &h.evaluation, &format!("heuristic seed {seed}"));
        let exact = milp::solve(&p, None, Some(&h.assignment)).unwrap();
        assert!(exact.proven_optimal, "seed {seed}: not proven optimal");
        let opt = p.evaluate(&exact.assignment);
        assert_allowed(&p, &opt, &format!("exact seed {seed}"));
        let rbar = p.mean_rate();
        let gap = h.evaluation.objective - opt.objective;
        assert!(gap <= 0.01 * rbar + 1e-6, "seed {seed} ({n}x{k}): heuristic {} vs optimum {} (R̄ {rbar})", h.evaluation.objective, opt.objective);
        worst_gap = worst_gap.max(gap / rbar);
    }
    assert!(worst_gap <= 0.01, "{worst_gap}");
}

#[test]
fn large_instances_keep_memory_and_c_max() {
    for seed in 1..=2u64 {
        let p = small(seed, 60, 5);
        let first = partition(&p, seed).unwrap();
        assert_allowed(&p, &first.evaluation, "first");
        for frac in [0.0, 0.02, 0.1] {
            let q = repartition(p.clone(), seed + 50, frac);
            let s = partition(&q, seed).unwrap();
            assert_allowed(&q, &s.evaluation, &format!("seed {seed} C_max {frac}"));
            if frac == 0.0 {
                assert!(s.evaluation.moved.is_empty());
            }
        }
    }
}

#[test]
fn same_seed_same_assignment() {
    let p = small(3, 80, 6);
    assert_eq!(partition(&p, 5).unwrap(), partition(&p, 5).unwrap());
}

#[test]
fn a_model_larger_than_a_gpu_is_an_error() {
    let p = problem(vec![model("a", 1.0, 100, 10), model("huge", 1.0, 2000, 100)], 2, GIB);
    assert!(matches!(partition(&p, 1), Err(PartitionError::ModelTooLarge { ref name, .. }) if name == "huge"));
    assert!(matches!(milp::solve(&p, None, None), Err(PartitionError::ModelTooLarge { .. })));
}

#[test]
fn too_little_memory_overall_is_an_error() {
    // Each model fits a GPU alone, but two of them never share one.
    let models = (0..3).map(|i| model(&format!("m{i}"), 1.0, 600, 100)).collect();
    let p = problem(models, 2, GIB);
    assert!(matches!(partition(&p, 1), Err(PartitionError::Infeasible(_))), "{:?}", partition(&p, 1));
    assert!(matches!(milp::solve(&p, None, None), Err(PartitionError::Infeasible(_))));
}

#[test]
fn c_max_that_forbids_the_needed_move_is_an_error() {
    // 1 GiB GPUs, 10 MiB dynamic each: 1014 MiB of static per sub-cluster.
    // Today {a, b} and {c, d}; the new model fits only in {a, c} + {b, d, new},
    // which moves 800 MiB (two models of 500 and 300).
    let sizes = [("a", 500), ("b", 300), ("c", 500), ("d", 300), ("new", 400)];
    let mut p = problem(sizes.iter().map(|&(n, s)| model(n, 1.0, s, 10)).collect(), 2, GIB);
    p.previous = Some(vec![Some(0), Some(0), Some(1), Some(1), None]);
    for c_max in [0u64, 700] {
        p.c_max_bytes = Some(c_max << 20);
        assert!(matches!(partition(&p, 1), Err(PartitionError::Infeasible(_))), "C_max {c_max}: {:?}", partition(&p, 1));
        assert!(matches!(milp::solve(&p, None, None), Err(PartitionError::Infeasible(_))), "C_max {c_max}");
    }
    p.c_max_bytes = Some(800 << 20);
    let s = partition(&p, 1).unwrap();
    assert_allowed(&p, &s.evaluation, "C_max 800 MiB");
    assert_eq!(s.evaluation.moved_bytes, 800 << 20);
    let e = milp::solve(&p, None, None).unwrap();
    assert_allowed(&p, &p.evaluate(&e.assignment), "exact, C_max 800 MiB");
}

#[test]
fn invalid_problems_are_errors_not_panics() {
    let p = problem(vec![model("a", 1.0, 1, 1)], 0, GIB);
    assert!(matches!(partition(&p, 1), Err(PartitionError::Invalid(_))));
    let p = problem(vec![model("a", f64::NAN, 1, 1)], 2, GIB);
    assert!(matches!(partition(&p, 1), Err(PartitionError::Invalid(_))));
    let mut p = problem(vec![model("a", 1.0, 1, 1)], 2, GIB);
    p.previous = Some(vec![Some(5)]);
    assert!(matches!(partition(&p, 1), Err(PartitionError::Invalid(_))));
    assert!(instance::parse_memory_csv("name,x\n").is_err());
    assert!(instance::parse_memory_csv("name,static_mib,dynamic_mib\nA,1\n").is_err());
}

#[test]
fn evaluation_reports_imbalance_both_ways() {
    let p = problem(vec![model("a", 30.0, 100, 10), model("b", 10.0, 100, 20), model("c", 20.0, 200, 5)], 2, GIB);
    let e = p.evaluate(&Assignment { sub_cluster: vec![0, 1, 1] });
    assert_eq!(e.rate, vec![30.0, 30.0]);
    assert_eq!(e.imbalance, 0.0);
    assert_eq!(e.static_bytes, vec![100 << 20, 300 << 20]);
    assert_eq!(e.memory_used_bytes, vec![110 << 20, 320 << 20]);
    // Mean static 200 MiB; deviations 100 MiB: ΔS/S̄ = 0.5, (max-min)/avg = 1.0.
    assert!((e.memory_imbalance - 0.5).abs() < 1e-12 && (e.memory_spread - 1.0).abs() < 1e-12);
    assert!((e.objective - 100.0 * p.w()).abs() < 1e-9);
    assert!(e.feasible);
}

#[test]
fn zoo_memory_covers_both_zoos_and_gpus() {
    assert_eq!(zoo_memory(Zoo::A100).unwrap().len(), 37);
    assert_eq!(zoo_memory(Zoo::Gtx1080Ti).unwrap().len(), 35);
    assert!(gpu_memory_bytes(Zoo::Gtx1080Ti) < gpu_memory_bytes(Zoo::A100));
}
