//! The `rdma` transport against real verbs: the shared conformance suite
//! (`transport::conformance`, unchanged), plus verbs-specific checks.
//!
//! Without an RDMA device (host CI) every test is a listed capability skip
//! (tests/capability-skips.txt, `CAPABILITY-SKIP` printed); with `SYMPHONY_REQUIRE_RDMA=1` (set by tests/softroce/run.sh in
//! the Soft-RoCE guest) a missing device is a failure instead.
//!
//! Ignored tests are run explicitly by tests/softroce/guest/*.sh:
//! - `rdma_read_latency`: READ latency percentiles (`LAT_SIZE`, `LAT_ITERS`);
//! - `rdma_many_queue_pairs`: `QP_PAIRS` (default 500) connected pairs = 2 x
//!   that many RC queue pairs in one process, data over every 50th pair;
//! - `rdma_pair_server` / `rdma_pair_client`: one guest serves a registered
//!   region (`SYMPHONY_PAIR_LISTEN`), the other READs it and checks every
//!   byte (`SYMPHONY_PAIR_CONNECT`).
#![cfg(feature = "rdma")]

#[path = "../../tests/lib/require.rs"]
mod require;

use std::sync::Arc;
use std::time::Instant;

use dataplane::idle::{IdleStrategy, Idler};
use dataplane::time::Duration;
use dataplane::transport::conformance::TransportFactory;
use dataplane::transport::rdma::{
    RawCompletion, RawKind, RdmaConfig, RdmaConnection, RdmaDomain, RAW_MAX_LEN,
};
use dataplane::transport::{
    Access, Completion, Connection, Domain, Error, ErrorKind, Listener, LocalRef, ReadOp, Region,
    Registration, RemoteRef,
};
use dataplane::waitset::WaitSet;
use dataplane::wire::{self, Message};

const TIMEOUT: Duration = Duration::from_millis(20_000);

/// The domain, or None (after saying so) when this machine has no RDMA device.
fn domain_or_skip() -> Option<RdmaDomain> {
    let required = std::env::var("SYMPHONY_REQUIRE_RDMA").is_ok_and(|v| v == "1");
    match RdmaDomain::from_env() {
        Ok(d) => Some(d),
        Err(Error::Unsupported(why)) if !required => {
            // A listed capability skip (tests/capability-skips.txt): the
            // Soft-RoCE guests run this suite with a device.
            require::capability("rdma-device", false, &format!("no RDMA device on this host ({why})"));
            None
        }
        Err(e) => panic!("RDMA domain unavailable (SYMPHONY_REQUIRE_RDMA={required}): {e}"),
    }
}

/// The suite's view of this transport.
struct Rdma;

impl TransportFactory for Rdma {
    type D = RdmaDomain;
    fn name(&self) -> String {
        "rdma".into()
    }
    fn domain(&self) -> Result<RdmaDomain, Error> {
        RdmaDomain::from_env()
    }
    fn listen_addr(&self) -> String {
        "127.0.0.1:0".into()
    }
    /// Verbs report bad key, out of bounds and deregistered alike (a remote
    /// access error) and the queue pair does not survive it.
    fn precise_errors(&self) -> bool {
        false
    }
    /// Soft-RoCE under full emulation (TCG) is slow; keep the waits generous.
    fn timeout(&self) -> Duration {
        Duration::from_millis(60_000)
    }
}

// Every check of the shared suite as its own test (they serialise
// themselves), from the suite's one list.
dataplane::conformance_tests!(domain_or_skip().map(|_| Rdma));

/// Encodes a heartbeat carrying `seq` (the verbs-specific tests' message).
fn heartbeat(seq: u64) -> Vec<u8> {
    let mut buf = vec![0u8; 64];
    let n = wire::encode(
        &mut buf,
        &wire::Heartbeat {
            seq,
            role: wire::Role::Backend as u32,
            id: 1,
        },
    )
    .unwrap();
    buf.truncate(n);
    buf
}

/// The heartbeat sequence number in a received message.
fn heartbeat_seq(bytes: &[u8]) -> u64 {
    match wire::decode(bytes).unwrap() {
        Message::Heartbeat(h) => h.seq,
        m => panic!("expected a heartbeat, got {m:?}"),
    }
}

