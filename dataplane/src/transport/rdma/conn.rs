//! One RC queue pair: the bootstrap over TCP, control messages by SEND into
//! pre-posted receive slots, one-sided READs (and WRITEs) as work requests.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::mem::MaybeUninit;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::ptr;
use std::sync::Arc;

use rdma_mummy_sys as sys;
use sideway::ibverbs::address::{AddressHandleAttribute, Gid};
use sideway::ibverbs::completion::{BasicCompletionQueue, CompletionQueue as _};
use sideway::ibverbs::device_context::Mtu;
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::queue_pair::{
    BasicQueuePair, QueuePair as _, QueuePairAttribute, QueuePairState,
};
use sideway::ibverbs::AccessFlags;

use super::device::Device;
use super::raw::RawQp;
use super::wake::{CqWake, WaitFd};
use super::{
    errno_err, verbs_err, DomainInner, MAX_READ_LEN, PEER_CHECK_EVERY, PEER_CHECK_EVERY_ARMED,
    POST_BATCH,
};
use crate::mem::AccessToken;
use crate::time::Duration;
use crate::transport::{
    Completion, Connection, Error, ErrorKind, LocalRef, ReadOp, RemoteRef, WrId,
};

/// What each side sends the other over the bootstrap socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct QpEndpoint {
    qpn: u32,
    psn: u32,
    lid: u16,
    gid: [u8; 16],
    /// Active MTU, verbs enum value 1..=5.
    mtu: u8,
    /// READs this side serves at once as responder (its `max_dest_rd_atomic`):
    /// the most the peer may have on the wire towards it.
    resp_depth: u8,
    /// Largest control message this side sends and receives.
    max_msg_len: u32,
    /// This side's raw queue pair ([`NO_RAW`] without one) and its first PSN.
    raw_qpn: u32,
    raw_psn: u32,
}

/// `raw_qpn` of a side without a raw queue pair.
const NO_RAW: u32 = u32::MAX;

/// "SYRD" + version 3 (1 had one READ depth for both directions, 2 no raw queue pair).
const BOOTSTRAP_MAGIC: u32 = u32::from_le_bytes(*b"SYRD");
const BOOTSTRAP_VERSION: u8 = 3;

impl QpEndpoint {
    const LEN: usize = 4 + 1 + 4 + 4 + 2 + 16 + 1 + 1 + 4 + 4 + 4;

    fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&BOOTSTRAP_MAGIC.to_le_bytes());
        b[4] = BOOTSTRAP_VERSION;
        b[5..9].copy_from_slice(&self.qpn.to_le_bytes());
        b[9..13].copy_from_slice(&self.psn.to_le_bytes());
        b[13..15].copy_from_slice(&self.lid.to_le_bytes());
        b[15..31].copy_from_slice(&self.gid);
        b[31] = self.mtu;
        b[32] = self.resp_depth;
        b[33..37].copy_from_slice(&self.max_msg_len.to_le_bytes());
        b[37..41].copy_from_slice(&self.raw_qpn.to_le_bytes());
        b[41..45].copy_from_slice(&self.raw_psn.to_le_bytes());
        b
    }

    /// Decodes and validates the peer's bytes; never panics.
    fn decode(b: &[u8; Self::LEN]) -> Result<Self, Error> {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        if u32_at(0) != BOOTSTRAP_MAGIC {
            return Err(Error::Protocol(crate::wire::WireError::BadMagic));
        }
        if b[4] != BOOTSTRAP_VERSION {
            return Err(Error::Protocol(crate::wire::WireError::BadVersion(
                u16::from(b[4]),
            )));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[15..31]);
        let e = QpEndpoint {
            qpn: u32_at(5),
            psn: u32_at(9),
            lid: u16::from_le_bytes([b[13], b[14]]),
            gid,
            mtu: b[31],
            resp_depth: b[32],
            max_msg_len: u32_at(33),
            raw_qpn: u32_at(37),
            raw_psn: u32_at(41),
        };
        let raw_ok = e.raw_qpn == NO_RAW || (e.raw_qpn < 1 << 24 && e.raw_psn < 1 << 24);
        let valid = e.qpn < 1 << 24
            && e.psn < 1 << 24
            && (1..=5).contains(&e.mtu)
            && e.resp_depth > 0
            && raw_ok;
        if !valid {
            return Err(Error::Protocol(crate::wire::WireError::BadLength));
        }
        Ok(e)
    }
}

fn mtu_from_wire(v: u8) -> Mtu {
    match v {
        1 => Mtu::Mtu256,
        2 => Mtu::Mtu512,
        3 => Mtu::Mtu1024,
        4 => Mtu::Mtu2048,
        _ => Mtu::Mtu4096,
    }
}

/// `wr_id` tag of SEND work requests; READs use their record index.
const WR_SEND: u64 = 1 << 63;

/// A READ or WRITE in flight: what to report and what to release on completion.
#[derive(Clone, Copy, Default)]
struct ReadRecord {
    wr_id: u64,
    token: Option<AccessToken>,
    len: u32,
}

