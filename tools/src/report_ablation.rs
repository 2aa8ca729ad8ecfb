//! `symphony report ablation [--quick] [--json] [--sample N --sample-seed S]`:
//! what each of deferred's departures from Algorithm 1 buys (issue 49,
//! item 3). One row per [`Departure`]: deferred with that departure
//! switched (off; [`Departure::LightLoad`], off by default, on) against
//! the default set, on
//!
//! - goodput over the fixed grid of `report grid` (`--quick`: its quick
//!   cells) and over a random sample of workloads from the grid's stated
//!   space ([`crate::report_grid::sample_cells`]): per cell the ratio
//!   switched / default, and over the cells the worst, the geometric mean
//!   and how many moved by more than [`MOVED`];
//! - p99 latency at half load: each grid cell at half the default set's
//!   goodput on it, the ratio of the two p99s (geometric mean and worst);
//! - closed-loop throughput: a perf_analyzer-style client
//!   ([`closed_loop_rate`]) at concurrency 1, 4 and 16.
//!
//! Seed 1 throughout (the ratio of two runs on the same arrivals); the
//! searches are the grid's ([`crate::report_grid`]'s knobs). A departure
//! whose row shows no gain on any of these on the sample is a candidate for
//! removal (`candidates` in the JSON).

use crate::report_grid::{cells, sample_cells, sim, Cell, GridError, Sample, MIN_REQUESTS_PER_MODEL};
use dataplane::stats;
use dataplane::time::{Duration, Instant};
use scheduler::deferred::{Departure, DepartureSet};
use scheduler::goodput::{search, GoodputSearch};
use scheduler::policy::{build, PolicyConfig, PolicyKind};
use scheduler::sim::simulate;
use scheduler::types::{Actions, GpuId, Request};
use scheduler::zoo::ModelSpec;
use serde::Serialize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// A cell's ratio counts as moved beyond this distance from 1 (the grid's
/// searches bisect to 0.5%, so two runs agree to about 1%).
pub const MOVED: f64 = 0.01;
/// Workloads drawn when `--sample` is not given: `--quick` and full.
const SAMPLE_SIZE: (usize, usize) = (8, 40);
/// The closed loop's concurrencies.
const CONCURRENCY: [u64; 3] = [1, 4, 16];
/// Threads the searches run on (the grid's two).
const THREADS: usize = 2;

/// One side of a row: the per-cell ratios of a switched set against the
/// default, summarised.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Ratios {
    /// Cells measured.
    pub cells: usize,
    /// The lowest ratio.
    pub worst: f64,
    /// The highest ratio.
    pub best: f64,
    /// The geometric mean.
    pub geomean: f64,
    /// Cells below `1 - MOVED` (the switch loses there).
    pub lower: usize,
    /// Cells above `1 + MOVED`.
    pub higher: usize,
}

impl Ratios {
    fn of(r: &[f64]) -> Ratios {
        let ok: Vec<f64> = r.iter().copied().filter(|x| x.is_finite() && *x > 0.0).collect();
        if ok.is_empty() {
            return Ratios::default();
        }
        Ratios {
            cells: ok.len(),
            worst: ok.iter().copied().fold(f64::INFINITY, f64::min),
            best: ok.iter().copied().fold(0.0, f64::max),
            geomean: (ok.iter().map(|x| x.ln()).sum::<f64>() / ok.len() as f64).exp(),
            lower: ok.iter().filter(|x| **x < 1.0 - MOVED).count(),
            higher: ok.iter().filter(|x| **x > 1.0 + MOVED).count(),
        }
    }
}

/// One departure's row.
#[derive(Debug, Serialize)]
pub struct Row {
    /// The departure's name.
    pub departure: &'static str,
    /// Its docs/decisions.md items.
    pub items: &'static [u8],
    /// Whether the row switches it on (off by default) rather than off.
    pub switched_on: bool,
    /// Goodput ratio switched / default over the grid's cells.
    pub grid_goodput: Ratios,
    /// ... over the sample's.
    pub sample_goodput: Ratios,
    /// p99 latency ratio switched / default at half the default's goodput,
    /// over the grid's cells (above 1: the switch is slower).
    pub half_load_p99: Ratios,
    /// Closed-loop completions per second, switched, per concurrency.
    pub closed_loop_rps: Vec<(u64, f64)>,
    /// Whether the departure pays on none of the measures on the sample
    /// and the closed loop: switching it off (on, for an off-by-default
    /// one) loses goodput in no sample cell, p99 at half load in no grid
    /// cell, and no closed-loop throughput.
    pub removal_candidate: bool,
}

