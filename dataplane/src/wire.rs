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

use bytemuck::{Pod, Zeroable};

mod batch;
pub use batch::{fuzz_decode_tasks, TaskBatcher, TaskList, TasksHead, MAX_TASKS_PER_MESSAGE};

pub use crate::ids::{TaskId, MAX_BACKENDS, MAX_FRONTENDS};
pub use crate::mem::RemoteRef;

/// First four bytes of every message: "SYMP" little-endian.
pub const MAGIC: u32 = u32::from_le_bytes(*b"SYMP");
/// Protocol version this code speaks. Version 2: the authenticated
/// registration (Challenge, Join, Welcome, Refused). Version 3: a
/// [`BatchDone`] carries the batch's start and finish (relative to its
/// send) and its READ latency, for the scheduler's closed loop; a
/// [`CompletionHead`] says which execution its task was part of (batch
/// size, position, input/compute/output-side durations). Version 4: a
/// [`BatchTask`] and a [`CompletionHead`] carry the task's scheduler queueing
/// time (`queued_us`) in the word that was reserved (zero) before.
/// Version 5: fencing by epoch and state from re-registration: a
/// [`Welcome`] and a [`BatchPlanHead`] carry the scheduler's election
/// `epoch` (0: no election) in the word that was reserved; a plan carries
/// its planned duration (`run_ns`); a backend's [`Kind::Models`] message
/// ends with how long each of its GPUs stays busy ([`GpuBusy`]) with the
/// batches it already holds. Version 6: a [`Dropped`] may carry
/// [`DropReason::Moved`] (code 10; several scheduler groups, issue 19).
/// Version 7: a [`Task`]'s flags carry its submission attempt in bits
/// 16-31 ([`TASK_ATTEMPT_SHIFT`]), and a moved [`Dropped`] names the
/// attempt it hands back in the word that was reserved.
pub const VERSION: u16 = 7;
/// Oldest peer version a scheduler of this version accepts. Upgrades are
/// stop-the-world (`docs/operations.md`): only its own version.
pub const OLDEST_PEER_VERSION: u16 = VERSION;
/// Bytes of the MAC in a [`Join`] (HMAC-SHA256).
pub const MAC_LEN: usize = 32;
/// Bytes of the nonce in a [`Challenge`].
pub const NONCE_LEN: usize = 32;
/// Bytes of the operator text in a [`Refused`].
pub const REFUSAL_TEXT_LEN: usize = 128;
/// Largest message (header + body) accepted or produced. READ payloads that
/// follow a [`ReadResponse`] are not messages and are bounded separately.
pub const MAX_MESSAGE_LEN: usize = 32 * 1024;
/// Size of the [`Header`].
pub const HEADER_LEN: usize = std::mem::size_of::<Header>();
/// Most task entries in one batch plan.
pub const MAX_BATCH_TASKS: usize = 512;
/// Most output bytes carried inline in one completion.
pub const MAX_INLINE_OUTPUT: usize =
    MAX_MESSAGE_LEN - HEADER_LEN - std::mem::size_of::<CompletionHead>();
/// Bytes of the endpoint text in [`Register`].
pub const ENDPOINT_LEN: usize = 64;

/// Why bytes were refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireError {
    /// Fewer bytes than the header or the header's length says.
    Truncated,
    /// Bytes after the end of the message.
    TrailingBytes,
    /// Wrong magic number.
    BadMagic,
    /// Unsupported version.
    BadVersion(u16),
    /// Unknown message kind.
    UnknownKind(u16),
    /// Body length wrong for the kind, or over [`MAX_MESSAGE_LEN`].
    BadLength,
    /// Entry count over its bound or inconsistent with the length.
    BadCount,
    /// A field holds a value outside its enumeration.
    BadValue(&'static str),
    /// A reserved field is not zero.
    ReservedNotZero,
    /// The caller's buffer is too small for the encoded message.
    BufferTooSmall,
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}
impl std::error::Error for WireError {}

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
            20 => Kind::BenchStamp,
            21 => Kind::Tasks,
            _ => return None,
        })
    }
}

/// Prefix of every message.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Header {
    /// [`MAGIC`].
    pub magic: u32,
    /// [`VERSION`].
    pub version: u16,
    /// [`Kind`] code.
    pub kind: u16,
    /// Body bytes after the header.
    pub len: u32,
    /// Zero.
    pub reserved: u32,
}

/// Role of a process in the cluster.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Client-facing frontend (owns staged inputs).
    Frontend = 1,
    /// GPU backend.
    Backend = 2,
    /// The scheduler.
    Scheduler = 3,
    /// A load generator or tool.
    Client = 4,
}

impl Role {
    /// The role with wire code `v`.
    pub fn from_u32(v: u32) -> Option<Role> {
        Some(match v {
            1 => Role::Frontend,
            2 => Role::Backend,
            3 => Role::Scheduler,
            4 => Role::Client,
            _ => return None,
        })
    }
}

/// "I am `role` number `id`": a backend's first message on its data link
/// to a frontend, and the scheduler's announcement of a frontend to the
/// backends (`Register{Frontend, id, 0, data endpoint}`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct Register {
    /// [`Role`] code.
    pub role: u32,
    /// Id within the role.
    pub id: u32,
    /// Role-specific count (e.g. GPUs of a backend); 0 if unused.
    pub count: u32,
    /// Zero.
    pub reserved: u32,
    /// Where this process can be reached for data (e.g. "10.0.0.5:7001"),
    /// UTF-8, zero padded.
    pub endpoint: [u8; ENDPOINT_LEN],
}

impl Register {
    /// A registration; `endpoint` is cut to [`ENDPOINT_LEN`] bytes.
    pub fn new(role: Role, id: u32, count: u32, endpoint: &str) -> Self {
        Register {
            role: role as u32,
            id,
            count,
            reserved: 0,
            endpoint: fill_text(endpoint),
        }
    }
    /// The role (validated by the decoder).
    pub fn role(&self) -> Option<Role> {
        Role::from_u32(self.role)
    }
    /// The endpoint text (validated by the decoder).
    pub fn endpoint(&self) -> &str {
        padded_text(&self.endpoint).unwrap_or("")
    }
}

/// Copies `text` into a zero-padded field, cut at a character boundary.
fn fill_text<const N: usize>(text: &str) -> [u8; N] {
    let mut e = [0u8; N];
    let mut n = text.len().min(N);
    while !text.is_char_boundary(n) {
        n -= 1;
    }
    e[..n].copy_from_slice(&text.as_bytes()[..n]);
    e
}

/// The text of a zero-padded field, if it is UTF-8 followed only by zeros.
fn padded_text(field: &[u8]) -> Option<&str> {
    let n = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    if field[n..].iter().any(|&b| b != 0) {
        return None;
    }
    std::str::from_utf8(&field[..n]).ok()
}

/// [`Challenge::flags`]: the scheduler requires a join token.
pub const CHALLENGE_TOKEN_REQUIRED: u32 = 1;
/// [`Join::flags`]: `mac` holds a MAC (the peer has a token).
pub const JOIN_HAS_MAC: u32 = 1;

/// The scheduler's first message on every accepted link: a fresh nonce and
/// the peer versions it accepts. Layout frozen for every version (see the
/// module docs).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct Challenge {
    /// Random bytes the peer's MAC must cover.
    pub nonce: [u8; NONCE_LEN],
    /// Oldest peer version accepted.
    pub oldest_version: u16,
    /// The scheduler's own (newest accepted) version.
    pub scheduler_version: u16,
    /// [`CHALLENGE_TOKEN_REQUIRED`] or 0 (other bits: ignored).
    pub flags: u32,
    /// Zero (ignored).
    pub reserved: u64,
}

