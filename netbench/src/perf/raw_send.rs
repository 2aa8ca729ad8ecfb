//! `lat`/`bw --verb send` over rdma (netbench built with `--features rdma`)
//! as perftest's `ib_send_lat` and `ib_send_bw`: raw verbs SENDs of a
//! registered buffer, one SEND per operation of any size up to 8 MiB, no
//! framing and no copy, on each connection's raw queue pair
//! (`dataplane::transport::rdma`'s `raw.rs`), into receives the server posted
//! ahead (`--rx-depth`, into one buffer as perftest's do; see
//! `crate::server_raw`). Every SEND is signalled; in the latency test
//! those of at most 236 bytes go inline (perftest's `ib_send_lat` default;
//! its bandwidth tests send nothing inline by default, nor does `bw` here).
//!
//! - Latency: the client posts a receive and a SEND; the server answers the
//!   SEND with one of the same bytes; the operation ends at the answer's
//!   receive completion, and its latency is half that round trip (as
//!   `ib_send_lat`). The bytes that came back are checked.
//! - Bandwidth: `--tx-depth` SENDs in flight per queue pair (at most the raw
//!   queue pair's depth); an operation ends at its SEND's work completion,
//!   the RC acknowledgement that it is in a receive of the server (as
//!   `ib_send_bw` counts). The server's tally after each phase must equal
//!   the SENDs sent.
//!
//! Without a raw queue pair on every link (a server that does not offer one,
//! or another transport), SEND is the framed message path of [`super::send_stream`].
//!
//! `lat --verb write` over rdma is perftest's `ib_write_lat` on the same raw
//! queue pairs: a WRITE ping-pong. At the start of each size's phase the
//! client sends the server (control channel, [`perf_proto::PerfMsg::WriteOpen`])
//! the address, rkey and length of its link's remote-writable receive
//! buffer, and the server answers with its own
//! ([`perf_proto::PerfMsg::WriteReady`]). The client WRITEs `size` bytes into
//! the server's buffer, the last byte carrying the operation's marker
//! ([`perf_proto::write_marker`]); the server busy-polls that byte and WRITEs
//! its buffer (the same bytes) back into the client's; the client busy-polls
//! its own last byte. Latency = half that round trip. WRITEs of at most
//! `raw_inline_max` bytes (236 on rxe; `ib_write_lat`'s default is 220) go
//! inline; every WRITE is signalled and its completion reaped when the send
//! queue fills, or checked for errors every few thousand empty polls. The
//! bytes of the last echo are checked.

use std::sync::Arc;

use dataplane::mem::{Access, Region};
use dataplane::transport::{Domain, LocalRef, Registration};

use super::{drain, stream_done, Links};
use crate::fail::{Fail, Res};
use crate::perf_proto;
use dataplane::transport::RemoteRef;

/// The client's side of raw SENDs: the registered source of every SEND.
#[cfg_attr(not(feature = "rdma"), allow(dead_code))]
pub(super) struct RawTx {
    _region: Arc<Region>,
    _reg: Registration,
    /// The SEND pattern (`Links::tx`'s bytes), `max_size` of them.
    src: LocalRef,
    /// Receives the server keeps posted.
    rx_depth: u32,
}

/// Raw SENDs for `links` if every link has a raw queue pair (rdma built
/// in and offered by both sides); `None` otherwise.
pub(super) fn setup<D: Domain>(
    domain: &D,
    links: &mut Links<D>,
    rx_depth: u32,
) -> Res<Option<RawTx>> {
    #[cfg(feature = "rdma")]
    {
        let all_raw = !links.links.is_empty()
            && links.links.iter_mut().all(|l| {
                super::verbs::<D>(&mut l.conn)
                    .and_then(|c| c.raw_depth())
                    .is_some()
            });
        if !all_raw {
            return Ok(None);
        }
        let len =
            u32::try_from(links.tx.len()).map_err(|_| Fail::usage("SEND size above 4 GiB"))?;
        let region = Region::anonymous(links.tx.len().max(1))
            .map_err(Fail::caused(format!("cannot map a {len}-byte SEND source")))?;
        region.write_at(0, &links.tx)?;
        let reg = domain.register(&region, Access::LOCAL_WRITE)?;
        let src = reg.local_ref(0, len.max(1))?;
        Ok(Some(RawTx {
            _region: region,
            _reg: reg,
            src,
            rx_depth: rx_depth.max(1),
        }))
    }
    #[cfg(not(feature = "rdma"))]
    {
        let _ = (domain, links, rx_depth, Access::LOCAL_WRITE);
        Ok(None)
    }
}

