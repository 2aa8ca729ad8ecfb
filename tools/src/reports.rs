//! Reports reproducing the figures and tables of docs/benchmarks.md. Each
//! prints Markdown on stdout; goodputs are medians over several seeds.

use crate::plot;
use dataplane::time::Duration;
use scheduler::analysis;
use scheduler::baselines::timeout::best_timeouts;
use scheduler::deferred::Gather;
use scheduler::netdelay::NetworkDelay;
use scheduler::goodput::{search, GoodputSearch};
use scheduler::policy::{build, PolicyConfig, PolicyKind};
use scheduler::sim::{simulate, Arrival, Popularity, RateSchedule, SimConfig, SimReport, Workload};
use scheduler::zoo::{ModelSpec, Zoo, ZooSelection};
use std::path::Path;

/// Shape of the runs behind one number.
#[derive(Clone)]
struct Setup {
    models: Vec<ModelSpec>,
    gpus: u32,
    arrival: Arrival,
    popularity: Popularity,
    duration_s: f64,
    seeds: Vec<u64>,
}

impl Setup {
    fn new(models: Vec<ModelSpec>, gpus: u32, quick: bool) -> Self {
        Setup {
            models,
            gpus,
            arrival: Arrival::Poisson,
            popularity: Popularity::Equal,
            duration_s: if quick { 10.0 } else { 30.0 },
            seeds: if quick { vec![1] } else { vec![1, 2, 3] },
        }
    }

    fn sim(&self, rate: f64, seed: u64) -> SimConfig {
        SimConfig {
            models: self.models.clone(),
            gpus: self.gpus,
            workload: Workload { rate_rps: rate, arrival: self.arrival, popularity: self.popularity.clone(), schedule: RateSchedule::default() },
            duration: Duration::from_secs_f64(self.duration_s),
            warmup: Duration::from_secs_f64((self.duration_s * 0.1).min(2.0)),
            seed,
            trace: None,
            admission: Default::default(),
        }
    }

    /// Median goodput over the seeds, and the run at goodput of the median seed.
    fn goodput(&self, policy: &PolicyConfig) -> Result<(f64, Option<SimReport>), String> {
        let mut results = Vec::new();
        for &seed in &self.seeds {
            let r = search(&self.sim(0.0, seed), policy, &GoodputSearch::default(), &mut |_, _, _, _| {})?;
            results.push((r.goodput_rps, r.at_goodput));
        }
        results.sort_by(|a, b| a.0.total_cmp(&b.0));
        Ok(results.swap_remove(results.len() / 2))
    }

    fn run(&self, rate: f64, policy: &PolicyConfig) -> Result<SimReport, String> {
        let cfg = self.sim(rate, self.seeds[0]);
        let mut s = build(&cfg.models, cfg.gpus, policy)?;
        simulate(&cfg, s.as_mut()).map_err(|e| e.to_string())
    }
}

fn policy(kind: PolicyKind, gather: Gather) -> PolicyConfig {
    let mut p = PolicyConfig::new(kind);
    p.gather = gather;
    p
}

/// The policies every comparison runs, with their report labels.
fn contenders() -> Vec<(String, PolicyConfig)> {
    vec![
        ("deferred (early drop)".into(), policy(PolicyKind::Deferred, Gather::Early)),
        ("deferred (lazy drop)".into(), policy(PolicyKind::Deferred, Gather::Lazy)),
        ("clockwork".into(), policy(PolicyKind::Clockwork, Gather::Lazy)),
        ("clockwork-any".into(), policy(PolicyKind::ClockworkAny, Gather::Lazy)),
        ("shepherd".into(), policy(PolicyKind::Shepherd, Gather::Lazy)),
        ("nexus".into(), policy(PolicyKind::Nexus, Gather::Early)),
        ("timeout (k=5 ms)".into(), policy(PolicyKind::Timeout, Gather::Lazy)),
        ("eager (EDF)".into(), policy(PolicyKind::Eager, Gather::Lazy)),
    ]
}

fn is_work_conserving(p: &PolicyConfig) -> bool {
    matches!(p.kind, PolicyKind::Clockwork | PolicyKind::ClockworkAny | PolicyKind::Shepherd | PolicyKind::Eager)
}

