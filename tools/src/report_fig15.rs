//! `symphony report fig15`: the Symphony paper's Figure 15, a workload that
//! changes over a day on up to 512 emulated GPUs, with the autoscaler
//! ([`scheduler::autoscale`]) acting on the paper's add/remove rule.
//!
//! **Models.** 24: every third model of each zoo (Table 3's 1080Ti and
//! Table 4's A100, their profiles and SLOs as tabled), 12 of each, named
//! `NAME@1080ti` and `NAME@a100`.
//!
//! **Workload** (seeded; the paper synthesised its rates from 150 hours of
//! video, which are not available). The day is 24 one-hour segments, each
//! a constant rate (Poisson arrivals). The total follows a day shape
//! `s(h) = 0.15 + 0.85·u(h)^p`, `u(h) = (1 + cos(2π(h − 14)/24))/2` (peak
//! at 14:00, trough at 02:00), taken at each hour's middle and scaled so
//! its largest hour is 1; `p` is found by bisection so that the mean over
//! the hours is exactly 0.4 of the peak (peak-to-mean 2.5), and the
//! trough hour comes out at about 15% of the peak (printed). Each model's
//! share drifts: its log-weight starts at a normal draw (σ 1) and takes a
//! mean-reverting random walk over the hours (`x ← x + 0.2·(x₀ − x) +
//! N(0, 0.3)`), and the shares of an hour are the weights normalised.
//! The peak total rate is `peak_load` times what the largest cluster
//! serves at the measured per-GPU goodput `g`: a goodput search of
//! deferred on half the largest cluster with the day's mean shares (the
//! per-GPU goodput of 24 models grows with the cluster: on 8 GPUs it is
//! well under what 32 reach).
//!
//! **Time.** The day is compressed: a simulated hour lasts `hour_s`
//! seconds of virtual time (the model profiles are real, so a batch takes
//! what it takes), and the autoscaler's interval, join time,
//! stabilisation window and cool-down are in the same compressed seconds.
//!
//! **Acceptance** (printed, measured on the run): after each hour's change
//! of rate the autoscaler needs a settling time (`join time + 2 intervals`
//! up, `stabilisation + cool-down + interval` down: the larger of the two
//! is used for every change); outside those windows the GPUs in use
//! should be within 15% of what the offered load needs at the measured
//! per-GPU goodput, and the bad rate at most 1%; over the day the
//! GPU-seconds used should be at most 60% of a static cluster sized for
//! the peak (`peak offered / g`, rounded up). What the load needs is
//! measured per hour ([`measured_need`]: the fewest GPUs on which deferred
//! serves that hour's rate and mix); `offered / g`, with the one `g` of
//! the day's mean mix, is printed beside it: it understates the need at
//! the trough, where each model's lower rate makes smaller batches and so
//! a lower per-GPU goodput than `g`, and overstates it at the peak.
//!
//! The same run under eager and Clockwork with the same autoscaler: their
//! GPU pools take GPUs in and out of matchmaking as deferred does, so the
//! autoscaler acts on them too; a policy without the membership hook only
//! gets advice, its cluster staying at its largest
//! ([`ElasticReport::acting`]).

use crate::plot;
use crate::reports::ReportError;
use dataplane::time::Duration;
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use scheduler::autoscale::AutoscaleConfig;
use scheduler::goodput::{search, GoodputSearch};
use scheduler::policy::{PolicyConfig, PolicyKind};
use scheduler::sim::autoscaled::{simulate_elastic, ElasticConfig, ElasticReport};
use scheduler::sim::{Popularity, RateSchedule, SimConfig, Workload};
use scheduler::zoo::{ModelSpec, Zoo};
use serde::Serialize;
use std::path::Path;

