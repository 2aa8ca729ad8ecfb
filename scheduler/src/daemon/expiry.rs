//! When the control plane forgets a task id: a coarse time wheel over the
//! ids' deadlines, exact at the edges.
//!
//! The plane remembers every task id it took until that task's deadline
//! (its duplicate filter). A binary heap of (deadline, id) cost a sift of
//! ~17 levels per insert and per expiry at 100k ids (2 M tasks/s, 50 ms
//! SLOs): the largest single cost of a saturated daemon's I/O thread
//! (docs/benchmarks.md 10c.5). Here an insert is a push onto the bucket of
//! its deadline's time slot, and expiring walks whole buckets.
//!
//! Exactly what the heap did: [`expire`](ExpiryWheel::expire)`(now, f)`
//! reports every id whose deadline is `<= now`, and no other. Buckets
//! wholly before `now`'s slot are emptied; the bucket of `now`'s slot is
//! scanned only when its earliest deadline has passed; an id inserted with
//! its deadline already passed (as of the last call) is reported by the
//! next call; deadlines beyond the wheel's span wait in a heap.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use dataplane::time::Instant;

/// A bucket spans 2^17 ns (131 µs): about one poll of a loaded daemon,
/// so the bucket of `now` is scanned about once.
const SLOT_SHIFT: u32 = 17;
/// Buckets (a power of two): the wheel spans 4096 x 131 µs = 537 ms ahead
/// of its cursor, more than any zoo model's SLO.
const SLOTS: u64 = 4096;

/// Ids keyed by deadline, reported once their deadline has passed.
#[derive(Debug)]
pub struct ExpiryWheel {
    buckets: Vec<Vec<(Instant, u64)>>,
    /// Slot of `last_now`: buckets of earlier slots are empty.
    cursor: u64,
    /// The `now` of the last [`expire`](Self::expire).
    last_now: Instant,
    /// Earliest deadline in the cursor's bucket (None: empty).
    cursor_min: Option<Instant>,
    /// Inserted with their deadline passed as of `last_now`.
    due: Vec<u64>,
    /// Deadlines at or beyond the wheel's span when inserted.
    far: BinaryHeap<Reverse<(Instant, u64)>>,
    len: usize,
}

impl Default for ExpiryWheel {
    fn default() -> Self {
        Self::new()
    }
}

impl ExpiryWheel {
    /// An empty wheel (its buckets grow once, then are reused).
    pub fn new() -> Self {
        ExpiryWheel {
            buckets: (0..SLOTS).map(|_| Vec::new()).collect(),
            cursor: 0,
            last_now: Instant::ZERO,
            cursor_min: None,
            due: Vec::new(),
            far: BinaryHeap::new(),
            len: 0,
        }
    }

