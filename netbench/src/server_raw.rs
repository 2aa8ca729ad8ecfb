//! Raw SENDs at `netbench serve` over rdma: the server's side of
//! `lat`/`bw --verb send` as perftest's `ib_send_lat`/`ib_send_bw`.
//!
//! Each client connection with a raw queue pair
//! (`SYMPHONY_RDMA_RAW_DEPTH`, which `netbench serve` sets to
//! [`SERVE_RAW_DEPTH`] unless it is set) gets a receive buffer of its own,
//! registered at its first raw phase, as long as the server's objects (at
//! most `RAW_MAX_LEN`). A [`PerfMsg::RawOpen`](crate::perf_proto::PerfMsg::RawOpen)
//! on the control channel says how many receives to keep posted (all of
//! them into that one buffer, as perftest's receives share its buffer) and
//! whether to answer each SEND with its own bytes (latency ping-pong) or
//! only count it (bandwidth; the count goes out with the tally). Receives
//! stay posted from one phase to the next: each covers the whole buffer, so
//! it fits any size the client runs.
//!
//! The same buffer is the server's side of the WRITE ping-pong (`lat --verb
//! write`, as perftest's `ib_write_lat`): it is registered remote-writable
//! (only this client's raw work lands there; a hostile client can write
//! nothing but its own scratch bytes), a
//! [`PerfMsg::WriteOpen`](crate::perf_proto::PerfMsg::WriteOpen) names the
//! client's buffer and the operation size, and the server answers with its
//! own buffer, then polls the last byte of the size for the next marker
//! ([`crate::perf_proto::write_marker`]) and WRITEs its buffer's bytes back
//! into the client's. A size past the buffer is refused (length 0).

use dataplane::transport::{Connection, Domain, Error as TransportError};

/// Raw queue pair depth `netbench serve` asks for unless
/// `SYMPHONY_RDMA_RAW_DEPTH` says otherwise (perftest's default rx depth).
pub const SERVE_RAW_DEPTH: u32 = 512;

/// Sets `SYMPHONY_RDMA_RAW_DEPTH` to `depth` (at most 4096) unless it is set:
/// this process's rdma connections, and the local servers it starts (who
/// inherit its environment), then have raw queue pairs. Called before any
/// thread that reads the environment starts.
pub fn ask_raw_depth(depth: u32) {
    const VAR: &str = "SYMPHONY_RDMA_RAW_DEPTH";
    if std::env::var_os(VAR).is_none() {
        std::env::set_var(VAR, depth.clamp(1, 4096).to_string());
    }
}

#[cfg(feature = "rdma")]
mod imp {
    use std::any::Any;
    use std::sync::Arc;

    use dataplane::mem::{Access, Region};
    use dataplane::transport::rdma::{RawCompletion, RawKind, RdmaConnection, RAW_MAX_LEN};
    use dataplane::transport::{
        Domain, Error as TransportError, LocalRef, Registration, RemoteRef,
    };

    use crate::perf_proto::write_marker;

    /// One client's raw receive buffer and phase.
    pub struct RawRx {
        region: Arc<Region>,
        reg: Registration,
        buf: LocalRef,
        echo: bool,
        rx_depth: u32,
        /// A WRITE ping-pong phase, if one is open.
        write: Option<WritePong>,
        comps: [RawCompletion; 16],
    }

    /// The server's state in a WRITE ping-pong phase.
    struct WritePong {
        /// The client's buffer, `len` = the operation size.
        peer: RemoteRef,
        /// The next operation expected.
        seq: u64,
    }

    pub(super) fn rdma(conn: &mut dyn Any) -> Option<&mut RdmaConnection> {
        conn.downcast_mut::<RdmaConnection>()
    }

