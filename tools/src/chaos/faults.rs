//! Fault classes and the seeded schedule of the faults that are events
//! (partitions, crashes, slow GPUs) rather than per-message chances.

use dataplane::time::{Duration, Instant};
use dataplane::transport::sim::FaultConfig;
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

/// One class of injected fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultClass {
    /// Messages and READs lost.
    Loss,
    /// Messages delivered twice.
    Dup,
    /// Messages overtaken by later ones.
    Reorder,
    /// Two nodes cut from each other for a while.
    Partition,
    /// A frontend or backend crashes and is restarted.
    Crash,
    /// A GPU runs slower than its profile.
    SlowGpu,
    /// The leading scheduler crashes (hot standbys take over).
    LeaderCrash,
    /// The leading scheduler is stopped past the failure timeout, then
    /// resumed: it must step down on its own.
    LeaderPause,
    /// The election store is unavailable for a while.
    StoreDown,
    /// The leader's heartbeats stop reaching a standby for a while.
    LeaderPartition,
    /// The routing table of several scheduler groups changes under load
    /// (issue 19): models move between the harness's scheduler (group a)
    /// and another group.
    Reroute,
    Reroute2,
    /// A backend is told to leave (SIGTERM on a scale-in: a graceful
    /// drain the scheduler agrees to) and crashes at a drawn moment,
    /// during its drain or after it left; it comes back later (a
    /// scale-out).
    Drain,
    /// A backend joins the running cluster (a scale-out) while it is cut
    /// from the scheduler or from a frontend; it leaves gracefully later,
    /// so that a run has several joins.
    Join,
    /// A GPU stalls longer than the scheduler's batch grace (a host stall,
    /// an executor far slower than its profile): a batch it starts runs
    /// a few hundred times its profile, the scheduler gives it up and
    /// learns from its late report, and the backend skips the plans it
    /// could not start before they were given up.
    Stall,
}

impl FaultClass {
    /// Every class of a single-scheduler cluster, in report order.
    pub const ALL: [FaultClass; 7] = [
        FaultClass::Loss,
        FaultClass::Dup,
        FaultClass::Reorder,
        FaultClass::Partition,
        FaultClass::Crash,
        FaultClass::SlowGpu,
        FaultClass::Stall,
    ];
    /// The failover classes: they run hot-standby schedulers.
    pub const FAILOVER: [FaultClass; 4] =
        [FaultClass::LeaderCrash, FaultClass::LeaderPause, FaultClass::StoreDown, FaultClass::LeaderPartition];

    /// The membership classes (issue 52): backends leaving and joining.
    pub const MEMBERSHIP: [FaultClass; 2] = [FaultClass::Drain, FaultClass::Join];

    /// The name used on the command line and in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            FaultClass::Loss => "loss",
            FaultClass::Dup => "dup",
            FaultClass::Reorder => "reorder",
            FaultClass::Partition => "partition",
            FaultClass::Crash => "crash",
            FaultClass::SlowGpu => "slow-gpu",
            FaultClass::LeaderCrash => "leader-crash",
            FaultClass::LeaderPause => "leader-pause",
            FaultClass::StoreDown => "store-down",
            FaultClass::LeaderPartition => "leader-partition",
            FaultClass::Reroute => "reroute",
            FaultClass::Reroute2 => "reroute2",
            FaultClass::Drain => "drain",
            FaultClass::Join => "join",
            FaultClass::Stall => "stall",
        }
    }

    fn every() -> impl Iterator<Item = FaultClass> {
        FaultClass::ALL
            .into_iter()
            .chain(FaultClass::FAILOVER)
            .chain([FaultClass::Reroute, FaultClass::Reroute2])
            .chain(FaultClass::MEMBERSHIP)
    }

    fn parse_one(s: &str) -> Option<FaultClass> {
        FaultClass::every().find(|c| c.as_str() == s)
    }
}

/// A fault class name that is not one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown fault class '{name}' (valid: all, none, {})", fault_class_names())]
pub struct UnknownFaultClass {
    /// The name given.
    pub name: String,
}

fn fault_class_names() -> String {
    FaultClass::every().map(|c| c.as_str()).collect::<Vec<_>>().join(", ")
}

