//! A conformance suite every transport runs unchanged, through a small
//! factory: connect, control messages, READs of 1 B .. 4 MiB with content
//! checks, batched and incast READs from several peer threads, rejected bad
//! READs, deregistration during READs, peer departure mid-READ, and no
//! leaks (regions, registrations, fds, shm files) after teardown.
//!
//! Every wait has a deadline; nothing sleeps to synchronise. The suite
//! functions panic with a message on a violation (they are test code) and
//! serialise themselves on a process-wide lock so that fd counts are exact.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant as StdInstant;

use super::{Completion, Connection, Domain, Error, ErrorKind, Listener, ReadOp, Registration};
use crate::mem::{Access, LocalRef, Region, RemoteRef};
use crate::time::Duration;
use crate::wire::{self, Message};

/// Makes the domains and regions a transport needs.
pub trait TransportFactory: Sync {
    /// The transport's domain.
    type D: Domain;
    /// Name for messages.
    fn name(&self) -> String;
    /// A fresh domain (one per simulated process).
    fn domain(&self) -> Result<Self::D, Error>;
    /// What to pass to [`Domain::listen`] ("" = transport picks).
    fn listen_addr(&self) -> String {
        String::new()
    }
    /// A region this transport can register for remote READ and landing.
    fn region(&self, len: usize) -> Result<Arc<Region>, Error> {
        Ok(Region::anonymous(len)?)
    }
    /// Whether remote-access errors are told apart (bad key vs out of
    /// bounds vs deregistered) and leave the connection usable. Verbs
    /// report all as one remote access error and break the queue pair.
    fn precise_errors(&self) -> bool {
        true
    }
    /// Whether `send` blocks while the peer's buffers are full (the tcp
    /// blocking baseline) instead of queueing until `QueueFull`.
    fn sends_block(&self) -> bool {
        false
    }
    /// Bound for every wait in the suite.
    fn timeout(&self) -> Duration {
        Duration::from_millis(20_000)
    }
}

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `f` while no suite check runs in this process: anything that opens
/// fds (a probe, a setup step) must not overlap a leak check's counts.
pub fn exclusive<T>(f: impl FnOnce() -> T) -> T {
    let _g = serial();
    f()
}

/// Runs every check.
pub fn run_all<F: TransportFactory>(f: &F) {
    connect_and_exchange(f);
    read_sizes(f);
    incast(f);
    rejects_bad_reads(f);
    deregister_during_reads(f);
    disconnect_mid_read(f);
    no_leaks(f);
    wait_fd_wakes(f);
    wait_fd_after_empty_recv(f);
    input_taken_in_by_a_send_is_reported(f);
    send_progress_counts(f);
}

// ---- helpers -----------------------------------------------------------------

/// Polite waiting for tests on small machines: yields, then short sleeps.
struct Idle(u32);

impl Idle {
    fn new() -> Self {
        Idle(0)
    }
    fn reset(&mut self) {
        self.0 = 0;
    }
    fn wait(&mut self) {
        self.0 += 1;
        if self.0 < 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
    }
}

fn deadline<F: TransportFactory>(f: &F) -> StdInstant {
    StdInstant::now() + std::time::Duration::from_nanos(f.timeout().as_nanos())
}