/// The client's side of the WRITE ping-pong: one registered, remote-writable
/// region holding the WRITE source (slot 0) and each link's receive buffer
/// (slot 1 + link), `max_size` bytes each.
pub(super) struct RawWrite {
    region: Arc<Region>,
    reg: Registration,
    /// Bytes per slot.
    slot: u32,
    /// Empty polls of the receive byte since the send queue was last checked.
    spins: u32,
}

impl RawWrite {
    /// Where link `i`'s receive buffer starts in the region.
    fn rx_offset(&self, i: usize) -> u64 {
        u64::from(self.slot) * (i as u64 + 1)
    }
}

/// Empty polls of a WRITE ping-pong's receive byte between two checks of
/// the send queue for failed WRITEs (a failed WRITE is never echoed).
const WRITE_ERROR_CHECK_EVERY: u32 = 4096;

/// The WRITE ping-pong's buffers for `links` (rdma; every link must have a
/// raw queue pair: `lat --verb write` over rdma is the ping-pong only).
pub(super) fn setup_write<D: Domain>(domain: &D, links: &mut Links<D>) -> Res<RawWrite> {
    #[cfg(feature = "rdma")]
    {
        for l in &mut links.links {
            if super::verbs::<D>(&mut l.conn)
                .and_then(|c| c.raw_depth())
                .is_none()
            {
                return Err(Fail::runtime(format!(
                    "server {}: no raw queue pair for the WRITE ping-pong of `lat --verb write` \
                     (SYMPHONY_RDMA_RAW_DEPTH=0 on either side, or a netbench serve older than this one)",
                    l.addr
                )));
            }
        }
        let slot = u32::try_from(links.tx.len())
            .map_err(|_| Fail::usage("WRITE size above 4 GiB"))?
            .max(1);
        let len = u64::from(slot) * (links.links.len() as u64 + 1);
        let region = Region::anonymous(len as usize).map_err(Fail::caused(format!(
            "cannot map {len} bytes of WRITE ping-pong buffers"
        )))?;
        region.write_at(0, &links.tx)?;
        let reg = domain.register(&region, Access::ALL | Access::REMOTE_WRITE)?;
        Ok(RawWrite {
            region,
            reg,
            slot,
            spins: 0,
        })
    }
    #[cfg(not(feature = "rdma"))]
    {
        let _ = (domain, links, Access::ALL);
        Err(Fail::runtime("WRITE ping-pong without verbs"))
    }
}

#[cfg(feature = "rdma")]
use dataplane::transport::rdma::{RawCompletion, RawKind, RdmaConnection};

/// Stand-ins where verbs are not built in: `setup` never returns a `RawTx`,
/// so none of the calls below runs. (One line each: they mirror
/// dataplane's raw-SEND types, which exist only with verbs.)
#[cfg(not(feature = "rdma"))]
#[allow(dead_code)]
#[rustfmt::skip]
mod stub {
    use crate::fail::{Fail, Res};
    use dataplane::transport::{Error, LocalRef};
    const NO_VERBS: &str = "raw SEND without verbs";
    #[derive(Clone, Copy)]
    pub(super) struct RawCompletion { pub(super) wr_id: u64, pub(super) kind: RawKind, pub(super) status: Result<(), ()>, pub(super) bytes: u32 }
    impl Default for RawCompletion {
        fn default() -> Self { RawCompletion { wr_id: 0, kind: RawKind::Send, status: Ok(()), bytes: 0 } }
    }
    #[derive(Clone, Copy, PartialEq, Eq)]
    pub(super) enum RawKind { Send, Recv, Write }
    pub(super) struct RdmaConnection;
    impl RdmaConnection {
        pub(super) fn poll_raw(&mut self, _: &mut [RawCompletion]) -> Res<usize> { Err(Fail::runtime(NO_VERBS)) }
        pub(super) fn poll_raw_recvs(&mut self, _: &mut [RawCompletion]) -> Res<usize> { Err(Fail::runtime(NO_VERBS)) }
        pub(super) fn post_raw_send(&mut self, _: u64, _: LocalRef, _: bool) -> Result<(), Error> { Err(Error::Unsupported(NO_VERBS)) }
        pub(super) fn post_raw_recv(&mut self, _: u64, _: LocalRef) -> Result<(), Error> { Err(Error::Unsupported(NO_VERBS)) }
        pub(super) fn post_raw_write(&mut self, _: u64, _: LocalRef, _: dataplane::transport::RemoteRef, _: bool) -> Result<(), Error> { Err(Error::Unsupported(NO_VERBS)) }
    }
}
#[cfg(not(feature = "rdma"))]
use stub::{RawCompletion, RawKind, RdmaConnection};

