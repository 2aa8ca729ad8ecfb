//! `netbench lat` and `netbench bw`: perftest's latency and bandwidth tests
//! (READ, WRITE, SEND; size sweeps; several queue pairs; a TX depth) over
//! every transport, point to point or as an incast over P servers, plus
//! latency under a concurrent bandwidth stream.
//!
//! What each verb is, per transport (also in `--help`):
//! - READ: the transport's one-sided READ (rdma: RDMA READ work requests;
//!   tcp/tcp-blocking: a `(key, offset, len)` request answered by the
//!   server's responder; shm: a bounds-checked copy out of the server's
//!   mapped region). Latency is post to completion (perftest's
//!   `ib_read_lat` reports the same round trip).
//! - WRITE and SEND: messages on the connection ([`crate::perf_proto`]),
//!   chunked into wire messages of at most 32 KiB; the server's CPU lands
//!   them in its buffer (WRITE at the operation's offset, SEND in its
//!   receive buffer; on tcp and shm the two differ only in name) and
//!   answers. rdma SENDs are real verbs SENDs of the transport's control
//!   channel (an operation over 32 KiB is several SENDs). Latency is half
//!   the ping-pong round trip, as perftest's `ib_send_lat` reports.
//! - rdma WRITE (netbench built with `--features rdma`), latency: a WRITE
//!   ping-pong on each connection's raw queue pair, as perftest's
//!   `ib_write_lat` ([`raw_send`]): client and server swap the address and
//!   rkey of a remote-writable buffer, the client WRITEs the size's bytes
//!   into the server's (the last byte carrying an iteration marker), the
//!   server busy-polls that byte and WRITEs the bytes back, the client
//!   busy-polls its own; latency is half that round trip, and the last
//!   echo's bytes are checked.
//! - rdma WRITE, bandwidth: RDMA WRITE work requests into the server's
//!   object, which a server started with `--writable` registers
//!   remote-writable (local servers are, for `--verb write`); each completes
//!   at its completion (the RC acknowledgement), as `ib_write_bw` counts.
//!   The WRITEs carry the object's own bytes (it stays as served); the check
//!   after each size writes a marker, reads it back and restores it.
//! - Bandwidth: each queue pair keeps `--tx-depth` operations in flight,
//!   READs and WRITEs posted `--post-list` per call (perftest's `-l`); an
//!   operation completes at its completion (READ, rdma WRITE) or at the
//!   server's acknowledgement (emulated WRITE; with `--bidirectional` the
//!   server answers every WRITE or SEND with one of the same size, and both
//!   directions count). A SEND stream is not answered, as perftest's
//!   `ib_send_bw` (see [`send_stream`]).
//!
//! Only this process's monotonic clock is read.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use dataplane::mem::{Access, Region};
use dataplane::time::{Duration, MonotonicClock};
use dataplane::transport::{
    Completion, Connection, Domain, Error as TransportError, LocalRef, ReadOp, RemoteRef,
};
use dataplane::wire::MAX_MESSAGE_LEN;

use crate::fail::{Fail, Res};
use crate::perf_proto::{self, Op, PerfMsg, Reply, MAX_CHUNK};
use crate::proto;
use crate::stats::Recorder;
use crate::transport::WithDomain;

mod bw_stats;
mod raw_send;
mod send_stream;
mod verbs;
pub use bw_stats::{peak_rate, BwStats};
use send_stream::is_send_stream;
use verbs::{post_writes, writes_one_sided};
#[cfg(feature = "rdma")]
use verbs::verbs;

/// The measured operation.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Verb {
    /// One-sided READ.
    Read,
    /// WRITE (one-sided on verbs; emulated by messages elsewhere).
    Write,
    /// Two-sided SEND.
    Send,
}

impl Verb {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Verb::Read => "read",
            Verb::Write => "write",
            Verb::Send => "send",
        }
    }
    fn op(self) -> Op {
        match self {
            Verb::Write => Op::Write,
            _ => Op::Send,
        }
    }
}

/// How an operation travels on this run's transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    /// A work request reaped as a completion: READ everywhere, WRITE on rdma.
    OneSided(Verb),
    /// Messages the server lands and answers: WRITE and SEND elsewhere.
    Message(Op),
    /// SEND on rdma with raw queue pairs ([`raw_send`]).
    RawSend,
    /// WRITE latency on rdma: a WRITE ping-pong on the raw queue pairs ([`raw_send`]).
    RawWrite,
}

impl Path {
    /// Latency of a one-sided operation is post to completion (a round trip:
    /// the READ's response, the WRITE's acknowledgement); of a message or a
    /// WRITE ping-pong, half the round trip, as perftest's `ib_send_lat` and
    /// `ib_write_lat` report.
    fn latency_of(self, round_trip: u64) -> u64 {
        match self {
            Path::OneSided(_) => round_trip,
            Path::Message(_) | Path::RawSend | Path::RawWrite => round_trip / 2,
        }
    }
}

/// Most work requests handed to the transport in one call (one doorbell on
/// verbs, perftest's post list; the rdma transport's batch is 16 as well).
/// How many a stream hands over is `--post-list`, by default 1 as perftest's:
/// on rxe a doorbell runs the requester (and the loopback responder and
/// completer) inside the poster's system call, and sixteen 1 MiB WRITEs in
/// one call outlast the retransmit timer (67 ms at ACK timeout 14), after
/// which the queue pair's work moved to softirq on the other CPU and stalled
/// 50-100 ms at a time (29-35 MB/s; one per call: 52, perftest 42-55).
pub const POST_AT_ONCE: usize = 16;

