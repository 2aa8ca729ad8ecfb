//! Single-producer single-consumer byte rings in shared memory: the shm
//! transport's control messages cross the host through them, without a
//! system call while both sides are busy.
//!
//! A ring lives in its own shared-memory file, created by its producer:
//! one header page (magic, capacity, and three separately padded words:
//! `tail`, written by the producer; `head`, written by the consumer;
//! `parked`, the consumer's sleep flag) followed by `capacity` data bytes
//! (a power of two). `tail` and `head` count bytes since the start and wrap
//! around `u64`; `tail - head` bytes are readable. As in rtrb (the
//! in-process ring, `crate::spsc`), each side keeps its own index
//! privately plus a cached copy of the other's, publishes with a `Release` store and reads the
//! other's index with an `Acquire` load only when its cache shows less
//! room (producer) or fewer bytes (consumer) than the call wants.
//!
//! The other side is another process: every index read from the header is
//! checked (`tail - head <= capacity`), a violation is reported as
//! [`Corrupt`] (the caller drops the link), and data positions are masked
//! by our own copy of the capacity, so a peer can garble bytes (the framing
//! checks them) but never make us touch memory outside the mapping.
//!
//! Wake-ups (the socket beside the ring carries them): a consumer about to
//! sleep sets `parked` to [`PARKED`] and re-checks the ring (a `SeqCst`
//! fence between, [`RingConsumer::arm`]); a producer that published sees it
//! after its own fence, moves it to [`WOKEN`] and writes one byte to the
//! socket ([`RingProducer::write`] tells it to). Either the consumer sees
//! the bytes in its re-check or the producer sees the flag: a message is
//! never stranded behind a sleep. While the consumer is busy the flag is
//! clear and publishing costs no system call.
//!
//! A consumer of many rings subscribes them to its process's doorbell
//! instead ([`doorbell`]): one pending bitmap and one sleep word for all,
//! so that one wake-up of the consumer costs one eventfd write and read,
//! not a byte through each ring's socket. A subscribed ring's `parked`
//! word carries the `BELL` flag; the producer checks it after the same
//! fence and rings the doorbell. The per-ring sleep keeps working beside
//! it (a connection's own `wait`), and a producer without the consumer's
//! doorbell (none passed) leaves the flag alone.
//!
//! The protocol (everything below [`RingMemory`]) is generic over where the
//! header and data live: the shared mapping ([`RingMap`]) in production,
//! and under the `loom` feature loom's atomics and cells, so that
//! `shm_ring::loom_model` model-checks this very code (every interleaving
//! of two threads, every byte access checked for a race, a lost wake-up
//! shows as a deadlock).

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use memmap2::MmapRaw;

pub(crate) mod doorbell;
#[cfg(all(test, feature = "loom"))]
mod loom_model;

pub(crate) use doorbell::{BellMap, BellMemory, Ringer};

/// Header bytes before the data (one page keeps the data page aligned).
pub(crate) const RING_HEADER_LEN: usize = 4096;
/// Smallest and largest data capacity accepted.
pub(crate) const MIN_RING_BYTES: usize = 4096;
pub(crate) const MAX_RING_BYTES: usize = 1 << 30;
const RING_MAGIC: u64 = u64::from_le_bytes(*b"SYMRING1");

/// `parked` (low bits): the consumer is awake (or has not said it sleeps).
const AWAKE: u32 = 0;
/// `parked`: the consumer is about to sleep on the socket.
const PARKED: u32 = 1;
/// `parked`: a producer saw [`PARKED`] and wrote (or is writing) a wake byte.
const WOKEN: u32 = 2;
/// The low bits of `parked` that hold the state above.
const STATE: u32 = 3;
/// `parked` flag: the consumer takes this ring's input through its
/// process's doorbell (see [`doorbell`]): after each publish the producer
/// rings it. Set once by the consumer ([`HeaderView::subscribe`]), kept
/// through the state changes above.
const BELL: u32 = 4;

/// An atomic header word, with the operations the protocol uses: std's
/// atomics in shared memory, loom's in the model check.
pub(crate) trait Word<V> {
    fn load(&self, order: Ordering) -> V;
    fn store(&self, value: V, order: Ordering);
    fn compare_exchange(&self, current: V, new: V, success: Ordering, failure: Ordering) -> Result<V, V>;
    fn swap(&self, value: V, order: Ordering) -> V;
    fn fetch_or(&self, value: V, order: Ordering) -> V;
}

