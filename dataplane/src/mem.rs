//! Registered memory: mapped regions, a fixed-size slot allocator for staging
//! buffers, the remote reference a peer needs to READ a slot, and the key
//! table that every software transport checks a READ against.
//!
//! Region memory is shared with transports that copy into or out of it while
//! the owner keeps using it (a NIC DMA, a responder's send, a reader process's
//! copy), so it is only ever touched through raw pointers: the safe accessors
//! copy ([`Region::read_at`], [`Region::write_at`]); the zero-copy views are
//! `unsafe` and say what the caller must guarantee.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytemuck::{Pod, Zeroable};
use memmap2::{MmapOptions, MmapRaw};

/// Errors from memory registration and access checks.
#[derive(Debug)]
pub enum MemError {
    /// The key names no registration (never issued, or from an older generation).
    BadKey,
    /// `offset + len` runs past the end of the registered region.
    OutOfBounds,
    /// The registration is closing or gone.
    Deregistered,
    /// The registration does not grant the requested access.
    AccessDenied,
    /// Deregistration refused for now: accesses are still in flight. Retry later.
    Busy,
    /// The key table has no free entry.
    TableFull,
    /// A slot handed back that is not allocated from this pool.
    NotAllocated,
    /// The operation needs something this region or table does not offer.
    Unsupported(&'static str),
    /// An OS call failed.
    Io(io::Error),
}

impl std::fmt::Display for MemError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MemError::BadKey => write!(f, "unknown memory key"),
            MemError::OutOfBounds => write!(f, "access out of the region's bounds"),
            MemError::Deregistered => write!(f, "region deregistered"),
            MemError::AccessDenied => write!(f, "registration does not grant this access"),
            MemError::Busy => write!(f, "accesses still in flight"),
            MemError::TableFull => write!(f, "key table full"),
            MemError::NotAllocated => write!(f, "slot not allocated from this pool"),
            MemError::Unsupported(what) => write!(f, "unsupported: {what}"),
            MemError::Io(e) => write!(f, "io: {e}"),
        }
    }
}

impl std::error::Error for MemError {}

impl From<io::Error> for MemError {
    fn from(e: io::Error) -> Self {
        MemError::Io(e)
    }
}

/// What a peer needs to READ bytes of a registered region: the owner's key,
/// the position and the length. Also a wire type (16 bytes, `#[repr(C)]`).
///
/// `offset` is interpreted by the owner's registration: the byte offset from
/// the region start for the software transports (tcp, shm), the remote virtual
/// address for RDMA verbs. Either way, only the owner creates RemoteRefs
/// (`Registration::remote_ref`); readers pass them on untouched.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct RemoteRef {
    /// Registration key at the owner (rkey for verbs).
    pub key: u32,
    /// Number of bytes.
    pub len: u32,
    /// Position of the first byte, as the owner's registration defines it.
    pub offset: u64,
}

/// A landing buffer in locally registered memory: where a READ puts its bytes.
/// Same shape as [`RemoteRef`] but names a local registration (lkey for verbs).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct LocalRef {
    /// Local registration key.
    pub key: u32,
    /// Number of bytes available at `offset`.
    pub len: u32,
    /// Position of the first byte, as the local registration defines it.
    pub offset: u64,
}

/// Access rights of a registration (bit set).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Access(pub u8);

impl Access {
    /// Peers may READ the region (one-sided).
    pub const REMOTE_READ: Access = Access(1);
    /// Local READs may land in the region.
    pub const LOCAL_WRITE: Access = Access(2);
    /// Both.
    pub const ALL: Access = Access(3);
    /// Peers may WRITE into the region (one-sided; only the rdma transport's
    /// WRITE uses it, for netbench's write target; serving regions never ask).
    pub const REMOTE_WRITE: Access = Access(4);

    /// Whether every right of `other` is in `self`.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

/// How to create a [`Region`].
#[derive(Clone, Debug)]
pub struct RegionOptions {
    /// Length in bytes (rounded up to the page size by the kernel).
    pub len: usize,
    /// Back the region with a shared-memory file under `/dev/shm`, so that
    /// same-host peers can map it (the `shm` transport needs this).
    pub shared_file: bool,
    /// Try 2 MiB huge pages (`MAP_HUGETLB`, anonymous regions only); fall back
    /// to normal pages when none are available. See [`Region::huge_pages`].
    pub huge_pages: bool,
    /// Fault every page in now (`MAP_POPULATE`) so that the first touch on
    /// the hot path does not page-fault.
    pub populate: bool,
}

impl RegionOptions {
    /// Anonymous, normal pages, populated.
    pub fn anonymous(len: usize) -> Self {
        RegionOptions {
            len,
            shared_file: false,
            huge_pages: false,
            populate: true,
        }
    }
    /// Shared-memory file, populated.
    pub fn shared(len: usize) -> Self {
        RegionOptions {
            len,
            shared_file: true,
            huge_pages: false,
            populate: true,
        }
    }
}

static NEXT_REGION_ID: AtomicU64 = AtomicU64::new(1);
static LIVE_REGIONS: AtomicUsize = AtomicUsize::new(0);

/// Regions currently mapped by this process (for leak checks).
pub fn live_regions() -> usize {
    LIVE_REGIONS.load(Ordering::SeqCst)
}

static REFUSED_KEYS: AtomicU64 = AtomicU64::new(0);

/// Accesses this process refused because their key named no live
/// registration (a wrong, guessed or stale key: [`MemError::BadKey`] from
/// [`KeyTable::acquire`]), since start. Exported as a metric by the daemons
/// (issue 55: a peer probing for keys shows here).
pub fn refused_key_accesses() -> u64 {
    REFUSED_KEYS.load(Ordering::Relaxed)
}

/// A mapped memory region that transports can register.
///
/// Dropping the last `Arc<Region>` unmaps it (and unlinks its shared-memory
/// file). Registrations hold an `Arc`, so a registered region cannot be
/// unmapped under a transport.
#[derive(Debug)]
pub struct Region {
    map: MmapRaw,
    len: usize,
    id: u64,
    huge: bool,
    shm_path: Option<PathBuf>,
}

impl Region {
    /// An anonymous private region of `len` bytes, populated.
    pub fn anonymous(len: usize) -> Result<Arc<Region>, MemError> {
        Self::with_options(&RegionOptions::anonymous(len))
    }