fn pattern(seed: u8, i: u64) -> u8 {
    ((i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8).wrapping_add(seed)
}

fn fill(region: &Region, seed: u8) {
    let mut chunk = vec![0u8; 64 * 1024];
    let mut off = 0u64;
    while (off as usize) < region.len() {
        let n = chunk.len().min(region.len() - off as usize);
        for (j, b) in chunk[..n].iter_mut().enumerate() {
            *b = pattern(seed, off + j as u64);
        }
        region.write_at(off, &chunk[..n]).expect("fill in bounds");
        off += n as u64;
    }
}

fn check_landed(landing: &Region, at: u64, seed: u8, src_off: u64, len: usize, what: &str) {
    let mut got = vec![0u8; len];
    landing.read_at(at, &mut got).expect("landing in bounds");
    if let Some(i) = (0..len).find(|&i| got[i] != pattern(seed, src_off + i as u64)) {
        panic!("{what}: byte {i} of {len} differs");
    }
}

struct Pair<D: Domain> {
    owner_dom: D,
    reader_dom: D,
    owner: D::Conn,
    reader: D::Conn,
}

fn pair<F: TransportFactory>(f: &F) -> Pair<F::D> {
    let owner_dom = f.domain().expect("owner domain");
    let reader_dom = f.domain().expect("reader domain");
    let (owner, reader) = connect(f, &owner_dom, &reader_dom);
    Pair {
        owner_dom,
        reader_dom,
        owner,
        reader,
    }
}

/// (accepted side at `server`, connecting side at `client`).
fn connect<F: TransportFactory>(
    f: &F,
    server: &F::D,
    client: &F::D,
) -> (<F::D as Domain>::Conn, <F::D as Domain>::Conn) {
    let mut listener = server.listen(&f.listen_addr()).expect("listen");
    let addr = listener.local_addr();
    let t = f.timeout();
    std::thread::scope(|s| {
        let acc = s.spawn(move || listener.accept(t));
        let c = client
            .connect(&addr, t)
            .unwrap_or_else(|e| panic!("{}: connect {addr}: {e}", f.name()));
        let mut a = acc
            .join()
            .expect("accept thread")
            .unwrap_or_else(|e| panic!("{}: accept: {e}", f.name()));
        // The accepted side owns the memory here: it lets the peer READ,
        // as a frontend does once a backend registered on its data port.
        a.allow_remote_reads();
        (a, c)
    })
}

/// Drives `conn` (serving its peer's READs) until `stop`.
fn serve<C: Connection>(conn: &mut C, stop: &AtomicBool) {
    let mut idle = Idle::new();
    while !stop.load(Ordering::Acquire) {
        if conn.progress().is_err() {
            break;
        }
        idle.wait();
        if idle.0 > 1000 {
            idle.reset();
        }
    }
}

fn send_retry<C: Connection>(
    conn: &mut C,
    msg: &[u8],
    other: &mut impl FnMut(),
    until: StdInstant,
) {
    let mut idle = Idle::new();
    loop {
        match conn.send(msg) {
            Ok(()) => return,
            Err(Error::QueueFull) => {}
            Err(e) => panic!("send: {e}"),
        }
        let _ = conn.progress();
        other();
        assert!(
            StdInstant::now() < until,
            "send did not drain before the deadline"
        );
        idle.wait();
    }
}

fn recv_one<C: Connection>(
    conn: &mut C,
    buf: &mut [u8],
    other: &mut impl FnMut(),
    until: StdInstant,
) -> usize {
    let mut idle = Idle::new();
    loop {
        match conn.try_recv(buf) {
            Ok(Some(n)) => return n,
            Ok(None) => {}
            Err(e) => panic!("try_recv: {e}"),
        }
        other();
        assert!(StdInstant::now() < until, "no message before the deadline");
        idle.wait();
    }
}

/// Posts all `ops` (retrying on QueueFull) and collects their completions.
fn read_all<C: Connection>(conn: &mut C, ops: &[ReadOp], until: StdInstant) -> Vec<Completion> {
    let mut out = Vec::with_capacity(ops.len());
    let mut buf = [Completion::default(); 64];
    let mut next = 0;
    let mut idle = Idle::new();
    while out.len() < ops.len() {
        if next < ops.len() {
            match conn.post_reads(&ops[next..]) {
                Ok(n) => next += n,
                Err(Error::QueueFull) => {}
                Err(e) => panic!("post_reads: {e}"),
            }
        }
        let n = conn.poll_completions(&mut buf).expect("poll_completions");
        out.extend_from_slice(&buf[..n]);
        if n == 0 {
            assert!(
                StdInstant::now() < until,
                "READs not completed before the deadline ({} of {})",
                out.len(),
                ops.len()
            );
            idle.wait();
        } else {
            idle.reset();
        }
    }
    out
}

/// One READ whose outcome may be an error (at post or in the completion).
fn read_outcome<C: Connection>(
    conn: &mut C,
    op: &ReadOp,
    until: StdInstant,
) -> Result<u32, ErrorKind> {
    if let Err(e) = conn.post_read(op) {
        return Err(e.kind());
    }
    let mut buf = [Completion::default(); 4];
    let mut idle = Idle::new();
    loop {
        let n = conn.poll_completions(&mut buf).expect("poll_completions");
        if n > 0 {
            assert_eq!(n, 1);
            assert_eq!(buf[0].wr_id, op.wr_id);
            return buf[0].status.map(|_| buf[0].bytes);
        }
        assert!(
            StdInstant::now() < until,
            "READ outcome not reported before the deadline"
        );
        idle.wait();
    }
}

fn landing<D: Domain, F: TransportFactory<D = D>>(
    f: &F,
    d: &D,
    len: usize,
) -> (Arc<Region>, Registration) {
    let r = f.region(len).expect("landing region");
    let reg = d
        .register(&r, Access::LOCAL_WRITE)
        .expect("register landing");
    (r, reg)
}

fn source<D: Domain, F: TransportFactory<D = D>>(
    f: &F,
    d: &D,
    len: usize,
    seed: u8,
) -> (Arc<Region>, Registration) {
    let r = f.region(len).expect("source region");
    fill(&r, seed);
    let reg = d
        .register(&r, Access::REMOTE_READ)
        .expect("register source");
    (r, reg)
}

fn op(wr_id: u64, remote: RemoteRef, local: LocalRef) -> ReadOp {
    ReadOp {
        wr_id,
        remote,
        local,
    }
}

// ---- checks ------------------------------------------------------------------

/// Both directions carry control messages in order, including the largest
/// ones; a too-small receive buffer leaves the message queued.
pub fn connect_and_exchange<F: TransportFactory>(f: &F) {
    let _g = serial();
    let until = deadline(f);
    let Pair {
        mut owner,
        mut reader,
        ..
    } = pair(f);
    let mut buf = vec![0u8; wire::MAX_MESSAGE_LEN];
    let mut msg = vec![0u8; wire::MAX_MESSAGE_LEN];

    let n = wire::encode(
        &mut msg,
        &wire::Register::new(wire::Role::Backend, 3, 4, "127.0.0.1:9"),
    )
    .unwrap();
    send_retry(&mut reader, &msg[..n], &mut || {}, until);
    let _ = reader.progress();
    // Too small: refused, kept.
    let mut tiny = [0u8; 8];
    let mut idle = Idle::new();
    loop {
        let _ = reader.progress();
        match owner.try_recv(&mut tiny) {
            Err(Error::BufferTooSmall { .. }) => break,
            Ok(None) => {}
            other => panic!("{}: expected BufferTooSmall, got {other:?}", f.name()),
        }
        assert!(StdInstant::now() < until, "no message");
        idle.wait();
    }
    let got = recv_one(&mut owner, &mut buf, &mut || drop(reader.progress()), until);
    match wire::decode(&buf[..got]).expect("valid message") {
        Message::Register(r) => assert_eq!((r.id, r.count, r.endpoint()), (3, 4, "127.0.0.1:9")),
        m => panic!("unexpected {m:?}"),
    }

    // Many small messages both ways, interleaved, in order.
    const N: u64 = 300;
    let mut sent_r = 0u64;
    let mut sent_o = 0u64;
    let mut got_r = 0u64;
    let mut got_o = 0u64;
    let mut idle = Idle::new();
    while got_r < N || got_o < N {
        if sent_r < N {
            let t = wire::Task {
                task_id: sent_r,
                budget_ns: 1_000,
                model_id: 1,
                frontend_id: 2,
                input: RemoteRef::default(),
                ..Default::default()
            };
            let n = wire::encode(&mut msg, &t).unwrap();
            match reader.send(&msg[..n]) {
                Ok(()) => sent_r += 1,
                Err(Error::QueueFull) => {}
                Err(e) => panic!("send: {e}"),
            }
        }
        if sent_o < N {
            let h = wire::Heartbeat {
                seq: sent_o,
                role: wire::Role::Frontend as u32,
                id: 9,
            };
            let n = wire::encode(&mut msg, &h).unwrap();
            match owner.send(&msg[..n]) {
                Ok(()) => sent_o += 1,
                Err(Error::QueueFull) => {}
                Err(e) => panic!("send: {e}"),
            }
        }
        if let Some(n) = owner.try_recv(&mut buf).expect("owner recv") {
            match wire::decode(&buf[..n]).unwrap() {
                Message::Task(t) => assert_eq!(t.task_id, got_o, "order"),
                m => panic!("unexpected {m:?}"),
            }
            got_o += 1;
            idle.reset();
        }
        if let Some(n) = reader.try_recv(&mut buf).expect("reader recv") {
            match wire::decode(&buf[..n]).unwrap() {
                Message::Heartbeat(h) => assert_eq!(h.seq, got_r, "order"),
                m => panic!("unexpected {m:?}"),
            }
            got_r += 1;
            idle.reset();
        }
        assert!(
            StdInstant::now() < until,
            "{}: exchange stalled at {got_o}/{got_r}",
            f.name()
        );
        idle.wait();
    }

    // The largest messages: a full batch plan and a full inline completion.
    let tasks: Vec<wire::BatchTask> = (0..wire::MAX_BATCH_TASKS as u64)
        .map(|i| wire::BatchTask {
            task_id: i,
            frontend_id: 1,
            queued_us: 0,
            input: RemoteRef {
                key: 1,
                len: 2,
                offset: i,
            },
        })
        .collect();
    let head = wire::BatchPlanHead {
        batch_id: 5,
        exec_in_ns: 10,
        model_id: 1,
        gpu_id: 0,
        count: 0,
        run_ns: 0,
            epoch: 0,
    };
    let n = wire::encode_batch_plan(&mut msg, &head, &tasks).unwrap();
    send_retry(&mut owner, &msg[..n], &mut || {}, until);
    let inline = vec![0xabu8; wire::MAX_INLINE_OUTPUT];
    let ch = wire::CompletionHead {
        task_id: 77,
        output_kind: wire::OutputKind::Inline as u32,
        ..Default::default()
    };
    let m = wire::encode_completion(&mut msg, &ch, &inline).unwrap();
    send_retry(&mut owner, &msg[..m], &mut || {}, until);
    // The sender keeps polling until its bytes are out.
    let got = recv_one(&mut reader, &mut buf, &mut || drop(owner.progress()), until);
    match wire::decode(&buf[..got]).unwrap() {
        Message::BatchPlan(h, t) => {
            assert_eq!(h.count as usize, wire::MAX_BATCH_TASKS);
            assert!(t.iter().eq(tasks.iter().copied()));
        }
        m => panic!("unexpected {m:?}"),
    }
    let got = recv_one(&mut reader, &mut buf, &mut || drop(owner.progress()), until);
    match wire::decode(&buf[..got]).unwrap() {
        Message::Completion(h, bytes) => {
            assert_eq!(h.task_id, 77);
            assert_eq!(bytes, &inline[..]);
        }
        m => panic!("unexpected {m:?}"),
    }
    // Malformed outgoing bytes are refused before they reach the stream.
    assert!(
        owner.send(&msg[..m - 1]).is_err(),
        "truncated message accepted by send"
    );
}

const SIZES: [usize; 9] = [1, 2, 63, 64, 4096, 4097, 150 * 1024, 1 << 20, 4 << 20];

/// READs of 1 B .. 4 MiB at odd offsets, one at a time and batched.
pub fn read_sizes<F: TransportFactory>(f: &F) {
    let _g = serial();
    let until = deadline(f);
    let Pair {
        owner_dom,
        reader_dom,
        mut owner,
        mut reader,
    } = pair(f);
    let src_len = 8 << 20;
    let (_src, src_reg) = source(f, &owner_dom, src_len, 7);
    let (dst, dst_reg) = landing(f, &reader_dom, src_len);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| serve(&mut owner, &stop));
        for (i, &len) in SIZES.iter().enumerate() {
            let off = ((len * 7 + 13 * i) % (src_len - len)) as u64;
            let at = ((len * 3 + 5 * i) % (src_len - len)) as u64;
            let o = op(
                i as u64,
                src_reg.remote_ref(off, len as u32).unwrap(),
                dst_reg.local_ref(at, len as u32).unwrap(),
            );
            let c = read_all(&mut reader, &[o], until);
            assert_eq!(c[0].status, Ok(()), "{}: READ of {len} B", f.name());
            assert_eq!((c[0].wr_id, c[0].bytes as usize), (i as u64, len));
            check_landed(
                &dst,
                at,
                7,
                off,
                len,
                &format!("{}: READ of {len} B", f.name()),
            );
        }
        // A batch, all posted at once.
        let ops: Vec<ReadOp> = (0..200u64)
            .map(|i| {
                let len = 1000 + (i as u32 * 37) % 3000;
                let off = i * 4099;
                op(
                    1000 + i,
                    src_reg.remote_ref(off, len).unwrap(),
                    dst_reg.local_ref(i * 4096, len).unwrap(),
                )
            })
            .collect();
        let cs = read_all(&mut reader, &ops, until);
        for c in &cs {
            assert_eq!(c.status, Ok(()), "{}: batched READ", f.name());
            let i = c.wr_id - 1000;
            let o = &ops[i as usize];
            assert_eq!(c.bytes, o.remote.len);
            check_landed(
                &dst,
                i * 4096,
                7,
                o.remote.offset - src_reg.addr_base(),
                o.remote.len as usize,
                "batched READ",
            );
        }
        let mut ids: Vec<u64> = cs.iter().map(|c| c.wr_id).collect();
        ids.sort_unstable();
        assert!(
            ids.iter().copied().eq(1000..1200),
            "every batched READ completes once"
        );
        stop.store(true, Ordering::Release);
    });
}

