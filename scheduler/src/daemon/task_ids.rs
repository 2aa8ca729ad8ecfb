//! The control plane's task ids: the tasks waiting in a sub-cluster and
//! the duplicate filter.
//!
//! Each waiting task has a slot in a slab, and the scheduling cores know it
//! by its slot's handle (its `Request::id`), not by its task id: a plan or
//! a drop names its members by handle, so taking them out indexes the slab
//! instead of hashing.
//!
//! The duplicate filter is a window per frontend: for each of its staging
//! slots (an id's low field), the newest sequence number seen in that
//! slot, until when a repeat of it is ignored (its deadline), and where it
//! waits. Why not a set of ids: a set must hold every id until its
//! deadline (100k+ ids at 2 M tasks/s), so its two lookups per task (at
//! offer, at expiry) were mostly cache misses, ~12% of a saturated
//! daemon's I/O thread (node_path); the window holds one entry per slot,
//! indexed, and needs no expiry at all.
//!
//! What makes one entry per slot enough is how a frontend numbers its tasks
//! (`frontend/src/staging.rs`): a slot's next sequence number is used only
//! once the slot's previous task is over at the frontend (answered, given
//! up, or past its deadline), and a frontend resubmits a task (after its
//! link came back, or after a move) under its own id. So for a slot:
//! - the newest sequence number: a repeat is ignored until its deadline,
//!   as the set did (then the original cannot run any more);
//! - a newer one is a new task;
//! - an older one is a stale copy of a task the frontend is done with
//!   (a duplicated or reordered message): ignored (the set took it once
//!   its own deadline had passed, to run a task nobody awaits);
//! - except after the frontend registered again: a restarted frontend
//!   numbers from the start, so an older number is its new task. A
//!   frontend that only reconnected resubmits the newest number or newer,
//!   never an older one. Not told apart: a restarted frontend's new task
//!   whose id equals that of a task from its previous run still waiting
//!   here (a crash, a restart and a registration within that task's
//!   deadline; the set could not tell them apart either).
//!
//! Sequence numbers are compared modulo 2^32 (serial number arithmetic),
//! so a slot wraps around without a break. The cores never look at a
//! request's id beyond equality (a cancellation names one), so handing
//! them handles changes no decision.

use dataplane::time::Instant;
use dataplane::wire::{RemoteRef, TaskId};

/// What the cores know a waiting task by (its `Request::id`): its slot's
/// index in the low 32 bits and the slot's generation above, so that a
/// handle of a task that left names no later task of the same slot.
pub(super) type Handle = u64;

fn handle(index: u32, generation: u32) -> Handle {
    u64::from(generation) << 32 | u64::from(index)
}