    /// A region in a fresh shared-memory file under `/dev/shm`, populated.
    pub fn shared(len: usize) -> Result<Arc<Region>, MemError> {
        Self::with_options(&RegionOptions::shared(len))
    }

    /// A region as `opts` says.
    pub fn with_options(opts: &RegionOptions) -> Result<Arc<Region>, MemError> {
        if opts.len == 0 {
            return Err(MemError::Unsupported("zero-length region"));
        }
        let id = NEXT_REGION_ID.fetch_add(1, Ordering::Relaxed);
        let region = Self::map(opts, id)?;
        LIVE_REGIONS.fetch_add(1, Ordering::SeqCst);
        Ok(Arc::new(region))
    }

    fn map(opts: &RegionOptions, id: u64) -> Result<Region, MemError> {
        if opts.shared_file {
            let path = shm_file_path(&format!("symphony-{}-{}", std::process::id(), id))?;
            let file = create_own_shm_file(&path)?;
            let unlink_on_err = |e: io::Error| {
                let _ = std::fs::remove_file(&path);
                MemError::Io(e)
            };
            file.set_len(opts.len as u64).map_err(unlink_on_err)?;
            let mut mo = MmapOptions::new();
            mo.len(opts.len);
            if opts.populate {
                mo.populate();
            }
            let map = mo.map_raw(&file).map_err(unlink_on_err)?;
            return Ok(Region {
                map,
                len: opts.len,
                id,
                huge: false,
                shm_path: Some(path),
            });
        }
        let mut mo = MmapOptions::new();
        mo.len(opts.len);
        if opts.populate {
            mo.populate();
        }
        if opts.huge_pages {
            let mut huge = mo.clone();
            huge.huge(Some(21));
            // Huge pages need a reserved pool (vm.nr_hugepages); without one
            // mmap fails with ENOMEM and we fall back to normal pages.
            if let Ok(m) = huge.map_anon() {
                return Ok(Region {
                    map: MmapRaw::from(m),
                    len: opts.len,
                    id,
                    huge: true,
                    shm_path: None,
                });
            }
        }
        let m = mo.map_anon()?;
        Ok(Region {
            map: MmapRaw::from(m),
            len: opts.len,
            id,
            huge: false,
            shm_path: None,
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Never true: zero-length regions are refused at creation.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Process-unique id of this region.
    pub fn id(&self) -> u64 {
        self.id
    }
    /// Whether huge pages back this region (false after a fallback).
    pub fn huge_pages(&self) -> bool {
        self.huge
    }
    /// The shared-memory file, if the region is one.
    pub fn shm_path(&self) -> Option<&Path> {
        self.shm_path.as_deref()
    }
    /// Start of the mapping. Writes through it race with transports unless
    /// the caller knows no transport touches the range.
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// Checks that `[offset, offset+len)` lies inside the region.
    pub fn check(&self, offset: u64, len: usize) -> Result<(), MemError> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.len as u64 => Ok(()),
            _ => Err(MemError::OutOfBounds),
        }
    }

    /// Copies `src` into the region at `offset`.
    pub fn write_at(&self, offset: u64, src: &[u8]) -> Result<(), MemError> {
        self.check(offset, src.len())?;
        // SAFETY: the range is inside the live mapping (checked above); the
        // mapping is writable; `src` is a distinct Rust borrow so the ranges
        // cannot overlap. Concurrent transport access to the same bytes is a
        // protocol error of the caller and can only tear data, as with a NIC.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.as_ptr(),
                self.as_ptr().add(offset as usize),
                src.len(),
            )
        };
        Ok(())
    }

    /// Zeroes `[offset, offset+len)` (a staging slot once its request is
    /// over, so that a later READ of it finds no earlier request's bytes).
    pub fn zero_at(&self, offset: u64, len: usize) -> Result<(), MemError> {
        self.check(offset, len)?;
        // SAFETY: the range is inside the live mapping (checked above) and
        // the mapping is writable. A concurrent transport access to the same
        // bytes can only tear data, as with `write_at`.
        unsafe { std::ptr::write_bytes(self.as_ptr().add(offset as usize), 0, len) };
        Ok(())
    }

    /// Copies region bytes at `offset` into `dst`.
    pub fn read_at(&self, offset: u64, dst: &mut [u8]) -> Result<(), MemError> {
        self.check(offset, dst.len())?;
        // SAFETY: the range is inside the live mapping (checked above) and
        // `dst` is a distinct exclusive borrow, so the ranges do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.as_ptr().add(offset as usize),
                dst.as_mut_ptr(),
                dst.len(),
            )
        };
        Ok(())
    }

    /// A zero-copy view of `[offset, offset+len)`.
    ///
    /// # Safety
    /// While the returned slice lives, nothing may write the range: no READ
    /// posted into it may be outstanding and no other writer may use it.
    pub unsafe fn slice(&self, offset: u64, len: usize) -> Result<&[u8], MemError> {
        self.check(offset, len)?;
        // SAFETY: in bounds (checked); the caller guarantees no concurrent writer.
        Ok(unsafe { std::slice::from_raw_parts(self.as_ptr().add(offset as usize), len) })
    }

    /// A zero-copy mutable view of `[offset, offset+len)`.
    ///
    /// # Safety
    /// While the returned slice lives, nothing else may read or write the
    /// range: no READ into or out of it may be outstanding, and the caller
    /// holds no other view of it.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, offset: u64, len: usize) -> Result<&mut [u8], MemError> {
        self.check(offset, len)?;
        // SAFETY: in bounds (checked); the caller guarantees exclusivity.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.as_ptr().add(offset as usize), len) })
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        LIVE_REGIONS.fetch_sub(1, Ordering::SeqCst);
        if let Some(p) = &self.shm_path {
            // Readers that still map the file keep their mapping; the name goes.
            let _ = std::fs::remove_file(p);
        }
    }
}