/// Hours of the day.
const HOURS: usize = 24;
/// Peak-to-mean of the day shape.
const PEAK_TO_MEAN: f64 = 2.5;
/// The day shape's floor, as a fraction of the peak.
const TROUGH: f64 = 0.15;
/// The autoscaler's headroom on this day: 4%. The demand estimate reads
/// 0-3% under the measured need in every hour of the design seeds (1 and
/// 6), and an hour's load is steady, so the margin covers the estimate's
/// error and a 1 s interval's Poisson noise (the target is the largest of
/// the stabilisation window's); the default 10% held 10-16% over the need
/// on every settled interval.
const HEADROOM: f64 = 0.04;

/// The shape of one Figure 15 run.
#[derive(Clone, Debug, Serialize)]
struct Shape {
    max_gpus: u32,
    probe_gpus: u32,
    hour_s: f64,
    interval_s: f64,
    join_s: f64,
    stabilisation_s: f64,
    cooldown_s: f64,
    max_step: u32,
    /// The idle fraction the autoscaler keeps over the demand.
    headroom: f64,
    peak_load: f64,
    seed: u64,
}

impl Shape {
    fn new(quick: bool) -> Self {
        if quick {
            Shape { max_gpus: 64, probe_gpus: 32, hour_s: 5.0, interval_s: 0.5, join_s: 1.0, stabilisation_s: 2.0, cooldown_s: 1.0, max_step: 16, headroom: HEADROOM, peak_load: 0.85, seed: 1 }
        } else {
            Shape { max_gpus: 512, probe_gpus: 256, hour_s: 25.0, interval_s: 1.0, join_s: 4.0, stabilisation_s: 8.0, cooldown_s: 4.0, max_step: 64, headroom: HEADROOM, peak_load: 0.85, seed: 1 }
        }
    }

    /// How long after a change of rate the acceptance does not look.
    fn settling_s(&self) -> f64 {
        (self.join_s + 2.0 * self.interval_s).max(self.stabilisation_s + self.cooldown_s + self.interval_s)
    }
}

/// Every third model of each zoo, 12 of each.
fn models() -> Vec<ModelSpec> {
    let mut out = Vec::with_capacity(24);
    for (zoo, tag) in [(Zoo::Gtx1080Ti, "1080ti"), (Zoo::A100, "a100")] {
        out.extend(zoo.models().into_iter().step_by(3).take(12).map(|m| ModelSpec { name: format!("{}@{tag}", m.name), ..m }));
    }
    out
}

/// The day shape at each hour's middle, largest 1, mean `1/PEAK_TO_MEAN`.
fn day_shape() -> Vec<f64> {
    let at = |p: f64| -> Vec<f64> {
        let raw: Vec<f64> = (0..HOURS)
            .map(|h| {
                let x = (h as f64 + 0.5 - 14.0) / HOURS as f64;
                let u = (1.0 + (2.0 * std::f64::consts::PI * x).cos()) / 2.0;
                TROUGH + (1.0 - TROUGH) * u.powf(p)
            })
            .collect();
        let top = raw.iter().copied().fold(0.0, f64::max);
        raw.iter().map(|v| v / top).collect()
    };
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    // The mean falls as p grows: bisect on p for the mean of 1/2.5.
    let (mut lo, mut hi) = (0.01, 64.0);
    for _ in 0..100 {
        let mid = (lo + hi) / 2.0;
        if mean(&at(mid)) > 1.0 / PEAK_TO_MEAN {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    at((lo + hi) / 2.0)
}

/// Each hour's shares of the models (rows: hours), from seeded drifting
/// log-weights.
fn drifting_shares(models: usize, seed: u64) -> Vec<Vec<f64>> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed ^ 0xf1_615);
    // A standard normal draw (Box-Muller).
    let mut normal = move || {
        let u1: f64 = 1.0 - rng.random::<f64>();
        let u2: f64 = rng.random::<f64>();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    };
    let base: Vec<f64> = (0..models).map(|_| normal()).collect();
    let mut x = base.clone();
    let mut rows = Vec::with_capacity(HOURS);
    for _ in 0..HOURS {
        let w: Vec<f64> = x.iter().map(|v| v.exp()).collect();
        let total: f64 = w.iter().sum();
        rows.push(w.iter().map(|v| v / total).collect());
        for (v, b) in x.iter_mut().zip(&base) {
            *v += 0.2 * (b - *v) + 0.3 * normal();
        }
    }
    rows
}

