//! The scheduler daemon as a sans-IO node: the [`ControlPlane`] plus
//! everything the daemon does per peer link (registration handshakes,
//! moving messages, heartbeats and liveness, burying dead peers, sending
//! the plane's outbox with back-pressure). In the style of quinn-proto's
//! `Connection`: the node never reads a clock, sleeps, spawns a thread,
//! accepts or connects; it is given `now`, does bounded work per
//! [`poll`](SchedulerNode::poll), says when it next wants to be polled
//! ([`poll_at`](SchedulerNode::poll_at)), and reports what the host should
//! know through [`poll_event`](SchedulerNode::poll_event). Its links are
//! whatever [`Connection`]s the host hands it: real transports in the
//! daemon, in-memory ones in the deterministic harness.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use dataplane::control::Liveness;
use dataplane::join::{JoinToken, NonceSource};
use dataplane::time::{Duration, Instant};
use dataplane::transport::{Connection, Error};
use dataplane::wire::{self, Challenge, Join, Message, RefuseReason, Refused, Role, WireError};

use super::metrics::SchedulerMetrics;
use super::plane::{ControlPlane, PeerId, DEFAULT_BATCH_GRACE};
use crate::delay_watch::Verdict as DelayVerdict;
use link::{drain_link, every_link, may_hold_messages, Link, MSGS_PER_PEER};

mod link;

/// Timing of a [`SchedulerNode`].
#[derive(Clone, Copy, Debug)]
pub struct NodeConfig {
    /// Heartbeat interval.
    pub heartbeat: Duration,
    /// Silence that makes a peer dead.
    pub dead_after: Duration,
    /// A new link must finish registering within this.
    pub handshake_timeout: Duration,
    /// A peer whose send queue stays full this long is dead.
    pub send_timeout: Duration,
    /// After [`SchedulerNode::stop`], batches in flight are waited for at
    /// most this long.
    pub drain: Duration,
    /// A batch not reported done this long after its planned finish is
    /// failed back (see [`ControlPlane::expire_overdue`]).
    pub batch_grace: Duration,
    /// With an election epoch ([`SchedulerNode::with_epoch`] > 0), how
    /// long after its first poll the node plans nothing (tasks queue, and
    /// are dropped only by their deadlines). The host sets it to cover the
    /// old leader's last lease renewal: the old leader steps down before
    /// its lease would lapse, so once this has passed it plans nothing
    /// more, and two leaders never plan in the same stretch of time.
    /// Backends are fenced per link besides: each learns the new epoch
    /// from its Welcome before the new leader's first plan to it, and from
    /// then on refuses the old epoch's plans.
    pub fence_wait: Duration,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            heartbeat: Duration::from_millis(100),
            dead_after: Duration::from_millis(1000),
            handshake_timeout: Duration::from_millis(5000),
            send_timeout: Duration::from_millis(100),
            drain: Duration::from_millis(2000),
            batch_grace: DEFAULT_BATCH_GRACE,
            fence_wait: Duration::ZERO,
        }
    }
}

/// Who may join, and the limits of the registration path (see
/// `docs/operations.md`, "The join token").
#[derive(Clone, Debug)]
pub struct Membership {
    /// The join token every peer must prove (challenge-response); `None`
    /// lets any peer that reaches the port join (the daemon allows that
    /// only when told so explicitly).
    pub token: Option<JoinToken>,
    /// Where the challenges' nonces come from.
    pub nonces: NonceSource,
    /// Most live frontends; more are refused (`full`).
    pub max_frontends: usize,
    /// Most live backends; more are refused (`full`).
    pub max_backends: usize,
    /// Most links registering at once; more are refused (`full`): a flood
    /// of connections costs a bounded amount of memory.
    pub max_pending: usize,
    /// How long a refused link stays open so that its `Refused` can leave
    /// (it closes earlier once the peer hangs up).
    pub linger: Duration,
}

impl Membership {
    /// Any peer may join (no token), OS nonces, the id bounds as limits.
    pub fn open() -> Self {
        Membership {
            token: None,
            nonces: NonceSource::Os,
            max_frontends: wire::MAX_FRONTENDS as usize,
            max_backends: wire::MAX_BACKENDS as usize,
            max_pending: 256,
            linger: Duration::from_millis(100),
        }
    }

    /// Only peers that prove `token` may join.
    pub fn with_token(token: JoinToken) -> Self {
        Membership { token: Some(token), ..Membership::open() }
    }
}

/// Why a registering link failed before it could be judged.
#[derive(Clone, Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The OS gave no randomness for the challenge's nonce.
    #[error("no OS randomness for a challenge")]
    NoRandomness,
    /// The challenge could not be encoded.
    #[error("cannot encode the challenge: {0}")]
    Encode(#[from] wire::WireError),
    /// The link broke (the transport error, shared: transport errors are
    /// not `Clone`, events are).
    #[error(transparent)]
    Transport(Arc<Error>),
}

/// Events are compared (in tests); two broken links are the same failure
/// when their transport errors are of one kind (the errors themselves are
/// not comparable).
impl PartialEq for HandshakeError {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (HandshakeError::NoRandomness, HandshakeError::NoRandomness) => true,
            (HandshakeError::Encode(a), HandshakeError::Encode(b)) => a == b,
            (HandshakeError::Transport(a), HandshakeError::Transport(b)) => a.kind() == b.kind(),
            _ => false,
        }
    }
}
impl Eq for HandshakeError {}

/// What happened, for the host to log (the `Display` text is the daemon's
/// log line without its prefix).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SchedulerEvent {
    /// A peer finished registering.
    PeerJoined(PeerId),
    /// A registration was refused (a `Refused` is sent, the link closed,
    /// `symphony_peers_refused_total{reason}` counted, nothing it sent
    /// kept).
    PeerRefused {
        /// Who (as it claimed to be), why, and the counter's reason label.
        why: String,
    },
    /// A registering link failed (the link is dropped).
    HandshakeFailed {
        /// Why.
        error: HandshakeError,
    },
    /// A link did not register in time (the link is dropped).
    HandshakeTimedOut {
        /// The bound it exceeded.
        after: Duration,
    },
    /// A peer was silent for longer than the liveness bound.
    PeerSilent(PeerId),
    /// Sending to a peer failed (it is declared dead).
    SendFailed {
        /// To whom.
        peer: PeerId,
        /// The transport error.
        error: String,
    },
    /// A peer is gone: its link is closed, the plane was told (a backend's
    /// batches are failed back).
    PeerLost(PeerId),
    /// Batches whose `BatchDone` never came were failed back.
    BatchesExpired {
        /// How many.
        count: usize,
    },
    /// The READ tail backends report crossed the network delay bound
    /// (the alarm: also `symphony_delay_bound_exceeded`), came back
    /// within it, or was adopted as the bound.
    DelayBound(DelayVerdict),
}

impl std::fmt::Display for SchedulerEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SchedulerEvent::PeerJoined(PeerId::Frontend(id)) => write!(f, "frontend {id} registered"),
            SchedulerEvent::PeerJoined(PeerId::Backend(id)) => write!(f, "backend {id} registered"),
            SchedulerEvent::PeerRefused { why } => write!(f, "registration refused: {why}"),
            SchedulerEvent::HandshakeFailed { error } => {
                write!(f, "a registering peer failed: {error}")
            }
            SchedulerEvent::HandshakeTimedOut { after } => {
                write!(f, "a peer did not register within {after:?}")
            }
            SchedulerEvent::PeerSilent(peer) => write!(f, "{peer:?} silent for too long"),
            SchedulerEvent::SendFailed { peer, error } => {
                write!(f, "sending to {peer:?} failed: {error}")
            }
            SchedulerEvent::PeerLost(PeerId::Frontend(id)) => write!(f, "frontend {id} is gone"),
            SchedulerEvent::PeerLost(PeerId::Backend(id)) => {
                write!(f, "backend {id} is gone (what it had in flight fails back; a released drain had none)")
            }
            SchedulerEvent::BatchesExpired { count } => write!(
                f,
                "{count} batches not reported done within the grace after their planned finish; failed back"
            ),
            SchedulerEvent::DelayBound(DelayVerdict::Exceeded { observed, bound }) => write!(
                f,
                "ALARM: the READ tail per input ({observed:?}) exceeds the network delay bound d_data ({bound:?}); batches may start late (recalibrate, or adopt the observed bound)"
            ),
            SchedulerEvent::DelayBound(DelayVerdict::Restored { observed, bound }) => write!(
                f,
                "the READ tail per input ({observed:?}) is back within the network delay bound d_data ({bound:?})"
            ),
            SchedulerEvent::DelayBound(DelayVerdict::Adopted { old, new }) => write!(
                f,
                "adopted the observed READ tail as the network delay bound: d_data {old:?} -> {new:?}"
            ),
        }
    }
}

