//! The 16-byte [`Header`] every message starts with, the version it names,
//! and framing: where a message ends in a stream ([`frame_len`]), and the
//! fixed-size bodies' encoder ([`encode`]).

use super::*;

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
/// attempt it hands back in the word that was reserved. Version 8: a
/// [`BatchTask`] carries the scheduler's capability for it, and a
/// [`CompletionHead`] hands it back with the sending backend's id (issue
/// 55, [`crate::capability`]). Version 9: a [`ReadRequest`] presents the
/// task it serves and that capability (the TCP responder checks it); a
/// [`Join`] carries the peer's fresh nonce and a [`Welcome`] the
/// scheduler's MAC over it (mutual authentication, `join::PeerProof`).
/// Version 10: a [`CompletionHead`] may carry [`TaskStatus::Abandoned`]
/// (code 3), the scheduler's answer for a batch it gave up (a version-9
/// frontend refuses the code).
pub const VERSION: u16 = 10;
/// Oldest peer version a scheduler of this version accepts. Upgrades are
/// stop-the-world (`docs/operations.md`): only its own version.
pub const OLDEST_PEER_VERSION: u16 = VERSION;
/// Largest message (header + body) accepted or produced. READ payloads that
/// follow a [`ReadResponse`] are not messages and are bounded separately.
pub const MAX_MESSAGE_LEN: usize = 32 * 1024;
/// Size of the [`Header`].
pub const HEADER_LEN: usize = std::mem::size_of::<Header>();

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

pub(super) fn put_header(buf: &mut [u8], kind: Kind, body_len: usize) -> Result<(), WireError> {
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

pub(super) fn read_fixed<M: Pod>(body: &[u8]) -> Result<M, WireError> {
    if body.len() != std::mem::size_of::<M>() {
        return Err(WireError::BadLength);
    }
    Ok(bytemuck::pod_read_unaligned(body))
}
