//! One wake-up per consuming process instead of one per ring: the
//! doorbell. A process that consumes many rings (the scheduler daemon: one
//! per frontend and backend link) keeps, in its registry head, a pending
//! bitmap (one bit per ring it consumes, [`BELL_BITS`] at most) and ONE
//! sleep word; one eventfd, passed to each peer at the handshake, wakes it.
//!
//! Producer, after publishing into a ring whose consumer subscribed (the
//! ring's `parked` word carries `BELL`): sets its ring's pending bit, a
//! `SeqCst` fence, and, only if the sleep word says [`PARKED`], moves it to
//! [`WOKEN`] and writes the eventfd once ([`Ringer::ring`]). Consumer,
//! before it sleeps: the sleep word to [`PARKED`], a `SeqCst` fence, and a
//! re-check of the bitmap ([`arm`]); awake, it swaps the bitmap's words
//! with zero and visits only the flagged rings ([`take_pending`]).
//!
//! No lost wake-up: the producer's fence comes after its bit, the
//! consumer's after its sleep word, so one of the two fences is first in
//! the single total order of `SeqCst` fences: if the consumer's, the
//! producer's load of the sleep word sees [`PARKED`] and it writes the
//! eventfd; if the producer's, the consumer's re-check sees the bit and it
//! does not sleep. No stranded message either: the bit is set by a
//! read-modify-write after the ring's tail was published, and the
//! consumer's swap (`Acquire`) reads that write or a later one, so the
//! visit it triggers sees the bytes; a bit set after the swap stays set
//! for the next one. `shm_ring::loom_model` checks this with two producers
//! and one consumer.
//!
//! Hostile peers: every peer of the consumer maps this page read-write (as
//! the registry's liveness words), so a peer can set any bit (the consumer
//! visits a ring it knows, or ignores the bit: the bitmap is a fixed array,
//! no index comes from it) or garble the sleep word (the consumer then
//! sleeps until its own timer, as with a peer that never writes; the
//! consumer's loops re-check their rings at least every 100 ms). Nothing a
//! peer writes here makes either side touch memory outside the mapping or
//! loop without bound.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use memmap2::MmapRaw;

use super::{Padded, Word, AWAKE, PARKED, WOKEN};

/// Rings one doorbell serves (bits of the pending bitmap).
pub(crate) const BELL_BITS: usize = 1024;
/// Words of the pending bitmap.
pub(crate) const BELL_WORDS: usize = BELL_BITS / 64;

/// The doorbell's shared words: the sleep word and the pending bitmap,
/// each on its own cache lines.
#[repr(C)]
pub(crate) struct Bell<W64, W32> {
    pub(crate) sleep: Padded<W32>,
    pub(crate) pending: Padded<[W64; BELL_WORDS]>,
}

/// The doorbell as it lies in shared memory.
pub(crate) type SharedBell = Bell<AtomicU64, AtomicU32>;

/// Where a doorbell lives and how its consumer is woken: the registry head
/// and the eventfd in production, loom's atomics and a modelled socket in
/// the model check.
pub(crate) trait BellMemory {
    type W64: Word<u64>;
    type W32: Word<u32>;

    fn bell(&self) -> &Bell<Self::W64, Self::W32>;

    /// A `SeqCst` fence in the model the atomics belong to.
    fn fence_seq_cst(&self);

    /// Wakes the consumer (one eventfd write; never blocks).
    fn signal(&self);
}

/// A producer's handle on its consumer's doorbell: the memory and the bit
/// of the ring it writes (checked below [`BELL_BITS`] when made).
pub(crate) struct Ringer<B: BellMemory> {
    memory: B,
    word: usize,
    mask: u64,
}

impl<B: BellMemory> Ringer<B> {
    /// The handle for ring `bit`; None if the bit is out of range (the
    /// peer named it: the ring then wakes through its socket only).
    pub(crate) fn new(memory: B, bit: u32) -> Option<Self> {
        let bit = bit as usize;
        (bit < BELL_BITS).then(|| Ringer { memory, word: bit / 64, mask: 1 << (bit % 64) })
    }

