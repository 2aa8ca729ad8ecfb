//! One scheduler group's link, as a state machine: the handshake
//! (challenge, `Join`, `Welcome` within the handshake timeout), then, once
//! registered, tasks out in coalesced messages, cancellations, the
//! scheduler's answers in, heartbeats and the scheduler's liveness.
//!
//! The link touches only its own connection, the staging area its answers
//! are routed into, and the held table (the tasks it sends are kept there
//! with failover or groups, and a `moved` answer is taken back there). What
//! it cannot decide alone (a registration, a refusal, a loss) it returns as
//! a [`LinkStep`] for the node, which owns the sink's state and the other
//! groups. The heartbeat schedule and the silence timeout are the link's
//! [`Liveness`] (the same mechanism the backend and scheduler links use).

use super::config::{human, FrontendNodeConfig, BURST, MOVED_RETRY};
use super::sink::{TaskQueue, SINK_OPEN};
use super::held::{HeldTasks, MovedAnswer};
use crate::staging::{RoutedOutcome, Staging};
use dataplane::control::Liveness;
use dataplane::join::{HandshakeNonces as Nonces, PeerProof};
use dataplane::time::Instant;
use dataplane::transport::{Connection, Error as TransportError};
use dataplane::wire::{self, DropReason, Join, Message, Role, Task, TaskStatus, WireError};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;

/// Where the scheduler link stands.
#[derive(Clone, Copy, Debug)]
pub(super) enum Phase {
    /// No scheduler link (none yet, refused or lost).
    Unlinked,
    /// The link is handed over: the scheduler's challenge is awaited
    /// (`nonces`: its nonce and ours, drawn when it came), then our `Join`
    /// is `sent` or still to send; the `Welcome` is due by `deadline`.
    Registering {
        nonces: Option<Nonces>,
        sent: bool,
        deadline: Instant,
    },
    /// Acknowledged; tasks flow. `live` says when to send a heartbeat and
    /// when the scheduler's silence makes it lost.
    Registered { live: Liveness },
}

/// What a link's poll needs from the node: the configuration, where
/// outcomes go, the queue tasks come from, the held table, and the node's
/// scratch buffers (allocated once). `taken_back`/`stale` are outputs.
pub(super) struct LinkCtx<'a> {
    pub cfg: &'a FrontendNodeConfig,
    /// The join token we prove, our nonces, the forged Welcomes' count.
    pub proof: &'a mut PeerProof,
    pub staging: &'a Staging,
    pub queue: &'a TaskQueue,
    pub held: Option<&'a mut HeldTasks>,
    /// With groups: the routing revision the node follows (tasks then come
    /// routed, in the link's `out`, and `moved` answers are taken back).
    pub routed: Option<u64>,
    pub buf: &'a mut [u8],
    pub batcher: &'a mut wire::TaskBatcher,
    /// Set when a `moved` answer was taken back into the held table.
    pub taken_back: bool,
    /// Set when such an answer was to a task sent by the current table
    /// (the table may be old).
    pub stale: bool,
}

/// What a link's poll means for the node.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum LinkStep {
    /// Nothing happened.
    Idle,
    /// Something happened (poll again).
    Work,
    /// The scheduler acknowledged the registration with this many models.
    Registered(u32),
    /// The registration failed (or the Welcome did not prove the join
    /// token): the node lets the link go.
    Refused(String),
    /// The registered link died, misbehaved or went silent.
    Lost(String),
}

impl LinkStep {
    fn from_work(work: bool) -> Self {
        if work {
            LinkStep::Work
        } else {
            LinkStep::Idle
        }
    }
}

