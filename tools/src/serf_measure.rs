//! `symphony predict --measure`: checks SERF's prediction
//! ([`scheduler::serf`]) against the ONNX Runtime executor on this machine.
//!
//! **What a worker is on a CPU.** SERF's worker is one machine (elsewhere in this
//! project a GPU) whose fixed compute is shared by the `c` requests it
//! runs at once. On a CPU the worker is one [`OnnxExecutor`] with `c`
//! devices (device threads, each with its own session) and a fixed budget
//! of `T` ONNX Runtime intra-op threads (`--thread-budget`, default the
//! cores of this machine): each device gets `max(1, T / c)` threads, so
//! `c = 1` runs one batch on all `T` threads and `c = 2` runs two batches
//! on `T / 2` each: SERF's rule that the intra-node parallelism of a
//! configuration with service parallelism `c` is `F / c` for `F` cores
//! (section IV-C3, after Eq. 13). Giving every concurrent batch its own thread instead
//! would grant `c = 2` twice the compute of `c = 1` and make the question
//! SERF answers (does sharing a worker between batches pay?) moot.
//!
//! **Inputs (SERF's profile, section IV-C):** for configuration `c`, `t_i`
//! for `i = 1..=c` is the mean service time of one batch of `--batch` while
//! exactly `i` batches run at once on that configuration's executor
//! (closed loop: the `i` batches start together after an idle pause; with
//! `--profile-from load` after the pauses the predicted load leaves
//! ([`LoadPauses`]); with `--profile-from busy` each of `i` devices
//! resubmits as soon as it finishes; a warm-up is discarded). The `t_i` depend on `c` (a batch alone on the
//! `c = 2` worker has `T / 2` threads), so each `c` is predicted from its
//! own profile.
//!
//! **Measurement:** a seeded Poisson stream of batches at `rate / batch`
//! per second for `--measure-s`, served FIFO with at most `c` batches in
//! flight; a batch's latency is its finish minus its intended arrival
//! (queueing + service). The first tenth of the arrivals is a warm-up and
//! not counted (the queue starts empty).
//!
//! The driver ([`OpenLoop`]) is sans-IO over any [`Executor`]: the
//! command drives it on the wall clock, the tests on the emulated
//! executor in virtual time.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::Duration as StdDuration;

use backend::exec::onnx::{OnnxModel, OnnxOptions};
use backend::{ExecError, Executor, Finished, InputRef, Job, OutputRef};
use dataplane::time::{Duration, Instant};
use scheduler::repository;
use scheduler::serf;
use rand::{Rng as _, SeedableRng as _};
use rand_xoshiro::Xoshiro256PlusPlus;
use scheduler::sim::workload::{ArrivalStream, Workload};
use serde::Serialize;

use crate::profile::{Bench, ProfileCmdError};

/// Relative error of the predicted mean latency the acceptance allows.
pub const TOLERANCE: f64 = 0.10;
/// Fraction of the arrivals (the first ones) not counted.
const WARMUP_FRACTION: f64 = 0.1;

