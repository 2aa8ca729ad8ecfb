//! Section 3.4 of the arXiv paper: deferred batch scheduling against the
//! timeout policy (Figure 6b) and against eager scheduling over synthetic
//! workloads (Figure 7, Table 1). Simulator only, as in the paper.

use super::{copies, policy, ReportError, Setup};
use crate::plot;
use crate::progress::Progress;
use dataplane::time::Duration;
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use scheduler::deferred::Gather;
use scheduler::goodput::GoodputSearch;
use scheduler::policy::{PolicyConfig, PolicyKind};
use scheduler::sim::Arrival;
use scheduler::zoo::{ModelSpec, Zoo};
use std::path::Path;

fn deferred() -> PolicyConfig {
    policy(PolicyKind::Deferred, Gather::Early)
}

fn eager() -> PolicyConfig {
    policy(PolicyKind::Eager, Gather::Lazy)
}

/// The timeout policy with every model's `k` at `fraction` of its SLO
/// (Figure 6b's x axis; `k` = 0 is eager).
fn timeout_at(models: &[ModelSpec], fraction: f64) -> PolicyConfig {
    let mut p = policy(PolicyKind::Timeout, Gather::Lazy);
    p.timeouts = models.iter().map(|m| Duration::from_nanos((m.slo.as_nanos() as f64 * fraction) as u64)).collect();
    p
}

/// Figure 6b: timeout goodput relative to deferred's, `k` a share of each
/// model's SLO, for one ResNet50 (Table 2's profile, SLO 50 ms) on 8 GPUs
/// and the 37 A100 models at their Table 4 SLOs on 64 GPUs.
pub(super) fn fig6b(quick: bool, plot_dir: Option<&Path>) -> Result<(), ReportError> {
    let r50 = ModelSpec::linear("ResNet50", 1.053, 5.072, 50.0)?;
    let cases = [("ResNet50, SLO 50 ms, 8 GPUs", Setup::new(vec![r50], 8, quick)), ("37 A100 models, Table 4 SLOs, 64 GPUs", Setup::new(Zoo::A100.models(), 64, quick))];
    let percents: Vec<u32> = if quick { vec![0, 10, 30] } else { vec![0, 5, 10, 15, 20, 30, 40, 50, 60, 80, 100] };
    println!("Figure 6b: timeout goodput / deferred goodput, every model's timeout k a share of its SLO (k = 0 is eager).");
    println!("Poisson, equal popularity, simulator; goodput = median over seeds {:?}, {} s runs.\n", cases[0].1.seeds, cases[0].1.duration_s);
    let mut series = Vec::new();
    let mut columns = Vec::new();
    for (name, setup) in &cases {
        let (d, _) = setup.goodput(&deferred())?;
        let mut points = Vec::new();
        for &pc in &percents {
            let (t, _) = setup.goodput(&timeout_at(&setup.models, f64::from(pc) / 100.0))?;
            points.push((f64::from(pc), t / d.max(1e-9)));
        }
        columns.push((name, d, points.clone()));
        series.push(plot::Series { label: (*name).into(), points });
    }
    println!("| k (% of SLO) | {} |", columns.iter().map(|c| format!("{} (deferred {:.0} rps)", c.0, c.1)).collect::<Vec<_>>().join(" | "));
    println!("|---:|{}", "---:|".repeat(columns.len()));
    for (i, pc) in percents.iter().enumerate() {
        println!("| {pc} | {} |", columns.iter().map(|c| format!("{:.2}", c.2[i].1)).collect::<Vec<_>>().join(" | "));
    }
    for (name, _, points) in &columns {
        let best = points.iter().copied().fold((0.0, 0.0), |b, p| if p.1 > b.1 { p } else { b });
        println!("\n{name}: best timeout k = {}% of SLO reaches {:.2} of deferred.", best.0, best.1);
    }
    if let Some(dir) = plot_dir {
        plot::write_svg(dir, "fig6b.svg", &plot::lines("Timeout vs deferred", "timeout k (% of SLO)", "timeout goodput / deferred goodput", &series))?;
    }
    Ok(())
}

