//! The paper's comparisons: Table 2, Figures 6a, 9, 2 and 10.

use super::{contenders, copies, policy, print_table_header, ReportError, Setup};
use crate::plot;
use scheduler::analysis;
use scheduler::goodput::{best_timeouts, TimeoutSearch, TUNING_SEED};
use scheduler::deferred::Gather;
use scheduler::goodput::GoodputSearch;
use scheduler::policy::{PolicyConfig, PolicyKind};
use scheduler::zoo::{ModelSpec, Zoo, ZooSelection};
use std::path::Path;

pub(super) fn table2(quick: bool) -> Result<(), ReportError> {
    let models = [ModelSpec::linear("ResNet50", 1.053, 5.072, 25.0)?, ModelSpec::linear("InceptionResNetV2", 5.090, 18.368, 70.0)?];
    println!(
        "Table 2: one model on 8 GPUs, Poisson; {}; the timeout policy's k searched on seed {TUNING_SEED}.\n",
        Setup::new(Vec::new(), 8, quick).runs_note()
    );
    println!("| model | row | batch size | goodput (rps) |\n|---|---|---:|---:|");
    for m in &models {
        table2_rows(m, quick)?;
    }
    table2_idle(&models[0], quick)
}

/// One model's analytical rows and every contender's goodput.
fn table2_rows(m: &ModelSpec, quick: bool) -> Result<(), ReportError> {
    for (row, b) in [
        ("analytical: staggered", analysis::staggered(m, 8)),
        ("analytical: uncoordinated", analysis::uncoordinated(m, 8)),
        ("analytical: hard ceiling", analysis::ceiling(m, 8)),
    ] {
        println!("| {} | {row} | {} | {:.0} |", m.name, b.batch, b.throughput_rps);
    }
    let setup = Setup::new(vec![m.clone()], 8, quick);
    let mut measured = Vec::new();
    for (label, p) in table2_contenders(&setup)? {
        let (g, at) = setup.goodput(&p)?;
        let b = at.as_ref().map_or(0, |r| r.median_batch);
        println!("| {} | {label} | {b} (median) | {g:.0} |", m.name);
        measured.push((p.kind.as_str(), g, b, at.map_or(0.0, |r| r.p99_ms)));
    }
    // The baseline panel (issue 49): each family's best variant, which it
    // was, and its p99 latency at its goodput.
    for (family, variants) in crate::report_grid::FAMILIES {
        let best = measured.iter().filter(|x| variants.contains(&x.0)).fold(None::<&(&str, f64, u32, f64)>, |b, x| if b.is_none_or(|b| x.1 > b.1) { Some(x) } else { b });
        if let Some((variant, g, b, p99)) = best {
            println!("| {} | panel: best {family} ({variant}, p99 {p99:.1} ms) | {b} (median) | {g:.0} |", m.name);
        }
    }
    Ok(())
}

/// Load-proportional GPU use at half of deferred's goodput.
fn table2_idle(r50: &ModelSpec, quick: bool) -> Result<(), ReportError> {
    let setup = Setup::new(vec![r50.clone()], 8, quick);
    let (g, _) = setup.goodput(&policy(PolicyKind::Deferred, Gather::Early))?;
    println!("\nGPU idle fraction, ResNet50 on 8 GPUs at 50% of deferred's goodput ({:.0} rps):\n", g / 2.0);
    println!("| policy | GPU idle fraction | median batch | bad rate |\n|---|---:|---:|---:|");
    for (label, p) in table2_contenders(&setup)? {
        let r = setup.run(g / 2.0, &p)?;
        println!("| {label} | {:.1}% | {} | {:.2}% |", r.gpu_idle_fraction * 100.0, r.median_batch, r.bad_rate * 100.0);
    }
    Ok(())
}

