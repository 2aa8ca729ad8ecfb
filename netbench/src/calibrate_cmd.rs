//! `netbench calibrate`: measures the round time of incasts of growing
//! batch sizes and control round trips, then writes the scheduler's delay
//! file (one per requested percentile).

use crate::args::CalibrateArgs;
use crate::client::{self, BenchConfig, Input, RunResult};
use crate::fail::{Fail, Res};
use crate::output::report;
use crate::transport::{self, DomainOptions};
use crate::{bench_config, calibrate, check_peers, local, local_options, note_oversubscription, stats, RunPlans};

pub(crate) fn cmd_calibrate(a: CalibrateArgs) -> Res<()> {
    calibrate::check_percentile(a.percentile)?;
    let cfg = bench_config(&a.work.shape, &a.work.measure)?;
    if cfg.ping_every == 0 {
        return Err(Fail::usage(
            "calibrate measures d_ctrl from control round trips: --ping-every must be at least 1",
        ));
    }
    a.work.shape.check(a.transport)?;
    let lo = local_options(a.transport, &a.local, &a.work.shape);
    let (servers, addrs, fabric) = if a.peers.is_empty() {
        note_oversubscription(lo.servers, lo.idle, lo.kind);
        let s = local::LocalServers::start(&lo)?;
        let addrs = s.addrs.clone();
        let fabric = s.fabric(&lo);
        (Some(s), addrs, fabric)
    } else {
        check_peers(&a.peers)?;
        let f = format!("{} peer(s)", a.peers.len());
        (None, a.peers.clone(), f)
    };
    if let Some(s) = &servers {
        s.enter_client_netns()?;
    }
    let batches = batch_sizes(&a, addrs.len() * cfg.objects as usize)?;
    let results = run_batches(&a, &cfg, &addrs, &batches)?;
    drop(servers);

    let fabric = a
        .fabric
        .clone()
        .unwrap_or_else(|| format!("{} ({fabric})", a.transport.name()));
    let mut ctrl = stats::Recorder::new();
    log_header(a.percentile);
    for (b, r) in batches.iter().zip(&results) {
        ctrl.merge(&r.ctrl);
        log_batch(*b, r, a.percentile);
        if let Some(dir) = &a.save_dir {
            let rep = report(
                a.transport,
                fabric.clone(),
                Some(format!("{} b={b}", a.transport.name())),
                addrs.clone(),
                &cfg,
                *b,
                r,
            )?;
            let json = serde_json::to_string_pretty(&rep)?;
            let p = dir.join(format!("calibrate-{}-b{b}.json", a.transport.name()));
            std::fs::write(&p, json).map_err(Fail::write(&p))?;
        }
    }
    for (pct, path) in output_files(&a)? {
        write_calibration(&a, &cfg, &batches, &results, &ctrl, &fabric, pct, &path)?;
    }
    Ok(())
}

/// `--batches`, or the default ladder up to `max_b` inputs per round.
fn batch_sizes(a: &CalibrateArgs, max_b: usize) -> Res<Vec<usize>> {
    let batches = if a.batches.is_empty() {
        calibrate::default_batches(max_b)
    } else {
        a.batches.clone()
    };
    if batches.contains(&0) {
        return Err(Fail::usage("--batches: every batch size must be at least 1"));
    }
    Ok(batches)
}

/// One run per batch size, on the same connections.
fn run_batches(a: &CalibrateArgs, cfg: &BenchConfig, addrs: &[String], batches: &[usize]) -> Res<Vec<RunResult>> {
    let plans: Vec<Vec<Input>> = batches
        .iter()
        .map(|&b| client::batch_plan(addrs.len(), cfg.objects, b))
        .collect();
    let task = RunPlans {
        addrs: addrs.to_vec(),
        cfg: cfg.clone(),
        plans,
        max_region: a.work.shape.max_region,
        kind: a.transport,
    };
    transport::with_domain(
        a.transport,
        DomainOptions {
            read_timeout: cfg.round_timeout,
        },
        task,
    )
}

/// The progress table's header (the batch sizes' round times follow).
fn log_header(percentile: f64) {
    tracing::info!("{:>6} {:>8} {:>14} {:>14}", "b", "rounds", "p50[usec]", format!("p{percentile}[usec]"));
}

fn log_batch(b: usize, r: &RunResult, percentile: f64) {
    tracing::info!(
        "{:>6} {:>8} {:>14.2} {:>14.2}",
        b,
        r.round.count(),
        r.round.percentile_ns(50.0) as f64 / 1000.0,
        r.round.percentile_ns(percentile) as f64 / 1000.0
    );
}

/// `(percentile, file)`: `--percentile` to `--out`, and each of
/// `--extra-percentiles` to `STEM.pP.EXT` beside it.
fn output_files(a: &CalibrateArgs) -> Res<Vec<(f64, std::path::PathBuf)>> {
    let mut outputs = vec![(a.percentile, a.out.clone())];
    for &p in &a.extra_percentiles {
        calibrate::check_percentile(p)?;
        let stem = a
            .out
            .file_stem()
            .map_or("delay".into(), |s| s.to_string_lossy().into_owned());
        let ext = a
            .out
            .extension()
            .map_or("toml".into(), |s| s.to_string_lossy().into_owned());
        outputs.push((p, a.out.with_file_name(format!("{stem}.p{p}.{ext}"))));
    }
    Ok(outputs)
}

/// Writes the delay file for percentile `pct` to `path` and prints what it
/// holds.
#[allow(clippy::too_many_arguments)]
fn write_calibration(
    a: &CalibrateArgs,
    cfg: &BenchConfig,
    batches: &[usize],
    results: &[RunResult],
    ctrl: &stats::Recorder,
    fabric: &str,
    pct: f64,
    path: &std::path::Path,
) -> Res<()> {
    let points = batches
        .iter()
        .zip(results)
        .map(|(b, r)| calibrate::Point {
            b: *b,
            rounds: r.round.count(),
            p50_us: r.round.percentile_ns(50.0) as f64 / 1000.0,
            pct_us: r.round.percentile_ns(pct) as f64 / 1000.0,
        })
        .collect();
    let cal = calibrate::Calibration {
        percentile: pct,
        ctrl_rtt_us: ctrl.percentile_ns(pct) as f64 / 1000.0,
        ctrl_bytes: cfg.ping_size,
        points,
        fabric: fabric.to_string(),
        fold_intercept: a.fold_intercept,
        size: cfg.size,
        provenance: vec![
            format!(
                "written by: {}",
                std::env::args().collect::<Vec<_>>().join(" ")
            ),
            format!(
                "host {} ({} cores) at {}; {} rounds per batch size after {} warm-up",
                stats::hostname(),
                std::thread::available_parallelism().map_or(0, |n| n.get()),
                stats::utc(stats::unix_time()),
                cfg.iters,
                cfg.warmup
            ),
        ],
    };
    let text = cal.to_toml()?;
    std::fs::write(path, &text).map_err(Fail::write(path))?;
    let (d_ctrl, d_data, _) = cal.values()?;
    println!(
        "wrote {}: d_ctrl_us = {d_ctrl:.3} (half the p{pct} control round trip), d_data_us = {d_data:.3} (slope of p{pct} round time per input)",
        path.display(),
    );
    Ok(())
}