/// The tasks and the cancellation a link has taken and not sent yet.
pub(super) struct Outbox {
    /// Tasks taken for this link and not sent yet, oldest first: the
    /// next message (at most the coalesce limit; allocated once). A send
    /// queue that had no room for their message keeps them here for the
    /// next poll.
    pub unsent: Vec<Task>,
    /// When the oldest of `unsent` was staged.
    staged_at: Instant,
    /// `unsent` waits for the hold window (not for room in the send
    /// queue): the node's `poll_at` names the window's end.
    holding: bool,
    /// A cancellation the link had no room for.
    pub unsent_cancel: Option<u64>,
    /// With groups: tasks routed to this group, to go out on its link this
    /// poll (at most [`BURST`]; allocated once).
    pub out: VecDeque<Task>,
}

/// One scheduler group's link (one in a single-group cluster).
pub(super) struct SchedLink<C> {
    pub conn: Option<C>,
    pub phase: Phase,
    pub outbox: Outbox,
    group: u16,
}

impl<C: Connection> SchedLink<C> {
    /// Group `group`'s link, with no connection yet.
    pub fn new(group: u16, routed: bool, coalesce: usize) -> Self {
        SchedLink {
            conn: None,
            phase: Phase::Unlinked,
            outbox: Outbox {
                unsent: Vec::with_capacity(coalesce),
                staged_at: Instant::ZERO,
                holding: false,
                unsent_cancel: None,
                out: VecDeque::with_capacity(if routed { BURST } else { 0 }),
            },
            group,
        }
    }

    pub fn registered(&self) -> bool {
        matches!(self.phase, Phase::Registered { .. })
    }

    pub fn unlinked(&self) -> bool {
        matches!(self.phase, Phase::Unlinked)
    }

    /// Whether the link can take one more routed task now.
    pub fn has_room(&self) -> bool {
        self.registered() && self.outbox.out.len() < BURST
    }

    /// A connection handed over at `now`: the handshake begins, due within
    /// the handshake timeout. Returns the connection it replaces, if any.
    pub fn handle_conn(&mut self, now: Instant, conn: C, cfg: &FrontendNodeConfig) -> Option<C> {
        let old = self.conn.replace(conn);
        self.phase = Phase::Registering { nonces: None, sent: false, deadline: now.saturating_add(cfg.handshake_timeout) };
        old
    }

    /// The link is refused or lost: back to no link; its connection, for
    /// the host to take.
    pub fn let_go(&mut self) -> Option<C> {
        self.phase = Phase::Unlinked;
        self.conn.take()
    }

    /// When the link next has timed work.
    pub fn poll_at(&self, cfg: &FrontendNodeConfig, mut consider: impl FnMut(Instant)) {
        match self.phase {
            Phase::Unlinked => {}
            Phase::Registering { deadline, .. } => consider(deadline),
            Phase::Registered { live } => {
                if self.outbox.holding {
                    consider(self.outbox.staged_at.saturating_add(cfg.coalesce_wait));
                }
                consider(live.next_send());
                consider(live.expires_at());
            }
        }
    }

    /// Does what is due at `now` (the link must not be unlinked).
    pub fn poll(&mut self, now: Instant, ctx: &mut LinkCtx<'_>) -> LinkStep {
        match self.phase {
            Phase::Unlinked => LinkStep::Idle,
            Phase::Registering { nonces, sent, deadline } => self.poll_handshake(now, ctx, nonces, sent, deadline),
            Phase::Registered { .. } => self.poll_registered(now, ctx),
        }
    }

    // ---- the handshake ------------------------------------------------------

    /// Our Join answering the challenge of `nonces` (with our nonce and a
    /// MAC if we hold a token).
    fn join(ctx: &LinkCtx<'_>, nonces: &Nonces) -> Join {
        ctx.proof.sign(Join::new(Role::Frontend, u32::from(ctx.cfg.id), 0, &ctx.cfg.data_endpoint), nonces)
    }

    fn refused_text(ctx: &LinkCtx<'_>) -> LinkStep {
        LinkStep::Refused(format!(
            "the scheduler closed the connection while frontend {} registered (refused it without saying why)",
            ctx.cfg.id
        ))
    }

