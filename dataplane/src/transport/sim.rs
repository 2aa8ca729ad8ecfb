//! `sim`: an in-memory transport on virtual time with seeded fault
//! injection, for the deterministic cluster harness (`symphony chaos`).
//!
//! It implements the same [`Domain`] / [`Listener`] / [`Connection`] traits
//! as `shm`, `tcp` and `rdma`, so the harness runs the daemons' real nodes
//! unchanged, in the way FoundationDB's simulator swaps its network for a
//! simulated one under unchanged actors. All nodes of a cluster share one
//! [`SimNet`]; each node gets its own [`SimDomain`] (`net.domain(node)`).
//!
//! Time is the harness's: [`SimNet::set_now`] moves it, nothing here reads a
//! clock. A message sent at `t` is delivered at `t + base_delay` (plus a
//! fault's extra delay); a READ completes at `t + read_delay`, copying the
//! bytes from the owner's registered region at that moment, with the same
//! checks the software transports make (key, owner, bounds, access).
//!
//! Faults, each drawn from one seeded generator in the order calls are
//! made, so the same seed and the same calls give the same run:
//! - **loss**: a message vanishes; a READ never completes until its timeout
//!   ([`FaultConfig::read_timeout`]) and then completes with `Timeout`;
//! - **duplication**: a message is delivered twice;
//! - **reordering**: a message is held back by up to `reorder_window`, so
//!   later ones overtake it;
//! - **partition** between two nodes ([`SimNet::partition`]): every message
//!   between them is lost and every READ times out, until healed;
//! - **crash** ([`SimNet::crash`]): every link of the node breaks (its peers
//!   see `PeerDisconnected` after the messages already under way), its
//!   registrations and listeners vanish, READs of its memory fail.
//!
//! Faults apply only from [`FaultConfig::active_from`] on, so a cluster can
//! form first. [`SimNet::counts`] says how many of each class hit a message
//! or READ in flight. Every message is shown to an optional tap when sent
//! (before faults) and when delivered, and folded into
//! [`SimNet::trace_hash`] when sent.
//!
//! Not for production paths: one mutex guards the whole network and each
//! message is a fresh `Vec` (the harness runs on one thread; allocation-free
//! I/O is the real transports' job).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

use super::{Completion, Connection, Domain, Error, ErrorKind, Listener, ReadOp, Registration};

mod manual;
pub use manual::SimPeer;
use crate::mem::{Access, Region};
use crate::time::{Duration, Instant};

/// A node of the simulated network (one per daemon of the cluster).
pub type NodeId = u32;

/// Probabilities and delays of the injected faults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FaultConfig {
    /// One-way latency of every message. Zero delivers a message at the
    /// instant it is sent (for unit tests that drive one node at one
    /// instant); the harness keeps it positive so that a reply never lands
    /// in the poll that caused it.
    pub base_delay: Duration,
    /// Latency of a READ.
    pub read_delay: Duration,
    /// How long a READ that lost its request or answer waits before it
    /// completes with `Timeout` (RDMA's retry budget).
    pub read_timeout: Duration,
    /// Probability that a message (or a READ) is lost.
    pub loss: f64,
    /// Probability that a message is delivered twice.
    pub duplicate: f64,
    /// Probability that a message is held back by up to `reorder_window`.
    pub reorder: f64,
    /// Longest extra delay of a reordered or duplicated message.
    pub reorder_window: Duration,
    /// No fault before this instant.
    pub active_from: Instant,
}

impl Default for FaultConfig {
    fn default() -> Self {
        FaultConfig {
            base_delay: Duration::from_micros(20),
            read_delay: Duration::from_micros(30),
            read_timeout: Duration::from_millis(50),
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_window: Duration::from_millis(2),
            active_from: Instant::ZERO,
        }
    }
}

impl FaultConfig {
    /// No faults, and every message delivered at the instant it is sent:
    /// for unit tests that drive one node and play its peers by hand.
    pub fn same_instant() -> Self {
        FaultConfig { base_delay: Duration::ZERO, ..FaultConfig::default() }
    }
}

/// How many faults hit something in flight, per class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// Messages lost.
    pub lost_messages: u64,
    /// READs lost (completed with `Timeout`).
    pub lost_reads: u64,
    /// Messages delivered twice.
    pub duplicated: u64,
    /// Messages held back.
    pub reordered: u64,
    /// Messages and READs lost to a partition.
    pub partitioned: u64,
    /// Messages and READs in flight when a node crashed.
    pub crash_hits: u64,
    /// Links broken by crashes.
    pub crash_links: u64,
}

/// A message as the tap sees it: once when sent (before any fault) and
/// once per delivery.
#[derive(Clone, Copy, Debug)]
pub struct Traffic<'a> {
    /// When it was sent or delivered.
    pub at: Instant,
    /// Sender.
    pub from: NodeId,
    /// Receiver.
    pub to: NodeId,
    /// The encoded wire message.
    pub bytes: &'a [u8],
    /// False at the send, true at a delivery.
    pub delivered: bool,
}