impl Challenge {
    /// A challenge of this version.
    pub fn new(nonce: [u8; NONCE_LEN], token_required: bool) -> Self {
        Challenge {
            nonce,
            oldest_version: OLDEST_PEER_VERSION,
            scheduler_version: VERSION,
            flags: if token_required { CHALLENGE_TOKEN_REQUIRED } else { 0 },
            reserved: 0,
        }
    }
    /// Whether the scheduler requires a join token.
    pub fn token_required(&self) -> bool {
        self.flags & CHALLENGE_TOKEN_REQUIRED != 0
    }
}

/// A peer's registration with the scheduler, answering its [`Challenge`]:
/// "I am `role` number `id`", with the MAC that proves the join token
/// (`join::JoinToken::sign`). A backend sends its [`Kind::Models`] next.
/// `role` and `id` stay the first 8 bytes in every version.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct Join {
    /// [`Role`] code (Frontend or Backend).
    pub role: u32,
    /// Id within the role.
    pub id: u32,
    /// Role-specific count (a backend's GPUs); 0 if unused.
    pub count: u32,
    /// [`JOIN_HAS_MAC`] or 0.
    pub flags: u32,
    /// A frontend's data endpoint (UTF-8, zero padded); empty otherwise.
    pub endpoint: [u8; ENDPOINT_LEN],
    /// HMAC-SHA256 over the challenge and the fields above; zero without
    /// a token.
    pub mac: [u8; MAC_LEN],
}

impl Join {
    /// A join without a MAC (set `mac` and `flags` with
    /// [`with_mac`](Self::with_mac)); `endpoint` is cut to
    /// [`ENDPOINT_LEN`] bytes.
    pub fn new(role: Role, id: u32, count: u32, endpoint: &str) -> Self {
        Join {
            role: role as u32,
            id,
            count,
            flags: 0,
            endpoint: fill_text(endpoint),
            mac: [0; MAC_LEN],
        }
    }
    /// This join carrying `mac`.
    pub fn with_mac(mut self, mac: [u8; MAC_LEN]) -> Self {
        self.flags |= JOIN_HAS_MAC;
        self.mac = mac;
        self
    }
    /// Whether it carries a MAC.
    pub fn has_mac(&self) -> bool {
        self.flags & JOIN_HAS_MAC != 0
    }
    /// The role (validated by the decoder).
    pub fn role(&self) -> Option<Role> {
        Role::from_u32(self.role)
    }
    /// The endpoint text (validated by the decoder).
    pub fn endpoint(&self) -> &str {
        padded_text(&self.endpoint).unwrap_or("")
    }
}

/// The scheduler accepted a [`Join`]: what every peer must agree on.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Welcome {
    /// Models in the scheduler's list (the peer's must be as many).
    pub models: u32,
    /// The scheduler's election epoch (0: no election, the embedded
    /// default). A backend that has seen a newer epoch leaves a scheduler
    /// that welcomes it with an older one, and never executes a plan of an
    /// older epoch than the newest it has seen.
    pub epoch: u32,
    /// The one-way control delay bound `d_ctrl` the scheduler charges,
    /// ns: backends subtract it from a plan's `exec_in`.
    pub control_delay_ns: u64,
}

/// Why the scheduler refused a registration. Wire codes are stable; a new
/// reason takes the next code (a peer shows an unknown one by its code).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RefuseReason {
    /// The peer speaks a wire version the scheduler does not accept.
    Version = 1,
    /// The scheduler requires a join token and the peer sent no MAC.
    NoToken = 2,
    /// The MAC does not verify (wrong token).
    BadToken = 3,
    /// The registration did not decode or broke the handshake's order.
    Malformed = 4,
    /// The plane refused it: duplicate or out-of-range id, unknown model,
    /// no sub-cluster, no GPUs.
    Rejected = 5,
    /// The configured peer limit is reached.
    Full = 6,
    /// It did not register within the handshake timeout.
    Timeout = 7,
}

impl RefuseReason {
    /// Number of reasons.
    pub const COUNT: usize = 7;
    /// Every reason, in wire-code order.
    pub const ALL: [RefuseReason; RefuseReason::COUNT] = [
        RefuseReason::Version,
        RefuseReason::NoToken,
        RefuseReason::BadToken,
        RefuseReason::Malformed,
        RefuseReason::Rejected,
        RefuseReason::Full,
        RefuseReason::Timeout,
    ];
    /// The reason with wire code `v`.
    pub fn from_u32(v: u32) -> Option<RefuseReason> {
        let i = usize::try_from(v).ok()?.checked_sub(1)?;
        RefuseReason::ALL.get(i).copied()
    }
    /// Its position in [`ALL`](Self::ALL) (a counter array's index).
    pub const fn index(self) -> usize {
        self as usize - 1
    }
    /// Stable snake_case name: metric label.
    pub const fn as_str(self) -> &'static str {
        match self {
            RefuseReason::Version => "version",
            RefuseReason::NoToken => "no_token",
            RefuseReason::BadToken => "bad_token",
            RefuseReason::Malformed => "malformed",
            RefuseReason::Rejected => "rejected",
            RefuseReason::Full => "full",
            RefuseReason::Timeout => "timeout",
        }
    }
}

impl std::fmt::Display for RefuseReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The scheduler refused a registration and closes the link. Layout
/// frozen for every version (see the module docs), so that a peer of any
/// version can show why.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct Refused {
    /// [`RefuseReason`] code (an unknown code is shown as a number).
    pub reason: u32,
    /// The scheduler's wire version.
    pub scheduler_version: u16,
    /// The peer's wire version, as the scheduler read it.
    pub peer_version: u16,
    /// Why, for the operator (UTF-8, zero padded).
    pub text: [u8; REFUSAL_TEXT_LEN],
}

impl Refused {
    /// A refusal of a peer of `peer_version`; `text` is cut to
    /// [`REFUSAL_TEXT_LEN`] bytes.
    pub fn new(reason: RefuseReason, peer_version: u16, text: &str) -> Self {
        Refused {
            reason: reason as u32,
            scheduler_version: VERSION,
            peer_version,
            text: fill_text(text),
        }
    }
    /// The reason, if this version knows its code.
    pub fn reason(&self) -> Option<RefuseReason> {
        RefuseReason::from_u32(self.reason)
    }
    /// The operator text (invalid UTF-8 shows as replacement characters).
    pub fn text(&self) -> std::borrow::Cow<'_, str> {
        let n = self.text.iter().position(|&b| b == 0).unwrap_or(REFUSAL_TEXT_LEN);
        String::from_utf8_lossy(&self.text[..n])
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.reason() {
            Some(r) => write!(f, "{r}")?,
            None => write!(f, "reason code {}", self.reason)?,
        }
        write!(
            f,
            " (scheduler wire version {}, ours {}): {}",
            self.scheduler_version,
            self.peer_version,
            self.text()
        )
    }
}

/// The version-independent part of a peer's first message
/// ([`peek_peer`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerPeek {
    /// The header's version.
    pub version: u16,
    /// The header's kind code.
    pub kind: u16,
    /// The first body word: the role code.
    pub role: u32,
    /// The second body word: the id.
    pub id: u32,
}

impl std::fmt::Display for PeerPeek {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match Role::from_u32(self.role) {
            Some(Role::Frontend) => write!(f, "frontend {}", self.id),
            Some(Role::Backend) => write!(f, "backend {}", self.id),
            _ => write!(f, "a peer of role code {}", self.role),
        }
    }
}