/// Two connected queue pairs of one domain (rxe loopback when on Soft-RoCE).
fn connected_pair(d: &RdmaDomain) -> (RdmaConnection, RdmaConnection) {
    let mut listener = d.listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr();
    std::thread::scope(|s| {
        let server = s.spawn(move || listener.accept(TIMEOUT).unwrap());
        let client = d.connect(&addr, TIMEOUT).unwrap();
        (server.join().unwrap(), client)
    })
}

/// Deterministic content: byte `i` of the pattern with `seed`.
fn pattern(seed: u8, i: usize) -> u8 {
    (i as u8).wrapping_mul(131).wrapping_add(seed) ^ (i >> 8) as u8
}

fn filled_region(
    d: &RdmaDomain,
    len: usize,
    seed: u8,
    access: Access,
) -> (Arc<Region>, Registration) {
    let r = Region::anonymous(len).unwrap();
    let bytes: Vec<u8> = (0..len).map(|i| pattern(seed, i)).collect();
    r.write_at(0, &bytes).unwrap();
    let reg = d.register(&r, access).unwrap();
    (r, reg)
}

/// Polls until `n` completions arrived (bounded by TIMEOUT), gently.
fn wait_completions(c: &mut RdmaConnection, n: usize) -> Vec<Completion> {
    let deadline = Instant::now() + std::time::Duration::from_nanos(TIMEOUT.as_nanos());
    let mut out = vec![Completion::default(); n];
    let mut got = 0;
    let mut idler = Idler::new(IdleStrategy::GENTLE);
    while got < n {
        let k = c.poll_completions(&mut out[got..]).unwrap();
        got += k;
        if k == 0 {
            assert!(
                Instant::now() < deadline,
                "only {got} of {n} completions before the deadline"
            );
            idler.idle(|| false);
        } else {
            idler.reset();
        }
    }
    out
}

/// Receives one message (bounded by TIMEOUT), gently.
fn recv_one(c: &mut RdmaConnection, buf: &mut [u8]) -> Result<usize, Error> {
    let deadline = Instant::now() + std::time::Duration::from_nanos(TIMEOUT.as_nanos());
    let mut idler = Idler::new(IdleStrategy::GENTLE);
    loop {
        if let Some(n) = c.try_recv(buf)? {
            return Ok(n);
        }
        assert!(Instant::now() < deadline, "no message before the deadline");
        idler.idle(|| false);
    }
}

#[test]
fn rdma_refuses_bad_landing_buffers_and_queue_overflow_without_posting() {
    let Some(d) = domain_or_skip() else { return };
    let (_server, mut client) = connected_pair(&d);
    let (_src, src_reg) = filled_region(&d, 1 << 16, 1, Access::REMOTE_READ);
    let (_dst, dst_reg) = filled_region(&d, 1 << 16, 0, Access::LOCAL_WRITE);
    let remote = src_reg.remote_ref(0, 256).unwrap();
    let local = dst_reg.local_ref(0, 256).unwrap();
    let op = |wr_id, remote: RemoteRef, local| ReadOp {
        wr_id,
        remote,
        local,
    };
    let mut bad_key = local;
    bad_key.key ^= 0x5a5a_0000;
    assert_eq!(
        client
            .post_read(&op(1, remote, bad_key))
            .unwrap_err()
            .kind(),
        ErrorKind::BadKey
    );
    let mut past_end = local;
    past_end.offset += (1 << 16) - 100;
    assert_eq!(
        client
            .post_read(&op(2, remote, past_end))
            .unwrap_err()
            .kind(),
        ErrorKind::OutOfBounds
    );
    let mut short = local;
    short.len = 10;
    assert_eq!(
        client.post_read(&op(3, remote, short)).unwrap_err().kind(),
        ErrorKind::OutOfBounds
    );
    // A staging region (REMOTE_READ only) is not a landing buffer.
    let mut wrong_access = local;
    wrong_access.key = src_reg.key();
    wrong_access.offset = src_reg.addr_base();
    assert_eq!(
        client
            .post_read(&op(4, remote, wrong_access))
            .unwrap_err()
            .kind(),
        ErrorKind::AccessDenied
    );
    assert_eq!(client.outstanding_reads(), 0);
    // More READs than the depth: the excess is refused, nothing lost.
    let depth = client.max_outstanding_reads();
    let ops: Vec<ReadOp> = (0..depth as u64 + 5)
        .map(|i| {
            op(
                100 + i,
                src_reg.remote_ref(0, 8).unwrap(),
                dst_reg.local_ref(i * 8, 8).unwrap(),
            )
        })
        .collect();
    // (post_reads frees finished slots only before it starts, so this is exact.)
    let accepted = client.post_reads(&ops).unwrap();
    assert_eq!(accepted, depth);
    let done = wait_completions(&mut client, depth);
    assert!(done.iter().all(|c| c.status.is_ok()));
    // Landing accesses were released: the landing region deregisters at once.
    let before = d.registered_count();
    d.deregister(&dst_reg).unwrap();
    assert_eq!(d.registered_count(), before - 1);
}

