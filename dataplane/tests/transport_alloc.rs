//! Once warm, a READ and a control message allocate nothing, on either side
//! of the connection (the memory owner's responder included). A counting
//! global allocator watches the whole process; this binary holds one test
//! so nothing else runs during the measured window.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

#[path = "../../tests/lib/require.rs"]
mod require;

use dataplane::mem::{Access, Region};
use dataplane::time::Duration;
use dataplane::transport::shm::ShmDomain;
use dataplane::transport::tcp::{Engine, TcpConfig, TcpDomain};
use dataplane::transport::{Completion, Connection, Domain, Listener, ReadOp};
use dataplane::wire;

struct Counting;
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const T: Duration = Duration::from_millis(10_000);

fn wait() {
    std::thread::yield_now();
}

/// Runs `rounds` READ + message round trips; panics on a stall (one round
/// trip taking 20 s).
fn rounds<C: Connection>(name: &str, reader: &mut C, ops: &[ReadOp], msg: &[u8], rounds: usize) {
    let mut comps = [Completion::default(); 16];
    let mut buf = [0u8; 256];
    for i in 0..rounds {
        // Per round trip: on a loaded machine (CI, or the grid next to it)
        // each handoff between the two yielding threads can wait a
        // scheduler tick, and 2000 of them took over 20 s in all.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let op = &ops[i % ops.len()];
        reader.post_read(op).expect("post");
        loop {
            let n = reader.poll_completions(&mut comps).expect("poll");
            if n == 1 {
                assert_eq!(comps[0].status, Ok(()));
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{name}: READ {i} stalled");
            wait();
        }
        reader.send(msg).expect("send");
        // The owner echoes every message back.
        loop {
            if reader.try_recv(&mut buf).expect("recv").is_some() {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{name}: echo {i} stalled");
            wait();
        }
    }
}

fn check<D: Domain>(
    name: &str,
    owner_dom: D,
    reader_dom: D,
    region: impl Fn(usize) -> Arc<Region>,
) {
    let mut l = owner_dom.listen("").expect("listen");
    let addr = l.local_addr();
    let (mut owner, mut reader) = std::thread::scope(|s| {
        let a = s.spawn(move || {
            let mut c = l.accept(T).expect("accept");
            // The owner serves this reader's READs (as a frontend does
            // once a backend registered).
            c.allow_remote_reads();
            c
        });
        let c = reader_dom.connect(&addr, T).expect("connect");
        (a.join().expect("accept thread"), c)
    });
    let src = region(1 << 20);
    let dst = region(1 << 20);
    let sreg = owner_dom.register(&src, Access::REMOTE_READ).unwrap();
    let dreg = reader_dom.register(&dst, Access::LOCAL_WRITE).unwrap();
    let ops: Vec<ReadOp> = [64u32, 4096, 150 * 1024]
        .iter()
        .enumerate()
        .map(|(i, &len)| ReadOp {
            wr_id: i as u64,
            remote: sreg.remote_ref(0, len).unwrap(),
            local: dreg.local_ref(0, len).unwrap(),
        })
        .collect();
    let mut msg = [0u8; 128];
    let n = wire::encode(
        &mut msg,
        &wire::Heartbeat {
            seq: 1,
            role: 1,
            id: 1,
        },
    )
    .unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut buf = [0u8; 256];
            while !stop.load(Ordering::Acquire) {
                if let Ok(Some(m)) = owner.try_recv(&mut buf) {
                    let _ = owner.send(&buf[..m]);
                }
                let _ = owner.progress();
                wait();
            }
        });
        // Stops the echo thread however this thread leaves the scope: a
        // panic in `rounds` (a stall) would otherwise wait on it forever.
        struct StopOnDrop<'a>(&'a AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Release);
            }
        }
        let _stop_echo = StopOnDrop(&stop);
        rounds(name, &mut reader, &ops, &msg[..n], 200);
        let before = ALLOCS.load(Ordering::SeqCst);
        rounds(name, &mut reader, &ops, &msg[..n], 2000);
        let after = ALLOCS.load(Ordering::SeqCst);
        stop.store(true, Ordering::Release);
        assert_eq!(
            after - before,
            0,
            "{name}: {} allocations in 2000 warm READ + message round trips",
            after - before
        );
    });
}

#[test]
fn warm_reads_and_messages_do_not_allocate() {
    let probe = std::hint::black_box(vec![1u8; 8]);
    assert!(
        ALLOCS.load(Ordering::SeqCst) > 0 && probe.len() == 8,
        "the counting allocator is installed"
    );
    check(
        "shm",
        ShmDomain::new().unwrap(),
        ShmDomain::new().unwrap(),
        |n| Region::shared(n).unwrap(),
    );
    let tcp = |e| TcpDomain::new(TcpConfig::new(e)).unwrap();
    check(
        "tcp-blocking",
        tcp(Engine::Blocking),
        tcp(Engine::Blocking),
        |n| Region::anonymous(n).unwrap(),
    );
    if TcpDomain::uring().is_ok() {
        check("tcp-uring", tcp(Engine::Uring), tcp(Engine::Uring), |n| {
            Region::anonymous(n).unwrap()
        });
    } else {
        // io_uring is not a capability skip: under CI its absence fails the test.
        require::capability("io_uring", false, "io_uring unavailable: tcp-uring allocation check not run");
    }
}