/// [`contenders`], with the timeout policy at its best `k`, searched on
/// [`TUNING_SEED`], a seed no goodput is measured on
/// (`scheduler::goodput::best_timeouts`), and printed in its label.
fn table2_contenders(setup: &Setup) -> Result<Vec<(String, PolicyConfig)>, ReportError> {
    let mut out = contenders();
    // The panel's variants the common contenders lack.
    for kind in [PolicyKind::ClockworkPaper, PolicyKind::EagerEarly, PolicyKind::EagerLatestStart, PolicyKind::EagerLatestStartEarly] {
        out.push((kind.as_str().into(), policy(kind, Gather::Lazy)));
    }
    for (label, p) in out.iter_mut() {
        if p.kind == PolicyKind::Timeout {
            let best = best_timeouts(&setup.sim(0.0, TUNING_SEED), p, &TimeoutSearch { knobs: GoodputSearch::default(), per_model: true })?;
            let ks: Vec<String> = best.timeouts.iter().map(|k| format!("{:.2}", k.as_millis_f64())).collect();
            *label = format!("timeout (best k={} ms)", ks.join("/"));
            p.timeouts = best.timeouts;
        }
    }
    Ok(out)
}

pub(super) fn fig6a(quick: bool) -> Result<(), ReportError> {
    println!("Eager goodput relative to deferred: 10 models of l(b) = b + beta ms, SLO = 2 l(8), 32 GPUs, Poisson; {}.\n", Setup::new(Vec::new(), 32, quick).runs_note());
    println!("| beta/alpha | SLO (ms) | deferred (rps) | eager (rps) | eager / deferred |\n|---:|---:|---:|---:|---:|");
    let betas: Vec<f64> = if quick { vec![1.0, 5.0, 15.0] } else { (1..=15).map(f64::from).collect() };
    for beta in betas {
        let slo = 2.0 * (8.0 + beta);
        let m = ModelSpec::linear("synthetic", 1.0, beta, slo)?;
        let setup = Setup::new(copies(&m, 10), 32, quick);
        let (d, _) = setup.goodput(&policy(PolicyKind::Deferred, Gather::Early))?;
        let (e, _) = setup.goodput(&policy(PolicyKind::Eager, Gather::Lazy))?;
        println!("| {beta:.0} | {slo:.0} | {d:.0} | {e:.0} | {:.2} |", e / d);
    }
    Ok(())
}

pub(super) fn fig9(quick: bool) -> Result<(), ReportError> {
    println!("Goodput (rps) of mixed model zoos on 64 GPUs, equal popularity, Poisson; {}.\n", Setup::new(Vec::new(), 64, quick).runs_note());
    let labels: Vec<String> = contenders().into_iter().map(|c| c.0).collect();
    println!("| zoo | models | {} |", labels.join(" | "));
    println!("|---|---:|{}", "---:|".repeat(labels.len()));
    for zoo in [Zoo::Gtx1080Ti, Zoo::A100] {
        for sel in ["all", "strong", "weak"] {
            let models = ZooSelection::parse(sel).select(zoo.models())?;
            let setup = Setup::new(models, 64, quick);
            let mut row = Vec::new();
            for (_, p) in contenders() {
                row.push(format!("{:.0}", setup.goodput(&p)?.0));
            }
            println!("| {} {sel} | {} | {} |", if zoo == Zoo::A100 { "A100" } else { "1080Ti" }, setup.models.len(), row.join(" | "));
        }
    }
    Ok(())
}

