//! Telemetry: what the plane learns about its GPUs and itself. Each
//! sub-cluster's closed loop (batch reports teach GPU speeds and correct
//! free times), the self-check that no GPU is planned a batch before its
//! previous planned batch ends, the periodic publication of estimates
//! into the metrics, and, in benchmarks only, the lag stamps. It reads no
//! clock: times come in as `now`, and the benchmark stamps' host clock is
//! the one the host hands to [`Telemetry::set_bench_stamps`].

use std::sync::atomic::Ordering;
use std::sync::Arc;

use dataplane::time::{Duration, Instant};
use dataplane::wire::BenchStamp;

use super::{SubCluster, PUBLISH_EVERY};
use crate::closed_loop::{ClosedLoop, Estimate, Learned, LoopConfig, Ratio, Report};
use crate::daemon::bench_stamps::BenchClock;
use crate::daemon::metrics::{LoopEstimate, SchedulerMetrics};
use crate::types::GpuId;
use crate::zoo::ModelSpec;

/// The host's monotonic clock in nanoseconds (benchmark stamps only; see
/// [`super::super::bench_stamps`]). Given by the host, so the plane reads
/// no clock of its own.
pub type HostClock = fn() -> u64;

/// The telemetry part (see the module docs).
pub(super) struct Telemetry {
    loop_cfg: LoopConfig,
    /// The closed loop of each sub-cluster (by index).
    loops: Vec<ClosedLoop>,
    /// Per sub-cluster, the planned finish of the last batch planned on
    /// each GPU id (moved by the closed loop's corrections).
    planned_free: Vec<Vec<Instant>>,
    /// Batches planned onto a GPU before its previous planned batch there
    /// ended (a scheduling bug; stays 0).
    overlapping_plans: u64,
    next_publish: Instant,
    /// Benchmark-only lag stamps (`--bench-stamps`), off by default.
    bench: Option<(BenchClock, HostClock)>,
    /// Benchmark only: planned dispatch moments (host clock) of the plans
    /// in the outbox, for [`Telemetry::outbox_sent`].
    bench_unsent: Vec<u64>,
    metrics: Arc<SchedulerMetrics>,
}

impl Telemetry {
    /// Telemetry of sub-clusters with `models[i]` models each.
    pub(super) fn new(models: impl Iterator<Item = usize>, metrics: Arc<SchedulerMetrics>) -> Self {
        let loops: Vec<ClosedLoop> = models.map(|n| ClosedLoop::new(n, LoopConfig::default())).collect();
        let t = Telemetry {
            loop_cfg: LoopConfig::default(),
            planned_free: vec![Vec::new(); loops.len()],
            loops,
            overlapping_plans: 0,
            next_publish: Instant::ZERO,
            bench: None,
            bench_unsent: Vec::new(),
            metrics,
        };
        t.sync_gauges();
        t
    }

    // --- the closed loop ----------------------------------------------------

    pub(super) fn set_closed_loop(&mut self, cfg: LoopConfig) {
        self.loop_cfg = cfg;
        for l in &mut self.loops {
            l.set_config(cfg);
        }
        self.sync_gauges();
    }

    pub(super) fn closed_loop(&self) -> LoopConfig {
        self.loop_cfg
    }

    /// The speed ratio of sub-cluster `sc`'s GPU `gpu`.
    pub(super) fn gpu_ratio(&self, sc: usize, gpu: GpuId) -> Ratio {
        self.loops[sc].gpu_ratio(gpu)
    }

    /// The estimate of local `model` on sub-cluster `sc`'s GPU `gpu`.
    pub(super) fn estimate(&self, sc: usize, model: u32, gpu: GpuId, line: Option<(f64, f64)>) -> Estimate {
        self.loops[sc].estimate(model, gpu, line)
    }

