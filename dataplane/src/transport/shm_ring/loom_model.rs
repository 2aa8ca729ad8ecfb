//! Model check of the shared-memory ring's protocol: the producer and
//! consumer code of `shm_ring` itself, run over loom's atomics and cells
//! (a [`RingMemory`] in loom's world instead of a mapping) under every
//! interleaving loom explores with a bounded number of preemptions.
//!
//! What loom checks here: every data byte the consumer reads was written
//! before the producer published it (a cell accessed by both threads
//! without a happens-before edge fails the run), bytes arrive in order
//! across the wrap and a full ring, and a consumer that goes to sleep is
//! always woken (a lost wake-up leaves it blocked on the modelled socket
//! after the producer is done: loom reports the deadlock).
//!
//! Run by the CI's loom step:
//! `cargo test --release -p dataplane --features loom --lib shm_ring::loom_model`

use loom::cell::UnsafeCell;
use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;

use super::doorbell::{self, Bell, BellMemory, BELL_WORDS};
use super::{impl_word, Header, Padded, Ringer, RingConsumer, RingMemory, RingProducer, Word, BELL};

impl_word!(AtomicU64, u64);
impl_word!(AtomicU32, u32);

/// Forced context switches per execution. Ordering bugs in two-thread
/// code show within 2-3; 3 keeps each test to seconds in release.
const PREEMPTIONS: usize = 3;

/// A ring in loom's world: the header's words are loom atomics and each
/// data byte a loom cell, shared by the two ends through an `Arc`.
struct LoomRing {
    header: Header<AtomicU64, AtomicU32>,
    data: Box<[UnsafeCell<u8>]>,
}

#[derive(Clone)]
struct LoomMemory(Arc<LoomRing>);

impl RingMemory for LoomMemory {
    type W64 = AtomicU64;
    type W32 = AtomicU32;

    fn header(&self) -> &Header<AtomicU64, AtomicU32> {
        &self.0.header
    }

    fn capacity(&self) -> u64 {
        self.0.data.len() as u64
    }

    fn fence_seq_cst(&self) {
        fence(Ordering::SeqCst);
    }

    unsafe fn write_data(&self, at: usize, src: &[u8]) {
        for (cell, byte) in self.0.data[at..at + src.len()].iter().zip(src) {
            // SAFETY: loom checks that no other thread accesses this cell
            // concurrently; that is the property under test.
            cell.with_mut(|p| unsafe { *p = *byte });
        }
    }

    unsafe fn read_data(&self, at: usize, dst: *mut u8, len: usize) {
        for (i, cell) in self.0.data[at..at + len].iter().enumerate() {
            // SAFETY: `dst` is valid for `len` bytes (caller); loom checks
            // the cell read for races with the producer's writes.
            cell.with(|p| unsafe { *dst.add(i) = *p });
        }
    }
}

/// A fresh ring of `capacity` bytes (a power of two) and its two ends.
fn ring(capacity: usize) -> (RingProducer<LoomMemory>, RingConsumer<LoomMemory>) {
    ring_of(capacity)
}

/// [`ring`] for a producer that may ring a doorbell in `B`.
fn ring_of<B: BellMemory>(capacity: usize) -> (RingProducer<LoomMemory, B>, RingConsumer<LoomMemory>) {
    assert!(capacity.is_power_of_two());
    let memory = LoomMemory(Arc::new(LoomRing {
        header: Header {
            magic: AtomicU64::new(0),
            capacity: AtomicU64::new(0),
            tail: Padded(AtomicU64::new(0)),
            head: Padded(AtomicU64::new(0)),
            parked: Padded(AtomicU32::new(0)),
        },
        data: (0..capacity).map(|_| UnsafeCell::new(0)).collect(),
    }));
    let producer = RingProducer::init(memory.clone());
    let consumer = RingConsumer::open(memory).expect("a fresh ring is consistent");
    (producer, consumer)
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(PREEMPTIONS);
    builder.check(f);
}

/// Reads up to `max` bytes (0 when the ring is empty).
fn read_some(rx: &mut RingConsumer<LoomMemory>, max: usize) -> Vec<u8> {
    let mut buf = vec![0u8; max];
    // SAFETY: `buf` holds `max` bytes and is not part of the ring.
    let n = unsafe { rx.read(buf.as_mut_ptr(), max) }.expect("the ring stays consistent");
    buf.truncate(n);
    buf
}