/// Per-model workloads: model `m` at `peak_rps · shape[h] · share[h][m]`
/// in hour `h`.
fn workloads(peak_rps: f64, shape: &[f64], shares: &[Vec<f64>], hour_s: f64) -> Vec<Workload> {
    let models = shares.first().map_or(0, Vec::len);
    (0..models)
        .map(|m| Workload {
            rate_rps: peak_rps,
            schedule: RateSchedule { steps: (0..HOURS).map(|h| (Duration::from_secs_f64(h as f64 * hour_s), shape[h] * shares[h][m])).collect() },
            ..Workload::poisson(peak_rps)
        })
        .collect()
}

/// The per-GPU goodput of deferred on the day's mean mix.
fn per_gpu_goodput(models: &[ModelSpec], mean_shares: &[f64], shape: &Shape) -> Result<f64, ReportError> {
    let base = SimConfig {
        models: models.to_vec(),
        gpus: shape.probe_gpus,
        workload: Workload { popularity: Popularity::Weights(mean_shares.to_vec()), ..Workload::poisson(0.0) },
        duration: Duration::from_secs_f64(if shape.max_gpus > 64 { 10.0 } else { 5.0 }),
        warmup: Duration::from_secs_f64(1.0),
        seed: shape.seed,
        trace: None,
        admission: Default::default(),
    };
    let found = search(&base, &PolicyConfig::new(PolicyKind::Deferred), &GoodputSearch { rel_precision: 0.01, ..GoodputSearch::default() }, &mut |_, _, _, _| {})?;
    Ok(found.goodput_rps / f64::from(shape.probe_gpus))
}