/// The configuration dimensions of Table 1 (homogeneous setups; a mixed
/// setup runs the 35 1080Ti models at their Table 3 SLOs instead of a
/// model, a model count and an SLO).
const TABLE1_MODELS: [&str; 6] = ["DenseNet121", "InceptionV3", "ResNet50V2", "VGG16", "Xception", "BERT"];
const TABLE1_COUNTS: [usize; 6] = [8, 16, 24, 32, 48, 64];
const TABLE1_RATIOS: [f64; 7] = [1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0];
const TABLE1_SLOS_MS: [f64; 5] = [20.0, 25.0, 30.0, 40.0, 50.0];
const TABLE1_GAMMAS: [f64; 6] = [0.1, 0.2, 0.3, 0.5, 0.7, 1.0];
/// Seed of Figure 7(d)'s sample of Table 1's workloads.
const FIG7D_SAMPLE_SEED: u64 = 7;

/// One synthetic workload of Table 1.
#[derive(Clone)]
struct Synthetic {
    /// A Table 1 model, or `None` for the 35-model mix.
    model: Option<&'static str>,
    /// Model copies (35 for the mix).
    count: usize,
    gpus_per_model: f64,
    /// Every copy's SLO (`None`: Table 3's per-model SLOs).
    slo_ms: Option<f64>,
    gamma: f64,
}

impl Synthetic {
    fn gpus(&self) -> u32 {
        (self.count as f64 * self.gpus_per_model).round().max(1.0) as u32
    }

    fn models(&self) -> Result<Vec<ModelSpec>, ReportError> {
        let zoo = Zoo::Gtx1080Ti.models();
        let Some(name) = self.model else { return Ok(zoo) };
        let base = zoo.iter().find(|m| m.name == name).ok_or_else(|| scheduler::zoo::ZooError::UnknownModel { name: name.into() })?;
        let m = match (self.slo_ms, base.profile.linear_coefficients()) {
            // Rebuilt, not patched: the profile is capped at the SLO.
            (Some(slo), Some((alpha, beta))) => ModelSpec::linear(name, alpha, beta, slo)?,
            _ => base.clone(),
        };
        Ok(copies(&m, self.count))
    }

    fn describe(&self) -> String {
        let slo = self.slo_ms.map_or("Table 3".to_string(), |s| format!("{s:.0} ms"));
        format!("{} x{} | {} | {} | {:.1} | Gamma({})", self.model.unwrap_or("mix"), self.count, self.gpus(), slo, self.gpus_per_model, self.gamma)
    }

    /// Deferred / eager goodput on `setup`'s seeds, with both goodputs.
    fn ratio(&self, quick: bool, shape: impl Fn(&mut Setup)) -> Result<(f64, f64, f64), ReportError> {
        let mut setup = Setup::new(self.models()?, self.gpus(), quick);
        setup.arrival = Arrival::Gamma(self.gamma);
        shape(&mut setup);
        let (d, _) = setup.goodput(&deferred())?;
        let (e, _) = setup.goodput(&eager())?;
        Ok((d / e.max(1e-9), d, e))
    }
}