    fn poll_handshake(
        &mut self,
        now: Instant,
        ctx: &mut LinkCtx<'_>,
        mut nonces: Option<Nonces>,
        mut sent: bool,
        deadline: Instant,
    ) -> LinkStep {
        let Some(conn) = self.conn.as_mut() else {
            self.phase = Phase::Unlinked;
            return LinkStep::Idle;
        };
        let mut work = false;
        for _ in 0..BURST {
            if let (Some(n), false) = (nonces, sent) {
                let join = Self::join(ctx, &n);
                let len = match wire::encode(ctx.buf, &join) {
                    Ok(len) => len,
                    Err(e) => return LinkStep::Refused(format!("registering with the scheduler: {e}")),
                };
                match conn.send(&ctx.buf[..len]) {
                    Ok(()) => {
                        sent = true;
                        work = true;
                    }
                    Err(TransportError::QueueFull) => {}
                    // A refusing scheduler closes the link, which this side
                    // may see while still sending its Join.
                    Err(TransportError::PeerDisconnected) => return Self::refused_text(ctx),
                    Err(e) => return LinkStep::Refused(format!("registering with the scheduler: {e}")),
                }
            }
            // Pushes our Join out; a departure shows in the receive.
            let _ = conn.progress();
            let n = match conn.try_recv(ctx.buf) {
                Ok(Some(n)) => n,
                Ok(None) => break,
                Err(TransportError::PeerDisconnected) => return Self::refused_text(ctx),
                Err(e) => return LinkStep::Refused(format!("waiting for the scheduler's acknowledgement: {e}")),
            };
            work = true;
            match wire::decode(&ctx.buf[..n]) {
                Ok(Message::Challenge(c)) if nonces.is_none() => match ctx.proof.nonces(c.nonce) {
                    Some(n) => nonces = Some(n),
                    None => return LinkStep::Refused("registering with the scheduler: no OS randomness for a nonce".into()),
                },
                Ok(Message::Welcome(w)) if sent => {
                    return match Self::forged(ctx, nonces, &w) {
                        Some(why) => LinkStep::Refused(why),
                        None => self.welcomed(now, w.models, ctx.cfg),
                    }
                }
                Ok(Message::Refused(r)) => {
                    return LinkStep::Refused(format!(
                        "the scheduler refused the registration of frontend {}: {r}",
                        ctx.cfg.id
                    ))
                }
                Err(WireError::BadVersion(v)) => {
                    return LinkStep::Refused(format!(
                        "the scheduler speaks wire version {v}, this frontend {}: run one version in the whole cluster",
                        wire::VERSION
                    ))
                }
                // Heartbeats may come first; anything else before the
                // Welcome is not worth failing for.
                Ok(_) => {}
                Err(e) => return LinkStep::Refused(format!("the scheduler sent a malformed message: {e}")),
            }
        }
        if now >= deadline {
            let timeout = human(ctx.cfg.handshake_timeout);
            return LinkStep::Refused(if sent {
                format!("the scheduler did not acknowledge the registration within {timeout}")
            } else {
                format!("registering with the scheduler: no challenge within {timeout}")
            });
        }
        self.phase = Phase::Registering { nonces, sent, deadline };
        LinkStep::from_work(work)
    }

    /// Why `welcome` does not prove the join token we hold (`None`: it
    /// does, or we hold none; a forged one is counted): it must be the
    /// token's answer to our Join after this challenge.
    fn forged(ctx: &mut LinkCtx<'_>, nonces: Option<Nonces>, welcome: &wire::Welcome) -> Option<String> {
        let proven = match nonces {
            Some(n) => {
                let join = Self::join(ctx, &n);
                ctx.proof.check_welcome(&n, &join, welcome)
            }
            None => ctx.proof.token().is_none(),
        };
        (!proven).then(|| {
            format!(
                "the scheduler's Welcome to frontend {} does not prove the join token (unsigned or forged): not a scheduler of this cluster; ignored",
                ctx.cfg.id
            )
        })
    }

