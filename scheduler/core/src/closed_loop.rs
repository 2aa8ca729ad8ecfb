//! The closed loop: what the scheduler learns from backends' batch reports.
//!
//! Per GPU it keeps the batches planned there and not yet reported, in
//! plan order. A report says how long its batch held the device; the loop
//! places the batch on the scheduler's clock (it started at its planned
//! start, or when the previous batch on the GPU really finished, whichever
//! is later; and it finished no earlier than the report itself proves),
//! carries that through the batches planned after it, and answers with the
//! GPU's corrected free time when that differs from what matchmaking holds
//! ([`Learned::free_at`]). A batch the scheduler gave up before its
//! report came (overdue past its grace) is learned from the same way when
//! the report does come ([`ClosedLoop::on_late_report`]).
//!
//! Per (model, GPU) it keeps the profile error, the ratio of the measured
//! time to the profile's `l(b)` (an exponentially weighted mean in log
//! space whose steps are clamped, so one outlier moves it by a bounded
//! amount), and a decayed least-squares fit of `α`, `β` over the recent
//! `(b, actual)` points; per GPU the same ratio pooled over its models.
//! Batches are planned with the (model, GPU) ratio once it has
//! [`LoopConfig::min_samples`] reports, with the GPU's pooled ratio before
//! (docs/decisions.md says why a ratio and not the fitted line).
//!
//! Sans-IO and clock-free like the cores; no allocation per report once
//! every GPU id has been seen (the per-GPU queues keep their capacity).

use std::collections::VecDeque;

use dataplane::time::{Duration, Instant};

use crate::types::{GpuId, ModelId};

/// How the loop learns and whether the scheduler acts on it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoopConfig {
    /// Act on the reports (correct free times, plan with the learned
    /// ratios). Off: the estimates are still kept and exported, but
    /// scheduling is open loop, as before the loop existed.
    pub enabled: bool,
    /// Weight of one report in the ratio's moving mean (after the first
    /// few, which are averaged evenly against the profile as a prior).
    pub weight: f64,
    /// One report moves a ratio by at most this factor (robustness).
    pub max_step: f64,
    /// Reports of a (model, GPU) before its own ratio replaces the GPU's.
    pub min_samples: u32,
    /// Forgetting factor of the `α`/`β` least squares (per report).
    pub fit_decay: f64,
}

impl Default for LoopConfig {
    fn default() -> Self {
        LoopConfig { enabled: true, weight: 0.2, max_step: 2.0, min_samples: 8, fit_decay: 0.95 }
    }
}

impl LoopConfig {
    /// The loop off (open-loop scheduling; estimates still kept).
    pub fn off() -> Self {
        LoopConfig { enabled: false, ..LoopConfig::default() }
    }
}

/// A ratio learned from reports: `exp` of a moving mean of `ln(actual /
/// predicted)`, 1 before any report.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Ratio {
    log: f64,
    samples: u64,
}

impl Ratio {
    /// The estimate (1 with no sample).
    pub fn value(&self) -> f64 {
        self.log.exp()
    }

    /// Reports folded in.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    fn update(&mut self, sample: f64, cfg: &LoopConfig) {
        if !(sample.is_finite() && sample > 0.0) {
            return;
        }
        // The profile counts as one prior sample: the first report moves
        // the estimate halfway, then the mean tightens until `weight`.
        let w = cfg.weight.max(1.0 / (self.samples as f64 + 2.0));
        let step = cfg.max_step.max(1.0).ln();
        self.log += w * (sample.ln() - self.log).clamp(-step, step);
        self.samples += 1;
    }
}

/// Decayed least squares of `actual_ms = α b + β`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Fit {
    s0: f64,
    sb: f64,
    sbb: f64,
    sy: f64,
    sby: f64,
}

impl Fit {
    fn update(&mut self, b: f64, y: f64, decay: f64) {
        let d = decay.clamp(0.0, 1.0);
        self.s0 = self.s0 * d + 1.0;
        self.sb = self.sb * d + b;
        self.sbb = self.sbb * d + b * b;
        self.sy = self.sy * d + y;
        self.sby = self.sby * d + b * y;
    }