    /// Ids held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Nothing held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn slot(t: Instant) -> u64 {
        t.as_nanos() >> SLOT_SHIFT
    }

    /// Holds `id` until `deadline`.
    pub fn insert(&mut self, deadline: Instant, id: u64) {
        self.len += 1;
        if deadline <= self.last_now {
            self.due.push(id);
            return;
        }
        let slot = Self::slot(deadline);
        if slot >= self.cursor + SLOTS {
            self.far.push(Reverse((deadline, id)));
            return;
        }
        if slot == self.cursor {
            self.cursor_min = Some(self.cursor_min.map_or(deadline, |m| m.min(deadline)));
        }
        self.buckets[(slot % SLOTS) as usize].push((deadline, id));
    }

    /// Calls `forget` with every id whose deadline is `<= now` and drops
    /// it. `now` never goes back (an earlier one reports nothing more).
    pub fn expire(&mut self, now: Instant, mut forget: impl FnMut(u64)) {
        let mut gone = 0;
        for id in self.due.drain(..) {
            forget(id);
            gone += 1;
        }
        if now > self.last_now {
            self.last_now = now;
            let to = Self::slot(now);
            if to > self.cursor {
                // Whole buckets before `now`'s slot: every deadline in them
                // is before the slot's start, so before `now`. A gap longer
                // than the wheel visits each bucket once.
                let from = self.cursor.max(to.saturating_sub(SLOTS));
                for slot in from..to {
                    for (_, id) in self.buckets[(slot % SLOTS) as usize].drain(..) {
                        forget(id);
                        gone += 1;
                    }
                }
                self.cursor = to;
                self.cursor_min = self.buckets[(to % SLOTS) as usize].iter().map(|e| e.0).min();
            }
            if self.cursor_min.is_some_and(|m| m <= now) {
                let mut min = None;
                self.buckets[(to % SLOTS) as usize].retain(|&(t, id)| {
                    if t <= now {
                        forget(id);
                        gone += 1;
                        false
                    } else {
                        min = Some(min.map_or(t, |m: Instant| m.min(t)));
                        true
                    }
                });
                self.cursor_min = min;
            }
        }
        while let Some(&Reverse((t, id))) = self.far.peek() {
            if t > now {
                break;
            }
            self.far.pop();
            forget(id);
            gone += 1;
        }
        self.len -= gone;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What the plane did before: a heap popped while its top is due.
    #[derive(Default)]
    struct HeapModel {
        heap: BinaryHeap<Reverse<(Instant, u64)>>,
    }

    impl HeapModel {
        fn expire(&mut self, now: Instant) -> Vec<u64> {
            let mut out = Vec::new();
            while let Some(&Reverse((t, id))) = self.heap.peek() {
                if t > now {
                    break;
                }
                self.heap.pop();
                out.push(id);
            }
            out
        }
    }

    proptest! {
        /// Every call reports exactly the ids the heap pops (as sets).
        #[test]
        fn reports_exactly_what_a_heap_pops(ops in proptest::collection::vec((0u64..4, 0u64..2_000_000_000, 0u64..3), 1..400)) {
            let mut wheel = ExpiryWheel::new();
            let mut model = HeapModel::default();
            let mut now = Instant::ZERO;
            let mut next_id = 0u64;
            for (kind, ns, step) in ops {
                match kind {
                    // Deadlines around now: passed, in this slot, near, far.
                    0 | 1 => {
                        let deadline = match step {
                            0 => Instant::from_nanos(now.as_nanos().saturating_sub(ns % 1_000_000)),
                            1 => now + dataplane::time::Duration::from_nanos(ns % 200_000),
                            _ => now + dataplane::time::Duration::from_nanos(ns),
                        };
                        wheel.insert(deadline, next_id);
                        model.heap.push(Reverse((deadline, next_id)));
                        next_id += 1;
                    }
                    _ => {
                        now = match step {
                            0 => now,
                            1 => now + dataplane::time::Duration::from_nanos(ns % 300_000),
                            _ => now + dataplane::time::Duration::from_nanos(ns),
                        };
                        let mut got = Vec::new();
                        wheel.expire(now, |id| got.push(id));
                        let mut want = model.expire(now);
                        got.sort_unstable();
                        want.sort_unstable();
                        prop_assert_eq!(got, want);
                        prop_assert_eq!(wheel.len(), model.heap.len());
                    }
                }
            }
        }
    }

    #[test]
    fn an_id_past_due_at_insert_goes_at_the_next_call_and_a_far_one_at_its_deadline() {
        let mut w = ExpiryWheel::new();
        let t = Instant::from_nanos(1_000_000_000);
        w.expire(t, |_| panic!("empty"));
        w.insert(t, 1);
        w.insert(t + dataplane::time::Duration::from_millis(5_000), 2);
        let mut got = Vec::new();
        w.expire(t, |id| got.push(id));
        assert_eq!(got, vec![1]);
        w.expire(t + dataplane::time::Duration::from_millis(4_999), |id| got.push(id));
        assert_eq!(got, vec![1]);
        w.expire(t + dataplane::time::Duration::from_millis(5_000), |id| got.push(id));
        assert_eq!(got, vec![1, 2]);
        assert!(w.is_empty());
    }
}
