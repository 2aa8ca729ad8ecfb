//! Which batch ids a worker has taken, so a duplicated plan runs once.

/// The batch ids a worker has taken: the highest, and which of the
/// [`SeenBatches::SPAN`] ids below it. The scheduler numbers batches in
/// increasing order (with gaps: the ids are shared by every backend), so
/// an id already marked is a duplicate and an unmarked lower one is a plan
/// that was overtaken. An id more than `SPAN` below the highest is too old
/// to tell and is taken as a duplicate (a plan that late could not run in
/// time anyway). Fixed size: no allocation per plan.
#[derive(Debug, Default)]
pub(super) struct SeenBatches {
    high: Option<u64>,
    bits: [u64; (SeenBatches::SPAN / 64) as usize],
}

impl SeenBatches {
    pub(super) const SPAN: u64 = 1024;

    fn bit(id: u64) -> (usize, u64) {
        let i = id % Self::SPAN;
        ((i / 64) as usize, 1 << (i % 64))
    }

    /// Marks `id`; returns false if it was already taken (or is too old).
    pub(super) fn insert(&mut self, id: u64) -> bool {
        let high = match self.high {
            None => id,
            Some(h) if id > h => {
                if id - h >= Self::SPAN {
                    self.bits = [0; (Self::SPAN / 64) as usize];
                } else {
                    for x in h + 1..id {
                        let (w, m) = Self::bit(x);
                        self.bits[w] &= !m;
                    }
                    let (w, m) = Self::bit(id);
                    self.bits[w] &= !m;
                }
                id
            }
            Some(h) if h - id >= Self::SPAN => return false,
            Some(h) => h,
        };
        self.high = Some(high);
        let (w, m) = Self::bit(id);
        if self.bits[w] & m != 0 {
            return false;
        }
        self.bits[w] |= m;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::SeenBatches;

    #[test]
    fn seen_batches_take_each_id_once_and_accept_overtaken_ones() {
        let mut s = SeenBatches::default();
        assert!(s.insert(10));
        assert!(!s.insert(10), "duplicate");
        assert!(s.insert(14));
        assert!(s.insert(12), "overtaken by 14, still new");
        assert!(!s.insert(12));
        assert!(s.insert(10 + SeenBatches::SPAN + 5), "far ahead clears the window");
        assert!(!s.insert(14), "too old to tell: taken as a duplicate");
        assert!(s.insert(10 + SeenBatches::SPAN + 4));
        // The slot of an old id is reused by a new one in the window.
        let mut t = SeenBatches::default();
        assert!(t.insert(0));
        assert!(t.insert(SeenBatches::SPAN - 1));
        assert!(t.insert(SeenBatches::SPAN));
        assert!(!t.insert(SeenBatches::SPAN));
    }
}
