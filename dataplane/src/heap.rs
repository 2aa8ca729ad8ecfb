//! An indexed binary min-heap over dense `u32` ids.
//!
//! Each id is in the heap at most once, with one key. `set` inserts or
//! re-keys, `remove` takes an id out, `peek` gives the smallest `(key, id)`;
//! all are `O(log n)`. Ties between equal keys go to the smaller id, so
//! every order is deterministic. Storage grows only when a new, larger id is
//! first seen: preallocate with [`IndexedHeap::with_ids`] and the heap never
//! allocates again.
//!
//! The scheduling cores use it for GPU free times, model wake-up times and
//! candidate orderings, where "re-key this entry" is the common operation and
//! a plain `BinaryHeap` with lazy deletion would grow without bound.

const ABSENT: u32 = u32::MAX;

/// Room of [`IndexedHeap::smallest`]'s frontier: up to `N + 1` entries
/// for `N` taken (each taken entry leaves and adds at most two).
const FRONTIER: usize = 8;

/// A min-heap of `(key, id)` pairs with one entry per id.
#[derive(Clone, Debug)]
pub struct IndexedHeap<K> {
    heap: Vec<(K, u32)>,
    /// `pos[id]` is the id's index in `heap`, or [`ABSENT`].
    pos: Vec<u32>,
}

impl<K: Ord + Copy> Default for IndexedHeap<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Ord + Copy> IndexedHeap<K> {
    /// An empty heap.
    pub fn new() -> Self {
        IndexedHeap { heap: Vec::new(), pos: Vec::new() }
    }

    /// An empty heap with room for ids `0..ids` without further allocation.
    pub fn with_ids(ids: usize) -> Self {
        IndexedHeap { heap: Vec::with_capacity(ids), pos: vec![ABSENT; ids] }
    }

    /// Number of ids in the heap.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// True when no id is in the heap.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// True when `id` is in the heap.
    pub fn contains(&self, id: u32) -> bool {
        self.slot(id).is_some()
    }

    /// The key of `id`, if present.
    pub fn get(&self, id: u32) -> Option<K> {
        self.slot(id).map(|i| self.heap[i].0)
    }

    /// The smallest `(key, id)`, if any.
    pub fn peek(&self) -> Option<(K, u32)> {
        self.heap.first().copied()
    }

    /// The `N` smallest `(key, id)`, smallest first (`None` past the
    /// heap's length). The next smallest is always a child of one already
    /// taken (or the root), so this walks a frontier of at most `N + 1`
    /// entries from the root: about `N^2 / 2` comparisons, meant for small
    /// `N` (the RankThread asks for three on every grant).
    pub fn smallest<const N: usize>(&self) -> [Option<(K, u32)>; N] {
        let mut out = [None; N];
        if N > FRONTIER - 1 {
            return self.smallest_by_levels();
        }
        // Heap indices whose parent is taken; unordered.
        let mut frontier = [0usize; FRONTIER];
        let mut len = usize::from(!self.heap.is_empty());
        for slot in out.iter_mut() {
            let Some(best) = (0..len).min_by_key(|&f| self.heap[frontier[f]]) else { break };
            let taken = frontier[best];
            *slot = Some(self.heap[taken]);
            len -= 1;
            frontier[best] = frontier[len];
            for child in [2 * taken + 1, 2 * taken + 2] {
                if child < self.heap.len() {
                    frontier[len] = child;
                    len += 1;
                }
            }
        }
        out
    }

    /// [`Self::smallest`] for a larger `N`: the `N` smallest lie in the
    /// heap's first `N` levels, so this reads at most `2^N - 1` entries.
    fn smallest_by_levels<const N: usize>(&self) -> [Option<(K, u32)>; N] {
        let mut out = [None; N];
        let levels = u32::try_from(N).unwrap_or(u32::MAX).min(usize::BITS - 1);
        for &e in self.heap.iter().take((1usize << levels) - 1) {
            // Insertion into the sorted prefix; `None` sorts last here.
            let mut cur = Some(e);
            for slot in out.iter_mut() {
                match (*slot, cur) {
                    (None, _) => {
                        *slot = cur;
                        break;
                    }
                    (Some(have), Some(c)) if c < have => {
                        *slot = cur;
                        cur = Some(have);
                    }
                    _ => {}
                }
            }
        }
        out
    }

    /// Removes and returns the smallest `(key, id)`.
    pub fn pop(&mut self) -> Option<(K, u32)> {
        let top = self.peek()?;
        self.remove_at(0);
        Some(top)
    }

    /// Inserts `id` with `key`, or changes its key if it is present.
    pub fn set(&mut self, id: u32, key: K) {
        match self.slot(id) {
            Some(i) => {
                let old = self.heap[i].0;
                self.heap[i].0 = key;
                if key < old {
                    self.sift_up(i);
                } else {
                    self.sift_down(i);
                }
            }
            None => {
                let idx = id as usize;
                if idx >= self.pos.len() {
                    self.pos.resize(idx + 1, ABSENT);
                }
                let i = self.heap.len();
                self.heap.push((key, id));
                self.pos[idx] = i as u32;
                self.sift_up(i);
            }
        }
    }

