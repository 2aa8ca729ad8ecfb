//! Deferred's departures from the paper's Algorithm 1 (with Appendix D's
//! network delay), each a named stage that configuration can switch off.
//! Off means Algorithm 1's behaviour for that one rule; the rationale of
//! each, with the measurements that justified it, is in docs/decisions.md
//! ("Deferred scheduling: where the code departs from Appendix D"), keyed
//! by the item number given here.
//!
//! Not every numbered item is a switch:
//! - items 1-3 are Algorithm 1 as Appendix D sketches it (re-evaluation at
//!   `latest - delay`, the RankThread hearing only of schedulable
//!   candidates, idle GPUs lowest id first);
//! - item 9 (the rate estimate over 256 arrivals) is a setting of the
//!   estimate the departures below read; Algorithm 1 has none;
//! - items 23 and 26 are settings of the measurement, not of scheduling;
//! - item 16 (the Poisson window leaves one request of the target) is
//!   subsumed by item 17's fill floor, which is [`Departure::FillFloor`].
//!
//! Some switches only matter with another on (a switch whose parent is off
//! changes nothing): [`Departure::parent`] says which.

use std::fmt;

/// One departure from Algorithm 1 (docs/decisions.md item numbers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Departure {
    /// Item 4: the schedulable window opens `window_gaps x max(1, CV^2)`
    /// expected gaps before the latest start. Off: the plain frontrun.
    WindowGaps,
    /// Item 5: early drop (Nexus's sliding window). Off: lazy drop, as
    /// `--gather lazy`.
    EarlyDrop,
    /// Items 6, 10 and 11: early drop tolerates a shortfall (the window is
    /// the smallest batch within 0.95 of the target's throughput per GPU,
    /// widened by `CV^2`). Off: the window is the target batch (Nexus).
    DropShortfall,
    /// Item 17 (and 16): under Poisson-like arrivals the early-drop window
    /// is at most what four fills in five reach.
    FillFloor,
    /// Item 21: under bursts the widened window stops at a third of the
    /// target.
    BurstWindowFloor,
    /// Item 27: a model losing more than twice every other model's share
    /// early-drops at 0.85.
    LossSpread,
    /// Item 7: deferral stops once the batch runs within the efficiency
    /// slack of the best throughput per GPU. Off: defer to the window.
    EfficiencyStop,
    /// Item 11: the efficiency stop aims at the target batch the rate
    /// fills, not the SLO-bound batch.
    StopAtTarget,
    /// Item 30: with three GPUs idle the efficiency stop aims at the
    /// SLO-bound batch again.
    ManyIdleDeferToSlo,
    /// Items 8 and 10: a GPU idle while more models wait for their windows
    /// than GPUs idle goes to the most urgent pending candidate now.
    WorkConserve,
    /// Item 15: a ready batch with slack leaves the last idle GPUs to more
    /// urgent pending ones.
    ServeUrgentPending,
    /// Items 12 and 13: a model whose lone request locks out a pair waits
    /// for the plain frontrun under bursts while a GPU idles.
    BurstLock,
    /// Item 14: the first 32 arrivals are judged bursty by their
    /// logarithms. Off: by the squared CV only.
    EarlyBurstTest,
    /// Item 19: only a pair worth waiting for (`beta >= alpha`) locks.
    /// Off: every model whose lone request locks out a pair (so
    /// [`Departure::PartnerHold`], which serves those item 19 leaves out,
    /// has none left).
    PairWorth,
    /// Item 18: a clearly bursty model stops deferring once its burst has
    /// gone quiet.
    QuietStop,
    /// Item 22: a lone request whose pair is not worth the frontrun waits
    /// while a partner is likely.
    PartnerHold,
    /// Item 24: with three GPUs idle a burst-locked or held request waits
    /// only while a partner is as likely as not.
    ManyIdlePartner,
    /// Item 28: a model holding out for its pair yields while another
    /// takes the losses alone.
    YieldToLoser,
    /// Item 20: a contended GPU that the most urgent cannot spare goes to
    /// the model that has lost the most. Off: latest-start order.
    LossPriority,
    /// Item 29: a GPU the most urgent can spare goes to the model taking
    /// the losses alone.
    SpareGpuToLoser,
    /// Item 25: a grant passes a lone head over for a larger batch the
    /// next GPU could not run.
    BatchPastHeads,
    /// Item 31: a closed loop's batch goes once its clients are all back.
    FollowUps,
    /// Item 32: light load without a latency tax: with a GPU idle, a batch
    /// whose expected growth by its latest start would not raise its
    /// throughput per GPU by [`LIGHT_LOAD_GAIN`](super::LIGHT_LOAD_GAIN),
    /// or whose model's load at that batch size is at most
    /// [`LIGHT_LOAD_SHARE`](super::LIGHT_LOAD_SHARE) of a GPU, goes now.
    LightLoad,
    /// Item 33: a long runner's quiet stop (item 18) needs quiet. A model
    /// whose lone request runs longer than another model's whole SLO does
    /// not stop deferring at once where a next request before the frontrun
    /// is less likely than the test's chance even right after an arrival
    /// (heavy-tailed gaps, a long horizon): there the test says nothing
    /// about a burst, and the batches of one it starts spread the long
    /// runner's bursts over the GPUs the tight models need.
    LongRunnerQuiet,
    /// Item 34: a batch that runs longer than another model's budget (the
    /// longest one of its fresh requests can wait to start) does not take
    /// the last GPU that frees within that budget while it can still
    /// start in time on the next GPU to free: otherwise long batches on
    /// every GPU leave the tight model no GPU for a whole batch, which a
    /// plan dedicating a GPU (Nexus) avoids.
    LongBatchOffLastGpu,
}