/// A read-only mapping of a peer's shared-memory file (the reader side of
/// the `shm` transport).
#[derive(Debug)]
pub struct ReadOnlyMapping {
    map: MmapRaw,
}

impl ReadOnlyMapping {
    /// Maps the whole file at `path` read-only.
    pub fn open(path: &Path) -> Result<Self, MemError> {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        if len == 0 {
            return Err(MemError::Unsupported("empty shared-memory file"));
        }
        let map = MmapOptions::new()
            .len(len as usize)
            .map_raw_read_only(&file)?;
        Ok(ReadOnlyMapping { map })
    }
    /// Mapped length.
    pub fn len(&self) -> usize {
        self.map.len()
    }
    /// Never true (empty files are refused).
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }
    /// Copies `[offset, offset+dst.len())` into `dst` after a bounds check.
    pub fn read_at(&self, offset: u64, dst: &mut [u8]) -> Result<(), MemError> {
        match offset.checked_add(dst.len() as u64) {
            Some(end) if end <= self.map.len() as u64 => {}
            _ => return Err(MemError::OutOfBounds),
        }
        // SAFETY: in bounds of the live read-only mapping; `dst` is a distinct
        // exclusive borrow. The owner may write the bytes concurrently (a
        // protocol error on its side) which can only tear the copied data.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.map.as_ptr().add(offset as usize),
                dst.as_mut_ptr(),
                dst.len(),
            )
        };
        Ok(())
    }
    /// Copies `len` bytes at `offset` to the raw destination `dst`.
    ///
    /// # Safety
    /// `dst` must be valid for `len` bytes of writes and not overlap the mapping.
    pub unsafe fn read_to_ptr(
        &self,
        offset: u64,
        dst: *mut u8,
        len: usize,
    ) -> Result<(), MemError> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.map.len() as u64 => {}
            _ => return Err(MemError::OutOfBounds),
        }
        // SAFETY: source in bounds (checked); the caller vouches for `dst`.
        unsafe { std::ptr::copy_nonoverlapping(self.map.as_ptr().add(offset as usize), dst, len) };
        Ok(())
    }
}

/// A fixed-size slot within a [`SlotPool`]'s region. Not `Clone`: handing it
/// back with [`SlotPool::free`] consumes it.
#[derive(Debug, PartialEq, Eq)]
pub struct Slot {
    index: u32,
    offset: u64,
    size: u32,
}

impl Slot {
    /// Index in the pool.
    pub fn index(&self) -> u32 {
        self.index
    }
    /// Byte offset of the slot in the region.
    pub fn offset(&self) -> u64 {
        self.offset
    }
    /// Slot size in bytes.
    pub fn size(&self) -> u32 {
        self.size
    }
}

/// Fixed-size slots carved from one region, for staging buffers.
///
/// The free list is preallocated: `alloc` and `free` never allocate. A pool
/// has one owner (`&mut self`); hand slots across threads through a ring.
#[derive(Debug)]
pub struct SlotPool {
    region: Arc<Region>,
    base: u64,
    slot_size: u32,
    free: Vec<u32>,
    allocated: Vec<bool>,
}

impl SlotPool {
    /// `count` slots of `slot_size` bytes starting at `base` in `region`.
    pub fn new(
        region: Arc<Region>,
        base: u64,
        slot_size: u32,
        count: u32,
    ) -> Result<Self, MemError> {
        if slot_size == 0 || count == 0 {
            return Err(MemError::Unsupported("empty slot pool"));
        }
        let total = (slot_size as u64)
            .checked_mul(count as u64)
            .ok_or(MemError::OutOfBounds)?;
        region.check(
            base,
            usize::try_from(total).map_err(|_| MemError::OutOfBounds)?,
        )?;
        // Pop from the end: slot 0 first.
        let free: Vec<u32> = (0..count).rev().collect();
        Ok(SlotPool {
            region,
            base,
            slot_size,
            free,
            allocated: vec![false; count as usize],
        })
    }

    /// As many `slot_size` slots as fit in the whole region.
    pub fn whole(region: Arc<Region>, slot_size: u32) -> Result<Self, MemError> {
        let count = region.len() as u64 / slot_size.max(1) as u64;
        let count = u32::try_from(count).map_err(|_| MemError::Unsupported("too many slots"))?;
        Self::new(region, 0, slot_size, count)
    }

    /// A free slot, or `None` when all are in use.
    pub fn alloc(&mut self) -> Option<Slot> {
        let index = self.free.pop()?;
        self.allocated[index as usize] = true;
        Some(Slot {
            index,
            offset: self.base + index as u64 * self.slot_size as u64,
            size: self.slot_size,
        })
    }

