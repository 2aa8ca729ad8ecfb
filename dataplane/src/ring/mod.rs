//! A bounded, lock-free, single-producer single-consumer ring.
//!
//! [`channel`] makes a ring of `capacity` slots (rounded up to a power of
//! two) and hands back its two ends: a [`Producer`] and a [`Consumer`], each
//! movable to its own thread. This is the only way threads of the live
//! runtime talk to each other (one ring per direction per thread pair).
//!
//! # Design
//!
//! * Two monotonically increasing indices, `tail` (next slot to write, owned
//!   by the producer) and `head` (next slot to read, owned by the consumer),
//!   each on its own cache line. They wrap around `usize`; a slot is
//!   `index & mask`, and `tail - head` is the number of items in the ring.
//! * Each side keeps its own index privately and also a *cached copy* of the
//!   other side's index. The hot path reads only the private fields; it loads
//!   the other side's cache line only when the cache says "full" (producer)
//!   or "empty" (consumer). With a ring that is neither, a push or pop touches
//!   one shared line: its own index, to publish. Each end also keeps its own
//!   copy of the buffer address and mask, so the hot path reads no shared
//!   memory but the slot, and the end structs are 128-byte aligned so their
//!   constantly written fields never share a line with anything else.
//! * Publishing is a `Release` store of the owner's index; reading the other
//!   side's index is an `Acquire` load. A slot is therefore fully written
//!   before the consumer can see it, and fully read before the producer can
//!   reuse it.
//! * Batched operations ([`Producer::push_slice`], [`Producer::push_from_iter`],
//!   [`Consumer::pop_batch`], [`Consumer::pop_slice`]) publish once per batch.
//! * Items left in the ring when both ends are gone are dropped.
//!
//! Under the `loom` feature the atomics, `Arc` and `UnsafeCell` are loom's, so the
//! model tests in `dataplane/tests/loom_ring.rs` check these orderings.

mod sync;

use std::fmt;
use std::mem::MaybeUninit;
use std::ptr::NonNull;

use crossbeam_utils::CachePadded;

use sync::{Arc, AtomicBool, AtomicUsize, Ordering, UnsafeCell};

/// One slot of the buffer: initialised only while in `head..tail`.
type Slot<T> = UnsafeCell<MaybeUninit<T>>;

/// Makes a ring with room for at least `capacity` items (rounded up to the
/// next power of two, and at least 1) and returns its two ends.
///
/// The ends can move to other threads when `T: Send`.
///
/// # Panics
///
/// If the rounded capacity does not fit in `usize` or cannot be allocated.
pub fn channel<T>(capacity: usize) -> (Producer<T>, Consumer<T>) {
    let capacity = capacity
        .max(1)
        .checked_next_power_of_two()
        .expect("ring capacity overflows usize when rounded to a power of two");
    let buffer: Box<[Slot<T>]> =
        (0..capacity).map(|_| UnsafeCell::new(MaybeUninit::uninit())).collect();
    let shared = Arc::new(Shared {
        head: CachePadded::new(AtomicUsize::new(0)),
        tail: CachePadded::new(AtomicUsize::new(0)),
        abandoned: AtomicBool::new(false),
        mask: capacity - 1,
        buffer,
    });
    let slots = Slots::new(&shared);
    let producer = Producer { shared: Arc::clone(&shared), slots, tail: 0, limit: capacity };
    let consumer = Consumer { shared, slots, head: 0, cached_tail: 0 };
    (producer, consumer)
}

/// The state both ends point at.
struct Shared<T> {
    /// Index of the next slot the consumer will read. Written only by the
    /// consumer.
    head: CachePadded<AtomicUsize>,
    /// Index of the next slot the producer will write. Written only by the
    /// producer.
    tail: CachePadded<AtomicUsize>,
    /// Set by whichever end is dropped first.
    abandoned: AtomicBool,
    /// `capacity - 1`; capacity is a power of two.
    mask: usize,
    /// Slots `head..tail` (mod capacity) are initialised; the rest are not.
    buffer: Box<[Slot<T>]>,
}

