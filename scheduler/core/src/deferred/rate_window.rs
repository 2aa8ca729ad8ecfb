//! The arrival-rate estimate of one model: the last [`RATE_WINDOW`]
//! arrival instants, the squared coefficient of variation of their gaps
//! and the gaps' empirical distribution by octave (what the deferral
//! rules of [`super::model_thread`] read per gather).

use dataplane::time::{Duration, Instant};

/// How many recent arrivals the rate estimate looks at.
pub(super) const RATE_WINDOW: usize = 256;
/// Gaps whose squared coefficient of variation exceeds this are clearly
/// burstier than Poisson: over 255 Poisson gaps the estimate is 0.99 with a
/// standard deviation of 0.12 (above 1.5 in 0.1% of windows), over
/// Gamma(0.5) gaps 1.98 +- 0.30 (above 1.5 in 97%).
pub(super) const BURSTY_CV2: f64 = 1.5;
/// Arrivals before the squared CV of the gaps is trusted: over a few
/// Gamma(0.2) gaps it is mostly far below its true 5 (one long quiet spell
/// dominates the mean), and a pair-locked model that takes each burst's
/// first request at once drops the rest. Until then the log-gap statistic
/// decides ([`RateWindow::maybe_bursty`]; docs/decisions.md, deferred
/// item 14).
pub(super) const MIN_BURST_ARRIVALS: usize = 32;
/// Above this `ln(mean gap) - mean(ln gap)` the first gaps count as
/// bursty (a Gamma shape below about 0.6; Poisson gaps give 0.58).
const EARLY_BURSTY_LOG_RATIO: f64 = 1.0;

/// Arrival-rate estimate from the last few arrival instants.
#[derive(Clone, Debug)]
pub(super) struct RateWindow {
    times: [Instant; RATE_WINDOW],
    next: usize,
    filled: usize,
    /// Sum of the squared gaps between the recorded arrivals, in ns²
    /// (exact: 255 gaps of up to 10^9 ns each fit a u128 many times over).
    gap_sq_sum: u128,
    /// Sum of the logarithms of the first gaps (ns, at least 1 µs), kept
    /// until [`MIN_BURST_ARRIVALS`] arrivals: the small-sample burstiness
    /// test ([`RateWindow::maybe_bursty`]).
    early_log_gap_sum: f64,
    /// The recorded gaps by octave (`GAP_OCTAVE_FLOOR` + index = `floor(log2
    /// ns)`): their empirical distribution, see [`Self::quiet_start`].
    gap_octaves: [u16; GAP_OCTAVES],
    /// Bit `o` set exactly when `gap_octaves[o] > 0`: the quantile search
    /// visits only the occupied octaves (a few of the 32 in practice). Why:
    /// the full walk, a division per octave, was 6% of the scheduler
    /// daemon's CPU at 1 M tasks/s (perf, amd-vm, 2026-11-29).
    occupied: u32,
}

/// Gaps under `2^(GAP_OCTAVE_FLOOR + 1)` ns (~2 µs) share the first octave.
const GAP_OCTAVE_FLOOR: u32 = 10;
/// Octaves counted: up to `2^(10 + 32)` ns (~73 minutes), the last takes
/// every longer gap.
const GAP_OCTAVES: usize = 32;

fn gap_octave(gap: Duration) -> usize {
    let log2 = 63 - gap.as_nanos().max(1).leading_zeros();
    (log2.saturating_sub(GAP_OCTAVE_FLOOR) as usize).min(GAP_OCTAVES - 1)
}

/// Where octave `o` starts (ns) and how wide it is: the first takes every
/// gap below `2^(GAP_OCTAVE_FLOOR + 1)` ns.
fn octave_span(o: usize) -> (u64, u64) {
    let lo = if o == 0 { 0 } else { 1u64 << (o as u32 + GAP_OCTAVE_FLOOR) };
    (lo, (1u64 << (o as u32 + GAP_OCTAVE_FLOOR + 1)) - lo)
}