    /// The scheduler's `Welcome` announcing `models` models, at `now`.
    fn welcomed(&mut self, now: Instant, models: u32, cfg: &FrontendNodeConfig) -> LinkStep {
        if models != cfg.models {
            return LinkStep::Refused(format!(
                "the scheduler has {models} models, this frontend {}: give every daemon the same --zoo/--models/--model",
                cfg.models
            ));
        }
        self.phase = Phase::Registered { live: Liveness::new(now, cfg.heartbeat, cfg.dead_after) };
        LinkStep::Registered(models)
    }

    // ---- registered ---------------------------------------------------------

    /// Tasks out, the scheduler's messages in, heartbeat, liveness.
    fn poll_registered(&mut self, now: Instant, ctx: &mut LinkCtx<'_>) -> LinkStep {
        let group = self.group;
        let Self { conn, phase, outbox, .. } = self;
        let (Some(conn), Phase::Registered { live }) = (conn.as_mut(), phase) else {
            return LinkStep::Idle;
        };
        let mut work = false;
        let exchanged = (|| {
            outbox.send(conn, now, group, ctx, &mut work)?;
            // The pass's tasks and cancellations leave now.
            match conn.flush_batched() {
                Ok(()) | Err(TransportError::QueueFull) => {}
                Err(e) => return Err(format!("sending tasks: {e}")),
            }
            receive(conn, live, now, ctx, &mut work)?;
            keep_alive(conn, live, now, ctx.cfg)
        })();
        match exchanged {
            Ok(()) => LinkStep::from_work(work),
            Err(why) => LinkStep::Lost(why),
        }
    }
}

impl Outbox {
    /// Tasks to the scheduler, in order, staged in `unsent` and sent
    /// `coalesce` to a message; a full send queue keeps the staged tasks
    /// for the next poll. Then the cancellations, after every task queued
    /// before them. Messages and cancellations are staged on the link
    /// (`send_batched`) and leave together in one write per pass, not one
    /// system call per task. With groups, the tasks come routed (the
    /// router fills `out`) and cancellations go through the router.
    fn send<C: Connection>(
        &mut self,
        conn: &mut C,
        now: Instant,
        group: u16,
        ctx: &mut LinkCtx<'_>,
        work: &mut bool,
    ) -> Result<(), String> {
        let coalesce = ctx.cfg.coalesce;
        // Set again below if a part batch waits for the hold window.
        self.holding = false;
        let mut blocked = false;
        for _ in 0..BURST {
            if self.unsent.len() >= coalesce {
                if !self.send_unsent(conn, now, group, ctx)? {
                    blocked = true;
                    break;
                }
                *work = true;
            }
            let next = match ctx.routed {
                Some(_) => self.out.pop_front(),
                None => ctx
                    .held
                    .as_deref_mut()
                    .and_then(|h| h.next_resubmit(now, ctx.staging, 0, |_, _| Some(0)))
                    .map(|(t, _)| t)
                    .or_else(|| ctx.queue.tasks.pop()),
            };
            let Some(task) = next else { break };
            if self.unsent.is_empty() {
                self.staged_at = now;
            }
            self.unsent.push(task);
        }
        // The last message of the pass: a part batch leaves now, unless a
        // hold window is configured and its oldest task is still within it
        // (a drain does not wait).
        if !blocked && !self.unsent.is_empty() {
            let due = self.unsent.len() >= coalesce
                || now >= self.staged_at.saturating_add(ctx.cfg.coalesce_wait)
                || ctx.queue.state.load(Ordering::Acquire) != SINK_OPEN;
            if due {
                *work |= self.send_unsent(conn, now, group, ctx)?;
            } else {
                self.holding = true;
            }
        }
        if self.unsent.is_empty() && ctx.routed.is_none() {
            self.send_cancels(conn, ctx, work)?;
        }
        Ok(())
    }