/// The verbs connection of link `conn` (raw SENDs run only where it exists).
fn rdma<D: Domain>(conn: &mut D::Conn) -> Res<&mut RdmaConnection> {
    #[cfg(feature = "rdma")]
    return super::verbs::<D>(conn).ok_or_else(|| Fail::runtime("raw SEND on a non-verbs link"));
    #[cfg(not(feature = "rdma"))]
    {
        let _ = conn;
        Err(Fail::runtime("raw SEND without verbs"))
    }
}

impl<D: Domain> Links<D> {
    fn raw_src(&self, size: u32) -> Res<LocalRef> {
        let raw = self
            .raw
            .as_ref()
            .ok_or_else(|| Fail::runtime("no raw SEND source"))?;
        Ok(LocalRef {
            len: size,
            ..raw.src
        })
    }

    /// Starts a raw phase on every link: the server keeps `rx_depth`
    /// receives posted and, with `echo`, answers each SEND (latency).
    pub(super) fn raw_open(&mut self, echo: bool) -> Res<()> {
        let rx_depth = self.raw.as_ref().map_or(1, |r| r.rx_depth);
        let n = perf_proto::encode_raw_open(&mut self.msg, rx_depth, echo)?;
        for i in 0..self.links.len() {
            self.links[i].raw_ready = None;
            self.send_msg(i, n, &mut |_, _, _| {})?;
        }
        self.await_phase_start("raw SEND phase", |l| l.raw_ready.is_some())?;
        for i in 0..self.links.len() {
            if self.links[i].raw_ready == Some(0) {
                return Err(Fail::runtime(format!(
                    "server {} posted no raw receives (a netbench serve without a raw queue pair?)",
                    self.links[i].addr
                )));
            }
        }
        Ok(())
    }

    /// Reads every link until `answered` says its server answered the start
    /// of a phase (`what`, for the error), within the op timeout.
    fn await_phase_start(
        &mut self,
        what: &str,
        answered: impl Fn(&super::Link<D::Conn>) -> bool,
    ) -> Res<()> {
        let t0 = self.now();
        for i in 0..self.links.len() {
            let mut spins = 0u32;
            while !answered(&self.links[i]) {
                let t = self.now();
                drain(&mut self.links[i], &mut self.buf, t, |_, _, _| {})?;
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(1024) && self.now().saturating_sub(t0) > self.op_timeout_ns
                {
                    return Err(Fail::runtime(format!(
                        "server {} did not start the {what}",
                        self.links[i].addr
                    )));
                }
            }
        }
        Ok(())
    }

    /// Latency: posts the receive for the answer, then SEND `seq` of `size` bytes.
    pub(super) fn raw_post_one(&mut self, i: usize, size: u32, seq: u64) -> Res<()> {
        let src = self.raw_src(size)?;
        let landing = LocalRef {
            len: size,
            ..self.links[i].landing
        };
        // Read only when the queue is full (a clock read inside the measured time otherwise).
        let mut t0 = None;
        let l = &mut self.links[i];
        let conn = rdma::<D>(&mut l.conn)?;
        if let Err(e) = conn.post_raw_recv(seq, landing) {
            return Err(Fail::caused(format!("posting a receive for {}", l.addr))(e));
        }
        loop {
            match conn.post_raw_send(seq, src, true) {
                Ok(()) => return Ok(()),
                // The previous SEND's completion is not reaped yet.
                Err(dataplane::transport::Error::QueueFull) => {
                    let mut c = [RawCompletion::default(); 4];
                    conn.poll_raw(&mut c)?;
                    let now = self.clock.now().as_nanos();
                    if now.saturating_sub(*t0.get_or_insert(now)) > self.op_timeout_ns {
                        return Err(Fail::runtime(format!("{}: raw send queue full", l.addr)));
                    }
                }
                Err(e) => return Err(Fail::caused(format!("sending to {}", l.addr))(e)),
            }
        }
    }