/// Latency or bandwidth.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Test {
    /// One operation at a time per queue pair.
    Lat,
    /// `tx_depth` operations in flight per queue pair.
    Bw,
}

/// When a measurement stops.
#[derive(Clone, Copy, Debug)]
pub enum Stop {
    /// After this many operations per queue pair.
    Count(u64),
    /// After this long.
    For(std::time::Duration),
}

/// The concurrent stream of `lat --under-load`.
#[derive(Clone, Copy, Debug)]
pub struct LoadSpec {
    /// Its verb.
    pub verb: Verb,
    /// Bytes per operation.
    pub size: u32,
    /// Operations in flight.
    pub tx_depth: usize,
}

/// One bandwidth stream's shape.
#[derive(Clone, Copy, Debug)]
struct Stream {
    verb: Verb,
    size: u32,
    /// Operations in flight per queue pair.
    depth: usize,
    /// READ/WRITE work requests per post call.
    post_list: usize,
    /// WRITE/SEND: the server answers with the same size (both directions count).
    bidirectional: bool,
}

/// How to measure.
#[derive(Clone, Debug)]
pub struct PerfConfig {
    /// Latency or bandwidth.
    pub test: Test,
    /// The operation.
    pub verb: Verb,
    /// Sizes, in order.
    pub sizes: Vec<u32>,
    /// When each size's measurement stops.
    pub stop: Stop,
    /// Unmeasured operations first, per queue pair and size.
    pub warmup: u64,
    /// Connections (queue pairs) per server.
    pub queue_pairs: usize,
    /// Operations in flight per queue pair (bandwidth).
    pub tx_depth: usize,
    /// READ/WRITE work requests per post call (bandwidth), 1..=[`POST_AT_ONCE`].
    pub post_list: usize,
    /// Bandwidth: the server answers each operation with one of the same size.
    pub bidirectional: bool,
    /// rdma raw SENDs: receives the server keeps posted (perftest's `--rx-depth`).
    pub rx_depth: u32,
    /// Latency: also measure under this concurrent stream.
    pub under_load: Option<LoadSpec>,
    /// Connect + catalog bound per connection.
    pub connect_timeout: Duration,
    /// Longest wait without any progress.
    pub op_timeout: std::time::Duration,
}

impl PerfConfig {
    pub(crate) fn max_size(&self) -> u32 {
        let load = self.under_load.map_or(0, |l| l.size);
        self.sizes.iter().copied().max().unwrap_or(0).max(load)
    }
}

/// One size's results.
#[derive(Debug, Default)]
pub struct SizeResult {
    /// Bytes per operation.
    pub bytes: u32,
    /// Latency (lat).
    pub lat: Option<Recorder>,
    /// Latency under the concurrent stream (lat --under-load).
    pub lat_loaded: Option<Recorder>,
    /// Bandwidth (bw).
    pub bw: Option<BwStats>,
    /// What the concurrent stream achieved meanwhile (lat --under-load).
    pub load_bw: Option<BwStats>,
}

struct Link<C> {
    addr: String,
    conn: C,
    /// The server's object (READ source), at least as long as the largest size.
    remote: RemoteRef,
    /// This link's landing slot (READ destination), as long as the largest size.
    landing: LocalRef,
    /// Where answers' bytes land (WRITE/SEND), as long as the largest size.
    rx: Vec<u8>,
    /// Operations in flight.
    inflight: usize,
    /// Operations started and completed (this size).
    started: u64,
    done: u64,
    /// Post time of the operation in flight (latency: one at a time).
    t_post: u64,
    /// When its post call returned (with `NETBENCH_LAT_SPLIT`).
    t_posted: u64,
    /// SEND stream: messages posted (this phase).
    msgs_posted: u64,
    /// SEND stream: the server's tally, once it answered.
    tally: Option<u64>,
    /// Raw SENDs: the server's receives posted, once it answered the phase's start.
    raw_ready: Option<u64>,
    /// WRITE ping-pong: the server's remote-writable buffer, once it
    /// answered the phase's start.
    write_peer: Option<RemoteRef>,
}

/// Connections to the servers and the buffers every measurement uses.
struct Links<D: Domain> {
    links: Vec<Link<D::Conn>>,
    landing: (Arc<Region>, dataplane::transport::Registration),
    tx: Vec<u8>,
    msg: Vec<u8>,
    buf: Vec<u8>,
    comps: Vec<Completion>,
    clock: MonotonicClock,
    op_timeout_ns: u64,
    /// WRITEs are one-sided work requests (rdma), not messages.
    write_one_sided: bool,
    /// The transport reports when a SEND has landed (rdma: its work
    /// completion), so a SEND stream's operations complete then.
    sends_delivered: bool,
    /// SENDs are raw verbs SENDs ([`raw_send`]).
    raw: Option<raw_send::RawTx>,
    /// rdma WRITE latency is a WRITE ping-pong on the raw queue pairs ([`raw_send`]).
    raw_write: Option<raw_send::RawWrite>,
    /// With `NETBENCH_LAT_SPLIT=1` (a diagnostic: two more clock reads per
    /// operation), latency is also split in two: the post call, and its
    /// return to the completion. Medians go to stderr after each size.
    split: Option<(Recorder, Recorder)>,
}