/// Figure 7: deferred goodput relative to eager's over Table 1's synthetic
/// workloads (1080Ti profiles).
/// * (a) the 35-model mix at Table 3's SLOs: GPUs per model on x, one line per burstiness;
/// * (b) 8 DenseNet121 (strongest batching) on 16 GPUs and (c) 8 BERT
///   (weakest) on 16 GPUs: burstiness on x, SLO 30 and 50 ms;
/// * (d) a seeded sample of all of Table 1's workloads (the paper ran all
///   5880; their cost does not fit this machine), as a CDF of the ratio.
pub(super) fn fig7(quick: bool, plot_dir: Option<&Path>) -> Result<(), ReportError> {
    let seeds = Setup::new(Vec::new(), 1, quick).seeds;
    println!("Figure 7: deferred goodput / eager goodput, Table 1 workloads, 1080Ti profiles, equal popularity, Gamma arrivals, simulator.");
    println!("Goodput = median over seeds {seeds:?} (panels a-c); panel (d) says its own.\n");

    // (a) the mix.
    let ratios: &[f64] = if quick { &[1.0] } else { &[1.0, 2.0, 3.0, 4.0] };
    let gammas: &[f64] = if quick { &[0.1] } else { &[0.1, 0.3, 1.0] };
    println!("### 7(a): 35 models (Table 3 SLOs)\n");
    println!("| GPUs per model | GPUs | Gamma shape | deferred (rps) | eager (rps) | deferred / eager |\n|---:|---:|---:|---:|---:|---:|");
    let mut panel_a = Vec::new();
    for &g in gammas {
        let mut points = Vec::new();
        for &r in ratios {
            let w = Synthetic { model: None, count: 35, gpus_per_model: r, slo_ms: None, gamma: g };
            let (ratio, d, e) = w.ratio(quick, |_| {})?;
            println!("| {r:.1} | {} | {g} | {d:.0} | {e:.0} | {ratio:.2} |", w.gpus());
            points.push((r, ratio));
        }
        panel_a.push(plot::Series { label: format!("Gamma({g})"), points });
    }

    // (b) and (c): one strong and one weak batcher.
    let gammas: &[f64] = if quick { &[0.1, 1.0] } else { &TABLE1_GAMMAS };
    let slos: &[f64] = if quick { &[30.0] } else { &[30.0, 50.0] };
    let mut panels_bc = Vec::new();
    for (panel, model) in [("7(b)", "DenseNet121"), ("7(c)", "BERT")] {
        println!("\n### {panel}: 8 x {model}, 16 GPUs\n");
        println!("| SLO (ms) | Gamma shape | deferred (rps) | eager (rps) | deferred / eager |\n|---:|---:|---:|---:|---:|");
        let mut series = Vec::new();
        for &slo in slos {
            let mut points = Vec::new();
            for &g in gammas {
                let w = Synthetic { model: Some(model), count: 8, gpus_per_model: 2.0, slo_ms: Some(slo), gamma: g };
                let (ratio, d, e) = w.ratio(quick, |_| {})?;
                println!("| {slo:.0} | {g} | {d:.0} | {e:.0} | {ratio:.2} |");
                points.push((g, ratio));
            }
            series.push(plot::Series { label: format!("SLO {slo:.0} ms"), points });
        }
        panels_bc.push((panel, model, series));
    }

    let cdf = fig7d(quick)?;
    if let Some(dir) = plot_dir {
        plot::write_svg(dir, "fig7a.svg", &plot::lines("7(a) 35-model mix", "GPUs per model", "deferred / eager goodput", &panel_a))?;
        for (panel, model, series) in &panels_bc {
            let name = format!("fig{}.svg", panel.replace(['(', ')'], ""));
            plot::write_svg(dir, &name, &plot::lines(&format!("{panel} 8 x {model}, 16 GPUs"), "Gamma shape (burstiness)", "deferred / eager goodput", series))?;
        }
        let series = [plot::Series { label: "sampled workloads".into(), points: cdf }];
        plot::write_svg(dir, "fig7d.svg", &plot::lines("7(d) CDF over sampled Table 1 workloads", "deferred / eager goodput", "fraction of workloads", &series))?;
    }
    Ok(())
}

/// Figure 7(d) sample size and run shape: sized to finish in under 15
/// minutes on a 2-core machine.
const FIG7D_SAMPLE: usize = 200;
const FIG7D_SAMPLE_QUICK: usize = 4;
const FIG7D_RUN_S: f64 = 5.0;