// SAFETY: `Shared` hands each slot to exactly one thread at a time: slots in
// `head..tail` belong to the consumer, the rest to the producer, and ownership
// moves only through the Release/Acquire pair on `head`/`tail`. Items of type
// `T` are moved between threads, so `T: Send` is required, and nothing hands
// out shared `&T` to two threads at once, so `T: Sync` is not.
unsafe impl<T: Send> Sync for Shared<T> {}
// SAFETY: as above; moving the whole ring to another thread moves its items.
unsafe impl<T: Send> Send for Shared<T> {}

impl<T> Shared<T> {
    fn capacity(&self) -> usize {
        self.mask + 1
    }
}

/// The buffer's address and mask, copied into each end so the hot path
/// reaches slots without going through the `Arc` for read-only data.
///
/// Valid only while the `Arc<Shared<T>>` it was made from is alive; each end
/// holds both.
struct Slots<T> {
    base: NonNull<Slot<T>>,
    mask: usize,
}

impl<T> Clone for Slots<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Slots<T> {}

impl<T> Slots<T> {
    fn new(shared: &Shared<T>) -> Self {
        debug_assert_eq!(shared.buffer.len(), shared.capacity());
        Slots { base: NonNull::from(&shared.buffer[..]).cast(), mask: shared.mask }
    }

    #[inline(always)]
    fn capacity(&self) -> usize {
        self.mask + 1
    }

    /// The slot for `index` (any value; it wraps).
    #[inline(always)]
    fn get(&self, index: usize) -> &Slot<T> {
        // SAFETY: `base` points to `mask + 1` slots owned by the `Shared`
        // that the end holding `self` keeps alive, and `index & mask` is in
        // bounds. Shared access to the `UnsafeCell`s is fine; who may touch
        // the contents is governed by `head`/`tail`.
        unsafe { self.base.add(index & self.mask).as_ref() }
    }

    /// The slots `[start, start + len)` (mod capacity, `len <= capacity`)
    /// as at most two contiguous runs, for batched copies.
    #[inline(always)]
    fn runs(&self, start: usize, len: usize) -> (&[Slot<T>], &[Slot<T>]) {
        debug_assert!(len <= self.capacity());
        let first = start & self.mask;
        let until_wrap = self.capacity() - first;
        let (first_len, second_len) =
            if len <= until_wrap { (len, 0) } else { (until_wrap, len - until_wrap) };
        // SAFETY: both runs lie within the `mask + 1` live slots at `base`
        // (`first + first_len <= capacity`, `second_len < capacity`), kept
        // alive as in `get`.
        unsafe {
            (
                std::slice::from_raw_parts(self.base.add(first).as_ptr(), first_len),
                std::slice::from_raw_parts(self.base.as_ptr(), second_len),
            )
        }
    }
}

impl<T> Drop for Shared<T> {
    fn drop(&mut self) {
        if !std::mem::needs_drop::<T>() {
            return;
        }
        // Both ends are gone (this is the last `Arc`), so the indices are
        // final and no other thread touches the slots.
        let head = self.head.load(Ordering::Acquire);
        let tail = self.tail.load(Ordering::Acquire);
        let mut index = head;
        while index != tail {
            self.buffer[index & self.mask].with_mut(|slot| {
                // SAFETY: slots in `head..tail` hold initialised items that
                // nobody has read; we have exclusive access and drop each
                // once.
                unsafe { (*slot).assume_init_drop() }
            });
            index = index.wrapping_add(1);
        }
    }
}

/// The writing end of a ring. Move it to the producing thread.
///
/// Aligned to 128 bytes (two cache lines, the adjacent-line prefetch unit)
/// so its private, constantly written indices never share a line with the
/// consumer's or anything else hot.
#[repr(align(128))]
pub struct Producer<T> {
    shared: Arc<Shared<T>>,
    slots: Slots<T>,
    /// Our own index, the authoritative copy (`shared.tail` trails it only
    /// between a write and its publication).
    tail: usize,
    /// Last `head` we loaded plus the capacity: we may write up to here. The
    /// consumer may have moved further, never less far.
    limit: usize,
}

