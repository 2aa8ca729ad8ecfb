//! Raw SENDs: verbs SENDs of registered buffers, of any size up to
//! [`RAW_MAX_LEN`], into receives of registered buffers the peer posted
//! ahead: what perftest's `ib_send_lat` and `ib_send_bw` measure. No framing,
//! no copy: a SEND's bytes go from the caller's registration to the peer's.
//!
//! They travel on a second RC queue pair of the connection, set up with the
//! first in the bootstrap when both sides configure one
//! ([`RdmaConfig::raw_depth`](super::RdmaConfig::raw_depth)). Not on the
//! control queue pair: a SEND consumes the next posted receive in order, and
//! that queue pair's receive queue is the control ring of 32 KiB slots,
//! which the framed message path ([`Connection::send`]) keeps unchanged.
//!
//! Every raw work request is signalled and reported by
//! `RdmaConnection::poll_raw` as one [`RawCompletion`]: a SEND when the RC
//! acknowledgement says its bytes are in a receive of the peer, a receive
//! with the number of bytes that landed. Raw queues are polled, never
//! waited on (`Connection::wait` does not watch them). Each work request
//! holds an access to its local range in the domain's key table until it
//! completes, so the registration cannot go while the NIC uses it.
//!
//! [`Connection::send`]: crate::transport::Connection::send

use std::mem::MaybeUninit;
use std::sync::Arc;

use rdma_mummy_sys as sys;
use sideway::ibverbs::completion::{BasicCompletionQueue, CompletionQueue as _};
use sideway::ibverbs::queue_pair::BasicQueuePair;

use super::device::Device;
use super::{errno_err, verbs_err};
use crate::mem::{AccessToken, KeyTable};
use crate::transport::{Error, ErrorKind, WrId};

/// Longest raw SEND: rxe's `max_msg_sz` (8 MiB; verbs reports it per port,
/// which the verbs crate used here does not expose).
pub const RAW_MAX_LEN: u32 = 8 << 20;

/// Most raw SENDs, and most raw receives, posted at once per connection.
pub const RAW_MAX_DEPTH: u32 = 4096;

/// Bytes a raw SEND may carry inline in its work request (perftest's
/// default for `ib_send_lat`, 236); the queue pair asks for this much.
pub const RAW_INLINE: u32 = 236;

/// Which kind of raw work request completed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RawKind {
    /// A SEND: its bytes are in a receive of the peer.
    #[default]
    Send,
    /// A receive: a SEND of the peer landed in it.
    Recv,
    /// An RDMA WRITE ([`RdmaConnection::post_raw_write`](super::RdmaConnection::post_raw_write)):
    /// its bytes are in the peer's memory.
    Write,
}

/// One raw work request's completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawCompletion {
    /// The id it was posted with.
    pub wr_id: WrId,
    /// SEND or receive.
    pub kind: RawKind,
    /// Success, or the error class (the queue pair is then dead).
    pub status: Result<(), ErrorKind>,
    /// Bytes sent or received (0 on error).
    pub bytes: u32,
}

impl Default for RawCompletion {
    fn default() -> Self {
        RawCompletion {
            wr_id: 0,
            kind: RawKind::Send,
            status: Ok(()),
            bytes: 0,
        }
    }
}

/// Work requests of one kind in flight: their callers' ids, the accesses
/// they hold and their lengths. Indexes are the verbs `wr_id`s.
pub(super) struct Ring {
    pub(super) slots: Box<[(WrId, Option<AccessToken>, u32)]>,
    pub(super) free: Vec<u32>,
}

impl Ring {
    fn new(depth: u32) -> Ring {
        Ring {
            slots: vec![(0, None, 0); depth as usize].into_boxed_slice(),
            free: (0..depth).rev().collect(),
        }
    }

    pub(super) fn in_flight(&self) -> u32 {
        (self.slots.len() - self.free.len()) as u32
    }

    /// Ends work request `index`: its caller's id and length, its access released.
    fn finish(&mut self, index: u64, table: &KeyTable) -> Option<(WrId, u32)> {
        let slot = self.slots.get_mut(usize::try_from(index).ok()?)?;
        let token = slot.1.take()?;
        table.release(token);
        self.free.push(index as u32);
        Some((slot.0, slot.2))
    }

    fn release_all(&mut self, table: &KeyTable) {
        for slot in self.slots.iter_mut() {
            if let Some(t) = slot.1.take() {
                table.release(t);
            }
        }
    }
}

