//! The frontend's sans-IO node: everything the frontend does on its links,
//! as a state machine its host drives (in the style of quinn-proto's
//! `Connection` and smoltcp's `Interface::poll(now, device)`).
//!
//! The node never reads a clock, sleeps, spawns a thread, accepts or
//! connects, and never blocks. Its host hands it links that are already
//! connected (values implementing [`Connection`]: real shm/tcp/rdma
//! connections in the daemon, in-memory ones in the deterministic
//! harness), calls [`FrontendNode::poll`] with the current time, sleeps
//! until [`FrontendNode::poll_at`] (or until a link or the task queue has
//! work), and acts on [`FrontendNode::poll_event`]. One poll does bounded
//! work: it sends queued tasks to the scheduler, routes `Dropped` and
//! `Completion` messages from the scheduler and the backends into the
//! [`Staging`] area, lets tcp links serve the backends' READs, sends
//! heartbeats and watches the scheduler's liveness.
//!
//! Requests enter through a [`NetSink`] (the [`TaskSink`] behind
//! `ClusterService`): a bounded lock-free queue that HTTP workers (or a
//! harness, on the node's own thread) push tasks into and the node drains.
//! If the scheduler goes away, the node reports
//! [`FrontendEvent::SchedulerLost`] and the host decides what happens next.
//! Without failover every request in flight ends once, as dropped for
//! [`DropReason::Shutdown`]; with it ([`FrontendNode::with_failover`], the
//! daemon's mode) they are held ([`held`]) and resent to the next
//! scheduler link that registers.
//!
//! With several scheduler groups ([`FrontendNode::with_groups`], issue 19)
//! the node holds one scheduler link per group, sends each task to its
//! model's owner by the newest routing table handed to it, and resubmits a
//! task a group answers `moved` to the owner with the budget it has left
//! (through the same held table).
//!
//! Tasks leave in batches (issue 14, item 2): a link stages the tasks it
//! takes and sends up to [`FrontendNodeConfig::coalesce`] of them as one
//! `Tasks` message (one message for the scheduler to decode, one record
//! per task), a lone task as a plain `Task`. A pass sends what it staged
//! before it returns unless a hold window is configured
//! ([`FrontendNodeConfig::coalesce_wait`]).
//!
//! The node is composed of parts, each its own module: `link`, one
//! scheduler link's state machine per group (handshake, tasks out,
//! answers in, heartbeats, liveness); `router`, the routing table and the
//! resubmission of held tasks over the groups' links; [`held`], the tasks
//! held across a scheduler's loss or a model's move (one table for every
//! group: a task may move between groups); `data`, the backends'
//! data links; `sink`, the task queue from the request handlers; `config`,
//! the configuration, the events and the bounds the parts share (a leaf).
//! The node itself only routes between them: it owns what spans groups
//! (the sink's state, the held table, the links it let go of, the events).

mod config;
mod data;
pub mod held;
mod link;
mod router;
mod sink;

pub use config::{FrontendEvent, FrontendNodeConfig, DEFAULT_COALESCE, MOVED_RETRY};
pub use sink::{FrontendStats, NetSink, TaskSource};

use held::HeldTasks;
use crate::staging::{RoutedOutcome, Staging};
use config::{BURST, HOLD_SWEEP};
use data::{DataCtx, DataLinks};
use dataplane::join::{JoinToken, NonceSource, PeerProof};
use dataplane::time::Instant;
use dataplane::transport::Connection;
use dataplane::wire::{self, DropReason, Task};
use link::{LinkCtx, LinkStep, SchedLink};
use router::Router;
use sink::{SINK_CLOSED, SINK_DRAINING, SINK_OPEN};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The frontend's links and their protocol, driven by a host (see the
/// module docs).
pub struct FrontendNode<C: Connection> {
    cfg: FrontendNodeConfig,
    staging: Arc<Staging>,
    tasks: TaskSource,
    /// One link per scheduler group (group 0 alone without groups).
    links: Vec<SchedLink<C>>,
    /// With groups ([`with_groups`](Self::with_groups)): the table.
    routing: Option<Router>,
    /// Data links: handshaking, and the registered backends.
    data: DataLinks<C>,
    /// Links let go of since the last poll, for the host to take.
    closed: Vec<C>,
    events: VecDeque<FrontendEvent>,
    /// Latest `now` seen: time never goes back inside the node.
    now: Instant,
    shut_down: bool,
    buf: Box<[u8]>,
    /// Builds the `Tasks` messages (its buffer allocated once).
    batcher: wire::TaskBatcher,
    /// The cluster's join token (its MAC answers the scheduler's
    /// challenge, and the scheduler's Welcome must prove it back).
    proof: PeerProof,
    /// With failover on, the tasks sent, held for the next scheduler.
    held: Option<HeldTasks>,
    /// When held requests past their deadline are next answered (while no
    /// scheduler is registered, or with groups while any task waits).
    sweep_at: Option<Instant>,
}

