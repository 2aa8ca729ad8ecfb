//! Batched task submissions (frontend -> scheduler): [`Kind::Tasks`] is a
//! [`TasksHead`] and `count` [`Task`] records, so a frontend under load
//! sends one message (one send on the link) per batch of tasks instead of
//! one per task. [`TaskBatcher`] builds it in place in a buffer of its own
//! (allocated once); decoding checks the count against the length and
//! [`MAX_TASKS_PER_MESSAGE`] and refuses an empty batch.

use super::*;

/// Head of a [`Kind::Tasks`] message: `count` [`Task`]s follow.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct TasksHead {
    /// Tasks that follow (1 ..= [`MAX_TASKS_PER_MESSAGE`]).
    pub count: u32,
    /// Zero.
    pub reserved: u32,
}

const TASKS_HEAD_LEN: usize = std::mem::size_of::<TasksHead>();
const SUBMIT_LEN: usize = std::mem::size_of::<Task>();

/// Most tasks one [`Kind::Tasks`] message carries.
pub const MAX_TASKS_PER_MESSAGE: usize = (MAX_MESSAGE_LEN - HEADER_LEN - TASKS_HEAD_LEN) / SUBMIT_LEN;

/// The tasks of a batched submission, borrowed from the received bytes
/// (copied out one at a time: they may be unaligned).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskList<'a> {
    bytes: &'a [u8],
}

impl<'a> TaskList<'a> {
    /// Number of tasks.
    pub fn len(&self) -> usize {
        self.bytes.len() / SUBMIT_LEN
    }
    /// Never true for a decoded message (an empty batch is refused).
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
    /// Task `i`.
    pub fn get(&self, i: usize) -> Option<Task> {
        let start = i.checked_mul(SUBMIT_LEN)?;
        self.bytes.get(start..start + SUBMIT_LEN).map(bytemuck::pod_read_unaligned)
    }
    /// The tasks in order.
    pub fn iter(&self) -> impl Iterator<Item = Task> + 'a {
        self.bytes.chunks_exact(SUBMIT_LEN).map(bytemuck::pod_read_unaligned)
    }
}

/// The body of a [`Kind::Tasks`] message.
pub(super) fn decode_tasks(body: &[u8]) -> Result<TaskList<'_>, WireError> {
    let head_bytes = body.get(..TASKS_HEAD_LEN).ok_or(WireError::BadLength)?;
    let head: TasksHead = bytemuck::pod_read_unaligned(head_bytes);
    if head.reserved != 0 {
        return Err(WireError::ReservedNotZero);
    }
    let count = head.count as usize;
    if count == 0 || count > MAX_TASKS_PER_MESSAGE || body.len() != TASKS_HEAD_LEN + count * SUBMIT_LEN {
        return Err(WireError::BadCount);
    }
    Ok(TaskList { bytes: &body[TASKS_HEAD_LEN..] })
}

/// Coalesces tasks into one [`Kind::Tasks`] message in a buffer it owns
/// (allocated once, reused after every [`take`](Self::take)).
#[derive(Debug)]
pub struct TaskBatcher {
    buf: Box<[u8]>,
    count: usize,
    limit: usize,
}

impl TaskBatcher {
    /// A batcher of at most `limit` tasks per message (clamped to
    /// 1 ..= [`MAX_TASKS_PER_MESSAGE`]).
    pub fn new(limit: usize) -> Self {
        let limit = limit.clamp(1, MAX_TASKS_PER_MESSAGE);
        TaskBatcher { buf: vec![0u8; HEADER_LEN + TASKS_HEAD_LEN + limit * SUBMIT_LEN].into_boxed_slice(), count: 0, limit }
    }
    /// Tasks waiting.
    pub fn len(&self) -> usize {
        self.count
    }
    /// No task waits.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
    /// The limit is reached: take the message before the next push.
    pub fn is_full(&self) -> bool {
        self.count >= self.limit
    }
    /// Appends one task (`BadCount` when full).
    pub fn push(&mut self, task: &Task) -> Result<(), WireError> {
        if self.is_full() {
            return Err(WireError::BadCount);
        }
        let at = HEADER_LEN + TASKS_HEAD_LEN + self.count * SUBMIT_LEN;
        self.buf[at..at + SUBMIT_LEN].copy_from_slice(bytemuck::bytes_of(task));
        self.count += 1;
        Ok(())
    }
    /// The encoded message of the tasks waiting (`None` when none), which
    /// empties the batcher; the bytes stay valid until the next push.
    pub fn take(&mut self) -> Option<&[u8]> {
        if self.count == 0 {
            return None;
        }
        let body = TASKS_HEAD_LEN + self.count * SUBMIT_LEN;
        let h = Header { magic: MAGIC, version: VERSION, kind: Kind::Tasks as u16, len: body as u32, reserved: 0 };
        self.buf[..HEADER_LEN].copy_from_slice(bytemuck::bytes_of(&h));
        let head = TasksHead { count: self.count as u32, reserved: 0 };
        self.buf[HEADER_LEN..HEADER_LEN + TASKS_HEAD_LEN].copy_from_slice(bytemuck::bytes_of(&head));
        self.count = 0;
        Some(&self.buf[..HEADER_LEN + body])
    }
}