/// One reader READs from several owners at once (each owner served by its
/// own thread), and several reader threads READ one owner at once.
pub fn incast<F: TransportFactory>(f: &F) {
    let _g = serial();
    let until = deadline(f);
    const OWNERS: usize = 3;
    const PER: u64 = 48;
    const LEN: u32 = 24 * 1024;
    let reader_dom = f.domain().expect("reader domain");
    let (dst, dst_reg) = landing(f, &reader_dom, OWNERS * PER as usize * LEN as usize);
    let mut owners = Vec::new();
    for k in 0..OWNERS {
        let d = f.domain().expect("owner domain");
        let (src, reg) = source(f, &d, PER as usize * LEN as usize + 4096, 40 + k as u8);
        let (oc, rc) = connect(f, &d, &reader_dom);
        owners.push((d, src, reg, oc, rc));
    }
    let (od, oreg) = (owners[0].0.clone(), owners[0].2.clone());
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let mut readers = Vec::new();
        for (_, _, reg, oc, rc) in owners.iter_mut() {
            let stop = &stop;
            s.spawn(move || serve(oc, stop));
            readers.push((rc, reg.clone()));
        }
        // Post everything to every owner first (the incast), then poll all.
        let mut expected = 0;
        let mut posted = [0u64; OWNERS];
        let mut done = 0;
        let mut buf = [Completion::default(); 32];
        let mut idle = Idle::new();
        let total = OWNERS as u64 * PER;
        while done < total {
            for (k, (rc, reg)) in readers.iter_mut().enumerate() {
                while posted[k] < PER {
                    let i = posted[k];
                    let slot = k as u64 * PER + i;
                    let o = op(
                        slot,
                        reg.remote_ref(i * LEN as u64 + 1, LEN).unwrap(),
                        dst_reg.local_ref(slot * LEN as u64, LEN).unwrap(),
                    );
                    match rc.post_read(&o) {
                        Ok(()) => posted[k] += 1,
                        Err(Error::QueueFull) => break,
                        Err(e) => panic!("{}: incast post: {e}", f.name()),
                    }
                }
                let n = rc.poll_completions(&mut buf).expect("poll");
                for c in &buf[..n] {
                    assert_eq!(c.status, Ok(()), "{}: incast READ {}", f.name(), c.wr_id);
                    let (owner, i) = (c.wr_id / PER, c.wr_id % PER);
                    assert_eq!(owner as usize, k, "completion on the right connection");
                    check_landed(
                        &dst,
                        c.wr_id * LEN as u64,
                        40 + k as u8,
                        i * LEN as u64 + 1,
                        LEN as usize,
                        "incast READ",
                    );
                    expected += 1;
                }
                done += n as u64;
                if n > 0 {
                    idle.reset();
                }
            }
            assert!(
                StdInstant::now() < until,
                "{}: incast stalled at {done}/{total}",
                f.name()
            );
            idle.wait();
        }
        assert_eq!(expected, total);

        // Several reader threads against one owner domain.
        let mut pairs = Vec::new();
        for _ in 0..2 {
            let rd = f.domain().expect("reader domain");
            let (l, lreg) = landing(f, &rd, 64 * 4096);
            let (oc, rc) = connect(f, &od, &rd);
            pairs.push((rd, l, lreg, oc, rc));
        }
        let stop2 = AtomicBool::new(false);
        std::thread::scope(|s2| {
            let mut hs = Vec::new();
            for (_, l, lreg, oc, rc) in pairs.iter_mut() {
                let stop2 = &stop2;
                s2.spawn(move || serve(oc, stop2));
                let oreg = oreg.clone();
                let lreg = lreg.clone();
                let l = l.clone();
                hs.push(s2.spawn(move || {
                    let ops: Vec<ReadOp> = (0..64u64)
                        .map(|i| {
                            op(
                                i,
                                oreg.remote_ref(i * 512, 4096).unwrap(),
                                lreg.local_ref(i * 4096, 4096).unwrap(),
                            )
                        })
                        .collect();
                    for c in read_all(rc, &ops, until) {
                        assert_eq!(c.status, Ok(()));
                        check_landed(
                            &l,
                            c.wr_id * 4096,
                            40,
                            c.wr_id * 512,
                            4096,
                            "concurrent readers",
                        );
                    }
                }));
            }
            for h in hs {
                h.join().expect("reader thread");
            }
            stop2.store(true, Ordering::Release);
        });
        stop.store(true, Ordering::Release);
    });
}