impl<C: Connection> std::fmt::Debug for FrontendNode<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (pending, backends) = self.data.len();
        f.debug_struct("FrontendNode")
            .field("id", &self.cfg.id)
            .field("phases", &self.links.iter().map(|l| l.phase).collect::<Vec<_>>())
            .field("pending", &pending)
            .field("backends", &backends)
            .finish()
    }
}

impl<C: Connection> FrontendNode<C> {
    /// A node over `staging` taking tasks from `tasks`, with no link yet.
    pub fn new(mut cfg: FrontendNodeConfig, staging: Arc<Staging>, tasks: TaskSource) -> Self {
        cfg.coalesce = cfg.coalesce.clamp(1, wire::MAX_TASKS_PER_MESSAGE);
        FrontendNode {
            batcher: wire::TaskBatcher::new(cfg.coalesce),
            links: vec![SchedLink::new(0, false, cfg.coalesce)],
            cfg,
            staging,
            tasks,
            routing: None,
            data: DataLinks::new(),
            closed: Vec::new(),
            events: VecDeque::new(),
            now: Instant::ZERO,
            shut_down: false,
            buf: vec![0u8; wire::MAX_MESSAGE_LEN].into_boxed_slice(),
            proof: PeerProof::new(None),
            held: None,
            sweep_at: None,
        }
    }

    /// With `on`, the node outlives its scheduler: losing it ends no
    /// request; the sink keeps taking tasks (a full queue still refuses,
    /// 503), requests that cannot be held within their deadline are
    /// answered as overloaded, and once a new scheduler link registers
    /// ([`handle_scheduler_link`](Self::handle_scheduler_link)) every
    /// request still awaited is resent with the budget it has left.
    pub fn with_failover(mut self, on: bool) -> Self {
        self.held = (on || self.routing.is_some()).then(|| HeldTasks::new(self.staging.capacity()));
        self
    }

    /// A node of a cluster with `groups` scheduler groups (issue 19): one
    /// scheduler link per group ([`handle_group_link`](Self::handle_group_link)),
    /// each task sent to its model's owner by the newest table handed over
    /// ([`handle_routes`](Self::handle_routes)); a task a group answers
    /// `moved` is resubmitted to the owner with the budget left (see
    /// [`held`]). Implies failover (per group). Until the first
    /// table, tasks wait (bounded by their deadlines).
    pub fn with_groups(mut self, groups: usize) -> Self {
        let groups = groups.clamp(1, usize::from(u16::MAX));
        self.links = (0..groups).map(|g| SchedLink::new(g as u16, true, self.cfg.coalesce)).collect();
        self.routing = Some(Router::new(self.cfg.models as usize));
        self.held = Some(HeldTasks::new(self.staging.capacity()));
        self
    }

    /// With groups: one more group (a table named a group the node has no
    /// link for), with no link yet ([`handle_group_link`](Self::handle_group_link));
    /// returns its index. `None` without groups, or at the limit.
    pub fn add_group(&mut self) -> Option<usize> {
        if self.routing.is_none() || self.links.len() >= usize::from(u16::MAX) {
            return None;
        }
        self.links.push(SchedLink::new(self.links.len() as u16, true, self.cfg.coalesce));
        Some(self.links.len() - 1)
    }

