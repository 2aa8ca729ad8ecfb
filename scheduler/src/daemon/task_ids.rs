//! The control plane's task ids: the tasks waiting in a sub-cluster and
//! the duplicate filter (ids taken whose deadline has not passed).
//!
//! Each waiting task has a slot in a slab, and the scheduling cores know it
//! by its slot's handle (its `Request::id`), not by its task id: a plan or
//! a drop names its members by handle, so taking them out indexes the slab
//! instead of hashing. Only the duplicate filter is keyed by task id: one
//! hash lookup when a task is offered and one when its filter entry
//! expires. Why: the three lookups per task (offer, take at plan, forget
//! at expiry) of one hash table, each mostly a cache miss at 100k+ live
//! ids, were the largest cost of a saturated daemon's I/O thread (~30% of
//! it, node_path); the slab of waiting tasks is small and reused
//! last-in-first-out, so it stays in cache.
//!
//! The cores never look at a request's id beyond equality (a cancellation
//! names one), so handing them handles changes no decision.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use dataplane::wire::{RemoteRef, TaskId};

use super::plane::IdHasher;

/// [`IdHasher`] arranged for locality: the ids of one frontend's
/// consecutive tasks (consecutive sequence numbers or staging slots) land
/// in one aligned run of 16 buckets, in the same control group and a few
/// adjacent cache lines, instead of 16 random places. Why: at 100k+ live
/// ids the filter is several MB, and the offer, take and forget of each
/// task were each a cache miss (a third of a saturated daemon's I/O
/// thread, node_path); the next ids of a frontend now mostly hit lines its
/// previous ids brought in. The bucket run is still placed by the seeded
/// hash of the id's other bits, and the control byte (top 7 bits) by the
/// seeded hash of the whole id, so a peer still cannot aim ids at one
/// bucket beyond its own run of 16.
#[derive(Clone, Copy, Debug, Default)]
struct TaskIdHash(IdHasher);

/// Hashes one `u64` task id (see [`TaskIdHash`]).
struct TaskIdHasher {
    seeded: IdHasher,
    hash: u64,
}

impl std::hash::BuildHasher for TaskIdHash {
    type Hasher = TaskIdHasher;
    fn build_hasher(&self) -> TaskIdHasher {
        TaskIdHasher { seeded: self.0, hash: 0 }
    }
}

impl std::hash::Hasher for TaskIdHasher {
    #[inline]
    fn write_u64(&mut self, id: u64) {
        use std::hash::BuildHasher as _;
        // The id's position: the sum of its sequence and slot (one of them
        // steps from one task of a frontend to the next); runs of 16.
        let t = TaskId(id);
        let pos = t.seq() + u64::from(t.slot());
        let (run, step) = ((u64::from(t.frontend()) << 48) | (pos >> 4), pos & 15);
        let (place, tag) = (self.seeded.hash_one(run), self.seeded.hash_one(id));
        const TAG: u64 = 0x7F << 57;
        self.hash = (place & !(TAG | 15)) | (tag & TAG) | ((place ^ step) & 15);
    }
    fn write(&mut self, bytes: &[u8]) {
        // Not reached for `u64` keys; total all the same.
        use std::hash::BuildHasher as _;
        self.hash = self.seeded.hash_one(bytes);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.hash
    }
}

/// What the cores know a waiting task by (its `Request::id`): its slot's
/// index in the low 32 bits and the slot's generation above, so that a
/// handle of a task that left names no later task of the same slot.
pub(super) type Handle = u64;

/// Generations count modulo 2^31 (a handle leaves the top bit of its
/// `u64` to the map entry's `seen` flag).
const GENERATION_MASK: u32 = u32::MAX >> 1;

fn handle(index: u32, generation: u32) -> Handle {
    u64::from(generation) << 32 | u64::from(index)
}

fn split(h: Handle) -> (usize, u32) {
    ((h & u64::from(u32::MAX)) as usize, (h >> 32) as u32)
}

/// The slot of `slots` where task `id` waits under handle `h`.
fn waiting_slot(slots: &mut [Slot], h: Handle, id: u64) -> Option<&mut Slot> {
    let (i, generation) = split(h);
    slots.get_mut(i).filter(|s| s.holds(generation) && s.id == id)
}

/// What a plan or a drop needs of a waiting task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct TaskMeta {
    pub frontend: u32,
    pub input: RemoteRef,
    pub model: u32,
    /// Its submission attempt (`Task::attempt`).
    pub attempt: u16,
}