    impl RawRx {
        pub(super) fn new<D: Domain>(domain: &D, conn: &mut D::Conn, size: u32) -> Option<RawRx> {
            rdma(conn)?.raw_depth()?;
            let len = size.clamp(1, RAW_MAX_LEN);
            let region = Region::anonymous(len as usize).ok()?;
            let reg = domain
                .register(&region, Access::ALL | Access::REMOTE_WRITE)
                .ok()?;
            let buf = reg.local_ref(0, len).ok()?;
            Some(RawRx {
                region,
                reg,
                buf,
                echo: false,
                rx_depth: 0,
                write: None,
                comps: [RawCompletion::default(); 16],
            })
        }

        /// Whether a raw phase was started (receives are posted from then
        /// on) or a WRITE ping-pong is open.
        pub fn is_open(&self) -> bool {
            self.rx_depth > 0 || self.write.is_some()
        }

        /// A WRITE ping-pong phase starts with the client's buffer `peer`
        /// (`len` = the operation size): returns this side's buffer, or a
        /// zero-length one when the size does not fit it.
        pub(super) fn write_open(&mut self, peer: RemoteRef) -> Result<RemoteRef, TransportError> {
            self.write = None;
            if peer.len == 0 || peer.len > self.buf.len {
                return Ok(RemoteRef::default());
            }
            // The byte polled for the first marker must not hold a stale one.
            self.region.zero_at(u64::from(peer.len) - 1, 1)?;
            self.write = Some(WritePong { peer, seq: 0 });
            self.reg.remote_ref(0, self.buf.len)
        }

        /// WRITE ping-pong: if the client's next operation landed whole (its
        /// marker is in the last byte), WRITEs the same bytes back. Whether
        /// it did.
        fn echo_write(&mut self, conn: &mut RdmaConnection) -> Result<bool, TransportError> {
            let Some(w) = self.write.as_mut() else {
                return Ok(false);
            };
            let at = u64::from(w.peer.len) - 1;
            if super::landed_byte(&self.region, at) != Some(write_marker(w.seq)) {
                return Ok(false);
            }
            let src = LocalRef {
                len: w.peer.len,
                ..self.buf
            };
            // One WRITE in flight per operation of the client: the queue has
            // room unless completions wait to be reaped (`pump` reaps them).
            match conn.post_raw_write(w.seq, src, w.peer, true) {
                Err(TransportError::QueueFull) => return Ok(false),
                r => r?,
            }
            w.seq += 1;
            Ok(true)
        }

        /// A raw phase starts: up to `rx_depth` receives posted (the queue
        /// pair's depth bounds it); returns how many are posted.
        pub(super) fn open(
            &mut self,
            conn: &mut RdmaConnection,
            rx_depth: u32,
            echo: bool,
        ) -> Result<u64, TransportError> {
            self.write = None;
            self.echo = echo;
            self.rx_depth = rx_depth.min(conn.raw_depth().unwrap_or(0));
            self.top_up(conn)?;
            Ok(u64::from(conn.raw_recvs_posted()))
        }

        fn top_up(&mut self, conn: &mut RdmaConnection) -> Result<(), TransportError> {
            while conn.raw_recvs_posted() < self.rx_depth {
                conn.post_raw_recv(0, self.buf)?;
            }
            Ok(())
        }

        /// Takes every raw completion: counts each landed SEND into
        /// `landed`, posts a receive in its place and, in an echo phase,
        /// answers it with its own bytes. Whether there were any.
        pub(super) fn pump(
            &mut self,
            conn: &mut RdmaConnection,
            landed: &mut u64,
        ) -> Result<bool, TransportError> {
            let mut any = self.echo_write(conn)?;
            loop {
                // Receives only while few SENDs wait to be reaped: one poll
                // per pass where a ping-pong waits for the next SEND.
                let n = if conn.raw_sends_in_flight() < 16 {
                    conn.poll_raw_recvs(&mut self.comps)?
                } else {
                    conn.poll_raw(&mut self.comps)?
                };
                if n == 0 {
                    return Ok(any);
                }
                any = true;
                for k in 0..n {
                    let c = self.comps[k];
                    if c.status.is_err() {
                        return Err(TransportError::PeerDisconnected);
                    }
                    if c.kind != RawKind::Recv {
                        continue;
                    }
                    *landed += 1;
                    self.top_up(conn)?;
                    if self.echo {
                        // Ping-pong: one SEND in flight, so the queue has room
                        // unless the client broke the protocol.
                        let src = LocalRef {
                            len: c.bytes.min(self.buf.len),
                            ..self.buf
                        };
                        conn.post_raw_send(0, src, true)?;
                    }
                }
            }
        }
    }
}