    /// Whether the node outlives its scheduler ([`with_failover`](Self::with_failover)).
    pub fn failover(&self) -> bool {
        self.held.is_some()
    }

    /// This node proving `token` when it registers (none: it registers
    /// without, which a scheduler that requires one refuses).
    pub fn with_join_token(mut self, token: Option<JoinToken>) -> Self {
        // Backends' data links prove the same token (data.rs), and their
        // completions the scheduler's capabilities (staging.rs).
        self.data.set_join_token(token.as_ref());
        if let Some(t) = &token {
            self.staging.require_capabilities(dataplane::capability::CapabilityKey::from_token(t));
        }
        self.proof.set_token(token);
        self
    }

    /// The nonces this frontend's Joins carry come from `nonces` (the OS
    /// generator unless set; a harness seeds them so that runs replay).
    pub fn with_join_nonces(mut self, nonces: NonceSource) -> Self {
        self.proof.set_nonces(nonces);
        self
    }

    /// Scheduler links let go because their Welcome did not prove the
    /// join token (nothing of them was taken).
    pub fn forged_welcomes(&self) -> u64 {
        self.proof.forged_welcomes()
    }

    /// The nonces of the data links' challenges come from `nonces` (the
    /// OS generator unless set): a deterministic harness seeds them.
    pub fn with_data_link_nonces(mut self, nonces: NonceSource) -> Self {
        self.data.set_nonces(nonces);
        self
    }

    /// The node's counters.
    pub fn stats(&self) -> &Arc<FrontendStats> {
        &self.tasks.queue.stats
    }
    /// The staging area outcomes are routed into.
    pub fn staging(&self) -> &Arc<Staging> {
        &self.staging
    }
    /// Whether a scheduler acknowledged the registration (and has not
    /// been lost since); with groups, any group's.
    pub fn is_registered(&self) -> bool {
        self.links.iter().any(SchedLink::registered)
    }
    /// Whether group `group`'s scheduler link is registered.
    pub fn group_registered(&self, group: usize) -> bool {
        self.links.get(group).is_some_and(SchedLink::registered)
    }
    /// Scheduler groups (1 without groups).
    pub fn groups(&self) -> usize {
        self.links.len()
    }
    /// Whether a group answered `moved` for a task the node's current
    /// table sent it since the last call: the host may read the table
    /// again now rather than at its next period.
    pub fn take_stale_table(&mut self) -> bool {
        self.routing.as_mut().is_some_and(|r| std::mem::take(&mut r.stale))
    }
    /// The routing revision the node follows (0: none, or no groups).
    pub fn route_revision(&self) -> u64 {
        self.routing.as_ref().map_or(0, |r| r.revision)
    }
    /// Whether tasks are waiting in the queue (for the host's idle
    /// re-check: a producer may have pushed one after the last poll).
    pub fn has_queued_tasks(&self) -> bool {
        !self.tasks.queue.tasks.is_empty() || !self.tasks.queue.cancels.is_empty()
    }

    fn observe(&mut self, now: Instant) -> Instant {
        self.now = self.now.max(now);
        self.now
    }

    /// The scheduler link, already connected by the host (group 0's with
    /// groups). The node waits
    /// for the scheduler's `Challenge`, answers `Join{Frontend, id, data
    /// endpoint, MAC}` and waits for the `Welcome` in [`poll`](Self::poll),
    /// all within the handshake timeout from `now`. A link given while another is registered
    /// replaces it: the old one counts as lost first.
    pub fn handle_scheduler_link(&mut self, now: Instant, conn: C) {
        self.handle_group_link(now, 0, conn);
    }

    /// [`handle_scheduler_link`](Self::handle_scheduler_link) for group
    /// `group`'s scheduler (a group the node does not have: the link is let
    /// go).
    pub fn handle_group_link(&mut self, now: Instant, group: usize, conn: C) {
        let now = self.observe(now);
        if self.shut_down || group >= self.links.len() {
            self.closed.push(conn);
            return;
        }
        if self.links[group].registered() {
            self.lose_scheduler(group, "replaced by a new scheduler link".into());
        }
        if let Some(old) = self.links[group].handle_conn(now, conn, &self.cfg) {
            self.closed.push(old);
        }
    }

