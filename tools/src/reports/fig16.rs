//! `symphony report fig16`: the arXiv paper's Figure 16, the quality of the
//! sub-cluster partitioner (CDF of the imbalance factors (max − min)/avg of
//! load and static memory over seeded configurations of 800 models × 20
//! sub-clusters, against the paper's random-search baseline), and its time
//! against instance size next to the exact MILP where that finishes.

use crate::plot;
use dataplane::stats;
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use scheduler::partition::instance::{generate, gpu_memory_bytes, zoo_memory, InstanceSpec};
use super::ReportError;
use scheduler::partition::{milp, partition, Assignment, Evaluation, PartitionError, Problem};
use scheduler::zoo::Zoo;
use std::path::Path;
use std::time::{Duration, Instant};

/// Random assignments the baseline tries per configuration (the paper's
/// "random solver": keep the feasible one with the least objective).
const RANDOM_TRIES: usize = 2000;

fn problem(models: usize, sub_clusters: usize, seed: u64) -> Result<Problem, PartitionError> {
    let base = zoo_memory(Zoo::A100)?;
    let models = generate(&base, &InstanceSpec { models, mean_rate: 100.0, seed, rate_seed: seed })?;
    Ok(Problem { models, sub_clusters, memory_bytes: gpu_memory_bytes(Zoo::A100), rate_max: None, memory_weight: 1.0, previous: None, c_max_bytes: None })
}

fn random_search(p: &Problem, seed: u64) -> Option<Evaluation> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed ^ 0xbad_5eed);
    let mut best: Option<Evaluation> = None;
    let mut a = Assignment { sub_cluster: vec![0; p.models.len()] };
    for _ in 0..RANDOM_TRIES {
        for j in &mut a.sub_cluster {
            *j = rng.random_range(0..p.sub_clusters);
        }
        let e = p.evaluate(&a);
        if e.feasible && best.as_ref().is_none_or(|b| e.objective < b.objective) {
            best = Some(e);
        }
    }
    best
}

/// The `q`-quantile of sorted `v` (NaN when empty: an empty series prints
/// as such).
fn percentile(v: &[f64], q: f64) -> f64 {
    stats::percentile(v, q).unwrap_or(f64::NAN)
}

fn cdf(label: &str, mut v: Vec<f64>) -> (plot::Series, Vec<f64>) {
    v.sort_by(f64::total_cmp);
    let n = v.len() as f64;
    let points = v.iter().enumerate().map(|(i, &x)| (x, (i + 1) as f64 / n)).collect();
    (plot::Series { label: label.into(), points }, v)
}