/// One RDMA WRITE (see [`RdmaConnection::post_writes`]).
#[derive(Clone, Copy, Debug)]
pub struct WriteOp {
    /// Returned in the completion.
    pub wr_id: WrId,
    /// What to write: `target.len` bytes from here (a local registration).
    pub source: LocalRef,
    /// Where: the peer's remote-writable registration.
    pub target: RemoteRef,
}

/// A READ or WRITE to build a work request from: the transfer is `remote.len`
/// bytes between `local` and `remote`, in the direction `opcode` says.
struct Transfer {
    wr_id: WrId,
    local: LocalRef,
    remote: RemoteRef,
    opcode: sys::ibv_wr_opcode::Type,
}

/// A new connection's completion queues (each with its wake-up channel) and QP.
struct Queues {
    qp: BasicQueuePair,
    send_cq: Arc<BasicCompletionQueue>,
    recv_cq: Arc<BasicCompletionQueue>,
    send_wake: CqWake,
    recv_wake: CqWake,
}

impl Queues {
    fn create(dev: &Device, sq_depth: u32, recv_slots: u32) -> Result<Queues, Error> {
        let send_wake = CqWake::new(&dev.ctx)?;
        let recv_wake = CqWake::new(&dev.ctx)?;
        let cq = |cqe: u32, wake: &CqWake| {
            dev.ctx
                .create_cq_builder()
                .setup_cqe(cqe)
                .setup_comp_channel(wake.channel(), 0)
                .build()
                .map_err(|e| verbs_err("ibv_create_cq", e))
        };
        let send_cq = cq(sq_depth, &send_wake)?;
        let recv_cq = cq(recv_slots, &recv_wake)?;
        let qp = dev
            .pd
            .create_qp_builder()
            .setup_max_send_wr(sq_depth)
            .setup_max_recv_wr(recv_slots)
            .setup_max_send_sge(1)
            .setup_max_recv_sge(1)
            .setup_send_cq(send_cq.clone())
            .setup_recv_cq(recv_cq.clone())
            .build()
            .map_err(|e| verbs_err("ibv_create_qp", e))?;
        Ok(Queues {
            qp,
            send_cq,
            recv_cq,
            send_wake,
            recv_wake,
        })
    }
}

/// Registers a connection's SEND or receive slots (local write only).
///
/// # Safety
/// `buf`'s heap memory must outlive the returned region.
unsafe fn register_slots(dev: &Device, buf: &mut [u8]) -> Result<Arc<MemoryRegion>, Error> {
    // SAFETY: the caller keeps the memory alive for the region's life.
    unsafe {
        dev.pd.reg_mr(
            buf.as_mut_ptr() as usize,
            buf.len(),
            AccessFlags::LocalWrite,
        )
    }
    .map_err(|e| verbs_err("ibv_reg_mr", e))
}

/// The first PSN of queue pair `qpn`: any 24-bit start works; derived from
/// the QPN so that runs are reproducible.
fn first_psn(qpn: u32) -> u32 {
    qpn.wrapping_mul(0x9E37_79B1) & 0x00ff_ffff
}

/// Moves a new QP to INIT.
fn qp_to_init(qp: &mut BasicQueuePair, dev: &Device) -> Result<(), Error> {
    let mut attr = QueuePairAttribute::new();
    attr.setup_state(QueuePairState::Init)
        .setup_pkey_index(0)
        .setup_port(dev.port)
        // Which regions a peer may READ or WRITE is decided per MR; the QP must
        // allow the kind (a serving region grants REMOTE_READ only).
        .setup_access_flags(
            AccessFlags::LocalWrite | AccessFlags::RemoteRead | AccessFlags::RemoteWrite,
        );
    qp.modify(&attr).map_err(|e| verbs_err("QP to INIT", e))
}

/// Moves `qp` to RTR towards the peer's queue pair `(qpn, psn)` at `remote`'s
/// address, then to RTS with send PSN `sq_psn`; `depths` = (responder,
/// initiator) READ depth.
fn connect_qp(
    qp: &mut BasicQueuePair,
    domain: &DomainInner,
    remote: &QpEndpoint,
    (dest_qpn, rq_psn): (u32, u32),
    sq_psn: u32,
    (resp_depth, init_depth): (u8, u8),
) -> Result<(), Error> {
    let dev = &domain.dev;
    let mut ah = AddressHandleAttribute::new();
    ah.setup_dest_lid(remote.lid)
        .setup_port(dev.port)
        .setup_grh(&Gid { raw: remote.gid }, 0, dev.gid_index, 64, 0);
    let mut attr = QueuePairAttribute::new();
    attr.setup_state(QueuePairState::ReadyToReceive)
        .setup_path_mtu(dev.mtu.min(mtu_from_wire(remote.mtu)))
        .setup_dest_qp_num(dest_qpn)
        .setup_rq_psn(rq_psn)
        .setup_max_dest_read_atomic(resp_depth)
        // 12 = 0.64 ms before a sender retries after a receive-not-ready NAK
        .setup_min_rnr_timer(12)
        .setup_address_vector(&ah);
    qp.modify(&attr).map_err(|e| verbs_err("QP to RTR", e))?;

    let mut attr = QueuePairAttribute::new();
    attr.setup_state(QueuePairState::ReadyToSend)
        .setup_sq_psn(sq_psn)
        .setup_timeout(domain.cfg.ack_timeout.clamp(1, 31))
        // 6, not 7: rxe treats 7 as "retry forever", and a vanished peer must
        // end outstanding READs with an error (7 ACK timeouts: ~1.9 s by default)
        .setup_retry_cnt(6)
        // 7 = retry forever on RNR: a full receive ring back-pressures the sender
        .setup_rnr_retry(7)
        // READs posted beyond this wait in the send queue (see `read_depth`).
        .setup_max_read_atomic(init_depth);
    qp.modify(&attr).map_err(|e| verbs_err("QP to RTS", e))
}