fn connect_links<D: Domain>(
    domain: &D,
    addrs: &[String],
    per_server: usize,
    max_size: u32,
    connect_timeout: Duration,
    op_timeout: std::time::Duration,
) -> Res<Links<D>> {
    let count = addrs.len() * per_server;
    let need = count as u64 * u64::from(max_size);
    let region = Region::anonymous(need as usize)
        .map_err(Fail::caused(format!("cannot map {need} bytes of landing buffers")))?;
    let reg = domain.register(&region, Access::LOCAL_WRITE)?;
    let mut buf = vec![0u8; MAX_MESSAGE_LEN];
    let mut links = Vec::with_capacity(count);
    for q in 0..per_server {
        for addr in addrs {
            let t = std::time::Duration::from_nanos(connect_timeout.as_nanos());
            let deadline = std::time::Instant::now() + t;
            let mut conn = domain.connect(addr, connect_timeout).map_err(Fail::caused(format!(
                "cannot connect to {addr} over {} within {:.1} s",
                domain.kind(),
                t.as_secs_f64()
            )))?;
            let n = proto::encode_hello(&mut buf, 1)?;
            proto::send_by(&mut conn, &buf[..n], deadline)
                .map_err(|e| e.context(format!("server {addr}")))?;
            let n = proto::recv_by(&mut conn, &mut buf, deadline)
                .map_err(|e| e.context(format!("server {addr} sent no catalog")))?;
            let (_, objects) = proto::decode_catalog(&buf[..n])
                .map_err(|e| e.context(format!("server {addr}")))?;
            let remote = *objects
                .first()
                .ok_or_else(|| Fail::runtime(format!("server {addr} serves no object")))?;
            if remote.len < max_size {
                return Err(Fail::runtime(format!(
                    "server {addr} serves {}-byte objects; this run needs {max_size} (start it with \
                     --size {max_size} or larger)",
                    remote.len
                )));
            }
            let slot = links.len() as u64;
            links.push(Link {
                addr: addr.clone(),
                conn,
                remote,
                landing: reg.local_ref(slot * u64::from(max_size), max_size)?,
                rx: vec![0u8; max_size as usize],
                inflight: 0,
                started: 0,
                done: 0,
                t_post: 0,
                t_posted: 0,
                msgs_posted: 0,
                tally: None,
                raw_ready: None,
                write_peer: None,
            });
            let _ = q;
        }
    }
    let mut tx = vec![0u8; max_size as usize];
    crate::pattern::fill(&mut tx, 0x5e);
    Ok(Links {
        links,
        landing: (region, reg),
        tx,
        msg: vec![0u8; MAX_MESSAGE_LEN],
        buf: vec![0u8; MAX_MESSAGE_LEN],
        comps: vec![Completion::default(); 256],
        clock: MonotonicClock::new(),
        op_timeout_ns: op_timeout.as_nanos().min(u128::from(u64::MAX)) as u64,
        write_one_sided: writes_one_sided::<D>(),
        sends_delivered: writes_one_sided::<D>(),
        raw: None,
        raw_write: None,
        split: std::env::var_os("NETBENCH_LAT_SPLIT")
            .is_some_and(|v| v == "1")
            .then(|| (Recorder::new(), Recorder::new())),
    })
}

/// Takes every message waiting on link `i`; calls `complete(link, seq, t)`
/// for each operation the server finished (its acknowledgement, or the last
/// chunk of its answer). Answer bytes land in the link's `rx`. `t` is the
/// caller's time before the call: completions reaped together share one
/// time, as a verbs poll's do (per-message clock reads would make a backlog
/// drained in one go look like a burst at memory speed).
fn drain<C: Connection>(
    link: &mut Link<C>,
    buf: &mut [u8],
    t: u64,
    mut complete: impl FnMut(&mut Link<C>, u64, u64),
) -> Res<bool> {
    let mut any = false;
    while let Some(n) = link.conn.try_recv(buf)? {
        any = true;
        match perf_proto::decode(&buf[..n]) {
            Some(PerfMsg::Ack(seq)) => complete(link, seq, t),
            Some(PerfMsg::Tally(n)) => link.tally = Some(n),
            Some(PerfMsg::RawReady(n)) => link.raw_ready = Some(n),
            Some(PerfMsg::WriteReady(r)) => link.write_peer = Some(r),
            Some(PerfMsg::Chunk(c)) => {
                let off = c.off as usize;
                let end = off + c.payload.len();
                if end > link.rx.len() {
                    return Err(Fail::runtime(format!(
                        "server {} answered {} bytes; at most {} were asked",
                        link.addr,
                        c.total,
                        link.rx.len()
                    )));
                }
                link.rx[off..end].copy_from_slice(c.payload);
                if c.is_last() {
                    complete(link, c.seq, t);
                }
            }
            Some(PerfMsg::TallyQuery | PerfMsg::RawOpen { .. } | PerfMsg::WriteOpen(_)) | None => {
                return Err(Fail::runtime(format!(
                    "server {} sent an unexpected {n}-byte message (is it a netbench server of this version?)",
                    link.addr
                )))
            }
        }
    }
    Ok(any)
}

impl<D: Domain> Links<D> {
    fn now(&self) -> u64 {
        self.clock.now().as_nanos()
    }

    fn reset(&mut self) {
        for l in &mut self.links {
            l.inflight = 0;
            l.started = 0;
            l.done = 0;
            l.msgs_posted = 0;
            l.tally = None;
        }
    }

