//! The messages of `netbench lat`/`bw` for WRITE and SEND over transports
//! whose connections carry messages (and, for rdma, SEND): an operation of
//! S bytes travels as one or more wire `Completion`s with inline bytes
//! (chunks of at most [`MAX_CHUNK`] bytes, in order on one connection).
//! The `CompletionHead` carries the operation: `task_id` = sequence number,
//! `input_ns` = [`CHUNK_MAGIC`], `compute_ns` = verb and reply kind,
//! `since_start_ns` = total length << 32 | offset of this chunk.
//!
//! The server (`netbench serve`) lands every chunk in its sink buffer at the
//! chunk's offset (WRITE: the emulated remote memory; SEND: the emulated
//! receive buffer) and, once the last chunk of an operation is in, answers
//! with the whole operation back ([`Reply::Full`]: latency ping-pong,
//! bidirectional bandwidth), with a short acknowledgement ([`Reply::Ack`]:
//! the sender's "completion" of an emulated WRITE in bandwidth tests), or
//! not at all ([`Reply::None`]: SEND bandwidth, as perftest's `ib_send_bw`,
//! whose sender waits for no answer; the server only counts the operation).
//! Every chunk says where it goes; the one per-connection state of the
//! server is that count, which a [`PerfMsg::TallyQuery`] asks for (and
//! resets): the SEND stream's final check that every operation landed.

use dataplane::transport::{Connection, Error as TransportError, RemoteRef};
use dataplane::wire::{
    self, CompletionHead, Message, OutputKind, TaskStatus, HEADER_LEN, MAX_MESSAGE_LEN,
};

use crate::fail::Res;

/// `input_ns` of a chunk.
pub const CHUNK_MAGIC: u64 = u64::from_le_bytes(*b"NBPERF01");
/// `input_ns` of an acknowledgement.
pub const ACK_MAGIC: u64 = u64::from_le_bytes(*b"NBPERFAK");
/// `input_ns` of a tally query (client to server).
pub const TALLY_QUERY_MAGIC: u64 = u64::from_le_bytes(*b"NBPERFTQ");
/// `input_ns` of a tally (server to client; `task_id` = the count).
pub const TALLY_MAGIC: u64 = u64::from_le_bytes(*b"NBPERFTA");
/// `input_ns` of a raw-SEND phase's start (client to server; `task_id` =
/// receives to have posted | echo << 32; see `crate::server_raw`).
pub const RAW_OPEN_MAGIC: u64 = u64::from_le_bytes(*b"NBPERFRO");
/// `input_ns` of the answer to it (`task_id` = receives posted).
pub const RAW_READY_MAGIC: u64 = u64::from_le_bytes(*b"NBPERFRR");
/// `input_ns` of a WRITE ping-pong phase's start (client to server; the
/// client's remote-writable buffer: `task_id` = address, `compute_ns` = rkey
/// | length << 32, the length being the phase's operation size; see
/// `crate::server_raw`).
pub const WRITE_OPEN_MAGIC: u64 = u64::from_le_bytes(*b"NBPERFWO");
/// `input_ns` of the answer to it (the server's buffer, same fields; length
/// 0: refused).
pub const WRITE_READY_MAGIC: u64 = u64::from_le_bytes(*b"NBPERFWR");
/// Wire bytes of a chunk before its payload.
pub const CHUNK_HEAD: usize = HEADER_LEN + std::mem::size_of::<CompletionHead>();
/// Most payload bytes in one chunk (one wire message).
pub const MAX_CHUNK: usize = MAX_MESSAGE_LEN - CHUNK_HEAD;

/// The operation a chunk belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Emulated one-sided WRITE (lands at an offset of the peer's buffer).
    Write = 1,
    /// Two-sided SEND (lands in the peer's receive buffer).
    Send = 2,
}

/// What the server answers once an operation is whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    /// The same number of bytes back, as an operation of the same verb.
    Full = 0,
    /// A short acknowledgement carrying the sequence number.
    Ack = 1,
    /// Nothing: the server counts the operation (see [`PerfMsg::TallyQuery`]).
    None = 2,
}