/// Tasks taken from all frontends per poll (at least one link's message
/// is read; a link's messages are never split): the next frontend is read
/// in the next poll, after this poll's decisions went out. Why: a poll
/// that took everything (up to 256 `Tasks` messages from each of 64
/// links, 262k tasks) held every plan decided meanwhile for its whole
/// length (bench-cluster at 2 M offered: dispatch lag p50 76 ms, every
/// batch late). 256 tasks are ~0.1 ms of a loaded I/O thread; 64-1024 were
/// within the noise of each other at 2 M offered, 4096 was 3-5x worse.
const TASKS_PER_POLL: usize = 256;
/// A link that has not finished registering.
struct Pending<C> {
    key: u64,
    conn: C,
    /// Its peer's address (none where the transport tells none).
    source: Option<std::net::IpAddr>,
    since: Instant,
    /// The nonce of the challenge sent on it (None: not sent yet).
    nonce: Option<[u8; wire::NONCE_LEN]>,
    /// A backend's accepted Join, waiting for its Models message.
    backend: Option<Join>,
}

/// A refused link kept open until its `Refused` has left.
struct Closing<C> {
    key: u64,
    conn: C,
    until: Instant,
}

/// What one message did to a registering link.
enum Verdict {
    /// Registered.
    Joined(PeerId),
    /// Half-way (a backend's Join, its Models to come).
    Continue,
    /// Refused: (reason, the peer's version, who, why).
    Refuse(RefuseReason, u16, String, String),
}

/// The scheduler daemon's logic over links of type `C`.
pub struct SchedulerNode<C: Connection> {
    plane: ControlPlane,
    metrics: Arc<SchedulerMetrics>,
    cfg: NodeConfig,
    // Ordered maps: every pass visits peers in id order, so a run on a
    // virtual clock is reproducible.
    frontends: BTreeMap<u32, Link<C>>,
    /// The frontend the next poll reads first (see [`TASKS_PER_POLL`]).
    next_frontend: u32,
    backends: BTreeMap<u32, Link<C>>,
    pending: Vec<Pending<C>>,
    closing: Vec<Closing<C>>,
    membership: Membership,
    dead: Vec<PeerId>,
    /// Peers the current flush queued messages for (flushed once each).
    touched: Vec<PeerId>,
    /// A link may have a backlog (else [`drive_backlogs`](Self::drive_backlogs)
    /// skips its walk of every link).
    backlogged: bool,
    events: VecDeque<SchedulerEvent>,
    buf: Vec<u8>,
    hb: [u8; 64],
    ids: Vec<u32>,
    busy: Vec<wire::GpuBusy>,
    next_key: u64,
    /// When the epoch's fence lifts (set at the first poll; None: not
    /// fenced, or not polled yet).
    fence_until: Option<Instant>,
    /// The previous poll's `now` (for the online GPU time integral).
    last_poll: Option<Instant>,
    /// No link's heartbeat or liveness bound is due before this (their
    /// earliest at the last scan; a new link resets it): until then
    /// [`liveness`](Self::liveness) skips its scan of every link.
    liveness_due: Instant,
    stopping: bool,
    drain_until: Option<Instant>,
    /// Keys of the links whose wait fd the host saw readable since the
    /// last poll, sorted; None: the host reports no readiness, and every
    /// pass drains every link.
    readable: Option<Vec<u64>>,
    /// The registered links with [`Link::active`] set (a buried peer's
    /// entry leaves at its burial): with readiness, a pass reads only these
    /// and the readable ones, and [`arm_waits`](Self::arm_waits) arms only
    /// these.
    active: Vec<PeerId>,
    /// Each registered link's key and peer, sorted by key (readable keys
    /// to links).
    peer_of_key: Vec<(u64, PeerId)>,
    /// Scratch: the frontends and backends a pass reads, sorted.
    visit: (Vec<u32>, Vec<u32>),
}

impl<C: Connection> SchedulerNode<C> {
    /// A node around `plane`.
    pub fn new(mut plane: ControlPlane, cfg: NodeConfig) -> Self {
        plane.set_batch_grace(cfg.batch_grace);
        SchedulerNode {
            metrics: plane.metrics().clone(),
            plane,
            cfg,
            frontends: BTreeMap::new(),
            next_frontend: 0,
            backends: BTreeMap::new(),
            pending: Vec::new(),
            closing: Vec::new(),
            membership: Membership::open(),
            dead: Vec::new(),
            touched: Vec::with_capacity(64),
            backlogged: false,
            events: VecDeque::new(),
            buf: vec![0u8; wire::MAX_MESSAGE_LEN],
            hb: [0u8; 64],
            ids: Vec::new(),
            busy: Vec::new(),
            next_key: 0,
            readable: None,
            active: Vec::new(),
            peer_of_key: Vec::new(),
            visit: (Vec::new(), Vec::new()),
            fence_until: None,
            last_poll: None,
            liveness_due: Instant::ZERO,
            stopping: false,
            drain_until: None,
        }
    }

    /// This node as the leader of election `epoch` (0: no election, the
    /// embedded default): the epoch is stamped in every `Welcome` and
    /// every plan, and a node with an epoch plans nothing until
    /// [`NodeConfig::fence_wait`] has passed since its first poll.
    pub fn with_epoch(mut self, epoch: u32) -> Self {
        self.plane.set_epoch(epoch);
        if epoch > 0 {
            self.plane.fence();
        }
        self
    }

    /// Applies routing table `table` for this node's group `group` (issue
    /// 19; see [`ControlPlane::set_routes`](super::plane::ControlPlane::set_routes)):
    /// an older revision than the one applied is ignored. Returns whether
    /// it was applied.
    pub fn handle_routes(&mut self, now: Instant, table: &crate::routes::RouteTable, group: &str) -> bool {
        self.plane.set_routes(now, table, group)
    }

    /// The routing-table revision applied (0: none).
    pub fn route_revision(&self) -> u64 {
        self.plane.route_revision()
    }

    /// Whether this node's group owns global model `model` (no table: yes).
    pub fn owns(&self, model: u32) -> bool {
        self.plane.owns(model)
    }

    /// The election epoch this node stamps (0: none).
    pub fn epoch(&self) -> u32 {
        self.plane.epoch()
    }

    /// Whether the epoch's fence still holds planning back.
    pub fn fenced(&self) -> bool {
        self.plane.fenced()
    }

    /// This node with `membership` (the token and the limits; by default
    /// [`Membership::open`]).
    pub fn with_membership(mut self, membership: Membership) -> Self {
        self.plane.set_capability_key(membership.token.as_ref().map(dataplane::capability::CapabilityKey::from_token));
        self.membership = membership;
        self
    }

    /// The membership rules in force.
    pub fn membership(&self) -> &Membership {
        &self.membership
    }

