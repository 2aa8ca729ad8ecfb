//! netbench's control protocol, made of the system's own wire messages:
//!
//! - client -> server, first: `Register{role: Client, count: objects wanted}`;
//! - server -> client: its catalog as a `BatchPlan` (batch id
//!   [`CATALOG_BATCH_ID`], `gpu_id` = server id, one `BatchTask` per object
//!   with `task_id` = object index and `input` = the object's `RemoteRef`),
//!   so the reader learns every key/offset over the connection itself,
//!   exactly as a backend learns where a batch's inputs are;
//! - pings: a `Heartbeat` (32 bytes on the wire) or, for other sizes, a
//!   `Completion` carrying inline bytes; the server echoes either verbatim.
//!   The sequence number sits in the first 8 body bytes of both.

use dataplane::transport::{Connection, RemoteRef};
use dataplane::wire::{
    self, BatchPlanHead, BatchTask, CompletionHead, Heartbeat, Message, OutputKind, Register, Role,
    TaskStatus, HEADER_LEN, MAX_BATCH_TASKS, MAX_MESSAGE_LEN,
};

use crate::fail::{Fail, Res};

/// Batch id that marks a batch plan as a netbench catalog.
pub const CATALOG_BATCH_ID: u64 = u64::from_le_bytes(*b"NBCATLOG");
/// Most objects one server can announce (one batch plan).
pub const MAX_OBJECTS: usize = MAX_BATCH_TASKS;
/// Smallest ping: a Heartbeat.
pub const MIN_PING: usize = HEADER_LEN + std::mem::size_of::<Heartbeat>();
/// Smallest ping that is a Completion (header + head, no inline bytes).
pub const MIN_COMPLETION_PING: usize = HEADER_LEN + std::mem::size_of::<CompletionHead>();
/// Largest ping (one wire message).
pub const MAX_PING: usize = MAX_MESSAGE_LEN;

/// The client's hello: "I want `objects` objects".
pub fn encode_hello(buf: &mut [u8], objects: u32) -> Res<usize> {
    Ok(wire::encode(
        buf,
        &Register::new(Role::Client, 0, objects, "netbench"),
    )?)
}

/// The objects a hello asks for, if `msg` is a hello.
pub fn decode_hello(msg: &[u8]) -> Option<u32> {
    match wire::decode(msg) {
        Ok(Message::Register(r)) if r.role() == Some(Role::Client) => Some(r.count),
        _ => None,
    }
}

/// The server's catalog.
pub fn encode_catalog(buf: &mut [u8], server_id: u32, refs: &[RemoteRef]) -> Res<usize> {
    let head = BatchPlanHead {
        batch_id: CATALOG_BATCH_ID,
        gpu_id: server_id,
        ..Default::default()
    };
    let mut w = wire::BatchPlanWriter::new(buf, &head)?;
    for (i, r) in refs.iter().enumerate() {
        w.push(&BatchTask {
            task_id: i as u64,
            frontend_id: server_id,
            queued_us: 0,
            input: *r,
            capability: Default::default(),
        })?;
    }
    Ok(w.finish())
}

/// A decoded catalog: the server's id and its objects in index order.
pub fn decode_catalog(msg: &[u8]) -> Res<(u32, Vec<RemoteRef>)> {
    match wire::decode(msg)? {
        Message::BatchPlan(head, tasks) if head.batch_id == CATALOG_BATCH_ID => {
            let mut refs = Vec::with_capacity(tasks.len());
            for (i, t) in tasks.iter().enumerate() {
                if t.task_id != i as u64 {
                    return Err(Fail::runtime("catalog entries out of order"));
                }
                refs.push(t.input);
            }
            Ok((head.gpu_id, refs))
        }
        Message::Dropped(_) => Err(Fail::runtime("the server refused the request")),
        other => Err(Fail::runtime(format!(
            "expected a netbench catalog, got {:?} (is this a netbench server?)",
            kind_name(&other)
        ))),
    }
}