    /// A batch planned on `gpu` at `[exec_at, finish_at)`: the self-check
    /// against its previous planned batch there.
    pub(super) fn check_plan(&mut self, sc: usize, gpu: GpuId, exec_at: Instant, finish_at: Instant) {
        let free = &mut self.planned_free[sc];
        if free.len() <= gpu as usize {
            free.resize(gpu as usize + 1, Instant::ZERO);
        }
        if exec_at < free[gpu as usize] {
            self.overlapping_plans += 1;
        }
        free[gpu as usize] = free[gpu as usize].max(finish_at);
    }

    /// The batch was sent: the loop waits for its report.
    pub(super) fn on_plan(&mut self, sc: usize, gpu: GpuId, batch: u64, exec_at: Instant, finish_at: Instant) {
        self.loops[sc].on_plan(gpu, batch, exec_at, finish_at);
    }

    /// A GPU joined, busy until `free_at` (the self-check starts there).
    pub(super) fn gpu_joined(&mut self, sc: usize, gpu: GpuId, free_at: Instant) {
        let free = &mut self.planned_free[sc];
        if free.len() <= gpu as usize {
            free.resize(gpu as usize + 1, Instant::ZERO);
        }
        free[gpu as usize] = free[gpu as usize].max(free_at);
    }

    /// When `gpu` of sub-cluster `sc` is free of the batches planned on it
    /// (as the overlap self-check holds it; None: never planned).
    pub(super) fn planned_free(&self, sc: usize, gpu: GpuId) -> Option<Instant> {
        self.planned_free.get(sc)?.get(gpu as usize).copied()
    }

    /// A GPU left: the loop forgets it.
    pub(super) fn gpu_left(&mut self, sc: usize, gpu: GpuId) {
        self.loops[sc].gpu_left(gpu);
    }

    /// A batch ended without a report to learn from.
    pub(super) fn forget(&mut self, sc: usize, gpu: GpuId, batch: u64) {
        self.loops[sc].forget(gpu, batch);
    }

