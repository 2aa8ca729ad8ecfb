//! A task's submission and its answers that are not completions: a
//! [`Task`] (frontend -> scheduler), a client's [`Cancel`], and a
//! [`Dropped`] task with its [`DropReason`] (scheduler -> frontend).

use super::*;

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

impl FixedMessage for Task {
    const KIND: Kind = Kind::Task;
}
impl FixedMessage for Cancel {
    const KIND: Kind = Kind::Cancel;
}
impl FixedMessage for Dropped {
    const KIND: Kind = Kind::Dropped;
}


/// The body of a [`Kind::Task`] message: known flags.
pub(super) fn decode_task(body: &[u8]) -> Result<Task, WireError> {
    let t: Task = read_fixed(body)?;
    if t.flags & !(TASK_BUDGET_IS_TIMEOUT | TASK_ATTEMPT_MASK) != 0 {
        return Err(WireError::BadValue("task flags"));
    }
    Ok(t)
}

/// The body of a [`Kind::Dropped`] message: a known reason, and a reserved
/// word that only a moved answer uses.
pub(super) fn decode_dropped(body: &[u8]) -> Result<Dropped, WireError> {
    let m: Dropped = read_fixed(body)?;
    let reason = DropReason::from_u32(m.reason).ok_or(WireError::BadValue("drop reason"))?;
    // A moved answer names the attempt it hands back (16 bits).
    let bound = if reason == DropReason::Moved { u32::from(u16::MAX) } else { 0 };
    if m.reserved > bound {
        return Err(WireError::ReservedNotZero);
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