    /// Returns a slot. Refuses slots that this pool did not hand out.
    pub fn free(&mut self, slot: Slot) -> Result<(), MemError> {
        let i = slot.index as usize;
        let expected = self.base + slot.index as u64 * self.slot_size as u64;
        if i >= self.allocated.len()
            || !self.allocated[i]
            || slot.offset != expected
            || slot.size != self.slot_size
        {
            return Err(MemError::NotAllocated);
        }
        self.allocated[i] = false;
        self.free.push(slot.index);
        Ok(())
    }

    /// Free slots.
    pub fn available(&self) -> usize {
        self.free.len()
    }
    /// Total slots.
    pub fn capacity(&self) -> usize {
        self.allocated.len()
    }
    /// Slot size in bytes.
    pub fn slot_size(&self) -> u32 {
        self.slot_size
    }
    /// The backing region.
    pub fn region(&self) -> &Arc<Region> {
        &self.region
    }
}

// ---------------------------------------------------------------------------
// Key table
// ---------------------------------------------------------------------------

/// Maximum entries of a [`KeyTable`] (the entry index takes 16 key bits).
pub const MAX_KEYS: u32 = 1 << 16;
/// Bytes of a registration's name (the shm file path), zero padded.
pub const KEY_NAME_LEN: usize = 64;

const PHASE_FREE: u32 = 0;
const PHASE_LIVE: u32 = 1;
const PHASE_CLOSING: u32 = 2;

/// One registration slot. `#[repr(C)]` and made of atomics only, so a table
/// can live in a shared-memory file that another process maps and checks.
#[repr(C)]
#[derive(Debug)]
pub struct KeyEntry {
    /// `tag << 16 | access << 8 | phase`: `tag` is the key's upper half
    /// (see [`KeyTable`]).
    state: AtomicU32,
    /// Accesses in progress (READs being served or landing).
    inflight: AtomicU32,
    /// Registered length in bytes.
    len: AtomicU64,
    /// Registration name (shm path), written before the entry goes live.
    name: [AtomicU64; KEY_NAME_LEN / 8],
}

fn pack(generation: u32, access: Access, phase: u32) -> u32 {
    (generation & 0xffff) << 16 | (access.0 as u32) << 8 | phase
}

/// Rounds of [`KeyTags`]' Feistel network (4 make an 8+8-bit network a
/// pseudo-random permutation for an observer without the round keys).
const TAG_ROUNDS: usize = 4;

/// The owner's secret for turning an entry's registration count into the
/// key's upper half: a keyed permutation of 16 bits per entry (a Feistel
/// network over two bytes, round keys from the OS), so that the tags of
/// one entry never repeat within 65,535 registrations (a permutation of
/// the count) and cannot be predicted from earlier keys without the round
/// keys (issue 55: keys used to be `generation << 16 | index`, the first
/// one `0x10000`). Only the owner draws tags; readers that map the table
/// compare the tag stored in the entry with the key's.
struct KeyTags {
    round_keys: [u64; TAG_ROUNDS],
    /// Registrations so far per entry (the permutation's input); guarded by
    /// the table's admin lock.
    counts: Box<[u16]>,
}

impl KeyTags {
    /// Fresh round keys from the OS; `None` if it has no randomness (the
    /// table then refuses to register: a guessable key is worse than none).
    fn new(cap: u32) -> Option<Self> {
        let mut raw = [0u8; 8 * TAG_ROUNDS];
        getrandom::fill(&mut raw).ok()?;
        let mut round_keys = [0u64; TAG_ROUNDS];
        for (k, chunk) in round_keys.iter_mut().zip(raw.chunks_exact(8)) {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            *k = u64::from_le_bytes(b);
        }
        Some(KeyTags { round_keys, counts: vec![0u16; cap as usize].into_boxed_slice() })
    }

    /// The tag of registration `count` of entry `index` (a bijection of
    /// `count` for each `index`).
    fn permute(&self, index: u32, count: u16) -> u16 {
        let (mut left, mut right) = ((count >> 8) as u8, count as u8);
        for (round, k) in self.round_keys.iter().enumerate() {
            let x = k ^ (u64::from(index) << 16 | (round as u64) << 8 | u64::from(right));
            // splitmix64's finaliser: every input bit moves every output bit.
            let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            (left, right) = (right, left ^ z as u8);
        }
        u16::from(left) << 8 | u16::from(right)
    }

    /// The next tag of entry `index`, never 0 (0 marks a free or zeroed
    /// entry) and never one this table issued for it in the last 65,535
    /// registrations.
    fn next(&mut self, index: u32) -> u32 {
        let Some(&start) = self.counts.get(index as usize) else {
            return 0;
        };
        let mut count = start;
        loop {
            count = count.wrapping_add(1);
            let tag = self.permute(index, count);
            if tag != 0 {
                self.counts[index as usize] = count;
                return u32::from(tag);
            }
        }
    }
}

/// A capability table: key -> (length, access, liveness) with an in-flight
/// counter per entry, so that deregistration never races with an access.
///
/// A key is `tag << 16 | index`, the tag drawn afresh for each
/// registration of the entry by a secret permutation ([`KeyTags`]): a key
/// from an earlier registration is refused, and one cannot be derived
/// from another. A key naming no live registration is refused and counted
/// ([`refused_key_accesses`]). Access protocol (Dekker-style, all `SeqCst`): an accessor bumps
/// `inflight` then checks the entry is live; a deregistration marks it
/// closing then checks `inflight == 0`. At least one of them sees the other,
/// so either the access is refused or deregistration returns `Busy`.
pub struct KeyTable {
    entries: *const KeyEntry,
    cap: u32,
    /// Serialises registrations and deregistrations (cold path only) and
    /// keeps the tag secret (`None`: no randomness, registration refused).
    admin: Mutex<Option<KeyTags>>,
    _backing: TableBacking,
}