/// Runs the report.
pub fn run(quick: bool, plot_dir: Option<&Path>) -> Result<(), ReportError> {
    let (configs, n, k) = if quick { (8u64, 200, 10) } else { (40u64, 800, 20) };
    println!("Figure 16: {configs} seeded configurations of {n} models (variants of the A100 zoo, exponential rates) over {k} sub-clusters (40 GiB GPUs).\n");
    let (mut h_load, mut h_mem, mut r_load, mut r_mem, mut h_secs) = (vec![], vec![], vec![], vec![], vec![]);
    for seed in 1..=configs {
        let p = problem(n, k, seed)?;
        let t = Instant::now();
        let s = partition(&p, seed)?;
        h_secs.push(t.elapsed().as_secs_f64());
        h_load.push(s.evaluation.rate_spread);
        h_mem.push(s.evaluation.memory_spread);
        if let Some(r) = random_search(&p, seed) {
            r_load.push(r.rate_spread);
            r_mem.push(r.memory_spread);
        }
    }
    let series = [
        cdf("load, heuristic", h_load),
        cdf("memory, heuristic", h_mem),
        cdf(&format!("load, random (best of {RANDOM_TRIES})"), r_load),
        cdf(&format!("memory, random (best of {RANDOM_TRIES})"), r_mem),
    ];
    println!("Imbalance factor (max − min)/avg over the sub-clusters, percentiles over the configurations:\n");
    println!("| series | p10 | p50 | p90 | max |");
    println!("|---|---:|---:|---:|---:|");
    for (s, v) in &series {
        println!("| {} | {:.5} | {:.5} | {:.5} | {:.5} |", s.label, percentile(v, 0.1), percentile(v, 0.5), percentile(v, 0.9), percentile(v, 1.0));
    }
    h_secs.sort_by(f64::total_cmp);
    println!("\nHeuristic time per configuration: median {:.2} s, max {:.2} s.\n", percentile(&h_secs, 0.5), percentile(&h_secs, 1.0));
    let sizes: &[(usize, usize)] = if quick {
        &[(6, 2), (8, 2), (10, 3), (12, 3), (50, 5), (200, 10)]
    } else {
        &[(6, 2), (8, 2), (10, 3), (12, 3), (14, 3), (16, 4), (20, 4), (24, 4), (50, 5), (100, 10), (200, 10), (400, 20), (800, 20)]
    };
    let limit = Duration::from_secs(if quick { 5 } else { 10 });
    println!("Time against instance size (seed 1; the exact MILP via good_lp + microlp with a {} s limit, up to 24 models):\n", limit.as_secs());
    println!("| models × sub-clusters | heuristic s | heuristic objective | exact s | exact objective | exact status | gap / R̄ |");
    println!("|---|---:|---:|---:|---:|---|---:|");
    let (mut h_time, mut x_time) = (Vec::new(), Vec::new());
    for &(n, k) in sizes {
        let p = problem(n, k, 1)?;
        let t = Instant::now();
        let h = partition(&p, 1)?;
        let hs = t.elapsed().as_secs_f64();
        h_time.push((n as f64, hs));
        let mut cells = vec!["–".to_string(), "–".into(), "not run".into(), "–".into()];
        if n <= 24 {
            let t = Instant::now();
            match milp::solve(&p, Some(limit), Some(&h.assignment)) {
                Ok(x) => {
                    let xs = t.elapsed().as_secs_f64();
                    x_time.push((n as f64, xs));
                    let e = p.evaluate(&x.assignment);
                    cells = vec![
                        format!("{xs:.3}"),
                        format!("{:.3}", e.objective),
                        if x.proven_optimal { "optimal".into() } else { "time limit".into() },
                        format!("{:.5}", (h.evaluation.objective - e.objective) / p.mean_rate()),
                    ];
                }
                Err(e) => cells[2] = format!("{e}"),
            }
        }
        println!("| {n} × {k} | {hs:.3} | {:.3} | {} | {} | {} | {} |", h.evaluation.objective, cells[0], cells[1], cells[2], cells[3]);
    }
    println!("\nImbalance factor: the paper's (max − min)/avg. Objective: ΔR + w·ΔS (rate units, w = R̄/S̄). Gap: heuristic − exact, over the mean sub-cluster rate R̄ (the acceptance bound is 0.01).");
    if let Some(dir) = plot_dir {
        let write = |name: &str, svg: String| plot::write_svg(dir, name, &svg);
        let all: Vec<plot::Series> = series.iter().map(|(s, _)| plot::Series { label: s.label.clone(), points: s.points.clone() }).collect();
        write("fig16_cdf.svg", plot::lines("Imbalance factor CDF: heuristic vs random search", "(max - min) / avg", "CDF", &all))?;
        let heuristic: Vec<plot::Series> = all.into_iter().take(2).collect();
        write("fig16_cdf_heuristic.svg", plot::lines("Imbalance factor CDF of the heuristic", "(max - min) / avg", "CDF", &heuristic))?;
        write(
            "fig16_time.svg",
            plot::lines(
                "Partitioning time vs models",
                "models",
                "seconds",
                &[plot::Series { label: "heuristic".into(), points: h_time }, plot::Series { label: "exact MILP".into(), points: x_time }],
            ),
        )?;
    }
    Ok(())
}