/// Why the measurement stopped.
#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    /// Loading or running the model on the executor failed.
    #[error(transparent)]
    Bench(#[from] ProfileCmdError),
    /// The repository has no such model.
    #[error("predict --measure: no loadable model '{0}' in the repository")]
    NoModel(String),
    /// The model's configuration is not servable by the executor.
    #[error(transparent)]
    Repository(#[from] repository::RepositoryError),
    /// The batch does not fit the model.
    #[error("predict --measure: --batch {batch} above {model}'s max_batch_size {max}")]
    Batch {
        /// The model.
        model: String,
        /// The batch asked for.
        batch: u32,
        /// Its limit.
        max: u32,
    },
    /// A batch failed.
    #[error("{model}: a batch failed: {what}")]
    Run {
        /// The model.
        model: String,
        /// The executor's message.
        what: String,
    },
}

/// What to measure.
#[derive(Clone, Debug)]
pub struct MeasureConfig {
    /// The Triton-layout repository.
    pub model_repository: PathBuf,
    /// The model's name in it.
    pub model: String,
    /// Requests per second (arriving in batches of `batch`).
    pub rate_rps: f64,
    /// Requests per batch.
    pub batch: u32,
    /// Largest `c` measured.
    pub max_concurrency: usize,
    /// Seconds of arrivals per `c`.
    pub duration_s: f64,
    /// Seconds of closed-loop profiling per `t_i` (after a warm-up).
    pub profile_s: f64,
    /// Seed of the arrival stream (round `r` draws stream `r` of it).
    pub seed: u64,
    /// ONNX Runtime intra-op threads shared by the concurrent batches.
    pub thread_budget: usize,
    /// Rounds: `duration_s` and `profile_s` are split into this many
    /// parts, and every round profiles and measures each `c` in turn.
    pub rounds: u32,
    /// How `t_i` is profiled.
    pub profile_from: ProfileFrom,
}

/// How the profile times `t_i` (the `i` batches of one configuration).
///
/// On this VM a batch's service time depends on how long the executor
/// idled before it, which SERF's model (service independent of load) does
/// not have. Measured on a quiet machine (open_nsfw, batch 1, c = 1, 2
/// intra-op threads): 16.2 ms back to back, 17.9 ms after a pause of one
/// service time, 26.9 ms after three; 20.5 ms on average while serving 11
/// batches/s (docs/journal/benchmarks-2026.md, "SERF's profile from idle").
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProfileFrom {
    /// The `i` batches start together after the executor has been idle
    /// for [`IDLE_PAUSE`] or one service time, whichever is longer (ONNX
    /// Runtime's pool has stopped spinning, as for a served batch that
    /// finds the worker idle). On both models measured it predicted
    /// closer than `Busy` (same section), but one fixed pause misses
    /// open_nsfw at c = 1 by 15-17%.
    Idle,
    /// Each of the `i` devices resubmits as soon as it finishes (warm
    /// threads and caches): the profile of earlier measurements.
    Busy,
    /// The group restarts after the pauses the predicted load leaves
    /// ([`LoadPauses`]): none with probability `rho`, else an exponential
    /// gap at the batch arrival rate. A served batch sees a mix of short
    /// and long idle gaps, and on this VM its service time depends on the
    /// gap; no single pause reproduces the mix at every load. The default:
    /// open_nsfw at c = 1 from -16.7% (`Idle`) to +2.3%, ppocr_cls alike
    /// (docs/journal/benchmarks-2026.md, "SERF's profile from the load's pauses").
    #[default]
    Load,
}

/// The idle pauses a Poisson load at `lambda` batches/s leaves before a
/// batch on a worker of `c` devices: by PASTA a fraction `rho = lambda t /
/// c` of batches find the worker busy and start on a previous finish (no
/// pause); the others find it idle, and the idle gap before them is the
/// wait for the next arrival, exponential with mean `1 / lambda`
/// (memoryless). Seeded, so a profile replays.
pub struct LoadPauses {
    lambda: f64,
    devices: f64,
    rng: Xoshiro256PlusPlus,
}

impl LoadPauses {
    /// Pauses for `lambda` batches/s on `c` devices, drawn from `seed`.
    pub fn new(lambda: f64, c: usize, seed: u64) -> Self {
        LoadPauses { lambda, devices: c.max(1) as f64, rng: Xoshiro256PlusPlus::seed_from_u64(seed ^ 0x7365_7266_7061_7573) }
    }

    /// The pause before the next group, given the mean service time seen
    /// so far (`service_s`, seconds).
    pub fn next(&mut self, service_s: f64) -> StdDuration {
        let rho = (self.lambda * service_s / self.devices).clamp(0.0, 1.0);
        let busy: f64 = self.rng.random();
        if busy < rho || self.lambda <= 0.0 {
            return StdDuration::ZERO;
        }
        // 1 - U is in (0, 1]: its logarithm is finite.
        let u: f64 = self.rng.random();
        StdDuration::from_secs_f64(-(1.0 - u).ln() / self.lambda)
    }
}

/// The shortest idle pause before each profiled group under
/// [`ProfileFrom::Idle`].
pub const IDLE_PAUSE: StdDuration = StdDuration::from_millis(5);

/// One open-loop run's outcome.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Measured {
    /// Mean latency (intended arrival to finish) of the counted batches, seconds.
    pub mean_latency_s: f64,
    /// Mean service time (start to finish) of the counted batches, seconds:
    /// beside the profiled `t_i`, it shows whether the queueing or the
    /// service is what the prediction misses.
    pub mean_service_s: f64,
    /// Per `i = 1..=c`: summed service time (seconds) and count of the
    /// counted batches that started with `i` batches in flight (itself
    /// included): the `t_i` this run saw, by SERF's own approximation
    /// (Eq. 12 charges a batch the concurrency it finds on arrival).
    pub in_run: Vec<(f64, usize)>,
    /// Mean start lag of the counted batches, seconds: from when the batch
    /// could start (its arrival, or its device's previous finish if later)
    /// to when the host handed it to the device (the host's wake-up and
    /// dispatch on this machine; outside SERF's model).
    pub mean_start_lag_s: f64,
    /// Batches counted.
    pub batches: usize,
    /// Whether every batch finished before the run's time limit (an
    /// overloaded `c` does not: its latency grows with the run's length).
    pub drained: bool,
}

impl Measured {
    /// Several runs as one: means weighted by the batches counted.
    pub fn combine(runs: &[Measured]) -> Measured {
        let batches: usize = runs.iter().map(|m| m.batches).sum();
        let mean = |f: fn(&Measured) -> f64| {
            if batches == 0 {
                0.0
            } else {
                runs.iter().map(|m| f(m) * m.batches as f64).sum::<f64>() / batches as f64
            }
        };
        let width = runs.iter().map(|m| m.in_run.len()).max().unwrap_or(0);
        let in_run = (0..width)
            .map(|i| runs.iter().filter_map(|m| m.in_run.get(i)).fold((0.0, 0), |a, &(s, n)| (a.0 + s, a.1 + n)))
            .collect();
        Measured {
            mean_latency_s: mean(|m| m.mean_latency_s),
            mean_service_s: mean(|m| m.mean_service_s),
            mean_start_lag_s: mean(|m| m.mean_start_lag_s),
            in_run,
            batches,
            drained: runs.iter().all(|m| m.drained),
        }
    }
}

/// One `c`: its profile, the prediction and the measurement.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// Concurrent batches at most.
    pub concurrency: usize,
    /// Intra-op threads per concurrent batch.
    pub intra_threads: usize,
    /// `t_1..t_c` on this configuration, ms.
    pub service_ms: Vec<f64>,
    /// SERF's `rho` (`None`: no profile).
    pub utilisation: Option<f64>,
    /// Predicted mean latency, ms (`None`: unstable, `rho >= 1`).
    pub predicted_ms: Option<f64>,
    /// Measured mean latency, ms (`None`: not measured or not drained).
    pub measured_ms: Option<f64>,
    /// Predicted mean service time (SERF Eq. 12), ms.
    pub predicted_service_ms: Option<f64>,
    /// Measured mean service time, ms.
    pub measured_service_ms: Option<f64>,
    /// `t_1..t_c` as the run saw them ([`Measured::in_run`]), ms.
    pub in_run_service_ms: Vec<Option<f64>>,
    /// SERF's prediction from the in-run `t_i` (a profiled `t_i` where the
    /// run saw none): the queueing model alone, without the profile's
    /// miss of the service times under serving, ms.
    pub predicted_from_in_run_ms: Option<f64>,
    /// Its `(predicted - measured) / measured`.
    pub in_run_relative_error: Option<f64>,
    /// Measured mean start lag ([`Measured::mean_start_lag_s`]), ms.
    pub start_lag_ms: Option<f64>,
    /// Batches the measurement counted.
    pub measured_batches: usize,
    /// `(predicted - measured) / measured`.
    pub relative_error: Option<f64>,
}