enum TableBacking {
    Heap(#[allow(dead_code)] Box<[KeyEntry]>),
    Mapped(#[allow(dead_code)] MmapRaw),
}

// SAFETY: the table only hands out shared references to `KeyEntry`s, which
// consist of atomics; the backing storage lives as long as the table.
unsafe impl Send for KeyTable {}
// SAFETY: as above; all mutation goes through atomics or the admin mutex.
unsafe impl Sync for KeyTable {}

impl std::fmt::Debug for KeyTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyTable")
            .field("cap", &self.cap)
            .field("live", &self.live_count())
            .finish()
    }
}

/// The outcome of a successful [`KeyTable::acquire`]: the entry index, to
/// be handed back with [`KeyTable::release`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AccessToken(u32);

impl AccessToken {
    /// Entry index.
    pub fn index(self) -> u32 {
        self.0
    }
}

impl KeyTable {
    /// Bytes a table of `cap` entries occupies (to size a shared file).
    pub const fn bytes_for(cap: u32) -> usize {
        cap as usize * std::mem::size_of::<KeyEntry>()
    }

    /// A table in process memory.
    pub fn new_local(cap: u32) -> Self {
        let cap = cap.clamp(1, MAX_KEYS);
        let entries: Box<[KeyEntry]> = (0..cap)
            .map(|_| KeyEntry {
                state: AtomicU32::new(pack(0, Access(0), PHASE_FREE)),
                inflight: AtomicU32::new(0),
                len: AtomicU64::new(0),
                name: Default::default(),
            })
            .collect();
        let ptr = entries.as_ptr();
        KeyTable {
            entries: ptr,
            cap,
            admin: Mutex::new(KeyTags::new(cap)),
            _backing: TableBacking::Heap(entries),
        }
    }

    /// A table laid over a shared mapping, starting `offset` bytes in and
    /// spanning `bytes_for(cap)` bytes, zero-filled (a fresh file) or written
    /// by another `KeyTable` (possibly in another process).
    pub fn in_mapping(map: MmapRaw, offset: usize, cap: u32) -> Result<Self, MemError> {
        let cap = cap.clamp(1, MAX_KEYS);
        if offset
            .checked_add(Self::bytes_for(cap))
            .is_none_or(|end| end > map.len())
        {
            return Err(MemError::OutOfBounds);
        }
        if !(map.as_ptr() as usize + offset).is_multiple_of(std::mem::align_of::<KeyEntry>()) {
            return Err(MemError::Unsupported("misaligned key table mapping"));
        }
        // SAFETY: `offset + bytes_for(cap) <= map.len()` (checked above).
        let ptr = unsafe { map.as_ptr().add(offset) } as *const KeyEntry;
        Ok(KeyTable {
            entries: ptr,
            cap,
            admin: Mutex::new(KeyTags::new(cap)),
            _backing: TableBacking::Mapped(map),
        })
    }

    /// Number of entries.
    pub fn capacity(&self) -> u32 {
        self.cap
    }

    fn entry(&self, index: u32) -> &KeyEntry {
        debug_assert!(index < self.cap);
        // SAFETY: `index < cap` (callers check) and the backing holds `cap`
        // initialised entries (zeroed memory is a valid all-atomic entry)
        // for the table's whole life.
        unsafe { &*self.entries.add(index as usize) }
    }

    fn split(&self, key: u32) -> Result<(u32, u32), MemError> {
        let index = key & 0xffff;
        let generation = key >> 16;
        if index >= self.cap || generation == 0 {
            return Err(MemError::BadKey);
        }
        Ok((index, generation))
    }

    /// Adds a live registration of `len` bytes; `name` (at most
    /// [`KEY_NAME_LEN`] bytes) travels with it. `before_publish(index)` runs
    /// before the entry goes live (to record process-local state such as a
    /// base address). Returns its key.
    pub fn register(
        &self,
        len: u64,
        access: Access,
        name: &[u8],
        before_publish: impl FnOnce(u32),
    ) -> Result<u32, MemError> {
        if name.len() > KEY_NAME_LEN {
            return Err(MemError::Unsupported("registration name too long"));
        }
        let mut tags = self.admin.lock().unwrap_or_else(|p| p.into_inner());
        let tags = tags
            .as_mut()
            .ok_or(MemError::Unsupported("no OS randomness for registration keys"))?;
        for index in 0..self.cap {
            let e = self.entry(index);
            let s = e.state.load(Ordering::SeqCst);
            if s & 0xff != PHASE_FREE {
                continue;
            }
            let generation = tags.next(index);
            e.len.store(len, Ordering::Relaxed);
            let mut padded = [0u8; KEY_NAME_LEN];
            padded[..name.len()].copy_from_slice(name);
            for (w, chunk) in e.name.iter().zip(padded.chunks_exact(8)) {
                let mut b = [0u8; 8];
                b.copy_from_slice(chunk);
                w.store(u64::from_le_bytes(b), Ordering::Relaxed);
            }
            before_publish(index);
            // Publishes len and name (readers load state with SeqCst/Acquire).
            e.state
                .store(pack(generation, access, PHASE_LIVE), Ordering::SeqCst);
            return Ok(generation << 16 | index);
        }
        Err(MemError::TableFull)
    }

    /// Starts or retries deregistration of `key`. New accesses are refused
    /// from the first call on; returns `Busy` while some are in flight, and
    /// `Ok` once the entry is free (the caller may then release the memory).
    pub fn deregister(&self, key: u32) -> Result<(), MemError> {
        let (index, generation) = self.split(key)?;
        let _g = self.admin.lock().unwrap_or_else(|p| p.into_inner());
        let e = self.entry(index);
        let s = e.state.load(Ordering::SeqCst);
        if (s >> 16) & 0xffff != generation || s & 0xff == PHASE_FREE {
            return Err(MemError::BadKey);
        }
        let access = Access(((s >> 8) & 0xff) as u8);
        e.state
            .store(pack(generation, access, PHASE_CLOSING), Ordering::SeqCst);
        if e.inflight.load(Ordering::SeqCst) != 0 {
            return Err(MemError::Busy);
        }
        // A free entry has tag 0, which no key carries; its next
        // registration draws a fresh tag.
        e.state.store(pack(0, Access(0), PHASE_FREE), Ordering::SeqCst);
        Ok(())
    }