fn is_access_error(k: ErrorKind) -> bool {
    matches!(
        k,
        ErrorKind::BadKey
            | ErrorKind::OutOfBounds
            | ErrorKind::Deregistered
            | ErrorKind::AccessDenied
    )
}

/// One thread sleeping on several connections' [`Connection::wait_fd`]s (a
/// [`crate::waitset::WaitSet`]) wakes when any peer sends or leaves, and not
/// otherwise. Transports without a wait fd pass trivially.
pub fn wait_fd_wakes<F: TransportFactory>(f: &F) {
    let _g = serial();
    let d = f.domain().expect("domain");
    let (mut s1, c1) = connect(f, &d, &d);
    let (mut s2, mut c2) = connect(f, &d, &d);
    let (Some(fd1), Some(fd2)) = (s1.wait_fd(), s2.wait_fd()) else {
        return;
    };
    let mut set = crate::waitset::WaitSet::new().expect("wait set");
    set.add(fd1).expect("add fd");
    set.add(fd2).expect("add fd");
    let mut buf = [0u8; 64];
    // Poll first (arms receives), arm the fds, then nothing is pending: the
    // wait times out.
    assert_eq!(s1.try_recv(&mut buf).expect("poll"), None);
    assert_eq!(s2.try_recv(&mut buf).expect("poll"), None);
    assert!(s1.arm_wait() && s2.arm_wait(), "{}: nothing pending, yet not armed", f.name());
    assert_eq!(set.wait(Duration::from_millis(20)), 0, "{}: woke with nothing to do", f.name());

    let mut msg = [0u8; 64];
    let n = wire::encode(&mut msg, &wire::Heartbeat { seq: 1, role: 4, id: 2 }).expect("encode");
    c2.send(&msg[..n]).expect("send");
    c2.progress().expect("progress");
    let end = deadline(f);
    let mut got = None;
    while got.is_none() {
        assert!(StdInstant::now() < end, "{}: no wake-up", f.name());
        if s1.arm_wait() && s2.arm_wait() {
            set.wait(Duration::from_millis(1000));
        }
        assert_eq!(s1.try_recv(&mut buf).expect("poll"), None);
        got = s2.try_recv(&mut buf).expect("poll");
    }
    assert_eq!(got, Some(n));

    // A departure wakes the set too, and is then reported.
    drop(c1);
    loop {
        assert!(StdInstant::now() < end, "{}: departure not noticed", f.name());
        if s1.arm_wait() {
            set.wait(Duration::from_millis(1000));
        }
        match s1.try_recv(&mut buf) {
            Err(Error::PeerDisconnected) => break,
            Ok(None) => {}
            other => panic!("{}: {other:?}", f.name()),
        }
    }
    let _ = (&mut c2, &mut s2);
}

