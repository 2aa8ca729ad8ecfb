//! The suite's control-message checks: order both ways, the largest
//! messages, wait fds and wake-ups, send progress.

use super::*;
use crate::wire::{self, Message};

/// Both directions carry control messages in order, including the largest
/// ones; a too-small receive buffer leaves the message queued.
pub fn connect_and_exchange<F: TransportFactory>(f: &F) {
    let (_g, until, Pair { mut owner, mut reader, .. }) = begin(f);
    let mut buf = vec![0u8; wire::MAX_MESSAGE_LEN];
    let mut msg = vec![0u8; wire::MAX_MESSAGE_LEN];
    let mut link = Link { owner: &mut owner, reader: &mut reader, buf: &mut buf, msg: &mut msg, until };
    register_through_a_tiny_buffer(f, &mut link);
    small_messages_both_ways(f, &mut link);
    largest_messages(&mut link);
}

/// Both ends of a pair and the buffers a message check uses.
struct Link<'a, C: Connection> {
    owner: &'a mut C,
    reader: &'a mut C,
    buf: &'a mut [u8],
    msg: &'a mut [u8],
    until: StdInstant,
}

/// A register message is refused by an 8-byte buffer, kept, and then
/// received whole.
fn register_through_a_tiny_buffer<F: TransportFactory, C: Connection>(f: &F, link: &mut Link<'_, C>) {
    let Link { owner, reader, buf, msg, until } = link;
    let until = *until;
    let n = wire::encode(
        msg,
        &wire::Register::new(wire::Role::Backend, 3, 4, "127.0.0.1:9"),
    )
    .unwrap();
    send_retry(*reader, &msg[..n], &mut || {}, until);
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
    let got = recv_one(*owner, buf, &mut || drop(reader.progress()), until);
    match wire::decode(&buf[..got]).expect("valid message") {
        Message::Register(r) => assert_eq!((r.id, r.count, r.endpoint()), (3, 4, "127.0.0.1:9")),
        m => panic!("unexpected {m:?}"),
    }
}

/// Many small messages both ways, interleaved, arrive in order.
fn small_messages_both_ways<F: TransportFactory, C: Connection>(f: &F, link: &mut Link<'_, C>) {
    let Link { owner, reader, buf, msg, until } = link;
    let until = *until;
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
            let n = wire::encode(msg, &t).unwrap();
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
            let n = wire::encode(msg, &h).unwrap();
            match owner.send(&msg[..n]) {
                Ok(()) => sent_o += 1,
                Err(Error::QueueFull) => {}
                Err(e) => panic!("send: {e}"),
            }
        }
        if let Some(n) = owner.try_recv(buf).expect("owner recv") {
            match wire::decode(&buf[..n]).unwrap() {
                Message::Task(t) => assert_eq!(t.task_id, got_o, "order"),
                m => panic!("unexpected {m:?}"),
            }
            got_o += 1;
            idle.reset();
        }
        if let Some(n) = reader.try_recv(buf).expect("reader recv") {
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
}

/// The largest messages: a full batch plan and a full inline completion;
/// malformed outgoing bytes are refused before they reach the stream.
fn largest_messages<C: Connection>(link: &mut Link<'_, C>) {
    let Link { owner, reader, buf, msg, until } = link;
    let until = *until;
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
            capability: Default::default(),
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
    let n = wire::encode_batch_plan(msg, &head, &tasks).unwrap();
    send_retry(*owner, &msg[..n], &mut || {}, until);
    let inline = vec![0xabu8; wire::MAX_INLINE_OUTPUT];
    let ch = wire::CompletionHead {
        task_id: 77,
        output_kind: wire::OutputKind::Inline as u32,
        ..Default::default()
    };
    let m = wire::encode_completion(msg, &ch, &inline).unwrap();
    send_retry(*owner, &msg[..m], &mut || {}, until);
    // The sender keeps polling until its bytes are out.
    let got = recv_one(*reader, buf, &mut || drop(owner.progress()), until);
    match wire::decode(&buf[..got]).unwrap() {
        Message::BatchPlan(h, t) => {
            assert_eq!(h.count as usize, wire::MAX_BATCH_TASKS);
            assert!(t.iter().eq(tasks.iter().copied()));
        }
        m => panic!("unexpected {m:?}"),
    }
    let got = recv_one(*reader, buf, &mut || drop(owner.progress()), until);
    match wire::decode(&buf[..got]).unwrap() {
        Message::Completion(h, bytes) => {
            assert_eq!(h.task_id, 77);
            assert_eq!(bytes, &inline[..]);
        }
        m => panic!("unexpected {m:?}"),
    }
    assert!(
        owner.send(&msg[..m - 1]).is_err(),
        "truncated message accepted by send"
    );
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