/// Implements [`Word`] for an atomic type by calling its own methods.
macro_rules! impl_word {
    ($atomic:ty, $value:ty) => {
        impl Word<$value> for $atomic {
            #[inline(always)]
            fn load(&self, order: Ordering) -> $value {
                <$atomic>::load(self, order)
            }
            #[inline(always)]
            fn store(&self, value: $value, order: Ordering) {
                <$atomic>::store(self, value, order)
            }
            #[inline(always)]
            fn compare_exchange(
                &self,
                current: $value,
                new: $value,
                success: Ordering,
                failure: Ordering,
            ) -> Result<$value, $value> {
                <$atomic>::compare_exchange(self, current, new, success, failure)
            }
            #[inline(always)]
            fn swap(&self, value: $value, order: Ordering) -> $value {
                <$atomic>::swap(self, value, order)
            }
            #[inline(always)]
            fn fetch_or(&self, value: $value, order: Ordering) -> $value {
                <$atomic>::fetch_or(self, value, order)
            }
        }
    };
}
// Path-addressable for the loom model, which implements `Word` for loom's atomics.
#[cfg(all(test, feature = "loom"))]
use impl_word;

impl_word!(AtomicU64, u64);
impl_word!(AtomicU32, u32);

/// One word alone on its (prefetch pair of) cache lines.
#[repr(C, align(128))]
pub(crate) struct Padded<T>(pub(crate) T);

/// The header page's layout, over its atomic word types.
#[repr(C)]
pub(crate) struct Header<W64, W32> {
    magic: W64,
    capacity: W64,
    tail: Padded<W64>,
    head: Padded<W64>,
    parked: Padded<W32>,
}

/// The header as it lies in shared memory (all atomics: shared between
/// processes).
type SharedHeader = Header<AtomicU64, AtomicU32>;

const _: () = assert!(std::mem::size_of::<SharedHeader>() <= RING_HEADER_LEN);

/// Where a ring's header and data bytes live, and the memory model their
/// accesses follow.
pub(crate) trait RingMemory {
    type W64: Word<u64>;
    type W32: Word<u32>;

    fn header(&self) -> &Header<Self::W64, Self::W32>;

    /// Our own copy of the data capacity, a power of two (never re-read
    /// from shared memory).
    fn capacity(&self) -> u64;

    /// A `SeqCst` fence in the model the atomics belong to.
    fn fence_seq_cst(&self);

    /// Copies `src` into the data area from byte `at`.
    ///
    /// # Safety
    /// `at + src.len() <= capacity()`, and the protocol gives those bytes
    /// to the producer (the consumer is done with them).
    unsafe fn write_data(&self, at: usize, src: &[u8]);

    /// Copies `len` data bytes from byte `at` to `dst`.
    ///
    /// # Safety
    /// `at + len <= capacity()`; `dst` is valid for `len` writes and does
    /// not overlap the data area; the protocol gives those bytes to the
    /// consumer (published by the producer).
    unsafe fn read_data(&self, at: usize, dst: *mut u8, len: usize);
}

/// The peer broke the ring's invariants (indices out of range, bad header):
/// the link is dead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Corrupt;

/// A ring in a shared-memory mapping (either side's view).
pub(crate) struct RingMap {
    map: MmapRaw,
    /// Our own copy of the capacity (never re-read from shared memory).
    cap: u64,
}

// SAFETY: the mapping is plain shared memory reached only through atomics
// (header) and bounds-checked copies (data); each end is used by one thread
// at a time.
unsafe impl Send for RingMap {}

impl RingMap {
    /// Checks a mapping's header and length; `cap` from the header.
    fn checked(map: MmapRaw) -> Result<Self, Corrupt> {
        if map.len() < RING_HEADER_LEN {
            return Err(Corrupt);
        }
        let mut m = RingMap { map, cap: 0 };
        let h = m.header();
        let cap = h.capacity.load(Ordering::Acquire);
        if h.magic.load(Ordering::Acquire) != RING_MAGIC || !m.fits(cap) {
            return Err(Corrupt);
        }
        m.cap = cap;
        Ok(m)
    }

