//! The SPSC ring the runtime uses: `rtrb`, behind the small API the
//! workers need.
//!
//! The one in-process ring. A hand-written rtrb-style ring (loom-checked)
//! used to sit beside it; measured side by side (`cargo bench -p dataplane
//! --bench rings`, docs/benchmarks.md) it reached 0.88x rtrb's single-item
//! and 0.96x its batched throughput with equal round-trip latency, so it was
//! removed and the crate kept, as the project's rule for hand-written code
//! demands (docs/decisions.md "SPSC ring"). The bench still compares rtrb
//! with crossbeam's `ArrayQueue`.

/// Sending end.
pub struct Producer<T>(rtrb::Producer<T>);
/// Receiving end.
pub struct Consumer<T>(rtrb::Consumer<T>);

/// A ring of at least `capacity` slots.
pub fn channel<T>(capacity: usize) -> (Producer<T>, Consumer<T>) {
    let (p, c) = rtrb::RingBuffer::new(capacity.max(1));
    (Producer(p), Consumer(c))
}

impl<T> Producer<T> {
    /// Pushes `value`, or hands it back when the ring is full.
    #[inline]
    pub fn try_push(&mut self, value: T) -> Result<(), T> {
        self.0.push(value).map_err(|rtrb::PushError::Full(v)| v)
    }

    /// Free slots.
    #[inline]
    pub fn free_slots(&self) -> usize {
        self.0.slots()
    }

    /// True when the consumer is gone.
    pub fn is_abandoned(&self) -> bool {
        self.0.is_abandoned()
    }
}

impl<T> Consumer<T> {
    /// Pops one item.
    #[inline]
    pub fn try_pop(&mut self) -> Option<T> {
        self.0.pop().ok()
    }

    /// Pops up to `max` items into `f`, publishing the new head once.
    #[inline]
    pub fn pop_batch(&mut self, max: usize, mut f: impl FnMut(T)) -> usize {
        let n = self.0.slots().min(max);
        if n == 0 {
            return 0;
        }
        match self.0.read_chunk(n) {
            Ok(chunk) => {
                for v in chunk {
                    f(v);
                }
                n
            }
            Err(_) => 0,
        }
    }

    /// True when nothing is queued.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// True when the producer is gone.
    pub fn is_abandoned(&self) -> bool {
        self.0.is_abandoned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_batches_and_full() {
        let (mut tx, mut rx) = channel::<u32>(4);
        for i in 0..4 {
            assert!(tx.try_push(i).is_ok());
        }
        assert_eq!(tx.try_push(9), Err(9));
        let mut got = Vec::new();
        assert_eq!(rx.pop_batch(3, |v| got.push(v)), 3);
        assert_eq!(rx.try_pop(), Some(3));
        assert!(rx.is_empty() && rx.pop_batch(8, |_| ()) == 0);
        assert_eq!(got, vec![0, 1, 2]);
        drop(tx);
        assert!(rx.is_abandoned());
    }
}
