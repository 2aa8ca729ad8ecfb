//! The reader side: connects to every peer, learns each peer's objects from
//! its catalog, then runs rounds. A round posts all its READs at once (each
//! peer's as one `post_reads`, up to the concurrency window), polls every
//! connection until the last completion, and records the round time (the
//! input fetch of one batch) and each READ's post-to-completion time. After
//! each round (or every `ping_every` rounds) one control message round trip
//! is timed to one peer, in turn, outside the round's time.
//!
//! Only this process's monotonic clock is read: nothing compares clocks
//! across hosts.

use std::sync::Arc;

use dataplane::mem::{Access, Region};
use dataplane::time::{Duration, MonotonicClock};
use dataplane::transport::{Completion, Connection, Domain, ReadOp, Registration, RemoteRef};
use dataplane::wire::MAX_MESSAGE_LEN;

use crate::fail::{Fail, Res};
use crate::stats::Recorder;
use crate::{pattern, proto};

/// How to measure.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// Objects expected at every peer.
    pub objects: u32,
    /// Bytes per object.
    pub size: u32,
    /// Measured rounds.
    pub iters: u64,
    /// Unmeasured rounds first.
    pub warmup: u64,
    /// READs outstanding per peer (None = all of the round's at once).
    pub concurrency: Option<usize>,
    /// Control message size, bytes.
    pub ping_size: usize,
    /// Time one control message round trip every this many rounds (0 = never).
    pub ping_every: u64,
    /// Check one READ's bytes every this many rounds (0 = never).
    pub verify_every: u64,
    /// Connect + catalog bound per peer.
    pub connect_timeout: Duration,
    /// Bound on one round (and one ping).
    pub round_timeout: Duration,
    /// How the reader waits for a READ completion or a ping's echo.
    pub reader_idle: ReaderIdle,
}

/// How the reader waits for answers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ReaderIdle {
    /// Busy-poll every connection (what a frontend's data path does).
    #[default]
    Spin,
    /// Sleep in the kernel on the connection while waiting for one peer
    /// (a ping's echo; a round's READs when there is one peer), like a
    /// blocking client (sockperf's, qperf's). Transports that cannot
    /// sleep (rdma) poll instead; rounds across several peers always poll.
    Block,
}

/// Longest single sleep of a blocking reader; the round and ping
/// timeouts are checked between sleeps.
const READER_SLEEP: Duration = Duration::from_millis(20);

/// One READ of a round: object `object` of peer `peer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Input {
    /// Peer index.
    pub peer: usize,
    /// Object index at that peer.
    pub object: u32,
}

/// The paper's incast: every object of every peer.
pub fn full_plan(peers: usize, objects: u32) -> Vec<Input> {
    (0..peers)
        .flat_map(|peer| (0..objects).map(move |object| Input { peer, object }))
        .collect()
}

/// A batch of `b` inputs spread over the peers round-robin (input i from
/// peer i mod P), as a batch whose requests came through P frontends.
pub fn batch_plan(peers: usize, objects: u32, b: usize) -> Vec<Input> {
    (0..b)
        .map(|i| Input {
            peer: i % peers,
            object: ((i / peers) % objects as usize) as u32,
        })
        .collect()
}

/// Results of one run.
#[derive(Debug, Default)]
pub struct RunResult {
    /// Round completion times.
    pub round: Recorder,
    /// Per-READ post-to-completion times.
    pub read: Recorder,
    /// Control message round trips.
    pub ctrl: Recorder,
    /// READs whose bytes were checked.
    pub verified: u64,
}

struct Peer<C> {
    addr: String,
    conn: C,
    objects: Vec<RemoteRef>,
}

/// Connections to every peer plus a landing region.
pub struct Client<D: Domain> {
    domain: D,
    peers: Vec<Peer<D::Conn>>,
    cfg: BenchConfig,
    landing: Option<(Arc<Region>, Registration)>,
    clock: MonotonicClock,
}