// SAFETY: the producer end only moves items into the ring (needs `T: Send`)
// and its raw slot pointer is kept valid by the `Arc` it owns; nothing in it
// is tied to the thread that made it.
unsafe impl<T: Send> Send for Producer<T> {}

impl<T> Producer<T> {
    /// Pushes `value`, or hands it back when the ring is full.
    #[inline]
    pub fn try_push(&mut self, value: T) -> Result<(), T> {
        if self.free_slots_cached() == 0 && self.refresh_head() == 0 {
            return Err(value);
        }
        self.slots.get(self.tail).with_mut(|slot| {
            // SAFETY: `tail - head < capacity`, so this slot is outside
            // `head..tail`: the consumer has finished with it (the Acquire
            // load of `head` in `refresh_head` ordered its read before this
            // write) and will not touch it until we publish.
            unsafe { (*slot).write(value) };
        });
        self.tail = self.tail.wrapping_add(1);
        self.shared.tail.store(self.tail, Ordering::Release);
        Ok(())
    }

    /// Pushes items taken from `items` until it runs out or the ring is
    /// full, publishing them once. Returns how many were pushed; the
    /// iterator is advanced only for items that found a slot.
    ///
    /// If the iterator panics, the items written so far are leaked (never
    /// published, never dropped), which is safe.
    #[inline]
    pub fn push_from_iter<I: Iterator<Item = T>>(&mut self, items: &mut I) -> usize {
        let free = match self.free_slots_cached() {
            0 => self.refresh_head(),
            n => n,
        };
        let mut pushed = 0;
        while pushed < free {
            let Some(value) = items.next() else { break };
            self.slots.get(self.tail.wrapping_add(pushed)).with_mut(|slot| {
                // SAFETY: `pushed < free`, so the slot is outside
                // `head..tail` and ours, as in `try_push`.
                unsafe { (*slot).write(value) };
            });
            pushed += 1;
        }
        if pushed > 0 {
            self.tail = self.tail.wrapping_add(pushed);
            self.shared.tail.store(self.tail, Ordering::Release);
        }
        pushed
    }

    /// Number of items that can be pushed right now (reads the consumer's
    /// index).
    pub fn free_slots(&mut self) -> usize {
        self.refresh_head()
    }

    /// Number of items in the ring as of now (reads the consumer's index).
    pub fn len(&mut self) -> usize {
        self.slots.capacity() - self.refresh_head()
    }

    /// True when no item can be pushed right now.
    pub fn is_full(&mut self) -> bool {
        self.refresh_head() == 0
    }

    /// True when the ring holds no items right now.
    pub fn is_empty(&mut self) -> bool {
        self.len() == 0
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.slots.capacity()
    }

    /// True once the [`Consumer`] has been dropped: nothing pushed from now
    /// on will ever be read.
    pub fn is_abandoned(&self) -> bool {
        self.shared.abandoned.load(Ordering::Acquire)
    }

    #[inline(always)]
    fn free_slots_cached(&self) -> usize {
        self.limit.wrapping_sub(self.tail)
    }

    /// Loads the consumer's index and returns the free slots it implies.
    #[inline]
    fn refresh_head(&mut self) -> usize {
        self.limit = self.shared.head.load(Ordering::Acquire).wrapping_add(self.slots.capacity());
        self.free_slots_cached()
    }
}

impl<T: Copy> Producer<T> {
    /// Pushes the longest prefix of `items` that fits, publishing it once.
    /// Returns how many items were pushed.
    #[inline]
    pub fn push_slice(&mut self, items: &[T]) -> usize {
        let mut free = self.free_slots_cached();
        if free < items.len() {
            free = self.refresh_head();
        }
        let n = items.len().min(free);
        if n == 0 {
            return 0;
        }
        let (first, second) = self.slots.runs(self.tail, n);
        let (src_first, src_second) = items[..n].split_at(first.len());
        // SAFETY: the `n <= free` slots from `tail` (both runs) are outside
        // `head..tail` and ours, as in `try_push`.
        unsafe {
            write_run(first, src_first);
            write_run(second, src_second);
        }
        self.tail = self.tail.wrapping_add(n);
        self.shared.tail.store(self.tail, Ordering::Release);
        n
    }
}