    /// Whether `cap` is a capacity in range and the mapping holds exactly
    /// the header and `cap` data bytes.
    fn fits(&self, cap: u64) -> bool {
        cap.is_power_of_two()
            && (cap as usize) >= MIN_RING_BYTES
            && (cap as usize) <= MAX_RING_BYTES
            && self.map.len() == RING_HEADER_LEN + cap as usize
    }

    fn data(&self) -> *mut u8 {
        // SAFETY: the data area starts right after the header page, inside
        // the mapping (its length was checked to be header + cap).
        unsafe { self.map.as_mut_ptr().add(RING_HEADER_LEN) }
    }
}

impl RingMemory for RingMap {
    type W64 = AtomicU64;
    type W32 = AtomicU32;

    #[inline]
    fn header(&self) -> &SharedHeader {
        // SAFETY: the mapping is at least RING_HEADER_LEN bytes (checked
        // before a RingMap is made), page aligned, lives as long as `self`,
        // and every field of the header is an atomic for which any bytes
        // are valid.
        unsafe { &*(self.map.as_ptr() as *const SharedHeader) }
    }

    #[inline]
    fn capacity(&self) -> u64 {
        self.cap
    }

    #[inline]
    fn fence_seq_cst(&self) {
        fence(Ordering::SeqCst);
    }

    #[inline]
    unsafe fn write_data(&self, at: usize, src: &[u8]) {
        // SAFETY: `at + src.len() <= cap` (caller) keeps the range inside
        // the data area; the source is a live slice, never the mapping.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.data().add(at), src.len()) }
    }

    #[inline]
    unsafe fn read_data(&self, at: usize, dst: *mut u8, len: usize) {
        // SAFETY: `at + len <= cap` keeps the source inside the data area;
        // `dst` is valid for `len` bytes and apart from the mapping (caller).
        unsafe { std::ptr::copy_nonoverlapping(self.data().add(at), dst, len) }
    }
}

/// Lays out a fresh ring in `map` (zeroed, exactly header + `cap` bytes,
/// `cap` a power of two in range) and returns its producer end.
pub(crate) fn init_producer(map: MmapRaw, cap: usize) -> Result<RingProducer, Corrupt> {
    let ring = RingMap { map, cap: cap as u64 };
    if !ring.fits(cap as u64) {
        return Err(Corrupt);
    }
    Ok(RingProducer::init(ring))
}

/// Opens the consumer end of a ring another side laid out in `map`.
pub(crate) fn open_consumer(map: MmapRaw) -> Result<RingConsumer, Corrupt> {
    RingConsumer::open(RingMap::checked(map)?)
}

/// A second view of a ring's header page, for its consumer's subscription
/// to a doorbell (the [`RingConsumer`] itself sits inside the stream).
pub(crate) struct HeaderView {
    map: MmapRaw,
}

// SAFETY: as for RingMap: shared memory reached only through atomics.
unsafe impl Send for HeaderView {}
// SAFETY: every access is an atomic operation on the shared header.
unsafe impl Sync for HeaderView {}

impl HeaderView {
    /// A view of the header page at the start of `map`; None if too short.
    pub(crate) fn new(map: MmapRaw) -> Option<Self> {
        (map.len() >= RING_HEADER_LEN).then_some(HeaderView { map })
    }

    fn header(&self) -> &SharedHeader {
        // SAFETY: the mapping holds at least the header page (checked in
        // `new`), is page aligned and lives as long as `self`; every
        // field is an atomic, valid for any bytes.
        unsafe { &*(self.map.as_ptr() as *const SharedHeader) }
    }

    /// Subscribes the ring to its consumer's doorbell: from the fence on,
    /// a publish either rings the bell or is seen by the caller's next
    /// look at the ring (the same argument as `RingConsumer::arm`), so the
    /// caller drains the ring once after this.
    pub(crate) fn subscribe(&self) {
        self.header().parked.0.fetch_or(BELL, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }
}

/// The writing end; `B`: the consumer's doorbell, if it passed one.
pub(crate) struct RingProducer<M: RingMemory = RingMap, B: BellMemory = BellMap> {
    ring: M,
    tail: u64,
    head_cache: u64,
    bell: Option<Ringer<B>>,
}

impl<M: RingMemory, B: BellMemory> RingProducer<M, B> {
    /// Writes a fresh header (indices zero, consumer awake; the magic last,
    /// published) into `ring` and becomes its producer.
    fn init(ring: M) -> Self {
        let h = ring.header();
        h.capacity.store(ring.capacity(), Ordering::Relaxed);
        h.tail.0.store(0, Ordering::Relaxed);
        h.head.0.store(0, Ordering::Relaxed);
        h.parked.0.store(AWAKE, Ordering::Relaxed);
        h.magic.store(RING_MAGIC, Ordering::Release);
        RingProducer { ring, tail: 0, head_cache: 0, bell: None }
    }