/// The whole comparison (what `--json` prints).
#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    /// The run's settings.
    #[serde(flatten)]
    pub header: Header,
    /// Batch arrivals per second.
    pub batches_per_s: f64,
    /// One row per `c`.
    pub rows: Vec<Row>,
    /// `c` with the lowest predicted mean latency.
    pub best_predicted: Option<usize>,
    /// `c` with the lowest measured mean latency.
    pub best_measured: Option<usize>,
    /// Both bests exist and are the same `c`.
    pub same_best: bool,
    /// Largest |relative error| over the rows with both figures.
    pub max_abs_relative_error: Option<f64>,
    /// `c` with the lowest latency predicted from the in-run `t_i`.
    pub best_predicted_from_in_run: Option<usize>,
    /// Largest |relative error| of the predictions from the in-run `t_i`.
    pub max_abs_in_run_relative_error: Option<f64>,
    /// Every `c` has both figures within [`TOLERANCE`] and the bests agree
    /// (the prediction from the profiled `t_i`: SERF's).
    pub accepted: bool,
}

/// One `c`'s inputs to [`compare`].
#[derive(Clone, Debug)]
pub struct Config {
    /// Concurrent batches at most.
    pub concurrency: usize,
    /// Intra-op threads per concurrent batch.
    pub intra_threads: usize,
    /// `t_1..t_c`, seconds.
    pub service_s: Vec<f64>,
    /// The open-loop run (`None`: not measured).
    pub measured: Option<Measured>,
}

/// SERF's prediction of every configuration from its own profile, set
/// beside its measurement: relative errors, the best `c` of each, whether
/// they agree and whether the acceptance holds.
pub fn compare(header: Header, lambda: f64, configs: &[Config]) -> Comparison {
    let rows: Vec<Row> = configs
        .iter()
        .map(|k| {
            let p = serf::predict(&k.service_s, k.concurrency, lambda);
            let predicted_ms = p.as_ref().map(|p| p.latency_s * 1e3);
            let measured = k.measured.as_ref().filter(|m| m.batches > 0);
            let measured_ms = measured.filter(|m| m.drained).map(|m| m.mean_latency_s * 1e3);
            let in_run: Vec<Option<f64>> = (0..k.concurrency)
                .map(|i| measured.and_then(|m| m.in_run.get(i)).filter(|&&(_, n)| n > 0).map(|&(sum, n)| sum / n as f64))
                .collect();
            let in_run_or_profile: Vec<f64> = in_run.iter().zip(&k.service_s).map(|(r, &t)| r.unwrap_or(t)).collect();
            let from_in_run_ms = serf::predict(&in_run_or_profile, k.concurrency, lambda).map(|p| p.latency_s * 1e3);
            Row {
                concurrency: k.concurrency,
                intra_threads: k.intra_threads,
                service_ms: k.service_s.iter().map(|t| t * 1e3).collect(),
                utilisation: p.as_ref().map(|p| p.utilisation),
                predicted_ms,
                measured_ms,
                predicted_service_ms: p.as_ref().map(|p| p.service_s * 1e3),
                measured_service_ms: measured.map(|m| m.mean_service_s * 1e3),
                in_run_service_ms: in_run.iter().map(|t| t.map(|t| t * 1e3)).collect(),
                predicted_from_in_run_ms: from_in_run_ms,
                in_run_relative_error: from_in_run_ms.zip(measured_ms).map(|(p, m)| (p - m) / m),
                start_lag_ms: measured.map(|m| m.mean_start_lag_s * 1e3),
                measured_batches: measured.map_or(0, |m| m.batches),
                relative_error: predicted_ms.zip(measured_ms).map(|(p, m)| (p - m) / m),
            }
        })
        .collect();
    let best = |f: fn(&Row) -> Option<f64>| {
        rows.iter().filter_map(|r| f(r).map(|v| (r.concurrency, v))).min_by(|a, b| a.1.total_cmp(&b.1)).map(|(c, _)| c)
    };
    let best_predicted = best(|r| r.predicted_ms);
    let best_measured = best(|r| r.measured_ms);
    let same_best = best_predicted.is_some() && best_predicted == best_measured;
    let max_abs_relative_error = rows.iter().filter_map(|r| r.relative_error.map(f64::abs)).max_by(f64::total_cmp);
    let max_abs_in_run_relative_error = rows.iter().filter_map(|r| r.in_run_relative_error.map(f64::abs)).max_by(f64::total_cmp);
    let best_predicted_from_in_run = best(|r| r.predicted_from_in_run_ms);
    let all_within = !rows.is_empty() && rows.iter().all(|r| r.relative_error.is_some_and(|e| e.abs() <= TOLERANCE));
    Comparison {
        header,
        batches_per_s: lambda,
        rows,
        best_predicted,
        best_measured,
        same_best,
        max_abs_relative_error,
        best_predicted_from_in_run,
        max_abs_in_run_relative_error,
        accepted: all_within && same_best,
    }
}

/// The run's settings as the report prints them.
#[derive(Clone, Debug, Serialize)]
pub struct Header {
    /// The model.
    pub model: String,
    /// Requests per second.
    pub rate_rps: f64,
    /// Requests per batch.
    pub batch: u32,
    /// Seed of the arrival stream.
    pub seed: u64,
    /// Intra-op thread budget of the worker.
    pub thread_budget: usize,
    /// Seconds of arrivals per `c`.
    pub duration_s: f64,
    /// Rounds the run was split into.
    pub rounds: u32,
    /// How the `t_i` were profiled.
    pub profile_from: ProfileFrom,
}