    /// Sends one whole WRITE/SEND of `size` bytes on link `i`. While the
    /// send queue is full it drains every link's answers (a server blocked
    /// on answering one link would otherwise never read the next chunk),
    /// handing completions to `complete`.
    fn send_op(
        &mut self,
        i: usize,
        seq: u64,
        op: Op,
        reply: Reply,
        size: u32,
        complete: &mut impl FnMut(&mut Link<D::Conn>, u64, u64),
    ) -> Res<()> {
        let total = size as usize;
        let mut off = 0usize;
        while off < total {
            let len = (total - off).min(MAX_CHUNK);
            let n = perf_proto::encode_chunk(
                &mut self.msg,
                seq,
                op,
                reply,
                size,
                off as u32,
                &self.tx[off..off + len],
            )?;
            self.send_msg(i, n, complete)?;
            off += len;
        }
        Ok(())
    }

    /// Sends the first `n` bytes of `msg` on link `i`, draining every
    /// link's answers into `complete` while the send queue is full.
    fn send_msg(
        &mut self,
        i: usize,
        n: usize,
        complete: &mut impl FnMut(&mut Link<D::Conn>, u64, u64),
    ) -> Res<()> {
        let t0 = self.now();
        loop {
            match self.links[i].conn.send(&self.msg[..n]) {
                Ok(()) => return Ok(()),
                Err(dataplane::transport::Error::QueueFull) => {
                    let t = self.now();
                    for l in &mut self.links {
                        drain(l, &mut self.buf, t, &mut *complete)?;
                    }
                    if self.now().saturating_sub(t0) > self.op_timeout_ns {
                        return Err(Fail::runtime(format!(
                            "server {}: send queue full for {:.1} s",
                            self.links[i].addr,
                            self.op_timeout_ns as f64 / 1e9
                        )));
                    }
                }
                Err(e) => return Err(Fail::caused(format!("sending to {}", self.links[i].addr))(e)),
            }
        }
    }

    fn read_op(&self, i: usize, size: u32, seq: u64) -> ReadOp {
        let l = &self.links[i];
        ReadOp {
            wr_id: seq,
            remote: RemoteRef {
                len: size,
                ..l.remote
            },
            local: LocalRef {
                len: size,
                ..l.landing
            },
        }
    }

    /// Reaps one-sided completions (READ, rdma WRITE) of link `i`; returns how many.
    fn reap(&mut self, i: usize) -> Res<usize> {
        let n = self.links[i].conn.poll_completions(&mut self.comps)?;
        for c in &self.comps[..n] {
            if let Err(k) = c.status {
                return Err(Fail::runtime(format!(
                    "a one-sided operation on {} failed: {k:?} (a WRITE needs a server \
                     started with --writable)",
                    self.links[i].addr
                )));
            }
        }
        Ok(n)
    }

    /// How `verb` travels on this run's transport.
    fn path(&self, verb: Verb) -> Path {
        match verb {
            Verb::Read => Path::OneSided(Verb::Read),
            // Only latency Links set up the ping-pong (`raw_send::setup_write`).
            Verb::Write if self.raw_write.is_some() => Path::RawWrite,
            Verb::Write if self.write_one_sided => Path::OneSided(Verb::Write),
            Verb::Send if self.raw.is_some() => Path::RawSend,
            _ => Path::Message(verb.op()),
        }
    }

    /// Posts up to `n` (at most [`POST_AT_ONCE`]) one-sided operations of
    /// `size` bytes on link `i` in one call, numbered from the link's
    /// `started`; returns how many the transport took.
    fn post_one_sided(
        &mut self,
        i: usize,
        verb: Verb,
        size: u32,
        n: usize,
    ) -> Result<usize, TransportError> {
        let n = n.min(POST_AT_ONCE);
        let first = self.links[i].started;
        let mut ops = [self.read_op(i, size, first); POST_AT_ONCE];
        for (k, op) in ops.iter_mut().enumerate().take(n) {
            op.wr_id = first + k as u64;
        }
        let conn = &mut self.links[i].conn;
        if verb == Verb::Write {
            post_writes::<D>(conn, &ops[..n])
        } else {
            conn.post_reads(&ops[..n])
        }
    }

    /// Posts operation `seq` of `size` bytes on link `i` (latency: one at a
    /// time). An earlier link's answer drained while this one's send queue
    /// was full ends that link's operation.
    fn post_one(&mut self, i: usize, path: Path, size: u32, seq: u64) -> Res<()> {
        match path {
            Path::OneSided(verb) => {
                self.links[i].started = seq;
                // The message is built only on an error: formatting it on
                // every post cost 2 us per READ in an emulated guest.
                self.post_one_sided(i, verb, size, 1).map(|_| ()).map_err(|e| {
                    let what = format!(
                        "posting a {} to {}",
                        verb.name().to_uppercase(),
                        self.links[i].addr
                    );
                    Fail::caused(what)(e)
                })
            }
            Path::Message(op) => {
                let mut done_early = |l: &mut Link<D::Conn>, s: u64, _t: u64| {
                    if s == seq {
                        l.inflight = 0;
                    }
                };
                self.send_op(i, seq, op, Reply::Full, size, &mut done_early)
            }
            Path::RawSend => self.raw_post_one(i, size, seq),
            Path::RawWrite => self.raw_write_post(i, size, seq),
        }
    }

