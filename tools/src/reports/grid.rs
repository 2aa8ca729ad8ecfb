//! Deferred scheduling vs the best work-conserving policy over a grid of
//! models, SLOs and arrival processes.

use super::{contenders, copies, ReportError, Setup};
use scheduler::policy::{PolicyConfig, PolicyKind};
use scheduler::sim::Arrival;
use scheduler::zoo::{ModelSpec, Zoo, ZooSelection};

fn is_work_conserving(p: &PolicyConfig) -> bool {
    matches!(p.kind, PolicyKind::Clockwork | PolicyKind::ClockworkAny | PolicyKind::Shepherd | PolicyKind::Eager)
}

/// The grid's cells: `(label, models, GPUs)`.
fn grid_cells() -> Result<Vec<(String, Vec<ModelSpec>, u32)>, ReportError> {
    let z = |zoo: Zoo, name: &str| zoo.models().into_iter().find(|m| m.name == name);
    let mut cells: Vec<(String, Vec<ModelSpec>, u32)> = Vec::new();
    for (zoo, name) in [(Zoo::Gtx1080Ti, "DenseNet121"), (Zoo::Gtx1080Ti, "ResNet50V2"), (Zoo::Gtx1080Ti, "BERT"), (Zoo::A100, "DenseNet121")] {
        let Some(m) = z(zoo, name) else { continue };
        for (tag, slo_scale) in [("tight", 1.0), ("loose", 2.0)] {
            // Zoo profiles are linear; rebuild with the scaled SLO so the
            // profile is capped at the new largest batch.
            let (alpha, beta) = m.profile.linear_coefficients().unwrap_or((1.0, 1.0));
            let spec = ModelSpec::linear(&m.name, alpha, beta, m.slo.as_millis_f64() * slo_scale)?;
            let label = format!("8x {name} ({}) SLO {:.0} ms ({tag})", if zoo == Zoo::A100 { "A100" } else { "1080Ti" }, spec.slo.as_millis_f64());
            cells.push((label, copies(&spec, 8), 16));
        }
    }
    cells.push(("1080Ti zoo, all 35".into(), Zoo::Gtx1080Ti.models(), 64));
    cells.push(("A100 zoo, all 37".into(), Zoo::A100.models(), 64));
    cells.push(("A100 zoo, strong".into(), ZooSelection::Strong.select(Zoo::A100.models())?, 64));
    Ok(cells)
}

/// Deferred's best goodput, and the best work-conserving policy's goodput
/// and label, on `setup`.
fn best_of(setup: &Setup) -> Result<(f64, (f64, String)), ReportError> {
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
    Ok((best_d, best_w))
}

pub(super) fn grid(quick: bool) -> Result<(), ReportError> {
    println!("Deferred (best of lazy/early gathering) vs the best work-conserving policy (clockwork, clockwork-any, shepherd, eager).\n");
    println!("| cell | GPUs | arrivals | deferred (rps) | best work-conserving (rps) | which | ratio |\n|---|---:|---|---:|---:|---|---:|");
    let arrivals: Vec<(&str, Arrival)> = if quick { vec![("Poisson", Arrival::Poisson)] } else { vec![("Poisson", Arrival::Poisson), ("Gamma(0.3)", Arrival::Gamma(0.3))] };
    let mut worst: f64 = f64::INFINITY;
    for (label, models, gpus) in &grid_cells()? {
        for (aname, arrival) in &arrivals {
            let mut setup = Setup::new(models.clone(), *gpus, quick);
            setup.arrival = *arrival;
            let (best_d, best_w) = best_of(&setup)?;
            let ratio = if best_w.0 > 0.0 { best_d / best_w.0 } else { f64::INFINITY };
            worst = worst.min(ratio);
            println!("| {label} | {gpus} | {aname} | {best_d:.0} | {:.0} | {} | {ratio:.2} |", best_w.0, best_w.1);
        }
    }
    println!("\nWorst ratio over the grid: {worst:.2}");
    Ok(())
}
