//! Batch plans (scheduler -> backend: a [`BatchPlanHead`] and its
//! [`BatchTask`] entries) and the report that a batch ran
//! ([`BatchDone`], backend -> scheduler).

use super::*;

/// Most task entries in one batch plan.
pub const MAX_BATCH_TASKS: usize = 512;

/// Bytes of a task's capability (see [`crate::capability`]: a truncated
/// HMAC-SHA256, 128 bits).
pub const CAPABILITY_LEN: usize = 16;

/// A task's capability as it travels (all zero where no key signs).
pub type Capability = [u8; CAPABILITY_LEN];

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
    /// The scheduler's capability for this task at this backend (see
    /// [`crate::capability`]), handed back in the task's
    /// [`CompletionHead::capability`]; zero without a join token.
    pub capability: Capability,
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

impl FixedMessage for BatchDone {
    const KIND: Kind = Kind::BatchDone;
}


/// The body of a [`Kind::BatchPlan`] message: a count within
/// [`MAX_BATCH_TASKS`] that matches the length.
pub(super) fn decode_batch_plan(body: &[u8]) -> Result<(BatchPlanHead, BatchTasks<'_>), WireError> {
    let head_bytes = body.get(..PLAN_HEAD_LEN).ok_or(WireError::BadLength)?;
    let head: BatchPlanHead = bytemuck::pod_read_unaligned(head_bytes);
    let count = head.count as usize;
    if count > MAX_BATCH_TASKS || body.len() != PLAN_HEAD_LEN + count * TASK_LEN {
        return Err(WireError::BadCount);
    }
    let tasks = BatchTasks {
        bytes: &body[PLAN_HEAD_LEN..],
    };
    Ok((head, tasks))
}

/// The body of a [`Kind::BatchDone`] message: a zero reserved word, and a
/// finish no earlier than the start.
pub(super) fn decode_batch_done(body: &[u8]) -> Result<BatchDone, WireError> {
    let m: BatchDone = read_fixed(body)?;
    if m.reserved != 0 {
        return Err(WireError::ReservedNotZero);
    }
    if m.finish_ago_ns > m.start_ago_ns {
        return Err(WireError::BadValue("batch finished before it started"));
    }
    Ok(m)
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
                capability: Default::default(),
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
    fn welcome_and_plans_carry_the_epoch() {
        let mut buf = [0u8; MAX_MESSAGE_LEN];
        let w = Welcome { models: 2, epoch: 7, control_delay_ns: 5, mac: [3; MAC_LEN] };
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
}