/// Each hour's measured need: the fewest GPUs on which deferred serves
/// the hour's rate and mix, as a static cluster, with at most 1% bad
/// (bisection; a run of `hour_s`, at most 10 s, its first fifth warm-up,
/// seeded with the day's seed plus the hour): what the hour's offered
/// load needs at the per-GPU goodput measured at that load. `offered / g`
/// (with `g` measured at the day's mean mix on half the cluster) asks the
/// same question at one load for the whole day.
fn measured_need(models: &[ModelSpec], shares: &[Vec<f64>], day: &[f64], peak_rps: f64, shape: &Shape) -> Result<Vec<u32>, ReportError> {
    let mut out = Vec::with_capacity(HOURS);
    for (h, row) in shares.iter().enumerate() {
        let rate = peak_rps * day[h];
        let serves = |gpus: u32| -> Result<bool, ReportError> {
            let cfg = SimConfig {
                models: models.to_vec(),
                gpus,
                workload: Workload { popularity: Popularity::Weights(row.clone()), ..Workload::poisson(rate) },
                duration: Duration::from_secs_f64(shape.hour_s.min(10.0)),
                warmup: Duration::from_secs_f64(shape.hour_s.min(10.0) / 5.0),
                seed: shape.seed.wrapping_add(h as u64),
                trace: None,
                admission: Default::default(),
            };
            let mut sched = scheduler::policy::build(models, gpus, &PolicyConfig::new(PolicyKind::Deferred))?;
            Ok(scheduler::sim::simulate(&cfg, sched.as_mut())?.bad_rate <= 0.01)
        };
        // serves(hi) holds and serves(lo) does not, or lo is 0.
        let (mut lo, mut hi) = (0u32, shape.max_gpus);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if serves(mid)? {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        out.push(hi);
    }
    Ok(out)
}

/// What the acceptance measures on one run.
#[derive(Clone, Debug, Serialize)]
struct Acceptance {
    settling_s: f64,
    settled_intervals: usize,
    /// Settled intervals whose GPUs in use are within 15% of the hour's
    /// measured need ([`measured_need`]): the acceptance's measure.
    within_15pct: usize,
    /// Settled intervals more than 15% over the measured need, and under.
    over_15pct: usize,
    under_15pct: usize,
    /// The largest |in use − need| / need over settled intervals.
    worst_gpu_error: f64,
    /// (in use − need) / need over the settled intervals: median, and the
    /// least and most.
    gpu_error_median: f64,
    gpu_error_min: f64,
    gpu_error_max: f64,
    /// Settled intervals whose GPUs in use are within 15% of
    /// `offered / g`, and the largest error against it.
    within_15pct_of_offered_per_g: usize,
    worst_offered_per_g_error: f64,
    /// Bad over all outcomes in the settled intervals.
    settled_bad_rate: f64,
    /// The worst settled interval's bad rate.
    worst_interval_bad_rate: f64,
    gpu_seconds: f64,
    static_peak_gpus: u32,
    static_gpu_seconds: f64,
    gpu_seconds_ratio: f64,
}

fn acceptance(rep: &ElasticReport, shape: &Shape, g: f64, peak_rps: f64, day_s: f64, measured: &[u32]) -> Acceptance {
    let settle = shape.settling_s();
    let (mut within_g, mut worst_g, mut good, mut bad, mut worst_bad) = (0usize, 0.0f64, 0u64, 0u64, 0.0f64);
    // (in use − measured need) / need of each settled interval.
    let mut errors: Vec<f64> = Vec::with_capacity(rep.epochs.len());
    for e in &rep.epochs {
        let since_change = e.t_s - shape.interval_s - (((e.t_s - shape.interval_s) / shape.hour_s).floor() * shape.hour_s);
        if since_change + 1e-9 < settle {
            continue;
        }
        let offered_rps = e.offered.iter().sum::<u64>() as f64 / shape.interval_s;
        let per_g = (offered_rps / g).max(1.0);
        let err_g = (e.gpus_in_use - per_g).abs() / per_g;
        within_g += usize::from(err_g <= 0.15);
        worst_g = worst_g.max(err_g);
        let hour = (((e.t_s - shape.interval_s) / shape.hour_s).floor() as usize).min(HOURS - 1);
        let need = f64::from(measured.get(hour).copied().unwrap_or(1).max(1));
        errors.push((e.gpus_in_use - need) / need);
        let (eg, eb) = (e.good.iter().sum::<u64>(), e.bad.iter().sum::<u64>());
        good += eg;
        bad += eb;
        worst_bad = worst_bad.max(e.bad_rate);
    }
    errors.sort_by(f64::total_cmp);
    let static_peak_gpus = (peak_rps / g).ceil() as u32;
    let static_gpu_seconds = f64::from(static_peak_gpus) * day_s;
    Acceptance {
        settling_s: settle,
        settled_intervals: errors.len(),
        within_15pct: errors.iter().filter(|e| e.abs() <= 0.15).count(),
        over_15pct: errors.iter().filter(|&&e| e > 0.15).count(),
        under_15pct: errors.iter().filter(|&&e| e < -0.15).count(),
        worst_gpu_error: errors.iter().fold(0.0, |w, e| w.max(e.abs())),
        gpu_error_median: errors.get(errors.len() / 2).copied().unwrap_or(0.0),
        gpu_error_min: errors.first().copied().unwrap_or(0.0),
        gpu_error_max: errors.last().copied().unwrap_or(0.0),
        within_15pct_of_offered_per_g: within_g,
        worst_offered_per_g_error: worst_g,
        settled_bad_rate: if good + bad > 0 { bad as f64 / (good + bad) as f64 } else { 0.0 },
        worst_interval_bad_rate: worst_bad,
        gpu_seconds: rep.gpu_seconds,
        static_peak_gpus,
        static_gpu_seconds,
        gpu_seconds_ratio: rep.gpu_seconds / static_gpu_seconds,
    }
}

#[derive(Serialize)]
struct PolicyRun {
    acceptance: Acceptance,
    run: ElasticReport,
}

#[derive(Serialize)]
struct Fig15 {
    shape: Shape,
    models: Vec<String>,
    day_shape: Vec<f64>,
    per_gpu_goodput_rps: f64,
    peak_rps: f64,
    /// Each hour's measured need ([`measured_need`]).
    measured_need: Vec<u32>,
    runs: Vec<PolicyRun>,
}

/// Runs the report: `policies` (empty: deferred, eager, clockwork) under
/// the same autoscaler.
pub fn run(quick: bool, plot_dir: Option<&Path>, json: bool, policies: &[String], seed: Option<u64>) -> Result<(), ReportError> {
    let mut shape = Shape::new(quick);
    shape.seed = seed.unwrap_or(shape.seed);
    let kinds: Vec<PolicyKind> = if policies.is_empty() {
        vec![PolicyKind::Deferred, PolicyKind::Eager, PolicyKind::Clockwork]
    } else {
        policies.iter().map(|p| PolicyKind::parse(p)).collect::<Result<_, _>>()?
    };
    let models = models();
    let day = day_shape();
    let shares = drifting_shares(models.len(), shape.seed);
    let mean_shares: Vec<f64> = (0..models.len()).map(|m| shares.iter().zip(&day).map(|(row, s)| row[m] * s).sum::<f64>()).collect();
    let g = per_gpu_goodput(&models, &mean_shares, &shape)?;
    let peak_rps = shape.peak_load * f64::from(shape.max_gpus) * g;
    let day_s = shape.hour_s * HOURS as f64;
    let autoscale = AutoscaleConfig {
        headroom: shape.headroom,
        stabilisation: Duration::from_secs_f64(shape.stabilisation_s),
        cooldown: Duration::from_secs_f64(shape.cooldown_s),
        max_gpus: shape.max_gpus,
        max_step: shape.max_step,
        ..AutoscaleConfig::default()
    };
    let cfg = ElasticConfig {
        models: models.clone(),
        workloads: workloads(peak_rps, &day, &shares, shape.hour_s),
        max_gpus: shape.max_gpus,
        initial_gpus: ((peak_rps * day[0] / g).ceil() as u32).clamp(1, shape.max_gpus),
        duration: Duration::from_secs_f64(day_s),
        seed: shape.seed,
        join_time: Duration::from_secs_f64(shape.join_s),
        interval: Duration::from_secs_f64(shape.interval_s),
        autoscale: Some(autoscale),
    };
    let measured = measured_need(&models, &shares, &day, peak_rps, &shape)?;
    let mut runs = Vec::with_capacity(kinds.len());
    for kind in kinds {
        let mut sched = scheduler::policy::build(&models, shape.max_gpus, &PolicyConfig::new(kind))?;
        let rep = simulate_elastic(&cfg, sched.as_mut())?;
        runs.push(PolicyRun { acceptance: acceptance(&rep, &shape, g, peak_rps, day_s, &measured), run: rep });
    }
    let fig = Fig15 { shape, models: models.iter().map(|m| m.name.clone()).collect(), day_shape: day, per_gpu_goodput_rps: g, peak_rps, measured_need: measured, runs };
    if let Some(dir) = plot_dir {
        for r in &fig.runs {
            write_panels(dir, &fig, r)?;
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&fig)?);
    } else {
        print_markdown(&fig);
    }
    Ok(())
}