    /// `(α, β)` in ms, when the recent batch sizes vary enough to tell
    /// slope from intercept (weighted variance of `b` at least 1/4) and
    /// both come out non-negative.
    fn solve(&self) -> Option<(f64, f64)> {
        if self.s0 <= 0.0 {
            return None;
        }
        let var = self.sbb / self.s0 - (self.sb / self.s0).powi(2);
        if var < 0.25 {
            return None;
        }
        let det = self.s0 * self.sbb - self.sb * self.sb;
        let alpha = (self.s0 * self.sby - self.sb * self.sy) / det;
        let beta = (self.sy - alpha * self.sb) / self.s0;
        (alpha.is_finite() && beta.is_finite() && alpha >= 0.0 && beta >= 0.0).then_some((alpha, beta))
    }
}

/// What the loop believes about one model on one GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Estimate {
    /// Measured over profiled time (the profile error; 1 = exact).
    pub ratio: f64,
    /// Reports behind `ratio`.
    pub samples: u64,
    /// The refined `(α, β)` in ms: the least-squares line when recent
    /// batch sizes varied enough, else the profile's line scaled by
    /// `ratio` (`None` for a measured, non-linear profile without a fit).
    pub alpha_beta_ms: Option<(f64, f64)>,
}

#[derive(Clone, Copy, Debug, Default)]
struct Cell {
    ratio: Ratio,
    fit: Fit,
}

/// A batch planned on a GPU and not yet reported.
#[derive(Clone, Copy, Debug)]
struct Planned {
    batch: u64,
    exec_at: Instant,
    finish_at: Instant,
}

#[derive(Debug, Default)]
struct GpuTrack {
    chain: VecDeque<Planned>,
    /// When the last reported batch finished (the loop's estimate).
    settled: Option<Instant>,
    /// The free time matchmaking holds for the GPU.
    believed_free: Instant,
    pooled: Ratio,
    corrections_later: u64,
    corrections_earlier: u64,
}

impl GpuTrack {
    /// The first `at` batches of the chain, whose reports never came (or
    /// come later), leave it taken as planned, each after its
    /// predecessor: when the last of them finished (the settled time
    /// before any).
    fn settle_before(&mut self, at: usize) -> Option<Instant> {
        let mut prev = self.settled;
        for p in self.chain.drain(..at) {
            prev = Some(p.exec_at.max(prev.unwrap_or(p.exec_at)) + p.finish_at.saturating_since(p.exec_at));
        }
        prev
    }
}

/// One batch report, on the scheduler's clock.
#[derive(Clone, Copy, Debug)]
pub struct Report {
    /// The batch (as planned with [`ClosedLoop::on_plan`]).
    pub batch: u64,
    /// The GPU it was planned on.
    pub gpu: GpuId,
    /// Its model.
    pub model: ModelId,
    /// Tasks that ran.
    pub count: u32,
    /// The profile's `l(count)` (zero when nothing ran).
    pub profiled: Duration,
    /// How long it held the device.
    pub actual: Duration,
    /// It finished no earlier than this (the report's receipt minus its
    /// "finished ago", minus the control delay bound for the transit).
    pub finished_after: Instant,
}

/// What one report changed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Learned {
    /// The GPU's corrected free time, when it differs from what
    /// matchmaking holds and is not already past (`None`: no change).
    pub free_at: Option<Instant>,
    /// The factor later batches of this model on this GPU should be
    /// planned with, when it is the model's own (`None`: the GPU's).
    pub model_factor: Option<f64>,
    /// The GPU's pooled factor.
    pub gpu_factor: f64,
}

/// The closed loop of one sub-cluster (see the module docs).
#[derive(Debug)]
pub struct ClosedLoop {
    cfg: LoopConfig,
    models: usize,
    gpus: Vec<GpuTrack>,
    /// `cells[gpu * models + model]`.
    cells: Vec<Cell>,
}

impl ClosedLoop {
    /// A loop over `models` models (local ids `0..models`).
    pub fn new(models: usize, cfg: LoopConfig) -> Self {
        ClosedLoop { cfg, models, gpus: Vec::new(), cells: Vec::new() }
    }

    /// The configuration.
    pub fn config(&self) -> &LoopConfig {
        &self.cfg
    }

