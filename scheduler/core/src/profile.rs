//! Batch latency profiles: how long a batch of `b` requests occupies a GPU.
//!
//! A profile is either linear, `l(b) = alpha*b + beta` (how the papers fit
//! their measurements), or a table measured at some batch sizes and linearly
//! interpolated between them. Either way it is stored as a dense, monotone
//! table of `l(1) ..= l(max_batch)` so every lookup on the scheduling hot
//! path is one array index, and "the largest batch that fits a budget" is a
//! binary search.

use dataplane::time::Duration;
use std::fmt;

/// The largest batch a linear profile is tabulated to when no SLO caps it.
pub const DEFAULT_MAX_BATCH: u32 = 1024;

/// Why a profile could not be built.
#[derive(Debug, Clone, PartialEq)]
pub enum ProfileError {
    /// alpha or beta was negative or not finite.
    BadLinear {
        /// The rejected alpha, ms.
        alpha_ms: f64,
        /// The rejected beta, ms.
        beta_ms: f64,
    },
    /// A measured table needs at least one point.
    EmptyTable,
    /// Batch sizes must start at 1 and strictly increase.
    BadBatchSizes,
    /// Latencies must not decrease with batch size.
    NotMonotone {
        /// The first batch size whose latency is lower than its predecessor's.
        batch: u32,
    },
}

impl fmt::Display for ProfileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProfileError::BadLinear { alpha_ms, beta_ms } => {
                write!(f, "linear profile needs finite alpha, beta >= 0 (got alpha={alpha_ms}, beta={beta_ms})")
            }
            ProfileError::EmptyTable => write!(f, "a measured profile needs at least one (batch, latency) point"),
            ProfileError::BadBatchSizes => {
                write!(f, "measured batch sizes must start at 1 and strictly increase")
            }
            ProfileError::NotMonotone { batch } => {
                write!(f, "measured latency decreases at batch size {batch}")
            }
        }
    }
}
impl std::error::Error for ProfileError {}

/// A monotone batch latency profile.
#[derive(Clone, Debug, PartialEq)]
pub struct LatencyProfile {
    /// `table[b - 1] = l(b)`.
    table: Vec<Duration>,
    /// The linear coefficients this table came from, if it was linear.
    linear: Option<(f64, f64)>,
}

impl LatencyProfile {
    /// `l(b) = alpha_ms*b + beta_ms` milliseconds, for `1 <= b <= max_batch`.
    pub fn linear(alpha_ms: f64, beta_ms: f64, max_batch: u32) -> Result<Self, ProfileError> {
        if !(alpha_ms.is_finite() && beta_ms.is_finite()) || alpha_ms < 0.0 || beta_ms < 0.0 {
            return Err(ProfileError::BadLinear { alpha_ms, beta_ms });
        }
        let max_batch = max_batch.max(1);
        let table = (1..=max_batch)
            .map(|b| Duration::from_millis_f64(alpha_ms * f64::from(b) + beta_ms))
            .collect();
        Ok(LatencyProfile { table, linear: Some((alpha_ms, beta_ms)) })
    }

    /// A measured profile: `(batch, latency)` points, batch sizes from 1 up,
    /// strictly increasing, latencies non-decreasing. Batch sizes between
    /// two points are linearly interpolated; the last point is the largest
    /// batch the model supports.
    pub fn measured(points: &[(u32, Duration)]) -> Result<Self, ProfileError> {
        let (&(first_b, _), _) = points.split_first().ok_or(ProfileError::EmptyTable)?;
        if first_b != 1 || points.windows(2).any(|w| w[1].0 <= w[0].0) {
            return Err(ProfileError::BadBatchSizes);
        }
        if let Some(w) = points.windows(2).find(|w| w[1].1 < w[0].1) {
            return Err(ProfileError::NotMonotone { batch: w[1].0 });
        }
        let max_b = points[points.len() - 1].0;
        let mut table = Vec::with_capacity(max_b as usize);
        table.push(points[0].1);
        for w in points.windows(2) {
            let ((b0, l0), (b1, l1)) = (w[0], w[1]);
            for b in (b0 + 1)..=b1 {
                let frac = f64::from(b - b0) / f64::from(b1 - b0);
                let ns = l0.as_nanos() as f64 + frac * (l1.as_nanos() - l0.as_nanos()) as f64;
                table.push(Duration::from_nanos(ns.round() as u64));
            }
        }
        Ok(LatencyProfile { table, linear: None })
    }

    /// The same profile, truncated to batches no larger than `max_batch`.
    pub fn capped(mut self, max_batch: u32) -> Self {
        self.table.truncate(max_batch.max(1) as usize);
        self
    }

    /// `l(b)`. Batch sizes above the largest supported one are clamped to it
    /// (callers never form such batches; the clamp keeps lookups total).
    #[inline]
    pub fn latency(&self, b: u32) -> Duration {
        let i = (b.max(1) as usize).min(self.table.len()) - 1;
        self.table[i]
    }

    /// The largest supported batch size.
    #[inline]
    pub fn max_batch(&self) -> u32 {
        self.table.len() as u32
    }

    /// The linear coefficients `(alpha_ms, beta_ms)`, if this profile is linear.
    pub fn linear_coefficients(&self) -> Option<(f64, f64)> {
        self.linear
    }

    /// `l(b)` on a device that runs `factor` times slower than the profile
    /// (the closed loop's estimate): exactly `l(b)` at factor 1, else
    /// rounded to the nanosecond, as `gpu::GpuSet::hold_time` rounds.
    #[inline]
    pub fn scaled_latency(&self, b: u32, factor: f64) -> Duration {
        let l = self.latency(b);
        if factor == 1.0 {
            l
        } else {
            // Float-to-integer casts saturate: a huge product is "never".
            Duration::from_nanos((l.as_nanos() as f64 * factor).round() as u64)
        }
    }

