//! Wire messages: fixed-layout (`#[repr(C)]`, [`bytemuck::Pod`]) records
//! behind a 16-byte [`Header`] (magic, version, kind, body length).
//!
//! The message set covers the whole system and carries no policy: who
//! registers, heartbeats, tasks (frontend -> scheduler), batch plans
//! (scheduler -> backend), completions, drops, batch-done reports, and the
//! READ request/response pair the tcp transport uses to emulate one-sided
//! READs. Times on the wire are always durations (remaining budgets, delays
//! relative to the send), never instants: no clock is shared between hosts.
//!
//! Encoding writes into a caller buffer and never allocates. Decoding borrows
//! from the input, checks everything (magic, version, kind, exact lengths,
//! counts, reserved fields, enum values) and returns a [`WireError`]; it
//! never panics, whatever the bytes.
//!
//! # What every version keeps (the preamble)
//!
//! A scheduler and a peer of different wire versions must still be able to
//! tell each other so. These never change, in any version:
//! - the 16-byte [`Header`] (magic, version, kind, length, reserved), so a
//!   framer can cut any version's messages ([`frame_len`] checks only the
//!   magic and the length bound of a message of another version);
//! - the bodies of [`Challenge`] (kind 11: the scheduler's first message on
//!   every link, with the range of peer versions it accepts) and
//!   [`Refused`] (kind 14: its last, naming both versions), which
//!   [`decode`] accepts whatever the header's version;
//! - the first 8 bytes of a peer's first message: its role and id (`u32`
//!   each; version 1's `Register` began the same way), read by
//!   [`peek_peer`] from a message of any version.
//!
//! Everything else (every other kind and layout) may change with
//! [`VERSION`]; see `docs/operations.md` for the upgrade policy.
//!
//! # Where each part lives
//!
//! - `header`: the [`Header`], [`VERSION`], framing ([`frame_len`]) and the
//!   fixed-size encoder ([`encode`]);
//! - `handshake`: who a peer is and its registration ([`Register`],
//!   [`Challenge`], [`Join`], [`Welcome`], [`Refused`], [`peek_peer`]);
//! - `control`: scheduler <-> peer messages after the handshake
//!   ([`Heartbeat`], a backend's [`Kind::Models`], [`BenchStamp`]);
//! - `task` and `batch`: a task's submission ([`Task`], batched as
//!   [`Kind::Tasks`]), [`Cancel`], and [`Dropped`] answers;
//! - `plan`: batch plans ([`BatchPlanHead`], [`BatchTask`]) and
//!   [`BatchDone`] reports;
//! - `completion`: a task's [`CompletionHead`] and its inline output;
//! - `read`: the tcp transport's emulated READ pair;
//! - `error`: [`WireError`]; `fuzz`: the codec's fuzz entry.
//!
//! Each message's decoder sits beside its layout; [`decode`] here checks
//! the header and hands the body to it by [`Kind`].

use bytemuck::{Pod, Zeroable};

mod batch;
mod completion;
mod control;
mod error;
mod fuzz;
mod handshake;
mod header;
mod plan;
mod read;
mod task;

pub use batch::{fuzz_decode_tasks, TaskBatcher, TaskList, TasksHead, MAX_TASKS_PER_MESSAGE};
pub use completion::*;
pub use control::*;
pub use error::*;
pub use fuzz::*;
pub use handshake::*;
pub use header::*;
pub use plan::*;
pub use read::*;
pub use task::*;

pub use crate::ids::{TaskId, MAX_BACKENDS, MAX_FRONTENDS};
pub use crate::mem::RemoteRef;