#[test]
fn rdma_remote_access_error_completes_with_error_and_ends_the_connection() {
    let Some(d) = domain_or_skip() else { return };
    let (_server, mut client) = connected_pair(&d);
    let (_src, src_reg) = filled_region(&d, 4096, 1, Access::REMOTE_READ);
    let (_dst, dst_reg) = filled_region(&d, 4096, 0, Access::LOCAL_WRITE);
    let mut remote = src_reg.remote_ref(0, 64).unwrap();
    remote.key ^= 0x00ff_ff00; // no such rkey at the peer
    client
        .post_read(&ReadOp {
            wr_id: 5,
            remote,
            local: dst_reg.local_ref(0, 64).unwrap(),
        })
        .unwrap();
    let c = wait_completions(&mut client, 1);
    assert_eq!(c[0].wr_id, 5);
    assert_eq!(c[0].status, Err(ErrorKind::BadKey));
    assert!(
        !client.is_connected(),
        "verbs: a remote access error moves the QP to the error state"
    );
    assert!(client
        .post_read(&ReadOp {
            wr_id: 6,
            remote,
            local: dst_reg.local_ref(0, 64).unwrap()
        })
        .is_err());
}

/// Keys apart and least access at the NIC: a landing region (LOCAL_WRITE only) is not
/// remote-readable even when a peer names it with a forged reference, and READs use
/// the staging region's rkey, never its lkey.
#[test]
fn rdma_landing_regions_are_not_remote_readable() {
    let Some(d) = domain_or_skip() else { return };
    let (_server, mut client) = connected_pair(&d);
    let (_src, src_reg) = filled_region(&d, 4096, 7, Access::REMOTE_READ);
    let (dst, dst_reg) = filled_region(&d, 4096, 0, Access::LOCAL_WRITE);
    let (_victim, victim_reg) = filled_region(&d, 4096, 9, Access::LOCAL_WRITE);
    assert_eq!(src_reg.remote_ref(0, 64).unwrap().key, src_reg.remote_key());
    // The good READ first (the failed one ends the queue pair).
    client
        .post_read(&ReadOp {
            wr_id: 1,
            remote: src_reg.remote_ref(0, 64).unwrap(),
            local: dst_reg.local_ref(0, 64).unwrap(),
        })
        .unwrap();
    assert_eq!(wait_completions(&mut client, 1)[0].status, Ok(()));
    let mut got = [0u8; 64];
    dst.read_at(0, &mut got).unwrap();
    assert!(got.iter().enumerate().all(|(i, &b)| b == pattern(7, i)));
    // Forged: the landing region's own keys and address, as if it had been exported.
    for key in [victim_reg.key(), victim_reg.remote_key()] {
        let (_s, mut c) = connected_pair(&d);
        let forged = RemoteRef {
            key,
            len: 64,
            offset: victim_reg.addr_base(),
        };
        c.post_read(&ReadOp {
            wr_id: 2,
            remote: forged,
            local: dst_reg.local_ref(0, 64).unwrap(),
        })
        .unwrap();
        assert_eq!(
            wait_completions(&mut c, 1)[0].status,
            Err(ErrorKind::BadKey),
            "the NIC refuses a READ of a region without REMOTE_READ"
        );
    }
}