    /// Marks every live entry closing and frees those with nothing in flight;
    /// returns how many are still busy. Used when an owner shuts down.
    pub fn close_all(&self) -> usize {
        let mut busy = 0;
        for index in 0..self.cap {
            let s = self.entry(index).state.load(Ordering::SeqCst);
            if s & 0xff == PHASE_FREE {
                continue;
            }
            let key = ((s >> 16) & 0xffff) << 16 | index;
            if let Err(MemError::Busy) = self.deregister(key) {
                busy += 1;
            }
        }
        busy
    }

    /// Begins an access of `[offset, offset+len)` under `key` needing `need`:
    /// checks key, liveness, access and bounds, and counts the access in
    /// flight. Every `Ok` must be paired with one [`release`](Self::release).
    pub fn acquire(
        &self,
        key: u32,
        offset: u64,
        len: u64,
        need: Access,
    ) -> Result<AccessToken, MemError> {
        let (index, generation) = self.split(key).inspect_err(|_| {
            REFUSED_KEYS.fetch_add(1, Ordering::Relaxed);
        })?;
        let e = self.entry(index);
        e.inflight.fetch_add(1, Ordering::SeqCst);
        let s = e.state.load(Ordering::SeqCst);
        let result = if (s >> 16) & 0xffff != generation {
            Err(MemError::BadKey)
        } else {
            match s & 0xff {
                PHASE_LIVE => {
                    let access = Access(((s >> 8) & 0xff) as u8);
                    let reg_len = e.len.load(Ordering::Relaxed);
                    if !access.contains(need) {
                        Err(MemError::AccessDenied)
                    } else if offset.checked_add(len).is_none_or(|end| end > reg_len) {
                        Err(MemError::OutOfBounds)
                    } else {
                        Ok(AccessToken(index))
                    }
                }
                PHASE_CLOSING => Err(MemError::Deregistered),
                _ => Err(MemError::BadKey),
            }
        };
        if let Err(e2) = &result {
            e.inflight.fetch_sub(1, Ordering::SeqCst);
            if matches!(e2, MemError::BadKey) {
                REFUSED_KEYS.fetch_add(1, Ordering::Relaxed);
            }
        }
        result
    }

    /// Ends an access begun by [`acquire`](Self::acquire).
    pub fn release(&self, token: AccessToken) {
        if token.0 < self.cap {
            self.entry(token.0).inflight.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// The name stored with the live or closing entry `index` (trailing zeros cut).
    pub fn name(&self, index: u32, out: &mut [u8; KEY_NAME_LEN]) -> usize {
        if index >= self.cap {
            return 0;
        }
        let e = self.entry(index);
        for (w, chunk) in e.name.iter().zip(out.chunks_exact_mut(8)) {
            chunk.copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
        }
        out.iter().position(|&b| b == 0).unwrap_or(KEY_NAME_LEN)
    }

    /// Generation currently stored at `index` (for readers caching per-key state).
    pub fn generation(&self, index: u32) -> u32 {
        if index >= self.cap {
            return 0;
        }
        (self.entry(index).state.load(Ordering::SeqCst) >> 16) & 0xffff
    }

    /// Whether entry `index` is live or closing.
    pub fn is_used(&self, index: u32) -> bool {
        index < self.cap && self.entry(index).state.load(Ordering::SeqCst) & 0xff != PHASE_FREE
    }

    /// Live (or closing) registrations.
    pub fn live_count(&self) -> usize {
        (0..self.cap)
            .filter(|&i| self.entry(i).state.load(Ordering::SeqCst) & 0xff != PHASE_FREE)
            .count()
    }
}

/// Process-local base addresses of the regions behind a [`KeyTable`], for
/// transports whose responder runs in the owning process (tcp).
#[derive(Debug)]
pub struct RegionDirectory {
    /// Base pointer per entry (0 = none); read by the data path after a
    /// successful `acquire`, which orders it after the registration.
    bases: Box<[AtomicUsize]>,
    /// Keeps registered regions mapped; cold path only.
    owners: Mutex<Vec<Option<Arc<Region>>>>,
}

impl RegionDirectory {
    /// Room for `cap` entries.
    pub fn new(cap: u32) -> Self {
        let cap = cap.clamp(1, MAX_KEYS) as usize;
        RegionDirectory {
            bases: (0..cap).map(|_| AtomicUsize::new(0)).collect(),
            owners: Mutex::new(vec![None; cap]),
        }
    }
    /// Records `region` as the memory behind entry `index`.
    pub fn insert(&self, index: u32, region: Arc<Region>) {
        let i = index as usize;
        if i >= self.bases.len() {
            return;
        }
        self.bases[i].store(region.as_ptr() as usize, Ordering::SeqCst);
        self.owners.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(region);
    }
    /// Forgets entry `index` (after the key table freed it).
    pub fn remove(&self, index: u32) -> Option<Arc<Region>> {
        let i = index as usize;
        if i >= self.bases.len() {
            return None;
        }
        self.bases[i].store(0, Ordering::SeqCst);
        self.owners.lock().unwrap_or_else(|p| p.into_inner())[i].take()
    }
    /// Base pointer of entry `index`; only meaningful under an [`AccessToken`].
    pub fn base(&self, token: AccessToken) -> *mut u8 {
        self.bases
            .get(token.0 as usize)
            .map_or(std::ptr::null_mut(), |b| {
                b.load(Ordering::Acquire) as *mut u8
            })
    }
}

/// Where this user's shared-memory files live: `/dev/shm/symphony.<uid>`,
/// created mode 0700 (and, if it exists, used only if it is a real
/// directory owned by this user that no one else may enter). Why a
/// directory of our own: `/dev/shm` lists every file to every user, and
/// one created there by someone else under our name would be theirs.
/// Peers must run as the same user (they open these files).
pub fn shm_dir() -> io::Result<&'static Path> {
    static DIR: std::sync::OnceLock<Result<PathBuf, (io::ErrorKind, String)>> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let uid = unsafe { libc::geteuid() };
        let dir = PathBuf::from(format!("/dev/shm/symphony.{uid}"));
        make_private_dir(&dir, uid).map(|()| dir).map_err(|e| (e.kind(), e.to_string()))
    })
    .as_ref()
    .map(PathBuf::as_path)
    .map_err(|(kind, why)| io::Error::new(*kind, why.clone()))
}

