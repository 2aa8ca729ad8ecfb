//! A queue of pending deadlines, each carrying a caller's key.
//!
//! [`TimerQueue::insert`] returns a [`TimerHandle`] that cancels or
//! reschedules the timer in `O(log n)`; [`TimerQueue::pop_expired`] hands out
//! due timers earliest first, ties in insertion (or last reschedule) order.
//!
//! Timers live in a slab of slots reused through a free list; the order is an
//! [`IndexedHeap`] over slot ids. A handle carries the slot's generation, so a
//! handle to a timer that already fired or was cancelled is recognised as
//! stale even after its slot is reused. Storage grows only when more timers
//! are pending at once than ever before: with
//! [`with_capacity`](TimerQueue::with_capacity) sized for the peak, insert,
//! cancel, reschedule and pop never allocate.

use crate::heap::IndexedHeap;
use crate::time::Instant;

/// Names one inserted timer. Stale once the timer fires or is cancelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TimerHandle {
    slot: u32,
    generation: u32,
}

/// One slab entry; `key` is `Some` while the timer is pending.
#[derive(Debug)]
struct Slot<K> {
    generation: u32,
    key: Option<K>,
}

/// Pending deadlines with caller keys, earliest first.
#[derive(Debug)]
pub struct TimerQueue<K> {
    /// Pending slots ordered by `(deadline, sequence)`; the sequence number
    /// makes equal deadlines fire in the order they were set.
    order: IndexedHeap<(Instant, u64)>,
    slots: Vec<Slot<K>>,
    /// Vacant slot ids; capacity kept at least `slots.len()` so pushing here
    /// never allocates.
    free: Vec<u32>,
    next_sequence: u64,
}

impl<K> Default for TimerQueue<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K> TimerQueue<K> {
    /// An empty queue.
    pub fn new() -> Self {
        Self::with_capacity(0)
    }

    /// An empty queue that holds `capacity` pending timers without
    /// allocating.
    pub fn with_capacity(capacity: usize) -> Self {
        TimerQueue {
            order: IndexedHeap::with_ids(capacity),
            slots: Vec::with_capacity(capacity),
            free: Vec::with_capacity(capacity),
            next_sequence: 0,
        }
    }