/// A connected pair whose accepted side's wait fd is in a fresh wait set
/// under key 7; None if the transport has no wait fd.
type Watched<F> = (<<F as TransportFactory>::D as Domain>::Conn, <<F as TransportFactory>::D as Domain>::Conn, crate::waitset::WaitSet);

fn watched_pair<F: TransportFactory>(f: &F) -> Option<Watched<F>> {
    let d = f.domain().expect("domain");
    let (s, c) = connect(f, &d, &d);
    let fd = s.wait_fd()?;
    let mut set = crate::waitset::WaitSet::new().expect("wait set");
    set.add_keyed(fd, 7).expect("add fd");
    Some((s, c, set))
}

/// The contract a host relies on to skip links that its wait set does not
/// report ([`Connection::wait_fd`]): a burst is drained to `Ok(None)`; from
/// then on, without any further `try_recv`, the fd stays quiet until a new
/// message or the peer's departure makes it readable, once armed by
/// [`Connection::arm_wait`] (before that, `may_hold_input` tells).
pub fn wait_fd_after_empty_recv<F: TransportFactory>(f: &F) {
    let _g = serial();
    let Some((mut s, mut c, mut set)) = watched_pair(f) else {
        return;
    };
    let end = deadline(f);
    let mut buf = [0u8; 64];
    let mut ready = Vec::new();
    // Blocks until the fd is readable (by the set's own report, not by
    // polling the connection).
    let wait_ready = |s: &<F::D as Domain>::Conn, set: &mut crate::waitset::WaitSet, what: &str| {
        let mut ready = Vec::new();
        loop {
            assert!(StdInstant::now() < end, "{}: {what}: fd never readable", f.name());
            if !s.arm_wait() {
                // Input pending that the fd need not report yet.
                assert!(s.may_hold_input(), "{}: {what}: not armed, yet holds nothing", f.name());
                break;
            }
            set.wait(Duration::from_millis(1000));
            set.ready_now(&mut ready);
            if ready == [7] {
                break;
            }
            ready.clear();
        }
    };
    assert_eq!(s.try_recv(&mut buf).expect("poll"), None);
    let mut msg = [0u8; 64];
    for round in 0..3u32 {
        // A burst in one write: the receiver may buffer all but the first.
        let burst = 1 + round * 20;
        for seq in 0..burst {
            let n = wire::encode(&mut msg, &wire::Heartbeat { seq: u64::from(seq), role: 4, id: 2 }).expect("encode");
            c.send_batched(&msg[..n]).expect("send");
        }
        c.flush_batched().expect("flush");
        c.progress().expect("progress");
        wait_ready(&s, &mut set, "burst");
        let mut got = 0;
        while got < burst {
            assert!(StdInstant::now() < end, "{}: burst of {burst}: got {got}", f.name());
            match s.try_recv(&mut buf).expect("recv") {
                Some(_) => got += 1,
                // The rest is on its way: the fd says when.
                None => wait_ready(&s, &mut set, "rest of the burst"),
            }
        }
        assert_eq!(s.try_recv(&mut buf).expect("recv"), None);
        ready.clear();
        set.ready_now(&mut ready);
        assert!(ready.is_empty(), "{}: drained, yet readable", f.name());
    }
    drop(c);
    wait_ready(&s, &mut set, "departure");
    let left = loop {
        assert!(StdInstant::now() < end, "{}: departure not reported", f.name());
        match s.try_recv(&mut buf) {
            Ok(None) => wait_ready(&s, &mut set, "departure"),
            Ok(Some(_)) => {}
            Err(e) => break e,
        }
    };
    assert!(matches!(left, Error::PeerDisconnected), "{}: {left:?}", f.name());
}