impl<D: Domain> Client<D> {
    /// Connects to every address and fetches its catalog, checking that it
    /// serves exactly `objects` objects of `size` bytes.
    pub fn connect(domain: D, addrs: &[String], cfg: BenchConfig) -> Res<Self> {
        if addrs.is_empty() {
            return Err(Fail::usage("no peers given"));
        }
        let mut peers = Vec::with_capacity(addrs.len());
        let mut buf = vec![0u8; MAX_MESSAGE_LEN];
        for addr in addrs {
            let t = std::time::Duration::from_nanos(cfg.connect_timeout.as_nanos());
            let deadline = std::time::Instant::now() + t;
            let mut conn = domain.connect(addr, cfg.connect_timeout).map_err(Fail::caused(format!(
                "cannot connect to peer {addr} over {} within {:.1} s",
                domain.kind(),
                t.as_secs_f64()
            )))?;
            let n = proto::encode_hello(&mut buf, cfg.objects)?;
            proto::send_by(&mut conn, &buf[..n], deadline)
                .map_err(|e| e.context(format!("peer {addr}")))?;
            let n = proto::recv_by(&mut conn, &mut buf, deadline).map_err(|e| {
                e.context(format!(
                    "peer {addr} sent no catalog within {:.1} s",
                    t.as_secs_f64()
                ))
            })?;
            let (_, objects) =
                proto::decode_catalog(&buf[..n]).map_err(|e| e.context(format!("peer {addr}")))?;
            let sizes_ok = objects.iter().all(|r| r.len == cfg.size);
            if objects.len() != cfg.objects as usize || !sizes_ok {
                let got = objects.first().map_or(0, |r| r.len);
                return Err(Fail::runtime(format!(
                    "peer {addr} serves {} object(s) of {got} bytes, but this run asked for \
                     --objects {} --size {} (start the server with the same --objects/--size)",
                    objects.len(),
                    cfg.objects,
                    cfg.size
                )));
            }
            peers.push(Peer {
                addr: addr.clone(),
                conn,
                objects,
            });
        }
        Ok(Client {
            domain,
            peers,
            cfg,
            landing: None,
            clock: MonotonicClock::new(),
        })
    }

    /// A landing region with room for `inputs` objects (reused if big enough).
    fn landing(&mut self, inputs: usize, max_landing: u64) -> Res<(Arc<Region>, Registration)> {
        let need = inputs as u64 * u64::from(self.cfg.size);
        if let Some((r, reg)) = &self.landing {
            if r.len() as u64 >= need {
                return Ok((r.clone(), reg.clone()));
            }
        }
        if need > max_landing {
            return Err(Fail::usage(format!(
                "{inputs} READs x {} bytes = {need} bytes of landing buffers: over the limit of \
                 {max_landing} bytes (--max-region)",
                self.cfg.size
            )));
        }
        let region = Region::anonymous(need as usize).map_err(Fail::caused(format!("cannot map {need} bytes of landing buffers")))?;
        let reg = self.domain.register(&region, Access::LOCAL_WRITE)?;
        if let Some((_, old)) = self.landing.take() {
            let _ = self.domain.deregister(&old);
        }
        self.landing = Some((region.clone(), reg.clone()));
        Ok((region, reg))
    }

    /// Each peer's READs of one round of `plan`, landing in `reg`.
    fn round_for(&self, plan: &[Input], reg: &Registration) -> Res<Round> {
        let p_count = self.peers.len();
        let size = self.cfg.size;
        // Each peer's READs of a round, in plan order; wr_id = input index
        // (so input i always lands in slot i).
        let mut ops: Vec<Vec<ReadOp>> = vec![Vec::new(); p_count];
        for (i, inp) in plan.iter().enumerate() {
            let peer = &self.peers[inp.peer];
            ops[inp.peer].push(ReadOp {
                wr_id: i as u64,
                remote: peer.objects[inp.object as usize],
                local: reg.local_ref(i as u64 * u64::from(size), size)?,
            });
        }
        let windows: Vec<usize> = self
            .peers
            .iter()
            .map(|p| {
                let w = p.conn.max_outstanding_reads().max(1);
                self.cfg.concurrency.map_or(w, |c| c.clamp(1, w))
            })
            .collect();
        Ok(Round {
            ops,
            windows,
            next: vec![0; p_count],
            inflight: vec![0; p_count],
            post_ns: vec![0; plan.len()],
        })
    }