/// The socket beside the ring, as far as wake-ups go: a count of unread
/// wake bytes, and a consumer blocking until one arrives.
struct Socket {
    unread: Mutex<u32>,
    readable: Condvar,
}

impl Socket {
    fn new() -> Self {
        Socket { unread: Mutex::new(0), readable: Condvar::new() }
    }

    fn send_wake_byte(&self) {
        *self.unread.lock().unwrap() += 1;
        self.readable.notify_one();
    }

    /// Blocks until a wake byte is unread, then reads them all. No
    /// timeout: a wake-up that never comes blocks for ever (a deadlock
    /// loom reports), where the runtime's timed sleep would hide it.
    fn sleep_until_readable(&self) {
        let mut unread = self.unread.lock().unwrap();
        while *unread == 0 {
            unread = self.readable.wait(unread).unwrap();
        }
        *unread = 0;
    }
}

/// Six bytes through a 4-byte ring, written two or three at a time and
/// read at most three at a time: the writes fill the ring and wrap around
/// it, every read sees what was written, in order.
#[test]
fn bytes_arrive_in_order_across_a_full_ring_and_the_wrap() {
    model(|| {
        let (mut tx, mut rx) = ring(4);
        let producer = thread::spawn(move || {
            for msg in [&[1u8, 2, 3][..], &[4, 5], &[6]] {
                let mut off = 0;
                while off < msg.len() {
                    let (n, _) = tx.write(&[&msg[off..]]).expect("consistent");
                    off += n;
                    if n == 0 {
                        thread::yield_now();
                    }
                }
                assert!(tx.taken() <= tx.tail, "the consumer never takes more than was written");
            }
        });
        let mut got = Vec::new();
        while got.len() < 6 {
            let bytes = read_some(&mut rx, 3);
            if bytes.is_empty() {
                thread::yield_now();
            }
            got.extend(bytes);
        }
        assert_eq!(got, [1, 2, 3, 4, 5, 6]);
        producer.join().unwrap();
    });
}

/// A producer writing three one-byte messages and a consumer that sleeps
/// on the socket whenever it finds the ring empty, as the shm transport's
/// `ByteIo::wait` does (arm, sleep, disarm, read the socket): every sleep
/// ends and every byte arrives.
#[test]
fn a_sleeping_consumer_is_always_woken() {
    model(|| {
        let (mut tx, mut rx) = ring(4);
        let socket = Arc::new(Socket::new());
        let producer_socket = Arc::clone(&socket);
        let producer = thread::spawn(move || {
            for byte in 1..=3u8 {
                let (n, wake) = tx.write(&[&[byte]]).expect("consistent");
                assert_eq!(n, 1, "the consumer keeps up with a 4-byte ring");
                if wake {
                    producer_socket.send_wake_byte();
                }
            }
        });
        let mut got = Vec::new();
        while got.len() < 3 {
            let bytes = read_some(&mut rx, 4);
            if bytes.is_empty() && rx.arm() {
                socket.sleep_until_readable();
                rx.disarm();
            }
            got.extend(bytes);
        }
        assert_eq!(got, [1, 2, 3]);
        producer.join().unwrap();
    });
}

/// A doorbell in loom's world: its words are loom atomics, and its eventfd
/// the modelled socket.
struct LoomBell {
    bell: Bell<AtomicU64, AtomicU32>,
    eventfd: Socket,
}

#[derive(Clone)]
struct LoomBellRef(Arc<LoomBell>);

impl LoomBellRef {
    fn new() -> Self {
        LoomBellRef(Arc::new(LoomBell {
            bell: Bell {
                sleep: Padded(AtomicU32::new(0)),
                pending: Padded(std::array::from_fn(|_| AtomicU64::new(0))),
            },
            eventfd: Socket::new(),
        }))
    }
}

impl BellMemory for LoomBellRef {
    type W64 = AtomicU64;
    type W32 = AtomicU32;

    fn bell(&self) -> &Bell<AtomicU64, AtomicU32> {
        &self.0.bell
    }

    fn fence_seq_cst(&self) {
        fence(Ordering::SeqCst);
    }