    /// The consumer's doorbell, rung after each publish once the consumer
    /// subscribed the ring (`BELL` in its `parked` word).
    pub(crate) fn set_bell(&mut self, bell: Ringer<B>) {
        self.bell = Some(bell);
    }

    /// Free bytes, reloading the consumer's index when the cache says full.
    fn room(&mut self, want: u64) -> Result<u64, Corrupt> {
        let cap = self.ring.capacity();
        let mut used = self.tail.wrapping_sub(self.head_cache);
        if cap - used < want {
            let head = self.ring.header().head.0.load(Ordering::Acquire);
            used = self.tail.wrapping_sub(head);
            if used > cap {
                return Err(Corrupt);
            }
            self.head_cache = head;
        }
        Ok(cap - used)
    }

    /// Bytes the consumer has taken out of the ring since its start (its
    /// index, one load; never more than we wrote, whatever the peer
    /// stores there).
    pub(crate) fn taken(&self) -> u64 {
        let head = self.ring.header().head.0.load(Ordering::Acquire);
        let cap = self.ring.capacity();
        if self.tail.wrapping_sub(head) > cap {
            // A corrupted index: report nothing taken; the next write
            // reports the corruption.
            return self.tail.saturating_sub(cap);
        }
        head
    }

    /// Copies as many leading bytes of `parts` as fit and publishes them
    /// once. Returns the bytes taken and whether the consumer sleeps and
    /// must be woken (one byte on the socket; the flag is cleared here). A
    /// subscribed consumer's doorbell is rung here (see [`doorbell`]).
    #[cfg(test)]
    pub(crate) fn write(&mut self, parts: &[&[u8]]) -> Result<(usize, bool), Corrupt> {
        self.write_parts(parts.iter().copied())
    }

    /// [`write`](Self::write) over any sequence of slices (walked twice:
    /// the stream's iovecs, without gathering them into an array first).
    pub(crate) fn write_parts<'a, I>(&mut self, parts: I) -> Result<(usize, bool), Corrupt>
    where
        I: Iterator<Item = &'a [u8]> + Clone,
    {
        let want: usize = parts.clone().map(|p| p.len()).sum();
        let room = self.room(want as u64)? as usize;
        let mut left = want.min(room);
        let taken = left;
        if taken == 0 {
            return Ok((0, false));
        }
        let cap = self.ring.capacity() as usize;
        let mut pos = self.tail;
        for part in parts {
            if left == 0 {
                break;
            }
            let n = part.len().min(left);
            let at = (pos & (cap as u64 - 1)) as usize;
            let first = n.min(cap - at);
            // SAFETY: `at + first <= cap` and `n - first < cap`: both ranges
            // lie in the data area. The bytes [tail, tail + room) are not
            // being read: the consumer's head says it is done with them.
            unsafe {
                self.ring.write_data(at, &part[..first]);
                self.ring.write_data(0, &part[first..n]);
            }
            pos = pos.wrapping_add(n as u64);
            left -= n;
        }
        self.tail = pos;
        let h = self.ring.header();
        h.tail.0.store(pos, Ordering::Release);
        // Pairs with the fence in `RingConsumer::arm`: either it sees our
        // tail or we see its flag.
        self.ring.fence_seq_cst();
        let parked = h.parked.0.load(Ordering::Relaxed);
        let wake = parked & STATE == PARKED
            && h
                .parked
                .0
                .compare_exchange(parked, (parked & !STATE) | WOKEN, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok();
        if parked & BELL != 0 {
            if let Some(bell) = &self.bell {
                bell.ring();
            }
        }
        Ok((taken, wake))
    }
}

/// The reading end.
pub(crate) struct RingConsumer<M: RingMemory = RingMap> {
    ring: M,
    head: u64,
    tail_cache: u64,
}

impl<M: RingMemory> RingConsumer<M> {
    /// The consumer of a ring whose producer wrote its header; refuses
    /// indices out of range.
    fn open(ring: M) -> Result<Self, Corrupt> {
        let h = ring.header();
        let head = h.head.0.load(Ordering::Acquire);
        let tail = h.tail.0.load(Ordering::Acquire);
        if tail.wrapping_sub(head) > ring.capacity() {
            return Err(Corrupt);
        }
        Ok(RingConsumer { ring, head, tail_cache: head })
    }