fn kind_name(m: &Message<'_>) -> &'static str {
    match m {
        Message::Register(_) => "Register",
        Message::Heartbeat(_) => "Heartbeat",
        Message::Task(_) => "Task",
        Message::Cancel(_) => "Cancel",
        Message::BatchPlan(..) => "BatchPlan",
        Message::Completion(..) => "Completion",
        Message::Dropped(_) => "Dropped",
        Message::BatchDone(_) => "BatchDone",
        Message::ReadRequest(_) => "ReadRequest",
        Message::ReadResponse(_) => "ReadResponse",
        Message::Models(..) => "Models",
        Message::Challenge(_) => "Challenge",
        Message::Join(_) => "Join",
        Message::Welcome(_) => "Welcome",
        Message::Refused(_) => "Refused",
        Message::BenchStamp(_) => "BenchStamp",
        Message::Tasks(_) => "Tasks",
        Message::Drain(_) => "Drain",
    }
}

/// Whether a server should echo `msg` (a ping).
pub fn is_ping(msg: &[u8]) -> bool {
    matches!(
        wire::decode(msg),
        Ok(Message::Heartbeat(_) | Message::Completion(..))
    )
}

/// Checks a ping size: 32 (a Heartbeat) or 112..=32768 bytes (a Completion; wire version 8 and later).
pub fn check_ping_size(size: usize) -> Res<()> {
    if size == MIN_PING || (MIN_COMPLETION_PING..=MAX_PING).contains(&size) {
        Ok(())
    } else {
        Err(Fail::usage(format!(
            "--ping-size {size}: a control message is {MIN_PING} bytes (Heartbeat) \
             or {MIN_COMPLETION_PING}..={MAX_PING} bytes (Completion with inline bytes)"
        )))
    }
}

/// A reusable ping message of a fixed size.
pub struct Ping {
    buf: Vec<u8>,
}

impl Ping {
    /// A ping of exactly `size` bytes on the wire (see [`check_ping_size`]).
    pub fn new(size: usize) -> Res<Self> {
        check_ping_size(size)?;
        let mut buf = vec![0u8; size];
        let n = if size == MIN_PING {
            wire::encode(
                &mut buf,
                &Heartbeat {
                    seq: 0,
                    role: Role::Client as u32,
                    id: 0,
                },
            )?
        } else {
            let inline: Vec<u8> = (0..size - MIN_COMPLETION_PING).map(|i| i as u8).collect();
            let head = CompletionHead {
                status: TaskStatus::Ok as u32,
                output_kind: OutputKind::Inline as u32,
                ..Default::default()
            };
            wire::encode_completion(&mut buf, &head, &inline)?
        };
        debug_assert_eq!(n, size);
        Ok(Ping { buf })
    }
    /// The message with sequence number `seq`.
    pub fn with_seq(&mut self, seq: u64) -> &[u8] {
        self.buf[HEADER_LEN..HEADER_LEN + 8].copy_from_slice(&seq.to_le_bytes());
        &self.buf
    }
    /// Whether `reply` is the echo of this ping with `seq`.
    pub fn is_echo(&self, reply: &[u8], seq: u64) -> bool {
        reply.len() == self.buf.len()
            && reply[HEADER_LEN..HEADER_LEN + 8] == seq.to_le_bytes()
            && reply[..HEADER_LEN] == self.buf[..HEADER_LEN]
    }
}

/// Sends `msg`, retrying while the send queue is full, until `deadline`.
pub fn send_by<C: Connection>(conn: &mut C, msg: &[u8], deadline: std::time::Instant) -> Res<()> {
    loop {
        match conn.send(msg) {
            Ok(()) => return Ok(()),
            Err(dataplane::transport::Error::QueueFull) if std::time::Instant::now() < deadline => {
                conn.progress()?;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Receives one message into `buf`, polling until `deadline` (yields the
/// core between polls: for setup, not for measurement).
pub fn recv_by<C: Connection>(
    conn: &mut C,
    buf: &mut [u8],
    deadline: std::time::Instant,
) -> Res<usize> {
    loop {
        if let Some(n) = conn.try_recv(buf)? {
            return Ok(n);
        }
        if std::time::Instant::now() >= deadline {
            return Err(Fail::runtime("no answer in time"));
        }
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_round_trips() {
        let refs: Vec<RemoteRef> = (0..8)
            .map(|i| RemoteRef {
                key: 7,
                len: 150 << 10,
                offset: i * (150 << 10),
            })
            .collect();
        let mut buf = vec![0u8; MAX_MESSAGE_LEN];
        let n = encode_catalog(&mut buf, 3, &refs).unwrap();
        let (id, got) = decode_catalog(&buf[..n]).unwrap();
        assert_eq!((id, got), (3, refs));
        let n = encode_hello(&mut buf, 8).unwrap();
        assert_eq!(decode_hello(&buf[..n]), Some(8));
        assert!(decode_catalog(&buf[..n]).is_err());
        assert!(decode_catalog(&[0u8; 5]).is_err());
    }

    #[test]
    fn pings_of_every_allowed_size() {
        for size in [MIN_PING, MIN_COMPLETION_PING, MIN_COMPLETION_PING + 1, 1000, MAX_PING] {
            let mut p = Ping::new(size).unwrap();
            let m = p.with_seq(9).to_vec();
            assert_eq!(m.len(), size);
            assert!(is_ping(&m));
            assert!(p.is_echo(&m, 9));
            assert!(!p.is_echo(&m, 10));
        }
        for bad in [0, 31, 33, 47, MIN_COMPLETION_PING - 1, MAX_PING + 1] {
            assert!(Ping::new(bad).is_err(), "{bad}");
        }
    }
}