    /// A freshly accepted link. Its registration (Challenge -> Join [+
    /// Models] -> Welcome or Refused) is done by later polls, within the
    /// handshake timeout from `now`. With [`Membership::max_pending`]
    /// links registering already, the oldest of them that has not sent its
    /// Join (else the oldest) is refused (`full`) to make room (issue 55):
    /// a flood of idle connections then pushes out its own connections,
    /// not a peer that connects after it and answers its challenge within
    /// a round trip. Refusing the newcomer instead let 256 idle
    /// connections lock every peer out for as long as they were renewed.
    /// The evicted link is of the address most registering links come
    /// from, so a flood from one address never pushes out a peer
    /// registering from another.
    pub fn handle_connection(&mut self, now: Instant, conn: C) {
        let key = self.next_key;
        self.next_key += 1;
        let source = conn.peer_addr();
        if self.pending.len() >= self.membership.max_pending {
            let crowd = dataplane::transport::tcp::most_frequent_source(self.pending.iter().map(|p| p.source));
            let oldest = |joined: bool| {
                self.pending
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| (crowd.is_none() || p.source == crowd) && (joined || p.backend.is_none()))
                    .min_by_key(|(_, p)| (p.since, p.key))
                    .map(|(i, _)| i)
            };
            match oldest(false).or_else(|| oldest(true)) {
                Some(i) => {
                    let evicted = self.pending.swap_remove(i);
                    let why = format!(
                        "{} links are registering (the limit): the oldest made room for a new one",
                        self.pending.len() + 1
                    );
                    self.refuse(now, evicted.key, evicted.conn, RefuseReason::Full, 0, "a registering peer".into(), why);
                }
                // max_pending 0: nobody may register.
                None => {
                    let why = "no link may register (the limit is 0)".to_string();
                    self.refuse(now, key, conn, RefuseReason::Full, 0, "a new peer".into(), why);
                    return;
                }
            }
        }
        self.pending.push(Pending {
            key,
            conn,
            source,
            since: now,
            nonce: None,
            backend: None,
        });
    }

    /// All due work at `now`: handshakes, messages in, the plane's timers,
    /// heartbeats out, dead peers buried, bytes flushed. Returns whether
    /// anything happened (then poll again before idling).
    pub fn poll(&mut self, now: Instant) -> bool {
        if let Some(last) = self.last_poll {
            let online = self.plane.online_gpus() as u64;
            self.metrics()
                .gpu_online_ns
                .inc_by(online.saturating_mul(now.saturating_since(last).as_nanos()));
        }
        self.last_poll = Some(now);
        let mut busy = false;
        if self.plane.fenced() {
            let until = *self.fence_until.get_or_insert(now + self.cfg.fence_wait);
            if now >= until {
                self.plane.lift_fence(now);
                busy = true;
            }
        }
        busy |= self.handshakes(now);
        self.linger(now);
        busy |= self.receive(now);
        if self.plane.poll_at().is_some_and(|t| t <= now) {
            self.plane.on_wake(now);
            busy = true;
        }
        busy |= self.plane.collect(now);
        if self.plane.next_expiry().is_some_and(|t| t <= now) {
            let count = self.plane.expire_overdue(now);
            if count > 0 {
                self.events.push_back(SchedulerEvent::BatchesExpired { count });
                busy = true;
            }
        }
        while let Some(v) = self.plane.take_delay_verdict() {
            self.events.push_back(SchedulerEvent::DelayBound(v));
        }
        self.plane.publish_estimates(now);
        self.drive_backlogs(now);
        // The outbox before heartbeats: a new peer's first message must be
        // its ack.
        busy |= self.flush(now);
        self.liveness(now);
        while !self.dead.is_empty() {
            self.bury(now);
            self.flush(now);
        }
        if self.stopping && self.drain_until.is_none() {
            self.drain_until = Some(now + self.cfg.drain);
        }
        busy
    }

    /// The earliest instant at which time alone makes progress: a
    /// scheduling timer, a heartbeat, a liveness, handshake, batch or
    /// drain deadline, a retry of a full send queue.
    pub fn poll_at(&self) -> Option<Instant> {
        let links = self.frontends.values().chain(self.backends.values());
        self.earliest(links.flat_map(|l| [Some(l.live.next_send()), Some(l.live.expires_at()), l.backlog.retry_at]).flatten())
    }

    /// [`poll_at`](Self::poll_at) or a little earlier, without visiting
    /// every link: the links' heartbeats and liveness bounds as of their
    /// last scan (hearing a peer only moves its bound later). For a host on
    /// a real clock, where an early wake costs one pass; a harness on a
    /// virtual clock keeps to `poll_at`, whose instants its trace records.
    pub fn wake_at(&self) -> Option<Instant> {
        let links = || self.frontends.values().chain(self.backends.values());
        let retry = self.backlogged.then(|| links().filter_map(|l| l.backlog.retry_at).min()).flatten();
        let scanned = Some(self.liveness_due).filter(|&t| t != Instant::from_nanos(u64::MAX));
        self.earliest(retry.into_iter().chain(scanned))
    }

    /// The earliest of `links` and every deadline not kept per link.
    fn earliest(&self, links: impl Iterator<Item = Instant>) -> Option<Instant> {
        let handshakes = self
            .pending
            .iter()
            .map(|p| p.since + self.cfg.handshake_timeout + Duration::from_nanos(1))
            .chain(self.closing.iter().map(|c| c.until));
        let fence = self.fence_until.filter(|_| self.plane.fenced());
        [self.plane.poll_at(), self.plane.next_expiry(), self.drain_until, fence]
            .into_iter()
            .flatten()
            .chain(links)
            .chain(handshakes)
            .min()
    }

    /// The next thing that happened, oldest first.
    pub fn poll_event(&mut self) -> Option<SchedulerEvent> {
        self.events.pop_front()
    }

    /// The control plane.
    pub fn plane(&self) -> &ControlPlane {
        &self.plane
    }

    /// The control plane, mutably.
    pub fn plane_mut(&mut self) -> &mut ControlPlane {
        &mut self.plane
    }

    /// Calls `f` with each connected link (registering ones included) and
    /// a key that no other link of this node ever has: for the host's
    /// wait set. A disconnected link is left out (its fd would poll
    /// readable for ever): the node drains it every pass from then on,
    /// until it is buried.
    pub fn for_each_conn(&mut self, mut f: impl FnMut(u64, &C)) {
        for p in &self.pending {
            f(p.key, &p.conn);
        }
        for c in &self.closing {
            f(c.key, &c.conn);
        }
        for (peer, l) in every_link(&mut self.frontends, &mut self.backends) {
            if l.conn.is_connected() {
                f(l.key, &l.conn);
            } else {
                l.activate(peer, &mut self.active);
            }
        }
    }

    /// Before the host sleeps on the links' wait fds: arms each link that
    /// was drained or sent to since it was last armed (see
    /// [`Connection::arm_wait`]; shm peers then write one wake-up byte per
    /// sleep, not one per message), and every registering or closing link,
    /// so that anything new makes a watched fd readable. False if a link
    /// holds input already: poll again instead of sleeping. A link armed
    /// before and untouched since needs nothing: its peer wakes us.
    pub fn arm_waits(&mut self) -> bool {
        let quiet = |c: &C| c.wait_fd().is_none() || (!c.may_hold_input() && c.arm_wait());
        if !(self.pending.iter().all(|p| quiet(&p.conn)) && self.closing.iter().all(|c| quiet(&c.conn))) {
            return false;
        }
        let (frontends, backends, mut armed) = (&mut self.frontends, &mut self.backends, true);
        self.active.retain(|&peer| {
            let link = match peer {
                PeerId::Frontend(id) => frontends.get_mut(&id),
                PeerId::Backend(id) => backends.get_mut(&id),
            };
            // After the first link with input, the rest wait for the next try.
            link.is_some_and(|l| {
                armed = armed && l.arm();
                l.active
            })
        });
        armed
    }

    /// Changes whenever the set of links [`for_each_conn`](Self::for_each_conn)
    /// visits may have changed (a link accepted, registered, refused or
    /// removed), so that a host can skip re-listing ~300 links on every
    /// pass. Why it is exact without a counter at every site: without a new
    /// connection (`next_key`), links only move pending -> registered or
    /// closing, or leave, so equal sizes of all four sets mean no move.
    /// A link that disconnected stays listed until it is removed; its fd
    /// then polls readable (hang-up) and the next pass drains and buries it.
    pub fn link_set_version(&self) -> [u64; 5] {
        [
            self.next_key,
            self.pending.len() as u64,
            self.closing.len() as u64,
            self.frontends.len() as u64,
            self.backends.len() as u64,
        ]
    }

    /// Readiness from the host (the keys of [`for_each_conn`](Self::for_each_conn)
    /// whose wait fd is readable): from the first call on, the next
    /// [`poll`](Self::poll) drains only these links, links whose last drain
    /// was cut short, links without a wait fd and disconnected ones,
    /// instead of one `try_recv` (a syscall that mostly finds nothing) per
    /// link per pass. Relies on the [`Connection::wait_fd`] contract: once
    /// `try_recv` has returned `Ok(None)`, a later message or the peer's
    /// departure makes the fd readable.
    pub fn set_readable(&mut self, keys: impl IntoIterator<Item = u64>) {
        let r = self.readable.get_or_insert_with(Vec::new);
        r.clear();
        r.extend(keys);
        r.sort_unstable();
    }

    /// Shutdown: every waiting task is dropped (reason `Shutdown`, sent by
    /// the next poll), new ones are refused, and batches in flight are
    /// waited for (at most [`NodeConfig::drain`] from the next poll).
    pub fn stop(&mut self) {
        if !self.stopping {
            self.stopping = true;
            self.plane.stop();
        }
    }

    /// Whether [`stop`](Self::stop) was called.
    pub fn stopping(&self) -> bool {
        self.stopping
    }

    /// Stopped, and every batch in flight finished or the drain bound
    /// passed (as of the last poll).
    pub fn drained(&self) -> bool {
        match (self.drain_until, self.last_poll) {
            (Some(until), Some(now)) => self.plane.batches_in_flight() == 0 || now >= until,
            _ => false,
        }
    }

    fn metrics(&self) -> &SchedulerMetrics {
        &self.metrics
    }

    fn new_link(&self, key: u64, conn: C, now: Instant) -> Link<C> {
        Link::new(key, conn, Liveness::new(now, self.cfg.heartbeat, self.cfg.dead_after))
    }

    /// Moves registering links along: the challenge out, then the Join
    /// (and a backend's Models) in, within the handshake timeout; a link
    /// that fails any check is refused.
    fn handshakes(&mut self, now: Instant) -> bool {
        let mut any = false;
        let mut i = 0;
        while i < self.pending.len() {
            if self.pending[i].nonce.is_none() {
                match self.challenge(i) {
                    Ok(true) => any = true,
                    Ok(false) => {}
                    Err(error) => {
                        self.events.push_back(SchedulerEvent::HandshakeFailed { error });
                        self.pending.swap_remove(i);
                        continue;
                    }
                }
            }
            let p = &mut self.pending[i];
            let got = match p.conn.try_recv(&mut self.buf) {
                Ok(Some(n)) => Some(n),
                Ok(None) => None,
                Err(e) => {
                    self.events.push_back(SchedulerEvent::HandshakeFailed { error: HandshakeError::Transport(Arc::new(e)) });
                    self.pending.swap_remove(i);
                    continue;
                }
            };
            let Some(n) = got else {
                if now.saturating_since(p.since) > self.cfg.handshake_timeout {
                    self.events.push_back(SchedulerEvent::HandshakeTimedOut {
                        after: self.cfg.handshake_timeout,
                    });
                    let p = self.pending.swap_remove(i);
                    let why = format!("no registration within {:?}", self.cfg.handshake_timeout);
                    self.refuse_quietly(now, p.key, p.conn, RefuseReason::Timeout, wire::VERSION, &why);
                    continue;
                }
                i += 1;
                continue;
            };
            any = true;
            match self.judge(now, i, n) {
                Verdict::Continue => i += 1,
                Verdict::Joined(peer) => {
                    let p = self.pending.swap_remove(i);
                    let link = self.new_link(p.key, p.conn, now);
                    match peer {
                        PeerId::Frontend(id) => self.frontends.insert(id, link),
                        PeerId::Backend(id) => self.backends.insert(id, link),
                    };
                    self.active.push(peer);
                    let at = self.peer_of_key.partition_point(|&(k, _)| k < p.key);
                    self.peer_of_key.insert(at, (p.key, peer));
                    self.liveness_due = Instant::ZERO;
                    self.events.push_back(SchedulerEvent::PeerJoined(peer));
                }
                Verdict::Refuse(reason, version, who, why) => {
                    let p = self.pending.swap_remove(i);
                    self.refuse(now, p.key, p.conn, reason, version, who, why);
                }
            }
        }
        any
    }

    /// Sends the challenge on pending link `i`: Ok(true) once sent,
    /// Ok(false) while its queue is full, Err when the link is unusable.
    fn challenge(&mut self, i: usize) -> Result<bool, HandshakeError> {
        let nonce = self.membership.nonces.next_nonce().ok_or(HandshakeError::NoRandomness)?;
        let c = Challenge::new(nonce, self.membership.token.is_some());
        let n = wire::encode(&mut self.buf, &c)?;
        let p = &mut self.pending[i];
        match p.conn.send(&self.buf[..n]) {
            Ok(()) => {
                p.nonce = Some(nonce);
                Ok(true)
            }
            Err(Error::QueueFull) => Ok(false),
            Err(e) => Err(HandshakeError::Transport(Arc::new(e))),
        }
    }

    /// What the `n`-byte message in the buffer does to pending link `i`.
    /// Nothing a refused peer sent reaches the plane: it is told only of
    /// authenticated Joins within the limits.
    fn judge(&mut self, now: Instant, i: usize, n: usize) -> Verdict {
        let bytes = &self.buf[..n];
        let p = &mut self.pending[i];
        let who = |peek: Option<wire::PeerPeek>| {
            peek.map_or_else(|| "an unidentified peer".to_string(), |p| p.to_string())
        };
        let decoded = wire::decode(bytes);
        let (join, nonce) = match (decoded, p.backend, p.nonce) {
            (Ok(Message::Join(j)), None, Some(nonce)) => (j, nonce),
            (Ok(Message::Models(ids, busy)), Some(j), nonce) => {
                // Another backend may have joined since this one's Join.
                if self.backends.len() >= self.membership.max_backends {
                    let why = format!("{} backends are registered (the limit)", self.backends.len());
                    return Verdict::Refuse(RefuseReason::Full, wire::VERSION, peek_of(&j).to_string(), why);
                }
                self.ids.clear();
                self.ids.extend(ids.iter());
                self.busy.clear();
                self.busy.extend(busy.iter());
                return match self.plane.backend_registered(now, j.id, j.count, &self.ids, &self.busy, j.reports_ready()) {
                    Ok(()) => self.sign_welcome(PeerId::Backend(j.id), nonce, &j),
                    Err(e) => Verdict::Refuse(RefuseReason::Rejected, wire::VERSION, peek_of(&j).to_string(), e.to_string()),
                };
            }
            (Err(WireError::BadVersion(v)), _, _) => {
                let why = format!(
                    "it speaks wire version {v}; this scheduler speaks {} and accepts {}..={}",
                    wire::VERSION,
                    wire::OLDEST_PEER_VERSION,
                    wire::VERSION
                );
                return Verdict::Refuse(RefuseReason::Version, v, who(wire::peek_peer(bytes)), why);
            }
            (Ok(m), _, _) => {
                let why = format!("{} out of the registration's order", kind_name(&m));
                return Verdict::Refuse(RefuseReason::Malformed, wire::VERSION, who(wire::peek_peer(bytes)), why);
            }
            (Err(e), _, _) => {
                let why = format!("a registration that does not decode ({e})");
                return Verdict::Refuse(RefuseReason::Malformed, wire::VERSION, who(wire::peek_peer(bytes)), why);
            }
        };
        let who = peek_of(&join).to_string();
        if let Some(token) = &self.membership.token {
            if !join.has_mac() {
                let why = "it has no join token (give it --join-token-file or SYMPHONY_JOIN_TOKEN)";
                return Verdict::Refuse(RefuseReason::NoToken, wire::VERSION, who, why.into());
            }
            if !token.verify(&nonce, wire::VERSION, &join) {
                let why = "its join token is not this cluster's";
                return Verdict::Refuse(RefuseReason::BadToken, wire::VERSION, who, why.into());
            }
        }
        let (live, limit) = match join.role() {
            Some(Role::Frontend) => (self.frontends.len(), self.membership.max_frontends),
            _ => (self.backends.len(), self.membership.max_backends),
        };
        if live >= limit {
            let why = format!("{live} peers of its role are registered (the limit)");
            return Verdict::Refuse(RefuseReason::Full, wire::VERSION, who, why);
        }
        match join.role() {
            Some(Role::Frontend) => match self.plane.frontend_joined(join.id, join.endpoint()) {
                Ok(()) => self.sign_welcome(PeerId::Frontend(join.id), Some(nonce), &join),
                Err(e) => Verdict::Refuse(RefuseReason::Rejected, wire::VERSION, who, e.to_string()),
            },
            // The decoder admits only frontends and backends.
            _ => {
                p.backend = Some(join);
                Verdict::Continue
            }
        }
    }

    /// Signs the Welcome the plane just queued for `peer`, whose `join`
    /// answered the challenge of `nonce` (with a token; without one it
    /// leaves unsigned): a peer holding the token takes nothing from a
    /// scheduler before its Welcome verifies (`JoinToken::sign_welcome`).
    fn sign_welcome(&mut self, peer: PeerId, nonce: Option<[u8; wire::NONCE_LEN]>, join: &Join) -> Verdict {
        if let (Some(token), Some(nonce)) = (&self.membership.token, nonce) {
            if let Some(bytes) = self.plane.outbox().newest_mut(peer, wire::Kind::Welcome) {
                if let Ok(Message::Welcome(w)) = wire::decode(bytes) {
                    let mac = token.sign_welcome(&nonce, join, &w);
                    let at = bytes.len() - wire::MAC_LEN;
                    bytes[at..].copy_from_slice(&mac);
                }
            }
        }
        Verdict::Joined(peer)
    }

    /// Refuses a link: counted, logged, told why (best effort), kept open
    /// for [`Membership::linger`] so that the refusal can leave.
    #[allow(clippy::too_many_arguments)]
    fn refuse(&mut self, now: Instant, key: u64, conn: C, reason: RefuseReason, version: u16, who: String, why: String) {
        self.events.push_back(SchedulerEvent::PeerRefused {
            why: format!("{who}: {why} [{reason}]"),
        });
        self.refuse_quietly(now, key, conn, reason, version, &why);
    }

    /// [`refuse`](Self::refuse) without the event (the caller has its own).
    fn refuse_quietly(&mut self, now: Instant, key: u64, mut conn: C, reason: RefuseReason, version: u16, why: &str) {
        self.metrics.count_refusal(reason);
        if let Ok(n) = wire::encode(&mut self.buf, &Refused::new(reason, version, why)) {
            let _ = conn.send(&self.buf[..n]);
            let _ = conn.progress();
        }
        self.closing.push(Closing { key, conn, until: now + self.membership.linger });
    }

    /// Drives refused links until their refusal left (the peer hung up) or
    /// the linger passed; then drops them.
    fn linger(&mut self, now: Instant) {
        let buf = &mut self.buf;
        self.closing.retain_mut(|c| {
            // Anything the peer still sends is read and discarded (bounded
            // per poll); an error is its departure.
            let mut gone = c.conn.progress().is_err();
            for _ in 0..MSGS_PER_PEER {
                match c.conn.try_recv(buf) {
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(_) => {
                        gone = true;
                        break;
                    }
                }
            }
            !gone && now < c.until
        });
    }

    /// The links a pass reads, sorted (into `self.visit`): every one
    /// without readiness from the host; with it, the active ones and those
    /// whose fd the host saw readable (an armed link untouched since holds
    /// nothing its fd does not report).
    fn links_to_read(&mut self) {
        let (frontends, backends) = &mut self.visit;
        frontends.clear();
        backends.clear();
        let Some(readable) = &self.readable else {
            frontends.extend(self.frontends.keys());
            backends.extend(self.backends.keys());
            return;
        };
        let peer_of = |key: &u64| self.peer_of_key.binary_search_by_key(key, |&(k, _)| k).ok().map(|i| self.peer_of_key[i].1);
        for peer in readable.iter().filter_map(peer_of).chain(self.active.iter().copied()) {
            match peer {
                PeerId::Frontend(id) => frontends.push(id),
                PeerId::Backend(id) => backends.push(id),
            }
        }
        for ids in [frontends, backends] {
            ids.sort_unstable();
            ids.dedup();
        }
    }

    /// Takes messages from every registered peer that may have sent some.
    fn receive(&mut self, now: Instant) -> bool {
        self.links_to_read();
        let (visit_frontends, visit_backends) = std::mem::take(&mut self.visit);
        let mut any = false;
        let plane = &mut self.plane;
        let active = &mut self.active;
        let readable = self.readable.as_deref();
        // Frontends from where the last poll stopped, round robin.
        let start = visit_frontends.partition_point(|&id| id < self.next_frontend);
        let mut taken = 0usize;
        let mut cut = None;
        let mut order = visit_frontends[start..].iter().chain(&visit_frontends[..start]);
        for &id in order.by_ref() {
            if taken >= TASKS_PER_POLL {
                cut = Some(id);
                break;
            }
            let Some(link) = self.frontends.get_mut(&id).filter(|l| may_hold_messages(l, readable)) else {
                continue;
            };
            link.activate(PeerId::Frontend(id), active);
            any |= drain_link(link, &mut self.buf, now, PeerId::Frontend(id), &mut self.dead, &self.metrics, |m, _| match m {
                Message::Task(t) => {
                    taken += 1;
                    plane.on_task(now, id, &t);
                    true
                }
                Message::Cancel(c) => {
                    plane.on_cancel(now, id, &c);
                    true
                }
                Message::Tasks(list) => {
                    taken += list.len();
                    for t in list.iter() {
                        plane.on_task(now, id, &t);
                    }
                    true
                }
                Message::BenchStamp(s) => {
                    plane.on_bench_stamp(id, &s);
                    true
                }
                _ => false,
            });
        }
        if let Some(id) = cut {
            // The links not reached keep their bytes: this poll counts as
            // busy, so the host polls again without sleeping, and they are
            // read then. They are listed active, or the next pass would
            // not visit them: a doorbell reports a link once, not for as
            // long as it holds bytes as a readable fd does, and a producer
            // whose ring is full rings no more (such a link waited for its
            // next heartbeat's send, ~100 ms: ingress p99.9 at 65-131 ms
            // in every doorbell run of 96c0a20).
            self.next_frontend = id;
            any = true;
            for &later in std::iter::once(&id).chain(order) {
                if let Some(link) = self.frontends.get_mut(&later) {
                    link.unread = true;
                    link.activate(PeerId::Frontend(later), active);
                }
            }
        }
        for &id in &visit_backends {
            let Some(link) = self.backends.get_mut(&id).filter(|l| may_hold_messages(l, readable)) else {
                continue;
            };
            link.activate(PeerId::Backend(id), active);
            any |= drain_link(link, &mut self.buf, now, PeerId::Backend(id), &mut self.dead, &self.metrics, |m, bytes| match m {
                Message::BatchDone(d) => {
                    plane.on_batch_done(now, id, &d);
                    true
                }
                Message::Completion(h, _) => {
                    plane.on_rerouted_completion(bytes, &h);
                    true
                }
                // A graceful leave (issue 52): see `ControlPlane::backend_draining`.
                Message::Drain(d) if d.backend_id == id && d.stage() == Some(wire::DrainStage::Draining) => {
                    plane.backend_draining(now, id);
                    true
                }
                // The join gate (issue 52): see `ControlPlane::backend_ready`.
                Message::Drain(d) if d.backend_id == id && d.stage() == Some(wire::DrainStage::Ready) => {
                    plane.backend_ready(now, id);
                    true
                }
                _ => false,
            });
        }
        if let Some(r) = self.readable.as_mut() {
            r.clear();
        }
        self.visit = (visit_frontends, visit_backends);
        any
    }

    /// Retries the sends that full queues refused; a peer whose queue
    /// stays full too long, or whose link fails, is dead.
    fn drive_backlogs(&mut self, now: Instant) {
        if !self.backlogged {
            return;
        }
        self.backlogged = false;
        let links = every_link(&mut self.frontends, &mut self.backends);
        for (peer, link) in links {
            if link.backlog.is_empty() {
                continue;
            }
            link.activate(peer, &mut self.active);
            if let Err(e) = link.backlog.drive(&mut link.conn, now, self.cfg.send_timeout) {
                self.events.push_back(SchedulerEvent::SendFailed { peer, error: e.to_string() });
                self.dead.push(peer);
            }
            self.backlogged |= !link.backlog.is_empty();
        }
    }

    /// Sends due heartbeats and declares silent peers dead.
    fn liveness(&mut self, now: Instant) {
        // Heartbeats fall due every 100 ms and hearing a peer only moves
        // its bound later: most passes have nothing to do here, and a scan
        // of ~300 links per pass was a good part of a quiet pass.
        if now < self.liveness_due {
            return;
        }
        let mut next = Instant::from_nanos(u64::MAX);
        let hb = &mut self.hb;
        let links = every_link(&mut self.frontends, &mut self.backends);
        for (peer, link) in links {
            if link.live.expired(now) {
                self.events.push_back(SchedulerEvent::PeerSilent(peer));
                self.dead.push(peer);
                continue;
            }
            // No separate progress(): `receive` has just drained every link
            // with try_recv, which drives the connection (flushes sends,
            // notices a departure) in the same call. A backlogged link
            // skips the beat: it must not overtake queued messages.
            if let Some(n) = link.live.due(now, Role::Scheduler, 0, hb).filter(|_| link.backlog.is_empty()) {
                link.activate(peer, &mut self.active);
                match link.conn.send(&hb[..n]) {
                    Ok(()) | Err(Error::QueueFull) => {}
                    Err(_) => self.dead.push(peer),
                }
            }
            next = next.min(link.live.next_send()).min(link.live.expires_at());
        }
        self.liveness_due = next;
    }

    /// Sends the plane's outbox: every message to a peer is queued on its
    /// link, then each link that got any is flushed once (one system call
    /// per peer per pass, however many plans, drops or completions).
    /// Returns whether the outbox held anything.
    fn flush(&mut self, now: Instant) -> bool {
        let out = self.plane.outbox();
        if out.is_empty() {
            return false;
        }
        for (peer, msg) in out.iter() {
            if self.dead.contains(&peer) {
                continue;
            }
            let Some(link) = (match peer {
                PeerId::Frontend(id) => self.frontends.get_mut(&id),
                PeerId::Backend(id) => self.backends.get_mut(&id),
            }) else {
                continue;
            };
            link.activate(peer, &mut self.active);
            if let Err(e) = link.send(now, msg) {
                self.events.push_back(SchedulerEvent::SendFailed { peer, error: e.to_string() });
                self.dead.push(peer);
                continue;
            }
            self.backlogged |= !link.backlog.is_empty();
            if !link.queued {
                link.queued = true;
                self.touched.push(peer);
            }
        }
        out.clear();
        for peer in self.touched.drain(..) {
            let link = match peer {
                PeerId::Frontend(id) => self.frontends.get_mut(&id),
                PeerId::Backend(id) => self.backends.get_mut(&id),
            };
            if let Some(link) = link {
                link.queued = false;
                if let Err(e) = link.conn.flush_batched() {
                    self.events.push_back(SchedulerEvent::SendFailed { peer, error: e.to_string() });
                    self.dead.push(peer);
                }
            }
        }
        self.plane.outbox_sent();
        true
    }

    /// Removes dead peers (closing their links) and tells the plane.
    fn bury(&mut self, now: Instant) {
        while let Some(p) = self.dead.pop() {
            self.active.retain(|&a| a != p);
            self.peer_of_key.retain(|&(_, a)| a != p);
            match p {
                PeerId::Frontend(id) => {
                    if self.frontends.remove(&id).is_some() {
                        self.events.push_back(SchedulerEvent::PeerLost(p));
                        self.metrics().frontend_deaths.inc();
                        self.plane.frontend_left(id);
                    }
                }
                PeerId::Backend(id) => {
                    if self.backends.remove(&id).is_some() {
                        self.events.push_back(SchedulerEvent::PeerLost(p));
                        self.plane.backend_left(now, id);
                    }
                }
            }
        }
    }
}

