//! Model-checks `dataplane::ring` under every thread interleaving loom
//! explores (bounded preemptions).
//!
//! Run with:
//! `cargo test -p dataplane --features loom --test loom_ring --release`
#![cfg(feature = "loom")]

use dataplane::ring;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

/// Forced context switches per execution that loom explores. Bugs in
/// two-thread code almost always show within 2–3; 4 keeps the whole file
/// within seconds in release mode.
const PREEMPTIONS: usize = 4;

/// Explores interleavings with at most `preemptions` forced switches
/// (loom's recommendation for keeping models tractable).
fn model(preemptions: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(preemptions);
    builder.check(f);
}

/// Pops `n` items, yielding to loom while the ring is empty.
fn pop_n<T>(rx: &mut ring::Consumer<T>, n: usize) -> Vec<T> {
    let mut got = Vec::with_capacity(n);
    while got.len() < n {
        match rx.try_pop() {
            Some(v) => got.push(v),
            None => thread::yield_now(),
        }
    }
    got
}

/// Pushes `items` one by one, yielding to loom while the ring is full.
fn push_all<T>(tx: &mut ring::Producer<T>, items: impl IntoIterator<Item = T>) {
    for mut item in items {
        loop {
            match tx.try_push(item) {
                Ok(()) => break,
                Err(back) => {
                    item = back;
                    thread::yield_now();
                }
            }
        }
    }
}

#[test]
fn items_arrive_in_push_order() {
    model(PREEMPTIONS, || {
        let (mut tx, mut rx) = ring::channel::<u32>(4);
        let producer = thread::spawn(move || push_all(&mut tx, [1, 2, 3]));
        assert_eq!(pop_n(&mut rx, 3), [1, 2, 3]);
        producer.join().unwrap();
    });
}

#[test]
fn wrap_around_with_capacity_two() {
    model(PREEMPTIONS, || {
        let (mut tx, mut rx) = ring::channel::<u32>(2);
        let producer = thread::spawn(move || push_all(&mut tx, [1, 2, 3, 4]));
        assert_eq!(pop_n(&mut rx, 4), [1, 2, 3, 4]);
        producer.join().unwrap();
    });
}

#[test]
fn batches_are_published_whole_and_in_order() {
    model(PREEMPTIONS, || {
        let (mut tx, mut rx) = ring::channel::<u32>(2);
        let producer = thread::spawn(move || {
            let items = [1, 2, 3];
            let mut sent = 0;
            while sent < items.len() {
                let n = tx.push_slice(&items[sent..]);
                sent += n;
                if n == 0 {
                    thread::yield_now();
                }
            }
        });
        let mut got = Vec::new();
        let mut buf = [0u32; 2];
        while got.len() < 3 {
            // Alternate the two batched pops.
            let n = if got.len() % 2 == 0 {
                rx.pop_slice(&mut buf)
            } else {
                rx.pop_batch(2, |v| buf[0] = v).min(1)
            };
            got.extend_from_slice(&buf[..n]);
            if n == 0 {
                thread::yield_now();
            }
        }
        assert_eq!(got, [1, 2, 3]);
        producer.join().unwrap();
    });
}

#[test]
fn push_from_iter_publishes_once() {
    model(PREEMPTIONS, || {
        let (mut tx, mut rx) = ring::channel::<u32>(4);
        let producer = thread::spawn(move || {
            assert_eq!(tx.push_from_iter(&mut [7, 8, 9].into_iter()), 3);
        });
        let mut got = Vec::new();
        while got.len() < 3 {
            if rx.pop_batch(4, |v| got.push(v)) == 0 {
                thread::yield_now();
            }
        }
        assert_eq!(got, [7, 8, 9]);
        producer.join().unwrap();
    });
}

/// An item that counts its drops.
struct Counted(Arc<AtomicUsize>);
impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn leftovers_are_dropped_once_whoever_drops_last() {
    model(PREEMPTIONS, || {
        let drops = Arc::new(AtomicUsize::new(0));
        let (mut tx, mut rx) = ring::channel::<Counted>(2);
        let d = Arc::clone(&drops);
        let producer = thread::spawn(move || {
            assert!(tx.try_push(Counted(d.clone())).is_ok());
            assert!(tx.try_push(Counted(d)).is_ok());
            // `tx` drops here, possibly last.
        });
        let consumer = thread::spawn(move || {
            // Pop at most one; whatever is left stays for the ring's drop.
            drop(rx.try_pop());
        });
        producer.join().unwrap();
        consumer.join().unwrap();
        assert_eq!(drops.load(Ordering::Relaxed), 2);
    });
}

#[test]
fn abandonment_is_seen_after_every_push() {
    model(PREEMPTIONS, || {
        let (mut tx, mut rx) = ring::channel::<u32>(2);
        let producer = thread::spawn(move || {
            assert!(tx.try_push(1).is_ok());
            assert!(tx.try_push(2).is_ok());
        });
        while !rx.is_abandoned() {
            thread::yield_now();
        }
        // Everything pushed before the drop is visible now.
        assert_eq!(rx.try_pop(), Some(1));
        assert_eq!(rx.try_pop(), Some(2));
        assert_eq!(rx.try_pop(), None);
        producer.join().unwrap();
    });
}