    fn signal(&self) {
        self.0.eventfd.send_wake_byte();
    }
}

/// A ring whose producer rings `bell` under `bit` once the consumer
/// subscribed the ring, and its two ends.
fn ring_with_bell(bell: &LoomBellRef, bit: u32) -> (RingProducer<LoomMemory, LoomBellRef>, RingConsumer<LoomMemory>) {
    let (mut tx, rx) = ring_of(4);
    tx.set_bell(Ringer::new(bell.clone(), bit).expect("bit in range"));
    (tx, rx)
}

/// A producer thread writing `bytes` one at a time into `tx`.
fn produce(mut tx: RingProducer<LoomMemory, LoomBellRef>, bytes: &'static [u8]) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        for &b in bytes {
            let (n, _) = tx.write(&[&[b]]).expect("consistent");
            assert_eq!(n, 1, "the consumer keeps up with a 4-byte ring");
        }
    })
}

/// Two producers, each with its own ring subscribed to one doorbell, and a
/// consumer that visits only the rings the bitmap flags and sleeps on the
/// doorbell's eventfd whenever a pass found nothing, as the scheduler
/// daemon does (`DoorbellWatch`): every byte arrives, in order per ring,
/// and no sleep misses its wake-up (a lost one is a deadlock loom reports).
#[test]
fn a_doorbell_shared_by_two_producers_never_loses_a_wake_up() {
    let mut builder = loom::model::Builder::new();
    // Three threads: two forced switches already cover every way the two
    // producers' bits and the consumer's sleep can cross.
    builder.preemption_bound = Some(2);
    builder.check(|| {
        let bell = LoomBellRef::new();
        let (tx0, mut rx0) = ring_with_bell(&bell, 0);
        let (tx1, mut rx1) = ring_with_bell(&bell, 65);
        rx0.ring.header().parked.0.store(BELL, Ordering::Relaxed);
        rx1.ring.header().parked.0.store(BELL, Ordering::Relaxed);
        let producers = [produce(tx0, &[1, 2]), produce(tx1, &[7])];
        let (mut got0, mut got1) = (Vec::new(), Vec::new());
        while got0.len() + got1.len() < 3 {
            let mut flagged = [false; 2];
            let n = doorbell::take_pending(&bell, |bit| match bit {
                0 => flagged[0] = true,
                65 => flagged[1] = true,
                _ => panic!("bit {bit} was never rung"),
            });
            assert!(n <= 2);
            let before = got0.len() + got1.len();
            if flagged[0] {
                got0.extend(read_some(&mut rx0, 4));
            }
            if flagged[1] {
                got1.extend(read_some(&mut rx1, 4));
            }
            if got0.len() + got1.len() == before && doorbell::arm(&bell) {
                bell.0.eventfd.sleep_until_readable();
            }
            doorbell::disarm(&bell);
        }
        assert_eq!((got0, got1), (vec![1, 2], vec![7]));
        for p in producers {
            p.join().unwrap();
        }
    });
}

/// A consumer subscribing a ring while its producer writes (the daemon's
/// `DoorbellWatch::watch` on a link that is already busy): after the
/// subscription it drains the ring once, then visits it only when flagged
/// and sleeps on the doorbell; nothing the producer wrote before, during
/// or after the subscription is stranded.
#[test]
fn a_ring_subscribed_while_its_producer_writes_strands_nothing() {
    model(|| {
        let bell = LoomBellRef::new();
        let (tx, mut rx) = ring_with_bell(&bell, BELL_WORDS as u32 * 64 - 1);
        let producer = produce(tx, &[1, 2]);
        // What `HeaderView::subscribe` does, then the first drain.
        rx.ring.header().parked.0.fetch_or(BELL, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let mut got = read_some(&mut rx, 4);
        while got.len() < 2 {
            let flagged = doorbell::take_pending(&bell, |_| {}) > 0;
            let bytes = if flagged { read_some(&mut rx, 4) } else { Vec::new() };
            if bytes.is_empty() && !flagged && doorbell::arm(&bell) {
                bell.0.eventfd.sleep_until_readable();
            }
            doorbell::disarm(&bell);
            got.extend(bytes);
        }
        assert_eq!(got, [1, 2]);
        producer.join().unwrap();
    });
}
