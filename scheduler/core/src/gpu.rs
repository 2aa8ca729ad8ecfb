//! The emulated GPUs: the one model of a GPU's timeline in the tree, used by
//! the simulator, the live runtime's emulated backends, the in-process
//! cluster and the backend's `EmulatedExecutor`.
//!
//! A [`GpuSet`] is `N` devices, each a timeline of the batches it holds. A
//! batch holds its device for exactly its profiled time `l(b)` (times the
//! device's slowdown factor, 1 unless a fault harness slowed the device
//! down), from `max(planned start, device free)`. A device may hold several
//! batches queued one after another (the simulator and the runtime accept a
//! batch planned to start when the current one ends); a caller that allows
//! one batch per device (the backend) checks [`GpuSet::is_idle`] first.
//! Finished batches leave in finish order, ties to the lower device id, so
//! every run is deterministic.
//!
//! Each batch carries a caller's tag `T` (its members, a job tag, ...),
//! handed back when the batch leaves. Storage is per device and reused:
//! once every device has held its peak number of batches, nothing allocates.

use crate::types::GpuId;
use dataplane::heap::IndexedHeap;
use dataplane::time::{Duration, Instant};
use std::collections::VecDeque;

/// When a batch holds its device: `[start, finish)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// The device starts the batch.
    pub start: Instant,
    /// The device is free of it.
    pub finish: Instant,
}

/// A batch that left its device (finished, or preempted at `finish`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completed<T> {
    /// The device.
    pub device: GpuId,
    /// When the device started it.
    pub start: Instant,
    /// When it left the device.
    pub finish: Instant,
    /// The caller's tag given at [`GpuSet::submit`].
    pub tag: T,
}

#[derive(Debug)]
struct Held<T> {
    span: Span,
    tag: T,
}

#[derive(Debug)]
struct Device<T> {
    /// Batches submitted and not yet popped, in start order. The head is
    /// running (or waiting for its start); each starts after the previous
    /// one's finish.
    held: VecDeque<Held<T>>,
    /// The finish of the last batch held; when none is held, when the
    /// device last became free.
    free_at: Instant,
    /// `l(b)` is multiplied by this; exactly 1 unless a fault slowed it.
    slowdown: f64,
}

/// Batches each device holds at first without allocating (more grow the
/// device's queue once).
const HELD_PER_DEVICE: usize = 4;

/// `N` emulated GPUs with a heap of their next finish times.
#[derive(Debug)]
pub struct GpuSet<T> {
    devices: Vec<Device<T>>,
    /// Per device holding a batch: the head batch's finish time.
    finishes: IndexedHeap<Instant>,
    held: usize,
}

impl<T> GpuSet<T> {
    /// `devices` idle GPUs, free from time zero, slowdown 1.
    pub fn new(devices: u32) -> Self {
        GpuSet {
            devices: (0..devices)
                .map(|_| Device { held: VecDeque::with_capacity(HELD_PER_DEVICE), free_at: Instant::ZERO, slowdown: 1.0 })
                .collect(),
            finishes: IndexedHeap::with_ids(devices as usize),
            held: 0,
        }
    }

    /// Number of devices.
    pub fn devices(&self) -> u32 {
        self.devices.len() as u32
    }

    /// Batches held over all devices (running or queued).
    pub fn in_flight(&self) -> usize {
        self.held
    }

    /// Multiplies every later batch's time on `device` by `factor` (the
    /// slow-GPU fault; 1 restores the profile exactly). Returns false, and
    /// changes nothing, for an unknown device or a factor that is not a
    /// positive finite number.
    pub fn set_slowdown(&mut self, device: GpuId, factor: f64) -> bool {
        match self.devices.get_mut(device as usize) {
            Some(d) if factor.is_finite() && factor > 0.0 => {
                d.slowdown = factor;
                true
            }
            _ => false,
        }
    }

    /// The slowdown factor of `device` (1 for an unknown device).
    pub fn slowdown(&self, device: GpuId) -> f64 {
        self.devices.get(device as usize).map_or(1.0, |d| d.slowdown)
    }

    /// How long `device` holds a batch whose profiled time is `l`: exactly
    /// `l` at factor 1, else `l * factor` rounded to the nanosecond.
    pub fn hold_time(&self, device: GpuId, l: Duration) -> Duration {
        let f = self.slowdown(device);
        if f == 1.0 {
            l
        } else {
            // Float-to-integer casts saturate: a huge product holds forever.
            Duration::from_nanos((l.as_nanos() as f64 * f).round() as u64)
        }
    }