/// A set of fault classes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultSet(u16);

impl FaultSet {
    /// No faults.
    pub const NONE: FaultSet = FaultSet(0);
    /// Every class of a single-scheduler cluster (`all`).
    pub const ALL: FaultSet = FaultSet(0x3f | 1 << FaultClass::Stall as u8);
    /// Every failover class (`failover`).
    pub const FAILOVER: FaultSet = FaultSet(0x3c0);

    /// Whether any failover class is in the set (the cluster then runs
    /// hot-standby schedulers).
    pub fn failover(self) -> bool {
        self.0 & FaultSet::FAILOVER.0 != 0
    }

    /// Only `c`.
    pub fn only(c: FaultClass) -> FaultSet {
        FaultSet(1 << c as u8)
    }

    /// Whether `c` is in the set.
    pub fn has(self, c: FaultClass) -> bool {
        self.0 & (1 << c as u8) != 0
    }

    /// Parses `all`, `none` or a comma-separated list of class names.
    pub fn parse(s: &str) -> Result<FaultSet, UnknownFaultClass> {
        match s {
            "all" => return Ok(FaultSet::ALL),
            "none" => return Ok(FaultSet::NONE),
            "failover" => return Ok(FaultSet::FAILOVER),
            _ => {}
        }
        let mut set = FaultSet::NONE;
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let c = FaultClass::parse_one(part).ok_or_else(|| UnknownFaultClass { name: part.to_string() })?;
            set.0 |= 1 << c as u8;
        }
        Ok(set)
    }

    /// The names of the classes in the set, comma-separated.
    pub fn names(self) -> String {
        let v: Vec<_> = FaultClass::every().filter(|c| self.has(*c)).map(|c| c.as_str()).collect();
        if v.is_empty() {
            "none".into()
        } else {
            v.join(",")
        }
    }
}

/// A node of the cluster, by role and index (not by network id: a
/// restarted node keeps its index and gets a new network id).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The scheduler.
    Scheduler,
    /// Frontend `i`.
    Frontend(usize),
    /// Backend `i`.
    Backend(usize),
}

/// A fault that happens at an instant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Event {
    /// Cut `a` from `b` until `until`.
    Partition { a: Target, b: Target, until: Instant },
    /// Crash a node; it restarts at `restart_at`.
    Crash { node: Target, restart_at: Instant },
    /// GPU `gpu` of backend `backend` runs `factor` times slower until `until`.
    SlowGpu { backend: usize, gpu: u32, factor: f64, until: Instant },
    /// The leading scheduler crashes.
    LeaderCrash,
    /// The leading scheduler is stopped until `until`.
    LeaderPause { until: Instant },
    /// The election store is unavailable until `until`.
    StoreDown { until: Instant },
    /// The leader's heartbeats miss a standby until `until`.
    LeaderPartition { until: Instant },
    /// A new routing-table revision: the harness's scheduler (group a)
    /// owns the models whose bit is set in `owned`, another group the rest.
    Reroute { owned: u64 },
    /// Backend `backend` is told to leave gracefully; it crashes at
    /// `crash_at` if it is still up then (the same instance), and once
    /// down (drained or crashed) it comes back at `rejoin_at` (never: it
    /// stays down until a [`Event::Join`]).
    Drain { backend: usize, crash_at: Option<Instant>, rejoin_at: Option<Instant> },
    /// Backend `backend`, held down, starts now and is cut from `peer`
    /// until `until`.
    Join { backend: usize, peer: Target, until: Instant },
}

/// The per-message fault probabilities of `set`.
pub fn message_faults(set: FaultSet, active_from: Instant) -> FaultConfig {
    let mut cfg = FaultConfig { active_from, ..FaultConfig::default() };
    if set.has(FaultClass::Loss) {
        cfg.loss = 0.002;
    }
    if set.has(FaultClass::Dup) {
        cfg.duplicate = 0.01;
    }
    if set.has(FaultClass::Reorder) {
        cfg.reorder = 0.02;
    }
    cfg
}

/// How much slower than its profile a stalled GPU runs a batch it starts
/// during the stall: every batch of 5 ms or more overruns its planned
/// finish by more than the scheduler's 1 s grace.
pub const STALL_FACTOR: f64 = 201.0;