/// Intra-op threads per concurrent batch: the budget shared by `c`.
pub fn intra_threads(thread_budget: usize, c: usize) -> usize {
    (thread_budget / c.max(1)).max(1)
}

/// Seeded Poisson arrival times at `lambda` per second in `[origin,
/// origin + duration_s)`: stream `index` of `seed` (the simulator's
/// arrival stream; one per round).
pub fn poisson_arrivals(lambda: f64, duration_s: f64, seed: u64, index: u32, origin: Instant) -> Vec<Instant> {
    let mut stream = ArrivalStream::new(&Workload::poisson(lambda), 1.0, index as usize, seed);
    let end = Instant::ZERO + Duration::from_secs_f64(duration_s);
    let mut out = Vec::new();
    while stream.peek() < end {
        out.push(origin + Duration::from_nanos(stream.advance().as_nanos()));
    }
    out
}

/// What [`OpenLoop::step`] asks of its host next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Call again at this time, or earlier when a batch finishes.
    At(Instant),
    /// Every batch finished.
    Done,
}

/// A FIFO queue of batch arrivals served by at most `c` devices of an
/// executor (one batch each): sans-IO, stepped at explicit times.
pub struct OpenLoop {
    arrivals: Vec<Instant>,
    /// Arrivals before this index are queued or served.
    admitted: usize,
    queue: VecDeque<usize>,
    in_flight: usize,
    /// Arrivals with a lower index are not counted.
    counted_from: usize,
    latency_sum_s: f64,
    service_sum_s: f64,
    /// Per concurrency at start: summed service and count.
    in_run: Vec<(f64, usize)>,
    /// Per device: batches in flight when its current batch started.
    started_with: Vec<usize>,
    /// Per device: when its current batch could have started.
    ready_at: Vec<Instant>,
    /// Per device: its last batch's finish.
    free_at: Vec<Instant>,
    start_lag_sum_s: f64,
    counted: usize,
    finished: usize,
    /// Inputs and output of each device's batch.
    slots: Vec<(Vec<InputRef>, OutputRef)>,
    done: Vec<Finished>,
}

impl OpenLoop {
    /// Serves `arrivals` (time order) on devices `0..slots.len()`, device
    /// `d` running batches with inputs and output `slots[d]`.
    pub fn new(arrivals: Vec<Instant>, slots: Vec<(Vec<InputRef>, OutputRef)>) -> Self {
        let counted_from = (arrivals.len() as f64 * WARMUP_FRACTION).ceil() as usize;
        let c = slots.len();
        OpenLoop {
            arrivals,
            admitted: 0,
            queue: VecDeque::new(),
            in_flight: 0,
            counted_from,
            latency_sum_s: 0.0,
            service_sum_s: 0.0,
            in_run: vec![(0.0, 0); c],
            started_with: vec![0; c],
            ready_at: vec![Instant::ZERO; c],
            free_at: vec![Instant::ZERO; c],
            start_lag_sum_s: 0.0,
            counted: 0,
            finished: 0,
            slots,
            done: vec![Finished::default(); c.max(1)],
        }
    }

    /// Takes finished batches, queues the arrivals due at `now` and starts
    /// queued batches on idle devices. `Err((tag, error))` for a refused or
    /// failed batch.
    pub fn step<E: Executor>(&mut self, now: Instant, exec: &mut E) -> Result<Next, StepError> {
        loop {
            let n = exec.poll(now, &mut self.done);
            for f in &self.done[..n] {
                if !f.ok {
                    return Err(StepError::Failed);
                }
                self.in_flight = self.in_flight.saturating_sub(1);
                self.finished += 1;
                if let Some(free) = self.free_at.get_mut(f.device as usize) {
                    *free = f.finish;
                }
                let i = f.tag as usize;
                if i >= self.counted_from {
                    if let Some(&at) = self.arrivals.get(i) {
                        self.latency_sum_s += f.finish.saturating_since(at).as_secs_f64();
                        let service = f.finish.saturating_since(f.start).as_secs_f64();
                        self.service_sum_s += service;
                        let ready = self.ready_at.get(f.device as usize).copied().unwrap_or(f.start);
                        self.start_lag_sum_s += f.start.saturating_since(ready).as_secs_f64();
                        let with = self.started_with.get(f.device as usize).copied().unwrap_or(0);
                        if let Some(acc) = with.checked_sub(1).and_then(|i| self.in_run.get_mut(i)) {
                            acc.0 += service;
                            acc.1 += 1;
                        }
                        self.counted += 1;
                    }
                }
            }
            while self.admitted < self.arrivals.len() && self.arrivals[self.admitted] <= now {
                self.queue.push_back(self.admitted);
                self.admitted += 1;
            }
            let mut started = false;
            for (d, (inputs, output)) in self.slots.iter().enumerate() {
                if self.queue.is_empty() {
                    break;
                }
                if !exec.is_idle(d as u32) {
                    continue;
                }
                let Some(i) = self.queue.pop_front() else { break };
                let job = Job { tag: i as u64, device: d as u32, model: 0, exec_at: Instant::ZERO, inputs, output: *output };
                exec.submit(now, &job).map_err(StepError::Submit)?;
                self.in_flight += 1;
                self.started_with[d] = self.in_flight;
                self.ready_at[d] = self.arrivals[i].max(self.free_at[d]);
                started = true;
            }
            // A start is handed to its device by the next poll; a poll
            // that reported batches may have freed devices.
            if !started && n == 0 {
                break;
            }
        }
        if self.admitted == self.arrivals.len() && self.queue.is_empty() && self.in_flight == 0 {
            return Ok(Next::Done);
        }
        let next_arrival = self.arrivals.get(self.admitted).copied().unwrap_or(Instant::NEVER);
        Ok(Next::At(next_arrival))
    }