/// Neither side sends before both are ready to receive: one byte each way.
fn barrier(sock: &mut TcpStream) -> Result<(), Error> {
    sock.write_all(&[0xA5])?;
    let mut b = [0u8; 1];
    sock.read_exact(&mut b)?;
    if b[0] != 0xA5 {
        return Err(Error::Protocol(crate::wire::WireError::BadMagic));
    }
    Ok(())
}

/// One RC queue pair to a peer. Used by one thread at a time; allocation-free once built.
pub struct RdmaConnection {
    // Field order is drop order: the QPs first (no more DMA), then the registrations,
    // then the buffers they cover, then the CQs and the domain.
    /// The raw-SEND queue pair (`raw.rs`), when both sides configured one.
    pub(super) raw: Option<RawQp>,
    qp: BasicQueuePair,
    recv_mr: Arc<MemoryRegion>,
    send_mr: Arc<MemoryRegion>,
    recv_buf: Box<[u8]>,
    send_buf: Box<[u8]>,
    send_cq: Arc<BasicCompletionQueue>,
    recv_cq: Arc<BasicCompletionQueue>,
    pub(super) domain: Arc<DomainInner>,
    sock: TcpStream,
    /// Completion-channel state of each queue (event-driven idling) and the fd
    /// over both channels and `sock` that idle callers sleep on.
    send_wake: CqWake,
    recv_wake: CqWake,
    wait: WaitFd,
    slot_len: usize,
    /// Largest message the peer accepts.
    peer_max_msg: usize,
    send_slots: u32,
    /// Next send slot; slots are reused in order and SEND completions arrive in order,
    /// so `sends_in_flight` alone tells which slots are busy.
    send_next: u32,
    sends_in_flight: u32,
    /// A received message not yet handed out (it did not fit the caller's buffer,
    /// or `wait` found it): (slot, length).
    pending_recv: Option<(u32, usize)>,
    records: Box<[ReadRecord]>,
    free_records: Vec<u32>,
    done: VecDeque<Completion>,
    max_reads: u32,
    empty_polls: u32,
    peer_gone: bool,
    /// Polls that find nothing arm the completion queues (see `wake`); off
    /// with [`RdmaConfig::busy_poll`](super::RdmaConfig::busy_poll).
    arm_in_polls: bool,
    /// Why the QP stopped working (a failed work completion puts it in the error state).
    failed: Option<ErrorKind>,
}

impl std::fmt::Debug for RdmaConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaConnection")
            .field("device", &self.domain.dev.name)
            .field("qpn", &self.qp.qp_number())
            .field(
                "reads_in_flight",
                &(self.max_reads as usize - self.free_records.len()),
            )
            .field("failed", &self.failed)
            .finish()
    }
}

