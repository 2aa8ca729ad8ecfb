//! The READ request/response pair the tcp transport uses to emulate
//! one-sided READs (internal to the transport).

use super::*;

/// Emulated one-sided READ: "send me `remote`" (tcp transport internal).
/// From wire version 9 it presents the task it serves and the plan's
/// capability for it ([`crate::capability::ReadGrant`]): a frontend that
/// holds a capability key serves a backend only the inputs planned to it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct ReadRequest {
    /// Requester's work-request id, echoed back.
    pub wr_id: u64,
    /// What to read.
    pub remote: RemoteRef,
    /// The task whose input this is (0 with no capability).
    pub task: u64,
    /// The scheduler's capability for `task` at the reading backend; zero
    /// without one.
    pub capability: Capability,
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
    /// Registration does not allow remote reads, or the READ's capability
    /// does not verify for the reading backend.
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

impl FixedMessage for ReadRequest {
    const KIND: Kind = Kind::ReadRequest;
}
impl FixedMessage for ReadResponse {
    const KIND: Kind = Kind::ReadResponse;
}


/// The body of a [`Kind::ReadResponse`] message: a known status, and no
/// payload unless it is Ok.
pub(super) fn decode_read_response(body: &[u8]) -> Result<ReadResponse, WireError> {
    let m: ReadResponse = read_fixed(body)?;
    let st = ReadStatus::from_u32(m.status).ok_or(WireError::BadValue("read status"))?;
    if st != ReadStatus::Ok && m.len != 0 {
        return Err(WireError::BadLength);
    }
    Ok(m)
}