/// One decoded chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk<'a> {
    /// Sequence number of the operation.
    pub seq: u64,
    /// Verb.
    pub op: Op,
    /// What the receiver answers.
    pub reply: Reply,
    /// Bytes of the whole operation.
    pub total: u32,
    /// Offset of this chunk in the operation.
    pub off: u32,
    /// This chunk's bytes.
    pub payload: &'a [u8],
}

impl Chunk<'_> {
    /// Whether this chunk ends its operation.
    pub fn is_last(&self) -> bool {
        u64::from(self.off) + self.payload.len() as u64 == u64::from(self.total)
    }
}

/// A decoded netbench perf message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PerfMsg<'a> {
    /// A piece of a WRITE or SEND.
    Chunk(Chunk<'a>),
    /// The acknowledgement of operation `seq`.
    Ack(u64),
    /// "How many [`Reply::None`] operations have landed on this connection
    /// since the last query?"
    TallyQuery,
    /// The answer to a [`PerfMsg::TallyQuery`].
    Tally(u64),
    /// rdma raw SENDs follow: have `rx_depth` receives posted on the raw
    /// queue pair, and answer each raw SEND with one of the same bytes
    /// (`echo`, latency) or only count it (bandwidth).
    RawOpen {
        /// Receives to keep posted.
        rx_depth: u32,
        /// Answer every raw SEND with its own bytes.
        echo: bool,
    },
    /// The answer to [`PerfMsg::RawOpen`]: receives posted.
    RawReady(u64),
    /// rdma WRITE ping-pong follows (latency, as perftest's `ib_write_lat`):
    /// the client's remote-writable buffer, `len` = the operation size. The
    /// server answers each WRITE into its buffer with a WRITE of the same
    /// bytes into this one. Untrusted: the server's NIC checks key and bounds.
    WriteOpen(RemoteRef),
    /// The answer to [`PerfMsg::WriteOpen`]: the server's remote-writable
    /// buffer (`len` = its capacity; 0 = no WRITE ping-pong here).
    WriteReady(RemoteRef),
}

/// Encodes one chunk into `buf` (at least `CHUNK_HEAD + payload.len()` bytes).
pub fn encode_chunk(
    buf: &mut [u8],
    seq: u64,
    op: Op,
    reply: Reply,
    total: u32,
    off: u32,
    payload: &[u8],
) -> Res<usize> {
    let head = CompletionHead {
        task_id: seq,
        status: TaskStatus::Ok as u32,
        output_kind: OutputKind::Inline as u32,
        input_ns: CHUNK_MAGIC,
        compute_ns: (op as u64) | ((reply as u64) << 8),
        since_start_ns: (u64::from(total) << 32) | u64::from(off),
        ..Default::default()
    };
    Ok(wire::encode_completion(buf, &head, payload)?)
}

/// Encodes a payload-free message: `magic` in `input_ns`, `value` in `task_id`.
fn encode_bare(buf: &mut [u8], magic: u64, value: u64) -> Res<usize> {
    let head = CompletionHead {
        task_id: value,
        status: TaskStatus::Ok as u32,
        output_kind: OutputKind::Inline as u32,
        input_ns: magic,
        ..Default::default()
    };
    Ok(wire::encode_completion(buf, &head, &[])?)
}

/// Encodes the acknowledgement of `seq`.
pub fn encode_ack(buf: &mut [u8], seq: u64) -> Res<usize> {
    encode_bare(buf, ACK_MAGIC, seq)
}

/// Encodes a tally query.
pub fn encode_tally_query(buf: &mut [u8]) -> Res<usize> {
    encode_bare(buf, TALLY_QUERY_MAGIC, 0)
}

/// Encodes the start of a raw-SEND phase (see [`PerfMsg::RawOpen`]).
pub fn encode_raw_open(buf: &mut [u8], rx_depth: u32, echo: bool) -> Res<usize> {
    encode_bare(buf, RAW_OPEN_MAGIC, u64::from(rx_depth) | (u64::from(echo) << 32))
}

/// Encodes the answer to a raw-SEND phase's start.
pub fn encode_raw_ready(buf: &mut [u8], posted: u64) -> Res<usize> {
    encode_bare(buf, RAW_READY_MAGIC, posted)
}

