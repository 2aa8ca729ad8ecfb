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
            Duration::from_secs_f64(l.as_secs_f64() * f)
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
        self.finishes.pop();
        let d = &mut self.devices[device as usize];
        let b = d.held.pop_front()?;
        if let Some(next) = d.held.front() {
            self.finishes.set(device, next.span.finish);
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