/// The report.
#[derive(Debug, Serialize)]
pub struct AblationReport {
    /// The grid's cells: quick or full.
    pub quick: bool,
    /// The sample.
    pub sample: Sample,
    /// Default set's closed-loop completions per second, per concurrency.
    pub default_closed_loop_rps: Vec<(u64, f64)>,
    /// One row per departure.
    pub rows: Vec<Row>,
    /// The rows whose `removal_candidate` holds.
    pub candidates: Vec<&'static str>,
    /// Wall time, seconds.
    pub wall_s: f64,
}

/// The set a row measures: `d` off, or (off by default) on.
fn switched(d: Departure) -> DepartureSet {
    let base = DepartureSet::default();
    if base.has(d) {
        base.without(d)
    } else {
        base.with(d)
    }
}

fn deferred(set: DepartureSet) -> PolicyConfig {
    PolicyConfig { departures: set, ..PolicyConfig::new(PolicyKind::Deferred) }
}

/// Runs `jobs` on [`THREADS`] threads; results in job order.
fn parallel<J: Sync, R: Send>(jobs: &[J], f: impl Fn(&J) -> R + Sync) -> Result<Vec<R>, GridError> {
    let results: Mutex<Vec<Option<R>>> = Mutex::new((0..jobs.len()).map(|_| None).collect());
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.get(i) else { break };
                let r = f(job);
                if let Ok(mut all) = results.lock() {
                    all[i] = Some(r);
                }
            });
        }
    });
    let all = results.into_inner().map_err(|_| GridError::Worker("a worker panicked"))?;
    all.into_iter().map(|r| r.ok_or(GridError::Worker("a job did not run"))).collect()
}

/// Goodput of `set` on every cell, seed 1, with the grid's knobs.
fn goodputs(cells: &[Cell], sets: &[DepartureSet]) -> Result<Vec<Vec<f64>>, GridError> {
    let knobs = GoodputSearch { rel_precision: 0.005, max_runs: 24, min_requests_per_model: MIN_REQUESTS_PER_MODEL, ..GoodputSearch::default() };
    let jobs: Vec<(usize, usize)> = (0..sets.len()).flat_map(|s| (0..cells.len()).map(move |c| (s, c))).collect();
    let found = parallel(&jobs, |&(s, c)| search(&sim(&cells[c], 1), &deferred(sets[s]), &knobs, &mut |_, _, _, _| {}).map(|f| f.goodput_rps))?;
    let mut out = vec![Vec::with_capacity(cells.len()); sets.len()];
    for ((s, _), g) in jobs.iter().zip(found) {
        out[*s].push(g.map_err(|source| GridError::Search { policy: "deferred".into(), source })?);
    }
    Ok(out)
}

/// p99 latency (ms) of `set` on every cell at `rates[c]`, seed 1.
fn p99s(cells: &[Cell], rates: &[f64], sets: &[DepartureSet]) -> Result<Vec<Vec<f64>>, GridError> {
    let jobs: Vec<(usize, usize)> = (0..sets.len()).flat_map(|s| (0..cells.len()).map(move |c| (s, c))).collect();
    let found = parallel(&jobs, |&(s, c)| {
        let mut cfg = sim(&cells[c], 1);
        cfg.workload.rate_rps = rates[c];
        let mut sched = build(&cfg.models, cfg.gpus, &deferred(sets[s]))?;
        Ok::<_, GridError>(simulate(&cfg, &mut *sched)?.p99_ms)
    })?;
    let mut out = vec![Vec::with_capacity(cells.len()); sets.len()];
    for ((s, _), p) in jobs.iter().zip(found) {
        out[*s].push(p?);
    }
    Ok(out)
}

