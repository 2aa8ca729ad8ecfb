//! A model's recent loss: the share of its recent admitted requests that
//! scheduling dropped, and the test of whether it takes the cluster's
//! losses alone (deferred items 20 and 27-29).

/// A model's recent loss (basis points) from which it may count as taking
/// the cluster's losses alone ([`takes_the_losses`]; deferred items 27,
/// 28 and 29): 0.2%, a fifth of the goodput bar, so low loads and single early
/// drops move nothing.
pub(super) const LOSS_SPREAD_MIN_BP: u32 = 20;
/// How many times wider early drop's tolerated shortfall is for a model
/// taking the cluster's losses alone (0.95 -> 0.85).
pub(super) const LOSS_SPREAD_WIDENING: f64 = 3.0;

/// Whether a model that lost `bp` basis points of its recent requests takes
/// the cluster's losses alone against models that lost at most `others`:
/// at least [`LOSS_SPREAD_MIN_BP`] and more than twice as much.
pub(super) fn takes_the_losses(bp: u16, others: u16) -> bool {
    let bp = u32::from(bp);
    bp >= LOSS_SPREAD_MIN_BP && bp > 2 * u32::from(others)
}

/// Admitted requests over which [`RecentLoss`] counts: both counts halve
/// when the admitted count reaches this, so the share covers the last
/// 2048-4096 requests (a count, not a time: no clock, and a slow model is
/// judged on as many requests as a fast one).
pub(super) const RECENT_LOSS_SPAN: u32 = 4096;

/// The share of a model's recent admitted requests that scheduling dropped
/// (deferred item 20). Two counters; no allocation.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct RecentLoss {
    pub(super) admitted: u32,
    pub(super) dropped: u32,
}

impl RecentLoss {
    pub(super) fn admitted(&mut self) {
        self.admitted += 1;
        if self.admitted >= RECENT_LOSS_SPAN {
            self.admitted /= 2;
            self.dropped /= 2;
        }
    }

    pub(super) fn dropped(&mut self) {
        self.dropped = self.dropped.saturating_add(1).min(self.admitted.max(1));
    }

    /// In basis points (1% = 100); 0 before any request.
    pub(super) fn basis_points(&self) -> u16 {
        if self.admitted == 0 {
            return 0;
        }
        (u64::from(self.dropped) * 10_000 / u64::from(self.admitted)).min(10_000) as u16
    }
}