    /// Whether link `i`'s operation `seq` finished (latency).
    fn finished(&mut self, i: usize, path: Path, size: u32, seq: u64) -> Res<bool> {
        Ok(match path {
            Path::RawSend => self.raw_finished(i, size, seq)?,
            Path::RawWrite => self.raw_write_finished(i, size, seq)?,
            Path::OneSided(_) => self.reap(i)? > 0,
            Path::Message(_) => {
                let mut hit = false;
                let t = self.now();
                drain(&mut self.links[i], &mut self.buf, t, |_, s, _| hit |= s == seq)?;
                hit
            }
        })
    }

    /// Latency: every link has one operation in flight at a time; each
    /// round posts one to every link and waits for all (with one link:
    /// perftest's ping-pong). Records per-operation latency.
    fn latency(&mut self, verb: Verb, size: u32, warmup: u64, stop: Stop) -> Res<Recorder> {
        let path = self.path(verb);
        self.load_write_sources(path, size)?;
        if path == Path::RawSend {
            self.raw_open(true)?;
        }
        if path == Path::RawWrite {
            self.write_open(size)?;
        }
        let mut rec = Recorder::new();
        let started = self.now();
        let until = match stop {
            Stop::For(d) => Some(started + d.as_nanos().min(u128::from(u64::MAX / 4)) as u64),
            Stop::Count(_) => None,
        };
        let mut round = 0u64;
        loop {
            let measured = round >= warmup;
            if measured {
                match (stop, until) {
                    (Stop::Count(n), _) if round - warmup >= n => break,
                    (_, Some(t)) if self.now() >= t => break,
                    _ => {}
                }
            }
            let seq = round;
            round += 1;
            // Post one operation on every link.
            for i in 0..self.links.len() {
                self.links[i].t_post = self.now();
                self.links[i].inflight = 1;
                self.post_one(i, path, size, seq)?;
                if self.split.is_some() {
                    self.links[i].t_posted = self.now();
                }
            }
            // Answers drained while sending count now (their time is a bound).
            if measured {
                for l in &self.links {
                    if l.inflight == 0 {
                        let dt = self.clock.now().as_nanos().saturating_sub(l.t_post);
                        rec.record(path.latency_of(dt));
                    }
                }
            }
            self.wait_round(path, size, seq, measured.then_some(&mut rec))?;
        }
        self.verify(path, size, round.checked_sub(1))?;
        if self.split.is_some() {
            // What one clock read costs here (two back to back).
            let mut clock = Recorder::new();
            for _ in 0..100 {
                let t = self.now();
                clock.record(self.now().saturating_sub(t));
            }
            let Some((post, rest)) = self.split.as_mut() else {
                return Ok(rec);
            };
            eprintln!(
                "lat split {} {size} B: post call p50 {} ns, post return to completion p50 {} ns \
                 (round trip, {} operations); clock read p50 {} ns",
                verb.name(),
                post.percentile_ns(50.0),
                rest.percentile_ns(50.0),
                post.count(),
                clock.percentile_ns(50.0)
            );
            *post = Recorder::new();
            *rest = Recorder::new();
        }
        Ok(rec)
    }

    /// Waits (bounded by the operation timeout) until every link's
    /// operation `seq` finished, recording each one's latency into `rec`.
    fn wait_round(
        &mut self,
        path: Path,
        size: u32,
        seq: u64,
        mut rec: Option<&mut Recorder>,
    ) -> Res<()> {
        let mut pending = self.links.iter().filter(|l| l.inflight == 1).count();
        // The timeout counts from the posts: no clock read of its own (a
        // read costs microseconds in an emulated guest without a stable TSC).
        let t_wait = self.links.iter().map(|l| l.t_post).min().unwrap_or(0);
        let mut spins = 0u32;
        while pending > 0 {
            for i in 0..self.links.len() {
                if self.links[i].inflight == 0 || !self.finished(i, path, size, seq)? {
                    continue;
                }
                let t = self.now();
                let dt = t.saturating_sub(self.links[i].t_post);
                self.links[i].inflight = 0;
                pending -= 1;
                if let Some(rec) = rec.as_deref_mut() {
                    rec.record(path.latency_of(dt));
                    if let Some((post, rest)) = self.split.as_mut() {
                        let l = &self.links[i];
                        post.record(l.t_posted.saturating_sub(l.t_post));
                        rest.record(t.saturating_sub(l.t_posted));
                    }
                }
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) && self.now().saturating_sub(t_wait) > self.op_timeout_ns
            {
                return Err(Fail::runtime(format!(
                    "no answer within {:.1} s ({pending} {size}-byte {:?})",
                    self.op_timeout_ns as f64 / 1e9,
                    path
                )));
            }
        }
        Ok(())
    }

    /// The bytes of link `i`'s landing slot (a READ's destination, a one-sided
    /// WRITE's source), `len` of them.
    fn slot_offset(&self, i: usize) -> u64 {
        self.links[i].landing.offset - self.landing.1.addr_base()
    }

    /// One-sided WRITEs send each link's landing slot: it holds the server
    /// object's own bytes (object 0's pattern), so a WRITE leaves the object
    /// as it was and READ runs against the same server still verify.
    fn load_write_sources(&mut self, path: Path, size: u32) -> Res<()> {
        if path != Path::OneSided(Verb::Write) {
            return Ok(());
        }
        let mut bytes = vec![0u8; size as usize];
        crate::pattern::fill(&mut bytes, 0);
        for i in 0..self.links.len() {
            self.landing.0.write_at(self.slot_offset(i), &bytes)?;
        }
        Ok(())
    }