    /// When `device` is free of every batch it holds (the finish of its
    /// last one); `None` for an unknown device.
    pub fn free_at(&self, device: GpuId) -> Option<Instant> {
        self.devices.get(device as usize).map(|d| d.free_at)
    }

    /// True when `device` holds no batch (false for an unknown device).
    pub fn is_idle(&self, device: GpuId) -> bool {
        self.devices.get(device as usize).is_some_and(|d| d.held.is_empty())
    }

    /// True when a batch planned to start at `planned_start` on `device`
    /// would overlap the previous batch there (it starts before that one
    /// finishes). [`GpuSet::submit`] would start it late instead; the
    /// simulator and the runtime report this as a broken invariant.
    pub fn would_overlap(&self, device: GpuId, planned_start: Instant) -> bool {
        self.free_at(device).is_some_and(|free| planned_start < free)
    }

    /// Puts a batch of profiled time `l` on `device`: it starts at
    /// `max(planned_start, free_at(device))` and holds the device for
    /// [`GpuSet::hold_time`]. Gives the tag back for an unknown device.
    pub fn submit(&mut self, device: GpuId, planned_start: Instant, l: Duration, tag: T) -> Result<Span, T> {
        let hold = self.hold_time(device, l);
        let Some(d) = self.devices.get_mut(device as usize) else { return Err(tag) };
        let start = planned_start.max(d.free_at);
        let span = Span { start, finish: start + hold };
        if d.held.is_empty() {
            self.finishes.set(device, span.finish);
        }
        d.held.push_back(Held { span, tag });
        d.free_at = span.finish;
        self.held += 1;
        Ok(span)
    }

    /// The next finish time over all devices.
    pub fn poll_at(&self) -> Option<Instant> {
        self.finishes.peek().map(|(t, _)| t)
    }

    /// Takes the earliest batch that has finished by `now` (ties to the
    /// lower device id); `None` when none has.
    pub fn pop_finished(&mut self, now: Instant) -> Option<Completed<T>> {
        let (t, device) = self.finishes.peek()?;
        if t > now {
            return None;
        }
        let d = &mut self.devices[device as usize];
        let Some(b) = d.held.pop_front() else {
            self.finishes.pop();
            return None;
        };
        // The device's next batch re-keys its entry in place (one sift)
        // instead of leaving and re-entering the heap.
        match d.held.front() {
            Some(next) => self.finishes.set(device, next.span.finish),
            None => {
                self.finishes.pop();
            }
        }
        self.held -= 1;
        Some(Completed { device, start: b.span.start, finish: b.span.finish, tag: b.tag })
    }

    /// Abandons the batch running on `device` at `now` (started, not
    /// finished), which leaves with `finish = now`. Batches queued after it
    /// keep their starts. `None` when nothing is running there.
    pub fn preempt(&mut self, device: GpuId, now: Instant) -> Option<Completed<T>> {
        let d = self.devices.get_mut(device as usize)?;
        let running = d.held.front().is_some_and(|b| b.span.start <= now && now < b.span.finish);
        if !running {
            return None;
        }
        let b = d.held.pop_front()?;
        match d.held.front() {
            Some(next) => self.finishes.set(device, next.span.finish),
            None => {
                self.finishes.remove(device);
                d.free_at = now;
            }
        }
        self.held -= 1;
        Some(Completed { device, start: b.span.start, finish: now, tag: b.tag })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ns: u64) -> Instant {
        Instant::from_nanos(ns)
    }

    #[test]
    fn a_batch_holds_its_device_for_exactly_l_from_max_of_planned_start_and_free() {
        let mut g: GpuSet<&str> = GpuSet::new(2);
        // An odd number of nanoseconds: no floating point may touch it.
        let l = Duration::from_nanos(5_072_123_457);
        assert_eq!(g.submit(1, at(1_000), l, "a"), Ok(Span { start: at(1_000), finish: at(1_000) + l }));
        assert_eq!(g.free_at(1), Some(at(1_000) + l));
        assert!(g.is_idle(0) && !g.is_idle(1) && !g.is_idle(9));
        // Planned before the device is free: starts when it frees.
        assert!(g.would_overlap(1, at(2_000)));
        assert!(!g.would_overlap(1, at(1_000) + l));
        let s = g.submit(1, at(2_000), l, "b").unwrap();
        assert_eq!(s, Span { start: at(1_000) + l, finish: at(1_000) + l + l });
        // Planned after: starts as planned.
        let s = g.submit(0, at(7), Duration::from_nanos(3), "c").unwrap();
        assert_eq!(s, Span { start: at(7), finish: at(10) });
        assert_eq!(g.submit(2, at(0), l, "unknown device"), Err("unknown device"));
        assert_eq!(g.in_flight(), 3);
    }