    /// A batch report: what the cores should change, if the loop is on
    /// (the caller passes it on); a corrected free time moves the
    /// self-check's planned free time too. `late`: the batch was given up
    /// before its report came; its planned start and finish.
    pub(super) fn learn(&mut self, now: Instant, sc: usize, report: &Report, late: Option<(Instant, Instant)>) -> Option<Learned> {
        let learned = match late {
            None => self.loops[sc].on_report(now, report)?,
            Some((exec_at, finish_at)) => self.loops[sc].on_late_report(now, report, exec_at, finish_at)?,
        };
        if !self.loop_cfg.enabled {
            return None;
        }
        if let Some(free_at) = learned.free_at {
            let planned = &mut self.planned_free[sc];
            let counter = match planned.get(report.gpu as usize) {
                Some(&p) if free_at < p => &self.metrics.closed_loop.free_corrections_earlier,
                _ => &self.metrics.closed_loop.free_corrections_later,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            if let Some(p) = planned.get_mut(report.gpu as usize) {
                *p = free_at;
            }
        }
        Some(learned)
    }

    /// Batches planned onto a GPU before its previous planned batch ended.
    pub(super) fn overlapping_plans(&self) -> u64 {
        self.overlapping_plans
    }

    /// Republishes the closed loop's estimates into the metrics, at most
    /// every [`PUBLISH_EVERY`] (a lock per publication, none per message).
    pub(super) fn publish(&mut self, now: Instant, subclusters: &[SubCluster], models: &[ModelSpec]) {
        if now < self.next_publish {
            return;
        }
        self.next_publish = now + PUBLISH_EVERY;
        let Ok(mut rows) = self.metrics.closed_loop.loop_estimates.lock() else { return };
        rows.clear();
        for (s, l) in subclusters.iter().zip(&self.loops) {
            for (g, &(backend, gpu)) in s.gpu_owner.iter().enumerate() {
                let g = g as GpuId;
                let pooled = l.gpu_ratio(g);
                if pooled.samples() == 0 {
                    continue;
                }
                rows.push(LoopEstimate { backend, gpu, model: None, ratio: pooled.value(), samples: pooled.samples(), alpha_beta_ms: None });
                for (local, &global) in s.models.iter().enumerate() {
                    let line = models[global as usize].profile.linear_coefficients();
                    let e = l.estimate(local as u32, g, line);
                    if e.samples > 0 {
                        rows.push(LoopEstimate { backend, gpu, model: Some(global), ratio: e.ratio, samples: e.samples, alpha_beta_ms: e.alpha_beta_ms });
                    }
                }
            }
        }
    }

    fn sync_gauges(&self) {
        self.metrics.closed_loop.closed_loop_enabled.store(u64::from(self.loop_cfg.enabled), Ordering::Relaxed);
    }

    // --- benchmark stamps -----------------------------------------------------

    /// Benchmark only: stamps on (`origin_host_ns`: the host clock at this
    /// process's clock origin; `host_clock`: the host's clock) or off.
    pub(super) fn set_bench_stamps(&mut self, origin_host_ns: Option<u64>, host_clock: HostClock) {
        self.bench = origin_host_ns.map(|o| (BenchClock::new(o), host_clock));
        self.bench_unsent = Vec::with_capacity(if self.bench.is_some() { 4096 } else { 0 });
    }

    /// A frontend's stamp for its next task.
    pub(super) fn on_bench_stamp(&mut self, from: u32, s: &BenchStamp) {
        if let Some((b, _)) = &mut self.bench {
            b.stamped(from, s);
        }
    }

    /// A task from `from` was queued: its ingress lag, if stamped. The
    /// poll's `now` was read before this link's messages were taken; the
    /// lag to measure ends now.
    pub(super) fn task_queued(&mut self, from: u32) {
        if let Some((b, host_clock)) = self.bench.as_mut().filter(|(b, _)| b.awaits(from)) {
            if let Some(lag) = b.take_ingress_lag(from, host_clock()) {
                self.metrics.bench_ingress_lag.record(lag);
            }
        }
    }

    /// The stamp to precede a plan (None: stamps off); records where the
    /// dispatch lag goes (decided here, handed to the link in
    /// [`outbox_sent`](Self::outbox_sent), received at the backend).
    pub(super) fn plan_stamp(&mut self, planned_at: Instant, exec_at: Instant, deadline: Instant) -> Option<BenchStamp> {
        let (b, host_clock) = self.bench.as_ref()?;
        let stamp = b.plan_stamp(planned_at, exec_at, deadline);
        self.metrics.bench_decision_lag.record(host_clock().saturating_sub(stamp.at_ns));
        self.bench_unsent.push(stamp.at_ns);
        Some(stamp)
    }

    /// Whether plans are stamped.
    pub(super) fn stamps_on(&self) -> bool {
        self.bench.is_some()
    }

    /// The outbox was handed to the links: the send lag of each plan it
    /// held.
    pub(super) fn outbox_sent(&mut self) {
        let Some((_, host_clock)) = self.bench.as_ref().filter(|_| !self.bench_unsent.is_empty()) else { return };
        let sent = host_clock();
        for &planned in &self.bench_unsent {
            self.metrics.bench_send_lag.record(sent.saturating_sub(planned));
        }
        self.bench_unsent.clear();
    }
}

/// The closed loop's report of a batch: placed on this clock, at most
/// `d_ctrl` (the bound) before `now` when it was sent.
pub(super) fn report(now: Instant, done: &dataplane::wire::BatchDone, gpu: GpuId, model: u32, profiled: Duration, d_ctrl: Duration) -> Report {
    Report {
        batch: done.batch_id,
        gpu,
        model,
        count: done.count,
        profiled,
        actual: Duration::from_nanos(done.actual_ns()),
        finished_after: now.saturating_sub(Duration::from_nanos(done.finish_ago_ns)).saturating_sub(d_ctrl),
    }
}