/// Reads the header's version and the sender's role and id from the first
/// message of a peer of any version (magic checked; nothing else), e.g. to
/// name a peer whose version is refused. `None` if too short or not ours.
pub fn peek_peer(buf: &[u8]) -> Option<PeerPeek> {
    let h: Header = bytemuck::pod_read_unaligned(buf.get(..HEADER_LEN)?);
    let word = |at: usize| -> Option<u32> {
        let b = buf.get(HEADER_LEN + at..HEADER_LEN + at + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    if h.magic != MAGIC || (h.len as usize) < 8 {
        return None;
    }
    Some(PeerPeek {
        version: h.version,
        kind: h.kind,
        role: word(0)?,
        id: word(4)?,
    })
}

/// Benchmark-only clock stamp for the message that follows it on the same
/// link: `symphony bench-cluster` measures ingress and dispatch lags
/// across processes of ONE host, whose `CLOCK_MONOTONIC` is shared.
/// Production peers never send it and never assume shared clocks; a
/// scheduler started without `--bench-stamps` ignores it and sends none.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct BenchStamp {
    /// Frontend -> scheduler: when the next task was sent; scheduler ->
    /// backend: the next plan's planned dispatch moment. `CLOCK_MONOTONIC`
    /// of the sender's host, ns.
    pub at_ns: u64,
    /// Scheduler -> backend: the next plan's planned start on the device
    /// (`CLOCK_MONOTONIC`, ns); 0 otherwise.
    pub due_ns: u64,
    /// Scheduler -> backend: the earliest deadline of the next plan's
    /// tasks (`CLOCK_MONOTONIC`, ns); 0 otherwise.
    pub deadline_ns: u64,
}

/// Liveness beacon.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Heartbeat {
    /// Sender's sequence number.
    pub seq: u64,
    /// Sender's [`Role`] code.
    pub role: u32,
    /// Sender's id.
    pub id: u32,
}

/// A request ready to be scheduled (frontend -> scheduler).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Task {
    /// Cluster-unique task id, a [`TaskId`] (see [`Task::id`]).
    pub task_id: u64,
    /// Time left until the deadline when the message was sent, ns.
    pub budget_ns: u64,
    /// Model to run.
    pub model_id: u32,
    /// Frontend that owns the input and wants the output.
    pub frontend_id: u32,
    /// Where the staged input lives.
    pub input: RemoteRef,
    /// Priority level, 1 = highest (Triton's numbering); 0 = the model's
    /// default level. A level past the model's lowest counts as its lowest.
    pub priority: u32,
    /// [`TASK_BUDGET_IS_TIMEOUT`] or zero.
    pub flags: u32,
}

/// [`Task::flags`]: the budget is the request's own timeout (shorter than
/// its model's SLO budget), so running out of it is reported as
/// [`DropReason::Timeout`] rather than a deadline drop. The frontend folds
/// the timeout into the budget: one deadline crosses the wire.
pub const TASK_BUDGET_IS_TIMEOUT: u32 = 1;

/// [`Task::flags`] bits 16-31: the submission attempt (0 the first time; a
/// frontend counts one more each time it sends a task again after a
/// `moved` answer or a lost link). A scheduler that handed attempt `a` of a
/// task back as moved ignores a later copy of attempt `a` (a duplicated
/// message), not attempt `a + 1`; it names the attempt in
/// [`Dropped::reserved`] so the frontend ignores a stale answer.
pub const TASK_ATTEMPT_SHIFT: u32 = 16;
const TASK_ATTEMPT_MASK: u32 = 0xffff << TASK_ATTEMPT_SHIFT;

impl Task {
    /// The submission attempt (see [`TASK_ATTEMPT_SHIFT`]).
    pub const fn attempt(&self) -> u16 {
        (self.flags >> TASK_ATTEMPT_SHIFT) as u16
    }

    /// The same task as submission attempt `attempt`.
    pub const fn with_attempt(mut self, attempt: u16) -> Task {
        self.flags = (self.flags & 0xffff) | (attempt as u32) << TASK_ATTEMPT_SHIFT;
        self
    }
}

/// A client gave a task up (frontend -> scheduler): remove it from its
/// model's queue and answer it as [`DropReason::Cancelled`]; a task already
/// planned onto a GPU is left alone (its result is discarded).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Cancel {
    /// Task id.
    pub task_id: u64,
}

/// Batch plan head (scheduler -> backend); `count` [`BatchTask`]s follow.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct BatchPlanHead {
    /// Scheduler-unique batch id.
    pub batch_id: u64,
    /// Execute this long after the message was sent, ns (the receiver
    /// subtracts its one-way delay bound).
    pub exec_in_ns: u64,
    /// How long the scheduler planned the batch to hold its GPU, ns (the
    /// backend's busy report to a new leader is built from it).
    pub run_ns: u64,
    /// Model to run.
    pub model_id: u32,
    /// GPU index at the backend.
    pub gpu_id: u32,
    /// Entries that follow (at most [`MAX_BATCH_TASKS`]).
    pub count: u32,
    /// The planning scheduler's election epoch (see [`Welcome::epoch`]).
    pub epoch: u32,
}

/// One task of a batch plan.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct BatchTask {
    /// Task id.
    pub task_id: u64,
    /// Frontend that owns the input.
    pub frontend_id: u32,
    /// From the task's ingress at the scheduler to the plan's sending, µs
    /// (saturating; 0: not known). The backend echoes it in the task's
    /// [`CompletionHead`], so the frontend can attribute that stage.
    pub queued_us: u32,
    /// Where to READ the input.
    pub input: RemoteRef,
}

/// Outcome of a task at the backend.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaskStatus {
    /// Ran; output attached.
    Ok = 0,
    /// The input could not be fetched.
    InputUnavailable = 1,
    /// Execution failed.
    ExecFailed = 2,
}

impl TaskStatus {
    /// The status with wire code `v`.
    pub fn from_u32(v: u32) -> Option<TaskStatus> {
        Some(match v {
            0 => TaskStatus::Ok,
            1 => TaskStatus::InputUnavailable,
            2 => TaskStatus::ExecFailed,
            _ => return None,
        })
    }
}

/// Where a completion's output is.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OutputKind {
    /// No output.
    None = 0,
    /// `output_len` bytes follow the head.
    Inline = 1,
    /// At `remote` (READ it).
    Remote = 2,
}

impl OutputKind {
    /// The kind with wire code `v`.
    pub fn from_u32(v: u32) -> Option<OutputKind> {
        Some(match v {
            0 => OutputKind::None,
            1 => OutputKind::Inline,
            2 => OutputKind::Remote,
            _ => return None,
        })
    }
}

/// Completion head (backend -> frontend/scheduler); inline output may follow.
///
/// The `batch_*` and duration fields describe the execution the task was
/// part of, so the frontend can account for it (Triton's execution count,
/// queue and compute durations, batch sizes). All zero when the task was
/// not executed (a failed input, a failed execution, an answer from the
/// scheduler). Durations are measured on the backend's clock; only
/// differences travel.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct CompletionHead {
    /// Task id.
    pub task_id: u64,
    /// [`TaskStatus`] code.
    pub status: u32,
    /// [`OutputKind`] code.
    pub output_kind: u32,
    /// Output bytes (inline count, or `remote.len`).
    pub output_len: u32,
    /// Tasks the execution ran (at most [`MAX_BATCH_TASKS`]); 0: not executed.
    pub batch_size: u32,
    /// Output location when `output_kind` is Remote, else zero.
    pub remote: RemoteRef,
    /// This task's position in the execution (below `batch_size`). Exactly
    /// one task per execution has position 0, the execution's leader: an
    /// execution is counted once, from its leader's completion.
    pub batch_index: u32,
    /// [`BatchTask::queued_us`] of the task, echoed (0: not known).
    pub queued_us: u32,
    /// From the plan's arrival at the backend to the batch's hand-over to
    /// its device (fetching the inputs), ns.
    pub input_ns: u64,
    /// The execution on the device, start to finish, ns.
    pub compute_ns: u64,
    /// From the execution's start to the sending of this completion, ns
    /// (at least `compute_ns`; the rest is output handling). The frontend
    /// derives the time before the start from its own clock.
    pub since_start_ns: u64,
}