/// Message kinds.
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// [`Register`]
    Register = 1,
    /// [`Heartbeat`]
    Heartbeat = 2,
    /// [`Task`]
    Task = 3,
    /// [`BatchPlanHead`] + [`BatchTask`] entries
    BatchPlan = 4,
    /// [`CompletionHead`] + optional inline output
    Completion = 5,
    /// [`Dropped`]
    Dropped = 6,
    /// [`BatchDone`]
    BatchDone = 7,
    /// [`ReadRequest`] (tcp transport internal)
    ReadRequest = 8,
    /// [`ReadResponse`] (tcp transport internal; payload follows the message)
    ReadResponse = 9,
    /// [`ModelsHead`] + `u32` model ids + [`GpuBusy`] entries (backend ->
    /// scheduler, after [`Join`]: the models it holds, and until when each
    /// GPU is busy with batches it already holds)
    Models = 10,
    /// [`Challenge`] (scheduler -> peer, first message; layout frozen)
    Challenge = 11,
    /// [`Join`] (peer -> scheduler, the answer to the challenge)
    Join = 12,
    /// [`Welcome`] (scheduler -> peer: registered)
    Welcome = 13,
    /// [`Refused`] (scheduler -> peer, then it closes; layout frozen)
    Refused = 14,
    /// [`Cancel`] (frontend -> scheduler: a client gave a task up)
    Cancel = 15,
    /// [`Drain`] (backend -> scheduler: it drains; scheduler -> backend:
    /// it is released)
    Drain = 16,
    /// [`BenchStamp`] (benchmark only: a sender's monotonic clock reading
    /// for the message that follows it on the same link)
    BenchStamp = 20,
    /// [`TasksHead`] + [`Task`]s (frontend -> scheduler: batched submissions)
    Tasks = 21,
}

impl Kind {
    /// The kind with wire code `v`.
    pub fn from_u16(v: u16) -> Option<Kind> {
        Some(match v {
            1 => Kind::Register,
            2 => Kind::Heartbeat,
            3 => Kind::Task,
            4 => Kind::BatchPlan,
            5 => Kind::Completion,
            6 => Kind::Dropped,
            7 => Kind::BatchDone,
            8 => Kind::ReadRequest,
            9 => Kind::ReadResponse,
            10 => Kind::Models,
            11 => Kind::Challenge,
            12 => Kind::Join,
            13 => Kind::Welcome,
            14 => Kind::Refused,
            15 => Kind::Cancel,
            16 => Kind::Drain,
            20 => Kind::BenchStamp,
            21 => Kind::Tasks,
            _ => return None,
        })
    }
}

/// A fixed-size message body.
pub trait FixedMessage: Pod {
    /// Its kind.
    const KIND: Kind;
}
/// The typed id of a message that names one task.
macro_rules! task_id_accessor {
    ($($t:ty),*) => {$(
        impl $t {
            /// `task_id` as a [`TaskId`].
            pub const fn id(&self) -> TaskId {
                TaskId(self.task_id)
            }
        }
    )*};
}
task_id_accessor!(Task, BatchTask, CompletionHead, Dropped, Cancel);