impl<T> Drop for Producer<T> {
    fn drop(&mut self) {
        // Release: a consumer that sees the flag also sees every push.
        self.shared.abandoned.store(true, Ordering::Release);
    }
}

impl<T> fmt::Debug for Producer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Producer")
            .field("capacity", &self.capacity())
            .field("tail", &self.tail)
            .field("limit", &self.limit)
            .finish()
    }
}

/// The reading end of a ring. Move it to the consuming thread.
///
/// Aligned like [`Producer`], for the same reason.
#[repr(align(128))]
pub struct Consumer<T> {
    shared: Arc<Shared<T>>,
    slots: Slots<T>,
    /// Our own index, the authoritative copy.
    head: usize,
    /// Last `tail` we loaded; the producer may have moved past it, never
    /// behind it.
    cached_tail: usize,
}

// SAFETY: the consumer end only moves items out of the ring (needs
// `T: Send`) and its raw slot pointer is kept valid by the `Arc` it owns.
unsafe impl<T: Send> Send for Consumer<T> {}

impl<T> Consumer<T> {
    /// Pops the oldest item, or `None` when the ring is empty.
    #[inline]
    pub fn try_pop(&mut self) -> Option<T> {
        if self.head == self.cached_tail && self.refresh_tail() == 0 {
            return None;
        }
        let value = self.slots.get(self.head).with(|slot| {
            // SAFETY: `head != tail`, so this slot is in `head..tail`: the
            // producer initialised it (the Acquire load of `tail` ordered that
            // write before this read) and will not touch it until we publish
            // a `head` past it. We move the item out exactly once because
            // `head` advances right after.
            unsafe { (*slot).assume_init_read() }
        });
        self.head = self.head.wrapping_add(1);
        self.shared.head.store(self.head, Ordering::Release);
        Some(value)
    }

    /// A reference to the oldest item without removing it.
    pub fn peek(&mut self) -> Option<&T> {
        if self.head == self.cached_tail && self.refresh_tail() == 0 {
            return None;
        }
        let ptr = self.slots.get(self.head).with(|slot| slot);
        // SAFETY: the slot is in `head..tail`, initialised and ours, as in
        // `try_pop`. The reference borrows `self` mutably, so no pop can move
        // the item out (or publish the slot back to the producer) while it
        // lives.
        Some(unsafe { (*ptr).assume_init_ref() })
    }

    /// Pops up to `max` items, oldest first, passing each to `f`, and
    /// publishes the new head once. Returns how many were popped.
    ///
    /// If `f` panics, the items already handed over stay popped (the head is
    /// published on unwind) and the rest stay in the ring.
    #[inline]
    pub fn pop_batch(&mut self, max: usize, mut f: impl FnMut(T)) -> usize {
        let mut available = self.available_cached();
        if available < max {
            available = self.refresh_tail();
        }
        let n = available.min(max);
        if n == 0 {
            return 0;
        }
        /// Publishes however far the batch got, also when `f` unwinds, so
        /// that items moved out are never dropped again by the ring.
        struct Publish<'a, T> {
            consumer: &'a mut Consumer<T>,
            popped: usize,
        }
        impl<T> Drop for Publish<'_, T> {
            fn drop(&mut self) {
                let c = &mut *self.consumer;
                c.head = c.head.wrapping_add(self.popped);
                c.shared.head.store(c.head, Ordering::Release);
            }
        }
        let mut batch = Publish { consumer: self, popped: 0 };
        while batch.popped < n {
            let index = batch.consumer.head.wrapping_add(batch.popped);
            let value = batch.consumer.slots.get(index).with(|slot| {
                // SAFETY: `popped < n <= tail - head`, so the slot is in
                // `head..tail`, initialised and ours, as in `try_pop`; it is
                // read once because `popped` advances right after.
                unsafe { (*slot).assume_init_read() }
            });
            batch.popped += 1;
            f(value);
        }
        n
    }

    /// Number of items that can be popped right now (reads the producer's
    /// index).
    pub fn len(&mut self) -> usize {
        self.refresh_tail()
    }

    /// True when the ring holds no items right now.
    pub fn is_empty(&mut self) -> bool {
        self.refresh_tail() == 0
    }

    /// Number of free slots as of now (reads the producer's index).
    pub fn free_slots(&mut self) -> usize {
        self.slots.capacity() - self.refresh_tail()
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.slots.capacity()
    }

    /// True once the [`Producer`] has been dropped: no more items will come.
    /// Items it pushed before that are still poppable, and a pop after this
    /// returned true sees all of them.
    pub fn is_abandoned(&self) -> bool {
        self.shared.abandoned.load(Ordering::Acquire)
    }

    #[inline(always)]
    fn available_cached(&self) -> usize {
        self.cached_tail.wrapping_sub(self.head)
    }

    /// Loads the producer's index and returns the items it implies.
    #[inline]
    fn refresh_tail(&mut self) -> usize {
        self.cached_tail = self.shared.tail.load(Ordering::Acquire);
        self.available_cached()
    }
}