    /// Runs one one-sided operation on link `i` to completion (verification).
    fn one_sided_now(&mut self, i: usize, verb: Verb, size: u32) -> Res<()> {
        self.links[i].t_post = self.now();
        self.links[i].inflight = 1;
        self.post_one(i, Path::OneSided(verb), size, u64::MAX)?;
        self.wait_round(Path::OneSided(verb), size, u64::MAX, None)
    }

    /// Checks the bytes of every link's last operation: a READ's landing
    /// slot against the server's object (`pattern` of object 0), a
    /// WRITE/SEND answer against what was sent, and a one-sided WRITE by
    /// writing a marker, reading it back and writing the object's bytes again.
    fn verify(&mut self, path: Path, size: u32, last_seq: Option<u64>) -> Res<()> {
        let n = size as usize;
        let mut want = vec![0u8; n];
        let mut got = vec![0u8; n];
        for i in 0..self.links.len() {
            match path {
                Path::OneSided(Verb::Write) => {
                    crate::pattern::fill(&mut want, 0x5e);
                    self.landing.0.write_at(self.slot_offset(i), &want)?;
                    self.one_sided_now(i, Verb::Write, size)?;
                    self.landing.0.write_at(self.slot_offset(i), &got)?;
                    self.one_sided_now(i, Verb::Read, size)?;
                    self.landing.0.read_at(self.slot_offset(i), &mut got)?;
                    self.load_write_sources(path, size)?;
                    self.one_sided_now(i, Verb::Write, size)?;
                }
                Path::OneSided(_) => {
                    // The server's object 0, prefix of `size` bytes (the pattern
                    // is positional, so a prefix of the object is the pattern's prefix).
                    crate::pattern::fill(&mut want, 0);
                    self.landing.0.read_at(self.slot_offset(i), &mut got)?;
                }
                Path::Message(_) => {
                    want.copy_from_slice(&self.tx[..n]);
                    got.copy_from_slice(&self.links[i].rx[..n]);
                }
                Path::RawSend => {
                    want.copy_from_slice(&self.tx[..n]);
                    self.landing.0.read_at(self.slot_offset(i), &mut got)?;
                }
                Path::RawWrite => {
                    // The last operation's bytes, back from the server's buffer.
                    want.copy_from_slice(&self.tx[..n]);
                    if let (Some(last), Some(end)) = (last_seq, want.last_mut()) {
                        *end = perf_proto::write_marker(last);
                    }
                    self.raw_write_landed(i, &mut got)?;
                }
            }
            if got != want {
                let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
                return Err(Fail::runtime(format!(
                    "link {i} to {}: the {size}-byte {:?}'s bytes differ from what was sent/served (first at byte {at})",
                    self.links[i].addr, path
                )));
            }
        }
        Ok(())
    }

    /// Bandwidth: every link keeps `depth` operations in flight until the
    /// stop condition (or `flag`) says stop, then the rest drain. `warmup`
    /// operations per link run first, unmeasured.
    fn bandwidth(
        &mut self,
        st: Stream,
        warmup: u64,
        stop: Stop,
        flag: Option<&AtomicBool>,
        running: Option<&AtomicBool>,
    ) -> Res<BwStats> {
        self.load_write_sources(self.path(st.verb), st.size)?;
        if self.path(st.verb) == Path::RawSend {
            self.raw_open(false)?;
        }
        if warmup > 0 {
            self.bw_phase(st, Stop::Count(warmup), None, None, &mut Vec::new())?;
            self.check_tally(&st)?;
        }
        let cap = match stop {
            Stop::Count(n) => n.saturating_mul(self.links.len() as u64).min(1 << 24) as usize,
            Stop::For(_) => 1 << 21,
        };
        let mut stamps: Vec<u64> = Vec::with_capacity(cap);
        let (start, mut end) = self.bw_phase(st, stop, flag, running, &mut stamps)?;
        if let Some(answered) = self.check_tally(&st)? {
            if !self.sends_delivered {
                // Nothing said when the SENDs landed: the run ends at the tally.
                end = answered;
            }
        }
        let Stream {
            verb,
            size,
            bidirectional,
            ..
        } = st;
        let total: u64 = self.links.iter().map(|l| l.done).sum();
        let dirs = if bidirectional && verb != Verb::Read {
            2
        } else {
            1
        };
        Ok(BwStats {
            bytes: size,
            ops: total * dirs,
            elapsed_ns: end.saturating_sub(start),
            peak_bytes_per_s: peak_rate(&stamps, start, f64::from(size) * dirs as f64),
        })
    }

    /// Bandwidth: posts up to `room` operations on link `i`.
    fn post_stream(
        &mut self,
        i: usize,
        st: &Stream,
        room: u64,
        stamps: &mut Vec<u64>,
    ) -> Res<()> {
        match self.path(st.verb) {
            Path::OneSided(verb) => {
                let max = self.links[i].conn.max_outstanding_reads().max(1);
                let mut room = room.min(max.saturating_sub(self.links[i].inflight) as u64);
                while room > 0 {
                    let ask = (room as usize).min(st.post_list.clamp(1, POST_AT_ONCE));
                    match self.post_one_sided(i, verb, st.size, ask) {
                        Ok(n) => {
                            self.links[i].started += n as u64;
                            self.links[i].inflight += n;
                            room -= n as u64;
                            if n < ask {
                                break;
                            }
                        }
                        Err(TransportError::QueueFull) => break,
                        Err(e) => {
                            let what = format!("posting a {} to {}", verb.name().to_uppercase(), self.links[i].addr);
                            return Err(Fail::caused(what)(e));
                        }
                    }
                }
            }
            Path::RawSend => self.raw_post_stream(i, st.size, room)?,
            Path::RawWrite => return Err(Fail::runtime("a WRITE ping-pong has no bandwidth stream")),
            Path::Message(_) if is_send_stream(st) => self.post_send_stream(i, st.size, room, stamps)?,
            Path::Message(op) => {
                let reply = if st.bidirectional {
                    Reply::Full
                } else {
                    Reply::Ack
                };
                for _ in 0..room {
                    let seq = self.links[i].started;
                    self.links[i].started += 1;
                    self.links[i].inflight += 1;
                    let mut on_done = |l: &mut Link<D::Conn>, _s: u64, t: u64| {
                        stream_done(l, stamps, t, 1);
                    };
                    self.send_op(i, seq, op, reply, st.size, &mut on_done)?;
                }
            }
        }
        Ok(())
    }