/// The completion channel: an idle connection sleeps in the kernel (no spinning) and
/// wakes when a READ completes or a message arrives.
#[test]
fn rdma_idle_connection_sleeps_until_a_completion() {
    let Some(d) = domain_or_skip() else { return };
    let (mut server, mut client) = connected_pair(&d);
    let (_src, src_reg) = filled_region(&d, 4096, 5, Access::REMOTE_READ);
    let (dst, dst_reg) = filled_region(&d, 4096, 0, Access::LOCAL_WRITE);
    let mut set = WaitSet::new().unwrap();
    set.add(client.wait_fd().expect("rdma has a wait fd")).unwrap();
    let mut out = [Completion::default(); 1];
    let mut buf = [0u8; 64];
    // Polled empty (which arms both queues): the wait sleeps its whole timeout.
    assert_eq!(client.poll_completions(&mut out).unwrap(), 0);
    assert_eq!(client.try_recv(&mut buf).unwrap(), None);
    let t = Instant::now();
    assert_eq!(set.wait(Duration::from_millis(50)), 0);
    assert!(t.elapsed() >= std::time::Duration::from_millis(40));
    let t = Instant::now();
    assert!(client.wait(Duration::from_millis(50)).unwrap());
    assert!(t.elapsed() >= std::time::Duration::from_millis(40), "Connection::wait slept");

    // A READ's completion wakes the set.
    client
        .post_read(&ReadOp {
            wr_id: 77,
            remote: src_reg.remote_ref(0, 256).unwrap(),
            local: dst_reg.local_ref(0, 256).unwrap(),
        })
        .unwrap();
    let deadline = Instant::now() + std::time::Duration::from_secs(20);
    loop {
        assert!(Instant::now() < deadline, "the READ's completion did not wake the set");
        set.wait(Duration::from_millis(5_000));
        if client.poll_completions(&mut out).unwrap() == 1 {
            break;
        }
    }
    assert_eq!((out[0].wr_id, out[0].status), (77, Ok(())));
    let mut got = [0u8; 256];
    dst.read_at(0, &mut got).unwrap();
    assert!(got.iter().enumerate().all(|(i, &b)| b == pattern(5, i)));
    // Drained: quiet again.
    assert_eq!(client.poll_completions(&mut out).unwrap(), 0);
    assert_eq!(set.wait(Duration::from_millis(20)), 0);

    // A message wakes Connection::wait, and is then received.
    let sender = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(30));
        server.send(&heartbeat(9)).unwrap();
        server
    });
    let t = Instant::now();
    while t.elapsed() < std::time::Duration::from_secs(20) {
        client.wait(Duration::from_millis(5_000)).unwrap();
        if let Some(n) = client.try_recv(&mut buf).unwrap() {
            assert_eq!(heartbeat_seq(&buf[..n]), 9);
            break;
        }
    }
    assert!(t.elapsed() < std::time::Duration::from_secs(20), "no message");
    drop(sender.join().unwrap());
}

/// A SEND that completes after the send queue was armed raises an event; a
/// caller that only receives never polls the send queue for it, so `wait`
/// must: otherwise the event keeps the wait fd readable and every later
/// `wait` returns at once (netbench's idle server spun through epoll and
/// socket peeks after answering a hello; fixed in 4d5b24d).
#[test]
fn rdma_wait_sleeps_after_a_send_that_completed_after_the_arm() {
    let Some(d) = domain_or_skip() else { return };
    let (mut server, mut client) = connected_pair(&d);
    let mut set = WaitSet::new().unwrap();
    set.add(client.wait_fd().expect("rdma has a wait fd")).unwrap();
    let mut out = [Completion::default(); 1];
    let mut buf = [0u8; 64];
    // Polled empty: both queues armed, then the SEND is posted.
    assert_eq!(client.poll_completions(&mut out).unwrap(), 0);
    assert_eq!(client.try_recv(&mut buf).unwrap(), None);
    client.send(&heartbeat(3)).unwrap();
    // Its completion (the peer's acknowledgement) raises the armed queue's
    // event: the wait fd turns readable (bounded wait, no sleep as sync).
    let deadline = Instant::now() + std::time::Duration::from_secs(20);
    while set.wait(Duration::from_millis(1_000)) == 0 {
        assert!(Instant::now() < deadline, "the SEND's completion raised no event");
    }
    let n = recv_one(&mut server, &mut buf).unwrap();
    assert_eq!(heartbeat_seq(&buf[..n]), 3);
    // Only receiving from here on: each wait reaps the SEND's completion
    // (first call), re-arms and sleeps its whole timeout.
    for round in 0..3 {
        let t = Instant::now();
        assert!(client.wait(Duration::from_millis(50)).unwrap());
        assert!(
            t.elapsed() >= std::time::Duration::from_millis(40),
            "wait {round} returned after {:?}: the SEND's event was left pending",
            t.elapsed()
        );
        assert_eq!(client.try_recv(&mut buf).unwrap(), None);
    }
    assert_eq!(set.wait(Duration::from_millis(20)), 0, "the wait fd stays quiet");
    // Still a working connection: a message wakes the wait.
    server.send(&heartbeat(4)).unwrap();
    let n = recv_one(&mut client, &mut buf).unwrap();
    assert_eq!(heartbeat_seq(&buf[..n]), 4);
}