    /// Removes `id`; returns its key if it was present.
    pub fn remove(&mut self, id: u32) -> Option<K> {
        let i = self.slot(id)?;
        let key = self.heap[i].0;
        self.remove_at(i);
        Some(key)
    }

    /// Removes every entry, keeping the storage.
    pub fn clear(&mut self) {
        for &(_, id) in &self.heap {
            self.pos[id as usize] = ABSENT;
        }
        self.heap.clear();
    }

    /// Iterates over the entries in heap order (not sorted).
    pub fn iter(&self) -> impl Iterator<Item = (K, u32)> + '_ {
        self.heap.iter().copied()
    }

    fn slot(&self, id: u32) -> Option<usize> {
        match self.pos.get(id as usize) {
            Some(&p) if p != ABSENT => Some(p as usize),
            _ => None,
        }
    }

    fn remove_at(&mut self, i: usize) {
        let last = self.heap.len() - 1;
        let removed_id = self.heap[i].1;
        self.heap.swap(i, last);
        self.heap.pop();
        self.pos[removed_id as usize] = ABSENT;
        if i < self.heap.len() {
            self.pos[self.heap[i].1 as usize] = i as u32;
            self.sift_down(i);
            self.sift_up(i);
        }
    }

    /// Moves the entry at `i` up to its place. The entries it passes move
    /// down one level each into the hole it leaves, and it is written once
    /// at the end: the same layout as swapping it up step by step, at a
    /// third of the writes (the simulator's and the scheduling cores'
    /// hottest loop).
    fn sift_up(&mut self, mut i: usize) {
        let entry = self.heap[i];
        while i > 0 {
            let parent = (i - 1) / 2;
            let above = self.heap[parent];
            if entry < above {
                self.heap[i] = above;
                self.pos[above.1 as usize] = i as u32;
                i = parent;
            } else {
                break;
            }
        }
        self.heap[i] = entry;
        self.pos[entry.1 as usize] = i as u32;
    }

    /// Moves the entry at `i` down to its place, the smaller child moving
    /// up into the hole at each level (see [`Self::sift_up`]).
    fn sift_down(&mut self, mut i: usize) {
        let n = self.heap.len();
        let entry = self.heap[i];
        loop {
            let l = 2 * i + 1;
            if l >= n {
                break;
            }
            let r = l + 1;
            let child = if r < n && self.heap[r] < self.heap[l] { r } else { l };
            let below = self.heap[child];
            if below < entry {
                self.heap[i] = below;
                self.pos[below.1 as usize] = i as u32;
                i = child;
            } else {
                break;
            }
        }
        self.heap[i] = entry;
        self.pos[entry.1 as usize] = i as u32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[derive(Debug, Clone)]
    enum Op {
        Set(u32, u16),
        Remove(u32),
        Pop,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u32..40, any::<u16>()).prop_map(|(i, k)| Op::Set(i, k)),
            (0u32..40).prop_map(Op::Remove),
            Just(Op::Pop),
        ]
    }

    proptest! {
        #[test]
        fn matches_a_sorted_model(ops in proptest::collection::vec(op(), 0..300)) {
            let mut heap = IndexedHeap::new();
            let mut model: BTreeMap<u32, u16> = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Set(id, k) => { heap.set(id, k); model.insert(id, k); }
                    Op::Remove(id) => { prop_assert_eq!(heap.remove(id), model.remove(&id)); }
                    Op::Pop => {
                        let want = model.iter().map(|(&id, &k)| (k, id)).min();
                        prop_assert_eq!(heap.pop(), want);
                        if let Some((_, id)) = want { model.remove(&id); }
                    }
                }
                prop_assert_eq!(heap.len(), model.len());
                let mut sorted: Vec<(u16, u32)> = model.iter().map(|(&id, &k)| (k, id)).collect();
                sorted.sort_unstable();
                prop_assert_eq!(heap.peek(), sorted.first().copied());
                let three: [Option<(u16, u32)>; 3] = heap.smallest();
                prop_assert_eq!(three.to_vec(), (0..3).map(|i| sorted.get(i).copied()).collect::<Vec<_>>());
                let seven: [Option<(u16, u32)>; 7] = heap.smallest();
                prop_assert_eq!(seven.to_vec(), (0..7).map(|i| sorted.get(i).copied()).collect::<Vec<_>>());
                let nine: [Option<(u16, u32)>; 9] = heap.smallest();
                prop_assert_eq!(nine.to_vec(), (0..9).map(|i| sorted.get(i).copied()).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn preallocated_heap_does_not_grow() {
        let mut heap = IndexedHeap::with_ids(8);
        let cap = heap.heap.capacity();
        for round in 0..100u32 {
            for id in 0..8 {
                heap.set(id, (id * 7 + round) % 13);
            }
            while heap.pop().is_some() {}
        }
        assert_eq!(heap.heap.capacity(), cap);
        heap.set(3, 1);
        heap.clear();
        assert!(heap.is_empty() && !heap.contains(3));
    }
}