    #[test]
    fn slowdown_scales_only_its_device_and_one_restores_the_profile() {
        let mut g: GpuSet<()> = GpuSet::new(2);
        let l = Duration::from_nanos(1_000_001);
        assert!(g.set_slowdown(0, 2.5));
        assert!(!g.set_slowdown(0, 0.0) && !g.set_slowdown(0, f64::NAN) && !g.set_slowdown(5, 2.0));
        assert_eq!(g.slowdown(0), 2.5);
        assert_eq!(g.hold_time(0, l), Duration::from_nanos(2_500_003));
        assert_eq!(g.hold_time(1, l), l);
        assert_eq!(g.submit(0, at(0), l, ()).unwrap().finish, at(2_500_003));
        assert!(g.set_slowdown(0, 1.0));
        assert_eq!(g.hold_time(0, Duration::from_nanos(u64::MAX / 3)), Duration::from_nanos(u64::MAX / 3));
    }

    #[test]
    fn batches_leave_in_finish_order_ties_to_the_lower_device() {
        let mut g: GpuSet<u32> = GpuSet::new(3);
        let ms = Duration::from_millis;
        g.submit(2, at(0), ms(5), 20).unwrap();
        g.submit(1, at(0), ms(5), 10).unwrap();
        g.submit(0, at(0), ms(7), 0).unwrap();
        g.submit(1, at(0), ms(1), 11).unwrap(); // queued: [5, 6) ms
        assert_eq!(g.poll_at(), Some(at(0) + ms(5)));
        assert_eq!(g.pop_finished(at(0) + ms(5) - Duration::from_nanos(1)), None);
        let order: Vec<(GpuId, u32, Instant)> =
            std::iter::from_fn(|| g.pop_finished(at(0) + ms(10))).map(|c| (c.device, c.tag, c.finish)).collect();
        assert_eq!(
            order,
            vec![(1, 10, at(0) + ms(5)), (2, 20, at(0) + ms(5)), (1, 11, at(0) + ms(6)), (0, 0, at(0) + ms(7))]
        );
        assert_eq!(g.poll_at(), None);
        assert!(g.is_idle(1) && g.in_flight() == 0);
        assert_eq!(g.free_at(1), Some(at(0) + ms(6)));
    }

    #[test]
    fn preemption_frees_the_device_at_once_and_keeps_queued_batches() {
        let mut g: GpuSet<u32> = GpuSet::new(1);
        let ms = Duration::from_millis;
        g.submit(0, at(0) + ms(2), ms(10), 1).unwrap();
        // Not started yet: nothing to preempt.
        assert_eq!(g.preempt(0, at(0) + ms(1)), None);
        let p = g.preempt(0, at(0) + ms(4)).unwrap();
        assert_eq!((p.tag, p.start, p.finish), (1, at(0) + ms(2), at(0) + ms(4)));
        assert!(g.is_idle(0) && g.poll_at().is_none());
        assert_eq!(g.free_at(0), Some(at(0) + ms(4)));
        assert!(!g.would_overlap(0, at(0) + ms(4)));
        g.submit(0, at(0) + ms(4), ms(3), 2).unwrap();
        g.submit(0, at(0) + ms(7), ms(3), 3).unwrap();
        let p = g.preempt(0, at(0) + ms(5)).unwrap();
        assert_eq!(p.tag, 2);
        // The queued batch keeps its start; the device is free after it.
        assert_eq!(g.poll_at(), Some(at(0) + ms(10)));
        assert_eq!(g.free_at(0), Some(at(0) + ms(10)));
        assert_eq!(g.pop_finished(at(0) + ms(10)).map(|c| (c.tag, c.start)), Some((3, at(0) + ms(7))));
    }
}