/// Creates `dir` with mode 0700 (the mode is given at creation, so no
/// window exists in which it is open to others, whatever the umask), or
/// checks that an existing one is a directory (not a link) owned by `uid`
/// with no access for group or others.
fn make_private_dir(dir: &Path, uid: u32) -> io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.file_type().is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{} is not a private directory of user {uid} (mode 0700)", dir.display()),
        ));
    }
    Ok(())
}

/// `name` inside [`shm_dir`].
pub(crate) fn shm_file_path(name: &str) -> io::Result<PathBuf> {
    Ok(shm_dir()?.join(name))
}

/// Whether `path` (a name a peer sent) is a file directly inside this
/// user's [`shm_dir`] whose name starts with `prefix`: a peer may point us
/// only at files of our own user, never elsewhere.
pub(crate) fn is_own_shm_file(path: &str, prefix: &str) -> bool {
    let Ok(dir) = shm_dir() else { return false };
    let p = Path::new(path);
    !path.contains("..")
        && p.parent() == Some(dir)
        && p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(prefix))
}

/// Creates `path`, a file in [`shm_dir`] named after this process's id
/// and a per-process counter, mode 0600 from its creation (the umask can
/// only take bits away). If it exists, it was left by a dead process that
/// had the same id (a crash or SIGKILL skips the unlink): no live process
/// can own it, so it is replaced.
pub(crate) fn create_own_shm_file(path: &std::path::Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    static SWEEP: std::sync::Once = std::sync::Once::new();
    SWEEP.call_once(|| {
        let prefixes = ["symphony-reg-", "symphony-ring-", "symphony-"];
        // Files of older versions lay in /dev/shm itself.
        sweep_stale_files(std::path::Path::new("/dev/shm"), &prefixes);
        if let Ok(dir) = shm_dir() {
            sweep_stale_files(dir, &prefixes);
        }
    });
    let open = || {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
    };
    match open() {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let _ = std::fs::remove_file(path);
            open()
        }
        other => other,
    }
}

/// Whether process `pid` exists (a process we may not signal exists too).
pub fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists; no signal is sent.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// The process id in a file name `<prefix><pid>[-<anything>]`, if it has
/// one of `prefixes` (longest first).
fn owner_pid(name: &str, prefixes: &[&str]) -> Option<u32> {
    let rest = prefixes.iter().find_map(|p| name.strip_prefix(p))?;
    rest.split('-').next()?.parse().ok()
}