impl RdmaConnection {
    /// Creates the QP, swaps endpoints over `sock`, connects (INIT, RTR, RTS) and meets
    /// the peer at a barrier. `sock` is filled in by the caller afterwards.
    pub(super) fn establish(
        domain: Arc<DomainInner>,
        sock: &mut TcpStream,
    ) -> Result<RdmaConnection, Error> {
        let cfg = &domain.cfg;
        let dev = &domain.dev;
        let slot_len = cfg.max_msg_len.max(64) as usize;
        let max_reads = cfg.max_reads_in_flight.clamp(1, 128);
        let depth = u8::try_from(cfg.read_depth.clamp(1, 255)).unwrap_or(1);
        // What we serve at once as responder, granted to the peer.
        let resp_depth = depth.min(dev.max_resp_reads);
        let recv_slots = cfg.recv_slots.max(1);
        let send_slots = cfg.send_slots.max(1);
        let queues = Queues::create(dev, send_slots + max_reads, recv_slots)?;
        let mut recv_buf = vec![0u8; slot_len * recv_slots as usize].into_boxed_slice();
        let mut send_buf = vec![0u8; slot_len * send_slots as usize].into_boxed_slice();
        // SAFETY: both buffers move into the connection, whose field order drops the
        // registrations before the buffers; a Box's heap memory does not move with it.
        let recv_mr = unsafe { register_slots(dev, &mut recv_buf) }?;
        // SAFETY: as above.
        let send_mr = unsafe { register_slots(dev, &mut send_buf) }?;
        let Queues {
            mut qp,
            send_cq,
            recv_cq,
            send_wake,
            recv_wake,
        } = queues;
        qp_to_init(&mut qp, dev)?;
        let mut raw = (cfg.raw_depth > 0)
            .then(|| RawQp::create(dev, cfg.raw_depth))
            .transpose()?;
        if let Some(r) = raw.as_mut() {
            qp_to_init(&mut r.qp, dev)?;
        }
        let qpn = qp.qp_number();
        let psn = first_psn(qpn);
        let raw_qpn = raw.as_ref().map_or(NO_RAW, |r| r.qp.qp_number());
        let local = QpEndpoint {
            qpn,
            psn,
            lid: dev.lid,
            gid: dev.gid,
            mtu: dev.mtu as u8,
            resp_depth,
            max_msg_len: slot_len as u32,
            raw_qpn,
            raw_psn: first_psn(raw_qpn),
        };
        sock.write_all(&local.encode())?;
        let mut buf = [0u8; QpEndpoint::LEN];
        sock.read_exact(&mut buf)?;
        let remote = QpEndpoint::decode(&buf)?;

        let conn_sock = sock.try_clone()?;
        let wait = WaitFd::new(&send_wake, &recv_wake, conn_sock.as_raw_fd())?;
        if remote.raw_qpn == NO_RAW {
            raw = None;
        }
        let mut conn = RdmaConnection {
            raw,
            qp,
            recv_mr,
            send_mr,
            recv_buf,
            send_buf,
            send_cq,
            recv_cq,
            domain: domain.clone(),
            sock: conn_sock,
            send_wake,
            recv_wake,
            wait,
            slot_len,
            peer_max_msg: remote.max_msg_len as usize,
            send_slots,
            send_next: 0,
            sends_in_flight: 0,
            pending_recv: None,
            records: vec![ReadRecord::default(); max_reads as usize].into_boxed_slice(),
            free_records: (0..max_reads).rev().collect(),
            done: VecDeque::with_capacity(max_reads as usize),
            max_reads,
            empty_polls: 0,
            peer_gone: false,
            arm_in_polls: !cfg.busy_poll,
            failed: None,
        };
        // Receives go up before RTR, so the peer's first SEND finds one.
        for slot in 0..recv_slots {
            conn.post_recv_slot(slot)?;
        }
        // READs on the wire as initiator: never more than the peer serves at once.
        let init_depth = depth.min(dev.max_init_reads).min(remote.resp_depth);
        let (ours, theirs) = ((remote.qpn, remote.psn), psn);
        connect_qp(
            &mut conn.qp,
            &conn.domain,
            &remote,
            ours,
            theirs,
            (resp_depth, init_depth),
        )?;
        if let Some(r) = conn.raw.as_mut() {
            // SENDs only: no READ depth either way.
            let peer = (remote.raw_qpn, remote.raw_psn);
            connect_qp(
                &mut r.qp,
                &conn.domain,
                &remote,
                peer,
                first_psn(raw_qpn),
                (1, 1),
            )?;
        }
        barrier(sock)?;
        Ok(conn)
    }

    /// Largest control message this connection carries.
    pub fn max_msg_len(&self) -> usize {
        self.slot_len.min(self.peer_max_msg)
    }

    /// Why new READs are refused, if they are: after a remote access error the
    /// queue pair is gone and later READs report that same error (they would have
    /// been refused for it); after anything else the peer counts as gone.
    fn dead(&self) -> Option<Error> {
        match self.failed {
            Some(k @ (ErrorKind::BadKey | ErrorKind::OutOfBounds | ErrorKind::Timeout)) => {
                Some(Error::from(k))
            }
            Some(_) => Some(Error::PeerDisconnected),
            None => self.peer_gone.then_some(Error::PeerDisconnected),
        }
    }

    /// Why messages can no longer flow, if so.
    pub(super) fn dead_for_messages(&self) -> Option<Error> {
        (self.failed.is_some() || self.peer_gone).then_some(Error::PeerDisconnected)
    }