    /// With groups: the routing table at `revision`, as the owner group
    /// of each model id (`owners[m]`; a missing or out-of-range entry: no
    /// owner). Ignored unless newer than the one the node has (returns
    /// whether it was taken). Tasks waiting for an owner, and those
    /// answered `moved`, are offered again at once.
    pub fn handle_routes(&mut self, revision: u64, owners: &[Option<u16>]) -> bool {
        let groups = self.links.len();
        let Some(r) = self.routing.as_mut() else { return false };
        if !r.handle_routes(revision, owners, groups) {
            return false;
        }
        self.tasks.queue.stats.route_revision.store(revision, Ordering::Relaxed);
        true
    }

    /// A backend's data link, accepted by the host. Its first message must
    /// be a `Register{Backend}`, within the handshake timeout from `now`.
    pub fn handle_backend_link(&mut self, now: Instant, conn: C) {
        let now = self.observe(now);
        if self.shut_down {
            self.closed.push(conn);
            return;
        }
        let deadline = now.saturating_add(self.cfg.handshake_timeout);
        if let Some(evicted) = self.data.handle_link(conn, deadline, &self.tasks.queue.stats) {
            self.closed.push(evicted);
            let why = format!("evicted a data connection still handshaking: {} others were", data::MAX_HANDSHAKING);
            self.events.push_back(FrontendEvent::LinkRefused { why });
        }
    }

    /// Does the work that is due at `now` (which need not advance between
    /// calls; an earlier `now` than already seen counts as that one):
    /// registration, tasks out, outcomes routed, READs served (by polling
    /// the links), heartbeats, liveness, backends' handshakes. Returns
    /// whether anything happened (poll again at once if so). Links let go
    /// of before this call and not taken by the host are dropped here.
    pub fn poll(&mut self, now: Instant) -> bool {
        let now = self.observe(now);
        self.closed.clear();
        let mut work = false;
        if let (Some(r), Some(held)) = (self.routing.as_mut(), self.held.as_mut()) {
            work |= r.dispatch(now, &mut self.links, held, &self.tasks.queue, &self.staging, &mut self.sweep_at);
        } else if self.held.is_some() && !self.is_registered() {
            work |= self.hold_unlinked(now);
        }
        let waits = self.held.is_some() || self.routing.is_some();
        for g in 0..self.links.len() {
            work |= match self.links[g].unlinked() {
                true if waits => false,
                true => self.end_queued(),
                false => self.poll_link(g, now),
            };
        }
        if let (Some(_), Some(held)) = (self.routing.as_ref(), self.held.as_ref()) {
            work |= router::send_cancels(&mut self.links, held, &self.tasks.queue, &mut self.buf);
        }
        let mut ctx = DataCtx {
            buf: &mut self.buf,
            staging: &self.staging,
            stats: &self.tasks.queue.stats,
            closed: &mut self.closed,
            events: &mut self.events,
        };
        work |= self.data.poll_backends(&mut ctx);
        work |= self.data.poll_pending(now, &mut ctx);
        work
    }

    /// When the node next has timed work (a heartbeat, a liveness or
    /// handshake deadline); `None` if none. Work that arrives on a link or
    /// in the task queue is not announced here: hosts also poll when those
    /// have something (the daemon sleeps on the links' wait fds and the
    /// queue's notifier).
    pub fn poll_at(&self) -> Option<Instant> {
        let mut at: Option<Instant> = None;
        let mut consider = |t: Instant| at = Some(at.map_or(t, |a| a.min(t)));
        if !self.is_registered() || self.routing.is_some() {
            if let Some(t) = self.sweep_at {
                consider(t);
            }
        }
        for link in &self.links {
            link.poll_at(&self.cfg, &mut consider);
        }
        self.data.poll_at(&mut consider);
        at
    }

    /// The next event for the host, oldest first.
    pub fn poll_event(&mut self) -> Option<FrontendEvent> {
        self.events.pop_front()
    }

