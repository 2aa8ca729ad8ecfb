//! The one event order of a run on a virtual clock, shared by the
//! simulator, the runtime's lockstep driver and any harness that must make
//! the same decisions.

use dataplane::time::Instant;

/// The kind of the next event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A GPU finished a batch.
    GpuDone,
    /// A scheduling timer is due.
    Wake,
    /// A request arrives.
    Arrival,
}

/// The next event: the earliest of the next GPU completion, scheduling
/// wake-up and arrival. At equal times a GPU completion comes first (the
/// policy knows the GPU is free before it decides), then the wake-up (timers
/// due now fire before new work arrives), then the arrival. `None` when
/// nothing is left.
#[inline]
pub fn next_event(t_done: Option<Instant>, t_wake: Option<Instant>, t_arrival: Option<Instant>) -> Option<(Instant, Event)> {
    // Taken in priority order, a later kind only when strictly earlier:
    // the same answer as the minimum with the tie rule above, without
    // building and scanning an array on every event.
    let mut next = t_done.map(|t| (t, Event::GpuDone));
    for (t, event) in [(t_wake, Event::Wake), (t_arrival, Event::Arrival)] {
        if let Some(t) = t {
            if next.is_none_or(|(best, _)| t < best) {
                next = Some((t, event));
            }
        }
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earliest_first_then_done_wake_arrival_at_equal_times() {
        let t = |n| Some(Instant::from_nanos(n));
        assert_eq!(next_event(None, None, None), None);
        assert_eq!(next_event(t(5), t(5), t(5)), Some((Instant::from_nanos(5), Event::GpuDone)));
        assert_eq!(next_event(t(6), t(5), t(5)), Some((Instant::from_nanos(5), Event::Wake)));
        assert_eq!(next_event(None, t(6), t(5)), Some((Instant::from_nanos(5), Event::Arrival)));
        assert_eq!(next_event(t(3), None, t(5)), Some((Instant::from_nanos(3), Event::GpuDone)));
    }
}