    fn post_recv_slot(&mut self, slot: u32) -> Result<(), Error> {
        let mut sge = sys::ibv_sge {
            addr: self.recv_buf.as_ptr() as u64 + u64::from(slot) * self.slot_len as u64,
            length: self.slot_len as u32,
            lkey: self.recv_mr.lkey(),
        };
        let mut wr = sys::ibv_recv_wr {
            wr_id: u64::from(slot),
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad = ptr::null_mut();
        // SAFETY: the QP is alive (owned by self); `wr` and `sge` outlive the call; the
        // slot lies inside recv_buf, registered by recv_mr, both outliving the QP.
        let rc = unsafe { sys::ibv_post_recv(self.qp.qp().as_ptr(), &mut wr, &mut bad) };
        if rc != 0 {
            return Err(errno_err("ibv_post_recv", rc));
        }
        Ok(())
    }

    pub(super) fn status_kind(status: u32) -> ErrorKind {
        use sys::ibv_wc_status as s;
        match status {
            s::IBV_WC_REM_ACCESS_ERR => ErrorKind::BadKey,
            s::IBV_WC_LOC_PROT_ERR | s::IBV_WC_LOC_LEN_ERR => ErrorKind::OutOfBounds,
            s::IBV_WC_REM_INV_REQ_ERR => ErrorKind::OutOfBounds,
            s::IBV_WC_RETRY_EXC_ERR | s::IBV_WC_RNR_RETRY_EXC_ERR | s::IBV_WC_WR_FLUSH_ERR => {
                ErrorKind::PeerDisconnected
            }
            s::IBV_WC_RESP_TIMEOUT_ERR => ErrorKind::Timeout,
            _ => ErrorKind::Io,
        }
    }

    /// Drains the send CQ: frees SEND slots, turns READ completions into `Completion`s.
    fn drain_send_cq(&mut self, arm: bool) -> Result<(), Error> {
        let mut wcs: [MaybeUninit<sys::ibv_wc>; 16] = [const { MaybeUninit::uninit() }; 16];
        loop {
            // SAFETY: the CQ is alive (held by self); the array has room for 16 entries.
            let n = unsafe {
                sys::ibv_poll_cq(self.send_cq.cq().as_ptr(), 16, wcs.as_mut_ptr().cast())
            };
            if n < 0 {
                return Err(errno_err("ibv_poll_cq", -n));
            }
            if n == 0 {
                // Drained: arm the channel, then poll once more (see `wake`). Only an
                // empty poll arms: a caller that always finds work (a busy-polled READ
                // that completes inside its doorbell, as on rxe) never pays for it.
                // SAFETY: the pointer is only used while self holds the CQ.
                let cq = unsafe { self.send_cq.cq() }.as_ptr();
                if arm && self.send_wake.arm_when_empty(cq)? {
                    continue;
                }
                return Ok(());
            }
            self.send_wake.note_work();
            for wc in &wcs[..n as usize] {
                // SAFETY: ibv_poll_cq initialised the first n entries.
                let wc = unsafe { wc.assume_init_ref() };
                let ok = wc.status == sys::ibv_wc_status::IBV_WC_SUCCESS;
                if !ok && self.failed.is_none() {
                    self.failed = Some(Self::status_kind(wc.status));
                }
                // A flushed work request died of the QP's first error: report that one.
                let kind = match (wc.status, self.failed) {
                    (sys::ibv_wc_status::IBV_WC_WR_FLUSH_ERR, Some(first)) => first,
                    _ => Self::status_kind(wc.status),
                };
                if wc.wr_id & WR_SEND != 0 {
                    self.sends_in_flight = self.sends_in_flight.saturating_sub(1);
                    continue;
                }
                let Some(rec) = self.records.get(wc.wr_id as usize).copied() else {
                    continue;
                };
                if let Some(t) = rec.token {
                    self.domain.table.release(t);
                }
                self.free_records.push(wc.wr_id as u32);
                self.done.push_back(Completion {
                    wr_id: rec.wr_id,
                    status: if ok { Ok(()) } else { Err(kind) },
                    bytes: if ok { rec.len } else { 0 },
                });
            }
            if (n as usize) < wcs.len() {
                return Ok(());
            }
        }
    }

    /// Before telling a caller "nothing" (after which it may sleep on the wait fd):
    /// drains the send queue until it is armed, or until a READ completion turns
    /// up for the caller. A drain that found only SEND completions does not arm.
    ///
    /// The queue is polled even when it is armed already: a completion that
    /// landed since the arm has raised its event, which keeps the wait fd
    /// readable until a poll finds the completion and the next arm consumes
    /// the event. A caller that only receives never polls the send queue
    /// otherwise, so a SEND that completed after the arm (netbench's server
    /// answering a hello, then idling with `wait`) made every later `wait`
    /// return at once: the idle server spun through epoll and socket peeks
    /// (in a Soft-RoCE guest, 1.2 s of CPU in 2.2 s, 0.8 s of it in the kernel)
    /// beside the READ and WRITE streams it was meant to leave alone.
    fn arm_send_if_idle(&mut self) -> Result<(), Error> {
        if self.done.is_empty() {
            self.drain_send_cq(true)?;
        }
        while !self.send_wake.armed() && self.done.is_empty() {
            self.drain_send_cq(true)?;
        }
        Ok(())
    }

    /// The next receive completion: `(slot, length)`, or None once the receive
    /// queue is empty (then armed).
    fn poll_recv_cq(&mut self, arm: bool) -> Result<Option<(u32, usize)>, Error> {
        loop {
            let mut wc = MaybeUninit::<sys::ibv_wc>::uninit();
            // SAFETY: the CQ is alive; room for one entry.
            let n = unsafe { sys::ibv_poll_cq(self.recv_cq.cq().as_ptr(), 1, wc.as_mut_ptr()) };
            if n < 0 {
                return Err(errno_err("ibv_poll_cq", -n));
            }
            if n == 0 {
                // SAFETY: the pointer is only used while self holds the CQ.
                let cq = unsafe { self.recv_cq.cq() }.as_ptr();
                if arm && self.recv_wake.arm_when_empty(cq)? {
                    continue;
                }
                return Ok(None);
            }
            self.recv_wake.note_work();
            // SAFETY: n == 1, so the entry is initialised.
            let wc = unsafe { wc.assume_init() };
            if wc.status != sys::ibv_wc_status::IBV_WC_SUCCESS {
                // Flushed receives after the QP failed: report the connection as dead.
                if self.failed.is_none() {
                    self.failed = Some(Self::status_kind(wc.status));
                }
                return Err(Error::PeerDisconnected);
            }
            let slot = u32::try_from(wc.wr_id)
                .map_err(|_| errno_err("bad receive wr_id", libc::EINVAL))?;
            return Ok(Some((slot, (wc.byte_len as usize).min(self.slot_len))));
        }
    }

    /// Every `PEER_CHECK_EVERY` calls, looks for EOF on the bootstrap socket.
    pub(super) fn check_peer(&mut self, force: bool) {
        if self.peer_gone {
            return;
        }
        self.empty_polls += 1;
        let every = if self.send_wake.armed() && self.recv_wake.armed() {
            PEER_CHECK_EVERY_ARMED
        } else {
            PEER_CHECK_EVERY
        };
        if !force && self.empty_polls < every {
            return;
        }
        self.empty_polls = 0;
        let mut b = [0u8; 1];
        match self.sock.peek(&mut b) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            // EOF; bytes after the barrier (which break the protocol); a reset.
            Ok(_) | Err(_) => self.peer_gone = true,
        }
        // The peer is gone: move the QP to the error state so that outstanding work
        // requests flush now (READs with an error completion) instead of after the
        // retry budget. Receives that already completed stay ahead of the flush, and
        // the peer waited for its SENDs to complete before it closed the socket.
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::Error);
        let _ = self.qp.modify(&attr);
    }

    /// SENDs posted and not yet completed (the RC acknowledgement: the message
    /// is in a receive slot of the peer), after reaping what has completed.
    /// netbench's SEND bandwidth test completes its operations by this, as
    /// perftest's `ib_send_bw` does by its SEND work completions.
    pub fn sends_in_flight(&mut self) -> Result<u32, Error> {
        self.drain_send_cq(self.arm_in_polls)?;
        Ok(self.sends_in_flight)
    }

    /// Posts RDMA WRITEs: each copies `source` (a local registration's bytes) into
    /// the peer's `target`, a region it registered with [`Access::REMOTE_WRITE`]
    /// (a serving region does not: its NIC refuses the WRITE and the connection
    /// fails with `BadKey`). WRITEs share the READs' work-request budget
    /// ([`Connection::max_outstanding_reads`]) and report through
    /// [`Connection::poll_completions`]. Returns how many were posted, as
    /// [`Connection::post_reads`] does.
    ///
    /// [`Access::REMOTE_WRITE`]: crate::mem::Access::REMOTE_WRITE
    pub fn post_writes(&mut self, ops: &[WriteOp]) -> Result<usize, Error> {
        self.post_transfers(ops, |op| Transfer {
            wr_id: op.wr_id,
            local: op.source,
            remote: op.target,
            opcode: sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
        })
    }

    /// Posts `ops` as READs or WRITEs, up to `POST_BATCH` per doorbell; returns
    /// how many were posted (an error only when none was).
    fn post_transfers<T>(
        &mut self,
        ops: &[T],
        transfer: impl Fn(&T) -> Transfer,
    ) -> Result<usize, Error> {
        if ops.len() > self.free_records.len() {
            self.drain_send_cq(self.arm_in_polls)?;
        }
        let mut accepted = 0;
        for chunk in ops.chunks(POST_BATCH) {
            // Only the entries used are written: zeroing all 16 WRs (2 KiB) per call is
            // measurable on a single READ (and very much so under emulation).
            let mut sges = [const { MaybeUninit::<sys::ibv_sge>::uninit() }; POST_BATCH];
            let mut wrs = [const { MaybeUninit::<sys::ibv_send_wr>::uninit() }; POST_BATCH];
            let mut n = 0;
            let mut refused = None;
            for op in chunk {
                match self.prepare(&transfer(op)) {
                    Ok((wr, sge)) => {
                        wrs[n].write(wr);
                        sges[n].write(sge);
                        n += 1;
                    }
                    Err(e) => {
                        refused = Some(e);
                        break;
                    }
                }
            }
            if n > 0 {
                // SAFETY: the first n entries of both arrays were written just above.
                let (wrs, sges) = unsafe {
                    (
                        std::slice::from_raw_parts_mut(
                            wrs.as_mut_ptr().cast::<sys::ibv_send_wr>(),
                            n,
                        ),
                        std::slice::from_raw_parts_mut(sges.as_mut_ptr().cast::<sys::ibv_sge>(), n),
                    )
                };
                if let Err((taken, e)) = self.post_chain(wrs, sges) {
                    accepted += taken;
                    return if accepted == 0 { Err(e) } else { Ok(accepted) };
                }
                accepted += n;
            }
            if let Some(e) = refused {
                return if accepted == 0 { Err(e) } else { Ok(accepted) };
            }
        }
        Ok(accepted)
    }

    /// Validates one READ or WRITE, takes a record for it and builds its work
    /// request (whose `sg_list` the caller points at the returned SGE).
    fn prepare(&mut self, w: &Transfer) -> Result<(sys::ibv_send_wr, sys::ibv_sge), Error> {
        if let Some(e) = self.dead() {
            return Err(e);
        }
        if w.remote.len > MAX_READ_LEN {
            return Err(Error::TooLarge);
        }
        if w.remote.len > w.local.len {
            return Err(Error::OutOfBounds);
        }
        // Completions not yet handed out count too: that bounds `done` (no growth).
        if self.outstanding_reads() >= self.max_reads as usize {
            return Err(Error::QueueFull);
        }
        let Some(&index) = self.free_records.last() else {
            return Err(Error::QueueFull);
        };
        let token = self
            .domain
            .acquire_local(w.local.key, w.local.offset, w.remote.len)?;
        self.free_records.pop();
        self.records[index as usize] = ReadRecord {
            wr_id: w.wr_id,
            token: Some(token),
            len: w.remote.len,
        };
        let sge = sys::ibv_sge {
            addr: w.local.offset,
            length: w.remote.len,
            lkey: w.local.key,
        };
        // SAFETY: ibv_send_wr is a plain C struct; all-zero is a valid value.
        let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = u64::from(index);
        wr.num_sge = 1;
        wr.opcode = w.opcode;
        wr.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        wr.wr.rdma = sys::rdma_t {
            remote_addr: w.remote.offset,
            rkey: w.remote.key,
        };
        Ok((wr, sge))
    }

    /// Undoes `prepare` for WRs that were built but not posted.
    fn unprepare(&mut self, wrs: &[sys::ibv_send_wr]) {
        for wr in wrs {
            let index = wr.wr_id as usize;
            if let Some(t) = self.records[index].token.take() {
                self.domain.table.release(t);
            }
            self.free_records.push(index as u32);
        }
    }

    /// Posts `wrs` (with `sges`, same length) as one linked list; on failure unwinds
    /// the ones the provider did not take and returns how many it took.
    fn post_chain(
        &mut self,
        wrs: &mut [sys::ibv_send_wr],
        sges: &mut [sys::ibv_sge],
    ) -> Result<(), (usize, Error)> {
        let n = wrs.len().min(sges.len());
        for i in 0..n {
            wrs[i].sg_list = &mut sges[i];
            wrs[i].next = if i + 1 < n {
                &mut wrs[i + 1]
            } else {
                ptr::null_mut()
            };
        }
        let mut bad: *mut sys::ibv_send_wr = ptr::null_mut();
        // SAFETY: the QP is alive; the WR chain and its SGEs live on the caller's stack
        // across the call; every local range (a READ's landing, a WRITE's source) was
        // checked against a live LOCAL_WRITE registration whose access token is held
        // until the work request completes.
        let rc = unsafe { sys::ibv_post_send(self.qp.qp().as_ptr(), wrs.as_mut_ptr(), &mut bad) };
        if rc == 0 {
            return Ok(());
        }
        let taken = if bad.is_null() {
            0
        } else {
            (bad as usize - wrs.as_ptr() as usize) / size_of::<sys::ibv_send_wr>()
        };
        let taken = taken.min(n);
        self.unprepare(&wrs[taken..n]);
        let err = if rc == libc::ENOMEM {
            Error::QueueFull
        } else {
            errno_err("ibv_post_send(READ/WRITE)", rc)
        };
        Err((taken, err))
    }
}