/// A perf_analyzer-style closed loop on one model (tests/perf_analyzer.sh's
/// profile: `l(b)` = 0.268 ms per request plus 5.172 ms, SLO 200 ms) on
/// `gpus` emulated GPUs: `clients` clients, each sending its next request
/// `turn` plus 20 µs per client index after its answer (answers reach
/// clients a little apart, as they do). Returns the completions per second
/// from 8 s to 10 s of simulated time (the loop settles in a few cycles).
pub fn closed_loop_rate(set: DepartureSet, clients: u64, gpus: u32, turn: Duration) -> f64 {
    let Ok(model) = ModelSpec::linear("tc_model", 0.268, 5.172, 200.0) else { return 0.0 };
    let Ok(mut s) = build(&[model], gpus, &deferred(set)) else { return 0.0 };
    let mut out = Actions::default();
    let mut sends: Vec<Instant> = (0..clients).map(|i| Instant::from_nanos(i * 10_000)).collect();
    // Per GPU: the running batch's finish and its (request id, client)s.
    type Running = Option<(Instant, Vec<(u64, usize)>)>;
    let mut running: Vec<Running> = vec![None; gpus as usize];
    let mut client_of: Vec<(u64, usize)> = Vec::new();
    let (mut done, mut next_id) = (0u64, 0u64);
    let (from, to) = (Instant::from_nanos(8_000_000_000), Instant::from_nanos(10_000_000_000));
    for _ in 0..10_000_000 {
        let Some((c, send)) = sends.iter().copied().enumerate().min_by_key(|&(_, t)| t) else { break };
        let finish = running.iter().enumerate().filter_map(|(g, r)| r.as_ref().map(|r| (g, r.0))).min_by_key(|&(_, t)| t);
        let now = send.min(finish.map_or(Instant::NEVER, |f| f.1)).min(s.poll_at().unwrap_or(Instant::NEVER));
        if now >= to {
            break;
        }
        match finish {
            Some((g, t)) if t == now => {
                for (_, client) in running[g].take().map(|r| r.1).unwrap_or_default() {
                    sends[client] = now + turn + Duration::from_micros(20 * client as u64);
                    done += u64::from(now >= from);
                }
                s.on_batch_done(now, g as GpuId, &mut out);
            }
            _ if send == now => {
                let id = next_id;
                next_id += 1;
                client_of.push((id, c));
                sends[c] = Instant::NEVER;
                s.on_request(now, Request::new(id, 0, now, now + Duration::from_millis(200)), &mut out);
            }
            _ => s.on_wake(now, &mut out),
        }
        for b in &out.batches {
            let members = out.members[b.members.clone()].iter().filter_map(|r| client_of.iter().find(|(id, _)| *id == r.id).copied()).collect();
            if let Some(slot) = running.get_mut(b.gpu as usize) {
                *slot = Some((b.finish_at, members));
            }
        }
        for (r, _) in &out.drops {
            if let Some(&(_, client)) = client_of.iter().find(|(id, _)| *id == r.id) {
                sends[client] = now + turn;
            }
        }
        let gone: Vec<u64> = out.members.iter().map(|r| r.id).chain(out.drops.iter().map(|(r, _)| r.id)).collect();
        client_of.retain(|(id, _)| !gone.contains(id));
        out.clear();
    }
    done as f64 / 2.0
}

fn closed_loop(set: DepartureSet) -> Vec<(u64, f64)> {
    CONCURRENCY.iter().map(|&c| (c, closed_loop_rate(set, c, 2, Duration::from_micros(500)))).collect()
}

/// Runs the ablation and prints it (Markdown, or JSON with `json`).
pub fn run(quick: bool, json: bool, sample: Option<Sample>) -> Result<(), GridError> {
    let started = std::time::Instant::now();
    let sample = sample.unwrap_or(Sample { size: if quick { SAMPLE_SIZE.0 } else { SAMPLE_SIZE.1 }, seed: 1 });
    let grid = cells(quick)?;
    let drawn = sample_cells(sample)?;
    let mut sets = vec![DepartureSet::default()];
    sets.extend(Departure::ALL.iter().map(|&d| switched(d)));
    tracing::info!("ablation: {} sets x ({} grid + {} sample cells) goodput searches, then p99 at half load", sets.len(), grid.len(), drawn.len());
    let grid_g = goodputs(&grid, &sets)?;
    let sample_g = goodputs(&drawn, &sets)?;
    let half: Vec<f64> = grid_g[0].iter().map(|g| g * 0.5).collect();
    let p99 = p99s(&grid, &half, &sets)?;
    let loops = parallel(&sets, |s| closed_loop(*s))?;
    let ratio = |a: &[f64], b: &[f64]| -> Vec<f64> { a.iter().zip(b).map(|(x, y)| if *y > 0.0 { x / y } else { f64::NAN }).collect() };
    let mut rows = Vec::new();
    for (i, &d) in Departure::ALL.iter().enumerate() {
        let s = i + 1;
        let sample_goodput = Ratios::of(&ratio(&sample_g[s], &sample_g[0]));
        let half_load_p99 = Ratios::of(&ratio(&p99[s], &p99[0]));
        let closed_loop_rps = loops[s].clone();
        // Switching the departure (off) costs nothing measured: no sample
        // cell loses goodput, no grid cell's p99 rises, no loop slows.
        let loop_loses = closed_loop_rps.iter().zip(&loops[0]).any(|((_, x), (_, y))| *x < (1.0 - MOVED) * y);
        let removal_candidate = DepartureSet::default().has(d) && sample_goodput.lower == 0 && half_load_p99.higher == 0 && !loop_loses;
        rows.push(Row { departure: d.name(), items: d.items(), switched_on: !DepartureSet::default().has(d), grid_goodput: Ratios::of(&ratio(&grid_g[s], &grid_g[0])), sample_goodput, half_load_p99, closed_loop_rps, removal_candidate });
    }
    let candidates = rows.iter().filter(|r| r.removal_candidate).map(|r| r.departure).collect();
    let report = AblationReport { quick, sample, default_closed_loop_rps: loops[0].clone(), rows, candidates, wall_s: started.elapsed().as_secs_f64() };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_markdown(&report, stats::median(&mut grid_g[0].clone()).unwrap_or(0.0));
    }
    Ok(())
}