pub fn run(name: &str, quick: bool, plot_dir: Option<&Path>) -> Result<(), String> {
    match name {
        "table2" => table2(quick),
        "fig6a" => fig6a(quick),
        "fig9" => fig9(quick),
        "fig2" => fig2(quick, plot_dir),
        "fig10" => fig10(quick),
        "grid" => grid(quick),
        "fig14" => fig14(quick),
        "live-curve" => live_curve(quick),
        other => Err(format!("unknown report '{other}' (table2, fig6a, fig9, fig2, fig10, grid, fig14, live-curve)")),
    }
}

fn table2(quick: bool) -> Result<(), String> {
    let models = [
        ModelSpec::linear("ResNet50", 1.053, 5.072, 25.0).map_err(|e| e.to_string())?,
        ModelSpec::linear("InceptionResNetV2", 5.090, 18.368, 70.0).map_err(|e| e.to_string())?,
    ];
    println!("| model | row | batch size | goodput (rps) |\n|---|---|---:|---:|");
    for m in &models {
        for (row, b) in [
            ("analytical: staggered", analysis::staggered(m, 8)),
            ("analytical: uncoordinated", analysis::uncoordinated(m, 8)),
            ("analytical: hard ceiling", analysis::ceiling(m, 8)),
        ] {
            println!("| {} | {row} | {} | {:.0} |", m.name, b.batch, b.throughput_rps);
        }
        let setup = Setup::new(vec![m.clone()], 8, quick);
        for (label, p) in table2_contenders(&setup)? {
            let (g, at) = setup.goodput(&p)?;
            let b = at.map_or(0, |r| r.median_batch);
            println!("| {} | {label} | {b} (median) | {g:.0} |", m.name);
        }
    }
    // Load-proportional GPU use at half of deferred's goodput.
    let r50 = &models[0];
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

/// [`contenders`], with the timeout policy at its best `k`, searched on the
/// setup's first seed (`scheduler::baselines::timeout`) and printed in its label.
fn table2_contenders(setup: &Setup) -> Result<Vec<(String, PolicyConfig)>, String> {
    let mut out = contenders();
    for (label, p) in out.iter_mut() {
        if p.kind == PolicyKind::Timeout {
            let best = best_timeouts(&setup.sim(0.0, setup.seeds[0]), p, &GoodputSearch::default())?;
            let ks: Vec<String> = best.timeouts.iter().map(|k| format!("{:.2}", k.as_millis_f64())).collect();
            *label = format!("timeout (best k={} ms)", ks.join("/"));
            p.timeouts = best.timeouts;
        }
    }
    Ok(out)
}

fn fig6a(quick: bool) -> Result<(), String> {
    println!("Eager goodput relative to deferred: 10 models of l(b) = b + beta ms, SLO = 2 l(8), 32 GPUs, Poisson.\n");
    println!("| beta/alpha | SLO (ms) | deferred (rps) | eager (rps) | eager / deferred |\n|---:|---:|---:|---:|---:|");
    let betas: Vec<f64> = if quick { vec![1.0, 5.0, 15.0] } else { (1..=15).map(f64::from).collect() };
    for beta in betas {
        let slo = 2.0 * (8.0 + beta);
        let m = ModelSpec::linear("synthetic", 1.0, beta, slo).map_err(|e| e.to_string())?;
        let mut setup = Setup::new(vec![m; 10], 32, quick);
        for (i, m) in setup.models.iter_mut().enumerate() {
            m.name = format!("synthetic#{i}");
        }
        let (d, _) = setup.goodput(&policy(PolicyKind::Deferred, Gather::Early))?;
        let (e, _) = setup.goodput(&policy(PolicyKind::Eager, Gather::Lazy))?;
        println!("| {beta:.0} | {slo:.0} | {d:.0} | {e:.0} | {:.2} |", e / d);
    }
    Ok(())
}

fn fig9(quick: bool) -> Result<(), String> {
    println!("Goodput (rps) of mixed model zoos on 64 GPUs, equal popularity, Poisson.\n");
    let labels: Vec<String> = contenders().into_iter().map(|c| c.0).collect();
    println!("| zoo | models | {} |", labels.join(" | "));
    println!("|---|---:|{}", "---:|".repeat(labels.len()));
    for zoo in [Zoo::Gtx1080Ti, Zoo::A100] {
        for sel in ["all", "strong", "weak"] {
            let models = ZooSelection::parse(sel).select(zoo.models()).map_err(|e| e.to_string())?;
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

fn fig2(quick: bool, plot_dir: Option<&Path>) -> Result<(), String> {
    let base = ModelSpec::linear("ResNet50", 2.050, 5.378, 100.0).map_err(|e| e.to_string())?;
    let models: Vec<ModelSpec> = (0..10).map(|i| ModelSpec { name: format!("ResNet50#{i}"), ..base.clone() }).collect();
    let setup = Setup::new(models, 24, quick);
    let (peak, _) = setup.goodput(&policy(PolicyKind::Deferred, Gather::Early))?;
    println!("Flat-top: 10 ResNet50-like models (1080Ti profile, SLO 100 ms), 24 GPUs, Poisson; deferred goodput {peak:.0} rps = 1.0x.\n");
    let steps = if quick { 6 } else { 15 };
    let loads: Vec<f64> = (1..=steps).map(|i| 1.5 * f64::from(i) / f64::from(steps)).collect();
    println!("| policy | {} |", loads.iter().map(|l| format!("{l:.1}x")).collect::<Vec<_>>().join(" | "));
    println!("|---|{}", "---:|".repeat(loads.len()));
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
    if let Some(dir) = plot_dir {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let write = |name: &str, svg: String| std::fs::write(dir.join(name), svg).map_err(|e| e.to_string());
        write("fig2_goodput.svg", plot::lines("Goodput vs offered load (x peak)", "offered load (x deferred peak)", "goodput (x peak)", &good_series))?;
        write("fig2_utilisation.svg", plot::lines("GPU utilisation vs offered load", "offered load (x deferred peak)", "GPU busy fraction", &util_series))?;
    }
    Ok(())
}

fn fig10(quick: bool) -> Result<(), String> {
    let target = 15_000.0;
    println!("Minimum GPUs to serve {target:.0} rps with every model's bad rate <= 1% (A100 profiles, Poisson).\n");
    let r50 = ModelSpec::linear("ResNet50", 0.268, 5.172, 25.0).map_err(|e| e.to_string())?;
    let workloads = [("ResNet50, SLO 25 ms", vec![r50]), ("37 A100 models (Table 4 SLOs)", Zoo::A100.models())];
    let labels: Vec<String> = contenders().into_iter().map(|c| c.0).collect();
    println!("| workload | {} |", labels.join(" | "));
    println!("|---|{}", "---:|".repeat(labels.len()));
    for (name, models) in workloads {
        let mut row = Vec::new();
        for (_, p) in contenders() {
            row.push(min_gpus(&models, &p, target, quick)?.map_or(">512".to_string(), |n| n.to_string()));
        }
        println!("| {name} | {} |", row.join(" | "));
    }
    Ok(())
}

fn min_gpus(models: &[ModelSpec], p: &PolicyConfig, rate: f64, quick: bool) -> Result<Option<u32>, String> {
    let passes = |n: u32| -> Result<bool, String> {
        let setup = Setup::new(models.to_vec(), n, quick);
        // Median over seeds of "passes".
        let mut ok = 0;
        for &seed in &setup.seeds {
            let cfg = setup.sim(rate, seed);
            let mut s = build(&cfg.models, cfg.gpus, p)?;
            let r = simulate(&cfg, s.as_mut()).map_err(|e| e.to_string())?;
            if r.max_model_bad_rate <= 0.01 {
                ok += 1;
            }
        }
        Ok(ok * 2 > setup.seeds.len())
    };
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

fn grid(quick: bool) -> Result<(), String> {
    println!("Deferred (best of lazy/early gathering) vs the best work-conserving policy (clockwork, clockwork-any, shepherd, eager).\n");
    println!("| cell | GPUs | arrivals | deferred (rps) | best work-conserving (rps) | which | ratio |\n|---|---:|---|---:|---:|---|---:|");
    let z = |zoo: Zoo, name: &str| zoo.models().into_iter().find(|m| m.name == name);
    let mut cells: Vec<(String, Vec<ModelSpec>, u32)> = Vec::new();
    for (zoo, name) in [(Zoo::Gtx1080Ti, "DenseNet121"), (Zoo::Gtx1080Ti, "ResNet50V2"), (Zoo::Gtx1080Ti, "BERT"), (Zoo::A100, "DenseNet121")] {
        let Some(m) = z(zoo, name) else { continue };
        for (tag, slo_scale) in [("tight", 1.0), ("loose", 2.0)] {
            // Zoo profiles are linear; rebuild with the scaled SLO so the
            // profile is capped at the new largest batch.
            let (alpha, beta) = m.profile.linear_coefficients().unwrap_or((1.0, 1.0));
            let spec = ModelSpec::linear(&m.name, alpha, beta, m.slo.as_millis_f64() * slo_scale).map_err(|e| e.to_string())?;
            let models: Vec<ModelSpec> = (0..8).map(|i| ModelSpec { name: format!("{}#{i}", spec.name), ..spec.clone() }).collect();
            let label = format!("8x {name} ({}) SLO {:.0} ms ({tag})", if zoo == Zoo::A100 { "A100" } else { "1080Ti" }, spec.slo.as_millis_f64());
            cells.push((label, models, 16));
        }
    }
    cells.push(("1080Ti zoo, all 35".into(), Zoo::Gtx1080Ti.models(), 64));
    cells.push(("A100 zoo, all 37".into(), Zoo::A100.models(), 64));
    cells.push(("A100 zoo, strong".into(), ZooSelection::Strong.select(Zoo::A100.models()).map_err(|e| e.to_string())?, 64));
    let arrivals: Vec<(&str, Arrival)> = if quick { vec![("Poisson", Arrival::Poisson)] } else { vec![("Poisson", Arrival::Poisson), ("Gamma(0.3)", Arrival::Gamma(0.3))] };
    let mut worst: f64 = f64::INFINITY;
    for (label, models, gpus) in &cells {
        for (aname, arrival) in &arrivals {
            let mut setup = Setup::new(models.clone(), *gpus, quick);
            setup.arrival = *arrival;
            let mut best_d: f64 = 0.0;
            let mut best_w = (0.0f64, String::new());
            for (plabel, p) in contenders() {
                if p.kind == PolicyKind::Deferred {
                    best_d = best_d.max(setup.goodput(&p)?.0);
                } else if is_work_conserving(&p) {
                    let g = setup.goodput(&p)?.0;
                    if g > best_w.0 {
                        best_w = (g, plabel);
                    }
                }
            }
            let ratio = if best_w.0 > 0.0 { best_d / best_w.0 } else { f64::INFINITY };
            worst = worst.min(ratio);
            println!("| {label} | {gpus} | {aname} | {best_d:.0} | {:.0} | {} | {ratio:.2} |", best_w.0, best_w.1);
        }
    }
    println!("\nWorst ratio over the grid: {worst:.2}");
    Ok(())
}

/// Network delay settings for Figure 14: synthetic points over the RDMA and
/// TCP ranges, then every calibration file in `docs/calibrations/`.
fn delay_settings() -> Result<Vec<(String, NetworkDelay)>, String> {
    let us = |c: f64, d: f64| NetworkDelay { d_ctrl: Duration::from_secs_f64(c * 1e-6), d_data: Duration::from_secs_f64(d * 1e-6) };
    let mut out = vec![
        ("none".to_string(), NetworkDelay::ZERO),
        ("RDMA range: 25 us + 2 us/input".into(), us(25.0, 2.0)),
        ("RDMA range: 50 us + 5 us/input".into(), us(50.0, 5.0)),
        ("RDMA range: 100 us + 10 us/input".into(), us(100.0, 10.0)),
        ("TCP range: 1 ms + 50 us/input".into(), us(1000.0, 50.0)),
        ("TCP range: 3 ms + 100 us/input".into(), us(3000.0, 100.0)),
        ("TCP range: 6 ms + 200 us/input".into(), us(6000.0, 200.0)),
        ("TCP range: 12 ms + 400 us/input".into(), us(12000.0, 400.0)),
    ];
    let dir = Path::new("docs/calibrations");
    if let Ok(entries) = std::fs::read_dir(dir) {
        let mut files: Vec<_> = entries.filter_map(Result::ok).map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "toml")).collect();
        files.sort();
        for f in files {
            let text = std::fs::read_to_string(&f).map_err(|e| format!("{}: {e}", f.display()))?;
            let d = NetworkDelay::from_toml(&text).map_err(|e| format!("{}: {e}", f.display()))?;
            let name = f.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            out.push((format!("calibrated: {name} ({:.1} us + {:.2} us/input)", d.d_ctrl.as_secs_f64() * 1e6, d.d_data.as_secs_f64() * 1e6), d));
        }
    }
    Ok(out)
}

fn fig14(quick: bool) -> Result<(), String> {
    let slos = [20.0, 25.0, 50.0, 100.0];
    println!("Goodput vs network delay: 20 equally popular ResNet50 models (A100 profile 0.268 b + 5.172 ms), 32 GPUs, Poisson, deferred.\n");
    println!("| network delay bound | {} |", slos.iter().map(|s| format!("SLO {s:.0} ms")).collect::<Vec<_>>().join(" | "));
    println!("|---|{}", "---:|".repeat(slos.len()));
    let mut base = vec![0.0; slos.len()];
    for (i, (label, delay)) in delay_settings()?.into_iter().enumerate() {
        let mut cells = Vec::new();
        for (j, &slo) in slos.iter().enumerate() {
            let m = ModelSpec::linear("ResNet50", 0.268, 5.172, slo).map_err(|e| e.to_string())?;
            let models: Vec<ModelSpec> = (0..20).map(|k| ModelSpec { name: format!("ResNet50#{k}"), ..m.clone() }).collect();
            let setup = Setup::new(models, 32, quick);
            let mut p = policy(PolicyKind::Deferred, Gather::Early);
            p.delay = delay;
            let (g, _) = setup.goodput(&p)?;
            if i == 0 {
                base[j] = g;
            }
            cells.push(if i == 0 || base[j] <= 0.0 { format!("{g:.0}") } else { format!("{g:.0} ({:.0}%)", 100.0 * g / base[j]) });
        }
        println!("| {label} | {} |", cells.join(" | "));
    }
    println!("\nCells: goodput in rps (relative to no network delay).");
    Ok(())
}

/// The live runtime over models and GPUs: 1 ModelThread + 1 RankThread,
/// spinning and pinned; each point offered min(4M rps, 80% of the emulated
/// cluster's capacity) so the GPUs are never the bottleneck.
fn live_curve(quick: bool) -> Result<(), String> {
    use dataplane::idle::IdleStrategy;
    use scheduler::deferred::CoreConfig;
    use scheduler::runtime::{run_live, LiveConfig, RuntimeConfig};
    let base = ModelSpec::linear("m", 0.1, 5.0, 50.0).map_err(|e| e.to_string())?;
    let per_gpu = base.profile.throughput_rps(base.profile.max_batch());
    let secs = if quick { 2.0 } else { 5.0 };
    println!("Live runtime, 1 ModelThread + 1 RankThread (pinned, spinning), emulated GPUs (profile 0.1 b + 5 ms, SLO 50 ms), {secs} s per point.\n");
    println!("| models | GPUs | offered (rps) | sustained (rps) | bad rate | lag p50 / p99 / p99.9 / max (us) | RankThread events/s | RankThread util. | ModelThread util. | CPU ns/req |");
    println!("|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|");
    for &models in &[10usize, 100, 1000] {
        for &gpus in &[8u32, 100, 1000, 10_000] {
            let rate = (0.8 * per_gpu * f64::from(gpus)).min(4e6);
            let specs: Vec<ModelSpec> = (0..models).map(|i| ModelSpec { name: format!("m{i}"), ..base.clone() }).collect();
            let r = run_live(&LiveConfig {
                runtime: RuntimeConfig { models: specs, gpus, model_threads: 1, core: CoreConfig::default(), ring_capacity: 1 << 16 },
                workload: Workload::poisson(rate),
                duration: Duration::from_secs_f64(secs),
                seed: 1,
                idle: IdleStrategy::Spin,
                pin: true,
            })?;
            let l = &r.dispatch_lag;
            println!(
                "| {models} | {gpus} | {rate:.0} | {:.0} | {:.3}% | {:.1} / {:.1} / {:.1} / {:.0} | {:.0} | {:.1}% | {:.0}% | {:.0} |",
                r.sustained_rps,
                r.bad_rate * 100.0,
                l.p50_us,
                l.p99_us,
                l.p999_us,
                l.max_us,
                r.rank_events_per_s,
                r.rank_utilisation * 100.0,
                r.model_thread_utilisation.first().copied().unwrap_or(0.0) * 100.0,
                r.cpu_ns_per_request
            );
        }
    }
    Ok(())
}