    /// Batches not yet finished.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The result so far (`drained` when every batch finished).
    pub fn measured(&self) -> Measured {
        let mean = |sum: f64| if self.counted == 0 { 0.0 } else { sum / self.counted as f64 };
        Measured {
            mean_latency_s: mean(self.latency_sum_s),
            mean_service_s: mean(self.service_sum_s),
            mean_start_lag_s: mean(self.start_lag_sum_s),
            in_run: self.in_run.clone(),
            batches: self.counted,
            drained: self.finished == self.arrivals.len(),
        }
    }
}

/// Why [`OpenLoop::step`] stopped.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// The executor refused a batch.
    #[error(transparent)]
    Submit(ExecError),
    /// A batch failed.
    #[error("a batch failed")]
    Failed,
}

/// Profiles, predicts and measures every `c = 1..=max_concurrency` on the
/// ONNX executor (see the module docs).
pub fn measure(cfg: &MeasureConfig) -> Result<Comparison, MeasureError> {
    let mut repo = repository::scan(&cfg.model_repository)?;
    repo.select(std::slice::from_ref(&cfg.model));
    let m = repo.models.first().ok_or_else(|| MeasureError::NoModel(cfg.model.clone()))?;
    let model = OnnxModel::from_repo(m)?;
    if cfg.batch > model.max_batch() {
        return Err(MeasureError::Batch { batch: cfg.batch, max: model.max_batch(), model: model.name });
    }
    let lambda = cfg.rate_rps / f64::from(cfg.batch);
    // Every c's executor is loaded at once and the rounds alternate
    // between them, so a change in this shared machine's load during the
    // run falls on every c alike.
    let mut benches = Vec::with_capacity(cfg.max_concurrency);
    for c in 1..=cfg.max_concurrency {
        let opts = OnnxOptions { devices: c as u32, intra_threads: intra_threads(cfg.thread_budget, c), ..OnnxOptions::default() };
        benches.push(Bench::load_with(&model, &opts)?);
    }
    let rounds = cfg.rounds.max(1);
    let round_cfg = MeasureConfig { duration_s: cfg.duration_s / f64::from(rounds), profile_s: cfg.profile_s / f64::from(rounds), ..cfg.clone() };
    let mut profiled: Vec<Vec<(f64, usize)>> = (1..=cfg.max_concurrency).map(|c| vec![(0.0, 0); c]).collect();
    let mut runs: Vec<Vec<Measured>> = vec![Vec::new(); cfg.max_concurrency];
    for round in 0..rounds {
        for (k, bench) in benches.iter_mut().enumerate() {
            let c = k + 1;
            tracing::info!("{}: round {}/{rounds}, c = {c}: profiling t_1..t_{c}, then {:.1} s of arrivals", model.name, round + 1, round_cfg.duration_s);
            for (i, acc) in profiled[k].iter_mut().enumerate() {
                let (sum, n) = profile_service(bench, &model.name, i + 1, c, round, &round_cfg)?;
                acc.0 += sum;
                acc.1 += n;
            }
            runs[k].push(run_open_loop(bench, &model.name, c, lambda, &round_cfg, round)?);
        }
    }
    let configs: Vec<Config> = (1..=cfg.max_concurrency)
        .map(|c| Config {
            concurrency: c,
            intra_threads: intra_threads(cfg.thread_budget, c),
            service_s: profiled[c - 1].iter().map(|&(sum, n)| if n == 0 { f64::NAN } else { sum / n as f64 }).collect(),
            measured: Some(Measured::combine(&runs[c - 1])),
        })
        .collect();
    let header = Header {
        model: model.name,
        rate_rps: cfg.rate_rps,
        batch: cfg.batch,
        seed: cfg.seed,
        thread_budget: cfg.thread_budget,
        duration_s: cfg.duration_s,
        rounds,
        profile_from: cfg.profile_from,
    };
    Ok(compare(header, lambda, &configs))
}