/// Why a task was dropped: the one list of drop reasons, for the wire, the
/// scheduling cores (`scheduler::types` re-exports it), metrics and reports.
/// Wire codes are stable; a new reason takes the next code.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// It can no longer meet its deadline (not even a batch of one would
    /// finish in time).
    DeadlineUnmeetable = 1,
    /// Admission refused: queue full / overload.
    Overloaded = 2,
    /// No backend serves the model.
    UnknownModel = 3,
    /// The system is shutting down.
    Shutdown = 4,
    /// Its input could not be fetched.
    InputUnavailable = 5,
    /// Dropped by a sliding-window policy to keep batches efficient (it
    /// could still have run alone).
    EarlyDrop = 6,
    /// Its frontend failed while it was in flight: nobody is left to answer.
    FrontendLost = 7,
    /// Its own timeout (shorter than the model's SLO) ran out first.
    Timeout = 8,
    /// Its client cancelled it before it was planned onto a GPU.
    Cancelled = 9,
    /// Its model moved to another scheduler group (issue 19) before it was
    /// planned: the frontend resubmits it to the new owner with the budget
    /// it has left.
    Moved = 10,
}

impl DropReason {
    /// Number of reasons: the length of a counter-by-reason array.
    pub const COUNT: usize = 10;
    /// Every reason, in [`index`](Self::index) order (wire-code order).
    pub const ALL: [DropReason; DropReason::COUNT] = [
        DropReason::DeadlineUnmeetable,
        DropReason::Overloaded,
        DropReason::UnknownModel,
        DropReason::Shutdown,
        DropReason::InputUnavailable,
        DropReason::EarlyDrop,
        DropReason::FrontendLost,
        DropReason::Timeout,
        DropReason::Cancelled,
        DropReason::Moved,
    ];

    /// The reason with wire code `v`.
    pub fn from_u32(v: u32) -> Option<DropReason> {
        let i = usize::try_from(v).ok()?.checked_sub(1)?;
        DropReason::ALL.get(i).copied()
    }

    /// Its wire code.
    pub const fn code(self) -> u32 {
        self as u32
    }

    /// Its position in [`ALL`](Self::ALL): the index of its entry in a
    /// `[_; DropReason::COUNT]` counter array.
    pub const fn index(self) -> usize {
        self as usize - 1
    }

    /// Stable snake_case name: metric label and report key.
    pub const fn as_str(self) -> &'static str {
        match self {
            DropReason::DeadlineUnmeetable => "deadline_unmeetable",
            DropReason::Overloaded => "overloaded",
            DropReason::UnknownModel => "unknown_model",
            DropReason::Shutdown => "shutdown",
            DropReason::InputUnavailable => "input_unavailable",
            DropReason::EarlyDrop => "early_drop",
            DropReason::FrontendLost => "frontend_lost",
            DropReason::Timeout => "timeout",
            DropReason::Cancelled => "cancelled",
            DropReason::Moved => "moved",
        }
    }
}

impl std::fmt::Display for DropReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A task was dropped (scheduler -> frontend).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Dropped {
    /// Task id.
    pub task_id: u64,
    /// [`DropReason`] code.
    pub reason: u32,
    /// For [`DropReason::Moved`]: the submission attempt handed back
    /// ([`Task::attempt`]); otherwise zero.
    pub reserved: u32,
}

/// A batch finished on a GPU (backend -> scheduler): what the scheduler's
/// closed loop learns from. Times are durations before the moment the
/// report was sent (no clock is shared): the scheduler places them on its
/// own clock at receipt.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct BatchDone {
    /// Batch id.
    pub batch_id: u64,
    /// How long before the send the device started the batch, ns (0 with
    /// `finish_ago_ns` 0: nothing ran).
    pub start_ago_ns: u64,
    /// How long before the send the device finished it, ns (at most
    /// `start_ago_ns`).
    pub finish_ago_ns: u64,
    /// The slowest input READ of the batch, post to completion, ns (0
    /// when no READ completed).
    pub read_max_ns: u64,
    /// GPU index at the backend.
    pub gpu_id: u32,
    /// Tasks in the batch that ran (inputs arrived).
    pub count: u32,
    /// READs that completed successfully (`read_max_ns` is their maximum).
    pub reads: u32,
    /// Zero.
    pub reserved: u32,
}

impl BatchDone {
    /// How long the batch held its device (finish minus start).
    pub const fn actual_ns(&self) -> u64 {
        self.start_ago_ns.saturating_sub(self.finish_ago_ns)
    }
}

/// Head of a model list (backend -> scheduler): `count` little-endian
/// `u32` model ids follow, each at most once, then `busy` [`GpuBusy`]
/// entries, each GPU at most once.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct ModelsHead {
    /// Ids that follow (at most [`MAX_MODEL_IDS`]).
    pub count: u32,
    /// [`GpuBusy`] entries after the ids.
    pub busy: u32,
}

/// Most model ids one [`Kind::Models`] message carries.
pub const MAX_MODEL_IDS: usize = (MAX_MESSAGE_LEN - HEADER_LEN - 8) / 4;

/// A GPU of a registering backend that is still busy with batches it holds
/// (planned by an earlier scheduler): state from re-registration. A new
/// leader plans nothing on the GPU before `busy_ns` after the report
/// arrived (a duration: no clock is shared; arriving late only makes the
/// bound later, i.e. safe).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct GpuBusy {
    /// From the report's sending until the GPU is expected free, ns.
    pub busy_ns: u64,
    /// GPU index at the backend.
    pub gpu_id: u32,
    /// Batches held for the GPU (running or waiting).
    pub batches: u32,
}

const GPU_BUSY_LEN: usize = std::mem::size_of::<GpuBusy>();

/// Emulated one-sided READ: "send me `remote`" (tcp transport internal).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct ReadRequest {
    /// Requester's work-request id, echoed back.
    pub wr_id: u64,
    /// What to read.
    pub remote: RemoteRef,
}

/// Result of a READ at the memory owner.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReadStatus {
    /// `len` payload bytes follow.
    Ok = 0,
    /// Unknown key.
    BadKey = 1,
    /// Out of the registration's bounds.
    OutOfBounds = 2,
    /// Registration closing or gone.
    Deregistered = 3,
    /// Registration does not allow remote reads.
    AccessDenied = 4,
    /// Longer than the responder serves.
    TooLarge = 5,
}

impl ReadStatus {
    /// The status with wire code `v`.
    pub fn from_u32(v: u32) -> Option<ReadStatus> {
        Some(match v {
            0 => ReadStatus::Ok,
            1 => ReadStatus::BadKey,
            2 => ReadStatus::OutOfBounds,
            3 => ReadStatus::Deregistered,
            4 => ReadStatus::AccessDenied,
            5 => ReadStatus::TooLarge,
            _ => return None,
        })
    }
}

/// Answer to a [`ReadRequest`]; when `status` is Ok, exactly `len` raw
/// payload bytes follow the message on the stream (they are not part of it).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct ReadResponse {
    /// The request's wr_id.
    pub wr_id: u64,
    /// [`ReadStatus`] code.
    pub status: u32,
    /// Payload bytes that follow (0 unless Ok).
    pub len: u32,
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

impl FixedMessage for Register {
    const KIND: Kind = Kind::Register;
}
impl FixedMessage for Heartbeat {
    const KIND: Kind = Kind::Heartbeat;
}
impl FixedMessage for Challenge {
    const KIND: Kind = Kind::Challenge;
}
impl FixedMessage for Join {
    const KIND: Kind = Kind::Join;
}
impl FixedMessage for Welcome {
    const KIND: Kind = Kind::Welcome;
}
impl FixedMessage for Refused {
    const KIND: Kind = Kind::Refused;
}
impl FixedMessage for Task {
    const KIND: Kind = Kind::Task;
}
impl FixedMessage for Cancel {
    const KIND: Kind = Kind::Cancel;
}
impl FixedMessage for BenchStamp {
    const KIND: Kind = Kind::BenchStamp;
}
impl FixedMessage for Dropped {
    const KIND: Kind = Kind::Dropped;
}
impl FixedMessage for BatchDone {
    const KIND: Kind = Kind::BatchDone;
}
impl FixedMessage for ReadRequest {
    const KIND: Kind = Kind::ReadRequest;
}
impl FixedMessage for ReadResponse {
    const KIND: Kind = Kind::ReadResponse;
}

