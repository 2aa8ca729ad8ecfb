//! Section 5.3 of the arXiv paper, scheduling quality: goodput under
//! varied workloads (Figure 11) and queueing delay (Figure 12).
//!
//! The paper measured both on its live systems over emulated GPUs (a
//! cluster of 32 and 8 GPUs, Symphony against reimplementations of
//! Clockwork, Nexus and Shepherd). This machine has neither GPUs nor a
//! cluster, and its live runtime cannot hold those rates on 2 cores; both
//! figures run the same policies in the simulator, whose emulated GPUs
//! take exactly the profile's latency (as the paper's emulation did).

use super::{copies, policy, ReportError, Setup};
use crate::plot;
use dataplane::time::Instant;
use scheduler::deferred::Gather;
use scheduler::policy::{build, PolicyConfig, PolicyKind};
use scheduler::sim::{simulate_observed, Arrival, BatchObserver, Popularity};
use scheduler::types::{GpuId, Request};
use scheduler::zoo::ModelSpec;
use std::path::Path;

/// The four systems of Figures 11 and 12, as the paper names them.
fn systems() -> Vec<(&'static str, PolicyConfig)> {
    vec![
        ("symphony (deferred)", policy(PolicyKind::Deferred, Gather::Early)),
        ("clockwork", policy(PolicyKind::Clockwork, Gather::Lazy)),
        ("nexus", policy(PolicyKind::Nexus, Gather::Early)),
        ("shepherd", policy(PolicyKind::Shepherd, Gather::Lazy)),
    ]
}

/// Figure 11: goodput of 20 ResNet50-like models (1080Ti profile, every
/// model at the same SLO) on 32 GPUs, against the SLO, for equal or
/// Zipf(0.9) popularity and Poisson or Gamma(0.05) arrivals.
pub(super) fn fig11(quick: bool, plot_dir: Option<&Path>) -> Result<(), ReportError> {
    let slos: &[f64] = if quick { &[15.0, 100.0] } else { &[15.0, 20.0, 25.0, 35.0, 50.0, 75.0, 100.0] };
    let gpus = 32;
    let setups: Vec<(&str, Popularity, &str, Arrival)> = vec![
        ("equal", Popularity::Equal, "Poisson", Arrival::Poisson),
        ("equal", Popularity::Equal, "Gamma(0.05)", Arrival::Gamma(0.05)),
        ("Zipf(0.9)", Popularity::Zipf(0.9), "Poisson", Arrival::Poisson),
        ("Zipf(0.9)", Popularity::Zipf(0.9), "Gamma(0.05)", Arrival::Gamma(0.05)),
    ];
    let seeds = Setup::new(Vec::new(), 1, quick).seeds;
    println!("Figure 11: goodput (rps) of 20 ResNet50-like models (1080Ti profile 2.050 b + 5.378 ms) on {gpus} emulated GPUs, every model at the row's SLO;");
    println!("simulator (the paper ran its live systems on 32 emulated GPUs), median over seeds {seeds:?}.\n");
    let labels: Vec<String> = systems().into_iter().map(|s| s.0.to_string()).collect();
    println!("| popularity | arrival | SLO (ms) | {} | symphony / best other |", labels.join(" | "));
    println!("|---|---|---:|{}---:|", "---:|".repeat(labels.len()));
    for (pop_name, pop, arr_name, arr) in &setups {
        let mut series: Vec<plot::Series> = labels.iter().map(|l| plot::Series { label: l.clone(), points: Vec::new() }).collect();
        for &slo in slos {
            let m = ModelSpec::linear("ResNet50", 2.050, 5.378, slo)?;
            let mut setup = Setup::new(copies(&m, 20), gpus, quick);
            setup.popularity = pop.clone();
            setup.arrival = *arr;
            let mut row = Vec::new();
            for (k, (_, p)) in systems().iter().enumerate() {
                let (g, _) = setup.goodput(p)?;
                series[k].points.push((slo, g));
                row.push(g);
            }
            let best_other = row[1..].iter().copied().fold(0.0, f64::max);
            let cells: Vec<String> = row.iter().map(|g| format!("{g:.0}")).collect();
            println!("| {pop_name} | {arr_name} | {slo:.0} | {} | {:.2} |", cells.join(" | "), row[0] / best_other.max(1e-9));
        }
        if let Some(dir) = plot_dir {
            let name = format!("fig11_{}_{}.svg", file_part(pop_name), file_part(arr_name));
            plot::write_svg(dir, &name, &plot::lines(&format!("Goodput vs SLO: {pop_name} popularity, {arr_name}"), "SLO (ms)", "goodput (rps)", &series))?;
        }
    }
    Ok(())
}