    /// Called after a publish into the ring: flags it and wakes the
    /// consumer if it sleeps (the module docs give the argument). Returns
    /// whether it woke it.
    pub(crate) fn ring(&self) -> bool {
        let bell = self.memory.bell();
        bell.pending.0[self.word].fetch_or(self.mask, Ordering::AcqRel);
        // Pairs with the fence in `arm`.
        self.memory.fence_seq_cst();
        let sleep = &bell.sleep.0;
        let wake = sleep.load(Ordering::Relaxed) == PARKED
            && sleep.compare_exchange(PARKED, WOKEN, Ordering::SeqCst, Ordering::Relaxed).is_ok();
        if wake {
            self.memory.signal();
        }
        wake
    }
}

/// Consumer: declares that it is about to sleep on the eventfd; false if
/// a ring was flagged meanwhile (then do not sleep). A pending
/// [`WOKEN`] is overwritten: its eventfd write keeps the fd readable.
pub(crate) fn arm<B: BellMemory>(memory: &B) -> bool {
    let bell = memory.bell();
    bell.sleep.0.store(PARKED, Ordering::Relaxed);
    // Pairs with the fence in `Ringer::ring`.
    memory.fence_seq_cst();
    bell.pending.0.iter().all(|w| w.load(Ordering::Relaxed) == 0)
}

/// Consumer, awake again: producers need not wake it any more.
pub(crate) fn disarm<B: BellMemory>(memory: &B) {
    memory.bell().sleep.0.store(AWAKE, Ordering::Relaxed);
}

/// Consumer: clears the bitmap and calls `flagged` with each ring bit that
/// was set (each below [`BELL_BITS`]). Returns how many.
pub(crate) fn take_pending<B: BellMemory>(memory: &B, mut flagged: impl FnMut(u32)) -> usize {
    let mut n = 0;
    for (i, w) in memory.bell().pending.0.iter().enumerate() {
        if w.load(Ordering::Relaxed) == 0 {
            continue;
        }
        // Acquire: the producers' tails published before their bits.
        let mut bits = w.swap(0, Ordering::Acquire);
        while bits != 0 {
            flagged((i * 64) as u32 + bits.trailing_zeros());
            bits &= bits - 1;
            n += 1;
        }
    }
    n
}

/// A doorbell in a shared mapping (the consumer's registry head) and the
/// consumer's eventfd: either side's view.
pub(crate) struct BellMap {
    map: MmapRaw,
    offset: usize,
    fd: Arc<OwnedFd>,
}

// SAFETY: the mapping is shared memory reached only through atomics; the
// eventfd is only written.
unsafe impl Send for BellMap {}
// SAFETY: as for Send: every access is atomic or a system call.
unsafe impl Sync for BellMap {}

impl BellMap {
    /// The doorbell at `offset` in `map`; None if it does not lie inside
    /// the mapping, aligned.
    pub(crate) fn new(map: MmapRaw, offset: usize, fd: Arc<OwnedFd>) -> Option<Self> {
        let fits = offset.is_multiple_of(std::mem::align_of::<SharedBell>())
            && offset.checked_add(std::mem::size_of::<SharedBell>()).is_some_and(|end| end <= map.len());
        fits.then_some(BellMap { map, offset, fd })
    }

    /// The eventfd that wakes the consumer.
    pub(crate) fn fd(&self) -> &Arc<OwnedFd> {
        &self.fd
    }
}

impl BellMemory for BellMap {
    type W64 = AtomicU64;
    type W32 = AtomicU32;

    #[inline]
    fn bell(&self) -> &SharedBell {
        // SAFETY: `offset` is aligned and the bell lies inside the mapping
        // (checked in `new`; mappings are page aligned), which lives as
        // long as `self`; every field is an atomic, valid for any bytes.
        unsafe { &*(self.map.as_ptr().add(self.offset) as *const SharedBell) }
    }

    #[inline]
    fn fence_seq_cst(&self) {
        fence(Ordering::SeqCst);
    }

    fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to the eventfd (set
        // nonblocking when received: a full counter fails, never blocks).
        let _ = unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
}