impl<T: Copy> Consumer<T> {
    /// Pops up to `out.len()` items into the front of `out`, oldest first,
    /// publishing the new head once. Returns how many were popped.
    #[inline]
    pub fn pop_slice(&mut self, out: &mut [T]) -> usize {
        let mut available = self.available_cached();
        if available < out.len() {
            available = self.refresh_tail();
        }
        let n = out.len().min(available);
        if n == 0 {
            return 0;
        }
        let (first, second) = self.slots.runs(self.head, n);
        let (dst_first, dst_second) = out[..n].split_at_mut(first.len());
        // SAFETY: the `n <= tail - head` slots from `head` (both runs) are
        // initialised and ours, as in `try_pop`.
        unsafe {
            read_run(first, dst_first);
            read_run(second, dst_second);
        }
        self.head = self.head.wrapping_add(n);
        self.shared.head.store(self.head, Ordering::Release);
        n
    }
}

/// Copies `src` into the slots of `run` (equal lengths), one simple loop
/// per contiguous run so the optimiser can turn it into a block copy.
///
/// # Safety
///
/// The caller owns every slot of `run` (none is in `head..tail`).
#[inline(always)]
unsafe fn write_run<T: Copy>(run: &[Slot<T>], src: &[T]) {
    debug_assert_eq!(run.len(), src.len());
    for (cell, value) in run.iter().zip(src) {
        // SAFETY: the caller owns the slot; writing a `Copy` value over an
        // uninitialised slot leaks nothing.
        cell.with_mut(|slot| unsafe { (*slot).write(*value) });
    }
}

/// Copies the items in `run` into `dst` (equal lengths); see [`write_run`].
///
/// # Safety
///
/// Every slot of `run` is initialised and owned by the caller, who publishes
/// them as consumed afterwards.
#[inline(always)]
unsafe fn read_run<T: Copy>(run: &[Slot<T>], dst: &mut [T]) {
    debug_assert_eq!(run.len(), dst.len());
    for (cell, out) in run.iter().zip(dst) {
        // SAFETY: the caller guarantees the slot is initialised; `T: Copy`,
        // so reading leaves nothing to drop.
        *out = cell.with(|slot| unsafe { (*slot).assume_init_read() });
    }
}

impl<T> Drop for Consumer<T> {
    fn drop(&mut self) {
        // Release: orders our reads of slots before the producer's drop of
        // the ring, which frees whatever is left.
        self.shared.abandoned.store(true, Ordering::Release);
    }
}