    /// Sends the staged tasks as one message: `Ok(true)` once they are
    /// dealt with (sent, or failed if they cannot be encoded), `Ok(false)`
    /// if the send queue had no room (they stay staged), `Err` if the link
    /// failed.
    fn send_unsent<C: Connection>(&mut self, conn: &mut C, now: Instant, group: u16, ctx: &mut LinkCtx<'_>) -> Result<bool, String> {
        let stats = &ctx.queue.stats;
        let (sent, n) = (send_staged(conn, &self.unsent, ctx.batcher, ctx.buf), self.unsent.len());
        match &sent {
            Sent::Tasks(n) => {
                stats.tasks_sent.fetch_add(*n, Ordering::Relaxed);
                stats.task_messages_sent.fetch_add(1, Ordering::Relaxed);
                if let Some(h) = ctx.held.as_deref_mut() {
                    let revision = ctx.routed.unwrap_or(0);
                    for task in &self.unsent {
                        h.sent(task, now, group, revision);
                    }
                }
            }
            Sent::Unencodable => {
                for task in &self.unsent {
                    ctx.staging.route(task.task_id, RoutedOutcome::Failed(TaskStatus::ExecFailed));
                }
            }
            Sent::QueueFull => return Ok(false),
            Sent::Failed(_) => {
                for task in &self.unsent {
                    match ctx.held.as_deref_mut() {
                        Some(h) => h.hold(task, now),
                        None => {
                            ctx.staging.route(task.task_id, RoutedOutcome::Dropped(DropReason::Shutdown));
                        }
                    }
                }
            }
        }
        self.unsent.clear();
        match sent {
            Sent::Failed(e) if n == 1 => Err(format!("sending a task: {e}")),
            Sent::Failed(e) => Err(format!("sending {n} tasks: {e}")),
            _ => Ok(true),
        }
    }

    /// Cancellations, after every task queued before them (a cancel that
    /// overtook its task would be ignored and the task would run).
    fn send_cancels<C: Connection>(&mut self, conn: &mut C, ctx: &mut LinkCtx<'_>, work: &mut bool) -> Result<(), String> {
        let stats = &ctx.queue.stats;
        for _ in 0..BURST {
            let Some(task_id) = self.unsent_cancel.take().or_else(|| ctx.queue.cancels.pop()) else {
                break;
            };
            let n = match wire::encode(ctx.buf, &wire::Cancel { task_id }) {
                Ok(n) => n,
                Err(_) => continue,
            };
            match conn.send_batched(&ctx.buf[..n]) {
                Ok(()) => {
                    *work = true;
                    stats.cancels_sent.fetch_add(1, Ordering::Relaxed);
                }
                Err(TransportError::QueueFull) => {
                    self.unsent_cancel = Some(task_id);
                    break;
                }
                Err(e) => {
                    stats.cancels_unsent.fetch_add(1, Ordering::Relaxed);
                    return Err(format!("sending a cancellation: {e}"));
                }
            }
        }
        Ok(())
    }
}