    /// The largest `b <= limit` with `cost(b) <= budget`, where
    /// `cost(b) = l(b) + per_item * b`; 0 if even `b = 1` does not fit.
    /// `O(log limit)`.
    #[inline]
    pub fn max_batch_within(&self, budget: Duration, per_item: Duration, limit: u32) -> u32 {
        self.max_batch_within_scaled(budget, per_item, limit, 1.0)
    }

    /// [`max_batch_within`](Self::max_batch_within) on a device `factor`
    /// times slower: `cost(b) = scaled_latency(b, factor) + per_item * b`.
    #[inline]
    pub fn max_batch_within_scaled(&self, budget: Duration, per_item: Duration, limit: u32, factor: f64) -> u32 {
        let limit = limit.min(self.max_batch());
        let fits = |b: u32| self.batch_fits(budget, per_item, b, factor);
        if limit == 0 || !fits(1) {
            return 0;
        }
        // The cost is non-decreasing (a monotone table, a monotone scaling):
        // when the whole limit fits, the search would end there. The common
        // case of the gathering policy's sizing (a queue shorter than what
        // its deadline allows), one lookup instead of ~log2(limit).
        if fits(limit) {
            return limit;
        }
        // Invariant: fits(lo); !fits(hi + 1) or hi == limit.
        let (mut lo, mut hi) = (1u32, limit);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }

    /// Whether `cost(b) = l(b) * factor + per_item * b` is within `budget`
    /// (the test [`Self::max_batch_within_scaled`] searches with).
    #[inline]
    pub fn batch_fits(&self, budget: Duration, per_item: Duration, b: u32, factor: f64) -> bool {
        self.scaled_latency(b, factor) + per_item.saturating_mul(u64::from(b)) <= budget
    }

    /// Throughput of back-to-back batches of size `b`, in requests per second.
    pub fn throughput_rps(&self, b: u32) -> f64 {
        f64::from(b) / self.latency(b).as_secs_f64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_profile_matches_formula() {
        let p = LatencyProfile::linear(1.053, 5.072, 64).unwrap();
        assert_eq!(p.latency(1), Duration::from_nanos(6_125_000));
        assert_eq!(p.latency(16), Duration::from_nanos(21_920_000));
        assert_eq!(p.max_batch(), 64);
        // 25 ms SLO: l(18) = 24.026 fits, l(19) = 25.079 does not.
        assert_eq!(p.max_batch_within(Duration::from_millis(25), Duration::ZERO, 64), 18);
        assert_eq!(p.max_batch_within(Duration::from_millis(6), Duration::ZERO, 64), 0);
        assert_eq!(p.max_batch_within(Duration::from_millis(25), Duration::ZERO, 5), 5);
        // A per-item network cost shrinks the batch.
        assert_eq!(p.max_batch_within(Duration::from_millis(25), Duration::from_millis(1), 64), 9);
        // On a device 1.5x slower: 1.5 * l(11) = 24.9825 ms fits, 1.5 * l(12) does not.
        assert!(p.scaled_latency(11, 1.5).as_nanos().abs_diff(24_982_500) <= 1);
        assert_eq!(p.max_batch_within_scaled(Duration::from_millis(25), Duration::ZERO, 64, 1.5), 11);
        assert_eq!(p.scaled_latency(16, 1.0), p.latency(16));
    }

    #[test]
    fn max_batch_within_is_the_largest_fitting_batch() {
        // Against a scan, over budgets, per-item costs, limits and factors
        // (the early return for a fitting limit included).
        let p = LatencyProfile::linear(0.1, 5.0, 300).unwrap();
        for budget_us in (0..60_000).step_by(997) {
            for per_item_ns in [0u64, 50, 3_000] {
                for limit in [0u32, 1, 2, 17, 300, 1000] {
                    for factor in [1.0, 0.8, 1.5] {
                        let (budget, per_item) = (Duration::from_micros(budget_us), Duration::from_nanos(per_item_ns));
                        let scan = (1..=limit.min(300)).filter(|&b| p.scaled_latency(b, factor) + per_item.saturating_mul(u64::from(b)) <= budget).max().unwrap_or(0);
                        assert_eq!(p.max_batch_within_scaled(budget, per_item, limit, factor), scan, "{budget_us} {per_item_ns} {limit} {factor}");
                    }
                }
            }
        }
    }

    #[test]
    fn measured_profile_interpolates_and_validates() {
        let ms = Duration::from_millis;
        let p = LatencyProfile::measured(&[(1, ms(2)), (3, ms(4)), (5, ms(10))]).unwrap();
        let got: Vec<u64> = (1..=5).map(|b| p.latency(b).as_nanos() / 1_000_000).collect();
        assert_eq!(got, vec![2, 3, 4, 7, 10]);
        assert_eq!(p.latency(99), ms(10));
        assert_eq!(LatencyProfile::measured(&[]), Err(ProfileError::EmptyTable));
        assert_eq!(LatencyProfile::measured(&[(2, ms(1))]), Err(ProfileError::BadBatchSizes));
        assert_eq!(
            LatencyProfile::measured(&[(1, ms(3)), (2, ms(2))]),
            Err(ProfileError::NotMonotone { batch: 2 })
        );
        assert!(LatencyProfile::linear(-1.0, 1.0, 4).is_err());
    }
}