fn split(h: Handle) -> (usize, u32) {
    ((h & u64::from(u32::MAX)) as usize, (h >> 32) as u32)
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

/// A slab slot: a waiting task, or free, with what a plan or a drop needs
/// of it, all on one cache line: a take (a plan's member, a drop) reads
/// and writes this line only. Why: with the meta in a second array and
/// the take also clearing the filter's entry, each take touched three
/// lines at random (TaskTable 2.8-3.6% of the daemon's CPU at shm 1 M).
#[derive(Clone, Copy, Debug)]
#[repr(align(64))]
struct Slot {
    id: u64,
    /// Bumped each time the slot is freed.
    generation: u32,
    waiting: bool,
    meta: TaskMeta,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 64);

impl Slot {
    /// Whether a handle of `generation` names this slot's waiting task.
    fn holds(&self, generation: u32) -> bool {
        self.waiting && self.generation == generation
    }
}

/// No waiting task (`SlotEntry::waiting`).
const NOT_WAITING: u32 = u32::MAX;

/// The newest id the filter saw in one staging slot of one frontend.
#[derive(Clone, Copy, Debug)]
struct SlotEntry {
    /// A repeat of `seq` is ignored before this (ZERO: released).
    until: Instant,
    seq: u32,
    /// The frontend's registration count when `seq` was taken (0: the
    /// entry is empty; counts skip 0).
    registration: u32,
    /// The slab index of `seq`'s task since it was offered (`NOT_WAITING`:
    /// none, or not known: a task whose entry a newer number took still
    /// waits in the slab, unnamed here). Not cleared when the task leaves
    /// (a take touches only its slab slot): a reader checks that the slot
    /// still holds this id, waiting ([`TaskTable::waiting_index`]).
    waiting: u32,
}

const EMPTY: SlotEntry = SlotEntry { until: Instant::ZERO, seq: 0, registration: 0, waiting: NOT_WAITING };

/// One frontend's window: its staging slots' entries, by slot index,
/// grown to the highest slot seen.
#[derive(Debug)]
struct Window {
    /// Counts the frontend's registrations from 1, wrapping past 0 to 1.
    registration: u32,
    slots: Vec<SlotEntry>,
}

impl Default for Window {
    fn default() -> Self {
        Window { registration: 1, slots: Vec::new() }
    }
}

/// Whether sequence number `a` is newer than `b` (modulo 2^32).
fn newer(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

/// What the filter makes of an id offered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// A repeat to ignore.
    Repeat,
    /// The slot's newest number again, its hold expired (or released).
    Again,
    /// A number the slot's entry does not hold.
    New,
}

/// Waiting tasks (a slab, by handle) and the duplicate filter (windows, by
/// frontend and staging slot).
#[derive(Debug)]
pub(super) struct TaskTable {
    /// By frontend id (`< MAX_FRONTENDS`), grown to the highest seen.
    windows: Vec<Window>,
    slots: Vec<Slot>,
    /// Free slot indices, reused last freed first (warm in cache).
    free: Vec<u32>,
    waiting: usize,
}

impl TaskTable {
    pub(super) fn new() -> Self {
        TaskTable {
            windows: Vec::new(),
            slots: Vec::with_capacity(1 << 12),
            free: Vec::with_capacity(1 << 12),
            waiting: 0,
        }
    }

    /// Tasks waiting.
    pub(super) fn waiting_len(&self) -> usize {
        self.waiting
    }

    /// Frontend `frontend` registered (again): from now on an older
    /// sequence number in one of its slots is a new task of a restarted
    /// frontend, not a stale copy.
    pub(super) fn frontend_registered(&mut self, frontend: u32) {
        let w = self.window_mut(TaskId::new(frontend, 0, 0));
        w.registration = match w.registration.wrapping_add(1) {
            0 => 1,
            r => r,
        };
    }

    /// The window of `id`'s frontend, created empty if need be.
    fn window_mut(&mut self, id: TaskId) -> &mut Window {
        let f = id.frontend() as usize;
        if self.windows.len() <= f {
            self.windows.resize_with(f + 1, Window::default);
        }
        &mut self.windows[f]
    }

    /// The entry of `id`'s slot, if it was ever written.
    fn entry(&self, id: TaskId) -> Option<&SlotEntry> {
        let w = self.windows.get(id.frontend() as usize)?;
        w.slots.get(id.slot() as usize).filter(|e| e.registration != 0)
    }

    fn entry_mut(&mut self, id: TaskId) -> Option<&mut SlotEntry> {
        let w = self.windows.get_mut(id.frontend() as usize)?;
        w.slots.get_mut(id.slot() as usize).filter(|e| e.registration != 0)
    }

    /// What the filter makes of `id` offered at `now`.
    fn verdict(&self, id: TaskId, now: Instant) -> Verdict {
        let Some(e) = self.entry(id) else { return Verdict::New };
        let seq = id.seq() as u32;
        if seq == e.seq {
            return if now < e.until { Verdict::Repeat } else { Verdict::Again };
        }
        let registration = self.windows[id.frontend() as usize].registration;
        if e.registration != registration || newer(seq, e.seq) {
            Verdict::New
        } else {
            Verdict::Repeat
        }
    }

    /// The slab index of the waiting task `id`, if its entry names it and
    /// its slot holds it still (the entry may name a slot the task left).
    fn waiting_index(&self, id: u64) -> Option<usize> {
        let t = TaskId(id);
        let e = self.entry(t).filter(|e| e.seq == t.seq() as u32 && e.waiting != NOT_WAITING)?;
        let i = e.waiting as usize;
        self.slots.get(i).filter(|s| s.waiting && s.id == id).map(|_| i)
    }

    /// The waiting task `id`: its handle and meta. None also for a task
    /// whose slot a newer number of its frontend took meanwhile (the
    /// frontend is done with it).
    pub(super) fn waiting(&self, id: u64) -> Option<(Handle, TaskMeta)> {
        let i = self.waiting_index(id)?;
        let s = &self.slots[i];
        Some((handle(i as u32, s.generation), s.meta))
    }

    /// Every waiting task as (handle, id, meta), in no order.
    pub(super) fn iter_waiting(&self) -> impl Iterator<Item = (Handle, u64, TaskMeta)> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.waiting)
            .map(|(i, s)| (handle(i as u32, s.generation), s.id, s.meta))
    }

    /// The task under handle `h` no longer waits (planned or dropped): its
    /// id and meta. None if `h` names no waiting task (it left already).
    pub(super) fn take(&mut self, h: Handle) -> Option<(u64, TaskMeta)> {
        let (i, generation) = split(h);
        let s = self.slots.get_mut(i).filter(|s| s.holds(generation))?;
        s.waiting = false;
        s.generation = s.generation.wrapping_add(1);
        let (id, meta) = (s.id, s.meta);
        self.free.push(i as u32);
        self.waiting -= 1;
        // The filter's entry keeps naming slot `i`: `waiting_index` checks
        // the slot (one random cache line less per take).
        Some((id, meta))
    }

    /// Every waiting task leaves: (id, meta), in no order.
    pub(super) fn drain_waiting(&mut self) -> Vec<(u64, TaskMeta)> {
        let handles: Vec<Handle> = self.iter_waiting().map(|(h, _, _)| h).collect();
        handles.into_iter().filter_map(|h| self.take(h)).collect()
    }

    /// Whether a copy of `id` offered at `now` would be ignored as a
    /// repeat.
    pub(super) fn seen(&self, id: u64, now: Instant) -> bool {
        self.verdict(TaskId(id), now) == Verdict::Repeat
    }

    /// The filter lets go of `id` (handed back as moved: its next attempt
    /// is a new submission). Nothing if its slot holds another number.
    pub(super) fn forget(&mut self, id: u64) {
        let t = TaskId(id);
        if let Some(e) = self.entry_mut(t).filter(|e| e.seq == t.seq() as u32) {
            e.until = Instant::ZERO;
        }
    }

    /// A task offered at `now`, to be held until `until` (its deadline):
    /// unless the filter makes it a repeat, its slot's entry holds it, and,
    /// if it does not wait already, it waits with `meta`. Returns whether
    /// it was not a repeat, and its handle if it now waits as `meta`. One
    /// indexed entry, no hash.
    pub(super) fn offer(&mut self, id: u64, now: Instant, until: Instant, meta: TaskMeta) -> (bool, Option<Handle>) {
        let t = TaskId(id);
        let verdict = self.verdict(t, now);
        if verdict == Verdict::Repeat {
            return (false, None);
        }
        let waits = if verdict == Verdict::Again { self.waiting_index(id) } else { None };
        let registration = self.window_mut(t).registration;
        let slot = t.slot() as usize;
        let w = self.window_mut(t);
        if w.slots.len() <= slot {
            // Grows to the highest slot the frontend uses (< MAX_SLOTS).
            w.slots.resize(slot + 1, EMPTY);
        }
        let e = &mut w.slots[slot];
        e.until = until;
        e.seq = t.seq() as u32;
        e.registration = registration;
        if waits.is_some() {
            // Still waits after its hold expired: held again, not taken
            // twice.
            return (true, None);
        }
        let i = match self.free.pop() {
            Some(i) => i,
            None => {
                // 2^32 waiting tasks would take > 100 GB: refused as a
                // repeat rather than a panic.
                let Ok(i) = u32::try_from(self.slots.len()) else { return (false, None) };
                if i == NOT_WAITING {
                    return (false, None);
                }
                self.slots.push(Slot { id, generation: 0, waiting: false, meta });
                i
            }
        };
        let s = &mut self.slots[i as usize];
        *s = Slot { id, generation: s.generation, waiting: true, meta };
        let h = handle(i, s.generation);
        self.window_mut(t).slots[slot].waiting = i;
        self.waiting += 1;
        (true, Some(h))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane::time::Duration;

    fn meta(model: u32) -> TaskMeta {
        TaskMeta { frontend: 3, input: RemoteRef::default(), model, attempt: 0 }
    }

    /// Frontend 3's id of sequence `seq` in staging slot `slot`.
    fn id(seq: u64, slot: u32) -> u64 {
        TaskId::new(3, seq, slot).0
    }

    fn at(ms: u64) -> Instant {
        Instant::ZERO + Duration::from_millis(ms)
    }

    #[test]
    fn a_repeat_is_ignored_until_its_deadline_and_a_handle_takes_once() {
        let mut t = TaskTable::new();
        let (fresh, h) = t.offer(id(1, 0), at(0), at(50), meta(7));
        assert!(fresh);
        let h = h.expect("waits");
        // A duplicated message: a repeat, not taken again.
        assert_eq!(t.offer(id(1, 0), at(1), at(51), meta(7)), (false, None));
        assert!(t.seen(id(1, 0), at(1)));
        assert_eq!(t.waiting(id(1, 0)), Some((h, meta(7))));
        assert_eq!(t.take(h), Some((id(1, 0), meta(7))));
        assert_eq!(t.take(h), None, "a handle takes once");
        assert_eq!(t.waiting(id(1, 0)), None);
        // Planned, before its deadline: a late copy is a repeat.
        assert_eq!(t.offer(id(1, 0), at(49), at(99), meta(7)), (false, None));
        assert_eq!(t.waiting_len(), 0);
        // Past its deadline the original cannot run: a copy is new.
        assert!(!t.seen(id(1, 0), at(50)));
        let (fresh, h2) = t.offer(id(1, 0), at(50), at(100), meta(7));
        assert!(fresh && h2.is_some());
        // Handed back (forgotten): its next attempt is new at once.
        assert!(t.take(h2.unwrap()).is_some());
        t.forget(id(1, 0));
        assert!(t.offer(id(1, 0), at(51), at(101), meta(7)).1.is_some());
    }

    /// A take leaves the filter's entry naming the slab slot; once the
    /// slot holds another task, the entry names no waiting task, and a
    /// copy past its hold waits anew beside the other.
    #[test]
    fn an_entry_naming_a_slot_its_task_left_names_no_waiting_task() {
        let mut t = TaskTable::new();
        let a = t.offer(id(1, 0), at(0), at(10), meta(1)).1.expect("waits");
        assert!(t.take(a).is_some());
        let b = t.offer(id(1, 1), at(1), at(11), meta(2)).1.expect("waits");
        assert_eq!(split(a).0, split(b).0, "the freed slab slot is reused");
        assert_eq!(t.waiting(id(1, 0)), None, "the entry's slot holds another task");
        let c = t.offer(id(1, 0), at(20), at(30), meta(1)).1.expect("a copy past its hold waits anew");
        assert_ne!(split(c).0, split(b).0);
        assert_eq!(t.waiting(id(1, 0)), Some((c, meta(1))));
        assert_eq!(t.waiting(id(1, 1)), Some((b, meta(2))));
        assert_eq!(t.waiting_len(), 2);
    }

    #[test]
    fn a_task_still_waiting_when_its_hold_expires_is_held_again_not_taken_twice() {
        let mut t = TaskTable::new();
        let h = t.offer(id(2, 5), at(0), at(10), meta(1)).1.expect("waits");
        assert_eq!(t.offer(id(2, 5), at(20), at(30), meta(1)), (true, None));
        assert!(t.seen(id(2, 5), at(29)), "held again until the copy's deadline");
        assert_eq!(t.waiting(id(2, 5)), Some((h, meta(1))));
        assert_eq!(t.take(h), Some((id(2, 5), meta(1))));
        assert!(t.free.len() == 1 && t.waiting_len() == 0);
    }

    #[test]
    fn in_a_slot_a_newer_number_is_new_an_older_one_a_stale_copy_across_wraparound() {
        let mut t = TaskTable::new();
        for (older, newest) in [(5u64, 6u64), (u64::from(u32::MAX), 0), (u64::from(u32::MAX) - 1, 1)] {
            let mut t2 = TaskTable::new();
            let a = t2.offer(id(older, 9), at(0), at(50), meta(0)).1.expect("waits");
            assert!(t2.take(a).is_some());
            // The frontend is done with `older` and reuses the slot.
            let b = t2.offer(id(newest, 9), at(1), at(51), meta(0)).1.expect("a newer number is new");
            // A reordered or duplicated copy of the older task, even past
            // its own deadline: the frontend awaits nothing of it.
            assert_eq!(t2.offer(id(older, 9), at(60), at(110), meta(0)), (false, None));
            assert!(t2.seen(id(older, 9), at(60)));
            assert_eq!(t2.take(b).map(|(x, _)| x), Some(id(newest, 9)));
        }
        // Slots are independent.
        assert!(t.offer(id(7, 1), at(0), at(50), meta(0)).0);
        assert!(t.offer(id(3, 2), at(0), at(50), meta(0)).0);
        assert!(t.offer(id(7, 2), at(0), at(50), meta(0)).0);
        assert!(!t.offer(id(3, 2), at(0), at(50), meta(0)).0);
        // Other frontends too.
        assert!(t.offer(TaskId::new(4, 3, 2).0, at(0), at(50), meta(0)).0);
        assert_eq!(t.waiting_len(), 4);
    }

    #[test]
    fn after_a_registration_an_older_number_is_a_restarted_frontends_new_task() {
        let mut t = TaskTable::new();
        t.frontend_registered(3);
        let h = t.offer(id(40, 0), at(0), at(50), meta(0)).1.expect("waits");
        // The frontend reconnects: a resubmission of the same id before its
        // deadline is still a repeat.
        t.frontend_registered(3);
        assert_eq!(t.offer(id(40, 0), at(5), at(55), meta(0)), (false, None));
        assert_eq!(t.waiting_len(), 1);
        // It restarted instead: it numbers from 1 again.
        let h1 = t.offer(id(1, 0), at(6), at(56), meta(0)).1.expect("new");
        // ... and its next copies of that are repeats again.
        assert_eq!(t.offer(id(1, 0), at(7), at(57), meta(0)), (false, None));
        // The earlier task still waits, unnamed by its slot: taking it works
        // and leaves the slot's entry alone.
        assert_eq!(t.waiting(id(40, 0)), None);
        assert_eq!(t.take(h).map(|(x, _)| x), Some(id(40, 0)));
        assert_eq!(t.waiting(id(1, 0)).map(|(x, _)| x), Some(h1));
        // Registrations wrap past 0.
        t.windows[3].registration = u32::MAX;
        t.frontend_registered(3);
        assert_eq!(t.windows[3].registration, 1);
    }

    #[test]
    fn a_reused_slab_slot_gets_a_new_generation_so_stale_handles_take_nothing() {
        let mut t = TaskTable::new();
        let old = t.offer(id(1, 0), at(0), at(50), meta(0)).1.expect("waits");
        assert!(t.take(old).is_some());
        let new = t.offer(id(1, 1), at(0), at(50), meta(1)).1.expect("waits");
        assert_eq!(old & u64::from(u32::MAX), new & u64::from(u32::MAX), "the slot is reused");
        assert_ne!(old, new);
        assert_eq!(t.take(old), None, "a stale handle names nothing");
        assert_eq!(t.waiting(id(1, 0)), None, "the first id's entry names no slot any more");
        assert_eq!(t.waiting(id(1, 1)), Some((new, meta(1))));
        assert_eq!(t.take(new), Some((id(1, 1), meta(1))));
        // Generations wrap without naming a live task wrongly.
        t.slots[0].generation = u32::MAX;
        let h = t.offer(id(2, 0), at(0), at(50), meta(0)).1.expect("waits");
        assert!(t.take(h).is_some());
        assert_eq!(t.slots[0].generation, 0);
        assert_eq!(t.take(h), None);
    }

    #[test]
    fn staging_numbered_tasks_duplicated_and_reordered_are_each_taken_once() {
        // 64 staging slots, each used for 40 tasks in turn (a slot's next
        // number only after its previous task was taken, as a frontend
        // does); every message is sent two or three times and delivered in
        // a seeded shuffled order within a window of 200 messages.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut t = TaskTable::new();
        let mut taken = std::collections::HashSet::new();
        let mut in_net: Vec<u64> = Vec::new();
        let mut seq: Vec<Option<u64>> = vec![None; 64];
        let mut now = 0u64;
        let mut sent = 0;
        while sent < 64 * 40 || !in_net.is_empty() {
            // Each slot with nothing waiting sends its next task.
            if sent < 64 * 40 {
                let slot = (next() % 64) as usize;
                let current = seq[slot].map(|q| id(q, slot as u32));
                if current.is_none_or(|c| taken.contains(&c)) {
                    let q = seq[slot].map_or(u64::from(u32::MAX) - 20, |q| (q + 1) & u64::from(u32::MAX));
                    seq[slot] = Some(q);
                    let copies = 2 + next() % 2;
                    for _ in 0..copies {
                        in_net.push(id(q, slot as u32));
                    }
                    sent += 1;
                }
            }
            // Deliver one message from near the front, out of order.
            if !in_net.is_empty() && (next() % 2 == 0 || sent >= 64 * 40) {
                let k = (next() % in_net.len().min(200) as u64) as usize;
                let m = in_net.remove(k);
                now += 1;
                if let (_, Some(h)) = t.offer(m, at(now), at(now + 1_000_000), meta(0)) {
                    let (got, _) = t.take(h).expect("live");
                    assert!(taken.insert(got), "taken twice");
                }
            }
        }
        assert_eq!(taken.len(), 64 * 40);
        assert_eq!(t.waiting_len(), 0);
        assert_eq!(t.drain_waiting(), Vec::new());
    }
}