fn file_part(s: &str) -> String {
    s.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '.').collect::<String>().to_ascii_lowercase()
}

/// Every served request's queueing delay (arrival to batch start), for
/// requests that arrived after the warm-up.
struct QueueingDelays {
    warmup_end: Instant,
    delays_us: Vec<u64>,
}

impl BatchObserver for QueueingDelays {
    fn on_batch(&mut self, _now: Instant, _gpu: GpuId, _model: u32, exec_at: Instant, members: &[Request]) {
        for r in members.iter().filter(|r| r.arrival >= self.warmup_end) {
            self.delays_us.push(exec_at.saturating_since(r.arrival).as_nanos() / 1000);
        }
    }
}

/// Figure 12: the queueing delay (arrival at the scheduler to its batch's
/// start) of Table 2's two cases, each system at its own goodput.
pub(super) fn fig12(quick: bool, plot_dir: Option<&Path>) -> Result<(), ReportError> {
    let cases = [ModelSpec::linear("ResNet50", 1.053, 5.072, 25.0)?, ModelSpec::linear("InceptionResNetV2", 5.090, 18.368, 70.0)?];
    let seeds = Setup::new(Vec::new(), 1, quick).seeds;
    println!("Figure 12: queueing delay (arrival to batch start, served requests) on 8 GPUs, Table 2's profiles and SLOs, Poisson;");
    println!("each system at its own goodput (median over seeds {seeds:?}), delays from one run at that rate with seed {}; simulator.\n", seeds[0]);
    println!("| model | system | goodput (rps) | p50 (ms) | p90 (ms) | p99 (ms) | max (ms) | max / SLO |\n|---|---|---:|---:|---:|---:|---:|---:|");
    for m in &cases {
        let setup = Setup::new(vec![m.clone()], 8, quick);
        let slo_ms = m.slo.as_millis_f64();
        let mut series = Vec::new();
        for (label, p) in systems() {
            let (g, _) = setup.goodput(&p)?;
            let cfg = setup.sim(g, setup.seeds[0]);
            let mut obs = QueueingDelays { warmup_end: Instant::ZERO.saturating_add(cfg.warmup), delays_us: Vec::new() };
            let mut s = build(&cfg.models, cfg.gpus, &p)?;
            simulate_observed(&cfg, s.as_mut(), &mut obs)?;
            let mut d = obs.delays_us;
            d.sort_unstable();
            let q = |f: f64| d.get(((d.len() as f64 - 1.0) * f).round() as usize).map_or(0.0, |&us| us as f64 / 1e3);
            let max = d.last().map_or(0.0, |&us| us as f64 / 1e3);
            println!("| {} | {label} | {g:.0} | {:.2} | {:.2} | {:.2} | {max:.2} | {:.2} |", m.name, q(0.5), q(0.9), q(0.99), max / slo_ms);
            series.push(plot::Series { label: label.into(), points: (0..=100).map(|i| (q(f64::from(i) / 100.0), f64::from(i) / 100.0)).collect() });
        }
        if let Some(dir) = plot_dir {
            let name = format!("fig12_{}.svg", file_part(&m.name));
            let title = format!("Queueing delay CDF: {}, 8 GPUs, SLO {slo_ms:.0} ms", m.name);
            plot::write_svg(dir, &name, &plot::lines(&title, "queueing delay (ms)", "fraction of served requests", &series))?;
        }
    }
    Ok(())
}