    /// Latency: whether the answer to SEND `seq` arrived on link `i`.
    pub(super) fn raw_finished(&mut self, i: usize, size: u32, seq: u64) -> Res<bool> {
        let mut c = [RawCompletion::default(); 4];
        let l = &mut self.links[i];
        let addr = &l.addr;
        // The answer's receive only; SEND completions are reaped when the
        // send queue fills (`raw_post_one`).
        let n = rdma::<D>(&mut l.conn)?.poll_raw_recvs(&mut c)?;
        let mut hit = false;
        for c in &c[..n] {
            if c.status.is_err() {
                return Err(Fail::runtime(format!(
                    "a raw SEND to {addr} failed: {:?}",
                    c.status
                )));
            }
            if c.kind == RawKind::Recv && c.wr_id == seq {
                if c.bytes != size {
                    return Err(Fail::runtime(format!(
                        "server {addr} answered a {size}-byte SEND with {} bytes",
                        c.bytes
                    )));
                }
                hit = true;
            }
        }
        Ok(hit)
    }

    /// Bandwidth: posts up to `room` SENDs of `size` bytes on link `i`.
    pub(super) fn raw_post_stream(&mut self, i: usize, size: u32, room: u64) -> Res<()> {
        let src = self.raw_src(size)?;
        for _ in 0..room {
            let l = &mut self.links[i];
            match rdma::<D>(&mut l.conn)?.post_raw_send(l.started, src, false) {
                Ok(()) => {}
                Err(dataplane::transport::Error::QueueFull) => break,
                Err(e) => return Err(Fail::caused(format!("sending to {}", l.addr))(e)),
            }
            l.started += 1;
            l.inflight += 1;
        }
        Ok(())
    }

    /// Bandwidth: completes link `i`'s SENDs whose work completions are in;
    /// whether there were any.
    pub(super) fn raw_reap_stream(&mut self, i: usize, stamps: &mut Vec<u64>) -> Res<bool> {
        let mut c = [RawCompletion::default(); 16];
        let n = rdma::<D>(&mut self.links[i].conn)?.poll_raw(&mut c)?;
        let t = self.now();
        let l = &mut self.links[i];
        let mut sent = 0;
        for c in &c[..n] {
            if c.status.is_err() {
                return Err(Fail::runtime(format!(
                    "a raw SEND to {} failed: {:?}",
                    l.addr, c.status
                )));
            }
            sent += usize::from(c.kind == RawKind::Send);
        }
        if sent > 0 {
            stream_done(l, stamps, t, sent);
        }
        Ok(sent > 0)
    }

    /// The WRITE ping-pong's buffers.
    fn raw_write_bufs(&mut self) -> Res<&mut RawWrite> {
        self.raw_write
            .as_mut()
            .ok_or_else(|| Fail::runtime("no WRITE ping-pong buffers"))
    }