/// The role and id a Join claims, for log lines.
fn peek_of(j: &Join) -> wire::PeerPeek {
    wire::PeerPeek { version: wire::VERSION, kind: wire::Kind::Join as u16, role: j.role, id: j.id }
}

/// A message's kind name, for log lines.
fn kind_name(m: &Message<'_>) -> &'static str {
    match m {
        Message::Register(_) => "a Register",
        Message::Heartbeat(_) => "a Heartbeat",
        Message::Task(_) => "a Task",
        Message::Cancel(_) => "a Cancel",
        Message::BatchPlan(..) => "a BatchPlan",
        Message::Completion(..) => "a Completion",
        Message::Dropped(_) => "a Dropped",
        Message::BatchDone(_) => "a BatchDone",
        Message::ReadRequest(_) => "a ReadRequest",
        Message::ReadResponse(_) => "a ReadResponse",
        Message::Models(..) => "a Models list",
        Message::Challenge(_) => "a Challenge",
        Message::Join(_) => "a Join",
        Message::Welcome(_) => "a Welcome",
        Message::Refused(_) => "a Refused",
        Message::BenchStamp(_) => "a BenchStamp",
        Message::Tasks(_) => "a Tasks batch",
        Message::Drain(_) => "a Drain",
    }
}

#[cfg(test)]
#[path = "node_auth_tests.rs"]
mod auth_tests;

#[cfg(test)]
mod readiness_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deferred::CoreConfig;
    use crate::zoo::ModelSpec;
    use dataplane::transport::sim::{FaultConfig, NodeId, SimConn, SimNet, SimPeer};
    use dataplane::wire::{BatchDone, Join, RemoteRef, Task};

    const SCHEDULER: NodeId = 0;
    const PEER: NodeId = 1;

    /// What the tests read from and write to a peer's end.
    trait PeerExt {
        /// Answers the scheduler's challenge with `join` (the node's
        /// membership is open: no MAC).
        fn join(&mut self, join: &Join);
        fn send_models(&mut self, ids: &[u32]);
        /// Every message received, debug-formatted, heartbeats left out.
        fn received(&mut self) -> Vec<String>;
    }

    impl PeerExt for SimPeer {
        fn join(&mut self, join: &Join) {
            super::auth_tests::take_nonce(&mut self.link);
            self.send(join).unwrap();
        }
        fn send_models(&mut self, ids: &[u32]) {
            self.send_encoded(|buf| wire::encode_models(buf, ids)).unwrap();
        }
        fn received(&mut self) -> Vec<String> {
            let msgs = self.take_all();
            msgs.iter()
                .map(|m| wire::decode(m).unwrap())
                .filter(|m| !matches!(m, Message::Heartbeat(_)))
                .map(|m| format!("{m:?}"))
                .collect()
        }
    }

    /// The node under test and the network its links run on (messages
    /// arrive at the instant they are sent).
    struct Sched {
        net: SimNet,
        node: SchedulerNode<SimConn>,
    }

    fn node(cfg: NodeConfig) -> Sched {
        let models = vec![ModelSpec::linear("a", 1.0, 5.0, 50.0).unwrap()];
        let metrics = Arc::new(SchedulerMetrics::new(&models));
        let plane = ControlPlane::new(models, &[vec![0]], CoreConfig::default(), metrics).unwrap();
        Sched { net: SimNet::new(0, FaultConfig::same_instant()), node: SchedulerNode::new(plane, cfg) }
    }

    impl Sched {
        /// Hands the node a new link at `now` and lets its challenge go
        /// out; returns the peer's end, whose sends may queue up to
        /// `capacity` unread at the node.
        fn connect_with(&mut self, now: Instant, capacity: Option<usize>) -> SimPeer {
            self.net.set_now(now);
            let (mut ours, theirs) = self.net.link(SCHEDULER, PEER).unwrap();
            ours.set_send_capacity(capacity);
            self.node.handle_connection(now, ours);
            self.settle(now);
            SimPeer::new(theirs)
        }

        fn connect(&mut self, now: Instant) -> SimPeer {
            self.connect_with(now, None)
        }

        fn events(&mut self) -> Vec<SchedulerEvent> {
            std::iter::from_fn(|| self.node.poll_event()).collect()
        }

        /// Moves the clock to `now` and polls until quiet.
        fn settle(&mut self, now: Instant) {
            assert!(self.net.settle(now, 100, |t| self.node.poll(t)), "node never quiet");
        }

        /// Runs on the virtual clock, jumping to each `poll_at`, up to `until`.
        fn run_until(&mut self, from: Instant, until: Instant, mut each: impl FnMut(Instant)) -> Instant {
            let mut now = from;
            loop {
                self.settle(now);
                each(now);
                match self.node.poll_at() {
                    Some(t) if t <= until => now = t.max(now),
                    _ => return now,
                }
            }
        }
    }

    fn task(id: u64, frontend: u32) -> Task {
        Task {
            task_id: wire::TaskId::new(frontend, id, 0).0,
            budget_ns: 40_000_000,
            model_id: 0,
            frontend_id: frontend,
            input: RemoteRef { key: 1, len: 16, offset: 0 },
            ..Default::default()
        }
    }

    /// A frontend 1 and a backend 7 (one GPU), registered at t=0.
    fn cluster(n: &mut Sched) -> (SimPeer, SimPeer) {
        let t0 = Instant::ZERO;
        let mut fe = n.connect(t0);
        let mut be = n.connect(t0);
        fe.join(&Join::new(Role::Frontend, 1, 0, "fe1"));
        be.join(&Join::new(Role::Backend, 7, 1, ""));
        be.send_models(&[0]);
        n.settle(t0);
        assert_eq!(
            n.events(),
            vec![
                SchedulerEvent::PeerJoined(PeerId::Frontend(1)),
                SchedulerEvent::PeerJoined(PeerId::Backend(7))
            ]
        );
        (fe, be)
    }

    #[test]
    fn registers_peers_and_turns_tasks_into_plans() {
        let mut n = node(NodeConfig::default());
        let (mut fe, mut be) = cluster(&mut n);
        let fe_msgs = fe.received();
        assert_eq!(fe_msgs.len(), 1, "{fe_msgs:?}");
        assert!(fe_msgs[0].starts_with("Welcome") && fe_msgs[0].contains("models: 1"), "the ack first: {fe_msgs:?}");
        let be_msgs = be.received();
        assert!(be_msgs[0].starts_with("Welcome"), "{be_msgs:?}");
        assert!(be_msgs[1].contains("endpoint") || be_msgs[1].contains("fe1") || be_msgs[1].contains("id: 1"), "{be_msgs:?}");
        fe.send(&task(1, 1)).unwrap();
        fe.send(&task(2, 1)).unwrap();
        let t0 = Instant::ZERO;
        let mut plans = Vec::new();
        n.run_until(t0, t0 + Duration::from_millis(100), |_| plans.extend(be.received()));
        assert!(plans.iter().any(|m| m.starts_with("BatchPlan")), "{plans:?}");
        assert_eq!(n.node.plane().batches_in_flight(), 1);
    }

    /// `cluster` plus a second frontend (id 2), every message so far
    /// taken: (frontend 1, the backend, frontend 2).
    fn two_frontends(n: &mut Sched) -> (SimPeer, SimPeer, SimPeer) {
        let (mut fe, mut be) = cluster(n);
        let t0 = Instant::ZERO;
        let mut other = n.connect(t0);
        other.join(&Join::new(Role::Frontend, 2, 0, "fe2"));
        n.settle(t0);
        let _ = (fe.received(), be.received(), other.received(), n.events());
        (fe, be, other)
    }

    #[test]
    fn batched_tasks_are_taken_and_a_malformed_batch_costs_only_its_sender() {
        let mut n = node(NodeConfig::default());
        let (mut fe, _be, mut other) = two_frontends(&mut n);
        let t0 = Instant::ZERO;
        let mut b = wire::TaskBatcher::new(8);
        for i in 1..=3 {
            b.push(&task(i, 1)).unwrap();
        }
        let batch = b.take().unwrap().to_vec();
        fe.send_encoded(|buf| {
            buf[..batch.len()].copy_from_slice(&batch);
            Ok(batch.len())
        })
        .unwrap();
        n.settle(t0);
        assert_eq!(n.node.plane().metrics().tasks_received.get(), 3);
        // Frontend 2's batch claims more tasks than it holds.
        let mut bad = batch.clone();
        bad[wire::HEADER_LEN] = 200;
        other
            .send_encoded(|buf| {
                buf[..bad.len()].copy_from_slice(&bad);
                Ok(bad.len())
            })
            .unwrap();
        n.settle(t0);
        assert_eq!(n.node.plane().metrics().protocol_errors.get(), 1);
        assert_eq!(n.node.plane().peers(), (1, 1), "only the sender of the bad batch is gone");
        fe.send(&task(4, 1)).unwrap();
        n.settle(t0);
        assert_eq!(n.node.plane().metrics().tasks_received.get(), 4);
    }

    #[test]
    fn a_poll_takes_a_bounded_number_of_tasks_and_the_next_starts_at_the_next_frontend() {
        let mut n = node(NodeConfig::default());
        let (mut fe, _be, mut other) = two_frontends(&mut n);
        let t0 = Instant::ZERO;
        let extra = 20;
        for i in 1..=TASKS_PER_POLL as u64 + extra {
            fe.send(&task(i, 1)).unwrap();
        }
        for i in 1..=extra {
            other.send(&task(i, 2)).unwrap();
        }
        let received = |n: &Sched| n.node.plane().metrics().tasks_received.get();
        assert!(n.node.poll(t0), "a cut poll is busy: the host polls again at once");
        assert_eq!(received(&n), TASKS_PER_POLL as u64, "frontend 1 filled the poll; frontend 2 waits");
        n.node.poll(t0);
        assert_eq!(received(&n), TASKS_PER_POLL as u64 + 2 * extra, "frontend 2 first, then the rest of frontend 1");
    }

    #[test]
    fn a_link_that_does_not_register_in_time_is_dropped_at_its_deadline() {
        let cfg = NodeConfig::default();
        let mut n = node(cfg);
        let t0 = Instant::ZERO;
        let mut silent = n.connect(t0);
        n.settle(t0);
        let deadline = t0 + cfg.handshake_timeout + Duration::from_nanos(1);
        assert_eq!(n.node.poll_at(), Some(deadline));
        // The clock jumps straight to the deadline.
        n.settle(deadline);
        assert_eq!(n.events(), vec![SchedulerEvent::HandshakeTimedOut { after: cfg.handshake_timeout }]);
        // The refusal gets its linger to leave, then the link closes.
        let closed_at = deadline + Membership::open().linger;
        assert_eq!(n.node.poll_at(), Some(closed_at));
        n.settle(closed_at);
        assert!(silent.received().iter().any(|m| m.starts_with("Refused")));
        assert!(silent.disconnected());
        assert_eq!(n.node.poll_at(), None);
    }

    #[test]
    fn a_refused_registration_closes_the_link() {
        let mut n = node(NodeConfig::default());
        let (_fe, _be) = cluster(&mut n);
        let mut dup = n.connect(Instant::ZERO);
        dup.join(&Join::new(Role::Frontend, 1, 0, "again"));
        n.settle(Instant::ZERO);
        let ev = n.events();
        assert!(matches!(&ev[..], [SchedulerEvent::PeerRefused { why }] if why.contains("already registered")), "{ev:?}");
        // The link closes once the refusal had its linger.
        n.settle(Instant::ZERO + Membership::open().linger);
        assert!(dup.received().iter().any(|m| m.starts_with("Refused")));
        assert!(dup.disconnected());
    }

    #[test]
    fn a_silent_backend_is_buried_and_its_batches_fail_back() {
        let cfg = NodeConfig::default();
        let mut n = node(cfg);
        let (mut fe, mut be) = cluster(&mut n);
        fe.received();
        fe.send(&task(1, 1)).unwrap();
        let t0 = Instant::ZERO;
        // The frontend keeps beating; the backend says nothing after its plan.
        let mut fe_beat = 0u64;
        let end = n.run_until(t0, t0 + Duration::from_secs_f64(1.5), |_| {
            be.received();
            fe_beat += 1;
            fe.send(&wire::Heartbeat { seq: fe_beat, role: Role::Frontend as u32, id: 1 }).unwrap();
        });
        let ev = n.events();
        assert!(ev.contains(&SchedulerEvent::PeerSilent(PeerId::Backend(7))), "{ev:?}");
        assert!(ev.contains(&SchedulerEvent::PeerLost(PeerId::Backend(7))), "{ev:?}");
        assert!(end >= t0 + cfg.dead_after);
        let failed: Vec<String> = fe.received().into_iter().filter(|m| m.contains("status: 3")).collect();
        assert_eq!(failed.len(), 1, "{failed:?}");
        assert!(be.disconnected());
        assert_eq!(n.node.plane().batches_in_flight(), 0);
    }

    #[test]
    fn a_batch_whose_done_never_comes_is_failed_back_after_the_grace() {
        let cfg = NodeConfig { batch_grace: Duration::from_millis(300), ..NodeConfig::default() };
        let mut n = node(cfg);
        let (mut fe, mut be) = cluster(&mut n);
        fe.received();
        fe.send(&task(1, 1)).unwrap();
        let t0 = Instant::ZERO;
        let mut seq = 0;
        // Both peers stay alive, but the backend never reports the batch.
        n.run_until(t0, t0 + Duration::from_millis(500), |_| {
            be.received();
            seq += 1;
            fe.send(&wire::Heartbeat { seq, role: Role::Frontend as u32, id: 1 }).unwrap();
            be.send(&wire::Heartbeat { seq, role: Role::Backend as u32, id: 7 }).unwrap();
        });
        let ev = n.events();
        assert_eq!(ev, vec![SchedulerEvent::BatchesExpired { count: 1 }]);
        assert_eq!(n.node.plane().batches_in_flight(), 0);
        assert_eq!(fe.received().iter().filter(|m| m.contains("status: 3")).count(), 1);
        // A late report is learned from, and answers nobody again; a copy
        // of it, or a report of a batch never planned, is a protocol error.
        let late = BatchDone { batch_id: 1, gpu_id: 0, count: 1, start_ago_ns: 9_000_000, ..BatchDone::default() };
        be.send(&late).unwrap();
        be.send(&late).unwrap();
        be.send(&BatchDone { batch_id: 99, gpu_id: 0, count: 1, ..BatchDone::default() }).unwrap();
        n.settle(t0 + Duration::from_millis(500));
        assert!(n.events().is_empty());
        let m = n.node.plane().metrics();
        assert_eq!((m.late_batch_reports.get(), m.protocol_errors.get()), (1, 2));
        assert_eq!(n.node.plane().gpu_ratio(7, 0).map(|r| r.samples()), Some(1), "learned from");
        assert!(fe.received().is_empty(), "the task was answered once");
    }

    #[test]
    fn a_full_send_queue_backs_up_then_kills_the_peer_after_the_send_timeout() {
        let cfg = NodeConfig::default();
        let mut n = node(cfg);
        let t0 = Instant::ZERO;
        let mut fe = n.connect_with(t0, Some(1));
        fe.join(&Join::new(Role::Frontend, 1, 0, "fe1"));
        n.settle(t0);
        // The ack took the one place; unknown-model drops queue behind it.
        for id in 0..3 {
            fe.send(&Task { model_id: 9, ..task(id, 1) }).unwrap();
        }
        n.settle(t0);
        assert_eq!(fe.received().len(), 1, "only the ack got through");
        let t1 = t0 + Duration::from_millis(50);
        n.settle(t1);
        assert_eq!(fe.received().len(), 1, "the backlog drained one");
        // Then the frontend stops reading for longer than the send timeout.
        let mut now = t1;
        while let Some(t) = n.node.poll_at() {
            if t > t1 + cfg.send_timeout + cfg.send_timeout {
                break;
            }
            now = t.max(now);
            n.settle(now);
            // Proof of life (it fails once the node has closed the link).
            let _ = fe.send(&wire::Heartbeat { seq: 1, role: Role::Frontend as u32, id: 1 });
        }
        let ev = n.events();
        assert!(ev.iter().any(|e| matches!(e, SchedulerEvent::SendFailed { peer: PeerId::Frontend(1), .. })), "{ev:?}");
        assert!(ev.contains(&SchedulerEvent::PeerLost(PeerId::Frontend(1))), "{ev:?}");
    }

    #[test]
    fn stop_drops_waiting_tasks_and_drains_once_batches_are_done() {
        let mut n = node(NodeConfig::default());
        let (mut fe, mut be) = cluster(&mut n);
        fe.received();
        let t0 = Instant::ZERO;
        fe.send(&task(1, 1)).unwrap();
        n.settle(t0);
        let plan_at = n.node.poll_at().unwrap();
        n.settle(plan_at);
        assert_eq!(n.node.plane().batches_in_flight(), 1);
        fe.send(&Task { budget_ns: 1_000_000_000, ..task(2, 1) }).unwrap();
        n.settle(plan_at);
        n.node.stop();
        n.settle(plan_at);
        assert!(!n.node.drained(), "a batch is in flight");
        assert!(fe.received().iter().any(|m| m.starts_with("Dropped") && m.contains("reason: ")));
        let plan = be.received().into_iter().find(|m| m.starts_with("BatchPlan")).unwrap();
        assert!(plan.contains("batch_id: 1"), "{plan}");
        be.send(&BatchDone { batch_id: 1, start_ago_ns: 1, gpu_id: 0, count: 1, ..BatchDone::default() }).unwrap();
        n.settle(plan_at);
        assert!(n.node.drained());
    }

    /// A node elected in `epoch`.
    fn elected(cfg: NodeConfig, epoch: u32) -> Sched {
        let Sched { net, node: n } = node(cfg);
        Sched { net, node: n.with_epoch(epoch) }
    }

    /// Every plan a peer received, with the instant it was sent at.
    fn plans_of(peer: &mut SimPeer, at: Instant, out: &mut Vec<(Instant, wire::BatchPlanHead)>) {
        for m in peer.take_all() {
            if let Ok(Message::BatchPlan(h, _)) = wire::decode(&m) {
                out.push((at, h));
            }
        }
    }

    #[test]
    fn an_elected_node_stamps_its_epoch_and_plans_nothing_until_the_fence_lifts() {
        let fence = Duration::from_millis(20);
        let mut n = elected(NodeConfig { fence_wait: fence, ..NodeConfig::default() }, 3);
        assert_eq!(n.node.epoch(), 3);
        let (mut fe, mut be) = cluster(&mut n);
        let t0 = Instant::ZERO;
        let welcome = |m: &[u8]| matches!(wire::decode(m), Ok(Message::Welcome(w)) if w.epoch == 3);
        assert!(welcome(&fe.take_all()[0]) && welcome(&be.take_all()[0]));
        assert!(n.node.fenced());
        fe.send(&task(1, 1)).unwrap();
        let mut plans = Vec::new();
        n.run_until(t0, t0 + Duration::from_millis(100), |now| plans_of(&mut be, now, &mut plans));
        assert!(!n.node.fenced());
        assert!(!plans.is_empty(), "the task ran once the fence lifted");
        for (at, h) in &plans {
            assert!(*at >= t0 + fence, "planned at {at:?}, inside the fence");
            assert_eq!(h.epoch, 3);
            assert!(h.run_ns > 0);
        }
        let drops: u64 = n.node.plane().metrics().drops.iter().map(|c| c.get()).sum();
        assert_eq!(drops, 0, "queued, not dropped");
    }

    #[test]
    fn nothing_is_planned_on_a_gpu_before_the_busy_time_its_backend_reported() {
        let mut n = node(NodeConfig::default());
        let t0 = Instant::ZERO;
        let mut fe = n.connect(t0);
        let mut be = n.connect(t0);
        fe.join(&Join::new(Role::Frontend, 1, 0, "fe1"));
        be.join(&Join::new(Role::Backend, 7, 1, ""));
        let busy = [wire::GpuBusy { busy_ns: 30_000_000, gpu_id: 0, batches: 1 }];
        be.send_encoded(|buf| wire::encode_models_busy(buf, &[0], &busy)).unwrap();
        n.settle(t0);
        assert_eq!(n.node.plane().peers(), (1, 1));
        let _ = (fe.take_all(), be.take_all());
        fe.send(&Task { budget_ns: 45_000_000, ..task(1, 1) }).unwrap();
        let mut plans = Vec::new();
        n.run_until(t0, t0 + Duration::from_millis(100), |now| plans_of(&mut be, now, &mut plans));
        assert_eq!(plans.len(), 1, "{plans:?}");
        let (at, h) = plans[0];
        assert!(at + Duration::from_nanos(h.exec_in_ns) >= t0 + Duration::from_millis(30), "{plans:?}");
        assert_eq!(n.node.plane().overlapping_plans(), 0);
        // A report about a GPU the backend does not have is refused.
        let mut bad = n.connect(t0);
        bad.join(&Join::new(Role::Backend, 8, 1, ""));
        let busy = [wire::GpuBusy { busy_ns: 1, gpu_id: 1, batches: 1 }];
        bad.send_encoded(|buf| wire::encode_models_busy(buf, &[0], &busy)).unwrap();
        n.settle(t0);
        let refused = n.events().into_iter().any(|e| matches!(&e, SchedulerEvent::PeerRefused { why } if why.contains("GPU 1")));
        assert!(refused);
    }
}