/// `1 / width` for a power of two `width` below 2^1023, exactly (an
/// exponent alone). `octave_span`'s widths all are.
#[inline]
fn reciprocal_of_power_of_two(width: u64) -> f64 {
    debug_assert!(width.is_power_of_two());
    f64::from_bits(u64::from(1023 - width.trailing_zeros()) << 52)
}

/// `x as f64`, through `u64` where `x` fits one (a sum of 255 squared
/// gaps does while the gaps average under a quarter second): the same
/// value, since both conversions round the same integer to nearest,
/// without the 128-bit conversion's library call (one per gather, 1.4%
/// of the simulator's instructions).
#[inline]
fn sum_as_f64(x: u128) -> f64 {
    match u64::try_from(x) {
        Ok(small) => small as f64,
        Err(_) => wide_as_f64(x),
    }
}

/// `x as f64` out of line: inline, the compiler converts before it tests
/// the width, and the library call runs on every gather.
#[cold]
#[inline(never)]
fn wide_as_f64(x: u128) -> f64 {
    x as f64
}

impl RateWindow {
    pub(super) fn new() -> Self {
        RateWindow { times: [Instant::ZERO; RATE_WINDOW], next: 0, filled: 0, gap_sq_sum: 0, early_log_gap_sum: 0.0, gap_octaves: [0; GAP_OCTAVES], occupied: 0 }
    }

    /// The empirical CDF of the recorded gaps at `x`, linear within an
    /// octave; `None` with fewer than [`MIN_BURST_ARRIVALS`] arrivals.
    pub(super) fn gap_cdf(&self, x: Duration) -> Option<f64> {
        if self.filled < MIN_BURST_ARRIVALS {
            return None;
        }
        let n = (self.filled - 1) as f64;
        let o = gap_octave(x);
        let mut below = 0u32;
        let mut left = self.occupied & ((1u64 << o) - 1) as u32;
        while left != 0 {
            below += u32::from(self.gap_octaves[left.trailing_zeros() as usize]);
            left &= left - 1;
        }
        let (lo, width) = octave_span(o);
        // `width` is a power of two: multiplying by its reciprocal gives
        // the division's bits without the division's latency.
        let within = ((x.as_nanos().saturating_sub(lo)) as f64 * reciprocal_of_power_of_two(width)).min(1.0);
        Some((f64::from(below) + within * f64::from(self.gap_octaves[o])) / n)
    }

    /// The smallest `x` with `gap_cdf(x) >= q` (`q` in `[0, 1]`).
    fn gap_quantile(&self, q: f64) -> Duration {
        let n = (self.filled - 1) as f64;
        let mut below = 0.0;
        // An empty octave adds a share of exactly 0.0 (`below` unchanged)
        // and never answers (`c > 0`): skipping it gives the same bits as
        // walking all 32.
        let mut left = self.occupied;
        while left != 0 {
            let o = left.trailing_zeros() as usize;
            left &= left - 1;
            let c = self.gap_octaves[o];
            let share = f64::from(c) / n;
            if below + share >= q {
                let (lo, width) = octave_span(o);
                let within = ((q - below) / share).clamp(0.0, 1.0);
                return Duration::from_nanos(lo + (within * width as f64) as u64);
            }
            below += share;
        }
        Duration::from_nanos(1u64 << (GAP_OCTAVES as u32 + GAP_OCTAVE_FLOOR))
    }

    /// Counts one more (`add`) or one fewer (saturating at zero) gap in
    /// octave `o`, keeping [`Self::occupied`] in step.
    #[inline]
    fn count_gap(&mut self, o: usize, add: bool) {
        let c = &mut self.gap_octaves[o];
        *c = if add { c.saturating_add(1) } else { c.saturating_sub(1) };
        if *c == 0 {
            self.occupied &= !(1 << o);
        } else {
            self.occupied |= 1 << o;
        }
    }