    /// A link the node let go of (refused, lost, replaced), for the host to
    /// take out of its wait set before dropping it. Links not taken before
    /// the next [`poll`](Self::poll) are dropped there.
    pub fn take_closed_link(&mut self) -> Option<C> {
        self.closed.pop()
    }

    /// Calls `f` on every live link (schedulers, backends, data links still
    /// handshaking), e.g. to fill a wait set.
    pub fn for_each_conn(&self, mut f: impl FnMut(&C)) {
        for c in self.links.iter().filter_map(|l| l.conn.as_ref()) {
            f(c);
        }
        self.data.for_each_conn(f);
    }

    /// Stops taking new requests (the sink refuses them, the service is no
    /// longer ready) while those queued still go out and outcomes are
    /// still routed: see [`drained`](Self::drained).
    pub fn begin_drain(&mut self) {
        self.tasks
            .queue
            .state
            .store(SINK_DRAINING, Ordering::Release);
        self.stats().ready.store(false, Ordering::Release);
    }

    /// Whether no task is waiting to go out and no request is in flight.
    pub fn drained(&self) -> bool {
        self.links.iter().all(|l| l.outbox.unsent.is_empty() && l.outbox.out.is_empty())
            && self.routing.as_ref().is_none_or(|r| r.unsent.is_none())
            && !self.has_queued_tasks()
            && self.staging.in_flight() == 0
    }

    /// Ends the node's service: the sink closes, and every queued task and
    /// request in flight ends now (dropped, shutdown), each once. Links
    /// stay open for the host ([`into_links`](Self::into_links)), which
    /// may still need to poll them while it deregisters memory.
    pub fn shutdown(&mut self) {
        self.shut_down = true;
        self.tasks.queue.state.store(SINK_CLOSED, Ordering::Release);
        self.stats().ready.store(false, Ordering::Release);
        self.end_queued();
        self.staging
            .end_in_flight(RoutedOutcome::Dropped(DropReason::Shutdown));
    }

    /// Every link the node holds (for the host's last rites).
    pub fn into_links(mut self) -> Vec<C> {
        let mut links: Vec<C> = self.closed.drain(..).collect();
        links.extend(self.links.iter_mut().filter_map(|l| l.conn.take()));
        links.extend(self.data.drain());
        links
    }

    /// Ends the unsent and queued tasks (nothing will send them); whether
    /// there were any.
    fn end_queued(&mut self) -> bool {
        let mut any = false;
        for link in &mut self.links {
            if link.outbox.unsent_cancel.take().is_some() {
                self.tasks.queue.stats.cancels_unsent.fetch_add(1, Ordering::Relaxed);
            }
        }
        while self.tasks.queue.cancels.pop().is_some() {
            self.stats().cancels_unsent.fetch_add(1, Ordering::Relaxed);
        }
        let routed_unsent = self.routing.as_mut().and_then(|r| r.unsent.take());
        let mut queued: Vec<Task> = Vec::new();
        for link in &mut self.links {
            queued.append(&mut link.outbox.unsent);
            queued.extend(link.outbox.out.drain(..));
        }
        queued.extend(routed_unsent);
        for t in queued.into_iter().chain(std::iter::from_fn(|| self.tasks.queue.tasks.pop())) {
            any = true;
            self.staging
                .route(t.task_id, RoutedOutcome::Dropped(DropReason::Shutdown));
        }
        any
    }

    /// With failover, while no scheduler is registered: stamps the queued
    /// tasks' budgets now (they wait in the held table) and, when due,
    /// answers the held requests past their deadline.
    fn hold_unlinked(&mut self, now: Instant) -> bool {
        let Some(held) = self.held.as_mut() else { return false };
        let mut work = false;
        for t in self.links[0].outbox.unsent.drain(..) {
            held.hold(&t, now);
            work = true;
        }
        for _ in 0..BURST {
            let Some(t) = self.tasks.queue.tasks.pop() else { break };
            held.hold(&t, now);
            work = true;
        }
        match self.sweep_at {
            Some(t) if t > now => {}
            _ => {
                work |= held.sweep(now, &self.staging).0 > 0;
                self.sweep_at = Some(now.saturating_add(HOLD_SWEEP));
            }
        }
        work
    }