/// A message that a `send` or `progress` took off the socket (the fd is
/// then quiet) is reported by [`Connection::may_hold_input`]: a host that
/// drains only links its wait set reports would otherwise leave it behind
/// until the peer's next message (a lost wake-up: a task waiting at idle
/// until the frontend's next heartbeat).
pub fn input_taken_in_by_a_send_is_reported<F: TransportFactory>(f: &F) {
    let _g = serial();
    let Some((mut s, mut c, mut set)) = watched_pair(f) else {
        return;
    };
    let end = deadline(f);
    let mut buf = [0u8; 64];
    let mut msg = [0u8; 64];
    assert_eq!(s.try_recv(&mut buf).expect("poll"), None);
    assert!(!s.may_hold_input(), "{}: drained, yet holds input", f.name());
    for round in 0..3u64 {
        let n = wire::encode(&mut msg, &wire::Heartbeat { seq: round, role: 4, id: 2 }).expect("encode");
        c.send(&msg[..n]).expect("send");
        c.progress().expect("progress");
        // Wait until the kernel reports the message (or the connection
        // says it holds it), without receiving.
        let mut ready = Vec::new();
        while ready != [7] && s.arm_wait() {
            assert!(StdInstant::now() < end, "{}: never readable", f.name());
            ready.clear();
            set.wait(Duration::from_millis(1000));
            set.ready_now(&mut ready);
        }
        // Our own traffic on the link: a send and progress may take the
        // message in.
        let m = wire::encode(&mut msg, &wire::Heartbeat { seq: 100 + round, role: 4, id: 3 }).expect("encode");
        s.send(&msg[..m]).expect("send back");
        s.progress().expect("progress");
        ready.clear();
        set.ready_now(&mut ready);
        assert!(
            ready == [7] || s.may_hold_input(),
            "{}: round {round}: the message left the socket and the connection does not say it holds it",
            f.name()
        );
        let got = loop {
            assert!(StdInstant::now() < end, "{}: message lost", f.name());
            if let Some(k) = s.try_recv(&mut buf).expect("recv") {
                break k;
            }
            set.wait(Duration::from_millis(10));
        };
        assert_eq!(got, n);
        // Drain what came back on the other side.
        while c.try_recv(&mut buf).expect("recv back").is_none() {
            assert!(StdInstant::now() < end, "{}: echo lost", f.name());
            std::thread::yield_now();
        }
    }
}

/// `send_progress`, where a transport reports it: `accepted` grows by
/// each message's bytes at `send`; `taken` never passes it, never goes
/// back, and catches up once the peer has the message. While the peer
/// does not read, the backlog shows (`taken < accepted` once `send` says
/// the queue is full) and clears once the peer has read every message.
/// `accepted_bytes` is `accepted` throughout.
pub fn send_progress_counts<F: TransportFactory>(f: &F) {
    let _g = serial();
    let mut p = pair(f);
    let Some(start) = p.reader.send_progress() else {
        return;
    };
    assert!(start.taken <= start.accepted, "{}: {start:?}", f.name());
    let end = deadline(f);
    let (mut msg, mut buf) = ([0u8; 64], [0u8; 64]);
    for round in 0..4u64 {
        let n = wire::encode(&mut msg, &wire::Heartbeat { seq: round, role: 4, id: 2 }).expect("encode");
        let before = p.reader.send_progress().expect("progress");
        send_retry(&mut p.reader, &msg[..n], &mut || {}, end);
        let after = p.reader.send_progress().expect("progress");
        assert_eq!(after.accepted, before.accepted + n as u64, "{}: round {round}", f.name());
        assert_eq!(p.reader.accepted_bytes(), Some(after.accepted), "{}: accepted_bytes is send_progress's", f.name());
        assert!(after.taken <= after.accepted, "{}: {after:?}", f.name());
        let got = recv_one(&mut p.owner, &mut buf, &mut || {}, end);
        assert_eq!(got, n);
        loop {
            let _ = p.reader.progress();
            let now = p.reader.send_progress().expect("progress");
            if now.taken == now.accepted {
                break;
            }
            assert!(StdInstant::now() < end, "{}: taken stuck at {now:?} after the peer read", f.name());
            std::thread::yield_now();
        }
    }
    if f.sends_block() {
        return;
    }
    // The peer stops reading: send until the queue is full.
    let n = wire::encode(&mut msg, &wire::Heartbeat { seq: 9, role: 4, id: 2 }).expect("encode");
    let before = p.reader.send_progress().expect("progress");
    let mut last = before;
    let mut queued = 0u64;
    loop {
        match p.reader.send(&msg[..n]) {
            Ok(()) => queued += 1,
            Err(Error::QueueFull) => break,
            Err(e) => panic!("{}: send: {e}", f.name()),
        }
        let now = p.reader.send_progress().expect("progress");
        assert!(now.taken >= last.taken && now.taken <= now.accepted, "{}: {last:?} then {now:?}", f.name());
        last = now;
        assert!(queued * (n as u64) < 1 << 30, "{}: 1 GiB queued and never full", f.name());
        assert!(StdInstant::now() < end, "{}: the queue never filled", f.name());
    }
    let full = p.reader.send_progress().expect("progress");
    assert_eq!(p.reader.accepted_bytes(), Some(full.accepted), "{}", f.name());
    assert_eq!(full.accepted, before.accepted + queued * n as u64, "{}", f.name());
    assert!(full.taken < full.accepted, "{}: a full queue and nothing waiting: {full:?}", f.name());
    // The peer reads every message: the backlog clears.
    for _ in 0..queued {
        let got = recv_one(&mut p.owner, &mut buf, &mut || {
            let _ = p.reader.progress();
        }, end);
        assert_eq!(got, n);
    }
    loop {
        let _ = p.reader.progress();
        let now = p.reader.send_progress().expect("progress");
        assert!(now.taken >= full.taken, "{}: taken went back: {full:?} then {now:?}", f.name());
        if now.taken == now.accepted {
            break;
        }
        assert!(StdInstant::now() < end, "{}: taken stuck at {now:?} after the peer read all", f.name());
        std::thread::yield_now();
    }
}