fn print_markdown(fig: &Fig15) {
    let s = &fig.shape;
    let trough = fig.day_shape.iter().copied().fold(f64::INFINITY, f64::min);
    let mean = fig.day_shape.iter().sum::<f64>() / fig.day_shape.len() as f64;
    println!(
        "Figure 15: {} models (12 of each zoo) on up to {} emulated GPUs over a day of 24 hours, each hour {} s of virtual time (compressed; real profiles). Day shape: peak-to-mean {:.2}, trough {:.1}% of peak; shares drifting (seed {}).",
        fig.models.len(),
        s.max_gpus,
        s.hour_s,
        1.0 / mean,
        trough * 100.0,
        s.seed
    );
    println!(
        "Per-GPU goodput g = {:.0} rps (deferred, goodput search on {} GPUs at the day's mean mix); peak {:.0} rps ({:.0}% of {} GPUs at g).",
        fig.per_gpu_goodput_rps,
        s.probe_gpus,
        fig.peak_rps,
        s.peak_load * 100.0,
        s.max_gpus
    );
    println!(
        "Autoscaler: interval {} s, join time {} s, stabilisation {} s, cool-down {} s, step ≤ {}, headroom {}% over the demand, bad-rate threshold 1%. Settling time after each hourly change: {} s.\n",
        s.interval_s,
        s.join_s,
        s.stabilisation_s,
        s.cooldown_s,
        s.max_step,
        s.headroom * 100.0,
        s.settling_s()
    );
    println!("| policy | acting | GPU-s / static peak-sized ({} GPUs) | settled intervals within 15% of the measured need (over / under) | error min / median / max | within 15% of offered / g | bad rate settled | bad rate, day | added | drained | longest drain s |", fig.runs.first().map_or(0, |r| r.acceptance.static_peak_gpus));
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &fig.runs {
        let a = &r.acceptance;
        println!(
            "| {} | {} | {:.0} / {:.0} = {:.3} | {} / {} ({} / {}) | {:+.3} / {:+.3} / {:+.3} | {} / {} | {:.4} | {:.4} | {} | {} | {:.3} |",
            r.run.policy,
            if r.run.acting { "yes" } else { "advice only" },
            a.gpu_seconds,
            a.static_gpu_seconds,
            a.gpu_seconds_ratio,
            a.within_15pct,
            a.settled_intervals,
            a.over_15pct,
            a.under_15pct,
            a.gpu_error_min,
            a.gpu_error_median,
            a.gpu_error_max,
            a.within_15pct_of_offered_per_g,
            a.settled_intervals,
            a.settled_bad_rate,
            r.run.summary.bad_rate,
            r.run.added,
            r.run.drained,
            r.run.max_drain_s
        );
    }
    for r in &fig.runs {
        println!("\n{} by hour (means over the hour's intervals):\n", r.run.policy);
        println!("| hour | offered rps | good rps | bad rate | GPUs needed | measured need | demand estimate | GPUs in use | GPUs busy | advice add | advice remove | added | drained |");
        println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for h in 0..HOURS {
            let rows: Vec<_> = r.run.epochs.iter().filter(|e| ((e.t_s - s.interval_s) / s.hour_s).floor() as usize == h).collect();
            if rows.is_empty() {
                continue;
            }
            let k = rows.len() as f64;
            let span = k * s.interval_s;
            let offered = rows.iter().map(|e| e.offered.iter().sum::<u64>()).sum::<u64>() as f64 / span;
            let good = rows.iter().map(|e| e.good.iter().sum::<u64>()).sum::<u64>() as f64 / span;
            let bad = rows.iter().map(|e| e.bad.iter().sum::<u64>()).sum::<u64>() as f64;
            let outcomes = good * span + bad;
            println!(
                "| {h} | {offered:.0} | {good:.0} | {:.4} | {:.1} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {} |",
                if outcomes > 0.0 { bad / outcomes } else { 0.0 },
                offered / fig.per_gpu_goodput_rps,
                fig.measured_need[h],
                rows.iter().map(|e| e.demand_gpus).sum::<f64>() / k,
                rows.iter().map(|e| e.gpus_in_use).sum::<f64>() / k,
                rows.iter().map(|e| e.gpus_busy).sum::<f64>() / k,
                rows.iter().map(|e| e.advice_add).sum::<f64>() / k,
                rows.iter().map(|e| e.advice_remove).sum::<f64>() / k,
                rows.iter().map(|e| e.added).sum::<u32>(),
                rows.iter().map(|e| e.drained).sum::<u32>()
            );
        }
    }
    println!("\nMeasured need (the acceptance's measure): the fewest GPUs of a static cluster on which deferred serves the hour's rate and mix with at most 1% bad. GPUs needed: offered / g, g measured once at the day's mean mix. Demand estimate: the autoscaler's target signal, each model's observed rate at the largest batch its SLO allows (scheduler::autoscale::demand_gpus). In use: joining, serving or draining (paid for). Busy: GPU time running batches. Advice: the paper's N·r/(1−r) and N·f for the serving GPUs.");
}

