//! A registered peer's link as the node keeps it: the connection, its
//! liveness, the backlog its full send queue left, and what the node knows
//! about input its wait fd may not report; the per-link steps of a pass
//! (draining one link, visiting every link in order).

use std::collections::{BTreeMap, VecDeque};

use dataplane::control::Liveness;
use dataplane::time::{Duration, Instant};
use dataplane::transport::{Connection, Error};
use dataplane::wire::{self, Message};

use super::super::metrics::SchedulerMetrics;
use super::super::plane::PeerId;

/// Every registered link with its peer: frontends, then backends, each
/// in id order.
pub(super) fn every_link<'a, C>(
    frontends: &'a mut BTreeMap<u32, Link<C>>,
    backends: &'a mut BTreeMap<u32, Link<C>>,
) -> impl Iterator<Item = (PeerId, &'a mut Link<C>)> {
    let frontends = frontends.iter_mut().map(|(&id, l)| (PeerId::Frontend(id), l));
    frontends.chain(backends.iter_mut().map(|(&id, l)| (PeerId::Backend(id), l)))
}

/// Messages taken from one peer per poll (bounds a poll's work).
pub(super) const MSGS_PER_PEER: usize = 256;

/// While a peer's send queue is full, its backlog is retried this often.
const BACKLOG_RETRY: Duration = Duration::from_millis(1);

/// Messages a peer's full send queue did not take yet, in order.
#[derive(Default)]
pub(super) struct Backlog {
    bytes: Vec<u8>,
    lens: VecDeque<usize>,
    /// Offset of the first unsent message in `bytes`.
    head: usize,
    /// When the queue was first found full (None: empty backlog).
    since: Option<Instant>,
    pub(super) retry_at: Option<Instant>,
}

impl Backlog {
    pub(super) fn is_empty(&self) -> bool {
        self.lens.is_empty()
    }

    fn push(&mut self, now: Instant, msg: &[u8]) {
        self.bytes.extend_from_slice(msg);
        self.lens.push_back(msg.len());
        self.since.get_or_insert(now);
        self.retry_at.get_or_insert(now + BACKLOG_RETRY);
    }

    /// Sends what the queue takes; `Timeout` once it stayed full for
    /// longer than `bound`.
    pub(super) fn drive<C: Connection>(&mut self, conn: &mut C, now: Instant, bound: Duration) -> Result<(), Error> {
        while let Some(&n) = self.lens.front() {
            match conn.send(&self.bytes[self.head..self.head + n]) {
                Ok(()) => {
                    self.lens.pop_front();
                    self.head += n;
                }
                Err(Error::QueueFull) => break,
                Err(e) => return Err(e),
            }
        }
        if self.lens.is_empty() {
            self.bytes.clear();
            self.head = 0;
            self.since = None;
            self.retry_at = None;
            return Ok(());
        }
        let since = self.since.unwrap_or(now);
        if now.saturating_since(since) > bound {
            return Err(Error::Timeout);
        }
        self.retry_at = Some((now + BACKLOG_RETRY).min(since + bound + Duration::from_nanos(1)));
        Ok(())
    }
}

/// A registered peer's link.
pub(super) struct Link<C> {
    pub(super) key: u64,
    pub(super) conn: C,
    pub(super) live: Liveness,
    pub(super) backlog: Backlog,
    /// Messages were queued on it in the current flush.
    pub(super) queued: bool,
    /// Its last drain stopped before `try_recv` said empty (or it was
    /// never drained): it may hold messages that its wait fd does not
    /// report (see [`SchedulerNode::set_readable`](super::SchedulerNode::set_readable)).
    pub(super) unread: bool,
    /// Drained or sent to since it was last armed ([`Link::arm`]), or never
    /// armed: it may hold input that its wait fd does not report (shm: the
    /// peer writes to the ring without waking us until the link is armed;
    /// any transport: a send or a drain may take bytes into user space).
    /// An armed link untouched since makes its fd readable for anything
    /// new, so a pass with readiness skips it unless the host saw it
    /// readable. Why: checking all ~320 links' rings and state every pass
    /// and re-arming all of them before every sleep was ~15% of the
    /// daemon's CPU at 1 M tasks/s over shm (perf, 2026-11-29).
    pub(super) active: bool,
}