/// Bad key, out of bounds, deregistered and too-long READs are refused
/// with an error, never served; a precise transport also names the error
/// and keeps the connection usable.
pub fn rejects_bad_reads<F: TransportFactory>(f: &F) {
    let _g = serial();
    let until = deadline(f);
    let cases: [&str; 4] = [
        "bad key",
        "out of bounds",
        "deregistered",
        "landing too small",
    ];
    for (ci, case) in cases.iter().enumerate() {
        let Pair {
            owner_dom,
            reader_dom,
            mut owner,
            mut reader,
        } = pair(f);
        let (_src, src_reg) = source(f, &owner_dom, 64 * 1024, 3);
        let (dst, dst_reg) = landing(f, &reader_dom, 64 * 1024);
        let good = src_reg.remote_ref(0, 4096).unwrap();
        let remote = match ci {
            0 => RemoteRef {
                key: good.key ^ 0x0001_0000,
                ..good
            },
            1 => RemoteRef {
                offset: good.offset + 64 * 1024 - 10,
                len: 20,
                ..good
            },
            2 => {
                let (_r2, reg2) = source(f, &owner_dom, 8192, 1);
                let rr = reg2.remote_ref(0, 4096).unwrap();
                owner_dom
                    .deregister(&reg2)
                    .expect("idle deregistration succeeds");
                rr
            }
            _ => good,
        };
        let local = if ci == 3 {
            dst_reg.local_ref(0, 100).unwrap()
        } else {
            dst_reg.local_ref(0, 4096).unwrap()
        };
        // Poison the landing area: a refused READ must not write it.
        dst.write_at(0, &[0x5a; 4096]).unwrap();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| serve(&mut owner, &stop));
            let r = read_outcome(&mut reader, &op(ci as u64, remote, local), until);
            let k = match r {
                Ok(_) => panic!("{}: {case} READ was served", f.name()),
                Err(k) => k,
            };
            if ci == 3 {
                assert!(
                    matches!(k, ErrorKind::OutOfBounds | ErrorKind::TooLarge) || is_access_error(k),
                    "{case}: {k:?}"
                );
            } else {
                assert!(is_access_error(k), "{}: {case}: got {k:?}", f.name());
            }
            let mut b = [0u8; 4096];
            dst.read_at(0, &mut b).unwrap();
            assert!(
                b.iter().all(|&x| x == 0x5a),
                "{}: {case}: refused READ wrote the landing buffer",
                f.name()
            );
            if f.precise_errors() {
                let want: &[ErrorKind] = match ci {
                    0 => &[ErrorKind::BadKey],
                    1 => &[ErrorKind::OutOfBounds],
                    2 => &[ErrorKind::BadKey, ErrorKind::Deregistered],
                    _ => &[ErrorKind::OutOfBounds],
                };
                assert!(
                    want.contains(&k),
                    "{}: {case}: got {k:?}, want {want:?}",
                    f.name()
                );
                let again = read_outcome(
                    &mut reader,
                    &op(99, good, dst_reg.local_ref(0, 4096).unwrap()),
                    until,
                );
                assert_eq!(
                    again,
                    Ok(4096),
                    "{}: connection unusable after {case}",
                    f.name()
                );
                check_landed(&dst, 0, 3, 0, 4096, "READ after a refused one");
                // Too long for the transport.
                let max = reader_dom.max_read_len();
                if max < u32::MAX {
                    let big = RemoteRef {
                        len: max + 1,
                        ..good
                    };
                    let r = read_outcome(
                        &mut reader,
                        &op(
                            100,
                            big,
                            LocalRef {
                                len: max + 1,
                                ..local
                            },
                        ),
                        until,
                    );
                    assert!(r.is_err(), "{}: READ over max_read_len accepted", f.name());
                }
            }
            stop.store(true, Ordering::Release);
        });
    }
}

/// The owner deregisters a region while READs of it are in flight: each
/// READ either lands intact or fails with an access error, nothing hangs,
/// and the owner unmaps the region as soon as deregistration succeeds (a
/// transport touching it afterwards would crash the test).
pub fn deregister_during_reads<F: TransportFactory>(f: &F) {
    let _g = serial();
    let until = deadline(f);
    let Pair {
        owner_dom,
        reader_dom,
        mut owner,
        mut reader,
    } = pair(f);
    let len: u32 = 1 << 20;
    let count = reader.max_outstanding_reads().min(16) as u64;
    let (src, src_reg) = source(f, &owner_dom, len as usize * count as usize, 11);
    let (dst, dst_reg) = landing(f, &reader_dom, len as usize * count as usize);
    let ops: Vec<ReadOp> = (0..count)
        .map(|i| {
            op(
                i,
                src_reg.remote_ref(i * len as u64, len).unwrap(),
                dst_reg.local_ref(i * len as u64, len).unwrap(),
            )
        })
        .collect();
    let posted = reader.post_reads(&ops).expect("post");
    let served_src = Mutex::new(Some(src));
    let reader_done = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut idle = Idle::new();
            loop {
                match owner_dom.deregister(&src_reg) {
                    Ok(()) => break,
                    Err(Error::Busy) => {}
                    Err(e) => panic!("deregister: {e}"),
                }
                let _ = owner.progress();
                assert!(StdInstant::now() < until, "deregistration stayed Busy");
                idle.wait();
            }
            // Unmap now: any later access by a transport would fault.
            served_src.lock().unwrap_or_else(|p| p.into_inner()).take();
            serve(&mut owner, &reader_done);
        });
        let mut got = 0;
        let mut buf = [Completion::default(); 32];
        let mut idle = Idle::new();
        while got < posted {
            let n = reader.poll_completions(&mut buf).expect("poll");
            for c in &buf[..n] {
                match c.status {
                    Ok(()) => check_landed(
                        &dst,
                        c.wr_id * len as u64,
                        11,
                        c.wr_id * len as u64,
                        len as usize,
                        "READ racing deregistration",
                    ),
                    Err(k) => assert!(
                        is_access_error(k),
                        "{}: READ racing deregistration failed with {k:?}",
                        f.name()
                    ),
                }
            }
            got += n;
            assert!(
                StdInstant::now() < until,
                "{}: READs racing deregistration hung",
                f.name()
            );
            idle.wait();
        }
        reader_done.store(true, Ordering::Release);
    });
    // After deregistration: refused.
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| serve(&mut owner, &stop));
        let r = read_outcome(&mut reader, &ops[0], until);
        assert!(
            matches!(r, Err(k) if is_access_error(k)),
            "{}: READ after deregistration: {r:?}",
            f.name()
        );
        stop.store(true, Ordering::Release);
    });
}