/// From the scheduler: drops, failures, heartbeats (each proof of life).
/// With groups, a task answered `moved` is taken back (held) for its new
/// owner.
fn receive<C: Connection>(
    conn: &mut C,
    live: &mut Liveness,
    now: Instant,
    ctx: &mut LinkCtx<'_>,
    work: &mut bool,
) -> Result<(), String> {
    for _ in 0..BURST {
        let n = match conn.try_recv(ctx.buf) {
            Ok(Some(n)) => n,
            Ok(None) => break,
            Err(TransportError::PeerDisconnected) => return Err("disconnected".into()),
            Err(e) => return Err(e.to_string()),
        };
        *work = true;
        live.heard(now);
        match wire::decode(&ctx.buf[..n]) {
            Ok(Message::Dropped(d)) if d.reason == DropReason::Moved as u32 && ctx.routed.is_some() => {
                take_back(ctx, d, now);
            }
            Ok(m @ (Message::Dropped(_) | Message::Completion(..))) => {
                if ctx.staging.route_message(&m).is_err() {
                    ctx.queue.stats.bad_messages.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(_) => {}
            Err(e) => return Err(format!("malformed message: {e}")),
        }
    }
    Ok(())
}

/// With groups: `d` answered `moved`; the held table takes the task back
/// for its owner unless the answer is to an attempt already superseded.
fn take_back(ctx: &mut LinkCtx<'_>, d: wire::Dropped, now: Instant) {
    let attempt = u16::try_from(d.reserved).unwrap_or(u16::MAX);
    let answer = ctx.held.as_deref_mut().map_or(MovedAnswer::Unknown, |h| h.moved(d.task_id, attempt, now, MOVED_RETRY));
    match answer {
        // An answer to an attempt already superseded (a copy, or late):
        // the task is elsewhere now.
        MovedAnswer::Stale => {}
        MovedAnswer::TakenBack(sent_by) => {
            ctx.queue.stats.moved_taken_back.fetch_add(1, Ordering::Relaxed);
            ctx.taken_back = true;
            ctx.stale |= sent_by >= ctx.routed.unwrap_or(0);
        }
        MovedAnswer::Unknown => {
            ctx.staging.route(d.task_id, RoutedOutcome::Dropped(DropReason::Moved));
        }
    }
}

/// Our heartbeat when due, and the scheduler's silence past the timeout.
fn keep_alive<C: Connection>(conn: &mut C, live: &mut Liveness, now: Instant, cfg: &FrontendNodeConfig) -> Result<(), String> {
    let mut hb = [0u8; 64];
    if let Some(n) = live.due(now, Role::Frontend, u32::from(cfg.id), &mut hb) {
        match conn.send(&hb[..n]) {
            // A full queue is sending anyway: that is proof of life too.
            Ok(()) | Err(TransportError::QueueFull) => {}
            Err(e) => return Err(format!("sending a heartbeat: {e}")),
        }
    }
    if live.expired(now) {
        return Err(format!("silent for more than {} ms", cfg.dead_after.as_nanos() / 1_000_000));
    }
    Ok(())
}

/// What became of a link's staged tasks ([`send_staged`]).
enum Sent {
    /// They left in one message (this many tasks).
    Tasks(u64),
    /// The send queue had no room: they stay staged, nothing was sent.
    QueueFull,
    /// They cannot be encoded (never for a well-formed task).
    Unencodable,
    /// The link failed.
    Failed(TransportError),
}

/// Sends `staged` (at least one task) as one message: a lone task as a
/// `Task`, several as a `Tasks` batch built in `batcher`'s buffer. Leaves
/// `staged` as it was: the caller clears it unless the queue was full, so
/// that each task leaves once, in one message, and in order.
fn send_staged<C: Connection>(conn: &mut C, staged: &[Task], batcher: &mut wire::TaskBatcher, buf: &mut [u8]) -> Sent {
    let msg = match staged {
        [task] => match wire::encode(buf, task) {
            Ok(n) => &buf[..n],
            Err(_) => return Sent::Unencodable,
        },
        _ => {
            for task in staged {
                if batcher.push(task).is_err() {
                    // More staged than the batcher holds: a caller bug;
                    // nothing goes out half.
                    let _ = batcher.take();
                    return Sent::Unencodable;
                }
            }
            match batcher.take() {
                Some(msg) => msg,
                None => return Sent::Unencodable,
            }
        }
    };
    match conn.send_batched(msg) {
        Ok(()) => Sent::Tasks(staged.len() as u64),
        Err(TransportError::QueueFull) => Sent::QueueFull,
        Err(e) => Sent::Failed(e),
    }
}
