//! The cluster's id spaces: task ids (the one definition of their bit
//! layout), and the bounds on frontend and backend ids every daemon checks.
//!
//! A task id is a `u64` on the wire ([`crate::wire::Task::task_id`] and
//! friends). A frontend builds it from three fields, high bits first:
//!
//! ```text
//!  63        52 51                              20 19               0
//! +------------+----------------------------------+------------------+
//! | frontend   | sequence (per staging slot)      | staging slot     |
//! | 12 bits    | 32 bits                          | 20 bits          |
//! +------------+----------------------------------+------------------+
//! ```
//!
//! The frontend field lets any node (the scheduler forwarding a completion a
//! backend could not deliver, a harness) tell whose task it is without a
//! table; the slot and sequence let the frontend route an outcome with one
//! array index and recognise a stale one. Frontend ids are therefore below
//! [`MAX_FRONTENDS`] on every daemon, and a frontend has at most
//! [`MAX_SLOTS`] slots.

/// Bits of the frontend id (the top bits of a task id).
pub const FRONTEND_BITS: u32 = 12;
/// Bits of the per-slot sequence number (the middle bits).
pub const SEQ_BITS: u32 = 32;
/// Bits of the staging slot index (the low bits).
pub const SLOT_BITS: u32 = 20;

const _: () = assert!(FRONTEND_BITS + SEQ_BITS + SLOT_BITS == u64::BITS);

/// Frontend ids are below this, cluster-wide (every daemon refuses others).
pub const MAX_FRONTENDS: u32 = 1 << FRONTEND_BITS;
/// Backend ids are below this, cluster-wide (every daemon refuses others).
pub const MAX_BACKENDS: u32 = 1 << 16;
/// Most staging slots one frontend can have.
pub const MAX_SLOTS: u32 = 1 << SLOT_BITS;
/// Mask of a sequence number (sequences wrap within it).
pub const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;

const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;
const SEQ_SHIFT: u32 = SLOT_BITS;
const FRONTEND_SHIFT: u32 = SLOT_BITS + SEQ_BITS;

/// A cluster-unique task id with the layout above. Every `u64` is a valid
/// `TaskId` (decoding its fields cannot fail), so ids read from the network
/// need no check here; whether one names a request in flight is the
/// frontend's question.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TaskId(pub u64);

impl TaskId {
    /// The id of sequence `seq` of staging slot `slot` of frontend
    /// `frontend`. Each field is truncated to its width (a debug build
    /// asserts that none needed it): `frontend < MAX_FRONTENDS`,
    /// `seq <= SEQ_MASK`, `slot < MAX_SLOTS`.
    pub const fn new(frontend: u32, seq: u64, slot: u32) -> TaskId {
        debug_assert!(frontend < MAX_FRONTENDS && seq <= SEQ_MASK && slot < MAX_SLOTS);
        TaskId(
            (frontend as u64 & (MAX_FRONTENDS as u64 - 1)) << FRONTEND_SHIFT
                | (seq & SEQ_MASK) << SEQ_SHIFT
                | (slot as u64 & SLOT_MASK),
        )
    }

    /// The frontend that staged the task (`< MAX_FRONTENDS`).
    pub const fn frontend(self) -> u32 {
        (self.0 >> FRONTEND_SHIFT) as u32
    }

    /// The staging slot's sequence number (`<= SEQ_MASK`).
    pub const fn seq(self) -> u64 {
        (self.0 >> SEQ_SHIFT) & SEQ_MASK
    }

    /// The staging slot (`< MAX_SLOTS`).
    pub const fn slot(self) -> u32 {
        (self.0 & SLOT_MASK) as u32
    }

    /// The id as it crosses the wire.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl From<u64> for TaskId {
    fn from(v: u64) -> TaskId {
        TaskId(v)
    }
}

impl From<TaskId> for u64 {
    fn from(id: TaskId) -> u64 {
        id.0
    }
}

impl std::fmt::Display for TaskId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:{}", self.frontend(), self.seq(), self.slot())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_at_their_extremes_round_trip() {
        for (f, s, i) in [
            (0, 0, 0),
            (MAX_FRONTENDS - 1, SEQ_MASK, MAX_SLOTS - 1),
            (MAX_FRONTENDS - 1, 0, 0),
            (0, SEQ_MASK, 0),
            (0, 0, MAX_SLOTS - 1),
            (5, 77, 1234),
        ] {
            let id = TaskId::new(f, s, i);
            assert_eq!((id.frontend(), id.seq(), id.slot()), (f, s, i));
            assert_eq!(TaskId::from(u64::from(id)), id);
        }
        assert_eq!(
            TaskId::new(MAX_FRONTENDS - 1, 0, 0).0 >> 63,
            1,
            "frontend holds the top bits"
        );
        assert_eq!(TaskId(u64::MAX).frontend(), MAX_FRONTENDS - 1);
        assert_eq!(TaskId::new(3, 2, 1).to_string(), "3:2:1");
    }
}