#[cfg(feature = "rdma")]
pub use imp::RawRx;

/// The byte at `at` of `region`, which a peer's RDMA WRITE may be landing
/// in right now (read as an atomic, acquire: the bytes before it, landed
/// first, are visible once it is); `None` past the region.
pub fn landed_byte(region: &dataplane::mem::Region, at: u64) -> Option<u8> {
    let at = usize::try_from(at).ok().filter(|&a| a < region.len())?;
    // SAFETY: `at` is inside the live mapping `region` points at (checked
    // just above; the borrow keeps it mapped); an AtomicU8 has the alignment
    // and size of a u8; the NIC's concurrent writes are why the load is atomic.
    let byte = unsafe { std::sync::atomic::AtomicU8::from_ptr(region.as_ptr().add(at)) };
    Some(byte.load(std::sync::atomic::Ordering::Acquire))
}

/// Starts a WRITE ping-pong on `conn` with the client's buffer `peer`
/// (see the module's description); returns this side's buffer, zero-length
/// where the connection has no raw queue pair or the size does not fit.
pub fn write_open<C: Connection + 'static>(
    raw: Option<&mut RawRx>,
    conn: &mut C,
    peer: dataplane::transport::RemoteRef,
) -> Result<dataplane::transport::RemoteRef, TransportError> {
    #[cfg(feature = "rdma")]
    if let (Some(raw), Some(_)) = (raw, imp::rdma(conn)) {
        return raw.write_open(peer);
    }
    #[cfg(not(feature = "rdma"))]
    let _ = (raw, conn, peer);
    Ok(dataplane::transport::RemoteRef::default())
}

/// Without verbs built in there are no raw queue pairs.
#[cfg(not(feature = "rdma"))]
pub struct RawRx;

#[cfg(not(feature = "rdma"))]
impl RawRx {
    /// Never: there is no raw phase without verbs.
    pub fn is_open(&self) -> bool {
        false
    }
}

/// The raw receive buffer for a new client connection, if it has a raw queue pair.
pub fn raw_rx<D: Domain>(domain: &D, conn: &mut D::Conn, size: u32) -> Option<RawRx>
where
    D::Conn: 'static,
{
    #[cfg(feature = "rdma")]
    return RawRx::new(domain, conn, size);
    #[cfg(not(feature = "rdma"))]
    {
        let _ = (domain, conn, size);
        None
    }
}

/// Starts a raw phase on `conn` (see the module's description); returns the
/// receives posted, 0 where the connection has no raw queue pair (the client
/// then refuses to run).
pub fn open<C: Connection + 'static>(
    raw: Option<&mut RawRx>,
    conn: &mut C,
    rx_depth: u32,
    echo: bool,
) -> Result<u64, TransportError> {
    #[cfg(feature = "rdma")]
    if let (Some(raw), Some(c)) = (raw, imp::rdma(conn)) {
        return raw.open(c, rx_depth, echo);
    }
    #[cfg(not(feature = "rdma"))]
    let _ = (raw, conn, rx_depth, echo);
    Ok(0)
}

/// Takes `conn`'s raw completions (see [`RawRx`]); whether there were any.
pub fn pump<C: Connection + 'static>(
    raw: Option<&mut RawRx>,
    conn: &mut C,
    landed: &mut u64,
) -> Result<bool, TransportError> {
    #[cfg(feature = "rdma")]
    if let (Some(raw), Some(c)) = (raw, imp::rdma(conn)) {
        return raw.pump(c, landed);
    }
    #[cfg(not(feature = "rdma"))]
    let _ = (raw, conn, landed);
    Ok(false)
}