    /// Bandwidth: reaps link `i`'s finished operations; whether there were any.
    fn reap_stream(&mut self, i: usize, st: &Stream, stamps: &mut Vec<u64>) -> Res<bool> {
        match self.path(st.verb) {
            Path::OneSided(_) => {
                let n = self.reap(i)?;
                if n > 0 {
                    let t = self.now();
                    stream_done(&mut self.links[i], stamps, t, n);
                }
                Ok(n > 0)
            }
            Path::RawSend => self.raw_reap_stream(i, stamps),
            Path::RawWrite => Err(Fail::runtime("a WRITE ping-pong has no bandwidth stream")),
            Path::Message(_) if is_send_stream(st) => self.reap_send_stream(i, st, stamps),
            Path::Message(_) => {
                let t = self.now();
                drain(&mut self.links[i], &mut self.buf, t, |l, _, t| {
                    stream_done(l, stamps, t, 1)
                })
            }
        }
    }

    fn bw_phase(
        &mut self,
        st: Stream,
        stop: Stop,
        flag: Option<&AtomicBool>,
        running: Option<&AtomicBool>,
        stamps: &mut Vec<u64>,
    ) -> Res<(u64, u64)> {
        self.reset();
        let per_link = match stop {
            Stop::Count(n) => n,
            Stop::For(_) => u64::MAX,
        };
        let start = self.now();
        let until = match stop {
            Stop::For(d) => start + d.as_nanos().min(u128::from(u64::MAX / 4)) as u64,
            Stop::Count(_) => u64::MAX,
        };
        let mut last = start;
        let mut last_progress = start;
        let mut spins = 0u32;
        let mut stopping = false;
        let mut signalled = false;
        loop {
            if !stopping {
                stopping = flag.is_some_and(|f| f.load(Ordering::Relaxed))
                    || (until != u64::MAX && spins.is_multiple_of(64) && self.now() >= until);
            }
            let mut outstanding = 0usize;
            let mut finished = true;
            for i in 0..self.links.len() {
                // Post up to the depth.
                let l = &self.links[i];
                let want = if stopping {
                    0
                } else {
                    st.depth.saturating_sub(l.inflight) as u64
                };
                let room = want.min(per_link - l.started);
                if room > 0 {
                    self.post_stream(i, &st, room, stamps)?;
                }
                if self.reap_stream(i, &st, stamps)? {
                    last_progress = self.now();
                    last = last_progress;
                }
                let l = &self.links[i];
                outstanding += l.inflight;
                if !(l.inflight == 0 && (stopping || l.started >= per_link)) {
                    finished = false;
                }
            }
            if let Some(r) = running {
                if !signalled && self.links.iter().any(|l| l.done > 0) {
                    r.store(true, Ordering::Release);
                    signalled = true;
                }
            }
            if finished {
                break;
            }
            spins = spins.wrapping_add(1);
            if outstanding > 0
                && spins.is_multiple_of(1024)
                && self.now().saturating_sub(last_progress) > self.op_timeout_ns
            {
                return Err(Fail::runtime(format!(
                    "{outstanding} {}-byte {} operation(s) unanswered for {:.1} s",
                    st.size,
                    st.verb.name(),
                    self.op_timeout_ns as f64 / 1e9
                )));
            }
        }
        if let Some(r) = running {
            r.store(true, Ordering::Release);
        }
        Ok((start, last))
    }
}

/// Bandwidth: `n` of link `l`'s operations finished at time `t`.
fn stream_done<C>(l: &mut Link<C>, stamps: &mut Vec<u64>, t: u64, n: usize) {
    l.inflight = l.inflight.saturating_sub(n);
    l.done += n as u64;
    for _ in 0..n {
        if stamps.len() < stamps.capacity() {
            stamps.push(t);
        }
    }
}

/// Runs a whole `lat`/`bw` measurement against `addrs` (P servers).
pub struct PerfRun {
    /// Server addresses.
    pub addrs: Vec<String>,
    /// What to measure.
    pub cfg: PerfConfig,
}

fn check_verb<D: Domain>(kind: &str, verb: Verb) -> Res<()> {
    if verb == Verb::Write && kind == "rdma" && !writes_one_sided::<D>() {
        return Err(Fail::usage(
            "--verb write over rdma: this netbench reaches verbs through the dataplane's \
             transport-neutral connection, which has READ and SEND but no WRITE; rebuild \
             with `cargo build -p netbench --features rdma` for RDMA WRITE",
        ));
    }
    Ok(())
}

