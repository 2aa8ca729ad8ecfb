//! Figure 14: goodput vs the network delay bound.

use super::{copies, policy, print_table_header, ReportError, Setup};
use dataplane::time::Duration;
use scheduler::deferred::Gather;
use scheduler::netdelay::NetworkDelay;
use scheduler::policy::PolicyKind;
use scheduler::zoo::ModelSpec;
use std::path::Path;

/// Network delay settings for Figure 14: synthetic points over the RDMA and
/// TCP ranges, then every calibration file in `docs/calibrations/`.
fn delay_settings() -> Result<Vec<(String, NetworkDelay)>, ReportError> {
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
            let text = std::fs::read_to_string(&f).map_err(|source| ReportError::ReadCalibration { path: f.clone(), source })?;
            let d = NetworkDelay::from_toml(&text).map_err(|source| ReportError::Calibration { path: f.clone(), source })?;
            let name = f.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            out.push((format!("calibrated: {name} ({:.1} us + {:.2} us/input)", d.d_ctrl.as_secs_f64() * 1e6, d.d_data.as_secs_f64() * 1e6), d));
        }
    }
    Ok(out)
}

pub(super) fn fig14(quick: bool) -> Result<(), ReportError> {
    let slos = [20.0, 25.0, 50.0, 100.0];
    println!("Goodput vs network delay: 20 equally popular ResNet50 models (A100 profile 0.268 b + 5.172 ms), 32 GPUs, Poisson, deferred; {}.\n", Setup::new(Vec::new(), 32, quick).runs_note());
    print_table_header("network delay bound", &slos.iter().map(|s| format!("SLO {s:.0} ms")).collect::<Vec<_>>());
    let mut base = vec![0.0; slos.len()];
    for (i, (label, delay)) in delay_settings()?.into_iter().enumerate() {
        let mut cells = Vec::new();
        for (j, &slo) in slos.iter().enumerate() {
            let m = ModelSpec::linear("ResNet50", 0.268, 5.172, slo)?;
            let setup = Setup::new(copies(&m, 20), 32, quick);
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
