//! The raw-SEND (and raw WRITE) operations of a connection (`raw.rs` says
//! what raw SENDs are).

use std::ptr;

use rdma_mummy_sys as sys;
use sideway::ibverbs::queue_pair::QueuePair as _;

use super::conn::RdmaConnection;
use super::raw::{RawCompletion, RawQp, Ring, RAW_MAX_LEN};
use super::{errno_err, DomainInner};
use crate::mem::AccessToken;
use crate::transport::{Error, LocalRef, RemoteRef, WrId};

impl RdmaConnection {
    /// The raw queue pair's depth (SENDs, and receives, postable at once), if
    /// both sides configured one ([`RdmaConfig::raw_depth`](super::RdmaConfig::raw_depth)).
    pub fn raw_depth(&self) -> Option<u32> {
        self.raw.as_ref().map(|r| r.depth)
    }

    /// Bytes a raw SEND may carry inline (0 without a raw queue pair).
    pub fn raw_inline_max(&self) -> u32 {
        self.raw.as_ref().map_or(0, |r| r.inline_max)
    }

    /// Raw SENDs posted and not yet reported by [`RdmaConnection::poll_raw`].
    pub fn raw_sends_in_flight(&self) -> u32 {
        self.raw.as_ref().map_or(0, |r| r.sends.in_flight())
    }

    /// Raw receives posted and not yet reported.
    pub fn raw_recvs_posted(&self) -> u32 {
        self.raw.as_ref().map_or(0, |r| r.recvs.in_flight())
    }

    /// The domain and the raw queue pair, if it can take work (two fields
    /// borrowed apart: no reference count touched per work request).
    fn live_raw(&mut self) -> Result<(&DomainInner, &mut RawQp), Error> {
        if let Some(e) = self.dead_for_messages() {
            return Err(e);
        }
        let raw = self.raw.as_mut().ok_or(Error::Unsupported(
            "raw SEND: no raw queue pair (SYMPHONY_RDMA_RAW_DEPTH on both sides)",
        ))?;
        if raw.failed.is_some() {
            return Err(Error::PeerDisconnected);
        }
        Ok((&self.domain, raw))
    }