    /// Runs `warmup` + `iters` rounds of `plan`.
    pub fn run(&mut self, plan: &[Input], max_landing: u64) -> Res<RunResult> {
        let size = self.cfg.size;
        if plan.is_empty() {
            return Err(Fail::usage("a round needs at least one READ"));
        }
        let (region, reg) = self.landing(plan.len(), max_landing)?;
        let mut round = self.round_for(plan, &reg)?;
        let mut comps = vec![Completion::default(); 64];
        let mut scratch = vec![0u8; size as usize];
        let mut msg = vec![0u8; MAX_MESSAGE_LEN];
        let mut ping = proto::Ping::new(self.cfg.ping_size)?;
        let mut res = RunResult::default();
        let timeout_ns = self.cfg.round_timeout.as_nanos();
        let total_rounds = self.cfg.warmup + self.cfg.iters;

        for r in 0..total_rounds {
            let measured = r >= self.cfg.warmup;
            let sample = (self.cfg.verify_every > 0 && r % self.cfg.verify_every == 0).then(|| {
                ((r / self.cfg.verify_every).wrapping_mul(7919) % plan.len() as u64) as usize
            });
            if let Some(i) = sample {
                // Poison the slot: bytes from an earlier round must not pass.
                scratch.fill(0xA5);
                region.write_at(i as u64 * u64::from(size), &scratch)?;
            }
            let reads = measured.then_some(&mut res.read);
            let (t0, last) = self.one_round(r, plan, &mut round, &mut comps, reads)?;
            if measured {
                res.round.record(last - t0);
            }
            if let Some(i) = sample {
                region.read_at(i as u64 * u64::from(size), &mut scratch)?;
                let inp = plan[i];
                pattern::verify(&scratch, inp.object).map_err(|off| {
                    Fail::runtime(format!(
                        "content check failed: object {} from peer {}, first wrong byte at offset {off}",
                        inp.object, self.peers[inp.peer].addr
                    ))
                })?;
                res.verified += 1;
            }
            // One control message round trip, to each peer in turn.
            if self.cfg.ping_every > 0 && r % self.cfg.ping_every == 0 {
                let k = r / self.cfg.ping_every;
                let p = (k % self.peers.len() as u64) as usize;
                let rtt = self.ping(p, &mut ping, r, &mut msg, timeout_ns)?;
                if measured {
                    res.ctrl.record(rtt);
                }
            }
        }
        Ok(res)
    }

    /// Round `r`: posts every READ of `plan` (each peer up to its window),
    /// reaps them all, recording each READ's latency into `reads` when
    /// measured. Returns the round's first post and last completion times.
    fn one_round(
        &mut self,
        r: u64,
        plan: &[Input],
        round: &mut Round,
        comps: &mut [Completion],
        mut reads: Option<&mut Recorder>,
    ) -> Res<(u64, u64)> {
        let p_count = self.peers.len();
        let clock = self.clock;
        let timeout_ns = self.cfg.round_timeout.as_nanos();
        round.next.fill(0);
        round.inflight.fill(0);
        let mut done = 0usize;
        let t0 = clock.now().as_nanos();
        let mut last = t0;
        for p in 0..p_count {
            round.post(p, &mut self.peers[p], &clock)?;
        }
        let block = self.cfg.reader_idle == ReaderIdle::Block && p_count == 1;
        while done < plan.len() {
            for p in 0..p_count {
                if !round.unfinished(p) {
                    continue;
                }
                let peer = &mut self.peers[p];
                if block {
                    // Errors surface in the poll below.
                    let _ = peer.conn.wait(READER_SLEEP);
                }
                let k = peer
                    .conn
                    .poll_completions(comps)
                    .map_err(Fail::caused(format!("peer {}", peer.addr)))?;
                if k > 0 {
                    let now = clock.now().as_nanos();
                    for c in &comps[..k] {
                        let i = c.wr_id as usize;
                        if let Err(kind) = c.status {
                            let obj = plan.get(i).map_or(0, |x| x.object);
                            return Err(Fail::runtime(format!(
                                "READ of object {obj} from peer {} failed: {kind:?}",
                                peer.addr
                            )));
                        }
                        if let Some(rec) = reads.as_deref_mut() {
                            rec.record(now.saturating_sub(round.post_ns[i]));
                        }
                    }
                    round.inflight[p] -= k;
                    done += k;
                    last = now;
                    round.post(p, peer, &clock)?;
                }
            }
            if done < plan.len() && clock.now().as_nanos().saturating_sub(t0) > timeout_ns {
                let stuck: Vec<String> = (0..p_count)
                    .filter(|&p| round.unfinished(p))
                    .map(|p| {
                        format!(
                            "{} ({} READs unfinished)",
                            self.peers[p].addr,
                            round.inflight[p] + round.ops[p].len() - round.next[p]
                        )
                    })
                    .collect();
                return Err(Fail::runtime(format!(
                    "round {r} timed out after {:.1} ms (--round-timeout-ms) waiting for {}",
                    timeout_ns as f64 / 1e6,
                    stuck.join(", ")
                )));
            }
        }
        Ok((t0, last))
    }