/// A slab slot: a waiting task, or free. Its meta is apart (`metas`):
/// checking whether a task still waits, as each expiry of the filter does
/// long after the task was taken, reads these 16 bytes only (the slot
/// reads were most of the expiry's cost with the meta inline, perf).
#[derive(Clone, Copy, Debug)]
struct Slot {
    id: u64,
    /// Bumped each time the slot is freed.
    generation: u32,
    waiting: bool,
    /// Its id is in the duplicate filter too (so its map entry stays when
    /// it leaves); a copy of the map entry's flag, so that taking a task
    /// needs no lookup.
    seen: bool,
}

impl Slot {
    /// Whether a handle of `generation` names this slot's waiting task.
    fn holds(&self, generation: u32) -> bool {
        self.waiting && self.generation == generation
    }
}

/// A task id's map entry: in the filter (`seen`), waiting (its handle
/// names a live slot holding this id), or both; it goes once neither
/// holds. Packed into 8 bytes (the handle below the top bit, `seen` in it):
/// with its key a bucket is 16 bytes, so a frontend's run of 16 ids (see
/// [`TaskIdHash`]) spans 4 cache lines, not 6.
#[derive(Clone, Copy, Debug)]
struct IdEntry(u64);

impl IdEntry {
    const SEEN: u64 = 1 << 63;

    fn new(handle: Handle, seen: bool) -> Self {
        IdEntry(handle | if seen { Self::SEEN } else { 0 })
    }

    fn handle(self) -> Handle {
        self.0 & !Self::SEEN
    }

    fn seen(self) -> bool {
        self.0 & Self::SEEN != 0
    }

    fn set_seen(&mut self, seen: bool) {
        *self = IdEntry::new(self.handle(), seen);
    }
}

/// Waiting tasks (a slab, by handle) and the duplicate filter (a map, by
/// task id).
#[derive(Debug)]
pub(super) struct TaskTable {
    map: HashMap<u64, IdEntry, TaskIdHash>,
    slots: Vec<Slot>,
    /// The meta of each slot's task (by slot index).
    metas: Vec<TaskMeta>,
    /// Free slot indices, reused last freed first (warm in cache).
    free: Vec<u32>,
    waiting: usize,
}

impl TaskTable {
    pub(super) fn new() -> Self {
        TaskTable {
            map: HashMap::with_capacity_and_hasher(1 << 16, TaskIdHash::default()),
            slots: Vec::with_capacity(1 << 12),
            metas: Vec::with_capacity(1 << 12),
            free: Vec::with_capacity(1 << 12),
            waiting: 0,
        }
    }

    /// Tasks waiting.
    pub(super) fn waiting_len(&self) -> usize {
        self.waiting
    }

    /// The live slot `h` names.
    fn slot(&self, h: Handle) -> Option<&Slot> {
        let (i, generation) = split(h);
        self.slots.get(i).filter(|s| s.holds(generation))
    }

    /// The waiting task `id`: its handle and meta.
    pub(super) fn waiting(&self, id: u64) -> Option<(Handle, TaskMeta)> {
        let e = self.map.get(&id)?;
        self.slot(e.handle()).filter(|s| s.id == id)?;
        Some((e.handle(), self.metas[split(e.handle()).0]))
    }