/// Encodes a buffer reference: `magic` in `input_ns`, the address in
/// `task_id`, key and length in `compute_ns`.
fn encode_buffer(buf: &mut [u8], magic: u64, r: RemoteRef) -> Res<usize> {
    let head = CompletionHead {
        task_id: r.offset,
        status: TaskStatus::Ok as u32,
        output_kind: OutputKind::Inline as u32,
        input_ns: magic,
        compute_ns: u64::from(r.key) | (u64::from(r.len) << 32),
        ..Default::default()
    };
    Ok(wire::encode_completion(buf, &head, &[])?)
}

/// Encodes the start of a WRITE ping-pong phase (see [`PerfMsg::WriteOpen`]).
pub fn encode_write_open(buf: &mut [u8], client_buf: RemoteRef) -> Res<usize> {
    encode_buffer(buf, WRITE_OPEN_MAGIC, client_buf)
}

/// Encodes the answer to a WRITE ping-pong phase's start.
pub fn encode_write_ready(buf: &mut [u8], server_buf: RemoteRef) -> Res<usize> {
    encode_buffer(buf, WRITE_READY_MAGIC, server_buf)
}

/// The buffer reference in a [`encode_buffer`] message's head.
fn buffer_of(head: &CompletionHead) -> RemoteRef {
    RemoteRef {
        key: head.compute_ns as u32,
        len: (head.compute_ns >> 32) as u32,
        offset: head.task_id,
    }
}

/// The iteration marker a WRITE ping-pong carries in the last byte of
/// operation `seq`: never 0 (a buffer's last byte is zeroed when a phase
/// opens) and different from the previous operation's, so the byte a side
/// polls changes exactly when the next operation has landed whole.
pub fn write_marker(seq: u64) -> u8 {
    (seq % 255) as u8 + 1
}

/// Encodes a tally of `count` operations.
pub fn encode_tally(buf: &mut [u8], count: u64) -> Res<usize> {
    encode_bare(buf, TALLY_MAGIC, count)
}

/// Decodes `msg` if it is a perf message with consistent fields (a chunk
/// that would end past its operation's length is refused: `None`).
pub fn decode(msg: &[u8]) -> Option<PerfMsg<'_>> {
    let Ok(Message::Completion(head, inline)) = wire::decode(msg) else {
        return None;
    };
    match head.input_ns {
        ACK_MAGIC => Some(PerfMsg::Ack(head.task_id)),
        TALLY_QUERY_MAGIC => Some(PerfMsg::TallyQuery),
        TALLY_MAGIC => Some(PerfMsg::Tally(head.task_id)),
        RAW_OPEN_MAGIC if head.task_id >> 33 == 0 => Some(PerfMsg::RawOpen {
            rx_depth: head.task_id as u32,
            echo: head.task_id >> 32 == 1,
        }),
        RAW_READY_MAGIC => Some(PerfMsg::RawReady(head.task_id)),
        WRITE_OPEN_MAGIC if inline.is_empty() => Some(PerfMsg::WriteOpen(buffer_of(&head))),
        WRITE_READY_MAGIC if inline.is_empty() => Some(PerfMsg::WriteReady(buffer_of(&head))),
        CHUNK_MAGIC => {
            let op = match head.compute_ns & 0xff {
                1 => Op::Write,
                2 => Op::Send,
                _ => return None,
            };
            let reply = match (head.compute_ns >> 8) & 0xff {
                0 => Reply::Full,
                1 => Reply::Ack,
                2 => Reply::None,
                _ => return None,
            };
            let total = (head.since_start_ns >> 32) as u32;
            let off = head.since_start_ns as u32;
            if u64::from(off) + inline.len() as u64 > u64::from(total) || inline.is_empty() {
                return None;
            }
            Some(PerfMsg::Chunk(Chunk {
                seq: head.task_id,
                op,
                reply,
                total,
                off,
                payload: inline,
            }))
        }
        _ => None,
    }
}

/// The server's side: a sink buffer where chunks land and a message buffer
/// for answers, both allocated once.
pub struct Sink {
    buf: Vec<u8>,
    out: Vec<u8>,
}