    /// Polls group `g`'s link and acts on what it reports.
    fn poll_link(&mut self, g: usize, now: Instant) -> bool {
        let Self { cfg, staging, tasks, links, routing, buf, batcher, proof, held, sweep_at, .. } = self;
        let mut ctx = LinkCtx {
            cfg,
            proof,
            staging,
            queue: &tasks.queue,
            held: held.as_mut(),
            routed: routing.as_ref().map(|r| r.revision),
            buf,
            batcher,
            taken_back: false,
            stale: false,
        };
        let step = links[g].poll(now, &mut ctx);
        let (taken_back, stale) = (ctx.taken_back, ctx.stale);
        if let (true, Some(r)) = (taken_back, routing.as_mut()) {
            r.repass = true;
            r.stale |= stale;
            sweep_at.get_or_insert(now.saturating_add(MOVED_RETRY));
        }
        match step {
            LinkStep::Idle => false,
            LinkStep::Work => true,
            LinkStep::Registered(models) => self.registered(g, models),
            LinkStep::Refused(why) => self.refuse(g, why),
            LinkStep::Lost(why) => {
                self.lose_scheduler(g, why);
                true
            }
        }
    }

    /// Group `g`'s registration failed: let the link go.
    fn refuse(&mut self, g: usize, why: String) -> bool {
        if let Some(c) = self.links[g].let_go() {
            self.closed.push(c);
        }
        self.events.push_back(FrontendEvent::Refused { group: g as u16, why });
        true
    }

    /// Group `g`'s registered scheduler is gone: without failover nothing
    /// will answer what is queued or in flight, so all of it ends now,
    /// once; with it, its tasks are held for the next link.
    fn lose_scheduler(&mut self, g: usize, why: String) {
        let now = self.now;
        if let Some(c) = self.links[g].let_go() {
            self.closed.push(c);
        }
        let group = g as u16;
        if let Some(held) = self.held.as_mut() {
            // Failover: everything stays in flight for the next scheduler.
            held.link_lost(group);
            let outbox = &mut self.links[g].outbox;
            for t in outbox.unsent.drain(..).chain(outbox.out.drain(..)) {
                held.hold(&t, now);
            }
            let ready = self.links.iter().any(SchedLink::registered);
            self.tasks.queue.stats.ready.store(ready, Ordering::Release);
            self.sweep_at = Some(now.saturating_add(HOLD_SWEEP));
            self.events.push_back(FrontendEvent::SchedulerLost { group, why });
            return;
        }
        // Close before draining: a task pushed after the drain is ended by
        // a later poll (the link is unlinked).
        self.tasks.queue.state.store(SINK_CLOSED, Ordering::Release);
        self.stats().ready.store(false, Ordering::Release);
        self.end_queued();
        self.staging
            .end_in_flight(RoutedOutcome::Dropped(DropReason::Shutdown));
        self.events.push_back(FrontendEvent::SchedulerLost { group, why });
    }

    /// Group `g`'s link registered with a scheduler of `models` models:
    /// the sink opens (unless a drain began), and the tasks waiting for a
    /// scheduler go out from the next poll.
    fn registered(&mut self, g: usize, models: u32) -> bool {
        // A drain begun before the ack keeps the sink closed (with
        // failover it stayed open while the scheduler was away).
        if self
            .tasks
            .queue
            .state
            .compare_exchange(SINK_CLOSED, SINK_OPEN, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
            || self.tasks.queue.state.load(Ordering::Acquire) == SINK_OPEN
        {
            self.stats().ready.store(true, Ordering::Release);
        }
        match (self.routing.as_mut(), self.held.as_mut()) {
            // The tasks waiting for this group go out from the next poll.
            (Some(r), _) => r.repass = true,
            (None, Some(held)) => {
                held.begin_resubmit();
                self.sweep_at = None;
            }
            (None, None) => {}
        }
        self.events.push_back(FrontendEvent::Registered { group: g as u16, models });
        true
    }
}

#[cfg(test)]
mod auth_tests;

#[cfg(test)]
mod tests;