/// The raw queue pair of a connection and its two completion queues.
pub(super) struct RawQp {
    // Field order is drop order: the QP before its CQs.
    pub(super) qp: BasicQueuePair,
    send_cq: Arc<BasicCompletionQueue>,
    recv_cq: Arc<BasicCompletionQueue>,
    pub(super) sends: Ring,
    pub(super) recvs: Ring,
    pub(super) depth: u32,
    /// Bytes a SEND may carry inline (what the device granted).
    pub(super) inline_max: u32,
    pub(super) failed: Option<ErrorKind>,
}

impl RawQp {
    /// A queue pair (not yet connected) with `depth` SENDs and `depth`
    /// receives, each reported on its own completion queue (no channel:
    /// raw queues are polled).
    pub(super) fn create(dev: &Device, depth: u32) -> Result<RawQp, Error> {
        let depth = depth.clamp(1, RAW_MAX_DEPTH);
        let cq = || {
            dev.ctx
                .create_cq_builder()
                .setup_cqe(depth)
                .build()
                .map_err(|e| verbs_err("ibv_create_cq (raw)", e))
        };
        let send_cq = cq()?;
        let recv_cq = cq()?;
        let build = |inline: u32| {
            dev.pd
                .create_qp_builder()
                .setup_max_send_wr(depth)
                .setup_max_recv_wr(depth)
                .setup_max_send_sge(1)
                .setup_max_recv_sge(1)
                .setup_max_inline_data(inline)
                .setup_send_cq(send_cq.clone())
                .setup_recv_cq(recv_cq.clone())
                .build()
        };
        // A device that offers no inline data refuses the first.
        let (qp, inline_max) = match build(RAW_INLINE) {
            Ok(qp) => (qp, RAW_INLINE),
            Err(_) => (
                build(0).map_err(|e| verbs_err("ibv_create_qp (raw)", e))?,
                0,
            ),
        };
        Ok(RawQp {
            qp,
            send_cq,
            recv_cq,
            sends: Ring::new(depth),
            recvs: Ring::new(depth),
            depth,
            inline_max,
            failed: None,
        })
    }

    pub(super) fn release_all(&mut self, table: &KeyTable) {
        self.sends.release_all(table);
        self.recvs.release_all(table);
    }

    /// Polls one completion queue into `out`; returns how many.
    /// `status_kind` classifies a failed work completion's status.
    pub(super) fn poll_cq(
        &mut self,
        recv: bool,
        out: &mut [RawCompletion],
        table: &KeyTable,
        status_kind: fn(u32) -> ErrorKind,
    ) -> Result<usize, Error> {
        let mut wcs: [MaybeUninit<sys::ibv_wc>; 16] = [const { MaybeUninit::uninit() }; 16];
        let cq = if recv { &self.recv_cq } else { &self.send_cq };
        let want = out.len().min(wcs.len()) as i32;
        // SAFETY: the CQ is alive (held by self); the array has room for `want` <= 16 entries.
        let n = unsafe { sys::ibv_poll_cq(cq.cq().as_ptr(), want, wcs.as_mut_ptr().cast()) };
        if n < 0 {
            return Err(errno_err("ibv_poll_cq (raw)", -n));
        }
        let mut k = 0;
        for wc in &wcs[..n as usize] {
            // SAFETY: ibv_poll_cq initialised the first n entries.
            let wc = unsafe { wc.assume_init_ref() };
            let ring = if recv {
                &mut self.recvs
            } else {
                &mut self.sends
            };
            let Some((wr_id, len)) = ring.finish(wc.wr_id, table) else {
                continue;
            };
            let status = if wc.status == sys::ibv_wc_status::IBV_WC_SUCCESS {
                Ok(())
            } else {
                let kind = status_kind(wc.status);
                self.failed.get_or_insert(kind);
                Err(kind)
            };
            out[k] = RawCompletion {
                wr_id,
                // The opcode is defined for successful completions only; a
                // failed one is reported as the SEND queue's (it kills the
                // queue pair either way).
                kind: match (recv, wc.opcode) {
                    (true, _) => RawKind::Recv,
                    (false, sys::ibv_wc_opcode::IBV_WC_RDMA_WRITE) => RawKind::Write,
                    (false, _) => RawKind::Send,
                },
                // A SEND's completion carries no length (verbs defines
                // `byte_len` for receives only): the posted one.
                bytes: match (status, recv) {
                    (Err(_), _) => 0,
                    (Ok(()), true) => wc.byte_len,
                    (Ok(()), false) => len,
                },
                status,
            };
            k += 1;
        }
        Ok(k)
    }
}