    /// Posts a receive of `buf` (a local registration's range, which a peer's
    /// SEND of at most `buf.len` bytes fills from its start). `QueueFull`
    /// when [`RdmaConnection::raw_depth`] receives are posted already.
    pub fn post_raw_recv(&mut self, wr_id: WrId, buf: LocalRef) -> Result<(), Error> {
        if buf.len > RAW_MAX_LEN {
            return Err(Error::TooLarge);
        }
        let (domain, raw) = self.live_raw()?;
        let Some(&index) = raw.recvs.free.last() else {
            return Err(Error::QueueFull);
        };
        let token = domain.acquire_local(buf.key, buf.offset, buf.len)?;
        let mut sge = sys::ibv_sge {
            addr: buf.offset,
            length: buf.len,
            lkey: buf.key,
        };
        let mut wr = sys::ibv_recv_wr {
            wr_id: u64::from(index),
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad = ptr::null_mut();
        // SAFETY: the QP is alive (owned by self); `wr` and `sge` outlive the call;
        // the range was checked against a live LOCAL_WRITE registration whose
        // access token is held until the receive completes.
        let rc = unsafe { sys::ibv_post_recv(raw.qp.qp().as_ptr(), &mut wr, &mut bad) };
        book_post(domain, &mut raw.recvs, index, (wr_id, token, buf.len), rc, "ibv_post_recv (raw)")
    }

    /// Posts a SEND of `src` (a local registration's range, at most
    /// [`RAW_MAX_LEN`] bytes) into the peer's next posted receive; with
    /// `inline` and at most [`RdmaConnection::raw_inline_max`] bytes the bytes
    /// go in the work request itself. The peer's NIC retries while it has no
    /// receive posted (receiver not ready). `QueueFull` when
    /// [`RdmaConnection::raw_depth`] SENDs are in flight.
    pub fn post_raw_send(&mut self, wr_id: WrId, src: LocalRef, inline: bool) -> Result<(), Error> {
        self.post_raw_out(wr_id, src, None, inline)
    }

    /// Posts an RDMA WRITE of `src` (a local registration's range, at most
    /// [`RAW_MAX_LEN`] bytes) into `target`, a range the peer registered
    /// remote-writable and told us about (its NIC checks the key and the
    /// bounds: a bad one fails the WRITE's completion and the raw queue
    /// pair). With `inline` and at most [`RdmaConnection::raw_inline_max`]
    /// bytes the bytes go in the work request itself. Reported by
    /// [`RdmaConnection::poll_raw`] as a [`RawKind::Write`](super::RawKind::Write)
    /// when the RC acknowledgement is in; shares the SENDs' ring, so
    /// `QueueFull` when [`RdmaConnection::raw_depth`] SENDs and WRITEs are in flight.
    pub fn post_raw_write(
        &mut self,
        wr_id: WrId,
        src: LocalRef,
        target: RemoteRef,
        inline: bool,
    ) -> Result<(), Error> {
        if src.len > target.len {
            return Err(Error::OutOfBounds);
        }
        self.post_raw_out(wr_id, src, Some(target), inline)
    }

    /// One signalled work request on the raw send queue: a SEND of `src`,
    /// or with `write_to` an RDMA WRITE of it there.
    fn post_raw_out(&mut self, wr_id: WrId, src: LocalRef, write_to: Option<RemoteRef>, inline: bool) -> Result<(), Error> {
        if src.len > RAW_MAX_LEN {
            return Err(Error::TooLarge);
        }
        let (domain, raw) = self.live_raw()?;
        let Some(&index) = raw.sends.free.last() else {
            return Err(Error::QueueFull);
        };
        let token = domain.acquire_local(src.key, src.offset, src.len)?;
        let mut sge = sys::ibv_sge {
            addr: src.offset,
            length: src.len,
            lkey: src.key,
        };
        // SAFETY: ibv_send_wr is a plain C struct; all-zero is a valid value.
        let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = u64::from(index);
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = sys::ibv_wr_opcode::IBV_WR_SEND;
        wr.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        if inline && src.len <= raw.inline_max {
            wr.send_flags |= sys::ibv_send_flags::IBV_SEND_INLINE.0;
        }
        if let Some(target) = write_to {
            wr.opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE;
            wr.wr.rdma = sys::rdma_t {
                remote_addr: target.offset,
                rkey: target.key,
            };
        }
        let mut bad = ptr::null_mut();
        // SAFETY: the QP is alive; `wr`/`sge` outlive the call; the source range was
        // checked against a live registration whose access token is held until the
        // work request completes (an inline one's bytes are copied during the call).
        // A WRITE's target is the peer's memory, checked by the peer's NIC against its key.
        let rc = unsafe { sys::ibv_post_send(raw.qp.qp().as_ptr(), &mut wr, &mut bad) };
        let what = if write_to.is_some() { "ibv_post_send (raw WRITE)" } else { "ibv_post_send (raw)" };
        book_post(domain, &mut raw.sends, index, (wr_id, token, src.len), rc, what)
    }

    /// Takes completed raw work requests, receives first, into `out`; returns
    /// how many. A failed one kills the raw queue pair (later posts are
    /// refused); the control queue pair is not touched.
    pub fn poll_raw(&mut self, out: &mut [RawCompletion]) -> Result<usize, Error> {
        self.poll_raw_queues(out, true)
    }

    /// [`RdmaConnection::poll_raw`] for receives only: one completion-queue
    /// poll where a caller waits for a receive (a latency ping-pong); SEND
    /// completions stay queued until a `poll_raw` (each holds its slot and
    /// access until then, so `QueueFull` says when to reap them).
    pub fn poll_raw_recvs(&mut self, out: &mut [RawCompletion]) -> Result<usize, Error> {
        self.poll_raw_queues(out, false)
    }

    fn poll_raw_queues(&mut self, out: &mut [RawCompletion], sends: bool) -> Result<usize, Error> {
        let domain = &self.domain;
        let Some(raw) = self.raw.as_mut() else {
            return Err(Error::Unsupported("raw SEND: no raw queue pair"));
        };
        let mut n = raw.poll_cq(true, out, &domain.table, RdmaConnection::status_kind)?;
        if sends {
            n += raw.poll_cq(
                false,
                &mut out[n..],
                &domain.table,
                RdmaConnection::status_kind,
            )?;
        }
        if n == 0 {
            self.check_peer(false);
            if let Some(e) = self.dead_for_messages() {
                return Err(e);
            }
        }
        Ok(n)
    }
}

/// Books a post call's outcome (`rc`) on `ring`: posted, slot `index` holds
/// (wr_id, token, len) until its completion; refused, the access token goes
/// back (a full queue is `QueueFull`).
fn book_post(
    domain: &DomainInner,
    ring: &mut Ring,
    index: u32,
    (wr_id, token, len): (WrId, AccessToken, u32),
    rc: i32,
    call: &str,
) -> Result<(), Error> {
    if rc != 0 {
        domain.table.release(token);
        return Err(if rc == libc::ENOMEM { Error::QueueFull } else { errno_err(call, rc) });
    }
    ring.free.pop();
    ring.slots[index as usize] = (wr_id, Some(token), len);
    Ok(())
}