impl Departure {
    /// Every departure, in item order of docs/decisions.md.
    pub const ALL: [Departure; 25] = [
        Departure::WindowGaps,
        Departure::EarlyDrop,
        Departure::DropShortfall,
        Departure::EfficiencyStop,
        Departure::WorkConserve,
        Departure::StopAtTarget,
        Departure::BurstLock,
        Departure::EarlyBurstTest,
        Departure::ServeUrgentPending,
        Departure::FillFloor,
        Departure::QuietStop,
        Departure::PairWorth,
        Departure::LossPriority,
        Departure::BurstWindowFloor,
        Departure::PartnerHold,
        Departure::ManyIdlePartner,
        Departure::BatchPastHeads,
        Departure::LossSpread,
        Departure::YieldToLoser,
        Departure::SpareGpuToLoser,
        Departure::ManyIdleDeferToSlo,
        Departure::FollowUps,
        Departure::LightLoad,
        Departure::LongRunnerQuiet,
        Departure::LongBatchOffLastGpu,
    ];

    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Departure::WindowGaps => "window-gaps",
            Departure::EarlyDrop => "early-drop",
            Departure::DropShortfall => "drop-shortfall",
            Departure::FillFloor => "fill-floor",
            Departure::BurstWindowFloor => "burst-window-floor",
            Departure::LossSpread => "loss-spread",
            Departure::EfficiencyStop => "efficiency-stop",
            Departure::StopAtTarget => "stop-at-target",
            Departure::ManyIdleDeferToSlo => "many-idle-defer-to-slo",
            Departure::WorkConserve => "work-conserve",
            Departure::ServeUrgentPending => "serve-urgent-pending",
            Departure::BurstLock => "burst-lock",
            Departure::EarlyBurstTest => "early-burst-test",
            Departure::PairWorth => "pair-worth",
            Departure::QuietStop => "quiet-stop",
            Departure::PartnerHold => "partner-hold",
            Departure::ManyIdlePartner => "many-idle-partner",
            Departure::YieldToLoser => "yield-to-loser",
            Departure::LossPriority => "loss-priority",
            Departure::SpareGpuToLoser => "spare-gpu-to-loser",
            Departure::BatchPastHeads => "batch-past-heads",
            Departure::FollowUps => "follow-ups",
            Departure::LightLoad => "light-load",
            Departure::LongRunnerQuiet => "long-runner-quiet",
            Departure::LongBatchOffLastGpu => "long-batch-off-last-gpu",
        }
    }

    /// The docs/decisions.md items it stands for.
    pub fn items(self) -> &'static [u8] {
        match self {
            Departure::WindowGaps => &[4],
            Departure::EarlyDrop => &[5],
            Departure::DropShortfall => &[6, 10, 11],
            Departure::FillFloor => &[16, 17],
            Departure::BurstWindowFloor => &[21],
            Departure::LossSpread => &[27],
            Departure::EfficiencyStop => &[7],
            Departure::StopAtTarget => &[11],
            Departure::ManyIdleDeferToSlo => &[30],
            Departure::WorkConserve => &[8, 10],
            Departure::ServeUrgentPending => &[15],
            Departure::BurstLock => &[12, 13],
            Departure::EarlyBurstTest => &[14],
            Departure::PairWorth => &[19],
            Departure::QuietStop => &[18],
            Departure::PartnerHold => &[22],
            Departure::ManyIdlePartner => &[24],
            Departure::YieldToLoser => &[28],
            Departure::LossPriority => &[20],
            Departure::SpareGpuToLoser => &[29],
            Departure::BatchPastHeads => &[25],
            Departure::FollowUps => &[31],
            Departure::LightLoad => &[32],
            Departure::LongRunnerQuiet => &[33],
            Departure::LongBatchOffLastGpu => &[34],
        }
    }

    /// The departure this one refines: with the parent off, this one
    /// changes nothing (the rules are only meaningful together).
    pub fn parent(self) -> Option<Departure> {
        match self {
            Departure::DropShortfall | Departure::FillFloor | Departure::BurstWindowFloor => Some(Departure::EarlyDrop),
            Departure::LossSpread => Some(Departure::DropShortfall),
            Departure::StopAtTarget => Some(Departure::EfficiencyStop),
            Departure::ManyIdleDeferToSlo => Some(Departure::StopAtTarget),
            Departure::ServeUrgentPending => Some(Departure::WorkConserve),
            Departure::EarlyBurstTest | Departure::YieldToLoser => Some(Departure::BurstLock),
            Departure::PartnerHold => Some(Departure::EfficiencyStop),
            Departure::LongRunnerQuiet => Some(Departure::QuietStop),
            _ => None,
        }
    }

    /// The departure named `name` ([`Self::name`]).
    pub fn parse(name: &str) -> Option<Departure> {
        Departure::ALL.into_iter().find(|d| d.name() == name)
    }

    fn bit(self) -> u32 {
        1 << (self as u8)
    }
}