    /// Times one control message round trip to peer `p` (busy-polls, or
    /// sleeps on the connection with `ReaderIdle::Block`).
    fn ping(
        &mut self,
        p: usize,
        ping: &mut proto::Ping,
        seq: u64,
        buf: &mut [u8],
        timeout_ns: u64,
    ) -> Res<u64> {
        let clock = self.clock;
        let peer = &mut self.peers[p];
        let t0 = clock.now().as_nanos();
        let deadline = std::time::Instant::now() + std::time::Duration::from_nanos(timeout_ns);
        proto::send_by(&mut peer.conn, ping.with_seq(seq), deadline)
            .map_err(|e| e.context(format!("ping to {}", peer.addr)))?;
        let block = self.cfg.reader_idle == ReaderIdle::Block;
        loop {
            if block {
                // Errors surface in try_recv.
                let _ = peer.conn.wait(READER_SLEEP);
            }
            match peer.conn.try_recv(buf) {
                Ok(Some(n)) => {
                    let t1 = clock.now().as_nanos();
                    if ping.is_echo(&buf[..n], seq) {
                        return Ok(t1 - t0);
                    }
                    return Err(Fail::runtime(format!(
                        "peer {} answered a ping with an unexpected {n}-byte message",
                        peer.addr
                    )));
                }
                Ok(None) => {}
                Err(e) => return Err(Fail::caused(format!("ping to {}", peer.addr))(e)),
            }
            if clock.now().as_nanos() - t0 > timeout_ns {
                return Err(Fail::runtime(format!(
                    "peer {} did not answer a ping within {:.1} ms",
                    peer.addr,
                    timeout_ns as f64 / 1e6
                )));
            }
        }
    }
}

/// One round's READs per peer and how far each peer got.
struct Round {
    /// Each peer's READs, in plan order; wr_id = input index.
    ops: Vec<Vec<ReadOp>>,
    /// READs in flight per peer at most.
    windows: Vec<usize>,
    /// Each peer's next READ to post.
    next: Vec<usize>,
    /// Each peer's READs posted and not reaped.
    inflight: Vec<usize>,
    /// Post time of each input's READ.
    post_ns: Vec<u64>,
}

impl Round {
    /// Whether peer `p` has READs left to post or reap.
    fn unfinished(&self, p: usize) -> bool {
        self.inflight[p] > 0 || self.next[p] < self.ops[p].len()
    }

    /// Posts peer `p`'s next READs up to its window, stamping their post time.
    fn post<C: Connection>(
        &mut self,
        p: usize,
        peer: &mut Peer<C>,
        clock: &MonotonicClock,
    ) -> Res<()> {
        let ops = &self.ops[p];
        let (next, inflight, window) = (&mut self.next[p], &mut self.inflight[p], self.windows[p]);
        while *next < ops.len() && *inflight < window {
            let end = ops.len().min(*next + (window - *inflight));
            let t = clock.now().as_nanos();
            match peer.conn.post_reads(&ops[*next..end]) {
                Ok(0) | Err(dataplane::transport::Error::QueueFull) => break,
                Ok(n) => {
                    for op in &ops[*next..*next + n] {
                        self.post_ns[op.wr_id as usize] = t;
                    }
                    *next += n;
                    *inflight += n;
                }
                Err(e) => return Err(Fail::caused(format!("posting READs to peer {}", peer.addr))(e)),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans() {
        let f = full_plan(2, 3);
        assert_eq!(f.len(), 6);
        assert_eq!(f[4], Input { peer: 1, object: 1 });
        let b = batch_plan(3, 2, 7);
        let peers: Vec<usize> = b.iter().map(|i| i.peer).collect();
        assert_eq!(peers, vec![0, 1, 2, 0, 1, 2, 0]);
        assert_eq!(b[6].object, 0, "wraps around the objects");
        assert_eq!(b[3].object, 1);
    }
}
