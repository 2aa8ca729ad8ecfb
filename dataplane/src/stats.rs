//! Order statistics of small sample sets (benchmark repetitions, report
//! cells): one `median` and one `percentile` for every bench and report,
//! so that "p99" means the same rank everywhere.
//!
//! Samples are `f64`s compared with `total_cmp` (NaNs sort last, no panic).
//! Large latency populations belong in an HDR histogram instead
//! (`hdrhistogram`, as the ring and transport benches use); these functions
//! sort their input and suit hundreds of values, not millions.

/// The median of `values`, which are sorted in place: the middle element,
/// the upper one of the two middles for an even count (a value that was
/// measured, never an average of two). `None` when empty.
pub fn median(values: &mut [f64]) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied()
}

/// The `q`-quantile (`q` in `0..=1`, clamped) of already sorted `sorted`,
/// by nearest rank: the element at `round((len - 1) * q)`. `None` when
/// empty.
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let rank = (last as f64 * q.clamp(0.0, 1.0)).round() as usize;
    sorted.get(rank.min(last)).copied()
}

/// Sorts `values` (`total_cmp`) and returns the `q`-quantile, as
/// [`percentile`].
pub fn percentile_of(values: &mut [f64], q: f64) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    percentile(values, q)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_is_a_measured_middle_value() {
        assert_eq!(median(&mut []), None);
        assert_eq!(median(&mut [3.0]), Some(3.0));
        assert_eq!(median(&mut [9.0, 1.0, 5.0]), Some(5.0));
        // Even count: the upper middle, not the mean 2.5.
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), Some(3.0));
        // A NaN sorts last and does not panic.
        assert_eq!(median(&mut [f64::NAN, 1.0, 2.0]), Some(2.0));
    }

    #[test]
    fn percentile_takes_the_nearest_rank() {
        let sorted: Vec<f64> = (0..=100).map(f64::from).collect();
        assert_eq!(percentile(&sorted, 0.0), Some(0.0));
        assert_eq!(percentile(&sorted, 0.5), Some(50.0));
        assert_eq!(percentile(&sorted, 0.99), Some(99.0));
        assert_eq!(percentile(&sorted, 1.0), Some(100.0));
        assert_eq!(percentile(&sorted, 7.0), Some(100.0), "q is clamped");
        assert_eq!(percentile(&[], 0.5), None);
        // (4 - 1) * 0.5 = 1.5 rounds to rank 2.
        assert_eq!(percentile_of(&mut [40.0, 10.0, 30.0, 20.0], 0.5), Some(30.0));
    }
}