impl<T> fmt::Debug for Consumer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("capacity", &self.capacity())
            .field("head", &self.head)
            .field("cached_tail", &self.cached_tail)
            .finish()
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;
    use std::rc::Rc;

    #[test]
    fn capacity_rounds_up_to_a_power_of_two() {
        assert_eq!(channel::<u8>(0).0.capacity(), 1);
        assert_eq!(channel::<u8>(1).0.capacity(), 1);
        assert_eq!(channel::<u8>(3).0.capacity(), 4);
        assert_eq!(channel::<u8>(1024).1.capacity(), 1024);
    }

    #[test]
    fn push_until_full_then_pop_in_order() {
        let (mut p, mut c) = channel(4);
        for i in 0..4 {
            assert_eq!(p.try_push(i), Ok(()));
        }
        assert_eq!(p.try_push(99), Err(99));
        assert!(p.is_full());
        assert_eq!(c.len(), 4);
        assert_eq!(c.peek(), Some(&0));
        for i in 0..4 {
            assert_eq!(c.try_pop(), Some(i));
        }
        assert_eq!(c.try_pop(), None);
        assert!(c.is_empty());
        assert_eq!(p.free_slots(), 4);
    }

    #[test]
    fn slices_wrap_around() {
        let (mut p, mut c) = channel::<u32>(8);
        let mut out = [0u32; 8];
        // Move the indices to the middle so the next batch wraps.
        assert_eq!(p.push_slice(&[1, 2, 3, 4, 5]), 5);
        assert_eq!(c.pop_slice(&mut out[..5]), 5);
        assert_eq!(p.push_slice(&[10, 11, 12, 13, 14, 15, 16, 17, 18]), 8);
        assert_eq!(c.pop_slice(&mut out), 8);
        assert_eq!(out, [10, 11, 12, 13, 14, 15, 16, 17]);
        assert_eq!(c.pop_slice(&mut out), 0);
    }

    #[test]
    fn push_from_iter_takes_only_what_fits() {
        let (mut p, mut c) = channel(4);
        let mut items = 0..10;
        assert_eq!(p.push_from_iter(&mut items), 4);
        assert_eq!(items.next(), Some(4), "the iterator was not over-advanced");
        let mut got = Vec::new();
        assert_eq!(c.pop_batch(3, |v| got.push(v)), 3);
        assert_eq!(c.pop_batch(usize::MAX, |v| got.push(v)), 1);
        assert_eq!(got, [0, 1, 2, 3]);
    }

    #[test]
    fn abandonment_is_seen_by_the_other_side() {
        let (p, c) = channel::<u8>(2);
        assert!(!p.is_abandoned());
        drop(c);
        assert!(p.is_abandoned());
        let (p, mut c) = channel::<u8>(2);
        drop(p);
        assert!(c.is_abandoned());
        assert_eq!(c.try_pop(), None);
    }

    /// Counts drops through a shared counter.
    struct DropCounter(Rc<std::cell::Cell<usize>>);
    impl Drop for DropCounter {
        fn drop(&mut self) {
            self.0.set(self.0.get() + 1);
        }
    }

    #[test]
    fn leftovers_are_dropped_exactly_once() {
        let drops = Rc::new(std::cell::Cell::new(0));
        let (mut p, mut c) = channel::<DropCounter>(4);
        for _ in 0..4 {
            assert!(p.try_push(DropCounter(drops.clone())).is_ok());
        }
        drop(c.try_pop());
        assert_eq!(drops.get(), 1);
        drop(p);
        drop(c);
        assert_eq!(drops.get(), 4);
    }

    #[test]
    fn a_panicking_batch_callback_does_not_double_drop() {
        let drops = Rc::new(std::cell::Cell::new(0));
        let (mut p, mut c) = channel::<DropCounter>(4);
        for _ in 0..4 {
            assert!(p.try_push(DropCounter(drops.clone())).is_ok());
        }
        let mut seen = 0;
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            c.pop_batch(4, |item| {
                seen += 1;
                drop(item);
                if seen == 2 {
                    panic!("callback fails on the second item");
                }
            })
        }));
        assert!(result.is_err());
        assert_eq!(drops.get(), 2);
        assert_eq!(c.len(), 2, "the two handed-over items stay popped");
        drop((p, c));
        assert_eq!(drops.get(), 4);
    }

    #[test]
    fn zero_sized_items_are_counted() {
        let (mut p, mut c) = channel::<()>(2);
        assert!(p.try_push(()).is_ok());
        assert!(p.try_push(()).is_ok());
        assert!(p.try_push(()).is_err());
        assert_eq!(c.try_pop(), Some(()));
        assert_eq!(c.len(), 1);
    }
}