impl<C: Connection> Link<C> {
    pub(super) fn new(key: u64, conn: C, live: Liveness) -> Self {
        Link { key, conn, live, backlog: Backlog::default(), queued: false, unread: true, active: true }
    }

    /// Marks the link touched (see [`Link::active`]), listing `peer` in
    /// `list` the first time.
    pub(super) fn activate(&mut self, peer: PeerId, list: &mut Vec<PeerId>) {
        if !self.active {
            self.active = true;
            list.push(peer);
        }
    }

    /// Before the host sleeps: arms the link if it was touched since it
    /// was last armed ([`Connection::arm_wait`]). False if it holds input
    /// (poll instead of sleeping). A link without a wait fd (polled on a
    /// timer) or a disconnected one (its fd is no longer watched: drained
    /// every pass until buried) stays active.
    pub(super) fn arm(&mut self) -> bool {
        if !self.active || self.conn.wait_fd().is_none() || !self.conn.is_connected() {
            return true;
        }
        if self.conn.may_hold_input() || !self.conn.arm_wait() {
            return false;
        }
        self.active = false;
        true
    }

    /// Queues `msg` behind any backlog; a full queue starts (or extends)
    /// the backlog. The bytes leave at the link's next `progress` (the
    /// node's flush ends with one per link it sent to).
    pub(super) fn send(&mut self, now: Instant, msg: &[u8]) -> Result<(), Error> {
        if self.backlog.is_empty() {
            match self.conn.send_batched(msg) {
                Err(Error::QueueFull) => {}
                other => return other,
            }
            // Progress may free room at once (bytes leave during polls).
            self.conn.progress()?;
            match self.conn.send_batched(msg) {
                Err(Error::QueueFull) => {}
                other => return other,
            }
        }
        self.backlog.push(now, msg);
        Ok(())
    }
}

/// Whether draining `link` may find something, given the keys the host saw
/// readable (None: no readiness known).
pub(super) fn may_hold_messages<C: Connection>(link: &Link<C>, readable: Option<&[u64]>) -> bool {
    let Some(readable) = readable else { return true };
    link.unread
        || readable.binary_search(&link.key).is_ok()
        // Else only a link touched since it was armed may hold input.
        || link.active
            && (link.conn.wait_fd().is_none()
            // A send or progress since (plans, heartbeats) may have taken
            // its bytes off the socket: the fd is quiet, the messages are ours.
            || link.conn.may_hold_input()
            // The host stops watching a disconnected link's fd: its error
            // must still be read here.
            || !link.conn.is_connected())
}

/// Takes up to [`MSGS_PER_PEER`] messages from one peer: heartbeats are
/// proof of life, `handle` takes the rest (false: not a message this peer
/// may send, counted); garbage or a failed link marks the peer dead.
/// Returns whether anything arrived.
pub(super) fn drain_link<C: Connection>(
    link: &mut Link<C>,
    buf: &mut [u8],
    now: Instant,
    peer: PeerId,
    dead: &mut Vec<PeerId>,
    metrics: &SchedulerMetrics,
    mut handle: impl FnMut(Message<'_>, &[u8]) -> bool,
) -> bool {
    let mut any = false;
    link.unread = true;
    for _ in 0..MSGS_PER_PEER {
        let n = match link.conn.try_recv(buf) {
            Ok(Some(n)) => n,
            Ok(None) => {
                link.unread = false;
                break;
            }
            Err(_) => {
                dead.push(peer);
                break;
            }
        };
        any = true;
        link.live.heard(now);
        let bytes = &buf[..n];
        match wire::decode(bytes) {
            Ok(Message::Heartbeat(_)) => {}
            Ok(m) => {
                if !handle(m, bytes) {
                    metrics.protocol_errors.inc();
                }
            }
            Err(_) => {
                metrics.protocol_errors.inc();
                dead.push(peer);
                break;
            }
        }
    }
    any
}