    /// Every waiting task as (handle, id, meta), in no order.
    pub(super) fn iter_waiting(&self) -> impl Iterator<Item = (Handle, u64, TaskMeta)> + '_ {
        self.slots
            .iter()
            .zip(&self.metas)
            .enumerate()
            .filter(|(_, (s, _))| s.waiting)
            .map(|(i, (s, &meta))| (handle(i as u32, s.generation), s.id, meta))
    }

    /// The task under handle `h` no longer waits (planned or dropped): its
    /// id and meta. None if `h` names no waiting task (it left already).
    /// No hash lookup unless its filter entry expired while it waited.
    pub(super) fn take(&mut self, h: Handle) -> Option<(u64, TaskMeta)> {
        let (i, generation) = split(h);
        let s = self.slots.get_mut(i).filter(|s| s.holds(generation))?;
        s.waiting = false;
        s.generation = s.generation.wrapping_add(1) & GENERATION_MASK;
        let (id, seen) = (s.id, s.seen);
        let meta = self.metas[i];
        self.free.push(i as u32);
        self.waiting -= 1;
        if !seen {
            self.map.remove(&id);
        }
        Some((id, meta))
    }

    /// Every waiting task leaves: (id, meta), in no order.
    pub(super) fn drain_waiting(&mut self) -> Vec<(u64, TaskMeta)> {
        let handles: Vec<Handle> = self.iter_waiting().map(|(h, _, _)| h).collect();
        handles.into_iter().filter_map(|h| self.take(h)).collect()
    }

    /// Whether `id` is in the duplicate filter.
    pub(super) fn seen(&self, id: u64) -> bool {
        self.map.get(&id).is_some_and(|e| e.seen())
    }

    /// `id` leaves the duplicate filter.
    pub(super) fn forget(&mut self, id: u64) {
        let Entry::Occupied(mut o) = self.map.entry(id) else { return };
        match waiting_slot(&mut self.slots, o.get().handle(), id) {
            Some(s) => {
                s.seen = false;
                o.get_mut().set_seen(false);
            }
            None => {
                o.remove();
            }
        }
    }

    /// A task offered: `id` enters the duplicate filter, and, if it was
    /// not in it and does not wait already, waits with `meta`. Returns
    /// whether it was new to the filter, and its handle if it now waits as
    /// `meta`. One hash lookup.
    pub(super) fn offer(&mut self, id: u64, meta: TaskMeta) -> (bool, Option<Handle>) {
        match self.map.entry(id) {
            Entry::Occupied(mut o) => {
                // An entry lives only while a flag is set: one in the
                // filter is a repeat; one out of it still waits (its
                // filter entry expired first) and re-enters the filter.
                let e = o.get_mut();
                if e.seen() {
                    return (false, None);
                }
                e.set_seen(true);
                if let Some(s) = waiting_slot(&mut self.slots, e.handle(), id) {
                    s.seen = true;
                }
                (true, None)
            }
            Entry::Vacant(v) => {
                let i = match self.free.pop() {
                    Some(i) => i,
                    None => {
                        // 2^32 waiting tasks would take > 100 GB: refused
                        // as a repeat rather than a panic.
                        let Ok(i) = u32::try_from(self.slots.len()) else { return (false, None) };
                        self.slots.push(Slot { id, generation: 0, waiting: false, seen: false });
                        self.metas.push(meta);
                        i
                    }
                };
                let s = &mut self.slots[i as usize];
                *s = Slot { id, generation: s.generation, waiting: true, seen: true };
                self.metas[i as usize] = meta;
                let h = handle(i, s.generation);
                v.insert(IdEntry::new(h, true));
                self.waiting += 1;
                (true, Some(h))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(model: u32) -> TaskMeta {
        TaskMeta { frontend: 3, input: RemoteRef::default(), model, attempt: 0 }
    }

    fn id(seq: u64) -> u64 {
        TaskId::new(3, seq, 0).0
    }

    #[test]
    fn a_frontends_consecutive_ids_share_one_run_of_buckets() {
        use std::hash::BuildHasher as _;
        let h = TaskIdHash::default();
        for (seq0, slot0, by_seq) in [(32u64, 0u32, true), (0, 48, false)] {
            let ids: Vec<u64> = (0..16u64).map(|k| if by_seq { TaskId::new(3, seq0 + k, slot0).0 } else { TaskId::new(3, seq0, slot0 + k as u32).0 }).collect();
            let hashes: Vec<u64> = ids.iter().map(|&id| h.hash_one(id)).collect();
            let runs: std::collections::HashSet<u64> = hashes.iter().map(|x| (x & !(0x7F << 57)) >> 4).collect();
            assert_eq!(runs.len(), 1, "one run of 16 buckets");
            let places: std::collections::HashSet<u64> = hashes.iter().map(|x| x & 15).collect();
            assert_eq!(places.len(), 16, "16 distinct buckets in it");
        }
        // Another frontend, or the next run, lands elsewhere.
        assert_ne!(h.hash_one(TaskId::new(3, 32, 0).0) >> 4, h.hash_one(TaskId::new(4, 32, 0).0) >> 4);
        assert_ne!(h.hash_one(TaskId::new(3, 32, 0).0) >> 4, h.hash_one(TaskId::new(3, 48, 0).0) >> 4);
        // The table behaves as any map.
        let mut t = TaskTable::new();
        let mut handles = Vec::new();
        for seq in 0..10_000u64 {
            let (fresh, h) = t.offer(TaskId::new(3, seq, (seq % 7) as u32).0, meta(0));
            assert!(fresh);
            handles.push(h.expect("waits"));
        }
        assert_eq!(t.offer(TaskId::new(3, 5, 5).0, meta(0)), (false, None));
        assert_eq!(t.waiting_len(), 10_000);
        assert_eq!(t.take(handles[9_999]).map(|(id, _)| id), Some(TaskId::new(3, 9_999, 9_999 % 7).0));
        assert_eq!(t.waiting_len(), 9_999);
    }

    #[test]
    fn a_repeat_is_a_duplicate_until_forgotten_and_a_handle_takes_once() {
        let mut t = TaskTable::new();
        let (fresh, h) = t.offer(id(1), meta(7));
        assert!(fresh);
        let h = h.expect("waits");
        // A duplicated message: in the filter, not taken again.
        assert_eq!(t.offer(id(1), meta(7)), (false, None));
        assert!(t.seen(id(1)));
        assert_eq!(t.waiting(id(1)), Some((h, meta(7))));
        assert_eq!(t.take(h), Some((id(1), meta(7))));
        assert_eq!(t.take(h), None, "a handle takes once");
        assert_eq!(t.waiting(id(1)), None);
        // Planned, still in the filter: a late copy is a repeat.
        assert_eq!(t.offer(id(1), meta(7)), (false, None));
        assert_eq!(t.waiting_len(), 0);
        // Its deadline passed: forgotten, and a later copy is new.
        t.forget(id(1));
        assert!(!t.seen(id(1)));
        assert!(t.map.is_empty(), "nothing left of it");
        let (fresh, h2) = t.offer(id(1), meta(7));
        assert!(fresh && h2.is_some());
    }

    #[test]
    fn a_task_still_waiting_when_its_filter_entry_expires_stays_and_reenters() {
        let mut t = TaskTable::new();
        let h = t.offer(id(2), meta(1)).1.expect("waits");
        t.forget(id(2));
        assert!(!t.seen(id(2)));
        assert_eq!(t.waiting(id(2)), Some((h, meta(1))), "still waits");
        // A repeat while it waits re-enters the filter but is not taken twice.
        assert_eq!(t.offer(id(2), meta(1)), (true, None));
        assert!(t.seen(id(2)));
        t.forget(id(2));
        // Taken with its filter entry gone: its id leaves the map entirely.
        assert_eq!(t.take(h), Some((id(2), meta(1))));
        assert!(t.map.is_empty());
        assert!(t.free.len() == 1 && t.waiting_len() == 0);
    }

    #[test]
    fn a_reused_slot_gets_a_new_generation_so_stale_handles_take_nothing() {
        let mut t = TaskTable::new();
        let old = t.offer(id(1), meta(0)).1.expect("waits");
        assert!(t.take(old).is_some());
        let new = t.offer(id(2), meta(1)).1.expect("waits");
        assert_eq!(old & u64::from(u32::MAX), new & u64::from(u32::MAX), "the slot is reused");
        assert_ne!(old, new);
        assert_eq!(t.take(old), None, "a stale handle names nothing");
        // Forgetting the first id, whose entry pointed at the reused slot,
        // leaves the new task alone.
        t.forget(id(1));
        assert_eq!(t.waiting(id(2)), Some((new, meta(1))));
        assert_eq!(t.take(new), Some((id(2), meta(1))));
        // Generations wrap without naming a live task wrongly.
        t.slots[0].generation = GENERATION_MASK;
        let h = t.offer(id(3), meta(0)).1.expect("waits");
        assert!(t.take(h).is_some());
        assert_eq!(t.slots[0].generation, 0);
        assert_eq!(t.take(h), None);
    }

    #[test]
    fn reordered_and_duplicated_offers_take_each_id_once() {
        // A seeded shuffle of ids, each offered two or three times, with
        // takes and forgets interleaved: every id is taken exactly once
        // while its filter entry lives.
        let mut t = TaskTable::new();
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut offers: Vec<u64> = (0..2_000u64).flat_map(|s| [s, s, (s * 7) % 2_000]).collect();
        for i in (1..offers.len()).rev() {
            offers.swap(i, (next() % (i as u64 + 1)) as usize);
        }
        let mut taken = std::collections::HashSet::new();
        let mut live = Vec::new();
        for (k, s) in offers.into_iter().enumerate() {
            if let (_, Some(h)) = t.offer(id(s), meta(0)) {
                live.push(h);
            }
            if k % 3 == 0 {
                if let Some(h) = live.pop() {
                    let (got, _) = t.take(h).expect("live");
                    assert!(taken.insert(got), "taken twice");
                }
            }
        }
        for h in live {
            let (got, _) = t.take(h).expect("live");
            assert!(taken.insert(got), "taken twice");
        }
        assert_eq!(taken.len(), 2_000);
        assert_eq!(t.waiting_len(), 0);
        for s in 0..2_000 {
            t.forget(id(s));
        }
        assert!(t.map.is_empty());
        assert_eq!(t.drain_waiting(), Vec::new());
    }
}