impl WithDomain for PerfRun {
    /// The results per size, and which device, port and GID rdma used.
    type Out = (Vec<SizeResult>, Option<String>);
    fn run<D: Domain>(self, domain: D) -> Res<Self::Out> {
        let cfg = self.cfg;
        check_verb::<D>(domain.kind(), cfg.verb)?;
        if let Some(l) = cfg.under_load {
            check_verb::<D>(domain.kind(), l.verb)?;
        }
        let max = cfg.max_size();
        if max > domain.max_read_len() {
            return Err(Fail::usage(format!(
                "size {max}: larger than the {} transport's longest operation ({} bytes)",
                domain.kind(),
                domain.max_read_len()
            )));
        }
        let mut links = connect_links(
            &domain,
            &self.addrs,
            cfg.queue_pairs,
            max,
            cfg.connect_timeout,
            cfg.op_timeout,
        )?;
        if cfg.verb == Verb::Send && !cfg.bidirectional {
            links.raw = raw_send::setup(&domain, &mut links, cfg.rx_depth)?;
        }
        if cfg.verb == Verb::Write && cfg.test == Test::Lat && writes_one_sided::<D>() {
            links.raw_write = Some(raw_send::setup_write(&domain, &mut links)?);
        }
        let mut out = Vec::with_capacity(cfg.sizes.len());
        for &size in &cfg.sizes {
            let mut r = SizeResult {
                bytes: size,
                ..Default::default()
            };
            match cfg.test {
                Test::Lat => {
                    r.lat = Some(links.latency(cfg.verb, size, cfg.warmup, cfg.stop)?);
                    if let Some(load) = cfg.under_load {
                        let (lat, bw) =
                            under_load(&domain, &self.addrs, &cfg, load, &mut links, size)?;
                        r.lat_loaded = Some(lat);
                        r.load_bw = Some(bw);
                    }
                }
                Test::Bw => {
                    let depth = cfg.tx_depth.max(1);
                    let st = Stream {
                        verb: cfg.verb,
                        size,
                        depth,
                        post_list: cfg.post_list,
                        bidirectional: cfg.bidirectional,
                    };
                    r.bw = Some(links.bandwidth(st, cfg.warmup, cfg.stop, None, None)?);
                }
            }
            out.push(r);
        }
        Ok((out, verbs_endpoint(&domain)))
    }
}

/// The device, port and GID an rdma domain opened (what `-d/-i/-x` chose).
fn verbs_endpoint<D: Domain>(domain: &D) -> Option<String> {
    #[cfg(feature = "rdma")]
    if let Some(d) = (domain as &dyn std::any::Any).downcast_ref::<dataplane::transport::rdma::RdmaDomain>() {
        return Some(format!(
            "device {}, port {}, GID index {} ({})",
            d.device_name(),
            d.port(),
            d.gid_index(),
            d.gid()
        ));
    }
    let _ = domain;
    None
}

/// Runs the latency test at `size` again while another thread, on its own
/// connections (one per server), keeps `load` streaming until it is done.
fn under_load<D: Domain>(
    domain: &D,
    addrs: &[String],
    cfg: &PerfConfig,
    load: LoadSpec,
    links: &mut Links<D>,
    size: u32,
) -> Res<(Recorder, BwStats)> {
    let stop = Arc::new(AtomicBool::new(false));
    let running = Arc::new(AtomicBool::new(false));
    let handle = {
        let (domain, addrs, stop, running) = (
            domain.clone(),
            addrs.to_vec(),
            stop.clone(),
            running.clone(),
        );
        let (connect_timeout, op_timeout, post_list, rx_depth) =
            (cfg.connect_timeout, cfg.op_timeout, cfg.post_list, cfg.rx_depth);
        std::thread::spawn(move || -> Res<BwStats> {
            let r = connect_links(&domain, &addrs, 1, load.size, connect_timeout, op_timeout)
                .and_then(|mut l| {
                    if load.verb == Verb::Send {
                        l.raw = raw_send::setup(&domain, &mut l, rx_depth)?;
                    }
                    let st = Stream {
                        verb: load.verb,
                        size: load.size,
                        depth: load.tx_depth.max(1),
                        post_list,
                        bidirectional: false,
                    };
                    l.bandwidth(
                        st,
                        0,
                        Stop::For(std::time::Duration::from_secs(24 * 3600)),
                        Some(&stop),
                        Some(&running),
                    )
                });
            running.store(true, Ordering::Release);
            r
        })
    };
    // Wait (bounded) for the stream's first completion.
    let t0 = std::time::Instant::now();
    while !running.load(Ordering::Acquire) {
        if t0.elapsed()
            > cfg.op_timeout + std::time::Duration::from_nanos(cfg.connect_timeout.as_nanos())
        {
            stop.store(true, Ordering::Relaxed);
            break;
        }
        std::thread::yield_now();
    }
    let lat = links.latency(cfg.verb, size, cfg.warmup, cfg.stop);
    stop.store(true, Ordering::Relaxed);
    let bw = handle
        .join()
        .map_err(|_| Fail::runtime("the load stream's thread panicked"))?;
    Ok((lat?, bw?))
}

/// perftest's `-a` sizes: 2, 4, ... up to 8 MiB.
pub fn all_sizes() -> Vec<u32> {
    (1..=23).map(|k| 1u32 << k).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_sizes_are_perftests() {
        let s = all_sizes();
        assert_eq!((s[0], *s.last().unwrap(), s.len()), (2, 8 << 20, 23));
    }
}