impl Connection for RdmaConnection {
    fn send(&mut self, msg: &[u8]) -> Result<(), Error> {
        if let Some(e) = self.dead_for_messages() {
            return Err(e);
        }
        if msg.len() > self.max_msg_len() {
            return Err(Error::TooLarge);
        }
        // Whole wire messages only: the peer must never see a torn or padded one.
        if crate::wire::frame_len(msg)? != Some(msg.len()) {
            return Err(Error::Protocol(crate::wire::WireError::BadLength));
        }
        if self.sends_in_flight == self.send_slots {
            self.drain_send_cq(self.arm_in_polls)?;
            if self.sends_in_flight == self.send_slots {
                return Err(Error::QueueFull);
            }
        }
        let slot = self.send_next;
        let off = slot as usize * self.slot_len;
        self.send_buf[off..off + msg.len()].copy_from_slice(msg);
        let mut sge = sys::ibv_sge {
            addr: self.send_buf.as_ptr() as u64 + off as u64,
            length: msg.len() as u32,
            lkey: self.send_mr.lkey(),
        };
        // SAFETY: ibv_send_wr is a plain C struct; all-zero is a valid value.
        let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = WR_SEND | u64::from(slot);
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = sys::ibv_wr_opcode::IBV_WR_SEND;
        wr.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        let mut bad = ptr::null_mut();
        // SAFETY: the QP is alive; `wr`/`sge` outlive the call; the slot is inside the
        // registered send buffer and is not rewritten before this SEND completes.
        let rc = unsafe { sys::ibv_post_send(self.qp.qp().as_ptr(), &mut wr, &mut bad) };
        if rc != 0 {
            return Err(if rc == libc::ENOMEM {
                Error::QueueFull
            } else {
                errno_err("ibv_post_send(SEND)", rc)
            });
        }
        self.sends_in_flight += 1;
        self.send_next = (slot + 1) % self.send_slots;
        Ok(())
    }