    /// Replaces the configuration (estimates are kept).
    pub fn set_config(&mut self, cfg: LoopConfig) {
        self.cfg = cfg;
    }

    fn track(&mut self, gpu: GpuId) -> &mut GpuTrack {
        let g = gpu as usize;
        if self.gpus.len() <= g {
            self.gpus.resize_with(g + 1, GpuTrack::default);
            self.cells.resize((g + 1) * self.models, Cell::default());
        }
        &mut self.gpus[g]
    }

    /// A batch was planned on `gpu` for `[exec_at, finish_at)`.
    pub fn on_plan(&mut self, gpu: GpuId, batch: u64, exec_at: Instant, finish_at: Instant) {
        let t = self.track(gpu);
        t.chain.push_back(Planned { batch, exec_at, finish_at });
        t.believed_free = t.believed_free.max(finish_at);
    }

    /// A batch will never be reported (failed back, its backend gone), or
    /// only late ([`on_late_report`](Self::on_late_report)).
    pub fn forget(&mut self, gpu: GpuId, batch: u64) {
        if let Some(t) = self.gpus.get_mut(gpu as usize) {
            t.chain.retain(|p| p.batch != batch);
        }
    }

    /// The GPU left: its planned batches are forgotten (its estimates
    /// stay, for the metrics).
    pub fn gpu_left(&mut self, gpu: GpuId) {
        if let Some(t) = self.gpus.get_mut(gpu as usize) {
            t.chain.clear();
            t.settled = None;
        }
    }

    /// Folds in a report at `now`; `None` when the batch is not one the
    /// loop holds for that GPU (already reported or forgotten).
    pub fn on_report(&mut self, now: Instant, r: &Report) -> Option<Learned> {
        let t = self.gpus.get_mut(r.gpu as usize)?;
        let at = t.chain.iter().position(|p| p.batch == r.batch)?;
        let prev = t.settle_before(at);
        let p = t.chain.pop_front()?;
        Some(self.fold(now, r, p, prev))
    }

    /// Folds in the report of a batch the scheduler gave up before it came
    /// (overdue past its grace: failed back and
    /// [`forget`](Self::forget)), planned for `[exec_at, finish_at)`. The GPU's batches still
    /// held that were planned before it ran before it (taken as planned);
    /// it then teaches the ratios and corrects the free time exactly as an
    /// on-time report does: a backend that lags past the grace is learned
    /// from rather than planned for at its old speed. `None` for a GPU the
    /// loop has not seen.
    pub fn on_late_report(&mut self, now: Instant, r: &Report, exec_at: Instant, finish_at: Instant) -> Option<Learned> {
        let t = self.gpus.get_mut(r.gpu as usize)?;
        // Batch ids grow in plan order, as does each GPU's chain.
        let at = t.chain.iter().position(|p| p.batch > r.batch).unwrap_or(t.chain.len());
        let prev = t.settle_before(at);
        Some(self.fold(now, r, Planned { batch: r.batch, exec_at, finish_at }, prev))
    }

    /// Places reported batch `p` (after `prev`, when the GPU's previous
    /// batch finished), carries its finish through the batches planned
    /// after it, and learns the ratios from it.
    fn fold(&mut self, now: Instant, r: &Report, p: Planned, prev: Option<Instant>) -> Learned {
        let cfg = self.cfg;
        let models = self.models;
        let t = &mut self.gpus[r.gpu as usize];
        let start = p.exec_at.max(prev.unwrap_or(p.exec_at));
        let finish = (start + r.actual).max(r.finished_after);
        t.settled = Some(finish);
        let mut free = finish;
        for q in &t.chain {
            free = q.exec_at.max(free) + q.finish_at.saturating_since(q.exec_at);
        }
        let mut learned = Learned::default();
        if cfg.enabled && free != t.believed_free && free.max(t.believed_free) > now {
            if free > t.believed_free {
                t.corrections_later += 1;
            } else {
                t.corrections_earlier += 1;
            }
            t.believed_free = free;
            learned.free_at = Some(free);
        }
        if r.count > 0 && r.profiled > Duration::ZERO {
            let sample = r.actual.as_nanos() as f64 / r.profiled.as_nanos() as f64;
            t.pooled.update(sample, &cfg);
            if (r.model as usize) < models {
                let cell = &mut self.cells[r.gpu as usize * models + r.model as usize];
                cell.ratio.update(sample, &cfg);
                cell.fit.update(f64::from(r.count), r.actual.as_nanos() as f64 / 1e6, cfg.fit_decay);
            }
        }
        learned.gpu_factor = self.gpus[r.gpu as usize].pooled.value();
        learned.model_factor = self.model_factor(r.model, r.gpu);
        learned
    }

