//! Bandwidth figures of one measurement: perftest's `BW average`, `MsgRate`
//! and `BW peak` (the fastest stretch of the run, [`peak_rate`]).

/// Bandwidth of one measurement.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BwStats {
    /// Bytes per operation.
    pub bytes: u32,
    /// Operations completed (both directions with `--bidirectional`).
    pub ops: u64,
    /// First post to last completion, ns.
    pub elapsed_ns: u64,
    /// Highest rate over a tenth of the run's operations, bytes per second.
    pub peak_bytes_per_s: f64,
}

impl BwStats {
    /// Average bandwidth, bytes per second.
    pub fn avg_bytes_per_s(&self) -> f64 {
        if self.elapsed_ns == 0 {
            0.0
        } else {
            self.ops as f64 * f64::from(self.bytes) * 1e9 / self.elapsed_ns as f64
        }
    }
    /// Operations per second.
    pub fn ops_per_s(&self) -> f64 {
        if self.elapsed_ns == 0 {
            0.0
        } else {
            self.ops as f64 * 1e9 / self.elapsed_ns as f64
        }
    }
}

/// Highest bandwidth over any stretch of the run holding at least a tenth
/// of its completions and lasting at least a tenth of its time (`stamps`:
/// completion times, ns, in order; `start` = the first post). Completions
/// reaped together share a time, so a stretch runs from the end of one such
/// batch to the end of a later one (a window cut inside a batch would divide
/// by a time the batch did not take), and the tenth of the time keeps a
/// backlog of acknowledgements drained at once from passing for a burst at
/// memory speed. The stretches ending at the last completion, each starting
/// where the next ends, tile the run: the peak is never below the average.
pub fn peak_rate(stamps: &[u64], start: u64, bytes_per_op: f64) -> f64 {
    let n = stamps.len();
    if n == 0 {
        return 0.0;
    }
    let w = (n / 10).max(1);
    let min_dt = stamps[n - 1].saturating_sub(start) / 10;
    let ends: Vec<usize> = (0..n)
        .filter(|&j| j + 1 == n || stamps[j + 1] != stamps[j])
        .collect();
    let mut best = 0.0f64;
    // `k`: index into `ends` of the latest burst end at or before j - w.
    let mut k: Option<usize> = None;
    for &j in &ends {
        while let Some(next) = k.map_or(Some(0), |k| (k + 1 < ends.len()).then_some(k + 1)) {
            if ends[next] + w <= j && stamps[j] - stamps[ends[next]] >= min_dt {
                k = Some(next);
            } else {
                break;
            }
        }
        let (from, count) = match k {
            Some(k) => (stamps[ends[k]], j - ends[k]),
            None => (start, j + 1),
        };
        let dt = stamps[j].saturating_sub(from);
        if dt > 0 {
            best = best.max(count as f64 * bytes_per_op * 1e9 / dt as f64);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_is_the_fastest_tenth_and_never_below_the_average() {
        // Uniform completions: peak = average.
        let uniform: Vec<u64> = (1..=100).map(|i| i * 5).collect();
        let avg = 100.0 * 1e9 / 500.0;
        assert!((peak_rate(&uniform, 0, 1.0) - avg).abs() < 1e-6);
        // Bursts of 8 completions reaped at one time, 100 ns apart: the
        // rate is 8 per 100 ns, whatever the window (not infinite inside a
        // burst, not 3 per 100 ns across a burst's edge).
        let bursts: Vec<u64> = (1..=10u64)
            .flat_map(|b| std::iter::repeat_n(b * 100, 8))
            .collect();
        let p = peak_rate(&bursts, 0, 1.0);
        assert!((p - 8.0 * 1e9 / 100.0).abs() < 1e-6, "{p}");
        // One fast stretch: 10 completions at 1 ns spacing among slow ones.
        let mut t = 0;
        let mut mixed = Vec::new();
        for i in 0..100 {
            t += if (40..50).contains(&i) { 1 } else { 100 };
            mixed.push(t);
        }
        // The stretch must last a tenth of the run (~900 ns here): the fast
        // ten completions count with the slow ones around them.
        let p = peak_rate(&mixed, 0, 1.0);
        let avg = 100.0 * 1e9 / *mixed.last().unwrap() as f64;
        assert!(p > avg * 1.5 && p < avg * 2.5, "{p} vs {avg}");
        // A backlog drained in quick succession (one completion per ns at
        // the end) cannot make the peak more than 10x the average.
        let mut backlog: Vec<u64> = (1..=90).map(|i| i * 1000).collect();
        backlog.extend((1..=10).map(|i| 90_000 + i));
        let avg = 100.0 * 1e9 / 90_010.0;
        let p = peak_rate(&backlog, 0, 1.0);
        assert!(p >= avg && p <= avg * 10.0, "{p} vs {avg}");
        // Random gaps: never below the average.
        let mut x = 12345u64;
        let mut t = 0;
        let mut random = Vec::new();
        for _ in 0..1000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            t += (x >> 60) * 10; // 0..150 ns, zero gaps included (bursts)
            random.push(t);
        }
        let avg = 1000.0 * 1e9 / *random.last().unwrap() as f64;
        assert!(peak_rate(&random, 0, 1.0) >= avg * (1.0 - 1e-12));
        assert_eq!(peak_rate(&[], 0, 1.0), 0.0);
    }
}