    fn try_recv(&mut self, buf: &mut [u8]) -> Result<Option<usize>, Error> {
        let (slot, len) = match self.pending_recv.take() {
            Some(p) => p,
            None => match self.poll_recv_cq(self.arm_in_polls)? {
                Some(p) => p,
                None => {
                    if let Some(e) = self.dead_for_messages() {
                        return Err(e);
                    }
                    self.check_peer(false);
                    return Ok(None);
                }
            },
        };
        if len > buf.len() {
            self.pending_recv = Some((slot, len));
            return Err(Error::BufferTooSmall { needed: len });
        }
        let off = slot as usize * self.slot_len;
        let msg = &self.recv_buf[off..off + len];
        // Untrusted bytes: hand out only what frames as exactly one message.
        let framed = crate::wire::frame_len(msg);
        if framed == Ok(Some(len)) {
            buf[..len].copy_from_slice(msg);
        }
        self.post_recv_slot(slot)?;
        match framed {
            Ok(Some(n)) if n == len => Ok(Some(len)),
            Err(e) => Err(Error::Protocol(e)),
            _ => Err(Error::Protocol(crate::wire::WireError::BadLength)),
        }
    }

    fn post_read(&mut self, op: &ReadOp) -> Result<(), Error> {
        match self.post_reads(std::slice::from_ref(op)) {
            Ok(_) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn post_reads(&mut self, ops: &[ReadOp]) -> Result<usize, Error> {
        self.post_transfers(ops, |op| Transfer {
            wr_id: op.wr_id,
            local: op.local,
            remote: op.remote,
            opcode: sys::ibv_wr_opcode::IBV_WR_RDMA_READ,
        })
    }

    fn poll_completions(&mut self, out: &mut [Completion]) -> Result<usize, Error> {
        self.drain_send_cq(self.arm_in_polls)?;
        if self.done.is_empty() && self.arm_in_polls {
            self.arm_send_if_idle()?;
        }
        let n = out.len().min(self.done.len());
        for slot in out.iter_mut().take(n) {
            if let Some(c) = self.done.pop_front() {
                *slot = c;
            }
        }
        if n == 0 {
            self.check_peer(false);
        }
        Ok(n)
    }

    fn progress(&mut self) -> Result<(), Error> {
        self.drain_send_cq(self.arm_in_polls)?;
        if self.done.is_empty() && self.arm_in_polls {
            self.arm_send_if_idle()?;
        }
        self.check_peer(false);
        Ok(())
    }

    fn outstanding_reads(&self) -> usize {
        (self.max_reads as usize - self.free_records.len()) + self.done.len()
    }

    fn max_outstanding_reads(&self) -> usize {
        self.max_reads as usize
    }

    fn is_connected(&self) -> bool {
        self.dead().is_none()
    }

    /// Sleeps on the completion channels and the bootstrap socket (see `wake`).
    fn wait(&mut self, timeout: Duration) -> Result<bool, Error> {
        if let Some(e) = self.dead_for_messages() {
            return Err(e);
        }
        if !self.done.is_empty() || self.pending_recv.is_some() {
            return Ok(true);
        }
        // Both queues must be armed before sleeping (the caller may have polled
        // only one): drain-and-arm each; whatever turns up is kept for the next poll.
        self.arm_send_if_idle()?;
        if !self.done.is_empty() {
            return Ok(true);
        }
        if let Some(p) = self.poll_recv_cq(true)? {
            self.pending_recv = Some(p);
            return Ok(true);
        }
        self.check_peer(true);
        if self.peer_gone {
            return Ok(true);
        }
        self.wait.wait(timeout)?;
        Ok(true)
    }

    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(self.wait.fd())
    }

    /// Receive completions are taken off the CQ only by `try_recv` and
    /// `wait`; `wait` may keep one for the next `try_recv`.
    fn may_hold_input(&self) -> bool {
        self.pending_recv.is_some()
    }
}

impl Drop for RdmaConnection {
    fn drop(&mut self) {
        // Let queued SENDs reach the peer before the QP goes (a closed bootstrap socket
        // tells the peer everything we sent has arrived). Bounded: a dead peer gives up.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while self.sends_in_flight > 0
            && self.failed.is_none()
            && std::time::Instant::now() < deadline
        {
            if self.drain_send_cq(self.arm_in_polls).is_err() {
                break;
            }
            std::thread::yield_now();
        }
        // Raw work requests still posted die with the QP: give their accesses back.
        if let Some(r) = self.raw.as_mut() {
            r.release_all(&self.domain.table);
        }
        // READs still in flight die with the QP: give their landing accesses back.
        for i in 0..self.records.len() {
            if let Some(t) = self.records[i].token.take() {
                self.domain.table.release(t);
            }
        }
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_roundtrips_and_rejects_garbage() {
        let e = QpEndpoint {
            qpn: 17,
            psn: 0xabcdef,
            lid: 0,
            gid: [7; 16],
            mtu: 3,
            resp_depth: 16,
            max_msg_len: 32768,
            raw_qpn: 5,
            raw_psn: 6,
        };
        assert_eq!(QpEndpoint::decode(&e.encode()).unwrap(), e);
        let mut b = e.encode();
        b[0] ^= 1;
        assert!(QpEndpoint::decode(&b).is_err());
        let mut b = e.encode();
        b[31] = 9; // MTU enum out of range
        assert!(QpEndpoint::decode(&b).is_err());
        let mut b = e.encode();
        b[8] = 1; // PSN >= 2^24
        assert!(QpEndpoint::decode(&b).is_err());
        for seed in 0..256u32 {
            let mut b = [0u8; QpEndpoint::LEN];
            for (i, x) in b.iter_mut().enumerate() {
                *x = (seed.wrapping_mul(2654435761).wrapping_add(i as u32 * 40503) >> 13) as u8;
            }
            let _ = QpEndpoint::decode(&b); // never panics
        }
    }
}