/// A batch plan's task entries, borrowed from the received bytes (which may
/// be unaligned: entries are copied out one at a time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchTasks<'a> {
    bytes: &'a [u8],
}

const TASK_LEN: usize = std::mem::size_of::<BatchTask>();

impl<'a> BatchTasks<'a> {
    /// Number of entries.
    pub fn len(&self) -> usize {
        self.bytes.len() / TASK_LEN
    }
    /// No entries.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
    /// Entry `i`.
    pub fn get(&self, i: usize) -> Option<BatchTask> {
        let start = i.checked_mul(TASK_LEN)?;
        self.bytes
            .get(start..start + TASK_LEN)
            .map(bytemuck::pod_read_unaligned)
    }
    /// All entries in order.
    pub fn iter(&self) -> impl Iterator<Item = BatchTask> + 'a {
        self.bytes
            .chunks_exact(TASK_LEN)
            .map(bytemuck::pod_read_unaligned)
    }
}

/// A model list's ids, borrowed from the received bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelIds<'a> {
    bytes: &'a [u8],
}

/// A backend's busy GPUs ([`GpuBusy`]), borrowed from the received bytes
/// (which may be unaligned: entries are copied out one at a time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuBusyList<'a> {
    bytes: &'a [u8],
}

impl<'a> GpuBusyList<'a> {
    /// Number of entries.
    pub fn len(&self) -> usize {
        self.bytes.len() / GPU_BUSY_LEN
    }
    /// No entries.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
    /// All entries in order.
    pub fn iter(&self) -> impl Iterator<Item = GpuBusy> + 'a {
        self.bytes.chunks_exact(GPU_BUSY_LEN).map(bytemuck::pod_read_unaligned)
    }
}

impl<'a> ModelIds<'a> {
    /// Number of ids.
    pub fn len(&self) -> usize {
        self.bytes.len() / 4
    }
    /// No ids.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
    /// All ids in order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + 'a {
        self.bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
    }
}

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
}

fn put_header(buf: &mut [u8], kind: Kind, body_len: usize) -> Result<(), WireError> {
    let total = HEADER_LEN + body_len;
    if total > MAX_MESSAGE_LEN {
        return Err(WireError::BadLength);
    }
    if buf.len() < total {
        return Err(WireError::BufferTooSmall);
    }
    let h = Header {
        magic: MAGIC,
        version: VERSION,
        kind: kind as u16,
        len: body_len as u32,
        reserved: 0,
    };
    buf[..HEADER_LEN].copy_from_slice(bytemuck::bytes_of(&h));
    Ok(())
}

/// Encodes a fixed-size message into `buf`; returns the bytes written.
/// Does not validate field values (the decoder does); see [`decode`].
pub fn encode<M: FixedMessage>(buf: &mut [u8], msg: &M) -> Result<usize, WireError> {
    let body = bytemuck::bytes_of(msg);
    put_header(buf, M::KIND, body.len())?;
    buf[HEADER_LEN..HEADER_LEN + body.len()].copy_from_slice(body);
    Ok(HEADER_LEN + body.len())
}

/// Encodes a model list with no busy GPU. Duplicate ids or more than
/// [`MAX_MODEL_IDS`] are refused (`BadCount`), as the decoder would refuse
/// them.
pub fn encode_models(buf: &mut [u8], ids: &[u32]) -> Result<usize, WireError> {
    encode_models_busy(buf, ids, &[])
}

/// Encodes a model list followed by the backend's busy GPUs. Duplicate
/// ids or GPUs are refused (`BadCount`), as the decoder would refuse them;
/// a message over [`MAX_MESSAGE_LEN`] is `BadLength`.
pub fn encode_models_busy(buf: &mut [u8], ids: &[u32], busy: &[GpuBusy]) -> Result<usize, WireError> {
    if ids.len() > MAX_MODEL_IDS
        || has_duplicates(ids.len(), |i| ids[i])
        || has_duplicates(busy.len(), |i| busy[i].gpu_id)
    {
        return Err(WireError::BadCount);
    }
    let body_len = 8 + 4 * ids.len() + GPU_BUSY_LEN * busy.len();
    put_header(buf, Kind::Models, body_len)?;
    let head = ModelsHead {
        count: ids.len() as u32,
        busy: busy.len() as u32,
    };
    buf[HEADER_LEN..HEADER_LEN + 8].copy_from_slice(bytemuck::bytes_of(&head));
    for (i, id) in ids.iter().enumerate() {
        let at = HEADER_LEN + 8 + 4 * i;
        buf[at..at + 4].copy_from_slice(&id.to_le_bytes());
    }
    let from = HEADER_LEN + 8 + 4 * ids.len();
    for (i, b) in busy.iter().enumerate() {
        let at = from + GPU_BUSY_LEN * i;
        buf[at..at + GPU_BUSY_LEN].copy_from_slice(bytemuck::bytes_of(b));
    }
    Ok(HEADER_LEN + body_len)
}

/// Whether an id repeats. Model lists are short (and bounded by
/// [`MAX_MODEL_IDS`]); a sorted copy on the stack would not be, so this is a
/// bitmap over the ids' low bits with an exact fallback on a collision.
fn has_duplicates(n: usize, id_at: impl Fn(usize) -> u32) -> bool {
    let mut seen = [0u64; 64];
    for i in 0..n {
        let id = id_at(i);
        let bit = (id % 4096) as usize;
        if seen[bit / 64] & (1 << (bit % 64)) != 0 && (0..i).any(|j| id_at(j) == id) {
            return true;
        }
        seen[bit / 64] |= 1 << (bit % 64);
    }
    false
}

/// Encodes a batch plan; `head.count` is set from `tasks.len()`.
pub fn encode_batch_plan(
    buf: &mut [u8],
    head: &BatchPlanHead,
    tasks: &[BatchTask],
) -> Result<usize, WireError> {
    let mut w = BatchPlanWriter::new(buf, head)?;
    for t in tasks {
        w.push(t)?;
    }
    Ok(w.finish())
}

/// Builds a batch plan in place, entry by entry, without a task slice.
#[derive(Debug)]
pub struct BatchPlanWriter<'a> {
    buf: &'a mut [u8],
    head: BatchPlanHead,
}

const PLAN_HEAD_LEN: usize = std::mem::size_of::<BatchPlanHead>();

impl<'a> BatchPlanWriter<'a> {
    /// Starts a plan in `buf`.
    pub fn new(buf: &'a mut [u8], head: &BatchPlanHead) -> Result<Self, WireError> {
        if buf.len() < HEADER_LEN + PLAN_HEAD_LEN {
            return Err(WireError::BufferTooSmall);
        }
        let mut head = *head;
        head.count = 0;
        Ok(BatchPlanWriter { buf, head })
    }
    /// Appends one task entry.
    pub fn push(&mut self, task: &BatchTask) -> Result<(), WireError> {
        let n = self.head.count as usize;
        if n >= MAX_BATCH_TASKS {
            return Err(WireError::BadCount);
        }
        let at = HEADER_LEN + PLAN_HEAD_LEN + n * TASK_LEN;
        let dst = self
            .buf
            .get_mut(at..at + TASK_LEN)
            .ok_or(WireError::BufferTooSmall)?;
        dst.copy_from_slice(bytemuck::bytes_of(task));
        self.head.count += 1;
        Ok(())
    }
    /// Entries so far.
    pub fn count(&self) -> usize {
        self.head.count as usize
    }
    /// Writes header and head; returns the message length.
    pub fn finish(self) -> usize {
        let body = PLAN_HEAD_LEN + self.head.count as usize * TASK_LEN;
        // Space and bound were checked by `new` and `push`.
        let h = Header {
            magic: MAGIC,
            version: VERSION,
            kind: Kind::BatchPlan as u16,
            len: body as u32,
            reserved: 0,
        };
        self.buf[..HEADER_LEN].copy_from_slice(bytemuck::bytes_of(&h));
        self.buf[HEADER_LEN..HEADER_LEN + PLAN_HEAD_LEN]
            .copy_from_slice(bytemuck::bytes_of(&self.head));
        HEADER_LEN + body
    }
}