    /// The factor of `model` on `gpu`, when its own reports are enough.
    fn model_factor(&self, model: ModelId, gpu: GpuId) -> Option<f64> {
        let c = self.cells.get(gpu as usize * self.models + model as usize)?;
        (c.ratio.samples >= u64::from(self.cfg.min_samples)).then(|| c.ratio.value())
    }

    /// The factor batches of `model` on `gpu` are planned with.
    pub fn factor(&self, model: ModelId, gpu: GpuId) -> f64 {
        self.model_factor(model, gpu)
            .unwrap_or_else(|| self.gpus.get(gpu as usize).map_or(1.0, |t| t.pooled.value()))
    }

    /// The GPU's ratio pooled over its models (its speed relative to the
    /// profiles; 1 before any report).
    pub fn gpu_ratio(&self, gpu: GpuId) -> Ratio {
        self.gpus.get(gpu as usize).map_or_else(Ratio::default, |t| t.pooled)
    }

    /// Free-time corrections made on `gpu`: (later, earlier).
    pub fn corrections(&self, gpu: GpuId) -> (u64, u64) {
        self.gpus.get(gpu as usize).map_or((0, 0), |t| (t.corrections_later, t.corrections_earlier))
    }

    /// GPU ids the loop has seen.
    pub fn gpus(&self) -> usize {
        self.gpus.len()
    }