/// A decoded message, borrowing variable parts from the input bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Message<'a> {
    /// Registration.
    Register(Register),
    /// Heartbeat.
    Heartbeat(Heartbeat),
    /// Task.
    Task(Task),
    /// A client gave a task up.
    Cancel(Cancel),
    /// Batch plan.
    BatchPlan(BatchPlanHead, BatchTasks<'a>),
    /// Completion with its inline output (empty unless inline).
    Completion(CompletionHead, &'a [u8]),
    /// Dropped task.
    Dropped(Dropped),
    /// Batch done.
    BatchDone(BatchDone),
    /// READ request.
    ReadRequest(ReadRequest),
    /// READ response (payload not included).
    ReadResponse(ReadResponse),
    /// Models a backend holds, and its busy GPUs.
    Models(ModelIds<'a>, GpuBusyList<'a>),
    /// The scheduler's challenge (any header version).
    Challenge(Challenge),
    /// A peer's registration.
    Join(Join),
    /// The scheduler accepted the registration.
    Welcome(Welcome),
    /// The scheduler refused the registration (any header version).
    Refused(Refused),
    /// Benchmark-only clock stamp.
    BenchStamp(BenchStamp),
    /// Batched task submissions.
    Tasks(TaskList<'a>),
    /// A backend's graceful leave (its notice, or the scheduler's release).
    Drain(Drain),
}

fn fixed_body_len(kind: Kind) -> Option<usize> {
    use std::mem::size_of;
    Some(match kind {
        Kind::Register => size_of::<Register>(),
        Kind::Heartbeat => size_of::<Heartbeat>(),
        Kind::Task => size_of::<Task>(),
        Kind::Cancel => size_of::<Cancel>(),
        Kind::Dropped => size_of::<Dropped>(),
        Kind::BatchDone => size_of::<BatchDone>(),
        Kind::ReadRequest => size_of::<ReadRequest>(),
        Kind::ReadResponse => size_of::<ReadResponse>(),
        Kind::Challenge => size_of::<Challenge>(),
        Kind::Join => size_of::<Join>(),
        Kind::Welcome => size_of::<Welcome>(),
        Kind::Refused => size_of::<Refused>(),
        Kind::BenchStamp => size_of::<BenchStamp>(),
        Kind::Drain => size_of::<Drain>(),
        Kind::BatchPlan | Kind::Completion | Kind::Models | Kind::Tasks => return None,
    })
}

/// Decodes exactly one message occupying all of `buf`.
pub fn decode(buf: &[u8]) -> Result<Message<'_>, WireError> {
    let total = frame_len(buf)?.ok_or(WireError::Truncated)?;
    if buf.len() < total {
        return Err(WireError::Truncated);
    }
    if buf.len() > total {
        return Err(WireError::TrailingBytes);
    }
    let h: Header = bytemuck::pod_read_unaligned(&buf[..HEADER_LEN]);
    let body = &buf[HEADER_LEN..];
    if h.version != VERSION {
        return decode_preamble(&h, body);
    }
    let kind = Kind::from_u16(h.kind).ok_or(WireError::UnknownKind(h.kind))?;
    decode_body(kind, body)
}

/// The body of a message of this version whose header says `kind`: each
/// kind's checks live beside its layout.
fn decode_body(kind: Kind, body: &[u8]) -> Result<Message<'_>, WireError> {
    Ok(match kind {
        Kind::Register => Message::Register(handshake::decode_register(body)?),
        Kind::Heartbeat => Message::Heartbeat(control::decode_heartbeat(body)?),
        Kind::Task => Message::Task(task::decode_task(body)?),
        Kind::Cancel => Message::Cancel(read_fixed(body)?),
        Kind::BatchPlan => {
            let (head, tasks) = plan::decode_batch_plan(body)?;
            Message::BatchPlan(head, tasks)
        }
        Kind::Completion => {
            let (head, inline) = completion::decode_completion(body)?;
            Message::Completion(head, inline)
        }
        Kind::Dropped => Message::Dropped(task::decode_dropped(body)?),
        Kind::BatchDone => Message::BatchDone(plan::decode_batch_done(body)?),
        Kind::ReadRequest => Message::ReadRequest(read_fixed(body)?),
        Kind::ReadResponse => Message::ReadResponse(read::decode_read_response(body)?),
        Kind::Models => {
            let (ids, busy) = control::decode_models(body)?;
            Message::Models(ids, busy)
        }
        Kind::Challenge => Message::Challenge(read_fixed(body)?),
        Kind::Join => Message::Join(handshake::decode_join(body)?),
        Kind::Welcome => Message::Welcome(read_fixed(body)?),
        Kind::Refused => Message::Refused(read_fixed(body)?),
        Kind::BenchStamp => Message::BenchStamp(read_fixed(body)?),
        Kind::Tasks => Message::Tasks(batch::decode_tasks(body)?),
        Kind::Drain => Message::Drain(control::decode_drain(body)?),
    })
}

/// A message whose header has another version: only the frozen preamble
/// kinds decode (leniently: a later version may use their flags, reasons
/// and reserved bits); anything else is `BadVersion`.
fn decode_preamble<'a>(h: &Header, body: &'a [u8]) -> Result<Message<'a>, WireError> {
    if h.magic != MAGIC {
        return Err(WireError::BadMagic);
    }
    match Kind::from_u16(h.kind) {
        Some(Kind::Challenge) => Ok(Message::Challenge(read_fixed(body)?)),
        Some(Kind::Refused) => Ok(Message::Refused(read_fixed(body)?)),
        _ => Err(WireError::BadVersion(h.version)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fixed_message_has_a_length_multiple_of_eight() {
        for k in 1..=16 {
            if let Some(n) = fixed_body_len(Kind::from_u16(k).unwrap()) {
                assert_eq!(n % 8, 0, "kind {k}");
            }
        }
        assert_eq!(Kind::from_u16(17), None);
    }
}