/// Encodes a completion; for inline output pass the bytes (and
/// `head.output_kind = Inline`; `output_len` is set from `inline.len()`).
pub fn encode_completion(
    buf: &mut [u8],
    head: &CompletionHead,
    inline: &[u8],
) -> Result<usize, WireError> {
    const H: usize = std::mem::size_of::<CompletionHead>();
    if inline.len() > MAX_INLINE_OUTPUT {
        return Err(WireError::BadLength);
    }
    let mut head = *head;
    if head.output_kind == OutputKind::Inline as u32 {
        head.output_len = inline.len() as u32;
    } else if !inline.is_empty() {
        return Err(WireError::BadValue(
            "inline bytes without inline output kind",
        ));
    }
    put_header(buf, Kind::Completion, H + inline.len())?;
    buf[HEADER_LEN..HEADER_LEN + H].copy_from_slice(bytemuck::bytes_of(&head));
    buf[HEADER_LEN + H..HEADER_LEN + H + inline.len()].copy_from_slice(inline);
    Ok(HEADER_LEN + H + inline.len())
}

/// Validates the header at the start of `buf` and returns the whole
/// message length, or `None` if fewer than [`HEADER_LEN`] bytes are there.
/// Stream framers call this before they have the body.
/// A message of another version is framed by its length alone (the header
/// is the same in every version), so that the receiver can decode a
/// [`Refused`] or name the peer ([`peek_peer`]) instead of losing the link.
pub fn frame_len(buf: &[u8]) -> Result<Option<usize>, WireError> {
    let Some(hb) = buf.get(..HEADER_LEN) else {
        return Ok(None);
    };
    let h: Header = bytemuck::pod_read_unaligned(hb);
    if h.magic == MAGIC && h.version != VERSION {
        if h.len as usize > MAX_MESSAGE_LEN - HEADER_LEN {
            return Err(WireError::BadLength);
        }
        return Ok(Some(HEADER_LEN + h.len as usize));
    }
    let kind = check_header(&h)?;
    let body = h.len as usize;
    if body != fixed_body_len(kind).unwrap_or(body) {
        return Err(WireError::BadLength);
    }
    Ok(Some(HEADER_LEN + body))
}

fn check_header(h: &Header) -> Result<Kind, WireError> {
    if h.magic != MAGIC {
        return Err(WireError::BadMagic);
    }
    if h.version != VERSION {
        return Err(WireError::BadVersion(h.version));
    }
    let kind = Kind::from_u16(h.kind).ok_or(WireError::UnknownKind(h.kind))?;
    if h.reserved != 0 {
        return Err(WireError::ReservedNotZero);
    }
    if h.len as usize > MAX_MESSAGE_LEN - HEADER_LEN {
        return Err(WireError::BadLength);
    }
    Ok(kind)
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
        Kind::BatchPlan | Kind::Completion | Kind::Models | Kind::Tasks => return None,
    })
}

