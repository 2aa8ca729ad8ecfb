//! A task's completion (backend -> frontend, or the scheduler's answer):
//! a [`CompletionHead`] with its status, where its output is, and the
//! execution it was part of, and inline output bytes when they fit.

use super::*;

/// Most output bytes carried inline in one completion.
pub const MAX_INLINE_OUTPUT: usize =
    MAX_MESSAGE_LEN - HEADER_LEN - std::mem::size_of::<CompletionHead>();

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
    /// The scheduler gave its batch up (no `BatchDone` within the grace
    /// after its planned finish, or its backend left): the cluster's
    /// failure, not the task's, so another try may succeed.
    Abandoned = 3,
}

impl TaskStatus {
    /// The status with wire code `v`.
    pub fn from_u32(v: u32) -> Option<TaskStatus> {
        Some(match v {
            0 => TaskStatus::Ok,
            1 => TaskStatus::InputUnavailable,
            2 => TaskStatus::ExecFailed,
            3 => TaskStatus::Abandoned,
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
    /// The backend that sends it (the frontend checks `capability` for
    /// it); zero in the scheduler's own answers.
    pub backend_id: u32,
    /// Zero.
    pub reserved: u32,
    /// [`BatchTask::capability`] of the task, handed back (zero in the
    /// scheduler's own answers, and without a join token).
    pub capability: Capability,
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


/// The body of a [`Kind::Completion`] message: a known status, a batch
/// position inside the batch (or both zero), and an output kind whose
/// length and location agree with the bytes that follow.
pub(super) fn decode_completion(body: &[u8]) -> Result<(CompletionHead, &[u8]), WireError> {
    const H: usize = std::mem::size_of::<CompletionHead>();
    let head_bytes = body.get(..H).ok_or(WireError::BadLength)?;
    let head: CompletionHead = bytemuck::pod_read_unaligned(head_bytes);
    let inline = &body[H..];
    TaskStatus::from_u32(head.status).ok_or(WireError::BadValue("task status"))?;
    if head.reserved != 0 {
        return Err(WireError::ReservedNotZero);
    }
    let executed = head.batch_size > 0 && head.batch_index < head.batch_size;
    let not_executed = head.batch_size == 0 && head.batch_index == 0;
    if head.batch_size as usize > MAX_BATCH_TASKS || !(executed || not_executed) {
        return Err(WireError::BadValue("batch size or index"));
    }
    match OutputKind::from_u32(head.output_kind).ok_or(WireError::BadValue("output kind"))? {
        OutputKind::None => {
            if head.output_len != 0 || !inline.is_empty() || head.remote != RemoteRef::default() {
                return Err(WireError::BadLength);
            }
        }
        OutputKind::Inline => {
            if head.output_len as usize != inline.len() || head.remote != RemoteRef::default() {
                return Err(WireError::BadLength);
            }
        }
        OutputKind::Remote => {
            if !inline.is_empty() || head.output_len != head.remote.len {
                return Err(WireError::BadLength);
            }
        }
    }
    Ok((head, inline))
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_completion_carries_its_sender_and_capability_and_a_zero_reserved_word() {
        let mut buf = [0u8; 256];
        let head = CompletionHead { task_id: 9, backend_id: 3, capability: [0xa5; 16], ..CompletionHead::default() };
        let n = encode_completion(&mut buf, &head, &[]).unwrap();
        assert!(matches!(decode(&buf[..n]), Ok(Message::Completion(h, _)) if h == head));
        let bad = CompletionHead { reserved: 1, ..head };
        let n = encode_completion(&mut buf, &bad, &[]).unwrap();
        assert_eq!(decode(&buf[..n]).err(), Some(WireError::ReservedNotZero));
    }
}