    /// Readable bytes, reloading the producer's index when the cache says
    /// fewer than `want`.
    fn available(&mut self, want: u64) -> Result<u64, Corrupt> {
        if self.tail_cache.wrapping_sub(self.head) < want {
            let tail = self.ring.header().tail.0.load(Ordering::Acquire);
            if tail.wrapping_sub(self.head) > self.ring.capacity() {
                return Err(Corrupt);
            }
            self.tail_cache = tail;
        }
        Ok(self.tail_cache.wrapping_sub(self.head))
    }

    /// Copies up to `len` readable bytes to `dst` and frees them; returns
    /// how many (0: empty).
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes and not overlap the
    /// ring's mapping.
    pub(crate) unsafe fn read(&mut self, dst: *mut u8, len: usize) -> Result<usize, Corrupt> {
        let n = (self.available(len as u64)? as usize).min(len);
        if n == 0 {
            return Ok(0);
        }
        let cap = self.ring.capacity() as usize;
        let at = (self.head & (cap as u64 - 1)) as usize;
        let first = n.min(cap - at);
        // SAFETY: `at + first <= cap` and `n - first < cap` keep the source
        // in the data area; `dst` holds `len >= n` bytes apart from the
        // mapping (caller). The bytes [head, tail) were published by the
        // producer's Release store, which our Acquire load of `tail` saw.
        unsafe {
            self.ring.read_data(at, dst, first);
            self.ring.read_data(0, dst.add(first), n - first);
        }
        self.head = self.head.wrapping_add(n as u64);
        self.ring.header().head.0.store(self.head, Ordering::Release);
        Ok(n)
    }

    /// Whether bytes are readable now (a cheap check: one load of the
    /// producer's index at most). A corrupted ring counts as readable, so
    /// that the caller reads it and learns the error.
    pub(crate) fn has_input(&self) -> bool {
        self.tail_cache != self.head
            || self.ring.header().tail.0.load(Ordering::Acquire) != self.head
    }

    /// Declares that the consumer is about to sleep on the socket; false if
    /// bytes arrived meanwhile (then do not sleep). Leaves a pending wake
    /// ([`WOKEN`]) alone: its byte keeps the socket readable.
    pub(crate) fn arm(&self) -> bool {
        let h = self.ring.header();
        let parked = h.parked.0.load(Ordering::Relaxed);
        if parked & STATE != WOKEN {
            h.parked.0.store((parked & BELL) | PARKED, Ordering::Relaxed);
        }
        // Pairs with the fence in `RingProducer::write`.
        self.ring.fence_seq_cst();
        !self.has_input()
    }

    /// Awake after a sleep: clears the flag. True if a producer answered
    /// the `arm` with a wake byte (the caller then reads the socket).
    pub(crate) fn disarm(&self) -> bool {
        let p = &self.ring.header().parked.0;
        let parked = p.load(Ordering::Relaxed);
        let kept = parked & BELL;
        p.compare_exchange(kept | PARKED, kept | AWAKE, Ordering::SeqCst, Ordering::Relaxed)
            .is_err()
            && self.take_woken()
    }