/// The summed service times (seconds) and the number of batches timed
/// while `i` run at once on configuration `c` (`cfg.profile_from`: the
/// group restarted after an idle pause or after the load's pauses, or each
/// device resubmitting at once), for
/// `cfg.profile_s` after a warm-up of a quarter of that (and at least 3
/// batches per device).
fn profile_service(bench: &mut Bench, name: &str, i: usize, c: usize, round: u32, cfg: &MeasureConfig) -> Result<(f64, usize), MeasureError> {
    let slots: Vec<(Vec<InputRef>, OutputRef)> = (0..i as u32).map(|d| (bench.inputs(d, cfg.batch), bench.output(d))).collect();
    let start = bench.clock.now();
    let warm_until = start + Duration::from_secs_f64(cfg.profile_s / 4.0);
    let end = warm_until + Duration::from_secs_f64(cfg.profile_s);
    let mut per_device_runs = vec![0u32; i];
    let (mut sum, mut n) = (0.0f64, 0usize);
    let mut done = vec![Finished::default(); i];
    let mut running = 0usize;
    let mut stopping = false;
    let mut last_service = StdDuration::ZERO;
    let mut pauses = LoadPauses::new(cfg.rate_rps / f64::from(cfg.batch.max(1)), c, cfg.seed ^ (u64::from(round) << 32) ^ i as u64);
    let submit = |bench: &mut Bench, d: usize| -> Result<(), MeasureError> {
        let now = bench.clock.now();
        let job = Job { tag: d as u64, device: d as u32, model: 0, exec_at: Instant::ZERO, inputs: &slots[d].0, output: slots[d].1 };
        bench.exec.submit(now, &job).map_err(|source| MeasureError::Bench(ProfileCmdError::Submit { model: name.to_string(), source }))
    };
    for d in 0..i {
        submit(bench, d)?;
        running += 1;
    }
    while running > 0 {
        let now = bench.clock.now();
        let k = bench.exec.poll(now, &mut done);
        let mut resubmit = Vec::new();
        for f in &done[..k] {
            running -= 1;
            if !f.ok {
                let what = bench.exec.last_error().unwrap_or("run failed").to_string();
                return Err(MeasureError::Run { model: name.to_string(), what });
            }
            let d = f.device as usize;
            per_device_runs[d] += 1;
            last_service = StdDuration::from_nanos(f.finish.saturating_since(f.start).as_nanos());
            // Counted only while all `i` run: after the warm-up and before
            // the first device stops.
            if f.start >= warm_until && per_device_runs[d] > 3 && !stopping {
                sum += f.finish.saturating_since(f.start).as_secs_f64();
                n += 1;
            }
            if f.finish >= end && per_device_runs[d] > 3 {
                stopping = true;
            }
            if !stopping {
                resubmit.push(d);
            }
        }
        match cfg.profile_from {
            ProfileFrom::Busy => {
                for d in resubmit {
                    submit(bench, d)?;
                    running += 1;
                }
            }
            // The whole group again once all `i` are done, after a pause.
            ProfileFrom::Idle | ProfileFrom::Load if running == 0 && !stopping => {
                let pause = match cfg.profile_from {
                    ProfileFrom::Load => pauses.next(if n == 0 { last_service.as_secs_f64() } else { sum / n as f64 }),
                    _ => IDLE_PAUSE.max(last_service),
                };
                if !pause.is_zero() {
                    std::thread::sleep(pause);
                }
                for d in 0..i {
                    submit(bench, d)?;
                    running += 1;
                }
            }
            ProfileFrom::Idle | ProfileFrom::Load => {}
        }
        if k == 0 {
            bench.exec.wait(StdDuration::from_secs(60));
        }
    }
    Ok((sum, n))
}

/// The open-loop run of one `c` on the wall clock.
fn run_open_loop(bench: &mut Bench, name: &str, c: usize, lambda: f64, cfg: &MeasureConfig, round: u32) -> Result<Measured, MeasureError> {
    let slots = (0..c as u32).map(|d| (bench.inputs(d, cfg.batch), bench.output(d))).collect();
    let origin = bench.clock.now();
    let arrivals = poisson_arrivals(lambda, cfg.duration_s, cfg.seed, round, origin);
    let mut driver = OpenLoop::new(arrivals, slots);
    // An overloaded `c` never drains: give up at three times the run.
    let limit = origin + Duration::from_secs_f64(3.0 * cfg.duration_s + 10.0);
    loop {
        let now = bench.clock.now();
        if now >= limit {
            break;
        }
        match driver.step(now, &mut bench.exec) {
            Ok(Next::Done) => break,
            Ok(Next::At(t)) => {
                let wait = t.min(limit).saturating_since(bench.clock.now());
                if wait > Duration::ZERO {
                    if driver.in_flight() > 0 {
                        bench.exec.wait(StdDuration::from_nanos(wait.as_nanos()));
                    } else {
                        std::thread::sleep(StdDuration::from_nanos(wait.as_nanos()));
                    }
                }
            }
            Err(StepError::Submit(source)) => return Err(MeasureError::Bench(ProfileCmdError::Submit { model: name.to_string(), source })),
            Err(StepError::Failed) => {
                let what = bench.exec.last_error().unwrap_or("run failed").to_string();
                return Err(MeasureError::Run { model: name.to_string(), what });
            }
        }
    }
    Ok(driver.measured())
}