/// Fuzz entry for the batched frames: `data` as the body of a
/// [`Kind::Tasks`] message under a valid header (so the fuzzer reaches the
/// batch decoder), and as a whole message; whatever decodes re-encodes to
/// the same bytes. Panics only on a codec bug.
pub fn fuzz_decode_tasks(data: &[u8]) {
    fuzz_decode(data);
    let body = &data[..data.len().min(MAX_MESSAGE_LEN - HEADER_LEN)];
    let mut msg = Vec::with_capacity(HEADER_LEN + body.len());
    let h = Header { magic: MAGIC, version: VERSION, kind: Kind::Tasks as u16, len: body.len() as u32, reserved: 0 };
    msg.extend_from_slice(bytemuck::bytes_of(&h));
    msg.extend_from_slice(body);
    if let Ok(Message::Tasks(list)) = decode(&msg) {
        let mut b = TaskBatcher::new(list.len());
        for t in list.iter() {
            b.push(&t).expect("a decoded batch fits its own limit");
        }
        assert_eq!(b.take(), Some(&msg[..]), "batched tasks re-encode to the same bytes");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(i: u64) -> Task {
        Task { task_id: i, budget_ns: 1000 + i, model_id: 2, frontend_id: 1, ..Default::default() }
    }

    #[test]
    fn batches_round_trip_and_respect_the_limit() {
        let mut b = TaskBatcher::new(3);
        assert!(b.take().is_none());
        for i in 0..3 {
            b.push(&task(i)).unwrap();
        }
        assert!(b.is_full());
        assert_eq!(b.push(&task(9)), Err(WireError::BadCount));
        let msg = b.take().unwrap().to_vec();
        assert!(b.is_empty());
        match decode(&msg).unwrap() {
            Message::Tasks(list) => {
                assert_eq!(list.len(), 3);
                assert_eq!(list.iter().collect::<Vec<_>>(), (0..3).map(task).collect::<Vec<_>>());
                assert_eq!(list.get(2), Some(task(2)));
                assert_eq!(list.get(3), None);
            }
            other => panic!("{other:?}"),
        }
        assert!(TaskBatcher::new(usize::MAX).limit == MAX_TASKS_PER_MESSAGE);
    }

    #[test]
    fn malformed_batches_are_refused() {
        let mut b = TaskBatcher::new(2);
        b.push(&task(1)).unwrap();
        b.push(&task(2)).unwrap();
        let good = b.take().unwrap().to_vec();
        // Count larger than the body.
        let mut m = good.clone();
        m[HEADER_LEN] = 3;
        assert_eq!(decode(&m), Err(WireError::BadCount));
        // Empty batch.
        let mut m = good[..HEADER_LEN + TASKS_HEAD_LEN].to_vec();
        m[8..12].copy_from_slice(&(TASKS_HEAD_LEN as u32).to_le_bytes());
        m[HEADER_LEN] = 0;
        assert_eq!(decode(&m), Err(WireError::BadCount));
        // Reserved bits.
        let mut m = good.clone();
        m[HEADER_LEN + 4] = 1;
        assert_eq!(decode(&m), Err(WireError::ReservedNotZero));
        // Oversized: a length beyond the message bound is refused by the framer.
        let mut m = good;
        m[8..12].copy_from_slice(&(MAX_MESSAGE_LEN as u32).to_le_bytes());
        assert!(decode(&m).is_err());
        for cut in 0..40 {
            fuzz_decode_tasks(&vec![cut as u8; cut * 7]);
        }
    }
}
