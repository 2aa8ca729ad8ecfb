//! Property tests of `dataplane::spsc`, the runtime's ring (rtrb behind the
//! API the workers use): what goes in comes out, in order, under random
//! interleavings of single and batched pops, on one thread against a model
//! and across two threads. What is tested is our wrapper's contract
//! (`pop_batch` publishing a chunk, full and empty answers), not rtrb's
//! internals.

use std::collections::VecDeque;
use std::thread;

use dataplane::spsc;
use proptest::prelude::*;
use proptest::test_runner::RngSeed;

/// One operation on the ring, applied by the single-threaded test.
#[derive(Clone, Debug)]
enum Op {
    Push,
    Pop,
    PopBatch(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::Push),
        3 => Just(Op::Pop),
        1 => (0usize..12).prop_map(Op::PopBatch),
    ]
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        rng_seed: RngSeed::Fixed(0x51ce_5eed),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(512))]

    /// Every result matches a bounded `VecDeque` model step by step.
    #[test]
    fn single_thread_matches_a_queue_model(
        capacity in 1usize..10,
        ops in proptest::collection::vec(op(), 0..200),
    ) {
        let (mut tx, mut rx) = spsc::channel::<u64>(capacity);
        let mut model = VecDeque::new();
        let mut next = 0u64;
        for op in ops {
            let free = capacity - model.len();
            match op {
                Op::Push => {
                    let pushed = tx.try_push(next);
                    prop_assert_eq!(pushed.is_ok(), free > 0);
                    match pushed {
                        Ok(()) => {
                            model.push_back(next);
                            next += 1;
                        }
                        Err(back) => prop_assert_eq!(back, next, "a full ring hands the item back"),
                    }
                }
                Op::Pop => prop_assert_eq!(rx.try_pop(), model.pop_front()),
                Op::PopBatch(max) => {
                    let mut got = Vec::new();
                    let n = rx.pop_batch(max, |v| got.push(v));
                    prop_assert_eq!(n, got.len());
                    let want: Vec<u64> = model.drain(..max.min(model.len())).collect();
                    prop_assert_eq!(got, want);
                }
            }
            prop_assert_eq!(rx.is_empty(), model.is_empty());
            prop_assert_eq!(tx.free_slots(), capacity - model.len());
        }
        prop_assert!(!rx.is_abandoned() && !tx.is_abandoned());
        drop(rx);
        prop_assert!(tx.is_abandoned());
    }
}

proptest! {
    #![proptest_config(config(24))]

    /// A producer and a consumer thread move `0..count` through a small
    /// ring, the consumer mixing single pops and batches of random sizes;
    /// it sees exactly that sequence. Full/empty rings yield the CPU rather
    /// than spin.
    #[test]
    fn two_threads_preserve_the_sequence(
        capacity in 1usize..32,
        count in 0u64..20_000,
        pop_sizes in proptest::collection::vec(0usize..9, 1..16),
    ) {
        let (mut tx, mut rx) = spsc::channel::<u64>(capacity);
        let producer = thread::spawn(move || {
            let mut next = 0u64;
            while next < count {
                match tx.try_push(next) {
                    Ok(()) => next += 1,
                    Err(_) => thread::yield_now(),
                }
            }
        });
        let mut got = Vec::with_capacity(count as usize);
        let mut step = 0usize;
        while (got.len() as u64) < count {
            let size = pop_sizes[step % pop_sizes.len()];
            step += 1;
            let n = match size {
                0 => match rx.try_pop() {
                    Some(v) => {
                        got.push(v);
                        1
                    }
                    None => 0,
                },
                _ => rx.pop_batch(size, |v| got.push(v)),
            };
            if n == 0 {
                thread::yield_now();
            }
        }
        producer.join().expect("producer panicked");
        prop_assert!(rx.is_abandoned());
        prop_assert_eq!(rx.try_pop(), None);
        prop_assert!(got.iter().copied().eq(0..count));
    }
}
