//! Messages between the scheduler and its registered peers after the
//! handshake: liveness ([`Heartbeat`]), a backend's model list and busy
//! GPUs ([`Kind::Models`]), a backend's graceful leave ([`Drain`]), and
//! the benchmark-only [`BenchStamp`].

use super::*;

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

/// A backend's way into and out of matchmaking (issue 52).
///
/// The join gate, stage [`DrainStage::Ready`], for a backend whose
/// [`Join`] set [`JOIN_REPORTS_READY`]: scheduler -> backend, after the
/// `Welcome` and the announcements of every live frontend: "those were
/// all; say when your data links to them are up"; backend -> scheduler:
/// "they are up" (or the backend stopped waiting for one at its bound):
/// its GPUs join matchmaking then, not at registration, so no plan reaches
/// it before it can READ its tasks' inputs.
///
/// The graceful leave: backend -> scheduler, stage
/// [`DrainStage::Draining`]: it is leaving (a stop signal): plan nothing
/// more on its GPUs, and release it once nothing planned to it is in
/// flight (resent every heartbeat until released). Scheduler -> backend,
/// stage [`DrainStage::Released`]: every batch planned to it was
/// reported and none follows on this link; it may leave.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Drain {
    /// The leaving backend's id.
    pub backend_id: u32,
    /// A [`DrainStage`] code.
    pub stage: u32,
}

/// Where a [`Drain`] stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum DrainStage {
    /// The backend drains (its notice).
    Draining = 1,
    /// The scheduler released it.
    Released = 2,
    /// The join gate: the frontends announced (scheduler), the data links
    /// to them up (backend).
    Ready = 3,
}

impl Drain {
    /// Backend `id`'s notice that it drains.
    pub const fn draining(id: u32) -> Drain {
        Drain { backend_id: id, stage: DrainStage::Draining as u32 }
    }
    /// The scheduler's release of backend `id`.
    pub const fn released(id: u32) -> Drain {
        Drain { backend_id: id, stage: DrainStage::Released as u32 }
    }
    /// The join gate's message about backend `id` (both ways).
    pub const fn ready(id: u32) -> Drain {
        Drain { backend_id: id, stage: DrainStage::Ready as u32 }
    }
    /// The stage, if the code is known (a decoded message's always is).
    pub const fn stage(&self) -> Option<DrainStage> {
        match self.stage {
            1 => Some(DrainStage::Draining),
            2 => Some(DrainStage::Released),
            3 => Some(DrainStage::Ready),
            _ => None,
        }
    }
}

impl FixedMessage for Drain {
    const KIND: Kind = Kind::Drain;
}

/// The body of a [`Kind::Drain`] message: a known stage.
pub(super) fn decode_drain(body: &[u8]) -> Result<Drain, WireError> {
    let m: Drain = read_fixed(body)?;
    m.stage().ok_or(WireError::BadValue("drain stage"))?;
    Ok(m)
}

impl FixedMessage for Heartbeat {
    const KIND: Kind = Kind::Heartbeat;
}
impl FixedMessage for BenchStamp {
    const KIND: Kind = Kind::BenchStamp;
}


/// The body of a [`Kind::Heartbeat`] message: a known role.
pub(super) fn decode_heartbeat(body: &[u8]) -> Result<Heartbeat, WireError> {
    let m: Heartbeat = read_fixed(body)?;
    Role::from_u32(m.role).ok_or(WireError::BadValue("role"))?;
    Ok(m)
}

/// The body of a [`Kind::Models`] message: counts that match the length,
/// no model id and no busy GPU twice.
pub(super) fn decode_models(body: &[u8]) -> Result<(ModelIds<'_>, GpuBusyList<'_>), WireError> {
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
    Ok((ids, gpus))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drain_messages_round_trip_and_refuse_an_unknown_stage() {
        let mut buf = [0u8; MAX_MESSAGE_LEN];
        for d in [Drain::draining(7), Drain::released(u32::MAX), Drain::ready(3)] {
            let n = encode(&mut buf, &d).unwrap();
            assert_eq!(decode(&buf[..n]), Ok(Message::Drain(d)));
            fuzz_decode(&buf[..n]);
        }
        let n = encode(&mut buf, &Drain { backend_id: 7, stage: 4 }).unwrap();
        assert_eq!(decode(&buf[..n]), Err(WireError::BadValue("drain stage")));
        assert_eq!(decode(&buf[..n - 1]), Err(WireError::Truncated));
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
}