    /// What the loop believes about `model` on `gpu`; `profile_line` is
    /// the profile's `(α, β)` in ms if it is linear.
    pub fn estimate(&self, model: ModelId, gpu: GpuId, profile_line: Option<(f64, f64)>) -> Estimate {
        let c = self.cells.get(gpu as usize * self.models + model as usize).copied().unwrap_or_default();
        let ratio = c.ratio.value();
        Estimate {
            ratio,
            samples: c.ratio.samples,
            alpha_beta_ms: c.fit.solve().or(profile_line.map(|(a, b)| (a * ratio, b * ratio))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Instant {
        Instant::from_nanos(v * 1_000_000)
    }

    fn report(batch: u64, count: u32, profiled_ms: u64, actual_ms: u64, finished_after: Instant) -> Report {
        Report {
            batch,
            gpu: 0,
            model: 0,
            count,
            profiled: Duration::from_millis(profiled_ms),
            actual: Duration::from_millis(actual_ms),
            finished_after,
        }
    }

    #[test]
    fn a_batch_on_profile_changes_nothing() {
        let mut l = ClosedLoop::new(1, LoopConfig::default());
        l.on_plan(0, 1, ms(0), ms(10));
        l.on_plan(0, 2, ms(10), ms(20));
        let got = l.on_report(ms(11), &report(1, 4, 10, 10, ms(9))).unwrap();
        assert_eq!(got.free_at, None);
        assert_eq!(got.gpu_factor, 1.0);
        assert_eq!(l.corrections(0), (0, 0));
        assert!(l.on_report(ms(12), &report(1, 4, 10, 10, ms(9))).is_none(), "reported once");
    }

    #[test]
    fn a_late_batch_pushes_the_gpu_free_time_through_the_batches_after_it() {
        let mut l = ClosedLoop::new(1, LoopConfig::default());
        l.on_plan(0, 1, ms(0), ms(10));
        l.on_plan(0, 2, ms(10), ms(20));
        l.on_plan(0, 3, ms(25), ms(30));
        // Batch 1 took 15 ms: batch 2 runs 15..25, batch 3 still at 25..30.
        assert_eq!(l.on_report(ms(16), &report(1, 4, 10, 15, ms(14))).unwrap().free_at, None);
        // Batch 2 also slow (15 ms): 15..30, so batch 3 runs 30..35.
        let got = l.on_report(ms(31), &report(2, 4, 10, 15, ms(29))).unwrap();
        assert_eq!(got.free_at, Some(ms(35)));
        assert_eq!(l.corrections(0), (1, 0));
        // The ratio moves toward 1.5 and the GPU's factor follows.
        assert!(got.gpu_factor > 1.2 && got.gpu_factor < 1.5, "{}", got.gpu_factor);
    }

    #[test]
    fn an_early_finish_frees_the_gpu_earlier() {
        let mut l = ClosedLoop::new(1, LoopConfig::default());
        l.on_plan(0, 1, ms(0), ms(20));
        let got = l.on_report(ms(11), &report(1, 4, 20, 10, ms(10))).unwrap();
        assert_eq!(got.free_at, Some(ms(10)));
        assert_eq!(l.corrections(0), (0, 1));
    }

    #[test]
    fn the_ratio_converges_and_the_fit_finds_alpha_and_beta() {
        let mut l = ClosedLoop::new(1, LoopConfig::default());
        let (alpha, beta) = (1.0, 5.0);
        for i in 0..60u64 {
            let b = 1 + (i % 8) as u32;
            let profiled = Duration::from_millis_f64(alpha * f64::from(b) + beta);
            let actual = Duration::from_nanos((profiled.as_nanos() as f64 * 1.5) as u64);
            let start = ms(100 * i);
            l.on_plan(0, i, start, start + profiled);
            let r = Report { batch: i, gpu: 0, model: 0, count: b, profiled, actual, finished_after: start };
            l.on_report(start + actual, &r).unwrap();
        }
        let e = l.estimate(0, 0, Some((alpha, beta)));
        assert!((e.ratio - 1.5).abs() < 0.01, "{e:?}");
        let (a, b) = e.alpha_beta_ms.unwrap();
        assert!((a - 1.5).abs() < 0.01 && (b - 7.5).abs() < 0.01, "{e:?}");
        assert!((l.factor(0, 0) - 1.5).abs() < 0.01);
        // One wild report moves it by a bounded step.
        l.on_plan(0, 99, ms(10_000), ms(10_006));
        let r = Report { batch: 99, gpu: 0, model: 0, count: 1, profiled: Duration::from_millis(6), actual: Duration::from_millis(6000), finished_after: ms(0) };
        l.on_report(ms(16_000), &r).unwrap();
        assert!(l.factor(0, 0) < 1.5 * 2f64.powf(0.2) + 1e-9, "{}", l.factor(0, 0));
    }

    #[test]
    fn a_report_after_the_batch_was_given_up_still_teaches_and_corrects() {
        let mut l = ClosedLoop::new(1, LoopConfig::default());
        l.on_plan(0, 1, ms(0), ms(10));
        l.on_plan(0, 2, ms(10), ms(20));
        l.on_plan(0, 3, ms(20), ms(30));
        // Batch 1 overdue: given up and forgotten; it took 40 ms (4x).
        l.forget(0, 1);
        assert!(l.on_report(ms(41), &report(1, 4, 10, 40, ms(40))).is_none(), "no longer held");
        let got = l.on_late_report(ms(41), &report(1, 4, 10, 40, ms(40)), ms(0), ms(10)).unwrap();
        // Batches 2 and 3 run after it: 40..50, 50..60.
        assert_eq!(got.free_at, Some(ms(60)));
        assert_eq!(l.corrections(0), (1, 0));
        // Halfway (the first report against the profile's prior) of the
        // step clamped to 2x: sqrt(2).
        assert!((got.gpu_factor - 2f64.sqrt()).abs() < 1e-9, "{}", got.gpu_factor);
        // A batch planned before a late one and never reported is taken as
        // planned, after the GPU's settled time.
        l.forget(0, 3);
        let got = l.on_late_report(ms(75), &report(3, 4, 10, 10, ms(70)), ms(20), ms(30)).unwrap();
        assert_eq!(l.on_report(ms(76), &report(2, 4, 10, 10, ms(60))), None, "batch 2 left the chain");
        assert_eq!(got.free_at, None, "past: no correction");
        assert_eq!(l.gpu_ratio(0).samples(), 2);
    }
}
