//! Figure 13 of the arXiv paper (issue 14, item 7).
//!
//! * Left: the scheduler's highest request rate against the number of
//!   ModelThreads, scheduler alone (in-process load and emulated GPUs, as
//!   in the paper), for two cluster sizes. Each point is `bench-scheduler
//!   --rate max`'s search (dispatch lag p99.9 <= 100 us, bad rate <= 1%,
//!   each probe the median of 3 runs). A point needs one core per
//!   ModelThread plus one for the RankThread (which the load generator and
//!   the emulated GPUs share); points that need more cores than the
//!   machine has are still run but marked, since threads then share cores
//!   and the figure no longer measures scaling.
//! * Right: goodput against the number of GPUs for 20 equally popular
//!   ResNet-like models with a 100 ms SLO, deferred against Clockwork, in
//!   the simulator (the paper ran its live system on emulated GPUs; the
//!   live runtime here cannot hold the rates of large clusters on 2
//!   cores, the simulator's policies are the same code).

use super::{policy, ReportError, Setup};
use crate::bench::{self, BenchArgs};
use crate::plot;
use scheduler::deferred::Gather;
use scheduler::policy::PolicyKind;
use scheduler::zoo::ModelSpec;
use std::path::Path;

/// Seed of every run of the left panel (the simulator's seeds are
/// `Setup`'s and printed with the right panel).
const SEED: u64 = 1;

/// Prints the figure's tables as Markdown, or with `json` one JSON object
/// (`left`: a row per point, `right`: a row per GPU count, `machine`).
pub(super) fn fig13(quick: bool, model_threads: &[usize], plot_dir: Option<&Path>, json: bool) -> Result<(), ReportError> {
    // With --json stdout carries the JSON object alone.
    let say = |line: String| {
        if !json {
            println!("{line}");
        }
    };
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let threads: Vec<usize> = if model_threads.is_empty() { (1..=cores.max(2)).collect() } else { model_threads.to_vec() };
    let gpu_counts: &[u32] = if quick { &[4000] } else { &[2000, 8000] };
    let secs = if quick { 0.5 } else { 1.0 };
    // Each point pins its threads the same way; the largest point's layout names them all.
    let machine = bench::runtime_machine(threads.iter().copied().max().unwrap_or(1), true);
    say("Figure 13 (left): highest rate with dispatch lag p99.9 <= 100 us and bad rate <= 1%, scheduler alone".into());
    say(format!("(20 models, profile 0.1 b + 5 ms, SLO 50 ms; {secs} s per run, 3 runs per probe, seed {SEED}; this machine: {cores} cores)."));
    say(format!("{}\n", machine.text()));
    say("| GPUs | ModelThreads | cores needed | highest rate (rps) | per ModelThread (rps) | lag p99.9 (us) | bad rate | CPU ns/req | note |".into());
    say("|---:|---:|---:|---:|---:|---:|---:|---:|---|".into());
    let mut left = Vec::new();
    let mut left_rows = Vec::new();
    for &gpus in gpu_counts {
        let mut points = Vec::new();
        for &mt in &threads {
            let need = mt + 1;
            let args = BenchArgs {
                models: 20,
                gpus,
                model_threads: mt,
                rate: "max".into(),
                duration_s: secs,
                profile: "0.1,5,50".into(),
                idle: "spin".into(),
                pin: true,
                seed: SEED,
                json: false,
            };
            let note = if need > cores { format!("not measurable here: needs {need} cores, has {cores} (threads share cores)") } else { "measured".into() };
            match bench::max_rate(&args) {
                Ok(r) => {
                    say(format!(
                        "| {gpus} | {mt} | {need} | {:.0} | {:.0} | {:.1} | {:.3}% | {:.0} | {note} |",
                        r.sustained_rps,
                        r.rps_per_model_thread,
                        r.dispatch_lag.p999_us,
                        r.bad_rate * 100.0,
                        r.cpu_ns_per_request
                    ));
                    left_rows.push(serde_json::json!({
                        "gpus": gpus, "model_threads": mt, "cores_needed": need, "highest_rps": r.sustained_rps,
                        "rps_per_model_thread": r.rps_per_model_thread, "lag_p99_9_us": r.dispatch_lag.p999_us,
                        "bad_rate": r.bad_rate, "cpu_ns_per_request": r.cpu_ns_per_request, "measurable": need <= cores,
                    }));
                    if need <= cores {
                        points.push((mt as f64, r.sustained_rps / 1e6));
                    }
                }
                Err(bench::BenchError::NoRatePassed) => {
                    say(format!("| {gpus} | {mt} | {need} | no rate passed | | | | | {note} |"));
                    left_rows.push(serde_json::json!({ "gpus": gpus, "model_threads": mt, "cores_needed": need, "highest_rps": null, "measurable": need <= cores }));
                }
                Err(e) => return Err(Box::new(e).into()),
            }
        }
        left.push(plot::Series { label: format!("{gpus} GPUs"), points });
    }

    let r50 = ModelSpec::linear("ResNet50", 0.268, 5.172, 100.0)?;
    let models: Vec<ModelSpec> = (0..20).map(|i| ModelSpec { name: format!("ResNet50#{i}"), ..r50.clone() }).collect();
    let gpus: &[u32] = if quick { &[8, 16] } else { &[8, 16, 32, 64] };
    let contenders = [("deferred", policy(PolicyKind::Deferred, Gather::Early)), ("clockwork", policy(PolicyKind::Clockwork, Gather::Lazy))];
    let seeds = Setup::new(models.clone(), 1, quick).seeds;
    say(format!("\nFigure 13 (right): goodput (rps) against GPUs, 20 equally popular ResNet50-like models (A100 profile 0.268 b + 5.172 ms), SLO 100 ms, Poisson, simulator, median of seeds {seeds:?}.\n"));
    say("| GPUs | deferred | clockwork | deferred per GPU | deferred / clockwork |".into());
    say("|---:|---:|---:|---:|---:|".into());
    let mut right_rows = Vec::new();
    let mut right: Vec<plot::Series> = contenders.iter().map(|(l, _)| plot::Series { label: (*l).into(), points: Vec::new() }).collect();
    for &n in gpus {
        let setup = Setup::new(models.clone(), n, quick);
        let mut g = Vec::new();
        for (k, (_, p)) in contenders.iter().enumerate() {
            let (rps, _) = setup.goodput(p)?;
            right[k].points.push((f64::from(n), rps));
            g.push(rps);
        }
        say(format!("| {n} | {:.0} | {:.0} | {:.0} | {:.2} |", g[0], g[1], g[0] / f64::from(n), g[0] / g[1].max(1e-9)));
        right_rows.push(serde_json::json!({ "gpus": n, "deferred_rps": g[0], "clockwork_rps": g[1] }));
    }
    if let Some(dir) = plot_dir {
        plot::write_svg(dir, "fig13_threads.svg", &plot::lines("Scheduler throughput vs ModelThreads (measured points)", "ModelThreads", "million requests/s", &left))?;
        plot::write_svg(dir, "fig13_gpus.svg", &plot::lines("Goodput vs GPUs (20 ResNet50-like models, SLO 100 ms)", "GPUs", "goodput (rps)", &right))?;
    }
    if json {
        let machine: serde_json::Value = serde_json::from_str(&machine.to_json())?;
        let v = serde_json::json!({ "left": left_rows, "right": right_rows, "simulator_seeds": seeds, "seconds_per_run": secs, "seed": SEED, "machine": machine });
        println!("{}", serde_json::to_string_pretty(&v)?);
    }
    Ok(())
}