/// The seeded schedule of event faults between `start` and `end`, sorted
/// by time: about one event of each enabled class per second of run (at
/// least one each).
pub fn schedule(set: FaultSet, seed: u64, start: Instant, end: Instant, frontends: usize, backends: usize, gpus: u32) -> Vec<(Instant, Event)> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed ^ 0x6661_756c_7473);
    let span = end.saturating_since(start).as_nanos().max(1);
    let per_class = (span / 1_000_000_000).max(1);
    let at = |rng: &mut Xoshiro256PlusPlus| start + Duration::from_nanos(rng.random_range(0..span));
    let mut events = Vec::new();
    let nodes = |rng: &mut Xoshiro256PlusPlus| -> Target {
        let k = rng.random_range(0..(1 + frontends + backends));
        if k == 0 {
            Target::Scheduler
        } else if k <= frontends {
            Target::Frontend(k - 1)
        } else {
            Target::Backend(k - 1 - frontends)
        }
    };
    for _ in 0..per_class {
        if set.has(FaultClass::Partition) {
            let t = at(&mut rng);
            let a = nodes(&mut rng);
            let mut b = nodes(&mut rng);
            while b == a {
                b = nodes(&mut rng);
            }
            // Short cuts (under the 1 s liveness bound) and long ones (past it).
            let len = Duration::from_millis(rng.random_range(50..1500));
            events.push((t, Event::Partition { a, b, until: t + len }));
        }
        if set.has(FaultClass::Crash) && frontends + backends > 0 {
            let t = at(&mut rng);
            let k = rng.random_range(0..(frontends + backends));
            let node = if k < frontends { Target::Frontend(k) } else { Target::Backend(k - frontends) };
            let down = Duration::from_millis(rng.random_range(20..500));
            events.push((t, Event::Crash { node, restart_at: t + down }));
        }
        if set.has(FaultClass::SlowGpu) && backends > 0 && gpus > 0 {
            let t = at(&mut rng);
            let backend = rng.random_range(0..backends);
            let gpu = rng.random_range(0..gpus);
            let factor = 1.0 + rng.random_range(0.2..1.5);
            let len = Duration::from_millis(rng.random_range(200..2000));
            events.push((t, Event::SlowGpu { backend, gpu, factor, until: t + len }));
        }
        // Drawn after the classes above: their schedules do not change.
        if set.has(FaultClass::LeaderCrash) {
            events.push((at(&mut rng), Event::LeaderCrash));
        }
        if set.has(FaultClass::LeaderPause) {
            let t = at(&mut rng);
            // Past the failure timeout; some past the peers' liveness bound.
            let len = Duration::from_millis(rng.random_range(150..1300));
            events.push((t, Event::LeaderPause { until: t + len }));
        }
        if set.has(FaultClass::StoreDown) {
            let t = at(&mut rng);
            // Some shorter than the lease (the leader keeps leading), some longer.
            let len = Duration::from_millis(rng.random_range(50..800));
            events.push((t, Event::StoreDown { until: t + len }));
        }
        if set.has(FaultClass::LeaderPartition) {
            let t = at(&mut rng);
            let len = Duration::from_millis(rng.random_range(150..1000));
            events.push((t, Event::LeaderPartition { until: t + len }));
        }
        // Several changes a second, some taking models away, some giving
        // them back (the model count is not known here: 64 random bits).
        if set.has(FaultClass::Reroute) || set.has(FaultClass::Reroute2) {
            for _ in 0..4 {
                events.push((at(&mut rng), Event::Reroute { owned: rng.random() }));
            }
        }
    }
    membership(set, &mut rng, &at, (frontends, backends), per_class, &mut events);
    // Drawn last: the schedules above do not change.
    if set.has(FaultClass::Stall) && backends > 0 && gpus > 0 {
        for _ in 0..per_class {
            let t = at(&mut rng);
            let backend = rng.random_range(0..backends);
            let gpu = rng.random_range(0..gpus);
            let len = Duration::from_millis(rng.random_range(1100..2500));
            events.push((t, Event::SlowGpu { backend, gpu, factor: STALL_FACTOR, until: t + len }));
        }
    }
    events.sort_by_key(|e| e.0);
    events
}