    /// Number of pending timers.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// True when no timer is pending.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Adds a timer for `key` that expires at `deadline`.
    ///
    /// # Panics
    ///
    /// If more than `u32::MAX - 1` timers are pending at once.
    pub fn insert(&mut self, deadline: Instant, key: K) -> TimerHandle {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => self.grow(),
        };
        let entry = &mut self.slots[slot as usize];
        entry.key = Some(key);
        let handle = TimerHandle { slot, generation: entry.generation };
        let sequence = self.take_sequence();
        self.order.set(slot, (deadline, sequence));
        handle
    }

    /// Cancels a pending timer and returns its key; `None` when the handle
    /// is stale (the timer fired or was cancelled).
    pub fn cancel(&mut self, handle: TimerHandle) -> Option<K> {
        self.pending_slot(handle)?;
        self.order.remove(handle.slot);
        Some(self.vacate(handle.slot))
    }

    /// Moves a pending timer to `deadline` (it then ranks after timers
    /// already set for the same instant). Returns false when the handle is
    /// stale; the handle stays valid otherwise.
    pub fn reschedule(&mut self, handle: TimerHandle, deadline: Instant) -> bool {
        if self.pending_slot(handle).is_none() {
            return false;
        }
        let sequence = self.take_sequence();
        self.order.set(handle.slot, (deadline, sequence));
        true
    }

    /// The deadline of a pending timer, `None` when the handle is stale.
    pub fn deadline(&self, handle: TimerHandle) -> Option<Instant> {
        self.pending_slot(handle)?;
        self.order.get(handle.slot).map(|(deadline, _)| deadline)
    }

    /// The key of a pending timer, `None` when the handle is stale.
    pub fn key(&self, handle: TimerHandle) -> Option<&K> {
        self.pending_slot(handle)?.key.as_ref()
    }

    /// The earliest pending deadline.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.order.peek().map(|((deadline, _), _)| deadline)
    }

    /// Removes and returns the earliest timer if it is due (`deadline <=
    /// now`). Call in a loop to drain everything due.
    pub fn pop_expired(&mut self, now: Instant) -> Option<(Instant, K)> {
        let ((deadline, _), slot) = self.order.peek()?;
        if deadline > now {
            return None;
        }
        self.order.remove(slot);
        Some((deadline, self.vacate(slot)))
    }

    /// The slot `handle` names, if its timer is still pending.
    fn pending_slot(&self, handle: TimerHandle) -> Option<&Slot<K>> {
        self.slots
            .get(handle.slot as usize)
            .filter(|s| s.generation == handle.generation && s.key.is_some())
    }

    /// Empties `slot` (already out of `order`), making every handle to it
    /// stale, and returns its key.
    fn vacate(&mut self, slot: u32) -> K {
        let entry = &mut self.slots[slot as usize];
        entry.generation = entry.generation.wrapping_add(1);
        let key = entry.key.take().expect("a pending slot holds a key");
        self.free.push(slot);
        key
    }

    /// Adds a fresh slot; the only place (with the heap's own growth) that
    /// allocates, and only past the previous peak.
    #[cold]
    fn grow(&mut self) -> u32 {
        let slot = u32::try_from(self.slots.len())
            .ok()
            .filter(|&s| s != u32::MAX)
            .expect("more than u32::MAX - 1 pending timers");
        self.slots.push(Slot { generation: 0, key: None });
        if self.free.capacity() < self.slots.capacity() {
            self.free.reserve(self.slots.capacity() - self.free.len());
        }
        slot
    }

    fn take_sequence(&mut self) -> u64 {
        let s = self.next_sequence;
        self.next_sequence += 1;
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ns: u64) -> Instant {
        Instant::from_nanos(ns)
    }

    #[test]
    fn expires_in_deadline_order_then_insertion_order() {
        let mut q = TimerQueue::new();
        q.insert(t(30), "c");
        q.insert(t(10), "a");
        q.insert(t(30), "d");
        q.insert(t(20), "b");
        assert_eq!(q.next_deadline(), Some(t(10)));
        assert_eq!(q.pop_expired(t(5)), None);
        let mut fired = Vec::new();
        while let Some((_, k)) = q.pop_expired(t(30)) {
            fired.push(k);
        }
        assert_eq!(fired, ["a", "b", "c", "d"]);
        assert!(q.is_empty());
        assert_eq!(q.next_deadline(), None);
    }

    #[test]
    fn cancel_and_reschedule_follow_the_handle() {
        let mut q = TimerQueue::new();
        let a = q.insert(t(10), 'a');
        let b = q.insert(t(20), 'b');
        assert_eq!(q.cancel(a), Some('a'));
        assert_eq!(q.cancel(a), None, "cancel twice");
        assert!(q.reschedule(b, t(5)));
        assert_eq!(q.deadline(b), Some(t(5)));
        assert_eq!(q.key(b), Some(&'b'));
        assert_eq!(q.pop_expired(t(5)), Some((t(5), 'b')));
        assert!(!q.reschedule(b, t(50)), "fired timers cannot be rescheduled");
        assert_eq!(q.deadline(b), None);
    }

    #[test]
    fn stale_handles_do_not_touch_a_reused_slot() {
        let mut q = TimerQueue::new();
        let old = q.insert(t(1), 1u32);
        assert_eq!(q.pop_expired(t(1)), Some((t(1), 1)));
        let new = q.insert(t(2), 2u32);
        assert_ne!(old, new);
        assert_eq!(q.cancel(old), None);
        assert_eq!(q.len(), 1);
        assert_eq!(q.cancel(new), Some(2));
    }

    #[test]
    fn rescheduling_to_an_equal_deadline_moves_to_the_back() {
        let mut q = TimerQueue::new();
        let a = q.insert(t(7), 'a');
        q.insert(t(7), 'b');
        assert!(q.reschedule(a, t(7)));
        assert_eq!(q.pop_expired(t(7)), Some((t(7), 'b')));
        assert_eq!(q.pop_expired(t(7)), Some((t(7), 'a')));
    }

    #[test]
    fn thousands_of_timers_drain_sorted() {
        let mut q = TimerQueue::with_capacity(5000);
        // A fixed permutation of deadlines (multiplicative hashing).
        let handles: Vec<_> =
            (0..5000u64).map(|i| q.insert(t((i * 2_654_435_761) % 10_007), i)).collect();
        for h in handles.iter().step_by(2) {
            assert!(q.cancel(*h).is_some());
        }
        let mut last = t(0);
        let mut n = 0;
        while let Some((d, k)) = q.pop_expired(Instant::NEVER) {
            assert!(d >= last);
            assert_eq!(k % 2, 1);
            last = d;
            n += 1;
        }
        assert_eq!(n, 2500);
    }

    mod model {
        use super::*;
        use proptest::prelude::*;
        use proptest::test_runner::RngSeed;
        use std::collections::BTreeMap;

        #[derive(Clone, Debug)]
        enum Op {
            Insert(u64),
            Cancel(usize),
            Reschedule(usize, u64),
            PopExpired(u64),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                4 => (0u64..50).prop_map(Op::Insert),
                2 => any::<usize>().prop_map(Op::Cancel),
                2 => (any::<usize>(), 0u64..50).prop_map(|(i, d)| Op::Reschedule(i, d)),
                2 => (0u64..60).prop_map(Op::PopExpired),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig {
                cases: 512,
                rng_seed: RngSeed::Fixed(0x7133_5eed),
                failure_persistence: None,
                ..ProptestConfig::default()
            })]

            /// Same answers as a `BTreeMap` keyed by `(deadline, sequence)`.
            #[test]
            fn matches_a_sorted_map(ops in proptest::collection::vec(op(), 0..300)) {
                let mut q = TimerQueue::new();
                let mut model: BTreeMap<(Instant, u64), u32> = BTreeMap::new();
                // Every handle ever returned, with its model entry while pending.
                let mut handles: Vec<(TimerHandle, Option<(Instant, u64)>)> = Vec::new();
                let mut sequence = 0u64;
                let mut next_key = 0u32;
                for op in ops {
                    match op {
                        Op::Insert(d) => {
                            let h = q.insert(t(d), next_key);
                            model.insert((t(d), sequence), next_key);
                            handles.push((h, Some((t(d), sequence))));
                            sequence += 1;
                            next_key += 1;
                        }
                        Op::Cancel(i) if !handles.is_empty() => {
                            let n = handles.len();
                            let (h, entry) = &mut handles[i % n];
                            let want = entry.take().and_then(|e| model.remove(&e));
                            prop_assert_eq!(q.cancel(*h), want);
                        }
                        Op::Reschedule(i, d) if !handles.is_empty() => {
                            let n = handles.len();
                            let (h, entry) = &mut handles[i % n];
                            let pending = entry.is_some();
                            prop_assert_eq!(q.reschedule(*h, t(d)), pending);
                            if let Some(old) = entry.take() {
                                let key = model.remove(&old).expect("model entry");
                                model.insert((t(d), sequence), key);
                                *entry = Some((t(d), sequence));
                                sequence += 1;
                            }
                        }
                        Op::PopExpired(now) => loop {
                            let want = match model.first_key_value() {
                                Some((&(d, _), _)) if d <= t(now) => model.pop_first(),
                                _ => None,
                            };
                            let got = q.pop_expired(t(now));
                            prop_assert_eq!(got, want.map(|((d, _), k)| (d, k)));
                            let Some((_, key)) = got else { break };
                            handles[key as usize].1 = None;
                        },
                        _ => {}
                    }
                    prop_assert_eq!(q.len(), model.len());
                    prop_assert_eq!(q.next_deadline(), model.keys().next().map(|&(d, _)| d));
                    for (h, entry) in &handles {
                        prop_assert_eq!(q.deadline(*h), entry.map(|(d, _)| d));
                    }
                }
            }
        }
    }
}