#[test]
fn rdma_peer_departure_comes_after_its_queued_messages() {
    let Some(d) = domain_or_skip() else { return };
    let (mut a, mut b) = connected_pair(&d);
    for i in 0..3 {
        b.send(&heartbeat(i)).unwrap();
    }
    drop(b);
    let mut buf = [0u8; 64];
    for i in 0..3 {
        let n = recv_one(&mut a, &mut buf).unwrap();
        assert_eq!(heartbeat_seq(&buf[..n]), i);
    }
    let err = recv_one(&mut a, &mut buf).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PeerDisconnected);
    assert!(!a.is_connected());
}

#[test]
fn rdma_connect_to_nobody_times_out() {
    let Some(d) = domain_or_skip() else { return };
    // A listener that never accepts on the RDMA side: bind, then drop, so the port is closed.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let t = Instant::now();
    let e = d.connect(&addr, Duration::from_millis(300)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert!(t.elapsed() < std::time::Duration::from_secs(5));
}

// ----------------------------------------------------------------------------------------
// Run explicitly in the Soft-RoCE guest (tests/softroce/guest/*.sh)
// ----------------------------------------------------------------------------------------

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Value at quantile `q` of sorted samples (perftest's convention: index `n * q`).
fn quantile(sorted: &[u64], q: f64) -> u64 {
    sorted[((sorted.len() as f64 * q) as usize).min(sorted.len() - 1)]
}

/// READ latency, one READ at a time, busy-polling the completion (what ib_read_lat
/// does). Prints `LAT <bytes> <iters> <p50_ns> <p99_ns> <p99.9_ns>`.
#[test]
#[ignore = "measurement; run by tests/softroce/guest/single.sh"]
fn rdma_read_latency() {
    let Some(d) = domain_or_skip() else { return };
    let size: u32 = env_or("LAT_SIZE", 64);
    let iters: usize = env_or("LAT_ITERS", 1000);
    let (_server, mut client) = connected_pair(&d);
    let (_src, src_reg) = filled_region(&d, size as usize, 3, Access::REMOTE_READ);
    let (dst, dst_reg) = filled_region(&d, size as usize, 0, Access::LOCAL_WRITE);
    let op = ReadOp {
        wr_id: 0,
        remote: src_reg.remote_ref(0, size).unwrap(),
        local: dst_reg.local_ref(0, size).unwrap(),
    };
    let mut samples = Vec::with_capacity(iters);
    let mut out = [Completion::default(); 1];
    let warmup = 100.min(iters);
    // Like perftest: one timestamp per iteration, a sample is the gap between two.
    let mut prev = Instant::now();
    for i in 0..warmup + iters {
        client.post_read(&op).unwrap();
        // A bare poll loop, as perftest's: no PAUSE hint (under QEMU TCG a PAUSE
        // leaves the translated code and costs microseconds).
        while client.poll_completions(&mut out).unwrap() == 0 {}
        let now = Instant::now();
        assert_eq!(out[0].status, Ok(()));
        if i >= warmup {
            samples.push((now - prev).as_nanos() as u64);
        }
        prev = now;
    }
    let mut last = vec![0u8; size as usize];
    dst.read_at(0, &mut last).unwrap();
    assert!(last.iter().enumerate().all(|(i, &b)| b == pattern(3, i)));
    samples.sort_unstable();
    println!(
        "LAT {size} {iters} {} {} {}",
        quantile(&samples, 0.5),
        quantile(&samples, 0.99),
        quantile(&samples, 0.999)
    );
}

const PAIR_REGION: usize = 4 << 20;
const PAIR_SEED: u8 = 42;

/// Serves a 4 MiB registered region to one client: sends its RemoteRef, waits for the
/// client's verdict.
#[test]
#[ignore = "cross-VM; run by tests/softroce/guest/pair.sh on the server guest"]
fn rdma_pair_server() {
    let Some(d) = domain_or_skip() else { return };
    let listen = std::env::var("SYMPHONY_PAIR_LISTEN").unwrap_or_else(|_| "0.0.0.0:18515".into());
    let mut listener = d.listen(&listen).unwrap();
    println!("pair server: {d:?} listening on {}", listener.local_addr());
    let mut conn = listener.accept(Duration::from_millis(120_000)).unwrap();
    let (_region, reg) = filled_region(&d, PAIR_REGION, PAIR_SEED, Access::REMOTE_READ);
    let whole = reg.remote_ref(0, PAIR_REGION as u32).unwrap();
    let mut msg = [0u8; 128];
    let task = wire::Task {
        task_id: 1,
        budget_ns: 0,
        model_id: 0,
        frontend_id: 0,
        input: whole,
        ..Default::default()
    };
    let n = wire::encode(&mut msg, &task).unwrap();
    conn.send(&msg[..n]).unwrap();
    let mut buf = [0u8; 256];
    let n = recv_one(&mut conn, &mut buf).unwrap();
    let bad = heartbeat_seq(&buf[..n]);
    println!("pair server: client found {bad} bad bytes");
    assert_eq!(bad, 0, "client saw wrong bytes");
    conn.send(&heartbeat(u64::MAX)).unwrap();
    // Wait for the client to go, so our QP outlives its last READ.
    let e = recv_one(&mut conn, &mut buf).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PeerDisconnected);
}

/// READs the server guest's region over the wire and checks every byte.
#[test]
#[ignore = "cross-VM; run by tests/softroce/guest/pair.sh on the client guest"]
fn rdma_pair_client() {
    let Some(d) = domain_or_skip() else { return };
    let peer = std::env::var("SYMPHONY_PAIR_CONNECT").expect("SYMPHONY_PAIR_CONNECT=host:port");
    let mut conn = d.connect(&peer, Duration::from_millis(120_000)).unwrap();
    println!("pair client: {d:?} connected to {peer}");
    let mut buf = [0u8; 128];
    let n = recv_one(&mut conn, &mut buf).unwrap();
    let whole = match wire::decode(&buf[..n]).unwrap() {
        Message::Task(t) => t.input,
        m => panic!("expected the region's RemoteRef in a Task, got {m:?}"),
    };
    assert_eq!(whole.len as usize, PAIR_REGION);
    let (dst, dst_reg) = filled_region(&d, PAIR_REGION, 0, Access::LOCAL_WRITE);
    // The whole region in 150 KiB READs (the last one shorter), batched 8 at a time.
    let chunk = 150 * 1024u32;
    let ops: Vec<ReadOp> = (0..PAIR_REGION as u32)
        .step_by(chunk as usize)
        .enumerate()
        .map(|(i, off)| {
            let len = chunk.min(PAIR_REGION as u32 - off);
            let remote = RemoteRef {
                key: whole.key,
                len,
                offset: whole.offset + u64::from(off),
            };
            ReadOp {
                wr_id: i as u64,
                remote,
                local: dst_reg.local_ref(u64::from(off), len).unwrap(),
            }
        })
        .collect();
    let t = Instant::now();
    for batch in ops.chunks(8) {
        assert_eq!(conn.post_reads(batch).unwrap(), batch.len());
        for c in wait_completions(&mut conn, batch.len()) {
            assert_eq!(c.status, Ok(()), "READ {}", c.wr_id);
        }
    }
    let elapsed = t.elapsed();
    let mut got = vec![0u8; PAIR_REGION];
    dst.read_at(0, &mut got).unwrap();
    let bad = got
        .iter()
        .enumerate()
        .filter(|&(i, &b)| b != pattern(PAIR_SEED, i))
        .count();
    // Small READs at odd offsets, one at a time, for a cross-VM latency figure.
    let mut lat = Vec::with_capacity(200);
    for i in 0..200u64 {
        let off = (i * 104_729) % (PAIR_REGION as u64 - 4096);
        let remote = RemoteRef {
            key: whole.key,
            len: 4096,
            offset: whole.offset + off,
        };
        let t = Instant::now();
        conn.post_read(&ReadOp {
            wr_id: i,
            remote,
            local: dst_reg.local_ref(0, 4096).unwrap(),
        })
        .unwrap();
        assert_eq!(wait_completions(&mut conn, 1)[0].status, Ok(()));
        lat.push(t.elapsed().as_nanos() as u64);
        let mut b = vec![0u8; 4096];
        dst.read_at(0, &mut b).unwrap();
        assert!(
            b.iter()
                .enumerate()
                .all(|(j, &x)| x == pattern(PAIR_SEED, off as usize + j)),
            "4 KiB READ at {off}"
        );
    }
    lat.sort_unstable();
    println!(
        "pair client: READ {} MiB in {:.1} ms ({:.0} MB/s), {bad} bad bytes; 4 KiB READ p50 {} us p99 {} us",
        PAIR_REGION >> 20,
        elapsed.as_secs_f64() * 1e3,
        PAIR_REGION as f64 / elapsed.as_secs_f64() / 1e6,
        quantile(&lat, 0.5) / 1000,
        quantile(&lat, 0.99) / 1000
    );
    conn.send(&heartbeat(bad as u64)).unwrap();
    let n = recv_one(&mut conn, &mut buf).unwrap();
    assert_eq!(heartbeat_seq(&buf[..n]), u64::MAX, "server's goodbye");
    assert_eq!(bad, 0, "{bad} bytes differ from the server's pattern");
}

/// Raises the soft fd limit to the hard one (a connection holds four fds:
/// bootstrap socket, two completion channels, the epoll wait fd).
fn raise_fd_limit(want: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid out pointer for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return;
    }
    if lim.rlim_max < want {
        lim.rlim_max = want; // root (the guest) may raise the hard limit
    }
    lim.rlim_cur = lim.rlim_cur.max(want).min(lim.rlim_max);
    // SAFETY: valid pointer; failure leaves the limits as they were.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
}

