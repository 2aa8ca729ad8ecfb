//! Closed-form bounds on one model's goodput (Symphony section 3.3, Table 2).
//!
//! - Staggered execution (the ideal deferred schedule): a request waits at
//!   most `l(b)/N`, so `(1 + 1/N) l(b) <= SLO`, throughput `N b / l(b)`.
//! - Uncoordinated execution (each GPU batches on its own, as Nexus): a
//!   request may wait a whole `l(b)`, so `2 l(b) <= SLO`.
//! - Hard ceiling: every GPU back to back with the largest batch whose
//!   execution alone fits the SLO, `l(b) <= SLO`.

use crate::zoo::ModelSpec;
use dataplane::time::Duration;
use serde::Serialize;

/// A bound: the batch size it implies and the throughput.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct Bound {
    /// Batch size.
    pub batch: u32,
    /// Requests per second over all GPUs.
    pub throughput_rps: f64,
}

fn bound(m: &ModelSpec, gpus: u32, budget: Duration) -> Bound {
    let b = m.profile.max_batch_within(budget, Duration::ZERO, u32::MAX);
    Bound { batch: b, throughput_rps: if b == 0 { 0.0 } else { f64::from(gpus) * m.profile.throughput_rps(b) } }
}

/// Staggered-execution bound for `gpus` GPUs.
pub fn staggered(m: &ModelSpec, gpus: u32) -> Bound {
    let n = f64::from(gpus.max(1));
    bound(m, gpus, Duration::from_secs_f64(m.slo.as_secs_f64() * n / (n + 1.0)))
}

/// Uncoordinated-execution bound for `gpus` GPUs.
pub fn uncoordinated(m: &ModelSpec, gpus: u32) -> Bound {
    bound(m, gpus, Duration::from_nanos(m.slo.as_nanos() / 2))
}

/// Hard ceiling for `gpus` GPUs.
pub fn ceiling(m: &ModelSpec, gpus: u32) -> Bound {
    bound(m, gpus, m.slo)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table2_bounds() {
        let r = ModelSpec::linear("ResNet50", 1.053, 5.072, 25.0).unwrap();
        let s = staggered(&r, 8);
        assert_eq!(s.batch, 16);
        assert!((s.throughput_rps - 5839.4).abs() < 1.0, "{s:?}");
        let c = ceiling(&r, 8);
        assert_eq!(c.batch, 18);
        assert!((c.throughput_rps - 5993.5).abs() < 1.0, "{c:?}");
        let i = ModelSpec::linear("InceptionResNetV2", 5.090, 18.368, 70.0).unwrap();
        assert!((staggered(&i, 8).throughput_rps - 1083.0).abs() < 1.0);
        assert!(uncoordinated(&r, 8).throughput_rps < s.throughput_rps);
    }
}
