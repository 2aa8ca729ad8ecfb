//! Property tests of `dataplane::ring`: what goes in comes out, in order,
//! under random interleavings of every push and pop flavour, on one thread
//! against a model and across two threads.

use std::collections::VecDeque;
use std::thread;

use dataplane::ring;
use proptest::prelude::*;
use proptest::test_runner::RngSeed;

/// One operation on the ring, applied by the single-threaded test.
#[derive(Clone, Debug)]
enum Op {
    Push,
    PushSlice(usize),
    PushIter(usize),
    Pop,
    PopBatch(usize),
    PopSlice(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => Just(Op::Push),
        1 => (0usize..12).prop_map(Op::PushSlice),
        1 => (0usize..12).prop_map(Op::PushIter),
        3 => Just(Op::Pop),
        1 => (0usize..12).prop_map(Op::PopBatch),
        1 => (0usize..12).prop_map(Op::PopSlice),
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
        requested in 1usize..10,
        ops in proptest::collection::vec(op(), 0..200),
    ) {
        let (mut tx, mut rx) = ring::channel::<u64>(requested);
        let capacity = tx.capacity();
        prop_assert!(capacity.is_power_of_two() && capacity >= requested);
        let mut model = VecDeque::new();
        let mut next = 0u64;
        for op in ops {
            let free = capacity - model.len();
            match op {
                Op::Push => {
                    let pushed = tx.try_push(next).is_ok();
                    prop_assert_eq!(pushed, free > 0);
                    if pushed {
                        model.push_back(next);
                        next += 1;
                    }
                }
                Op::PushSlice(len) => {
                    let items: Vec<u64> = (next..next + len as u64).collect();
                    let n = tx.push_slice(&items);
                    prop_assert_eq!(n, len.min(free));
                    model.extend(&items[..n]);
                    next += n as u64;
                }
                Op::PushIter(len) => {
                    let mut items = next..next + len as u64;
                    let n = tx.push_from_iter(&mut items);
                    prop_assert_eq!(n, len.min(free));
                    prop_assert_eq!(items.next(), (n < len).then_some(next + n as u64));
                    model.extend(next..next + n as u64);
                    next += n as u64;
                }
                Op::Pop => prop_assert_eq!(rx.try_pop(), model.pop_front()),
                Op::PopBatch(max) => {
                    let mut got = Vec::new();
                    let n = rx.pop_batch(max, |v| got.push(v));
                    prop_assert_eq!(n, got.len());
                    let want: Vec<u64> = model.drain(..max.min(model.len())).collect();
                    prop_assert_eq!(got, want);
                }
                Op::PopSlice(len) => {
                    let mut out = vec![0u64; len];
                    let n = rx.pop_slice(&mut out);
                    let want: Vec<u64> = model.drain(..len.min(model.len())).collect();
                    prop_assert_eq!(&out[..n], &want[..]);
                }
            }
            prop_assert_eq!(rx.len(), model.len());
            prop_assert_eq!(tx.free_slots(), capacity - model.len());
        }
    }
}

proptest! {
    #![proptest_config(config(24))]

    /// A producer and a consumer thread, each mixing single and batched
    /// operations with random sizes, move `0..count` through a small ring;
    /// the consumer sees exactly that sequence. Full/empty rings yield the
    /// CPU rather than spin.
    #[test]
    fn two_threads_preserve_the_sequence(
        requested in 1usize..32,
        count in 0u64..20_000,
        push_sizes in proptest::collection::vec(0usize..9, 1..16),
        pop_sizes in proptest::collection::vec(0usize..9, 1..16),
    ) {
        let (mut tx, mut rx) = ring::channel::<u64>(requested);
        let producer = thread::spawn(move || {
            let mut next = 0u64;
            let mut step = 0usize;
            while next < count {
                let size = push_sizes[step % push_sizes.len()];
                step += 1;
                let n = match size {
                    0 => usize::from(tx.try_push(next).is_ok()),
                    1..=4 => {
                        let end = (next + size as u64).min(count);
                        let items: Vec<u64> = (next..end).collect();
                        tx.push_slice(&items)
                    }
                    _ => tx.push_from_iter(&mut (next..count).take(size)),
                };
                next += n as u64;
                if n == 0 {
                    thread::yield_now();
                }
            }
        });
        let mut got = Vec::with_capacity(count as usize);
        let mut step = 0usize;
        let mut buf = [0u64; 8];
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
                1..=4 => rx.pop_batch(size, |v| got.push(v)),
                _ => {
                    let n = rx.pop_slice(&mut buf[..size]);
                    got.extend_from_slice(&buf[..n]);
                    n
                }
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