fn print_markdown(r: &AblationReport, median_goodput: f64) {
    println!(
        "Deferred's departures from Algorithm 1, each switched against the default set (seed 1; ratios switched / default; grid: {} cells, median default goodput {:.0} rps; sample: {} workloads, seed {}). Lower/higher: cells beyond {:.0}%.\n",
        if r.quick { "the quick" } else { "the full" },
        median_goodput,
        r.sample.size,
        r.sample.seed,
        MOVED * 100.0
    );
    let loops = r.default_closed_loop_rps.iter().map(|(c, x)| format!("c{c} {x:.0}")).collect::<Vec<_>>().join(", ");
    println!("Closed loop, default set: {loops} completions/s.\n");
    println!("| departure | items | grid goodput worst / geomean (lower, higher) | sample goodput worst / geomean (lower, higher) | half-load p99 geomean / worst (higher) | closed loop c1 / c4 / c16 | removal candidate |");
    println!("|---|---|---|---|---|---|---|");
    let fmt = |x: &Ratios| format!("{:.3} / {:.3} ({}, {})", x.worst, x.geomean, x.lower, x.higher);
    for row in &r.rows {
        let items = row.items.iter().map(u8::to_string).collect::<Vec<_>>().join(", ");
        let name = if row.switched_on { format!("{} (on)", row.departure) } else { format!("{} (off)", row.departure) };
        let loops = row.closed_loop_rps.iter().map(|(_, x)| format!("{x:.0}")).collect::<Vec<_>>().join(" / ");
        println!(
            "| {name} | {items} | {} | {} | {:.3} / {:.3} ({}) | {loops} | {} |",
            fmt(&row.grid_goodput),
            fmt(&row.sample_goodput),
            row.half_load_p99.geomean,
            row.half_load_p99.best,
            row.half_load_p99.higher,
            if row.removal_candidate { "yes" } else { "no" }
        );
    }
    println!("\nRemoval candidates: {}. Wall time {:.0} s.", if r.candidates.is_empty() { "none".to_string() } else { r.candidates.join(", ") }, r.wall_s);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_summarise_and_skip_cells_without_a_measure() {
        let r = Ratios::of(&[0.5, 2.0, 1.0, f64::NAN, 1.005]);
        assert_eq!(r.cells, 4);
        assert_eq!((r.worst, r.best), (0.5, 2.0));
        assert!((r.geomean - 1.005f64.powf(0.25)).abs() < 1e-12, "{}", r.geomean);
        assert_eq!((r.lower, r.higher), (1, 1));
        assert_eq!(Ratios::of(&[]).cells, 0);
    }

    #[test]
    fn a_row_switches_one_departure_against_the_default() {
        let base = DepartureSet::default();
        for d in Departure::ALL {
            let s = switched(d);
            assert_ne!(s.has(d), base.has(d), "{d}");
            assert_eq!(Departure::ALL.iter().filter(|e| s.has(**e) != base.has(**e)).count(), 1, "{d}");
        }
    }

    #[test]
    fn the_closed_loop_keeps_every_client_busy_and_follow_ups_pay_at_concurrency_four() {
        // tests/deferred.rs's closed loop: one client over 2 GPUs runs a
        // batch of one per cycle, l(1) = 5.44 ms plus a 0.5 ms turn: about
        // 168 per second, not 5 (the SLO) ...
        let turn = Duration::from_micros(500);
        let one = closed_loop_rate(DepartureSet::default(), 1, 2, turn);
        assert!(one > 150.0 && one < 185.0, "{one}");
        // ... and at concurrency 4 the batch goes once its clients are back
        // (item 31); without follow-ups it waits into its window.
        let four = closed_loop_rate(DepartureSet::default(), 4, 2, turn);
        let without = closed_loop_rate(DepartureSet::default().without(Departure::FollowUps), 4, 2, turn);
        assert!(four > 533.0, "{four}");
        assert!(without < 0.9 * four, "{without} against {four}");
    }
}