fn read_fixed<M: Pod>(body: &[u8]) -> Result<M, WireError> {
    if body.len() != std::mem::size_of::<M>() {
        return Err(WireError::BadLength);
    }
    Ok(bytemuck::pod_read_unaligned(body))
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
    Ok(match kind {
        Kind::Register => {
            let r: Register = read_fixed(body)?;
            Role::from_u32(r.role).ok_or(WireError::BadValue("role"))?;
            if r.reserved != 0 {
                return Err(WireError::ReservedNotZero);
            }
            if padded_text(&r.endpoint).is_none() {
                return Err(WireError::BadValue("endpoint"));
            }
            Message::Register(r)
        }
        Kind::Heartbeat => {
            let m: Heartbeat = read_fixed(body)?;
            Role::from_u32(m.role).ok_or(WireError::BadValue("role"))?;
            Message::Heartbeat(m)
        }
        Kind::Task => {
            let t: Task = read_fixed(body)?;
            if t.flags & !(TASK_BUDGET_IS_TIMEOUT | TASK_ATTEMPT_MASK) != 0 {
                return Err(WireError::BadValue("task flags"));
            }
            Message::Task(t)
        }
        Kind::Cancel => Message::Cancel(read_fixed(body)?),
        Kind::BatchPlan => {
            let head_bytes = body.get(..PLAN_HEAD_LEN).ok_or(WireError::BadLength)?;
            let head: BatchPlanHead = bytemuck::pod_read_unaligned(head_bytes);
            let count = head.count as usize;
            if count > MAX_BATCH_TASKS || body.len() != PLAN_HEAD_LEN + count * TASK_LEN {
                return Err(WireError::BadCount);
            }
            let tasks = BatchTasks {
                bytes: &body[PLAN_HEAD_LEN..],
            };
            Message::BatchPlan(head, tasks)
        }
        Kind::Completion => {
            const H: usize = std::mem::size_of::<CompletionHead>();
            let head_bytes = body.get(..H).ok_or(WireError::BadLength)?;
            let head: CompletionHead = bytemuck::pod_read_unaligned(head_bytes);
            let inline = &body[H..];
            TaskStatus::from_u32(head.status).ok_or(WireError::BadValue("task status"))?;
            let executed = head.batch_size > 0 && head.batch_index < head.batch_size;
            let not_executed = head.batch_size == 0 && head.batch_index == 0;
            if head.batch_size as usize > MAX_BATCH_TASKS || !(executed || not_executed) {
                return Err(WireError::BadValue("batch size or index"));
            }
            match OutputKind::from_u32(head.output_kind)
                .ok_or(WireError::BadValue("output kind"))?
            {
                OutputKind::None => {
                    if head.output_len != 0
                        || !inline.is_empty()
                        || head.remote != RemoteRef::default()
                    {
                        return Err(WireError::BadLength);
                    }
                }
                OutputKind::Inline => {
                    if head.output_len as usize != inline.len()
                        || head.remote != RemoteRef::default()
                    {
                        return Err(WireError::BadLength);
                    }
                }
                OutputKind::Remote => {
                    if !inline.is_empty() || head.output_len != head.remote.len {
                        return Err(WireError::BadLength);
                    }
                }
            }
            Message::Completion(head, inline)
        }
        Kind::Dropped => {
            let m: Dropped = read_fixed(body)?;
            let reason = DropReason::from_u32(m.reason).ok_or(WireError::BadValue("drop reason"))?;
            // A moved answer names the attempt it hands back (16 bits).
            let bound = if reason == DropReason::Moved { u32::from(u16::MAX) } else { 0 };
            if m.reserved > bound {
                return Err(WireError::ReservedNotZero);
            }
            Message::Dropped(m)
        }
        Kind::BatchDone => {
            let m: BatchDone = read_fixed(body)?;
            if m.reserved != 0 {
                return Err(WireError::ReservedNotZero);
            }
            if m.finish_ago_ns > m.start_ago_ns {
                return Err(WireError::BadValue("batch finished before it started"));
            }
            Message::BatchDone(m)
        }
        Kind::ReadRequest => Message::ReadRequest(read_fixed(body)?),
        Kind::ReadResponse => {
            let m: ReadResponse = read_fixed(body)?;
            let st = ReadStatus::from_u32(m.status).ok_or(WireError::BadValue("read status"))?;
            if st != ReadStatus::Ok && m.len != 0 {
                return Err(WireError::BadLength);
            }
            Message::ReadResponse(m)
        }
        Kind::Models => {
            let head_bytes = body.get(..8).ok_or(WireError::BadLength)?;
            let head: ModelsHead = bytemuck::pod_read_unaligned(head_bytes);
            let count = head.count as usize;
            let busy = head.busy as usize;
            // Both counts are u32: the sum cannot overflow a usize of 64 bits,
            // and the length bound keeps it far below on 32 bits too.
            let expected = 4u64 * count as u64 + GPU_BUSY_LEN as u64 * busy as u64 + 8;
            if count > MAX_MODEL_IDS || body.len() as u64 != expected {
                return Err(WireError::BadCount);
            }
            let ids = ModelIds { bytes: &body[8..8 + 4 * count] };
            let at = |i: usize| {
                let b = &ids.bytes[4 * i..4 * i + 4];
                u32::from_le_bytes([b[0], b[1], b[2], b[3]])
            };
            if has_duplicates(ids.len(), at) {
                return Err(WireError::BadValue("duplicate model id"));
            }
            let gpus = GpuBusyList { bytes: &body[8 + 4 * count..] };
            let gpu_at = |i: usize| {
                let e: GpuBusy = bytemuck::pod_read_unaligned(&gpus.bytes[GPU_BUSY_LEN * i..GPU_BUSY_LEN * (i + 1)]);
                e.gpu_id
            };
            if has_duplicates(gpus.len(), gpu_at) {
                return Err(WireError::BadValue("duplicate busy GPU"));
            }
            Message::Models(ids, gpus)
        }
        Kind::Challenge => Message::Challenge(read_fixed(body)?),
        Kind::Join => {
            let j: Join = read_fixed(body)?;
            match j.role() {
                Some(Role::Frontend | Role::Backend) => {}
                _ => return Err(WireError::BadValue("role")),
            }
            if j.flags & !JOIN_HAS_MAC != 0 {
                return Err(WireError::BadValue("join flags"));
            }
            if !j.has_mac() && j.mac != [0; MAC_LEN] {
                return Err(WireError::ReservedNotZero);
            }
            if padded_text(&j.endpoint).is_none() {
                return Err(WireError::BadValue("endpoint"));
            }
            Message::Join(j)
        }
        Kind::Welcome => Message::Welcome(read_fixed(body)?),
        Kind::Refused => Message::Refused(read_fixed(body)?),
        Kind::BenchStamp => Message::BenchStamp(read_fixed(body)?),
        Kind::Tasks => Message::Tasks(batch::decode_tasks(body)?),
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

/// Entry point for fuzzers and property tests: decodes arbitrary bytes both
/// as one message and as a frame prefix, and checks that whatever decodes
/// re-encodes to the same bytes. Panics only on a real codec bug.
pub fn fuzz_decode(data: &[u8]) {
    let _ = frame_len(data);
    if let Some(p) = peek_peer(data) {
        let _ = p.to_string();
    }
    if let Ok(m) = decode(data) {
        match m {
            Message::Task(t) => fuzz_task_id(t.id()),
            Message::Cancel(c) => fuzz_task_id(c.id()),
            Message::BatchPlan(_, t) => t.iter().for_each(|e| fuzz_task_id(e.id())),
            Message::Completion(h, _) => fuzz_task_id(h.id()),
            Message::Dropped(d) => {
                fuzz_task_id(d.id());
                let r = DropReason::from_u32(d.reason).expect("decoded reasons are known");
                assert_eq!((r.code(), DropReason::ALL[r.index()]), (d.reason, r));
            }
            Message::Refused(r) => {
                let _ = r.to_string();
            }
            Message::Join(j) => {
                let _ = j.endpoint();
            }
            _ => {}
        }
        // A preamble message of another version decodes but re-encodes
        // with this version's header.
        let version = u16::from_le_bytes([data[4], data[5]]);
        if version != VERSION {
            assert!(matches!(m, Message::Challenge(_) | Message::Refused(_)), "{m:?}");
            return;
        }
        let mut buf = [0u8; MAX_MESSAGE_LEN];
        let n = match m {
            Message::Register(r) => encode(&mut buf, &r),
            Message::Heartbeat(r) => encode(&mut buf, &r),
            Message::Task(r) => encode(&mut buf, &r),
            Message::Cancel(r) => encode(&mut buf, &r),
            Message::BatchPlan(h, t) => {
                let mut w = BatchPlanWriter::new(&mut buf, &h).expect("room for a plan");
                for e in t.iter() {
                    w.push(&e).expect("decoded plans fit");
                }
                Ok(w.finish())
            }
            Message::Completion(h, inline) => encode_completion(&mut buf, &h, inline),
            Message::Dropped(r) => encode(&mut buf, &r),
            Message::BatchDone(r) => encode(&mut buf, &r),
            Message::ReadRequest(r) => encode(&mut buf, &r),
            Message::ReadResponse(r) => encode(&mut buf, &r),
            Message::Models(ids, busy) => {
                let ids: Vec<u32> = ids.iter().collect();
                let busy: Vec<GpuBusy> = busy.iter().collect();
                encode_models_busy(&mut buf, &ids, &busy)
            }
            Message::Challenge(r) => encode(&mut buf, &r),
            Message::Join(r) => encode(&mut buf, &r),
            Message::Welcome(r) => encode(&mut buf, &r),
            Message::Refused(r) => encode(&mut buf, &r),
            Message::BenchStamp(r) => encode(&mut buf, &r),
            Message::Tasks(list) => {
                let mut b = TaskBatcher::new(list.len());
                list.iter().for_each(|t| b.push(&t).expect("a decoded batch fits its own limit"));
                let m = b.take().expect("a decoded batch is not empty");
                buf[..m.len()].copy_from_slice(m);
                Ok(m.len())
            }
        }
        .expect("a decoded message re-encodes");
        assert_eq!(
            &buf[..n],
            data,
            "decode/encode round trip changed the bytes"
        );
    }
}

/// Any task id's fields rebuild it.
fn fuzz_task_id(id: TaskId) {
    assert_eq!(TaskId::new(id.frontend(), id.seq(), id.slot()), id);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_plan_round_trips_and_rejects_bad_counts() {
        let mut buf = [0u8; MAX_MESSAGE_LEN];
        let head = BatchPlanHead {
            batch_id: 7,
            exec_in_ns: 5,
            model_id: 1,
            gpu_id: 2,
            count: 99,
            run_ns: 11,
            epoch: 3,
        };
        let tasks: Vec<BatchTask> = (0..3)
            .map(|i| BatchTask {
                task_id: i,
                frontend_id: 1,
                queued_us: 0,
                input: RemoteRef {
                    key: 1,
                    len: 2,
                    offset: 3,
                },
            })
            .collect();
        let n = encode_batch_plan(&mut buf, &head, &tasks).unwrap();
        match decode(&buf[..n]).unwrap() {
            Message::BatchPlan(h, t) => {
                assert_eq!(h.count, 3);
                assert_eq!(t.iter().collect::<Vec<_>>(), tasks);
            }
            m => panic!("{m:?}"),
        }
        assert_eq!(decode(&buf[..n - 1]), Err(WireError::Truncated));
        // Claim one more entry than present.
        buf[HEADER_LEN + 32..HEADER_LEN + 36].copy_from_slice(&4u32.to_le_bytes());
        assert_eq!(decode(&buf[..n]), Err(WireError::BadCount));
    }

    #[test]
    fn model_lists_round_trip_and_refuse_duplicates() {
        let mut buf = [0u8; MAX_MESSAGE_LEN];
        let ids = [3u32, 0, 4099, 7];
        let n = encode_models(&mut buf, &ids).unwrap();
        match decode(&buf[..n]).unwrap() {
            Message::Models(m, busy) => {
                assert_eq!(m.iter().collect::<Vec<_>>(), ids);
                assert!(busy.is_empty());
            }
            m => panic!("{m:?}"),
        }
        assert_eq!(encode_models(&mut buf, &[1, 2, 1]), Err(WireError::BadCount));
        // 4099 and 3 share a bitmap bit but are different ids.
        assert!(encode_models(&mut buf, &[3, 4099]).is_ok());
        // A duplicate forged on the wire is refused by the decoder.
        let n = encode_models(&mut buf, &[5, 6]).unwrap();
        buf[n - 4..n].copy_from_slice(&5u32.to_le_bytes());
        assert_eq!(decode(&buf[..n]), Err(WireError::BadValue("duplicate model id")));
        assert_eq!(decode(&buf[..n - 4]), Err(WireError::Truncated));
        let empty = encode_models(&mut buf, &[]).unwrap();
        assert!(matches!(decode(&buf[..empty]), Ok(Message::Models(m, _)) if m.is_empty()));
    }

    #[test]
    fn busy_gpus_follow_the_model_ids_and_are_checked() {
        let mut buf = [0u8; MAX_MESSAGE_LEN];
        let busy = [
            GpuBusy { busy_ns: 7_000_000, gpu_id: 1, batches: 2 },
            GpuBusy { busy_ns: 0, gpu_id: 0, batches: 0 },
        ];
        let n = encode_models_busy(&mut buf, &[4, 2], &busy).unwrap();
        match decode(&buf[..n]).unwrap() {
            Message::Models(ids, b) => {
                assert_eq!(ids.iter().collect::<Vec<_>>(), [4, 2]);
                assert_eq!(b.iter().collect::<Vec<_>>(), busy);
            }
            m => panic!("{m:?}"),
        }
        fuzz_decode(&buf[..n]);
        // One entry short of what the head claims; a GPU twice.
        assert_eq!(decode(&buf[..n - GPU_BUSY_LEN]), Err(WireError::Truncated));
        let twice = [busy[0], busy[0]];
        assert_eq!(encode_models_busy(&mut buf, &[4], &twice), Err(WireError::BadCount));
        let n = encode_models_busy(&mut buf, &[4], &busy).unwrap();
        buf[n - GPU_BUSY_LEN + 8..n - GPU_BUSY_LEN + 12].copy_from_slice(&1u32.to_le_bytes());
        assert_eq!(decode(&buf[..n]), Err(WireError::BadValue("duplicate busy GPU")));
        // A busy count that does not match the length.
        let n = encode_models_busy(&mut buf, &[4], &busy[..1]).unwrap();
        buf[HEADER_LEN + 4..HEADER_LEN + 8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(decode(&buf[..n]), Err(WireError::BadCount));
    }

    #[test]
    fn welcome_and_plans_carry_the_epoch() {
        let mut buf = [0u8; MAX_MESSAGE_LEN];
        let w = Welcome { models: 2, epoch: 7, control_delay_ns: 5 };
        let n = encode(&mut buf, &w).unwrap();
        assert_eq!(decode(&buf[..n]), Ok(Message::Welcome(w)));
        let head = BatchPlanHead { batch_id: 1, epoch: u32::MAX, ..BatchPlanHead::default() };
        let n = encode_batch_plan(&mut buf, &head, &[]).unwrap();
        assert!(matches!(decode(&buf[..n]), Ok(Message::BatchPlan(h, _)) if h.epoch == u32::MAX));
    }

    #[test]
    fn batch_done_round_trips_and_refuses_a_finish_before_its_start() {
        let mut buf = [0u8; MAX_MESSAGE_LEN];
        let done = BatchDone {
            batch_id: 9,
            start_ago_ns: 5_000,
            finish_ago_ns: 1_000,
            read_max_ns: 30_000,
            gpu_id: 1,
            count: 4,
            reads: 4,
            reserved: 0,
        };
        assert_eq!(done.actual_ns(), 4_000);
        let n = encode(&mut buf, &done).unwrap();
        assert_eq!(decode(&buf[..n]), Ok(Message::BatchDone(done)));
        let bad = BatchDone { finish_ago_ns: 6_000, ..done };
        let n = encode(&mut buf, &bad).unwrap();
        assert_eq!(decode(&buf[..n]), Err(WireError::BadValue("batch finished before it started")));
        let bad = BatchDone { reserved: 1, ..done };
        let n = encode(&mut buf, &bad).unwrap();
        assert_eq!(decode(&buf[..n]), Err(WireError::ReservedNotZero));
    }

    #[test]
    fn every_fixed_message_has_a_length_multiple_of_eight() {
        for k in 1..=15 {
            if let Some(n) = fixed_body_len(Kind::from_u16(k).unwrap()) {
                assert_eq!(n % 8, 0, "kind {k}");
            }
        }
        assert_eq!(Kind::from_u16(16), None);
    }

    #[test]
    fn drop_reasons_are_one_consistent_list() {
        for (i, r) in DropReason::ALL.iter().enumerate() {
            assert_eq!((r.index(), DropReason::from_u32(r.code())), (i, Some(*r)));
        }
        assert_eq!(DropReason::from_u32(0), None);
        assert_eq!(DropReason::from_u32(DropReason::COUNT as u32 + 1), None);
        assert_eq!((DropReason::Timeout.code(), DropReason::Timeout.as_str()), (8, "timeout"));
        assert_eq!((DropReason::Cancelled.code(), DropReason::Cancelled.as_str()), (9, "cancelled"));
    }

    #[test]
    fn tasks_carry_priority_and_the_timeout_flag_and_cancels_round_trip() {
        let mut buf = [0u8; 128];
        // Only a moved answer names an attempt.
        let moved = Dropped { task_id: 7, reason: DropReason::Moved.code(), reserved: 3 };
        let n = encode(&mut buf, &moved).unwrap();
        assert_eq!(decode(&buf[..n]), Ok(Message::Dropped(moved)));
        let bad = Dropped { reason: DropReason::Overloaded.code(), ..moved };
        let n = encode(&mut buf, &bad).unwrap();
        assert_eq!(decode(&buf[..n]), Err(WireError::ReservedNotZero));
        let t = Task { task_id: 7, budget_ns: 9, model_id: 1, frontend_id: 0, priority: 2, flags: TASK_BUDGET_IS_TIMEOUT, ..Task::default() };
        let n = encode(&mut buf, &t).unwrap();
        assert_eq!(decode(&buf[..n]), Ok(Message::Task(t)));
        // The attempt rides in the flags' upper half, beside the timeout flag.
        let again = t.with_attempt(3);
        assert_eq!((again.attempt(), again.flags & TASK_BUDGET_IS_TIMEOUT), (3, TASK_BUDGET_IS_TIMEOUT));
        let n = encode(&mut buf, &again).unwrap();
        assert_eq!(decode(&buf[..n]), Ok(Message::Task(again)));
        let bad = Task { flags: 2, ..t };
        let n = encode(&mut buf, &bad).unwrap();
        assert_eq!(decode(&buf[..n]), Err(WireError::BadValue("task flags")));
        let c = Cancel { task_id: 42 };
        let n = encode(&mut buf, &c).unwrap();
        assert_eq!(n, HEADER_LEN + 8);
        assert_eq!(decode(&buf[..n]), Ok(Message::Cancel(c)));
        assert_eq!(decode(&buf[..n - 1]), Err(WireError::Truncated));
    }

    #[test]
    fn completion_execution_fields_round_trip_and_are_checked() {
        let mut buf = [0u8; 256];
        let head = CompletionHead {
            task_id: 9,
            batch_size: 4,
            batch_index: 3,
            input_ns: 1,
            compute_ns: 2,
            since_start_ns: 3,
            ..CompletionHead::default()
        };
        let n = encode_completion(&mut buf, &head, &[]).unwrap();
        assert!(matches!(decode(&buf[..n]), Ok(Message::Completion(h, _)) if h == head));
        for (size, index) in [(4, 4), (0, 1), (MAX_BATCH_TASKS as u32 + 1, 0)] {
            let bad = CompletionHead { batch_size: size, batch_index: index, ..head };
            let n = encode_completion(&mut buf, &bad, &[]).unwrap();
            assert_eq!(decode(&buf[..n]).err(), Some(WireError::BadValue("batch size or index")));
        }
    }
}