impl fmt::Display for Departure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which departures are on: a bitset, so testing one on the hot path is a
/// mask, and the configuration stays `Copy`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct DepartureSet(u32);

impl DepartureSet {
    /// Every departure off: Algorithm 1 with Appendix D's network delay
    /// (and the structural items 1-3).
    pub const NONE: DepartureSet = DepartureSet(0);

    /// Every departure on, including those not on by default.
    pub fn all() -> DepartureSet {
        Departure::ALL.iter().fold(DepartureSet::NONE, |s, d| s.with(*d))
    }

    /// Whether `d` is on.
    #[inline]
    pub fn has(self, d: Departure) -> bool {
        self.0 & d.bit() != 0
    }

    /// This set with `d` on.
    #[must_use]
    pub fn with(self, d: Departure) -> DepartureSet {
        DepartureSet(self.0 | d.bit())
    }

    /// This set with `d` off.
    #[must_use]
    pub fn without(self, d: Departure) -> DepartureSet {
        DepartureSet(self.0 & !d.bit())
    }

    /// The departures on, in [`Departure::ALL`]'s order.
    pub fn iter(self) -> impl Iterator<Item = Departure> {
        Departure::ALL.into_iter().filter(move |d| self.has(*d))
    }
}

/// The default: every departure on but [`Departure::LightLoad`] (see
/// docs/decisions.md, item 32, for why it is not on by default).
impl Default for DepartureSet {
    fn default() -> Self {
        DepartureSet::all().without(Departure::LightLoad)
    }
}

impl fmt::Debug for DepartureSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter().map(Departure::name)).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_parse_back() {
        for d in Departure::ALL {
            assert_eq!(Departure::parse(d.name()), Some(d));
            assert_eq!(Departure::ALL.iter().filter(|e| e.name() == d.name()).count(), 1);
            assert!(!d.items().is_empty());
        }
        assert_eq!(Departure::parse("nonsense"), None);
    }

    #[test]
    fn the_default_has_every_departure_but_light_load() {
        let d = DepartureSet::default();
        assert_eq!(d.iter().count(), Departure::ALL.len() - 1);
        assert!(!d.has(Departure::LightLoad));
        assert!(DepartureSet::all().has(Departure::LightLoad));
        assert!(!DepartureSet::NONE.has(Departure::EarlyDrop));
    }

    #[test]
    fn a_parent_is_never_its_own_descendant() {
        for d in Departure::ALL {
            let mut p = d.parent();
            for _ in 0..Departure::ALL.len() {
                let Some(q) = p else { break };
                assert_ne!(q, d, "{d} is its own ancestor");
                p = q.parent();
            }
            assert!(p.is_none(), "{d}: a parent chain longer than the list");
        }
    }
}