    /// Whether a producer answered our `arm` with a wake byte (the flag is
    /// reset, a subscription kept): the caller then reads the socket.
    pub(crate) fn take_woken(&self) -> bool {
        let p = &self.ring.header().parked.0;
        let parked = p.load(Ordering::Relaxed);
        parked & STATE == WOKEN
            && p.compare_exchange(parked, (parked & BELL) | AWAKE, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
    }
}

/// The data capacity for a configured size: a power of two in range.
pub(crate) fn ring_capacity(bytes: usize) -> usize {
    bytes
        .clamp(MIN_RING_BYTES, MAX_RING_BYTES)
        .checked_next_power_of_two()
        .unwrap_or(MAX_RING_BYTES)
        .min(MAX_RING_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;
    use memmap2::MmapOptions;

    /// Two views of one anonymous shared mapping (as two processes would
    /// see one file): the producer's and the consumer's.
    fn pair(cap: usize) -> (RingProducer, RingConsumer, MmapRaw) {
        let len = RING_HEADER_LEN + cap;
        let file = tempfile_shm(len);
        let p = init_producer(MmapOptions::new().len(len).map_raw(&file).unwrap(), cap).unwrap();
        let c = open_consumer(MmapOptions::new().len(len).map_raw(&file).unwrap()).unwrap();
        let raw = MmapOptions::new().len(len).map_raw(&file).unwrap();
        (p, c, raw)
    }

    fn tempfile_shm(len: usize) -> std::fs::File {
        static N: AtomicU64 = AtomicU64::new(0);
        let path = format!(
            "/dev/shm/symphony-ringtest-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let f = crate::mem::create_own_shm_file(std::path::Path::new(&path)).unwrap();
        let _ = std::fs::remove_file(&path);
        f.set_len(len as u64).unwrap();
        f
    }

    fn read_all(c: &mut RingConsumer, max: usize) -> Vec<u8> {
        let mut out = vec![0u8; max];
        // SAFETY: `out` holds `max` bytes.
        let n = unsafe { c.read(out.as_mut_ptr(), max) }.unwrap();
        out.truncate(n);
        out
    }

    fn header(raw: &MmapRaw) -> &SharedHeader {
        // SAFETY: as in RingMap::header.
        unsafe { &*(raw.as_ptr() as *const SharedHeader) }
    }

    #[test]
    fn bytes_cross_in_order_across_the_wrap() {
        let (mut p, mut c, _raw) = pair(4096);
        let mut expect = Vec::new();
        let mut got = Vec::new();
        let mut x = 0u8;
        for round in 0..50 {
            let a: Vec<u8> = (0..700 + round * 13).map(|_| { x = x.wrapping_add(1); x }).collect();
            let b: Vec<u8> = (0..333).map(|_| { x = x.wrapping_add(7); x }).collect();
            let (n, wake) = p.write(&[&a, &b]).unwrap();
            assert!(!wake, "nobody parked");
            assert_eq!(n, a.len() + b.len());
            expect.extend_from_slice(&a);
            expect.extend_from_slice(&b);
            // Partial reads: a frame may arrive in pieces.
            got.extend(read_all(&mut c, 500));
            got.extend(read_all(&mut c, 1 << 20));
        }
        assert_eq!(got, expect);
        assert!(p.tail > 4096 * 10, "wrapped many times");
    }

    #[test]
    fn a_full_ring_takes_what_fits_then_nothing() {
        let (mut p, mut c, _raw) = pair(4096);
        let big = vec![9u8; 5000];
        assert_eq!(p.write(&[&big]).unwrap().0, 4096);
        assert_eq!(p.write(&[&big]).unwrap().0, 0, "full");
        assert_eq!(read_all(&mut c, 100).len(), 100);
        assert_eq!(p.write(&[&big]).unwrap().0, 100, "room the consumer freed");
        assert_eq!(read_all(&mut c, 1 << 20).len(), 4096);
        assert!(read_all(&mut c, 10).is_empty());
        assert!(!c.has_input());
    }

    #[test]
    fn corrupted_indices_are_refused_not_followed() {
        let (mut p, mut c, raw) = pair(4096);
        p.write(&[b"hello"]).unwrap();
        // The peer claims more bytes than the ring holds.
        header(&raw).tail.0.store(1 << 40, Ordering::SeqCst);
        let mut buf = [0u8; 64];
        // SAFETY: `buf` holds 64 bytes.
        assert_eq!(unsafe { c.read(buf.as_mut_ptr(), 64) }, Err(Corrupt));
        // The consumer's index runs ahead of the producer's.
        header(&raw).head.0.store(1 << 40, Ordering::SeqCst);
        assert_eq!(p.write(&[&[0u8; 8000]]), Err(Corrupt));
    }

    #[test]
    fn a_bad_header_is_refused_at_open() {
        let len = RING_HEADER_LEN + 4096;
        let file = tempfile_shm(len);
        let raw = MmapOptions::new().len(len).map_raw(&file).unwrap();
        init_producer(MmapOptions::new().len(len).map_raw(&file).unwrap(), 4096).unwrap();
        header(&raw).capacity.store(4097, Ordering::SeqCst);
        let open = || open_consumer(MmapOptions::new().len(len).map_raw(&file).unwrap()).err();
        assert_eq!(open(), Some(Corrupt), "capacity not a power of two");
        header(&raw).capacity.store(8192, Ordering::SeqCst);
        assert_eq!(open(), Some(Corrupt), "capacity beyond the file");
        header(&raw).capacity.store(4096, Ordering::SeqCst);
        header(&raw).magic.store(0, Ordering::SeqCst);
        assert_eq!(open(), Some(Corrupt), "no magic");
    }

    #[test]
    fn a_parked_consumer_is_woken_once() {
        let (mut p, mut c, _raw) = pair(4096);
        assert!(c.arm(), "empty: may sleep");
        let (_, wake) = p.write(&[b"a"]).unwrap();
        assert!(wake, "the producer saw the flag");
        let (_, wake) = p.write(&[b"b"]).unwrap();
        assert!(!wake, "one byte per sleep");
        assert!(c.take_woken());
        assert!(!c.take_woken());
        assert!(!c.arm(), "input pending: do not sleep");
        assert_eq!(read_all(&mut c, 10), b"ab");
        assert!(c.arm());
    }

    /// Two threads, a small ring, partial writes and reads, and a consumer
    /// that sleeps whenever it finds the ring empty: every byte arrives in
    /// order and no sleep misses its wake-up. The socket is modelled by a
    /// counter of unread wake bytes; a lost wake-up hangs the consumer
    /// (caught by the deadline).
    #[test]
    fn threads_move_bytes_and_never_lose_a_wake_up() {
        use std::sync::Arc;
        const TOTAL: usize = 4 << 20;
        let (mut p, mut c, _raw) = pair(4096);
        let socket = Arc::new(AtomicU64::new(0));
        let sock = socket.clone();
        let producer = std::thread::spawn(move || {
            let mut sent = 0usize;
            let mut rng = 0x9e37_79b9_7f4a_7c15u64;
            let mut chunk = [0u8; 300];
            while sent < TOTAL {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let n = (1 + (rng % 300) as usize).min(TOTAL - sent);
                for (i, b) in chunk[..n].iter_mut().enumerate() {
                    *b = ((sent + i) % 251) as u8;
                }
                let mut off = 0;
                while off < n {
                    let (k, wake) = p.write(&[&chunk[off..n]]).expect("write");
                    if wake {
                        sock.fetch_add(1, Ordering::SeqCst);
                    }
                    off += k;
                    if k == 0 {
                        std::thread::yield_now();
                    }
                }
                sent += n;
            }
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut got = 0usize;
        let mut buf = [0u8; 777];
        let mut sleeps = 0u64;
        while got < TOTAL {
            // SAFETY: `buf` holds its length.
            let n = unsafe { c.read(buf.as_mut_ptr(), buf.len()) }.expect("read");
            for (i, b) in buf[..n].iter().enumerate() {
                assert_eq!(*b, ((got + i) % 251) as u8, "byte {}", got + i);
            }
            got += n;
            if n == 0 && c.arm() {
                sleeps += 1;
                while socket.load(Ordering::SeqCst) == 0 {
                    assert!(std::time::Instant::now() < deadline, "lost wake-up after {got} bytes");
                    std::hint::spin_loop();
                }
                socket.store(0, Ordering::SeqCst);
                c.take_woken();
            }
        }
        producer.join().unwrap();
        assert!(sleeps > 0, "the consumer never slept: the test proved nothing");
    }

    #[test]
    fn capacities_are_powers_of_two_in_range() {
        assert_eq!(ring_capacity(0), MIN_RING_BYTES);
        assert_eq!(ring_capacity(5000), 8192);
        assert_eq!(ring_capacity(1 << 20), 1 << 20);
        assert_eq!(ring_capacity(usize::MAX), MAX_RING_BYTES);
    }
}