    /// Starts a WRITE ping-pong phase of `size`-byte operations on every
    /// link: zeroes each link's receive buffer, tells its server where it is
    /// and takes the server's buffer in exchange.
    pub(super) fn write_open(&mut self, size: u32) -> Res<()> {
        let size = size.max(1);
        // The source holds the pattern again (an earlier, shorter phase
        // left its marker inside this one's bytes).
        let rw = self
            .raw_write
            .as_ref()
            .ok_or_else(|| Fail::runtime("no WRITE ping-pong buffers"))?;
        rw.region.write_at(0, &self.tx[..size as usize])?;
        for i in 0..self.links.len() {
            let rw = self.raw_write_bufs()?;
            let off = rw.rx_offset(i);
            rw.region.zero_at(off, size as usize)?;
            let mine = rw.reg.remote_ref(off, size)?;
            self.links[i].write_peer = None;
            let n = perf_proto::encode_write_open(&mut self.msg, mine)?;
            self.send_msg(i, n, &mut |_, _, _| {})?;
        }
        self.await_phase_start("WRITE ping-pong", |l| l.write_peer.is_some())?;
        for i in 0..self.links.len() {
            let peer = self.links[i].write_peer.unwrap_or_default();
            if peer.len < size {
                return Err(Fail::runtime(format!(
                    "server {} refused a {size}-byte WRITE ping-pong (its buffer: {} bytes; \
                     a netbench serve without a raw queue pair, or with smaller objects?)",
                    self.links[i].addr, peer.len
                )));
            }
        }
        self.raw_write_bufs()?.spins = 0;
        Ok(())
    }

    /// Latency: WRITEs operation `seq` (`size` bytes, its marker last) into
    /// link `i`'s server buffer.
    pub(super) fn raw_write_post(&mut self, i: usize, size: u32, seq: u64) -> Res<()> {
        let size = size.max(1);
        // Read only when the queue is full (a clock read inside the measured time otherwise).
        let mut t0 = None;
        let rw = self.raw_write_bufs()?;
        // The previous operation's source bytes were read: its echo is in.
        rw.region
            .write_at(u64::from(size) - 1, &[perf_proto::write_marker(seq)])?;
        let src = rw.reg.local_ref(0, size)?;
        let l = &mut self.links[i];
        let target = RemoteRef {
            len: size,
            ..l.write_peer.unwrap_or_default()
        };
        let conn = rdma::<D>(&mut l.conn)?;
        loop {
            match conn.post_raw_write(seq, src, target, true) {
                Ok(()) => return Ok(()),
                // Earlier WRITEs' completions are not reaped yet.
                Err(dataplane::transport::Error::QueueFull) => {
                    let mut c = [RawCompletion::default(); 16];
                    let n = conn.poll_raw(&mut c)?;
                    check_writes(&l.addr, &c[..n])?;
                    let now = self.clock.now().as_nanos();
                    if now.saturating_sub(*t0.get_or_insert(now)) > self.op_timeout_ns {
                        return Err(Fail::runtime(format!("{}: raw send queue full", l.addr)));
                    }
                }
                Err(e) => return Err(Fail::caused(format!("WRITE to {}", l.addr))(e)),
            }
        }
    }

    /// Latency: whether the server's echo of operation `seq` landed in link
    /// `i`'s buffer (its last byte carries `seq`'s marker).
    pub(super) fn raw_write_finished(&mut self, i: usize, size: u32, seq: u64) -> Res<bool> {
        let size = size.max(1);
        let rw = self.raw_write_bufs()?;
        let at = rw.rx_offset(i) + u64::from(size) - 1;
        let byte = crate::server_raw::landed_byte(&rw.region, at)
            .ok_or_else(|| Fail::runtime("WRITE ping-pong buffer out of range"))?;
        if byte == perf_proto::write_marker(seq) {
            return Ok(true);
        }
        rw.spins = rw.spins.wrapping_add(1);
        if rw.spins.is_multiple_of(WRITE_ERROR_CHECK_EVERY) {
            let l = &mut self.links[i];
            let mut c = [RawCompletion::default(); 16];
            let n = rdma::<D>(&mut l.conn)?.poll_raw(&mut c)?;
            check_writes(&l.addr, &c[..n])?;
        }
        Ok(false)
    }

    /// The bytes the server's last echo left in link `i`'s buffer.
    pub(super) fn raw_write_landed(&mut self, i: usize, out: &mut [u8]) -> Res<()> {
        let rw = self.raw_write_bufs()?;
        Ok(rw.region.read_at(rw.rx_offset(i), out)?)
    }
}

/// Fails on a failed WRITE among raw completions `c` (link to `addr`).
fn check_writes(addr: &str, c: &[RawCompletion]) -> Res<()> {
    match c.iter().find(|c| c.status.is_err()) {
        Some(c) => Err(Fail::runtime(format!(
            "a raw WRITE to {addr} failed: {:?} (the server's buffer refused it?)",
            c.status
        ))),
        None => Ok(()),
    }
}