/// The paper's four panels for one policy.
fn write_panels(dir: &Path, fig: &Fig15, r: &PolicyRun) -> Result<(), ReportError> {
    let p = &r.run.policy;
    let e = &r.run.epochs;
    let per_s = fig.shape.interval_s;
    let series = |label: &str, f: &dyn Fn(&scheduler::sim::autoscaled::EpochRow) -> f64| plot::Series { label: label.into(), points: e.iter().map(|row| (row.t_s, f(row))).collect() };
    // Panel 1: goodput and unsatisfied requests; the busiest models by name.
    let mut by_volume: Vec<usize> = (0..fig.models.len()).collect();
    by_volume.sort_by_key(|&m| std::cmp::Reverse(e.iter().map(|row| row.good[m]).sum::<u64>()));
    let mut goodput = vec![
        series("offered (all)", &|row| row.offered.iter().sum::<u64>() as f64 / per_s),
        series("good (all)", &|row| row.good.iter().sum::<u64>() as f64 / per_s),
        series("unsatisfied (all)", &|row| row.bad.iter().sum::<u64>() as f64 / per_s),
    ];
    for &m in by_volume.iter().take(5) {
        goodput.push(series(&format!("good {}", fig.models[m]), &|row| row.good[m] as f64 / per_s));
    }
    let write = |name: &str, svg: String| plot::write_svg(dir, &format!("fig15_{p}_{name}.svg"), &svg);
    write("goodput", plot::lines(&format!("{p}: goodput and unsatisfied requests"), "virtual time (s)", "requests/s", &goodput))?;
    let g = fig.per_gpu_goodput_rps;
    write(
        "gpus",
        plot::lines(
            &format!("{p}: GPUs"),
            "virtual time (s)",
            "GPUs",
            &[
                series("in use", &|row| row.gpus_in_use),
                series("needed (offered / g)", &|row| row.offered.iter().sum::<u64>() as f64 / per_s / g),
                series("busy", &|row| row.gpus_busy),
                series("demand estimate (full batches)", &|row| row.demand_gpus),
            ],
        ),
    )?;
    write(
        "advice",
        plot::lines(
            &format!("{p}: autoscaler advice and actions"),
            "virtual time (s)",
            "GPUs",
            &[
                series("advice: add", &|row| row.advice_add),
                series("advice: remove", &|row| row.advice_remove),
                series("added", &|row| f64::from(row.added)),
                series("drained", &|row| f64::from(row.drained)),
            ],
        ),
    )?;
    write("bad_rate", plot::lines(&format!("{p}: bad rate"), "virtual time (s)", "bad rate", &[series("bad rate", &|row| row.bad_rate)]))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_day_has_the_stated_shape() {
        let d = day_shape();
        let mean = d.iter().sum::<f64>() / d.len() as f64;
        let max = d.iter().copied().fold(0.0, f64::max);
        let min = d.iter().copied().fold(f64::INFINITY, f64::min);
        assert!((max - 1.0).abs() < 1e-12);
        assert!((1.0 / mean - PEAK_TO_MEAN).abs() < 1e-6, "{}", 1.0 / mean);
        assert!((0.13..0.18).contains(&min), "{min}");
    }

    #[test]
    fn shares_drift_and_sum_to_one() {
        let s = drifting_shares(24, 1);
        assert_eq!(s.len(), HOURS);
        assert!(s.iter().all(|row| (row.iter().sum::<f64>() - 1.0).abs() < 1e-9));
        assert_ne!(s[0], s[12]);
        assert_eq!(s, drifting_shares(24, 1));
    }

    #[test]
    fn twenty_four_models_of_both_zoos() {
        let m = models();
        assert_eq!(m.len(), 24);
        assert_eq!(m.iter().filter(|m| m.name.ends_with("@a100")).count(), 12);
    }
}