/// Sees every message sent and delivered (the harness's invariant checks
/// decode them).
pub type Tap = Box<dyn FnMut(Traffic<'_>) + Send>;

struct Msg {
    deliver_at: Instant,
    seq: u64,
    bytes: Vec<u8>,
}

struct PendingRead {
    done_at: Instant,
    seq: u64,
    op: ReadOp,
    /// Decided at post time: the error it completes with, if any.
    fail: Option<ErrorKind>,
}

/// One direction's state of a link: what is on its way to this side.
#[derive(Default)]
struct Side {
    node: NodeId,
    /// Messages to this side, ordered by (deliver_at, seq).
    inbox: VecDeque<Msg>,
    /// READs this side posted, ordered by (done_at, seq).
    reads: VecDeque<PendingRead>,
    /// When this side closed (dropped its connection or crashed).
    closed_at: Option<Instant>,
    /// Most messages this side may have on their way to, or unread at, its
    /// peer before `send` says `QueueFull` (`None`: no bound).
    send_capacity: Option<usize>,
}

struct Link {
    sides: [Side; 2],
}

impl Link {
    /// When side `s` learns that its peer is gone: the peer's close plus one
    /// message delay (the FIN's trip).
    fn gone_notice(&self, s: usize, delay: Duration) -> Option<Instant> {
        self.sides[1 - s].closed_at.map(|t| t + delay)
    }
}

struct RegEntry {
    node: NodeId,
    region: Arc<Region>,
    access: Access,
}

struct Inner {
    now: Instant,
    cfg: FaultConfig,
    rng: Xoshiro256PlusPlus,
    seq: u64,
    links: Vec<Link>,
    /// Per address: the listening node and the connections waiting to be
    /// accepted, each with the instant it may be.
    listeners: HashMap<String, (NodeId, VecDeque<(usize, Instant)>)>,
    /// Per address: how long after its connect a connection may be
    /// accepted ([`SimNet::delay_accepts`]).
    accept_delays: HashMap<String, Duration>,
    next_listener: u64,
    regs: HashMap<u32, RegEntry>,
    next_key: u32,
    partitions: BTreeSet<(NodeId, NodeId)>,
    crashed: BTreeSet<NodeId>,
    counts: FaultCounts,
    hash: u64,
    tap: Option<Tap>,
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

impl Inner {
    fn faulty(&self) -> bool {
        self.now >= self.cfg.active_from
    }

    fn partitioned(&self, a: NodeId, b: NodeId) -> bool {
        self.partitions.contains(&(a.min(b), a.max(b)))
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.faulty() && self.rng.random::<f64>() < p
    }

    fn extra_delay(&mut self) -> Duration {
        let w = self.cfg.reorder_window.as_nanos().max(1);
        Duration::from_nanos(self.rng.random_range(1..=w))
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn fold(&mut self, words: &[u64], bytes: &[u8]) {
        let mut h = self.hash;
        for w in words {
            h = fnv(h, &w.to_le_bytes());
        }
        self.hash = fnv(h, bytes);
    }
}

fn insert_msg(q: &mut VecDeque<Msg>, m: Msg) {
    let pos = q.partition_point(|x| (x.deliver_at, x.seq) <= (m.deliver_at, m.seq));
    q.insert(pos, m);
}

fn insert_read(q: &mut VecDeque<PendingRead>, r: PendingRead) {
    let pos = q.partition_point(|x| (x.done_at, x.seq) <= (r.done_at, r.seq));
    q.insert(pos, r);
}

/// The simulated network: every node's links, registrations and listeners,
/// one virtual clock and one seeded fault generator. Cheap to clone.
#[derive(Clone)]
pub struct SimNet {
    inner: Arc<Mutex<Inner>>,
}

impl std::fmt::Debug for SimNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimNet").finish_non_exhaustive()
    }
}

impl SimNet {
    /// A network whose faults are drawn from `seed`.
    pub fn new(seed: u64, cfg: FaultConfig) -> Self {
        let cfg = FaultConfig { read_delay: cfg.read_delay.max(Duration::from_nanos(1)), ..cfg };
        SimNet {
            inner: Arc::new(Mutex::new(Inner {
                now: Instant::ZERO,
                cfg,
                rng: Xoshiro256PlusPlus::seed_from_u64(seed),
                seq: 0,
                links: Vec::new(),
                listeners: HashMap::new(),
                accept_delays: HashMap::new(),
                next_listener: 0,
                regs: HashMap::new(),
                next_key: 1,
                partitions: BTreeSet::new(),
                crashed: BTreeSet::new(),
                counts: FaultCounts::default(),
                hash: FNV_OFFSET,
                tap: None,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock only happens in a failing test;
        // the state is still usable for its report.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Moves the virtual clock (never backwards).
    pub fn set_now(&self, now: Instant) {
        let mut g = self.lock();
        g.now = g.now.max(now);
    }

    /// The virtual clock.
    pub fn now(&self) -> Instant {
        self.lock().now
    }

    /// The transport context of `node`.
    pub fn domain(&self, node: NodeId) -> SimDomain {
        SimDomain { net: self.clone(), node }
    }

    /// Installs the tap that sees every message sent.
    pub fn set_tap(&self, tap: Tap) {
        self.lock().tap = Some(tap);
    }

    /// Cuts `a` from `b` (both directions) until [`heal`](Self::heal).
    pub fn partition(&self, a: NodeId, b: NodeId) {
        let mut g = self.lock();
        g.partitions.insert((a.min(b), a.max(b)));
        let now = g.now.as_nanos();
        g.fold(&[0x5041_5254, now, u64::from(a), u64::from(b)], &[]);
    }

    /// Connections to `addr` may be accepted only `delay` after their
    /// connect (a host slow to take them, a data link that comes up
    /// later than the control path). Messages sent meanwhile wait on the
    /// link as on a real one's queue.
    pub fn delay_accepts(&self, addr: &str, delay: Duration) {
        self.lock().accept_delays.insert(addr.to_string(), delay);
    }

    /// Ends the partition between `a` and `b`.
    pub fn heal(&self, a: NodeId, b: NodeId) {
        let mut g = self.lock();
        g.partitions.remove(&(a.min(b), a.max(b)));
    }

    /// Crashes `node`: its links break, its listeners and registrations
    /// vanish. The node's objects (connections, domain) may still be
    /// dropped later; they act on nothing. A restarted node takes a new id.
    pub fn crash(&self, node: NodeId) {
        let mut g = self.lock();
        let now = g.now;
        g.crashed.insert(node);
        g.listeners.retain(|_, (n, _)| *n != node);
        g.regs.retain(|_, r| r.node != node);
        let mut hits = 0u64;
        let mut links = 0u64;
        for link in &mut g.links {
            for s in 0..2 {
                if link.sides[s].node == node && link.sides[s].closed_at.is_none() {
                    link.sides[s].closed_at = Some(now);
                    links += 1;
                    // What was on its way to or from the crashed side.
                    hits += link.sides[s].inbox.len() as u64 + link.sides[s].reads.len() as u64;
                    hits += link.sides[1 - s].reads.len() as u64;
                    link.sides[s].inbox.clear();
                    link.sides[s].reads.clear();
                }
            }
        }
        g.counts.crash_hits += hits;
        g.counts.crash_links += links;
        g.fold(&[0x4352_4153, now.as_nanos(), u64::from(node)], &[]);
    }

    /// Faults that hit something in flight so far.
    pub fn counts(&self) -> FaultCounts {
        self.lock().counts
    }

    /// Counts a fault the harness injected outside the network (e.g. a
    /// batch run on a slowed GPU), into the trace hash.
    pub fn record(&self, tag: u64, value: u64) {
        let mut g = self.lock();
        let now = g.now.as_nanos();
        g.fold(&[tag, now, value], &[]);
    }

    /// Hash of every message sent (time, sender, receiver, bytes) and every
    /// fault, in order: two runs with the same seed have the same hash.
    pub fn trace_hash(&self) -> u64 {
        self.lock().hash
    }

    /// The earliest future instant at which something happens on the
    /// network by itself: a delivery, a READ completion, a peer's departure
    /// becoming visible. What is due at or before [`now`](Self::now) (with
    /// a zero `base_delay`, a message sent now) is ready already and not
    /// reported: the caller polls its nodes at `now` until they are quiet.
    pub fn next_event_at(&self) -> Option<Instant> {
        let g = self.lock();
        let delay = g.cfg.base_delay;
        let mut best: Option<Instant> = None;
        let mut consider = |t: Instant| {
            if t > g.now {
                best = Some(best.map_or(t, |b| b.min(t)));
            }
        };
        for link in &g.links {
            for s in 0..2 {
                let side = &link.sides[s];
                if side.closed_at.is_some() {
                    continue;
                }
                if let Some(m) = side.inbox.front() {
                    consider(m.deliver_at);
                }
                if let Some(r) = side.reads.front() {
                    consider(r.done_at);
                }
                if let Some(t) = link.gone_notice(s, delay) {
                    consider(t);
                }
            }
        }
        for (_, pending) in g.listeners.values() {
            if let Some(&(_, at)) = pending.front() {
                consider(at);
            }
        }
        best
    }

    /// A connected pair of link ends between `a` and `b` (`a`'s end
    /// first), made as `b` listening and `a` connecting: for tests that
    /// hand a node one end and play its peer with the other.
    pub fn link(&self, a: NodeId, b: NodeId) -> Result<(SimConn, SimConn), Error> {
        let mut listener = self.domain(b).listen("")?;
        let ours = self.domain(a).connect(&listener.local_addr(), Duration::ZERO)?;
        let theirs = listener.accept(Duration::ZERO)?;
        Ok((ours, theirs))
    }
}

/// One node's transport context on a [`SimNet`].
#[derive(Clone, Debug)]
pub struct SimDomain {
    net: SimNet,
    node: NodeId,
}

impl SimDomain {
    /// The node this domain belongs to.
    pub fn node(&self) -> NodeId {
        self.node
    }
    /// The network.
    pub fn net(&self) -> &SimNet {
        &self.net
    }
}

/// Accepts simulated connections.
#[derive(Debug)]
pub struct SimListener {
    net: SimNet,
    addr: String,
}

/// One end of a simulated link.
#[derive(Debug)]
pub struct SimConn {
    net: SimNet,
    link: usize,
    side: usize,
}

/// Most READs outstanding per connection.
const MAX_OUTSTANDING: usize = 256;
/// Longest READ.
const MAX_READ: u32 = 16 << 20;

impl Domain for SimDomain {
    type Conn = SimConn;
    type Listener = SimListener;

    fn kind(&self) -> &'static str {
        "sim"
    }

    fn listen(&self, addr: &str) -> Result<SimListener, Error> {
        let mut g = self.net.lock();
        if g.crashed.contains(&self.node) {
            return Err(Error::PeerDisconnected);
        }
        let addr = if addr.is_empty() {
            g.next_listener += 1;
            format!("sim:{}:{}", self.node, g.next_listener)
        } else {
            addr.to_string()
        };
        if g.listeners.contains_key(&addr) {
            return Err(Error::Io(std::io::Error::from(std::io::ErrorKind::AddrInUse)));
        }
        g.listeners.insert(addr.clone(), (self.node, VecDeque::new()));
        Ok(SimListener { net: self.net.clone(), addr })
    }

    fn connect(&self, addr: &str, _timeout: Duration) -> Result<SimConn, Error> {
        let mut g = self.net.lock();
        if g.crashed.contains(&self.node) {
            return Err(Error::PeerDisconnected);
        }
        let Some(&(server, _)) = g.listeners.get(addr) else {
            return Err(Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)));
        };
        if g.partitioned(self.node, server) {
            g.counts.partitioned += 1;
            return Err(Error::Timeout);
        }
        let link = g.links.len();
        g.links.push(Link {
            sides: [Side { node: self.node, ..Side::default() }, Side { node: server, ..Side::default() }],
        });
        let at = g.now + g.accept_delays.get(addr).copied().unwrap_or(Duration::ZERO);
        if let Some((_, pending)) = g.listeners.get_mut(addr) {
            pending.push_back((link, at));
        }
        let now = g.now.as_nanos();
        g.fold(&[0x434f_4e4e, now, u64::from(self.node), u64::from(server)], addr.as_bytes());
        Ok(SimConn { net: self.net.clone(), link, side: 0 })
    }

    fn register(&self, region: &Arc<Region>, access: Access) -> Result<Registration, Error> {
        let mut g = self.net.lock();
        let key = g.next_key;
        g.next_key = g.next_key.checked_add(1).ok_or(Error::QueueFull)?;
        g.regs.insert(key, RegEntry { node: self.node, region: region.clone(), access });
        Ok(Registration::new(key, region.clone(), access, 0))
    }

    fn deregister(&self, reg: &Registration) -> Result<(), Error> {
        let mut g = self.net.lock();
        match g.regs.get(&reg.key()) {
            Some(e) if e.node == self.node => {
                g.regs.remove(&reg.key());
                Ok(())
            }
            _ => Err(Error::BadKey),
        }
    }

    fn registered_count(&self) -> usize {
        let g = self.net.lock();
        g.regs.values().filter(|r| r.node == self.node).count()
    }

    fn max_read_len(&self) -> u32 {
        MAX_READ
    }
}

impl Listener for SimListener {
    type Conn = SimConn;

    fn local_addr(&self) -> String {
        self.addr.clone()
    }

    /// Never waits (time is virtual): a pending connection, or `Timeout`.
    fn accept(&mut self, _timeout: Duration) -> Result<SimConn, Error> {
        let mut g = self.net.lock();
        let now = g.now;
        let Some((_, pending)) = g.listeners.get_mut(&self.addr) else {
            return Err(Error::PeerDisconnected);
        };
        // In connect order: the delay is per address, so the front is due first.
        match pending.front() {
            Some(&(link, at)) if at <= now => {
                pending.pop_front();
                Ok(SimConn { net: self.net.clone(), link, side: 1 })
            }
            _ => Err(Error::Timeout),
        }
    }
}

impl Drop for SimListener {
    fn drop(&mut self) {
        let mut g = self.net.lock();
        g.listeners.remove(&self.addr);
    }
}

impl SimConn {
    /// The node at this end.
    pub fn node(&self) -> NodeId {
        self.net.lock().links[self.link].sides[self.side].node
    }
    /// The node at the other end.
    pub fn peer(&self) -> NodeId {
        self.net.lock().links[self.link].sides[1 - self.side].node
    }

    /// Bounds the messages this end may have on their way to, or unread
    /// at, its peer: beyond `capacity`, [`Connection::send`] returns
    /// `QueueFull` (nothing sent), as a real send queue does when the peer
    /// stops reading. `None` lifts the bound (the default).
    pub fn set_send_capacity(&mut self, capacity: Option<usize>) {
        self.net.lock().links[self.link].sides[self.side].send_capacity = capacity;
    }

    /// Whether the peer's departure is visible at `now`.
    fn peer_gone(g: &Inner, link: &Link, side: usize) -> bool {
        link.sides[side].closed_at.is_some() || link.gone_notice(side, g.cfg.base_delay).is_some_and(|t| t <= g.now)
    }

    fn complete_read(g: &mut Inner, me: NodeId, peer: NodeId, r: &PendingRead) -> Result<u32, ErrorKind> {
        if let Some(e) = r.fail {
            return Err(e);
        }
        if g.crashed.contains(&peer) {
            return Err(ErrorKind::PeerDisconnected);
        }
        let src = g.regs.get(&r.op.remote.key).ok_or(ErrorKind::BadKey)?;
        if src.node != peer {
            return Err(ErrorKind::BadKey);
        }
        if !src.access.contains(Access::REMOTE_READ) {
            return Err(ErrorKind::AccessDenied);
        }
        let len = r.op.remote.len;
        src.region.check(r.op.remote.offset, len as usize).map_err(|_| ErrorKind::OutOfBounds)?;
        let dst = g.regs.get(&r.op.local.key).ok_or(ErrorKind::BadKey)?;
        if dst.node != me || !dst.access.contains(Access::LOCAL_WRITE) {
            return Err(ErrorKind::AccessDenied);
        }
        if r.op.local.len < len {
            return Err(ErrorKind::BufferTooSmall);
        }
        dst.region.check(r.op.local.offset, len as usize).map_err(|_| ErrorKind::OutOfBounds)?;
        let mut buf = vec![0u8; len as usize];
        src.region.read_at(r.op.remote.offset, &mut buf).map_err(|_| ErrorKind::OutOfBounds)?;
        dst.region.write_at(r.op.local.offset, &buf).map_err(|_| ErrorKind::OutOfBounds)?;
        Ok(len)
    }
}

impl Connection for SimConn {
    fn send(&mut self, msg: &[u8]) -> Result<(), Error> {
        let net = self.net.clone();
        let mut g = net.lock();
        let (link, side) = (self.link, self.side);
        if Self::peer_gone(&g, &g.links[link], side) {
            return Err(Error::PeerDisconnected);
        }
        if let Some(cap) = g.links[link].sides[side].send_capacity {
            if g.links[link].sides[1 - side].inbox.len() >= cap {
                return Err(Error::QueueFull);
            }
        }
        let (from, to) = (g.links[link].sides[side].node, g.links[link].sides[1 - side].node);
        let now = g.now;
        g.fold(&[now.as_nanos(), u64::from(from), u64::from(to)], msg);
        if let Some(tap) = g.tap.as_mut() {
            tap(Traffic { at: now, from, to, bytes: msg, delivered: false });
        }
        if g.partitioned(from, to) {
            g.counts.partitioned += 1;
            return Ok(());
        }
        let loss = g.cfg.loss;
        if g.chance(loss) {
            g.counts.lost_messages += 1;
            g.fold(&[0x4c4f_5353], &[]);
            return Ok(());
        }
        let mut deliver_at = now + g.cfg.base_delay;
        let reorder = g.cfg.reorder;
        if g.chance(reorder) {
            g.counts.reordered += 1;
            deliver_at += g.extra_delay();
            g.fold(&[0x524f_5244, deliver_at.as_nanos()], &[]);
        }
        let dup = g.cfg.duplicate;
        let copy_at = if g.chance(dup) {
            g.counts.duplicated += 1;
            let t = deliver_at + g.extra_delay();
            g.fold(&[0x4455_5020, t.as_nanos()], &[]);
            Some(t)
        } else {
            None
        };
        let seq = g.next_seq();
        insert_msg(&mut g.links[link].sides[1 - side].inbox, Msg { deliver_at, seq, bytes: msg.to_vec() });
        if let Some(t) = copy_at {
            let seq = g.next_seq();
            insert_msg(&mut g.links[link].sides[1 - side].inbox, Msg { deliver_at: t, seq, bytes: msg.to_vec() });
        }
        Ok(())
    }

    fn try_recv(&mut self, buf: &mut [u8]) -> Result<Option<usize>, Error> {
        let net = self.net.clone();
        let mut g = net.lock();
        let now = g.now;
        let (link, side) = (self.link, self.side);
        if g.links[link].sides[side].closed_at.is_some() {
            return Err(Error::PeerDisconnected);
        }
        let gone = Self::peer_gone(&g, &g.links[link], side);
        let inbox = &mut g.links[link].sides[side].inbox;
        match inbox.front() {
            Some(m) if m.deliver_at <= now => {
                if buf.len() < m.bytes.len() {
                    return Err(Error::BufferTooSmall { needed: m.bytes.len() });
                }
                let n = m.bytes.len();
                buf[..n].copy_from_slice(&m.bytes);
                inbox.pop_front();
                let (from, to) = (g.links[link].sides[1 - side].node, g.links[link].sides[side].node);
                if let Some(tap) = g.tap.as_mut() {
                    tap(Traffic { at: now, from, to, bytes: &buf[..n], delivered: true });
                }
                Ok(Some(n))
            }
            Some(_) => Ok(None),
            None if gone => Err(Error::PeerDisconnected),
            None => Ok(None),
        }
    }

    fn post_read(&mut self, op: &ReadOp) -> Result<(), Error> {
        let net = self.net.clone();
        let mut g = net.lock();
        let (link, side) = (self.link, self.side);
        if Self::peer_gone(&g, &g.links[link], side) {
            return Err(Error::PeerDisconnected);
        }
        if g.links[link].sides[side].reads.len() >= MAX_OUTSTANDING {
            return Err(Error::QueueFull);
        }
        if op.remote.len > MAX_READ {
            return Err(Error::TooLarge);
        }
        let (me, peer) = (g.links[link].sides[side].node, g.links[link].sides[1 - side].node);
        let now = g.now;
        let mut done_at = now + g.cfg.read_delay;
        let mut fail = None;
        if g.partitioned(me, peer) {
            g.counts.partitioned += 1;
            fail = Some(ErrorKind::Timeout);
            done_at = now + g.cfg.read_timeout;
        } else {
            let loss = g.cfg.loss;
            if g.chance(loss) {
                g.counts.lost_reads += 1;
                fail = Some(ErrorKind::Timeout);
                done_at = now + g.cfg.read_timeout;
            }
        }
        g.fold(&[0x5245_4144, now.as_nanos(), u64::from(me), u64::from(peer), op.wr_id, fail.is_some() as u64], &[]);
        let seq = g.next_seq();
        insert_read(&mut g.links[link].sides[side].reads, PendingRead { done_at, seq, op: *op, fail });
        Ok(())
    }

    fn poll_completions(&mut self, out: &mut [Completion]) -> Result<usize, Error> {
        let net = self.net.clone();
        let mut g = net.lock();
        let now = g.now;
        let (link, side) = (self.link, self.side);
        let (me, peer) = (g.links[link].sides[side].node, g.links[link].sides[1 - side].node);
        let gone = Self::peer_gone(&g, &g.links[link], side);
        let mut n = 0;
        while n < out.len() {
            let reads = &mut g.links[link].sides[side].reads;
            let due = match reads.front() {
                Some(r) => r.done_at <= now || gone,
                None => false,
            };
            if !due {
                break;
            }
            let Some(r) = reads.pop_front() else { break };
            let result = if gone && r.fail.is_none() && r.done_at > now {
                Err(ErrorKind::PeerDisconnected)
            } else {
                Self::complete_read(&mut g, me, peer, &r)
            };
            out[n] = match result {
                Ok(bytes) => Completion { wr_id: r.op.wr_id, status: Ok(()), bytes },
                Err(e) => Completion { wr_id: r.op.wr_id, status: Err(e), bytes: 0 },
            };
            n += 1;
        }
        Ok(n)
    }

    fn progress(&mut self) -> Result<(), Error> {
        let g = self.net.lock();
        let link = &g.links[self.link];
        if link.sides[self.side].closed_at.is_some() {
            return Err(Error::PeerDisconnected);
        }
        if Self::peer_gone(&g, link, self.side) && link.sides[self.side].inbox.is_empty() {
            return Err(Error::PeerDisconnected);
        }
        Ok(())
    }

    fn outstanding_reads(&self) -> usize {
        self.net.lock().links[self.link].sides[self.side].reads.len()
    }

    fn max_outstanding_reads(&self) -> usize {
        MAX_OUTSTANDING
    }

    fn is_connected(&self) -> bool {
        let g = self.net.lock();
        !Self::peer_gone(&g, &g.links[self.link], self.side)
    }
}

impl Drop for SimConn {
    fn drop(&mut self) {
        let mut g = self.net.lock();
        let now = g.now;
        let side = &mut g.links[self.link].sides[self.side];
        if side.closed_at.is_none() {
            side.closed_at = Some(now);
            side.inbox.clear();
            side.reads.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{self, Heartbeat};

    fn hb(seq: u64) -> Vec<u8> {
        let mut buf = vec![0u8; 64];
        let n = wire::encode(&mut buf, &Heartbeat { seq, role: wire::Role::Frontend as u32, id: 0 }).unwrap();
        buf.truncate(n);
        buf
    }

    fn pair(net: &SimNet) -> (SimConn, SimConn) {
        net.link(1, 2).unwrap()
    }

    #[test]
    fn delivers_in_order_after_the_delay_and_reports_a_departure_after_the_backlog() {
        let net = SimNet::new(1, FaultConfig::default());
        let (mut c, mut s) = pair(&net);
        let mut buf = [0u8; 128];
        c.send(&hb(1)).unwrap();
        c.send(&hb(2)).unwrap();
        assert_eq!(s.try_recv(&mut buf).unwrap(), None, "nothing at the send instant");
        net.set_now(Instant::ZERO + Duration::from_micros(20));
        let n = s.try_recv(&mut buf).unwrap().unwrap();
        assert!(matches!(wire::decode(&buf[..n]).unwrap(), wire::Message::Heartbeat(h) if h.seq == 1));
        drop(c);
        let n = s.try_recv(&mut buf).unwrap().unwrap();
        assert!(matches!(wire::decode(&buf[..n]).unwrap(), wire::Message::Heartbeat(h) if h.seq == 2));
        net.set_now(Instant::ZERO + Duration::from_micros(40));
        assert!(matches!(s.try_recv(&mut buf), Err(Error::PeerDisconnected)));
        assert!(!s.is_connected());
    }

    #[test]
    fn reads_copy_registered_bytes_and_check_owner_bounds_and_access() {
        let net = SimNet::new(1, FaultConfig::default());
        let (mut c, s) = pair(&net);
        let (a, b) = (net.domain(1), net.domain(2));
        let src = Region::anonymous(4096).unwrap();
        src.write_at(100, b"hello").unwrap();
        let sreg = b.register(&src, Access::REMOTE_READ).unwrap();
        let dst = Region::anonymous(4096).unwrap();
        let dreg = a.register(&dst, Access::LOCAL_WRITE).unwrap();
        let ok = ReadOp { wr_id: 7, remote: sreg.remote_ref(100, 5).unwrap(), local: dreg.local_ref(0, 5).unwrap() };
        let mut oob = ok;
        oob.wr_id = 8;
        oob.remote.offset = 4094;
        let mut own = ok;
        own.wr_id = 9;
        own.remote.key = dreg.key();
        c.post_reads(&[ok, oob, own]).unwrap();
        let mut out = [Completion::default(); 4];
        assert_eq!(c.poll_completions(&mut out).unwrap(), 0);
        net.set_now(Instant::ZERO + Duration::from_micros(30));
        assert_eq!(c.poll_completions(&mut out).unwrap(), 3);
        assert_eq!((out[0].wr_id, out[0].status, out[0].bytes), (7, Ok(()), 5));
        assert_eq!((out[1].wr_id, out[1].status), (8, Err(ErrorKind::OutOfBounds)));
        assert_eq!((out[2].wr_id, out[2].status), (9, Err(ErrorKind::BadKey)), "a key of the reader's own node");
        let mut got = [0u8; 5];
        dst.read_at(0, &mut got).unwrap();
        assert_eq!(&got, b"hello");
        drop(s);
    }

    #[test]
    fn the_same_seed_gives_the_same_faults_and_hash() {
        let run = |seed| {
            let cfg = FaultConfig { loss: 0.2, duplicate: 0.2, reorder: 0.3, ..FaultConfig::default() };
            let net = SimNet::new(seed, cfg);
            let (mut c, mut s) = pair(&net);
            let mut got = Vec::new();
            let mut buf = [0u8; 128];
            for i in 0..200u64 {
                net.set_now(Instant::ZERO + Duration::from_micros(i * 10));
                c.send(&hb(i)).unwrap();
                while let Some(n) = s.try_recv(&mut buf).unwrap() {
                    if let Ok(wire::Message::Heartbeat(h)) = wire::decode(&buf[..n]) {
                        got.push(h.seq);
                    }
                }
            }
            (got, net.counts(), net.trace_hash())
        };
        let (a, ca, ha) = run(5);
        let (b, cb, hb_) = run(5);
        assert_eq!((&a, ca, ha), (&b, cb, hb_));
        let (c, _, hc) = run(6);
        assert_ne!((a.clone(), ha), (c, hc));
        assert!(ca.lost_messages > 0 && ca.duplicated > 0 && ca.reordered > 0);
        assert!(a.windows(2).any(|w| w[1] < w[0]), "reordering happened");
    }

    #[test]
    fn partition_and_crash_cut_links() {
        let net = SimNet::new(1, FaultConfig::default());
        let (mut c, mut s) = pair(&net);
        let mut buf = [0u8; 128];
        net.partition(1, 2);
        c.send(&hb(1)).unwrap();
        net.set_now(Instant::ZERO + Duration::from_millis(1));
        assert_eq!(s.try_recv(&mut buf).unwrap(), None);
        assert_eq!(net.counts().partitioned, 1);
        net.heal(1, 2);
        c.send(&hb(2)).unwrap();
        net.crash(1);
        net.set_now(Instant::ZERO + Duration::from_millis(2));
        assert!(s.try_recv(&mut buf).unwrap().is_some(), "sent before the crash: still delivered");
        assert!(matches!(s.try_recv(&mut buf), Err(Error::PeerDisconnected)));
        assert!(matches!(c.send(&hb(3)), Err(Error::PeerDisconnected)));
        assert_eq!(net.counts().crash_links, 1);
    }

    #[test]
    fn a_zero_base_delay_delivers_at_the_send_instant_and_reports_no_future_event() {
        let net = SimNet::new(1, FaultConfig::same_instant());
        let (mut c, mut s) = pair(&net);
        let mut buf = [0u8; 128];
        let t = Instant::ZERO + Duration::from_millis(3);
        net.set_now(t);
        c.send(&hb(1)).unwrap();
        assert_eq!(net.next_event_at(), None, "due now, not in the future");
        let n = s.try_recv(&mut buf).unwrap().unwrap();
        assert!(matches!(wire::decode(&buf[..n]).unwrap(), wire::Message::Heartbeat(h) if h.seq == 1));
        // READs keep their (positive) delay, and the next event says when.
        let (a, b) = (net.domain(1), net.domain(2));
        let src = Region::anonymous(64).unwrap();
        let sreg = b.register(&src, Access::REMOTE_READ).unwrap();
        let dst = Region::anonymous(64).unwrap();
        let dreg = a.register(&dst, Access::LOCAL_WRITE).unwrap();
        let op = ReadOp { wr_id: 1, remote: sreg.remote_ref(0, 8).unwrap(), local: dreg.local_ref(0, 8).unwrap() };
        c.post_read(&op).unwrap();
        assert_eq!(net.next_event_at(), Some(t + Duration::from_micros(30)));
        // A departure is visible at once.
        drop(c);
        assert!(matches!(s.try_recv(&mut buf), Err(Error::PeerDisconnected)));
    }

    #[test]
    fn a_delayed_address_accepts_its_connections_only_after_the_delay_and_keeps_what_was_sent() {
        let net = SimNet::new(1, FaultConfig::default());
        let mut slow = net.domain(2).listen("slow").unwrap();
        let mut fast = net.domain(2).listen("fast").unwrap();
        net.delay_accepts("slow", Duration::from_millis(5));
        let mut c = net.domain(1).connect("slow", Duration::ZERO).unwrap();
        let _f = net.domain(1).connect("fast", Duration::ZERO).unwrap();
        assert!(fast.accept(Duration::ZERO).is_ok(), "another address is not delayed");
        c.send(&hb(1)).unwrap();
        assert!(matches!(slow.accept(Duration::ZERO), Err(Error::Timeout)));
        let due = Instant::ZERO + Duration::from_millis(5);
        assert_eq!(net.next_event_at(), Some(Instant::ZERO + Duration::from_micros(20)), "the message first");
        net.set_now(due - Duration::from_nanos(1));
        assert!(matches!(slow.accept(Duration::ZERO), Err(Error::Timeout)), "not a nanosecond early");
        assert_eq!(net.next_event_at(), Some(due), "the accept is the next event");
        net.set_now(due);
        let mut s = slow.accept(Duration::ZERO).expect("accepted at the delay");
        let mut buf = [0u8; 128];
        let n = s.try_recv(&mut buf).unwrap().expect("the message sent before the accept waited on the link");
        assert!(matches!(wire::decode(&buf[..n]).unwrap(), wire::Message::Heartbeat(h) if h.seq == 1));
    }

    #[test]
    fn a_send_capacity_refuses_sends_while_the_peer_holds_that_many_unread() {
        let net = SimNet::new(1, FaultConfig::default());
        let (mut c, mut s) = pair(&net);
        let mut buf = [0u8; 128];
        c.set_send_capacity(Some(2));
        c.send(&hb(1)).unwrap();
        c.send(&hb(2)).unwrap();
        assert!(matches!(c.send(&hb(3)), Err(Error::QueueFull)), "two on their way");
        let sent_hash = net.trace_hash();
        assert!(matches!(c.send(&hb(3)), Err(Error::QueueFull)));
        assert_eq!(net.trace_hash(), sent_hash, "a refused send is not traffic");
        s.send(&hb(9)).unwrap();
        net.set_now(Instant::ZERO + Duration::from_micros(20));
        assert!(s.try_recv(&mut buf).unwrap().is_some());
        c.send(&hb(3)).unwrap();
        assert!(matches!(c.send(&hb(4)), Err(Error::QueueFull)));
        c.set_send_capacity(None);
        c.send(&hb(4)).unwrap();
    }

    #[test]
    fn a_partition_with_a_long_read_timeout_holds_reads_and_cuts_only_that_pair() {
        let hour = Duration::from_millis(3_600_000);
        let net = SimNet::new(1, FaultConfig { read_timeout: hour, ..FaultConfig::default() });
        let (mut c, _s) = net.link(1, 2).unwrap();
        let (mut c3, mut s3) = net.link(1, 3).unwrap();
        let src = Region::anonymous(64).unwrap();
        let sreg = net.domain(2).register(&src, Access::REMOTE_READ).unwrap();
        let dst = Region::anonymous(64).unwrap();
        let dreg = net.domain(1).register(&dst, Access::LOCAL_WRITE).unwrap();
        let op = ReadOp { wr_id: 4, remote: sreg.remote_ref(0, 8).unwrap(), local: dreg.local_ref(0, 8).unwrap() };
        net.partition(1, 2);
        c.post_read(&op).unwrap();
        c3.send(&hb(1)).unwrap();
        let mut out = [Completion::default(); 1];
        net.set_now(Instant::ZERO + hour - Duration::from_nanos(1));
        assert!(s3.try_recv(&mut [0u8; 128]).unwrap().is_some(), "other pairs unaffected");
        assert_eq!(c.poll_completions(&mut out).unwrap(), 0, "held until the timeout");
        assert_eq!(c.outstanding_reads(), 1);
        net.set_now(Instant::ZERO + hour);
        assert_eq!(c.poll_completions(&mut out).unwrap(), 1);
        assert_eq!((out[0].wr_id, out[0].status), (4, Err(ErrorKind::Timeout)));
    }
}