pub(super) fn fig2(quick: bool, plot_dir: Option<&Path>) -> Result<(), ReportError> {
    let base = ModelSpec::linear("ResNet50", 2.050, 5.378, 100.0)?;
    let setup = Setup::new(copies(&base, 10), 24, quick);
    let (peak, _) = setup.goodput(&policy(PolicyKind::Deferred, Gather::Early))?;
    println!(
        "Flat-top: 10 ResNet50-like models (1080Ti profile, SLO 100 ms), 24 GPUs, Poisson; deferred goodput {peak:.0} rps = 1.0x; {}; each load run on seed {}.\n",
        setup.runs_note(),
        setup.seeds[0]
    );
    let steps = if quick { 6 } else { 15 };
    let loads: Vec<f64> = (1..=steps).map(|i| 1.5 * f64::from(i) / f64::from(steps)).collect();
    print_table_header("policy", &loads.iter().map(|l| format!("{l:.1}x")).collect::<Vec<_>>());
    let mut good_series = Vec::new();
    let mut util_series = Vec::new();
    for (label, p) in contenders() {
        let mut cells = Vec::new();
        let mut gs = Vec::new();
        let mut us = Vec::new();
        for &l in &loads {
            let r = setup.run(peak * l, &p)?;
            cells.push(format!("{:.2} / {:.0}%", r.good_rps / peak, (1.0 - r.gpu_idle_fraction) * 100.0));
            gs.push((l, r.good_rps / peak));
            us.push((l, 1.0 - r.gpu_idle_fraction));
        }
        println!("| {label} | {} |", cells.join(" | "));
        good_series.push(plot::Series { label: label.clone(), points: gs });
        util_series.push(plot::Series { label, points: us });
    }
    println!("\nCells: goodput relative to deferred's peak / GPU utilisation.");
    match plot_dir {
        Some(dir) => write_fig2_plots(dir, &good_series, &util_series),
        None => Ok(()),
    }
}

fn write_fig2_plots(dir: &Path, good: &[plot::Series], util: &[plot::Series]) -> Result<(), ReportError> {
    plot::write_svg(dir, "fig2_goodput.svg", &plot::lines("Goodput vs offered load (x peak)", "offered load (x deferred peak)", "goodput (x peak)", good))?;
    plot::write_svg(dir, "fig2_utilisation.svg", &plot::lines("GPU utilisation vs offered load", "offered load (x deferred peak)", "GPU busy fraction", util))?;
    Ok(())
}

pub(super) fn fig10(quick: bool) -> Result<(), ReportError> {
    let target = 15_000.0;
    let runs = Setup::new(Vec::new(), 1, quick);
    println!(
        "Minimum GPUs to serve {target:.0} rps with every model's bad rate <= 1% (A100 profiles, Poisson; simulator, a GPU count passes on most of seeds {:?}, {} s runs).\n",
        runs.seeds, runs.duration_s
    );
    let r50 = ModelSpec::linear("ResNet50", 0.268, 5.172, 25.0)?;
    let workloads = [("ResNet50, SLO 25 ms", vec![r50]), ("37 A100 models (Table 4 SLOs)", Zoo::A100.models())];
    print_table_header("workload", &contenders().into_iter().map(|c| c.0).collect::<Vec<_>>());
    for (name, models) in workloads {
        let mut row = Vec::new();
        for (_, p) in contenders() {
            row.push(min_gpus(&models, &p, target, quick)?.map_or(">512".to_string(), |n| n.to_string()));
        }
        println!("| {name} | {} |", row.join(" | "));
    }
    Ok(())
}

/// Whether `p` on `n` GPUs keeps every model's bad rate <= 1% at `rate`
/// on most seeds.
fn passes_on(models: &[ModelSpec], p: &PolicyConfig, rate: f64, n: u32, quick: bool) -> Result<bool, ReportError> {
    let setup = Setup::new(models.to_vec(), n, quick);
    let mut ok = 0;
    for &seed in &setup.seeds {
        if setup.run_seed(rate, seed, p)?.max_model_bad_rate <= 0.01 {
            ok += 1;
        }
    }
    Ok(ok * 2 > setup.seeds.len())
}

fn min_gpus(models: &[ModelSpec], p: &PolicyConfig, rate: f64, quick: bool) -> Result<Option<u32>, ReportError> {
    let passes = |n: u32| passes_on(models, p, rate, n, quick);
    let (mut lo, mut hi) = (0u32, 1u32);
    while !passes(hi)? {
        lo = hi;
        hi *= 2;
        if hi > 512 {
            return Ok(None);
        }
    }
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if passes(mid)? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(Some(hi))
}