/// Draws `n` Table 1 workloads with [`FIG7D_SAMPLE_SEED`]: one in
/// `TABLE1_MODELS.len() + 1` is the mix, the rest homogeneous.
fn fig7d_sample(n: usize) -> Vec<Synthetic> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(FIG7D_SAMPLE_SEED);
    (0..n)
        .map(|_| {
            let m = rng.random_range(0..=TABLE1_MODELS.len());
            let gpus_per_model = TABLE1_RATIOS[rng.random_range(0..TABLE1_RATIOS.len())];
            let gamma = TABLE1_GAMMAS[rng.random_range(0..TABLE1_GAMMAS.len())];
            let count = TABLE1_COUNTS[rng.random_range(0..TABLE1_COUNTS.len())];
            let slo = TABLE1_SLOS_MS[rng.random_range(0..TABLE1_SLOS_MS.len())];
            match TABLE1_MODELS.get(m) {
                Some(&name) => Synthetic { model: Some(name), count, gpus_per_model, slo_ms: Some(slo), gamma },
                None => Synthetic { model: None, count: 35, gpus_per_model, slo_ms: None, gamma },
            }
        })
        .collect()
}

/// Figure 7(d): returns the CDF points `(ratio, fraction <= ratio)`.
fn fig7d(quick: bool) -> Result<Vec<(f64, f64)>, ReportError> {
    let n = if quick { FIG7D_SAMPLE_QUICK } else { FIG7D_SAMPLE };
    let sample = fig7d_sample(n);
    let knobs = GoodputSearch { rel_precision: 0.01, max_runs: 24, ..GoodputSearch::default() };
    println!("\n### 7(d): {n} workloads drawn from Table 1 with seed {FIG7D_SAMPLE_SEED}\n");
    println!(
        "Each workload: model (or the 35-model mix) with equal odds, then count, GPUs per model, SLO and Gamma shape uniformly \
         (count and SLO unused by the mix). One seed per workload (its index + 1), {FIG7D_RUN_S} s runs, \
         search precision {:.0}%.\n",
        knobs.rel_precision * 100.0
    );
    println!("| # | model | GPUs | SLO | GPUs per model | arrival | seed | deferred (rps) | eager (rps) | deferred / eager |\n|---:|---|---:|---|---:|---|---:|---:|---:|---:|");
    let started = std::time::Instant::now();
    let bar = Progress::new("fig7d", false);
    let mut ratios = Vec::with_capacity(n);
    for (i, w) in sample.iter().enumerate() {
        bar.update(i as u32, n as u32, &w.describe());
        let seed = i as u64 + 1;
        let (ratio, d, e) = w.ratio(quick, |s| {
            s.duration_s = FIG7D_RUN_S;
            s.seeds = vec![seed];
            s.knobs = knobs.clone();
        })?;
        println!("| {} | {} | {seed} | {d:.0} | {e:.0} | {ratio:.2} |", i + 1, w.describe());
        ratios.push(ratio);
    }
    bar.finish();
    // On stderr: the wall time is the machine's, not the figure's.
    tracing::info!("fig7d: {n} workloads in {:.0} s", started.elapsed().as_secs_f64());
    ratios.sort_by(f64::total_cmp);
    let share = |p: &dyn Fn(f64) -> bool| ratios.iter().filter(|&&r| p(r)).count() as f64 / n.max(1) as f64 * 100.0;
    println!(
        "\nOf {n} workloads: {:.1}% at >= 0.95 of eager, {:.1}% at >= 1.5x, {:.1}% at >= 2x; min {:.2}, median {:.2}, max {:.2}.",
        share(&|r| r >= 0.95),
        share(&|r| r >= 1.5),
        share(&|r| r >= 2.0),
        ratios.first().copied().unwrap_or(0.0),
        ratios.get(n / 2).copied().unwrap_or(0.0),
        ratios.last().copied().unwrap_or(0.0)
    );
    Ok(ratios.iter().enumerate().map(|(i, &r)| (r, (i + 1) as f64 / n as f64)).collect())
}