/// Thousands of RC queue pairs in one guest (rxe loopback): `QP_PAIRS` connected
/// pairs (default 500 = 1000 QPs) of one domain, each with the small per-connection
/// footprint a large fan-out would use (2 receive and 2 send slots of 256 B, 4 READs),
/// then a message and a 4 KiB READ over every 50th pair (bytes checked), with every
/// queue pair still open. Prints `QPS <queue pairs> <setup ms> <data ms>`.
#[test]
#[ignore = "scale; run by tests/softroce/guest/single.sh"]
fn rdma_many_queue_pairs() {
    let Some(_) = domain_or_skip() else { return };
    let pairs: usize = env_or("QP_PAIRS", 500);
    raise_fd_limit(4 * 2 * pairs as u64 + 256);
    let cfg = RdmaConfig {
        recv_slots: 2,
        send_slots: 2,
        max_msg_len: 256,
        max_reads_in_flight: 4,
        read_depth: 4,
        ..RdmaConfig::from_env().unwrap()
    };
    let d = RdmaDomain::open(cfg).unwrap();
    let mut listener = d.listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr();
    let t0 = Instant::now();
    let (servers, clients) = std::thread::scope(|s| {
        let acceptor = s.spawn(move || {
            (0..pairs)
                .map(|i| {
                    listener
                        .accept(TIMEOUT)
                        .unwrap_or_else(|e| panic!("accept #{i}: {e}"))
                })
                .collect::<Vec<_>>()
        });
        let clients: Vec<RdmaConnection> = (0..pairs)
            .map(|i| {
                d.connect(&addr, TIMEOUT)
                    .unwrap_or_else(|e| panic!("connect #{i}: {e}"))
            })
            .collect();
        (acceptor.join().unwrap(), clients)
    });
    let setup = t0.elapsed();
    let (mut servers, mut clients) = (servers, clients);
    assert_eq!(servers.len() + clients.len(), 2 * pairs);
    let t1 = Instant::now();
    let (_src, src_reg) = filled_region(&d, 1 << 20, 11, Access::REMOTE_READ);
    let (dst, dst_reg) = filled_region(&d, 4096, 0, Access::LOCAL_WRITE);
    let mut buf = [0u8; 256];
    let mut checked = 0;
    for i in (0..pairs).step_by(50) {
        // Pairs are accepted in connect order: servers[i] is clients[i]'s peer.
        clients[i].send(&heartbeat(i as u64)).unwrap();
        let n = recv_one(&mut servers[i], &mut buf).unwrap();
        assert_eq!(heartbeat_seq(&buf[..n]), i as u64, "pair {i}: wrong peer");
        let at = (i as u64 * 4096) % ((1 << 20) - 4096);
        clients[i]
            .post_read(&ReadOp {
                wr_id: i as u64,
                remote: src_reg.remote_ref(at, 4096).unwrap(),
                local: dst_reg.local_ref(0, 4096).unwrap(),
            })
            .unwrap();
        let c = wait_completions(&mut clients[i], 1);
        assert_eq!((c[0].wr_id, c[0].status), (i as u64, Ok(())));
        let mut got = vec![0u8; 4096];
        dst.read_at(0, &mut got).unwrap();
        assert!(
            got.iter()
                .enumerate()
                .all(|(j, &b)| b == pattern(11, at as usize + j)),
            "pair {i}: bytes differ"
        );
        checked += 1;
    }
    assert!(servers.iter().chain(&clients).all(|c| c.is_connected()));
    println!(
        "QPS {} {} {} (data over {checked} pairs)",
        2 * pairs,
        setup.as_millis(),
        t1.elapsed().as_millis()
    );
}