/// The owner goes away (connection, domain and memory) while READs are
/// outstanding: every posted READ completes exactly once, successfully or
/// with an error, new READs are refused, and nothing hangs or panics.
pub fn disconnect_mid_read<F: TransportFactory>(f: &F) {
    let _g = serial();
    let until = deadline(f);
    let Pair {
        owner_dom,
        reader_dom,
        owner,
        mut reader,
    } = pair(f);
    let len: u32 = 256 * 1024;
    let (src, src_reg) = source(f, &owner_dom, 4 << 20, 21);
    let (dst, dst_reg) = landing(f, &reader_dom, 64 * len as usize);
    let completed = AtomicUsize::new(0);
    let owner_box = Mutex::new(Some((owner, owner_dom, src)));
    std::thread::scope(|s| {
        s.spawn(|| {
            let (mut owner, dom, src) = owner_box.lock().unwrap().take().unwrap();
            let mut idle = Idle::new();
            while completed.load(Ordering::Acquire) < 4 {
                let _ = owner.progress();
                assert!(StdInstant::now() < until, "reader made no progress");
                idle.wait();
            }
            // Leave mid-stream: READs are still outstanding.
            drop(owner);
            drop(dom);
            drop(src);
        });
        let window = reader.max_outstanding_reads().min(16);
        let mut next_id = 0u64;
        let mut seen = vec![false; 0];
        let mut error_seen = false;
        let mut refused = false;
        let mut buf = [Completion::default(); 32];
        let mut idle = Idle::new();
        loop {
            if !refused && reader.outstanding_reads() < window {
                let slot = next_id % 64;
                let o = op(
                    next_id,
                    src_reg
                        .remote_ref((next_id % 16) * len as u64, len)
                        .unwrap(),
                    dst_reg.local_ref(slot * len as u64, len).unwrap(),
                );
                match reader.post_read(&o) {
                    Ok(()) => {
                        next_id += 1;
                        seen.push(false);
                    }
                    Err(Error::QueueFull) => {}
                    Err(_) => refused = true,
                }
            }
            let n: usize = reader.poll_completions(&mut buf).unwrap_or_default();
            for c in &buf[..n] {
                let i = c.wr_id as usize;
                assert!(
                    i < seen.len() && !seen[i],
                    "{}: completion {i} unknown or repeated",
                    f.name()
                );
                seen[i] = true;
                match c.status {
                    Ok(()) => {
                        check_landed(
                            &dst,
                            (c.wr_id % 64) * len as u64,
                            21,
                            (c.wr_id % 16) * len as u64,
                            len as usize,
                            "READ before departure",
                        );
                        completed.fetch_add(1, Ordering::AcqRel);
                    }
                    Err(_) => error_seen = true,
                }
            }
            if (error_seen || refused) && reader.outstanding_reads() == 0 {
                break;
            }
            assert!(
                StdInstant::now() < until,
                "{}: departure not reported ({} outstanding)",
                f.name(),
                reader.outstanding_reads()
            );
            if n == 0 {
                idle.wait();
            } else {
                idle.reset();
            }
        }
        assert!(
            seen.iter().all(|&x| x),
            "{}: a posted READ never completed",
            f.name()
        );
        // Eventually refused for good.
        let mut idle = Idle::new();
        loop {
            let o = op(
                1 << 40,
                src_reg.remote_ref(0, 64).unwrap(),
                dst_reg.local_ref(0, 64).unwrap(),
            );
            if read_outcome(&mut reader, &o, until).is_err() {
                break;
            }
            assert!(
                StdInstant::now() < until,
                "{}: READs still served after the owner left",
                f.name()
            );
            idle.wait();
        }
    });
    let _ = reader.progress();
    assert!(
        !reader.is_connected() || reader.try_recv(&mut [0u8; 64]).is_err(),
        "{}: departure not visible",
        f.name()
    );
}

fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

fn shm_files() -> usize {
    let prefix = "symphony-";
    let pid = format!("-{}-", std::process::id());
    let Ok(dir) = crate::mem::shm_dir() else { return 0 };
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| {
                    let n = e.file_name();
                    let n = n.to_string_lossy();
                    n.starts_with(prefix) && n.contains(&pid)
                })
                .count()
        })
        .unwrap_or(0)
}

/// A full session (connect, register, READ, message, deregister, drop)
/// leaves no fd, region, registration or shm file behind.
pub fn no_leaks<F: TransportFactory>(f: &F) {
    let _g = serial();
    let until = deadline(f);
    // Warm-up: lazily created process-wide state (e.g. a device list) is not a leak.
    let _ = f.domain().map(drop);
    let fds = fd_count();
    let regions = crate::mem::live_regions();
    let files = shm_files();
    {
        let Pair {
            owner_dom,
            reader_dom,
            mut owner,
            mut reader,
        } = pair(f);
        let (_src, src_reg) = source(f, &owner_dom, 1 << 20, 5);
        let (dst, dst_reg) = landing(f, &reader_dom, 1 << 20);
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| serve(&mut owner, &stop));
            let ops: Vec<ReadOp> = (0..8u64)
                .map(|i| {
                    op(
                        i,
                        src_reg.remote_ref(i * 4096, 4096).unwrap(),
                        dst_reg.local_ref(i * 4096, 4096).unwrap(),
                    )
                })
                .collect();
            for c in read_all(&mut reader, &ops, until) {
                assert_eq!(c.status, Ok(()));
            }
            check_landed(&dst, 0, 5, 0, 4096, "READ in leak check");
            stop.store(true, Ordering::Release);
        });
        // The owner's last response may still be in flight: poll it out.
        super::deregister_within(&owner_dom, &src_reg, &mut [&mut owner], f.timeout())
            .expect("deregister source");
        super::deregister_within(&reader_dom, &dst_reg, &mut [&mut reader], f.timeout())
            .expect("deregister landing");
        assert_eq!(
            owner_dom.registered_count(),
            0,
            "{}: registrations left",
            f.name()
        );
        assert_eq!(
            reader_dom.registered_count(),
            0,
            "{}: registrations left",
            f.name()
        );
    }
    assert_eq!(
        crate::mem::live_regions(),
        regions,
        "{}: regions leaked",
        f.name()
    );
    assert_eq!(fd_count(), fds, "{}: fds leaked", f.name());
    assert_eq!(shm_files(), files, "{}: shm files leaked", f.name());
}