/// The human-readable report.
pub fn print(c: &Comparison) {
    let h = &c.header;
    println!(
        "SERF vs ONNX Runtime: {} at {:.1} rps in batches of {} ({:.2} batches/s, Poisson, seed {}), {} s per c in {} rounds, {} intra-op threads shared by the concurrent batches, t_i profiled from {:?}",
        h.model, h.rate_rps, h.batch, c.batches_per_s, h.seed, h.duration_s, h.rounds, h.thread_budget, h.profile_from
    );
    println!("| c | threads/batch | t_1..t_c (ms) | utilisation | service: predicted / measured (ms) | latency: predicted (ms) | measured (ms) | batches | error |");
    println!("|---:|---:|---|---:|---:|---:|---:|---:|---:|");
    let opt = |v: Option<f64>, scale: f64, unit: &str| v.map_or("-".to_string(), |v| format!("{:.3}{unit}", v * scale));
    for r in &c.rows {
        let ts: Vec<String> = r.service_ms.iter().map(|t| format!("{t:.3}")).collect();
        println!(
            "| {} | {} | {} | {} | {} / {} | {} | {} | {} | {} |",
            r.concurrency,
            r.intra_threads,
            ts.join(", "),
            opt(r.utilisation, 1.0, ""),
            opt(r.predicted_service_ms, 1.0, ""),
            opt(r.measured_service_ms, 1.0, ""),
            opt(r.predicted_ms, 1.0, ""),
            opt(r.measured_ms, 1.0, ""),
            r.measured_batches,
            r.relative_error.map_or("-".to_string(), |e| format!("{:+.1}%", e * 100.0)),
        );
    }
    let show = |b: Option<usize>| b.map_or("none".to_string(), |c| c.to_string());
    for r in &c.rows {
        let ts: Vec<String> = r.in_run_service_ms.iter().map(|t| t.map_or("-".into(), |t| format!("{t:.3}"))).collect();
        println!(
            "c = {}: t_i seen in the run {} ms; mean start lag {} ms; SERF from them {} ms ({})",
            r.concurrency,
            ts.join(", "),
            opt(r.start_lag_ms, 1.0, ""),
            opt(r.predicted_from_in_run_ms, 1.0, ""),
            r.in_run_relative_error.map_or("-".to_string(), |e| format!("{:+.1}%", e * 100.0))
        );
    }
    println!(
        "best c: predicted {}, measured {} ({}); largest |error| {}; acceptance (every |error| <= {:.0}% and the same best c): {}",
        show(c.best_predicted),
        show(c.best_measured),
        if c.same_best { "agree" } else { "disagree" },
        opt(c.max_abs_relative_error, 100.0, "%"),
        TOLERANCE * 100.0,
        if c.accepted { "holds" } else { "fails" }
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use backend::exec::emulated::EmulatedExecutor;
    use backend::exec::ExecModel;
    use dataplane::mem::Region;
    use scheduler::profile::LatencyProfile;

    fn header() -> Header {
        Header { model: "m".into(), rate_rps: 50.0, batch: 1, seed: 1, thread_budget: 2, duration_s: 10.0, rounds: 1, profile_from: ProfileFrom::Idle }
    }

    fn measured(ms: f64) -> Option<Measured> {
        Some(Measured { mean_latency_s: ms / 1e3, mean_service_s: 0.01, mean_start_lag_s: 0.0, in_run: vec![], batches: 1000, drained: true })
    }

    #[test]
    fn the_comparison_reports_errors_bests_and_acceptance() {
        // lambda = 50/s, t_1 = 10 ms: rho 0.5, M/D/1 latency 10 + 5 = 15 ms.
        let c1 = Config { concurrency: 1, intra_threads: 2, service_s: vec![0.010], measured: measured(14.0) };
        // c = 2 on one thread each: t_1 = 16 ms, t_2 = 19 ms (interference).
        let c2 = Config { concurrency: 2, intra_threads: 1, service_s: vec![0.016, 0.019], measured: measured(19.0) };
        let r = compare(header(), 50.0, &[c1.clone(), c2.clone()]);
        let p1 = r.rows[0].predicted_ms.unwrap();
        assert!((p1 - 15.0).abs() < 1e-9, "{p1}");
        assert!((r.rows[0].relative_error.unwrap() - 1.0 / 14.0).abs() < 1e-9);
        assert_eq!(r.rows[1].service_ms, vec![16.0, 19.0]);
        let p2 = r.rows[1].predicted_ms.unwrap();
        assert!(p2 > 16.0 && p2 > p1, "{p2}");
        assert_eq!((r.best_predicted, r.best_measured, r.same_best), (Some(1), Some(1), true));
        let worst = r.max_abs_relative_error.unwrap();
        assert!(r.accepted == (worst <= TOLERANCE), "{r:?}");

        // A measurement that favours c = 2 disagrees; an error above 10% fails.
        let r = compare(header(), 50.0, &[Config { measured: measured(25.0), ..c1.clone() }, c2.clone()]);
        assert_eq!((r.best_measured, r.same_best, r.accepted), (Some(2), false, false));
        // An undrained (overloaded) run has no measured figure and cannot pass.
        let stuck = Some(Measured { mean_latency_s: 9.0, mean_service_s: 0.01, mean_start_lag_s: 0.0, in_run: vec![], batches: 10, drained: false });
        let r = compare(header(), 50.0, &[Config { measured: stuck, ..c1 }, c2]);
        assert_eq!((r.rows[0].measured_ms, r.best_measured, r.accepted), (None, Some(2), false));
    }

    #[test]
    fn rounds_combine_weighted_by_batches() {
        let a = Measured { mean_latency_s: 0.010, mean_service_s: 0.004, mean_start_lag_s: 0.001, in_run: vec![(0.2, 50), (0.2, 50)], batches: 100, drained: true };
        let b = Measured { mean_latency_s: 0.040, mean_service_s: 0.008, mean_start_lag_s: 0.0, in_run: vec![(1.0, 300)], batches: 300, drained: true };
        let m = Measured::combine(&[a.clone(), b.clone()]);
        assert!((m.mean_latency_s - 0.0325).abs() < 1e-12 && (m.mean_service_s - 0.007).abs() < 1e-12, "{m:?}");
        assert_eq!((m.batches, m.drained), (400, true));
        assert_eq!(m.in_run, vec![(1.2, 350), (0.2, 50)]);
        assert!((m.mean_start_lag_s - 0.00025).abs() < 1e-12);
        assert!(!Measured::combine(&[a.clone(), Measured { drained: false, ..b }]).drained);
        assert_eq!(Measured::combine(&[]).batches, 0);
    }

    #[test]
    fn an_unstable_configuration_has_no_prediction() {
        let c1 = Config { concurrency: 1, intra_threads: 2, service_s: vec![0.030], measured: None };
        let r = compare(header(), 50.0, &[c1]);
        assert_eq!((r.rows[0].predicted_ms, r.best_predicted, r.accepted), (None, None, false));
    }

    #[test]
    fn the_thread_budget_is_shared_by_the_concurrent_batches() {
        assert_eq!(intra_threads(2, 1), 2);
        assert_eq!(intra_threads(2, 2), 1);
        assert_eq!(intra_threads(2, 3), 1);
        assert_eq!(intra_threads(8, 3), 2);
    }

    #[test]
    fn load_pauses_follow_the_idle_gaps_of_the_load() {
        // 20 batches/s of 10 ms on one device: rho = 0.2, so 80% of the
        // pauses are exponential with mean 50 ms: 40 ms on average.
        let mut p = LoadPauses::new(20.0, 1, 7);
        let draws: Vec<f64> = (0..20_000).map(|_| p.next(0.010).as_secs_f64()).collect();
        let zero = draws.iter().filter(|d| **d == 0.0).count() as f64 / draws.len() as f64;
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        assert!((zero - 0.2).abs() < 0.02, "busy starts {zero}");
        assert!((mean - 0.040).abs() < 0.002, "mean pause {mean}");
        // Seeded: the same draws again; a saturated worker never pauses.
        let mut q = LoadPauses::new(20.0, 1, 7);
        assert!(draws.iter().take(100).all(|d| *d == q.next(0.010).as_secs_f64()));
        let mut busy = LoadPauses::new(20.0, 2, 7);
        assert!((0..100).all(|_| busy.next(0.100).is_zero()));
    }

    #[test]
    fn arrivals_are_seeded_poisson() {
        let a = poisson_arrivals(200.0, 50.0, 7, 0, Instant::ZERO);
        assert_eq!(a, poisson_arrivals(200.0, 50.0, 7, 0, Instant::ZERO));
        assert_ne!(a, poisson_arrivals(200.0, 50.0, 8, 0, Instant::ZERO));
        assert_ne!(a, poisson_arrivals(200.0, 50.0, 7, 1, Instant::ZERO));
        let n = a.len() as f64;
        assert!((n / 50.0 - 200.0).abs() < 200.0 * 0.03, "{n}");
        assert!(a.windows(2).all(|w| w[0] <= w[1]));
    }

    /// Drives [`OpenLoop`] on `c` emulated devices (a fixed `t_ms` per
    /// batch, no interference) in virtual time.
    fn simulate(c: u32, t_ms: f64, lambda: f64, duration_s: f64, seed: u64) -> Measured {
        let region = Region::anonymous(1 << 16).unwrap();
        let model = ExecModel { profile: LatencyProfile::linear(0.0, t_ms, 4).unwrap(), output_len: 8 };
        let mut exec = EmulatedExecutor::new(region, c, 4, vec![model]);
        let slots = (0..c).map(|d| (vec![InputRef { offset: u64::from(d) * 64, len: 16 }], OutputRef { offset: 4096 + u64::from(d) * 64, stride: 8 })).collect();
        let mut driver = OpenLoop::new(poisson_arrivals(lambda, duration_s, seed, 0, Instant::ZERO), slots);
        let mut now = Instant::ZERO;
        for _ in 0..10_000_000 {
            match driver.step(now, &mut exec).unwrap() {
                Next::Done => return driver.measured(),
                Next::At(t) => now = exec.next_wakeup().map_or(t, |w| w.min(t)).max(now),
            }
        }
        panic!("the open loop did not finish");
    }

    #[test]
    fn the_open_loop_on_fixed_service_times_matches_serf_m_d_c() {
        // No interference (t_1 = t_2): SERF reduces to M/D/c, which a FIFO
        // queue on c devices must reproduce within the model's accuracy.
        for (c, lambda) in [(1u32, 70.0), (2, 140.0), (2, 70.0)] {
            let m = simulate(c, 10.0, lambda, 400.0, 3);
            assert!(m.drained && m.batches > 20_000, "{m:?}");
            // Virtual time: the host hands every batch over when it can start.
            assert_eq!(m.mean_start_lag_s, 0.0);
            // Fixed service times: every concurrency level saw exactly 10 ms.
            assert!(m.in_run.iter().all(|&(sum, n)| n > 0 && (sum / n as f64 - 0.010).abs() < 1e-6), "{:?}", m.in_run);
            let p = serf::predict(&vec![0.010; c as usize], c as usize, lambda).unwrap();
            let err = (p.latency_s - m.mean_latency_s) / m.mean_latency_s;
            assert!(err.abs() < 0.03, "c {c} lambda {lambda}: predicted {} measured {} ({err:+.3})", p.latency_s, m.mean_latency_s);
        }
        // Deterministic: the same seed, the same figures.
        assert_eq!(simulate(2, 10.0, 140.0, 20.0, 5), simulate(2, 10.0, 140.0, 20.0, 5));
    }

    #[test]
    fn an_overloaded_open_loop_queues_without_bound() {
        let short = simulate(1, 10.0, 120.0, 20.0, 1);
        let long = simulate(1, 10.0, 120.0, 80.0, 1);
        assert!(long.mean_latency_s > 2.0 * short.mean_latency_s, "{short:?} {long:?}");
    }

    /// The real measurement, briefly, on the models of
    /// `scripts/fetch-models.sh` with ONNX Runtime. Without them the test
    /// says why and passes, unless `SYMPHONY_ONNX_REQUIRED=1` (set by
    /// `tests/run.sh` once the models are fetched, as for the executor's
    /// own tests in `backend/tests/onnx.rs`): then it fails.
    #[test]
    fn measures_ppocr_cls_on_onnx_runtime() {
        let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models");
        let why = match backend::exec::onnx::find_dylib() {
            Err(e) => Some(e.to_string()),
            Ok(_) if !repo.join("ppocr_cls").is_dir() => Some(format!("no {}/ppocr_cls (run scripts/fetch-models.sh)", repo.display())),
            Ok(_) => None,
        };
        if let Some(why) = why {
            assert!(std::env::var_os("SYMPHONY_ONNX_REQUIRED").is_none(), "ONNX tests required but cannot run: {why}");
            eprintln!("SKIPPED (ONNX Runtime or models unavailable): {why}");
            return;
        }
        let cfg = MeasureConfig {
            model_repository: repo,
            model: "ppocr_cls".into(),
            rate_rps: 200.0,
            batch: 4,
            max_concurrency: 2,
            duration_s: 2.0,
            profile_s: 0.5,
            seed: 1,
            thread_budget: 2,
            rounds: 1,
            profile_from: ProfileFrom::Load,
        };
        let r = measure(&cfg).unwrap();
        assert_eq!(r.rows.len(), 2);
        for row in &r.rows {
            assert_eq!(row.service_ms.len(), row.concurrency);
            assert!(row.service_ms.iter().all(|t| *t > 0.0 && t.is_finite()), "{row:?}");
            assert!(row.measured_batches > 0, "{row:?}");
        }
    }
}