/// Removes the entries of `dir` (files or directories) named
/// `<prefix><pid>[-...]` whose process is dead: what a crash or SIGKILL left
/// behind. Entries of live processes (other clusters, parallel tests) are
/// left alone. Returns how many were removed.
pub fn sweep_stale_files(dir: &std::path::Path, prefixes: &[&str]) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let me = std::process::id();
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| owner_pid(n, prefixes)) else { continue };
        if pid == me || process_alive(pid) {
            continue;
        }
        let path = e.path();
        let gone = if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
        if gone.is_ok() {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweeps_only_entries_of_dead_processes() {
        let dir = std::env::temp_dir().join(format!("sweep-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A pid far above pid_max cannot be alive; ours is.
        let dead = dir.join("symphony-4000000000-1");
        let mine = dir.join(format!("symphony-{}-1", std::process::id()));
        let reg = dir.join("symphony-reg-4000000000-2");
        let other = dir.join("unrelated-4000000000-1");
        for f in [&dead, &mine, &reg, &other] {
            std::fs::write(f, b"x").unwrap();
        }
        assert_eq!(sweep_stale_files(&dir, &["symphony-reg-", "symphony-"]), 2);
        assert!(!dead.exists() && !reg.exists());
        assert!(mine.exists() && other.exists());
        assert_eq!(owner_pid("symphony-up-123", &["symphony-up-"]), Some(123));
        assert_eq!(owner_pid("symphony-x-1", &["symphony-"]), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn slot_pool_hands_out_each_slot_once_and_refuses_foreign_frees() {
        let r = Region::anonymous(4096).unwrap();
        let mut p = SlotPool::new(r, 0, 1024, 4).unwrap();
        let a = p.alloc().unwrap();
        assert_eq!(a.offset(), 0);
        let b = p.alloc().unwrap();
        assert_eq!(b.offset(), 1024);
        let forged = Slot {
            index: 2,
            offset: 2048,
            size: 1024,
        };
        assert!(matches!(p.free(forged), Err(MemError::NotAllocated)));
        p.free(a).unwrap();
        assert_eq!(p.available(), 3);
        assert!(SlotPool::new(Region::anonymous(4096).unwrap(), 0, 1024, 5).is_err());
    }

    #[test]
    fn key_table_checks_bounds_generation_and_defers_deregistration() {
        let t = KeyTable::new_local(4);
        let k = t.register(100, Access::REMOTE_READ, b"x", |_| {}).unwrap();
        assert!(matches!(
            t.acquire(k, 90, 11, Access::REMOTE_READ),
            Err(MemError::OutOfBounds)
        ));
        assert!(matches!(
            t.acquire(k, u64::MAX, 2, Access::REMOTE_READ),
            Err(MemError::OutOfBounds)
        ));
        assert!(matches!(
            t.acquire(k, 0, 1, Access::LOCAL_WRITE),
            Err(MemError::AccessDenied)
        ));
        assert!(matches!(
            t.acquire(k ^ 1, 0, 1, Access::REMOTE_READ),
            Err(MemError::BadKey)
        ));
        let tok = t.acquire(k, 0, 100, Access::REMOTE_READ).unwrap();
        assert!(matches!(t.deregister(k), Err(MemError::Busy)));
        assert!(matches!(
            t.acquire(k, 0, 1, Access::REMOTE_READ),
            Err(MemError::Deregistered)
        ));
        t.release(tok);
        t.deregister(k).unwrap();
        assert!(matches!(
            t.acquire(k, 0, 1, Access::REMOTE_READ),
            Err(MemError::BadKey)
        ));
        let k2 = t.register(10, Access::ALL, b"", |_| {}).unwrap();
        assert_ne!(k, k2, "a reused entry gets a new generation");
        assert_eq!(t.live_count(), 1);
    }

    #[test]
    fn an_entrys_keys_never_repeat_and_wrong_keys_are_refused_and_counted() {
        let t = KeyTable::new_local(2);
        let mut seen = std::collections::HashSet::new();
        // A full cycle of the tag permutation: every key of entry 0 differs.
        for _ in 0..0xffff {
            let k = t.register(8, Access::REMOTE_READ, b"", |_| {}).unwrap();
            assert_eq!(k & 0xffff, 0, "one entry is reused");
            assert_ne!(k >> 16, 0);
            assert!(seen.insert(k), "key {k:#x} issued twice");
            t.deregister(k).unwrap();
        }
        let live = t.register(8, Access::REMOTE_READ, b"", |_| {}).unwrap();
        let before = refused_key_accesses();
        let stale = *seen.iter().find(|&&k| k != live).unwrap();
        assert!(matches!(t.acquire(stale, 0, 1, Access::REMOTE_READ), Err(MemError::BadKey)));
        assert!(matches!(t.acquire(live ^ 0x0001_0000, 0, 1, Access::REMOTE_READ), Err(MemError::BadKey)));
        assert!(matches!(t.acquire(7, 0, 1, Access::REMOTE_READ), Err(MemError::BadKey)));
        // Other tests in this process may refuse keys too: at least ours.
        assert!(refused_key_accesses() >= before + 3);
        let tok = t.acquire(live, 0, 8, Access::REMOTE_READ).unwrap();
        t.release(tok);
    }

    #[test]
    fn key_tags_are_a_permutation_that_does_not_count_up() {
        let tags = KeyTags { round_keys: [0x0123_4567_89ab_cdef, 42, 7, u64::MAX], counts: vec![0; 2].into_boxed_slice() };
        for index in [0u32, 1] {
            let mut hit = vec![false; 1 << 16];
            for c in 0..=u16::MAX {
                let t = tags.permute(index, c) as usize;
                assert!(!hit[t], "tag {t:#x} twice for entry {index}");
                hit[t] = true;
            }
        }
        // The old scheme's keys were 1, 2, 3, ...: a tag sequence that
        // counts up (or down) by a constant step is what a guesser would try.
        let seq: Vec<i32> = (1..=16).map(|c| i32::from(tags.permute(0, c))).collect();
        let steps: std::collections::HashSet<i32> = seq.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(steps.len() > 8, "tags follow a pattern: {seq:?}");
        assert_ne!(tags.permute(0, 1), tags.permute(1, 1), "entries share their tag sequence");
    }

    #[test]
    fn huge_page_request_falls_back_cleanly() {
        let mut o = RegionOptions::anonymous(4 << 20);
        o.huge_pages = true;
        let r = Region::with_options(&o).unwrap();
        r.write_at(0, b"ok").unwrap();
        let mut b = [0u8; 2];
        r.read_at(0, &mut b).unwrap();
        assert_eq!(&b, b"ok");
    }

    #[test]
    fn a_shared_memory_directory_not_private_to_us_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        let base = std::env::temp_dir().join(format!("symphony-privdir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        let fresh = base.join("fresh");
        make_private_dir(&fresh, me).expect("created private");
        let mode = std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        make_private_dir(&fresh, me).expect("reused when private");
        // Open to others, someone else's, or a link: refused.
        let open = base.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(make_private_dir(&open, me).is_err());
        assert!(make_private_dir(&fresh, me.wrapping_add(1)).is_err());
        let link = base.join("link");
        std::os::unix::fs::symlink(&fresh, &link).unwrap();
        assert!(make_private_dir(&link, me).is_err());
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn shared_region_file_is_unlinked_on_drop() {
        let r = Region::shared(8192).unwrap();
        let p = r.shm_path().unwrap().to_path_buf();
        r.write_at(10, b"hello").unwrap();
        let m = ReadOnlyMapping::open(&p).unwrap();
        let mut b = [0u8; 5];
        m.read_at(10, &mut b).unwrap();
        assert_eq!(&b, b"hello");
        drop(r);
        assert!(!p.exists());
        m.read_at(10, &mut b).unwrap();
    }
}