/// Raw completions of `c` until `n` arrived (bounded by `TIMEOUT`).
fn wait_raw(c: &mut RdmaConnection, n: usize) -> Vec<RawCompletion> {
    let deadline = Instant::now() + std::time::Duration::from_nanos(TIMEOUT.as_nanos());
    let mut got = Vec::new();
    let mut buf = [RawCompletion::default(); 4];
    while got.len() < n {
        let k = c.poll_raw(&mut buf).unwrap();
        got.extend_from_slice(&buf[..k]);
        assert!(Instant::now() < deadline, "{} of {n} raw completions", got.len());
    }
    got
}

#[test]
fn rdma_raw_sends_land_whole_in_posted_receives() {
    let Some(_) = domain_or_skip() else { return };
    let raw_cfg = |depth| RdmaConfig {
        raw_depth: depth,
        ..RdmaConfig::from_env().unwrap()
    };
    let d = RdmaDomain::open(raw_cfg(4)).unwrap();
    let (mut server, mut client) = connected_pair(&d);
    assert_eq!((server.raw_depth(), client.raw_depth()), (Some(4), Some(4)));
    let big = 1usize << 20;
    let (_src, src_reg) = filled_region(&d, big, 7, Access::LOCAL_WRITE);
    let (dst, dst_reg) = filled_region(&d, big, 0, Access::LOCAL_WRITE);
    let whole = dst_reg.local_ref(0, big as u32).unwrap();
    for (k, size) in [2u32, 200, 4096, 65536, 1 << 20].into_iter().enumerate() {
        let k = k as u64;
        server.post_raw_recv(100 + k, whole).unwrap();
        // Inline where small enough: the same bytes arrive either way.
        let src = src_reg.local_ref(0, size).unwrap();
        client.post_raw_send(k, src, true).unwrap();
        let r = wait_raw(&mut server, 1)[0];
        assert_eq!((r.wr_id, r.kind, r.status, r.bytes), (100 + k, RawKind::Recv, Ok(()), size));
        let s = wait_raw(&mut client, 1)[0];
        assert_eq!((s.wr_id, s.kind, s.status, s.bytes), (k, RawKind::Send, Ok(()), size));
        let mut got = vec![0u8; size as usize];
        dst.read_at(0, &mut got).unwrap();
        assert!(
            got.iter().enumerate().all(|(i, b)| *b == pattern(7, i)),
            "{size}-byte raw SEND: bytes differ"
        );
    }
    // Bounds: too long, outside its registration, more than the depth.
    let src = src_reg.local_ref(0, 8).unwrap();
    let too_long = LocalRef { len: RAW_MAX_LEN + 1, ..src };
    assert!(matches!(client.post_raw_send(1, too_long, false), Err(Error::TooLarge)));
    let outside = LocalRef { offset: src.offset + big as u64, ..src };
    assert!(client.post_raw_send(1, outside, false).is_err());
    assert!(server.post_raw_recv(1, LocalRef { key: 0, ..whole }).is_err());
    for k in 0..4 {
        server.post_raw_recv(k, whole).unwrap();
    }
    assert!(matches!(server.post_raw_recv(9, whole), Err(Error::QueueFull)));
    assert_eq!(server.raw_recvs_posted(), 4);
    // The control channel is untouched by the raw queue pair.
    client.send(&heartbeat(5)).unwrap();
    let mut buf = vec![0u8; 1024];
    let n = recv_one(&mut server, &mut buf).unwrap();
    assert_eq!(heartbeat_seq(&buf[..n]), 5);
    // A peer without a raw queue pair: neither side has one.
    let plain = RdmaDomain::open(raw_cfg(0)).unwrap();
    let mut listener = d.listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr();
    let (mut a, mut b) = std::thread::scope(|s| {
        let server = s.spawn(move || listener.accept(TIMEOUT).unwrap());
        let client = plain.connect(&addr, TIMEOUT).unwrap();
        (server.join().unwrap(), client)
    });
    assert_eq!((a.raw_depth(), b.raw_depth()), (None, None));
    assert!(matches!(a.post_raw_send(1, src, false), Err(Error::Unsupported(_))));
    assert!(matches!(b.poll_raw(&mut [RawCompletion::default(); 1]), Err(Error::Unsupported(_))));
}