impl Sink {
    /// A sink for operations of up to `cap` bytes.
    pub fn new(cap: usize) -> Self {
        Sink {
            buf: vec![0u8; cap],
            out: vec![0u8; MAX_MESSAGE_LEN],
        }
    }

    /// Handles `msg` if it is a perf message: lands a chunk and answers a
    /// finished operation on `conn` (or adds it to `landed`, the
    /// connection's count of [`Reply::None`] operations), answers a tally
    /// query with `landed` and resets it. Returns whether `msg` was a perf
    /// message. An operation larger than the sink is refused with a
    /// protocol error (the connection is dropped), never written past the
    /// buffer.
    pub fn handle<C: Connection>(
        &mut self,
        conn: &mut C,
        landed: &mut u64,
        msg: &[u8],
        send: impl Fn(&mut C, &[u8]) -> Result<(), TransportError>,
    ) -> Result<bool, TransportError> {
        let bad = |_| TransportError::Protocol(wire::WireError::BadLength);
        let c = match decode(msg) {
            Some(PerfMsg::Chunk(c)) => c,
            Some(PerfMsg::TallyQuery) => {
                let n = encode_tally(&mut self.out, std::mem::take(landed)).map_err(bad)?;
                send(conn, &self.out[..n])?;
                return Ok(true);
            }
            // Acknowledgements and tallies go from servers to clients; one
            // arriving here is ignored.
            // Raw-SEND phases are the caller's (`crate::server_raw`).
            Some(PerfMsg::Ack(_) | PerfMsg::Tally(_) | PerfMsg::RawReady(_)) => return Ok(true),
            Some(PerfMsg::WriteReady(_)) => return Ok(true),
            // Raw phases and WRITE ping-pongs are the caller's (`crate::server_raw`).
            Some(PerfMsg::RawOpen { .. } | PerfMsg::WriteOpen(_)) => return Ok(true),
            None => return Ok(false),
        };
        let total = c.total as usize;
        if total > self.buf.len() {
            return Err(TransportError::Protocol(wire::WireError::BadLength));
        }
        let off = c.off as usize;
        self.buf[off..off + c.payload.len()].copy_from_slice(c.payload);
        if !c.is_last() {
            return Ok(true);
        }
        match c.reply {
            Reply::None => *landed += 1,
            Reply::Ack => {
                let n = encode_ack(&mut self.out, c.seq).map_err(bad)?;
                send(conn, &self.out[..n])?;
            }
            Reply::Full => {
                let mut off = 0usize;
                while off < total {
                    let len = (total - off).min(MAX_CHUNK);
                    let n = encode_chunk(
                        &mut self.out,
                        c.seq,
                        c.op,
                        Reply::Ack,
                        c.total,
                        off as u32,
                        &self.buf[off..off + len],
                    )
                    .map_err(bad)?;
                    send(conn, &self.out[..n])?;
                    off += len;
                }
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_and_acks_round_trip() {
        let mut buf = vec![0u8; MAX_MESSAGE_LEN];
        let payload: Vec<u8> = (0..MAX_CHUNK).map(|i| i as u8).collect();
        let n = encode_chunk(&mut buf, 7, Op::Send, Reply::Ack, 1 << 20, 4096, &payload).unwrap();
        assert_eq!(n, MAX_MESSAGE_LEN);
        match decode(&buf[..n]) {
            Some(PerfMsg::Chunk(c)) => {
                assert_eq!(
                    (c.seq, c.op, c.reply, c.total, c.off),
                    (7, Op::Send, Reply::Ack, 1 << 20, 4096)
                );
                assert_eq!(c.payload, &payload[..]);
                assert!(!c.is_last());
            }
            other => panic!("{other:?}"),
        }
        let n = encode_chunk(&mut buf, 1, Op::Write, Reply::Full, 2, 0, &[1, 2]).unwrap();
        assert!(
            matches!(decode(&buf[..n]), Some(PerfMsg::Chunk(c)) if c.is_last() && c.op == Op::Write)
        );
        let n = encode_ack(&mut buf, 99).unwrap();
        assert_eq!(decode(&buf[..n]), Some(PerfMsg::Ack(99)));
        let n = encode_chunk(&mut buf, 5, Op::Send, Reply::None, 3, 0, &[1, 2, 3]).unwrap();
        assert!(matches!(decode(&buf[..n]), Some(PerfMsg::Chunk(c)) if c.reply == Reply::None));
        let n = encode_tally_query(&mut buf).unwrap();
        assert_eq!(decode(&buf[..n]), Some(PerfMsg::TallyQuery));
        let n = encode_raw_open(&mut buf, 512, true).unwrap();
        assert_eq!(decode(&buf[..n]), Some(PerfMsg::RawOpen { rx_depth: 512, echo: true }));
        let n = encode_raw_ready(&mut buf, 7).unwrap();
        assert_eq!(decode(&buf[..n]), Some(PerfMsg::RawReady(7)));
        let n = encode_bare(&mut buf, RAW_OPEN_MAGIC, 1 << 40).unwrap();
        assert_eq!(decode(&buf[..n]), None, "a raw open with stray bits is refused");
        let n = encode_tally(&mut buf, 1 << 40).unwrap();
        assert_eq!(decode(&buf[..n]), Some(PerfMsg::Tally(1 << 40)));
        let r = RemoteRef { key: 0xdead_beef, len: 4096, offset: 0x7f00_1234_5678 };
        let n = encode_write_open(&mut buf, r).unwrap();
        assert_eq!(decode(&buf[..n]), Some(PerfMsg::WriteOpen(r)));
        let r = RemoteRef { key: u32::MAX, len: u32::MAX, offset: u64::MAX };
        let n = encode_write_ready(&mut buf, r).unwrap();
        assert_eq!(decode(&buf[..n]), Some(PerfMsg::WriteReady(r)));
        // A ping (no magic) is not a perf message.
        let mut ping = crate::proto::Ping::new(200).unwrap();
        assert_eq!(decode(ping.with_seq(3)), None);
    }

    /// A real shm connection pair: the server's sink counts the operations
    /// it does not answer, a tally query gets that count and resets it.
    #[test]
    fn unanswered_operations_are_counted_and_tallied() {
        use dataplane::transport::shm::ShmDomain;
        use dataplane::transport::{Domain, Listener};
        let wait = dataplane::time::Duration::from_millis(5_000);
        let domain = ShmDomain::new().unwrap();
        let mut listener = domain.listen("").unwrap();
        let addr = listener.local_addr();
        let connecting = std::thread::spawn(move || domain.connect(&addr, wait).unwrap());
        let mut server = listener.accept(wait).unwrap();
        let mut client = connecting.join().unwrap();
        let recv = |c: &mut dataplane::transport::shm::ShmConn, buf: &mut [u8]| {
            let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
            loop {
                if let Some(n) = c.try_recv(buf).unwrap() {
                    return n;
                }
                assert!(std::time::Instant::now() < until, "no message within 5 s");
                std::thread::yield_now();
            }
        };
        let send = |c: &mut dataplane::transport::shm::ShmConn, m: &[u8]| c.send(m);
        let mut sink = Sink::new(1 << 20);
        let mut landed = 0u64;
        let mut msg = vec![0u8; MAX_MESSAGE_LEN];
        let mut got = vec![0u8; MAX_MESSAGE_LEN];
        // Operation 0: two chunks; operations 1 and 2: one each.
        let total = MAX_CHUNK as u32 + 10;
        let payload = vec![7u8; MAX_CHUNK];
        let ops: [(u64, u32, u32, usize); 4] =
            [(0, total, 0, MAX_CHUNK), (0, total, MAX_CHUNK as u32, 10), (1, 5, 0, 5), (2, 5, 0, 5)];
        for (k, &(seq, total, off, len)) in ops.iter().enumerate() {
            let n = encode_chunk(&mut msg, seq, Op::Send, Reply::None, total, off, &payload[..len]).unwrap();
            client.send(&msg[..n]).unwrap();
            let n = recv(&mut server, &mut got);
            assert!(sink.handle(&mut server, &mut landed, &got[..n], send).unwrap());
            // An operation counts once, at its last chunk.
            assert_eq!(landed, [0, 1, 2, 3][k]);
        }
        let n = encode_tally_query(&mut msg).unwrap();
        client.send(&msg[..n]).unwrap();
        let n = recv(&mut server, &mut got);
        assert!(sink.handle(&mut server, &mut landed, &got[..n], send).unwrap());
        assert_eq!(landed, 0, "a tally resets the count");
        let n = recv(&mut client, &mut got);
        assert_eq!(decode(&got[..n]), Some(PerfMsg::Tally(3)));
        // Nothing else was sent back: the operations themselves got no answer.
        assert_eq!(client.try_recv(&mut got).unwrap(), None);
    }

    #[test]
    fn write_markers_are_never_zero_and_change_every_operation() {
        let mut prev = None;
        for seq in 0..2000u64 {
            let m = write_marker(seq);
            assert_ne!(m, 0, "seq {seq}");
            assert_ne!(Some(m), prev, "seq {seq} repeats the previous marker");
            prev = Some(m);
        }
        assert_eq!((write_marker(0), write_marker(254), write_marker(255)), (1, 255, 1));
        assert_ne!(write_marker(u64::MAX), write_marker(u64::MAX - 1));
        assert_ne!(write_marker(u64::MAX), 0);
    }

    /// Buffer messages from a hostile peer: payload bytes, truncation and
    /// random bytes are refused or decoded, never a panic; decoded fields are
    /// taken as they are (the NIC checks them).
    #[test]
    fn hostile_buffer_messages_decode_or_are_refused() {
        let mut buf = vec![0u8; MAX_MESSAGE_LEN];
        let r = RemoteRef { key: 7, len: 2, offset: 64 };
        let n = encode_write_open(&mut buf, r).unwrap();
        for cut in 0..n {
            assert_eq!(decode(&buf[..cut]), None, "a {cut}-byte prefix decoded");
        }
        // The same head with a payload is not a buffer message.
        let head = CompletionHead {
            task_id: 64,
            status: TaskStatus::Ok as u32,
            output_kind: OutputKind::Inline as u32,
            input_ns: WRITE_READY_MAGIC,
            compute_ns: 7 | (2 << 32),
            ..Default::default()
        };
        let m = wire::encode_completion(&mut buf, &head, &[1, 2, 3]).unwrap();
        assert_eq!(decode(&buf[..m]), None);
        let mut x = 0x1234_5678_9abc_def0u64;
        for _ in 0..2000 {
            let n = encode_write_open(&mut buf, r).unwrap();
            for _ in 0..4 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                buf[(x >> 33) as usize % n] = (x >> 20) as u8;
            }
            let _ = decode(&buf[..n]);
        }
    }

    #[test]
    fn chunks_past_their_operation_are_refused() {
        let mut buf = vec![0u8; MAX_MESSAGE_LEN];
        // Offset + payload beyond the stated total.
        let n = encode_chunk(&mut buf, 1, Op::Write, Reply::Ack, 10, 8, &[0; 4]).unwrap();
        assert_eq!(decode(&buf[..n]), None);
        // An offset near u32::MAX must not wrap.
        let n = encode_chunk(&mut buf, 1, Op::Write, Reply::Ack, 10, u32::MAX, &[0; 4]).unwrap();
        assert_eq!(decode(&buf[..n]), None);
        // Empty chunks and unknown verbs are refused.
        let n = encode_chunk(&mut buf, 1, Op::Write, Reply::Ack, 10, 0, &[]).unwrap();
        assert_eq!(decode(&buf[..n]), None);
        let n = encode_chunk(&mut buf, 1, Op::Write, Reply::Ack, 10, 0, &[0; 4]).unwrap();
        let mut other = vec![0u8; MAX_MESSAGE_LEN];
        encode_chunk(&mut other, 1, Op::Send, Reply::Ack, 10, 0, &[0; 4]).unwrap();
        // The one byte where the verbs differ is the verb's.
        let at = (0..n).find(|&i| buf[i] != other[i]).unwrap();
        buf[at] = 9;
        assert_eq!(decode(&buf[..n]), None);
        // Truncated and random bytes never panic.
        for cut in 0..n {
            let _ = decode(&buf[..cut]);
        }
    }
}