/// The backend slot the `join` class holds down from the start and joins.
pub fn join_slot(backends: usize) -> usize {
    backends.saturating_sub(1)
}

/// The membership classes' events (drawn after every other class, so
/// their schedules do not change): per second of run, a drain of a drawn
/// backend that crashes 0-12 ms later (a drain lasts about as long as the
/// batches planned to it, a few ms at half load: some crashes land in it,
/// some after the leave)
/// and comes back 100-400 ms after that; a join of [`join_slot`] cut from
/// the scheduler or a frontend for 20-600 ms, which leaves gracefully
/// 300-900 ms later.
fn membership(
    set: FaultSet,
    rng: &mut Xoshiro256PlusPlus,
    at: &dyn Fn(&mut Xoshiro256PlusPlus) -> Instant,
    (frontends, backends): (usize, usize),
    per_class: u64,
    events: &mut Vec<(Instant, Event)>,
) {
    if backends < 2 {
        return;
    }
    for _ in 0..per_class {
        if set.has(FaultClass::Drain) {
            let t = at(rng);
            let backend = rng.random_range(0..backends);
            let crash_at = t + Duration::from_micros(rng.random_range(0..12_000));
            let rejoin_at = crash_at + Duration::from_millis(rng.random_range(100..400));
            events.push((t, Event::Drain { backend, crash_at: Some(crash_at), rejoin_at: Some(rejoin_at) }));
        }
        if set.has(FaultClass::Join) {
            let t = at(rng);
            let k = rng.random_range(0..=frontends);
            let peer = if k == 0 { Target::Scheduler } else { Target::Frontend(k - 1) };
            let until = t + Duration::from_millis(rng.random_range(20..600));
            let backend = join_slot(backends);
            events.push((t, Event::Join { backend, peer, until }));
            let leave = t + Duration::from_millis(rng.random_range(300..900));
            events.push((leave, Event::Drain { backend, crash_at: None, rejoin_at: None }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sets_and_names_valid_values_on_error() {
        assert_eq!(FaultSet::parse("all").unwrap(), FaultSet::ALL);
        let s = FaultSet::parse("loss,slow-gpu").unwrap();
        assert!(s.has(FaultClass::Loss) && s.has(FaultClass::SlowGpu) && !s.has(FaultClass::Dup));
        assert_eq!(s.names(), "loss,slow-gpu");
        let e = FaultSet::parse("loss,bogus").unwrap_err().to_string();
        assert!(e.contains("bogus") && e.contains("partition"), "{e}");
    }

    #[test]
    fn schedule_is_seeded_sorted_and_covers_each_class() {
        let (s, e) = (Instant::ZERO + Duration::from_millis(100), Instant::ZERO + Duration::from_millis(3000));
        let a = schedule(FaultSet::ALL, 7, s, e, 3, 4, 1);
        assert_eq!(a, schedule(FaultSet::ALL, 7, s, e, 3, 4, 1));
        assert!(a.windows(2).all(|w| w[0].0 <= w[1].0));
        // Partition, crash, slow-gpu and stall are events (loss, dup,
        // reorder are per-message chances): one of each per whole second
        // of the span.
        assert_eq!(a.len(), 4 * 2);
        assert!(a.iter().all(|(t, _)| *t >= s && *t < e));
        // Stalls are drawn last: the other classes' events did not move.
        // Each outlasts the scheduler's 1 s grace.
        let without = schedule(FaultSet(FaultSet::ALL.0 & !(1 << FaultClass::Stall as u8)), 7, s, e, 3, 4, 1);
        assert!(without.iter().all(|ev| a.contains(ev)) && a.len() == without.len() + 2);
        let stalls: Vec<_> = a.iter().filter(|ev| !without.contains(ev)).collect();
        assert!(
            stalls.iter().all(|(t, ev)| matches!(ev, Event::SlowGpu { until, factor, .. } if *until >= *t + Duration::from_millis(1100) && *factor == STALL_FACTOR)),
            "{stalls:?}"
        );
    }
}