    /// When a batch that would take one more request arriving by `horizon`
    /// stops waiting for it: the first moment after the newest arrival at
    /// which the next request, given the quiet so far, comes before
    /// `horizon` with probability below `chance`, by the recorded gaps'
    /// empirical distribution `F`. With `e` the quiet so far and `H` the
    /// horizon, both from the newest arrival, that probability is `(F(H) -
    /// F(e)) / (1 - F(e))`, which is below `chance` exactly when `F(e) >
    /// (F(H) - chance) / (1 - chance)`: a quantile of the gaps. Poisson gaps
    /// stop `-ln(1 - chance)` mean gaps before `horizon`; bursty gaps
    /// wait a burst's short gaps out right after an arrival and not at all
    /// once the burst has gone quiet. `None` before the distribution is
    /// known.
    pub(super) fn quiet_start(&self, horizon: Instant, chance: f64) -> Option<Instant> {
        let last = self.newest();
        let f_h = self.gap_cdf(horizon.saturating_since(last))?;
        let q = (f_h - chance) / (1.0 - chance);
        if q <= 0.0 {
            return Some(last);
        }
        Some(last + self.gap_quantile(q))
    }

    /// The newest arrival recorded ([`Instant::ZERO`] before the first):
    /// [`Self::quiet_start`] answers exactly this when the quiet so far
    /// carries no information (deferred item 34).
    pub(super) fn newest(&self) -> Instant {
        self.times[(self.next + RATE_WINDOW - 1) % RATE_WINDOW]
    }

    pub(super) fn record(&mut self, t: Instant) {
        let sq = |d: Duration| u128::from(d.as_nanos()).pow(2);
        if self.filled == RATE_WINDOW {
            // The oldest gap leaves the window with the oldest arrival.
            let oldest = self.times[self.next];
            let second = self.times[(self.next + 1) % RATE_WINDOW];
            let gap = second.saturating_since(oldest);
            self.gap_sq_sum -= sq(gap);
            self.count_gap(gap_octave(gap), false);
        }
        if self.filled > 0 {
            let last = self.times[(self.next + RATE_WINDOW - 1) % RATE_WINDOW];
            let gap = t.saturating_since(last);
            self.gap_sq_sum += sq(gap);
            self.count_gap(gap_octave(gap), true);
            if self.filled < MIN_BURST_ARRIVALS {
                self.early_log_gap_sum += (gap.as_nanos().max(1_000) as f64).ln();
            }
        }
        self.times[self.next] = t;
        self.next = (self.next + 1) % RATE_WINDOW;
        self.filled = (self.filled + 1).min(RATE_WINDOW);
    }

    /// Squared coefficient of variation of the recent inter-arrival gaps
    /// (0: evenly spaced, 1: Poisson, `1 / k`: Gamma with shape `k`), if at
    /// least two gaps were seen.
    pub(super) fn gap_cv2(&self) -> Option<f64> {
        if self.filled < 3 {
            return None;
        }
        let oldest = if self.filled < RATE_WINDOW { self.times[0] } else { self.times[self.next] };
        let newest = self.times[(self.next + RATE_WINDOW - 1) % RATE_WINDOW];
        let n = (self.filled - 1) as f64;
        let mean = newest.saturating_since(oldest).as_nanos() as f64 / n;
        if mean <= 0.0 {
            return None;
        }
        let mean_sq = sum_as_f64(self.gap_sq_sum) / n;
        Some((mean_sq / (mean * mean) - 1.0).max(0.0))
    }

    /// Whether the arrivals may be burstier than Poisson: from
    /// [`MIN_BURST_ARRIVALS`] arrivals on by the squared CV of the recent
    /// gaps (`cv2`, [`Self::gap_cv2`] as the caller read it once per
    /// gather), before that by the log-gap statistic of the first gaps,
    /// and with fewer than three arrivals (nothing to tell) always.
    /// `early_test` off ([`Departure::EarlyBurstTest`]): by the squared CV
    /// alone from the first arrivals on.
    pub(super) fn maybe_bursty(&self, cv2: Option<f64>, early_test: bool) -> bool {
        if self.filled >= MIN_BURST_ARRIVALS || !early_test {
            return cv2.is_some_and(|c| c > BURSTY_CV2);
        }
        if self.filled < 3 {
            return true;
        }
        // `ln(mean gap) - mean(ln gap)`, the statistic of the Gamma
        // shape's estimate: 0.58 for Poisson gaps, 1.27 for Gamma(0.5),
        // 3.68 for Gamma(0.2), and steady over a few gaps where the squared
        // CV is not (one long gap rules it).
        let n = (self.filled - 1) as f64;
        let oldest = self.times[0];
        let newest = self.times[self.filled - 1];
        let mean = (newest.saturating_since(oldest).as_nanos() as f64 / n).max(1_000.0);
        mean.ln() - self.early_log_gap_sum / n > EARLY_BURSTY_LOG_RATIO
    }

