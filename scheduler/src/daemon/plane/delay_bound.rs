//! The network delay bound: its one owner in the daemon. The cores charge
//! `delay(b) = d_ctrl + d_data * b` before a batch may start; every peer
//! is told `d_ctrl` in its `Welcome` (backends subtract what the
//! scheduler charges); the closed loop places a report `d_ctrl` back in
//! time. All of them read it here. It changes in one way only: the READ
//! tail watch ([`DelayWatch`]) adopts an observed `d_data`, and
//! [`DelayBound::on_reads`] hands the new bound to the plane, which
//! passes it to the cores.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use dataplane::time::Duration;

use crate::daemon::metrics::SchedulerMetrics;
use crate::delay_watch::{DelayWatch, DelayWatchConfig, Verdict};
use crate::netdelay::NetworkDelay;

/// The bound and its watch (see the module docs).
pub(super) struct DelayBound {
    /// The bound charged now.
    delay: NetworkDelay,
    /// The READ tail against `delay.d_data`, for the one transport this
    /// scheduler's links use.
    watch: DelayWatch,
    /// Verdicts not yet taken by the host (for its log).
    verdicts: Vec<Verdict>,
    metrics: Arc<SchedulerMetrics>,
}

impl DelayBound {
    /// The bound given by configuration or calibration.
    pub(super) fn new(delay: NetworkDelay, metrics: Arc<SchedulerMetrics>) -> Self {
        let b = DelayBound { delay, watch: DelayWatch::new(DelayWatchConfig::default()), verdicts: Vec::with_capacity(4), metrics };
        b.sync_gauges();
        b
    }

    /// The bound the cores charge now.
    pub(super) fn current(&self) -> NetworkDelay {
        self.delay
    }

    /// `d_ctrl`: announced to every peer, and charged per message.
    pub(super) fn control(&self) -> Duration {
        self.delay.d_ctrl
    }

    /// How the READ tail of `transport` (a metric label) is watched.
    pub(super) fn set_watch(&mut self, transport: &str, cfg: DelayWatchConfig) {
        self.watch.set_config(cfg);
        if let Ok(mut t) = self.metrics.closed_loop.read_transport.lock() {
            t.clear();
            t.push_str(transport);
        }
        self.sync_gauges();
    }

    /// The READ tail watch.
    pub(super) fn watch(&self) -> &DelayWatch {
        &self.watch
    }

    /// The oldest verdict not yet taken.
    pub(super) fn take_verdict(&mut self) -> Option<Verdict> {
        (!self.verdicts.is_empty()).then(|| self.verdicts.remove(0))
    }

    /// A batch's slowest READ and the READs it waited for. Returns the
    /// new bound when the watch adopted the observed tail (the one update
    /// path: the caller hands it to the cores).
    pub(super) fn on_reads(&mut self, slowest: Duration, reads: u32) -> Option<NetworkDelay> {
        let loop_metrics = &self.metrics.closed_loop;
        let Some(v) = self.watch.record(slowest, reads, self.delay.d_data) else {
            if reads > 0 {
                loop_metrics.read_batches.fetch_add(1, Ordering::Relaxed);
            }
            return None;
        };
        loop_metrics.read_batches.fetch_add(1, Ordering::Relaxed);
        let mut changed = None;
        match v {
            Verdict::Exceeded { .. } => {
                loop_metrics.delay_bound_alarms.fetch_add(1, Ordering::Relaxed);
            }
            Verdict::Restored { .. } => {}
            Verdict::Adopted { new, .. } => {
                loop_metrics.delay_bound_adopted.fetch_add(1, Ordering::Relaxed);
                self.delay.d_data = new;
                changed = Some(self.delay);
            }
        }
        if self.verdicts.len() < self.verdicts.capacity() {
            self.verdicts.push(v);
        }
        self.sync_gauges();
        changed
    }

    fn sync_gauges(&self) {
        let m = &self.metrics.closed_loop;
        m.read_bound_ns.store(self.delay.d_data.as_nanos(), Ordering::Relaxed);
        m.read_percentile_milli.store((self.watch.config().percentile * 1000.0) as u64, Ordering::Relaxed);
        m.read_tail_ns.store(self.watch.observed().map_or(0, |d| d.as_nanos()), Ordering::Relaxed);
        m.delay_bound_exceeded.store(u64::from(self.watch.exceeded()), Ordering::Relaxed);
    }
}