    /// Mean gap between recent arrivals, if at least two were seen.
    pub(super) fn mean_gap(&self, now: Instant) -> Option<Duration> {
        if self.filled < 2 {
            return None;
        }
        let oldest = if self.filled < RATE_WINDOW { self.times[0] } else { self.times[self.next] };
        // Measuring to `now` (not to the last arrival) lets the estimate
        // decay when a model goes quiet.
        let span = now.saturating_since(oldest);
        Some(Duration::from_nanos(span.as_nanos() / (self.filled as u64 - 1).max(1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The walk over every octave that the occupied-octave search replaced.
    fn quantile_over_all_octaves(w: &RateWindow, q: f64) -> Duration {
        let n = (w.filled - 1) as f64;
        let mut below = 0.0;
        for (o, &c) in w.gap_octaves.iter().enumerate() {
            let share = f64::from(c) / n;
            if below + share >= q && c > 0 {
                let (lo, width) = octave_span(o);
                let within = ((q - below) / share).clamp(0.0, 1.0);
                return Duration::from_nanos(lo + (within * width as f64) as u64);
            }
            below += share;
        }
        Duration::from_nanos(1u64 << (GAP_OCTAVES as u32 + GAP_OCTAVE_FLOOR))
    }

    /// The occupied-octave search gives the full walk's answer to the bit,
    /// over bursty gaps spread across many octaves, as the window slides
    /// (octaves emptying and filling again).
    #[test]
    fn octave_widths_have_exact_reciprocals() {
        for o in 0..GAP_OCTAVES {
            let (_, width) = octave_span(o);
            assert_eq!(reciprocal_of_power_of_two(width), 1.0 / width as f64, "octave {o}");
        }
    }

    #[test]
    fn the_occupied_octave_search_matches_the_full_walk() {
        let mut w = RateWindow::new();
        let mut t = Instant::ZERO;
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut checked = 0;
        for i in 0..3000u32 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            // Gaps from 0 to 2^24 ns (~17 ms), spread over the octaves by
            // a random shift.
            let gap = (rng >> 40) >> (rng % 40).min(24);
            t += Duration::from_nanos(gap);
            w.record(t);
            let mask = w.gap_octaves.iter().enumerate().fold(0u32, |m, (o, &c)| if c > 0 { m | 1 << o } else { m });
            assert_eq!(w.occupied, mask, "arrival {i}");
            if w.filled < MIN_BURST_ARRIVALS {
                continue;
            }
            for q in [0.0, 1e-9, 0.05, 0.3, 0.5, 0.77, 0.99, 1.0] {
                assert_eq!(w.gap_quantile(q), quantile_over_all_octaves(&w, q), "arrival {i}, q {q}");
                checked += 1;
            }
            let x = Duration::from_nanos(rng >> 30);
            let all: u32 = w.gap_octaves[..gap_octave(x)].iter().map(|&c| u32::from(c)).sum();
            let (lo, width) = octave_span(gap_octave(x));
            let within = ((x.as_nanos().saturating_sub(lo)) as f64 / width as f64).min(1.0);
            let want = (f64::from(all) + within * f64::from(w.gap_octaves[gap_octave(x)])) / (w.filled - 1) as f64;
            assert_eq!(w.gap_cdf(x).map(f64::to_bits), Some(want.to_bits()), "arrival {i}");
        }
        assert!(checked > 20_000, "the window never filled: {checked}");
    }
}
