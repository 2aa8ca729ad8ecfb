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
//! daemon's mode) they are held ([`crate::held`]) and resent to the next
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

use crate::held::{HeldTasks, MovedAnswer};
use crate::service::{SinkError, TaskSink};
use crate::staging::{RoutedOutcome, Staging, Ticket};
use crossbeam_queue::ArrayQueue;
use dataplane::control::Liveness;
use dataplane::join::JoinToken;
use dataplane::metrics::{Computed, MetricsRegistry};
use dataplane::time::{Duration, Instant};
use dataplane::transport::{Connection, Error as TransportError};
use dataplane::waitset::Notifier;
use dataplane::wire::{self, DropReason, Join, Message, Role, Task, TaskStatus, WireError};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

/// Most tasks sent, and messages taken from one link, per poll: bounds the
/// work of one call. A poll that reaches it reports progress, so its host
/// polls again at once.
const BURST: usize = 256;

/// How often a frontend without a scheduler answers the held requests that
/// can no longer meet their deadline (with failover on).
const HOLD_SWEEP: Duration = Duration::from_millis(10);

/// Sink states: tasks are refused until registration, taken while
/// registered, refused again once the node drains or lost its scheduler.
const SINK_CLOSED: u8 = 0;
const SINK_OPEN: u8 = 1;
const SINK_DRAINING: u8 = 2;

// ---- counters ---------------------------------------------------------------

/// The node's own counters (beyond the staging's accounting), shared by the
/// node, its [`NetSink`] and whoever renders them (the daemon's /metrics).
#[derive(Debug, Default)]
pub struct FrontendStats {
    /// True while registered with the scheduler (and not draining): the
    /// service's readiness flag.
    pub ready: Arc<AtomicBool>,
    /// Tasks sent to the scheduler.
    pub tasks_sent: AtomicU64,
    /// Messages that carried them (`Task` or `Tasks`): `tasks_sent` over
    /// this is the batching the wire achieved.
    pub task_messages_sent: AtomicU64,
    /// Requests failed because the task queue was full.
    pub queue_full: AtomicU64,
    /// Backend data links open (registered).
    pub backends: AtomicU64,
    /// Backend data links that died or misbehaved.
    pub backends_lost: AtomicU64,
    /// Malformed or unroutable messages received.
    pub bad_messages: AtomicU64,
    /// Cancellations sent to the scheduler.
    pub cancels_sent: AtomicU64,
    /// Cancellations not sent (their queue was full or the scheduler
    /// gone): the task then ends by its deadline, its slot freed then.
    pub cancels_unsent: AtomicU64,
    /// With scheduler groups: tasks a group answered `moved`, taken back
    /// to be resubmitted to the model's owner.
    pub moved_taken_back: AtomicU64,
    /// With scheduler groups: the routing revision followed.
    pub route_revision: AtomicU64,
}

impl FrontendStats {
    /// Registers the counters in `r` (read where they are kept, when
    /// scraped).
    pub fn register(self: &Arc<Self>, r: &MetricsRegistry) {
        type Read = fn(&FrontendStats) -> u64;
        let gauges: [(&str, &str, Read); 3] = [
            ("symphony_frontend_route_revision", "The routing table revision followed (scheduler groups; 0: none)", |s| {
                s.route_revision.load(Ordering::Relaxed)
            }),
            ("symphony_frontend_ready", "1 while registered with the scheduler", |s| {
                u64::from(s.ready.load(Ordering::Relaxed))
            }),
            ("symphony_frontend_backends", "Backend data connections open", |s| {
                s.backends.load(Ordering::Relaxed)
            }),
        ];
        let counters: [(&str, &str, Read); 6] = [
            ("symphony_frontend_moved_resubmits", "Tasks a scheduler group answered moved, taken back for the model's owner", |s| {
                s.moved_taken_back.load(Ordering::Relaxed)
            }),
            ("symphony_frontend_tasks_sent", "Tasks sent to the scheduler", |s| {
                s.tasks_sent.load(Ordering::Relaxed)
            }),
            ("symphony_frontend_task_messages_sent", "Messages that carried tasks to the scheduler (Task or Tasks batches)", |s| {
                s.task_messages_sent.load(Ordering::Relaxed)
            }),
            ("symphony_frontend_queue_full", "Requests failed because the queue to the scheduler was full", |s| {
                s.queue_full.load(Ordering::Relaxed)
            }),
            ("symphony_frontend_backends_lost", "Backend data connections that died or misbehaved", |s| {
                s.backends_lost.load(Ordering::Relaxed)
            }),
            ("symphony_frontend_bad_messages", "Malformed or unroutable messages received", |s| {
                s.bad_messages.load(Ordering::Relaxed)
            }),
        ];
        for (name, help, read) in gauges {
            let s = self.clone();
            r.register(name, help, Computed::gauge_of(move || read(&s) as f64));
        }
        for (name, help, read) in counters {
            let s = self.clone();
            r.register(name, help, Computed::counter_of(move || read(&s)));
        }
    }
}

// ---- the task queue -----------------------------------------------------------

#[derive(Debug)]
struct TaskQueue {
    tasks: ArrayQueue<Task>,
    /// Ids of cancelled tasks, for the scheduler.
    cancels: ArrayQueue<u64>,
    state: AtomicU8,
    waker: Option<Notifier>,
    stats: Arc<FrontendStats>,
}

/// The [`TaskSink`] in front of a [`FrontendNode`]: a bounded lock-free
/// queue the node drains (waking its host through the optional
/// [`Notifier`]). Never blocks; a full queue, or a sink the node has not
/// opened (not registered with the scheduler) or has closed, is an error,
/// so the request fails at once (counted) instead of waiting.
#[derive(Clone, Debug)]
pub struct NetSink {
    queue: Arc<TaskQueue>,
}

/// The node's end of a [`NetSink`]'s queue (give it to
/// [`FrontendNode::new`]).
#[derive(Debug)]
pub struct TaskSource {
    queue: Arc<TaskQueue>,
}

impl NetSink {
    /// A queue of at most `capacity` tasks (at least 1): the sink to give
    /// the service, and the source to give the node. `waker`, if any, is
    /// notified after each push (the daemon's I/O thread sleeps on it; a
    /// single-threaded harness needs none). Closed until the node
    /// registers.
    pub fn new(capacity: usize, waker: Option<Notifier>) -> (NetSink, TaskSource) {
        let queue = Arc::new(TaskQueue {
            tasks: ArrayQueue::new(capacity.max(1)),
            cancels: ArrayQueue::new(capacity.max(1)),
            state: AtomicU8::new(SINK_CLOSED),
            waker,
            stats: Arc::new(FrontendStats::default()),
        });
        (
            NetSink {
                queue: queue.clone(),
            },
            TaskSource { queue },
        )
    }
    /// The node's counters.
    pub fn stats(&self) -> &Arc<FrontendStats> {
        &self.queue.stats
    }

    /// The client gave `ticket`'s request up ([`Ticket::cancel`]): it
    /// resolves now as cancelled, and the node tells the scheduler, which
    /// takes the task out of its queue (or, already planned, lets it run;
    /// the result is discarded). The staging slot is freed when the task's
    /// outcome arrives. Returns false if the outcome was already there
    /// (the ticket still yields it). Never blocks.
    pub fn cancel(&self, ticket: &mut Ticket) -> bool {
        if !ticket.cancel() {
            return false;
        }
        if self.queue.state.load(Ordering::Acquire) != SINK_OPEN || self.queue.cancels.push(ticket.task_id()).is_err() {
            self.queue.stats.cancels_unsent.fetch_add(1, Ordering::Relaxed);
        } else if let Some(w) = &self.queue.waker {
            w.notify();
        }
        true
    }
}

impl TaskSink for NetSink {
    fn cancel(&self, ticket: &mut Ticket) -> bool {
        NetSink::cancel(self, ticket)
    }
    fn send(&self, task: &Task) -> Result<(), SinkError> {
        match self.queue.state.load(Ordering::Acquire) {
            SINK_OPEN => {}
            SINK_DRAINING => return Err(SinkError("the frontend is shutting down".into())),
            _ => return Err(SinkError("not registered with the scheduler".into())),
        }
        if self.queue.tasks.push(*task).is_err() {
            self.queue.stats.queue_full.fetch_add(1, Ordering::Relaxed);
            return Err(SinkError("the queue to the scheduler is full".into()));
        }
        if let Some(w) = &self.queue.waker {
            w.notify();
        }
        Ok(())
    }
}

// ---- the node -----------------------------------------------------------------

/// What a [`FrontendNode`] is.
#[derive(Clone, Debug)]
pub struct FrontendNodeConfig {
    /// This frontend's id (the high 16 bits of its task ids).
    pub id: u16,
    /// Where backends reach this frontend's data listener (sent in the
    /// registration).
    pub data_endpoint: String,
    /// How many models this frontend serves: a scheduler announcing
    /// another count is refused (the model ids would not agree).
    pub models: u32,
    /// Heartbeat interval toward the scheduler.
    pub heartbeat: Duration,
    /// The scheduler is lost after this much silence.
    pub dead_after: Duration,
    /// How long the scheduler has to acknowledge the registration, and a
    /// backend's data link to send its `Register`.
    pub handshake_timeout: Duration,
    /// Most tasks per submission message (clamped to
    /// 1 ..= [`wire::MAX_TASKS_PER_MESSAGE`]): a full batch leaves at once
    /// as one `Tasks` message. 1 sends one `Task` message per task (the
    /// wire before batching).
    pub coalesce: usize,
    /// How long a staged task may wait for more to fill its message
    /// (zero: never; a pass sends what it staged before it returns). Zero
    /// is the default because the frontend's tasks carry deadlines and
    /// batching comes free under load anyway: a pass takes every task
    /// queued since the last one, so the busier the frontend the fuller
    /// its messages, while an idle one adds no delay. A window trades up
    /// to its length in latency for fewer messages at moderate load; one
    /// shorter than the host's sleep threshold (`waitset::SLEEP_ABOVE`)
    /// spins its I/O thread through it (docs/journal/benchmarks-2026.md: 50 µs doubled
    /// the bad rate of `symphony up` at 3k requests/s on 2 cores).
    pub coalesce_wait: Duration,
}

/// [`FrontendNodeConfig::coalesce`]'s default: 16 tasks (1 KiB of task
/// records) per message.
pub const DEFAULT_COALESCE: usize = 16;

/// What the host must act on (log, exit, update its wait set's view).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrontendEvent {
    /// The scheduler acknowledged the registration, announcing `models`
    /// models; tasks now flow.
    Registered {
        /// The scheduler group (0 without groups).
        group: u16,
        /// The scheduler's model count (equal to this node's).
        models: u32,
    },
    /// The registration failed (refused, not acknowledged in time, or the
    /// scheduler's model list differs); the link was let go.
    Refused {
        /// The scheduler group (0 without groups).
        group: u16,
        /// Why, for the operator.
        why: String,
    },
    /// The registered scheduler link died, misbehaved or went silent; the
    /// link was let go. Without failover every request in flight has been
    /// ended (dropped, shutdown) and the sink is closed; with it
    /// ([`FrontendNode::with_failover`]) the requests are held and resent
    /// to the next scheduler link that registers.
    SchedulerLost {
        /// The scheduler group (0 without groups).
        group: u16,
        /// Why, for the operator.
        why: String,
    },
    /// A backend's data link registered.
    BackendJoined(u32),
    /// A backend's data link died or sent garbage; it was let go (the
    /// scheduler fails that backend's tasks back).
    BackendLost {
        /// The backend's id.
        id: u32,
        /// Why, for the operator.
        why: String,
    },
    /// A data link that did not register as a backend in time; let go.
    LinkRefused {
        /// Why, for the operator.
        why: String,
    },
}

/// Where the scheduler link stands.
#[derive(Clone, Copy, Debug)]
enum Phase {
    /// No scheduler link (none yet, refused or lost).
    Unlinked,
    /// The link is handed over: the scheduler's challenge (its nonce) is
    /// awaited, then our `Join` is `sent` or still to send; the `Welcome`
    /// is due by `deadline`.
    Registering {
        nonce: Option<[u8; wire::NONCE_LEN]>,
        sent: bool,
        deadline: Instant,
    },
    /// Acknowledged; tasks flow.
    Registered { live: Liveness, heard_at: Instant },
}

struct PendingLink<C> {
    conn: C,
    deadline: Instant,
}

struct BackendLink<C> {
    id: u32,
    conn: C,
}

/// One scheduler group's link (one in a single-group cluster).
struct SchedLink<C> {
    conn: Option<C>,
    phase: Phase,
    /// Tasks taken for this link and not sent yet, oldest first: the
    /// next message (at most the coalesce limit; allocated once). A send
    /// queue that had no room for their message keeps them here for the
    /// next poll.
    unsent: Vec<Task>,
    /// When the oldest of `unsent` was staged.
    staged_at: Instant,
    /// `unsent` waits for the hold window (not for room in the send
    /// queue): [`FrontendNode::poll_at`] names the window's end.
    holding: bool,
    /// A cancellation the link had no room for.
    unsent_cancel: Option<u64>,
    /// With groups: tasks routed to this group, to go out on its link this
    /// poll (at most [`BURST`]; allocated once).
    out: VecDeque<Task>,
}

impl<C> SchedLink<C> {
    fn new(routed: bool, coalesce: usize) -> Self {
        SchedLink {
            conn: None,
            phase: Phase::Unlinked,
            unsent: Vec::with_capacity(coalesce),
            staged_at: Instant::ZERO,
            holding: false,
            unsent_cancel: None,
            out: VecDeque::with_capacity(if routed { BURST } else { 0 }),
        }
    }
    fn registered(&self) -> bool {
        matches!(self.phase, Phase::Registered { .. })
    }
}

/// With scheduler groups: the routing table as the node uses it.
struct Routing {
    /// The newest revision handed to the node (0: none yet).
    revision: u64,
    /// The owner group of each model id (`None`: no owner in the table).
    owners: Vec<Option<u16>>,
    /// A resubmission pass is to begin (a table, a registration or a
    /// `moved` answer).
    repass: bool,
    /// A task taken from the queue whose group's link had no room.
    unsent: Option<Task>,
    /// A group answered `moved` for a task this table sent it: the table
    /// may be old (see [`FrontendNode::take_stale_table`]).
    stale: bool,
}

/// How long a task answered `moved` by the group the frontend's table
/// still names waits before it is offered again (the table unchanged): the
/// owner may not have applied the revision the frontend has. Also the
/// period of the held table's sweep while tasks wait (with groups). 5 ms
/// rather than 20: in the `reroute2` harness class (per-node lags up to
/// 8 ms, budgets 25-50 ms) 20 ms let 9% of the resubmitted tasks end
/// dropped `moved`, 5 ms none (300 seeds).
pub const MOVED_RETRY: Duration = Duration::from_millis(5);

/// The frontend's links and their protocol, driven by a host (see the
/// module docs).
pub struct FrontendNode<C: Connection> {
    cfg: FrontendNodeConfig,
    staging: Arc<Staging>,
    tasks: TaskSource,
    /// One link per scheduler group (group 0 alone without groups).
    links: Vec<SchedLink<C>>,
    /// With groups ([`with_groups`](Self::with_groups)): the table.
    routing: Option<Routing>,
    /// Data links accepted by the host, waiting for their `Register`.
    pending: Vec<PendingLink<C>>,
    backends: Vec<BackendLink<C>>,
    /// Links let go of since the last poll, for the host to take.
    closed: Vec<C>,
    events: VecDeque<FrontendEvent>,
    /// Latest `now` seen: time never goes back inside the node.
    now: Instant,
    shut_down: bool,
    buf: Box<[u8]>,
    /// Builds the `Tasks` messages (its buffer allocated once).
    batcher: wire::TaskBatcher,
    hb: [u8; 64],
    /// The cluster's join token (its MAC answers the scheduler's challenge).
    token: Option<JoinToken>,
    /// With failover on, the tasks sent, held for the next scheduler.
    held: Option<HeldTasks>,
    /// When held requests past their deadline are next answered (while no
    /// scheduler is registered, or with groups while any task waits).
    sweep_at: Option<Instant>,
}

impl<C: Connection> std::fmt::Debug for FrontendNode<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrontendNode")
            .field("id", &self.cfg.id)
            .field("phases", &self.links.iter().map(|l| l.phase).collect::<Vec<_>>())
            .field("pending", &self.pending.len())
            .field("backends", &self.backends.len())
            .finish()
    }
}

/// `d` for an operator: whole seconds as "5 s", otherwise milliseconds.
fn human(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns >= 1_000_000_000 && ns.is_multiple_of(1_000_000_000) {
        format!("{} s", ns / 1_000_000_000)
    } else {
        format!("{} ms", ns / 1_000_000)
    }
}

impl<C: Connection> FrontendNode<C> {
    /// A node over `staging` taking tasks from `tasks`, with no link yet.
    pub fn new(mut cfg: FrontendNodeConfig, staging: Arc<Staging>, tasks: TaskSource) -> Self {
        cfg.coalesce = cfg.coalesce.clamp(1, wire::MAX_TASKS_PER_MESSAGE);
        FrontendNode {
            batcher: wire::TaskBatcher::new(cfg.coalesce),
            links: vec![SchedLink::new(false, cfg.coalesce)],
            cfg,
            staging,
            tasks,
            routing: None,
            pending: Vec::new(),
            backends: Vec::new(),
            closed: Vec::new(),
            events: VecDeque::new(),
            now: Instant::ZERO,
            shut_down: false,
            buf: vec![0u8; wire::MAX_MESSAGE_LEN].into_boxed_slice(),
            hb: [0u8; 64],
            token: None,
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
    /// [`crate::held`]). Implies failover (per group). Until the first
    /// table, tasks wait (bounded by their deadlines).
    pub fn with_groups(mut self, groups: usize) -> Self {
        let groups = groups.clamp(1, usize::from(u16::MAX));
        self.links = (0..groups).map(|_| SchedLink::new(true, self.cfg.coalesce)).collect();
        self.routing = Some(Routing { revision: 0, owners: vec![None; self.cfg.models as usize], repass: false, unsent: None, stale: false });
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
        self.links.push(SchedLink::new(true, self.cfg.coalesce));
        Some(self.links.len() - 1)
    }

    /// Whether the node outlives its scheduler ([`with_failover`](Self::with_failover)).
    pub fn failover(&self) -> bool {
        self.held.is_some()
    }

    /// This node proving `token` when it registers (none: it registers
    /// without, which a scheduler that requires one refuses).
    pub fn with_join_token(mut self, token: Option<JoinToken>) -> Self {
        self.token = token;
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
        let deadline = now.saturating_add(self.cfg.handshake_timeout);
        let link = &mut self.links[group];
        if let Some(old) = link.conn.replace(conn) {
            self.closed.push(old);
        }
        link.phase = Phase::Registering { nonce: None, sent: false, deadline };
    }

    /// With groups: the routing table at `revision`, as the owner group
    /// of each model id (`owners[m]`; a missing or out-of-range entry: no
    /// owner). Ignored unless newer than the one the node has (returns
    /// whether it was taken). Tasks waiting for an owner, and those
    /// answered `moved`, are offered again at once.
    pub fn handle_routes(&mut self, revision: u64, owners: &[Option<u16>]) -> bool {
        let groups = self.links.len();
        let Some(r) = self.routing.as_mut() else { return false };
        if revision <= r.revision {
            return false;
        }
        r.revision = revision;
        for (m, o) in r.owners.iter_mut().enumerate() {
            *o = owners.get(m).copied().flatten().filter(|&g| usize::from(g) < groups);
        }
        r.repass = true;
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
        self.pending.push(PendingLink {
            conn,
            deadline: now.saturating_add(self.cfg.handshake_timeout),
        });
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
        if self.routing.is_some() {
            work |= self.dispatch(now);
        } else if self.held.is_some() && !self.is_registered() {
            work |= self.hold_unlinked(now);
        }
        let waits = self.held.is_some() || self.routing.is_some();
        for g in 0..self.links.len() {
            work |= match self.links[g].phase {
                Phase::Unlinked if waits => false,
                Phase::Unlinked => self.end_queued(),
                Phase::Registering { nonce, sent, deadline } => {
                    self.poll_registration(g, now, nonce, sent, deadline)
                }
                Phase::Registered { .. } => self.poll_scheduler(g, now),
            };
        }
        if self.routing.is_some() {
            work |= self.send_cancels_routed();
        }
        work |= self.poll_backends();
        work |= self.poll_pending(now);
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
            match link.phase {
                Phase::Unlinked => {}
                Phase::Registering { deadline, .. } => consider(deadline),
                Phase::Registered { live, heard_at } => {
                    if link.holding {
                        consider(link.staged_at.saturating_add(self.cfg.coalesce_wait));
                    }
                    consider(live.next_send());
                    // `Liveness::expired` is strict: the first instant past the timeout.
                    consider(
                        heard_at
                            .saturating_add(self.cfg.dead_after)
                            .saturating_add(Duration::from_nanos(1)),
                    );
                }
            }
        }
        for p in &self.pending {
            consider(p.deadline);
        }
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
        for p in &self.pending {
            f(&p.conn);
        }
        for b in &self.backends {
            f(&b.conn);
        }
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
        self.links.iter().all(|l| l.unsent.is_empty() && l.out.is_empty())
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
        links.extend(self.pending.drain(..).map(|p| p.conn));
        links.extend(self.backends.drain(..).map(|b| b.conn));
        links
    }

    /// Ends the unsent and queued tasks (nothing will send them); whether
    /// there were any.
    fn end_queued(&mut self) -> bool {
        let mut any = false;
        for link in &mut self.links {
            if link.unsent_cancel.take().is_some() {
                self.tasks.queue.stats.cancels_unsent.fetch_add(1, Ordering::Relaxed);
            }
        }
        while self.tasks.queue.cancels.pop().is_some() {
            self.stats().cancels_unsent.fetch_add(1, Ordering::Relaxed);
        }
        let routed_unsent = self.routing.as_mut().and_then(|r| r.unsent.take());
        let mut queued: Vec<Task> = Vec::new();
        for link in &mut self.links {
            queued.append(&mut link.unsent);
            queued.extend(link.out.drain(..));
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
        for t in self.links[0].unsent.drain(..) {
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

    /// With groups: every MOVED_RETRY while tasks wait, answers those past
    /// their deadline and offers the rest again; resubmissions and new
    /// tasks go to their owner's link (`out`), or wait in the held table
    /// while it has no registered link.
    fn dispatch(&mut self, now: Instant) -> bool {
        let Self { staging, tasks, links, routing, held, sweep_at, .. } = self;
        let (Some(r), Some(held)) = (routing.as_mut(), held.as_mut()) else { return false };
        let mut work = false;
        if sweep_at.is_some_and(|t| t <= now) {
            let (ended, waiting) = held.sweep(now, staging);
            work |= ended > 0;
            *sweep_at = (waiting > 0).then(|| now.saturating_add(MOVED_RETRY));
            r.repass |= waiting > 0;
        }
        if std::mem::take(&mut r.repass) {
            held.begin_resubmit();
        }
        let room = |links: &Vec<SchedLink<C>>, g: u16| {
            links.get(usize::from(g)).is_some_and(|l| l.registered() && l.out.len() < BURST)
        };
        for _ in 0..BURST {
            if !held.resubmitting() {
                break;
            }
            let owners = &r.owners;
            let Some((t, g)) = held.next_resubmit(now, staging, r.revision, |m, pinned| {
                pinned.or_else(|| owners.get(m as usize).copied().flatten()).filter(|&g| room(links, g))
            }) else {
                break;
            };
            links[usize::from(g)].out.push_back(t);
            work = true;
        }
        for _ in 0..BURST {
            let Some(t) = r.unsent.take().or_else(|| tasks.queue.tasks.pop()) else { break };
            work = true;
            match r.owners.get(t.model_id as usize).copied().flatten() {
                Some(g) if room(links, g) => links[usize::from(g)].out.push_back(t),
                Some(g) if links[usize::from(g)].registered() => {
                    r.unsent = Some(t);
                    break;
                }
                _ => {
                    held.hold(&t, now);
                    sweep_at.get_or_insert(now.saturating_add(HOLD_SWEEP));
                }
            }
        }
        work
    }

    /// With groups: cancellations, each to the group its task was sent to
    /// (best effort: one the link has no room for, or whose task is not
    /// at a registered group, is not sent; the task then ends by its
    /// deadline, or is answered cancelled when it would be resubmitted).
    fn send_cancels_routed(&mut self) -> bool {
        let Self { tasks, links, held, buf, .. } = self;
        let Some(held) = held.as_ref() else { return false };
        let stats = &tasks.queue.stats;
        let mut work = false;
        for _ in 0..BURST {
            let Some(task_id) = tasks.queue.cancels.pop() else { break };
            work = true;
            let link = held.group_of(task_id).and_then(|g| links.get_mut(usize::from(g))).filter(|l| l.registered());
            let sent = link.and_then(|l| l.conn.as_mut()).is_some_and(|conn| {
                wire::encode(buf, &wire::Cancel { task_id }).is_ok_and(|n| conn.send(&buf[..n]).is_ok())
            });
            let counter = if sent { &stats.cancels_sent } else { &stats.cancels_unsent };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        work
    }

    /// Group `g`'s registration failed: let the link go.
    fn refuse(&mut self, g: usize, why: String) -> bool {
        let link = &mut self.links[g];
        link.phase = Phase::Unlinked;
        if let Some(c) = link.conn.take() {
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
        let link = &mut self.links[g];
        link.phase = Phase::Unlinked;
        if let Some(c) = link.conn.take() {
            self.closed.push(c);
        }
        let group = g as u16;
        if let Some(held) = self.held.as_mut() {
            // Failover: everything stays in flight for the next scheduler.
            held.link_lost(group);
            let link = &mut self.links[g];
            for t in link.unsent.drain(..).chain(link.out.drain(..)) {
                held.hold(&t, now);
            }
            let ready = self.links.iter().any(SchedLink::registered);
            self.tasks.queue.stats.ready.store(ready, Ordering::Release);
            self.sweep_at = Some(now.saturating_add(HOLD_SWEEP));
            self.events.push_back(FrontendEvent::SchedulerLost { group, why });
            return;
        }
        // Close before draining: a task pushed after the drain is ended by
        // a later poll (`Phase::Unlinked`).
        self.tasks.queue.state.store(SINK_CLOSED, Ordering::Release);
        self.stats().ready.store(false, Ordering::Release);
        self.end_queued();
        self.staging
            .end_in_flight(RoutedOutcome::Dropped(DropReason::Shutdown));
        self.events.push_back(FrontendEvent::SchedulerLost { group, why });
    }

    fn refused_text(&self) -> String {
        format!(
            "the scheduler closed the connection while frontend {} registered (refused it without saying why)",
            self.cfg.id
        )
    }

    /// Our Join answering `nonce`, with a MAC if we hold a token.
    fn join(&self, nonce: &[u8; wire::NONCE_LEN]) -> Join {
        let j = Join::new(Role::Frontend, u32::from(self.cfg.id), 0, &self.cfg.data_endpoint);
        match &self.token {
            Some(t) => j.with_mac(t.sign(nonce, wire::VERSION, &j)),
            None => j,
        }
    }

    fn poll_registration(
        &mut self,
        g: usize,
        now: Instant,
        mut nonce: Option<[u8; wire::NONCE_LEN]>,
        mut sent: bool,
        deadline: Instant,
    ) -> bool {
        if self.links[g].conn.is_none() {
            self.links[g].phase = Phase::Unlinked;
            return false;
        }
        let mut work = false;
        for _ in 0..BURST {
            if let (Some(n), false) = (nonce, sent) {
                let join = self.join(&n);
                let len = match wire::encode(&mut self.buf, &join) {
                    Ok(len) => len,
                    Err(e) => return self.refuse(g, format!("registering with the scheduler: {e}")),
                };
                let Some(conn) = self.links[g].conn.as_mut() else { break };
                match conn.send(&self.buf[..len]) {
                    Ok(()) => {
                        sent = true;
                        work = true;
                    }
                    Err(TransportError::QueueFull) => {}
                    // A refusing scheduler closes the link, which this side
                    // may see while still sending its Join.
                    Err(TransportError::PeerDisconnected) => return self.refuse(g, self.refused_text()),
                    Err(e) => return self.refuse(g, format!("registering with the scheduler: {e}")),
                }
            }
            let Some(conn) = self.links[g].conn.as_mut() else { break };
            // Pushes our Join out; a departure shows in the receive.
            let _ = conn.progress();
            let n = match conn.try_recv(&mut self.buf) {
                Ok(Some(n)) => n,
                Ok(None) => break,
                Err(TransportError::PeerDisconnected) => return self.refuse(g, self.refused_text()),
                Err(e) => {
                    return self.refuse(g, format!("waiting for the scheduler's acknowledgement: {e}"))
                }
            };
            work = true;
            match wire::decode(&self.buf[..n]) {
                Ok(Message::Challenge(c)) if nonce.is_none() => nonce = Some(c.nonce),
                Ok(Message::Welcome(w)) if sent => return self.registered(g, now, w.models),
                Ok(Message::Refused(r)) => {
                    return self.refuse(g, format!(
                        "the scheduler refused the registration of frontend {}: {r}",
                        self.cfg.id
                    ))
                }
                Err(WireError::BadVersion(v)) => {
                    return self.refuse(g, format!(
                        "the scheduler speaks wire version {v}, this frontend {}: run one version in the whole cluster",
                        wire::VERSION
                    ))
                }
                // Heartbeats may come first; anything else before the
                // Welcome is not worth failing for.
                Ok(_) => {}
                Err(e) => {
                    return self.refuse(g, format!("the scheduler sent a malformed message: {e}"));
                }
            }
        }
        if now >= deadline {
            return self.refuse(g, if sent {
                format!(
                    "the scheduler did not acknowledge the registration within {}",
                    human(self.cfg.handshake_timeout)
                )
            } else {
                format!(
                    "registering with the scheduler: no challenge within {}",
                    human(self.cfg.handshake_timeout)
                )
            });
        }
        self.links[g].phase = Phase::Registering { nonce, sent, deadline };
        work
    }

    fn registered(&mut self, g: usize, now: Instant, models: u32) -> bool {
        if models != self.cfg.models {
            return self.refuse(g, format!(
                "the scheduler has {models} models, this frontend {}: give every daemon the same --zoo/--models/--model",
                self.cfg.models
            ));
        }
        self.links[g].phase = Phase::Registered {
            live: Liveness::new(now, self.cfg.heartbeat, self.cfg.dead_after),
            heard_at: now,
        };
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

    /// Tasks out, the scheduler's messages in, heartbeat, liveness (group
    /// `g`'s link).
    fn poll_scheduler(&mut self, g: usize, now: Instant) -> bool {
        let Self {
            cfg,
            staging,
            tasks,
            links,
            routing,
            buf,
            batcher,
            hb,
            held,
            sweep_at,
            ..
        } = self;
        let SchedLink { conn, phase, unsent, staged_at, holding, unsent_cancel, out } = &mut links[g];
        let (Some(conn), Phase::Registered { live, heard_at }) = (conn.as_mut(), phase) else {
            return false;
        };
        let stats = &tasks.queue.stats;
        let (group, revision) = (g as u16, routing.as_ref().map_or(0, |r| r.revision));
        let mut work = false;
        let mut lost: Option<String> = None;

        // Tasks to the scheduler, in order, staged in `unsent` and sent
        // `cfg.coalesce` to a message; a full send queue keeps the staged
        // tasks for the next poll. Messages and cancellations are staged
        // on the link (`send_batched`) and leave together in one write per
        // pass, not one system call per task. With groups, the tasks come
        // routed (`dispatch`).
        let mut blocked = false;
        let mut send = |unsent: &mut Vec<Task>, conn: &mut C, held: &mut Option<HeldTasks>, work: &mut bool| {
            let (sent, n) = (send_staged(conn, unsent.as_slice(), batcher, buf), unsent.len());
            match &sent {
                Sent::Tasks(n) => {
                    *work = true;
                    stats.tasks_sent.fetch_add(*n, Ordering::Relaxed);
                    stats.task_messages_sent.fetch_add(1, Ordering::Relaxed);
                    if let Some(h) = held.as_mut() {
                        for task in unsent.iter() {
                            h.sent(task, now, group, revision);
                        }
                    }
                }
                Sent::Unencodable => {
                    *work = true;
                    for task in unsent.iter() {
                        staging.route(task.task_id, RoutedOutcome::Failed(TaskStatus::ExecFailed));
                    }
                }
                Sent::QueueFull => return Ok(false),
                Sent::Failed(_) => {
                    for task in unsent.iter() {
                        match held.as_mut() {
                            Some(h) => h.hold(task, now),
                            None => {
                                staging.route(task.task_id, RoutedOutcome::Dropped(DropReason::Shutdown));
                            }
                        }
                    }
                }
            }
            unsent.clear();
            match sent {
                Sent::Failed(e) if n == 1 => Err(format!("sending a task: {e}")),
                Sent::Failed(e) => Err(format!("sending {n} tasks: {e}")),
                _ => Ok(true),
            }
        };
        for _ in 0..BURST {
            if unsent.len() >= cfg.coalesce {
                match send(unsent, conn, held, &mut work) {
                    Ok(true) => {}
                    Ok(false) => {
                        blocked = true;
                        break;
                    }
                    Err(e) => {
                        lost = Some(e);
                        break;
                    }
                }
            }
            let next = match routing {
                Some(_) => out.pop_front(),
                None => held
                    .as_mut()
                    .and_then(|h| h.next_resubmit(now, staging, 0, |_, _| Some(0)))
                    .map(|(t, _)| t)
                    .or_else(|| tasks.queue.tasks.pop()),
            };
            let Some(task) = next else { break };
            if unsent.is_empty() {
                *staged_at = now;
            }
            unsent.push(task);
        }
        // The last message of the pass: a part batch leaves now, unless a
        // hold window is configured and its oldest task is still within it
        // (a drain does not wait).
        *holding = false;
        if lost.is_none() && !blocked && !unsent.is_empty() {
            let due = unsent.len() >= cfg.coalesce
                || now >= staged_at.saturating_add(cfg.coalesce_wait)
                || tasks.queue.state.load(Ordering::Acquire) != SINK_OPEN;
            if due {
                match send(unsent, conn, held, &mut work) {
                    Ok(_) => {}
                    Err(e) => lost = Some(e),
                }
            } else {
                *holding = true;
            }
        }

        // Cancellations, after every task queued before them (a cancel
        // that overtook its task would be ignored and the task would run).
        // With groups they go to their task's group (`send_cancels_routed`).
        if lost.is_none() && unsent.is_empty() && routing.is_none() {
            for _ in 0..BURST {
                let Some(task_id) = unsent_cancel.take().or_else(|| tasks.queue.cancels.pop()) else {
                    break;
                };
                let n = match wire::encode(buf, &wire::Cancel { task_id }) {
                    Ok(n) => n,
                    Err(_) => continue,
                };
                match conn.send_batched(&buf[..n]) {
                    Ok(()) => {
                        work = true;
                        stats.cancels_sent.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(TransportError::QueueFull) => {
                        *unsent_cancel = Some(task_id);
                        break;
                    }
                    Err(e) => {
                        stats.cancels_unsent.fetch_add(1, Ordering::Relaxed);
                        lost = Some(format!("sending a cancellation: {e}"));
                        break;
                    }
                }
            }
        }

        // The pass's tasks and cancellations leave now.
        if lost.is_none() {
            match conn.flush_batched() {
                Ok(()) | Err(TransportError::QueueFull) => {}
                Err(e) => lost = Some(format!("sending tasks: {e}")),
            }
        }

        // From the scheduler: drops, failures, heartbeats. With groups, a
        // task answered `moved` is taken back (held) for its new owner.
        if lost.is_none() {
            for _ in 0..BURST {
                match conn.try_recv(buf) {
                    Ok(Some(n)) => {
                        work = true;
                        live.heard(now);
                        *heard_at = now;
                        match wire::decode(&buf[..n]) {
                            Ok(Message::Dropped(d)) if d.reason == DropReason::Moved as u32 && routing.is_some() => {
                                let attempt = u16::try_from(d.reserved).unwrap_or(u16::MAX);
                                let answer = held.as_mut().map_or(MovedAnswer::Unknown, |h| h.moved(d.task_id, attempt, now, MOVED_RETRY));
                                match (routing.as_mut(), answer) {
                                    // An answer to an attempt already
                                    // superseded (a copy, or late): the
                                    // task is elsewhere now.
                                    (_, MovedAnswer::Stale) => {}
                                    (Some(r), MovedAnswer::TakenBack(sent_by)) => {
                                        stats.moved_taken_back.fetch_add(1, Ordering::Relaxed);
                                        r.repass = true;
                                        r.stale |= sent_by >= r.revision;
                                        sweep_at.get_or_insert(now.saturating_add(MOVED_RETRY));
                                    }
                                    _ => {
                                        staging.route(d.task_id, RoutedOutcome::Dropped(DropReason::Moved));
                                    }
                                }
                            }
                            Ok(m @ (Message::Dropped(_) | Message::Completion(..))) => {
                                if staging.route_message(&m).is_err() {
                                    stats.bad_messages.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            Ok(_) => {}
                            Err(e) => {
                                lost = Some(format!("malformed message: {e}"));
                                break;
                            }
                        }
                    }
                    Ok(None) => break,
                    Err(TransportError::PeerDisconnected) => {
                        lost = Some("disconnected".into());
                        break;
                    }
                    Err(e) => {
                        lost = Some(e.to_string());
                        break;
                    }
                }
            }
        }
        if lost.is_none() {
            if let Some(n) = live.due(now, Role::Frontend, u32::from(cfg.id), hb) {
                match conn.send(&hb[..n]) {
                    // A full queue is sending anyway: that is proof of life too.
                    Ok(()) | Err(TransportError::QueueFull) => {}
                    Err(e) => lost = Some(format!("sending a heartbeat: {e}")),
                }
            }
        }
        if lost.is_none() && live.expired(now) {
            lost = Some(format!(
                "silent for more than {} ms",
                cfg.dead_after.as_nanos() / 1_000_000
            ));
        }
        if let Some(why) = lost {
            self.lose_scheduler(g, why);
            return true;
        }
        work
    }

    /// Completions from the backends (and, on tcp, their READs of our slots).
    fn poll_backends(&mut self) -> bool {
        let mut work = false;
        let mut i = 0;
        while i < self.backends.len() {
            match poll_backend(
                &mut self.backends[i].conn,
                &mut self.buf,
                &self.staging,
                &self.tasks.queue.stats,
            ) {
                Ok(w) => {
                    work |= w;
                    i += 1;
                }
                Err(why) => {
                    // Its tasks are failed back by the scheduler.
                    work = true;
                    let gone = self.backends.swap_remove(i);
                    self.closed.push(gone.conn);
                    let stats = self.stats();
                    stats.backends_lost.fetch_add(1, Ordering::Relaxed);
                    stats
                        .backends
                        .store(self.backends.len() as u64, Ordering::Relaxed);
                    self.events
                        .push_back(FrontendEvent::BackendLost { id: gone.id, why: why.to_string() });
                }
            }
        }
        work
    }

    /// Data links waiting for their `Register{Backend}`.
    fn poll_pending(&mut self, now: Instant) -> bool {
        let mut work = false;
        let mut i = 0;
        while i < self.pending.len() {
            let p = &mut self.pending[i];
            // None: still waiting; Some(Ok(backend id)) or Some(Err(why)).
            let verdict: Option<Result<u32, DataLinkError>> = match p.conn.try_recv(&mut self.buf) {
                Ok(Some(n)) => Some(match wire::decode(&self.buf[..n]) {
                    Ok(Message::Register(r)) if r.role() == Some(Role::Backend) => Ok(r.id),
                    Ok(Message::Register(r)) => Err(DataLinkError::NotABackend(r.role)),
                    Ok(_) => Err(DataLinkError::NoRegister(TransportError::Protocol(
                        wire::WireError::BadValue("first message is not Register"),
                    ))),
                    Err(e) => Err(DataLinkError::NoRegister(e.into())),
                }),
                Ok(None) if now >= p.deadline => Some(Err(DataLinkError::NoRegister(TransportError::Timeout))),
                Ok(None) => None,
                Err(e) => Some(Err(DataLinkError::NoRegister(e))),
            };
            let Some(verdict) = verdict else {
                i += 1;
                continue;
            };
            work = true;
            let mut link = self.pending.swap_remove(i);
            match verdict {
                Ok(id) => {
                    // Only a registered backend may READ staging memory.
                    link.conn.allow_remote_reads();
                    // A backend that reconnects replaces its old link.
                    if let Some(at) = self.backends.iter().position(|b| b.id == id) {
                        let old = self.backends.swap_remove(at);
                        self.closed.push(old.conn);
                    }
                    self.backends.push(BackendLink {
                        id,
                        conn: link.conn,
                    });
                    self.stats()
                        .backends
                        .store(self.backends.len() as u64, Ordering::Relaxed);
                    self.events.push_back(FrontendEvent::BackendJoined(id));
                }
                Err(why) => {
                    self.closed.push(link.conn);
                    self.events.push_back(FrontendEvent::LinkRefused { why: why.to_string() });
                }
            }
        }
        work
    }
}

/// Why a backend's data link is let go.
#[derive(Debug, thiserror::Error)]
enum DataLinkError {
    /// It registered as another role.
    #[error("refused a data connection registering as role {0} (not a backend)")]
    NotABackend(u32),
    /// Its first message was not a `Register`, or did not come in time.
    #[error("data connection without Register: {0}")]
    NoRegister(TransportError),
    /// It sent bytes that do not decode.
    #[error("malformed message: {0}")]
    Malformed(WireError),
    /// The link broke.
    #[error(transparent)]
    Transport(#[from] TransportError),
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

/// Receives what a backend has sent (at most a burst); `Ok(found work)`,
/// `Err` if the link is dead or the backend sent garbage (it is then let
/// go).
fn poll_backend<C: Connection>(
    conn: &mut C,
    buf: &mut [u8],
    staging: &Staging,
    stats: &FrontendStats,
) -> Result<bool, DataLinkError> {
    let mut work = false;
    for _ in 0..BURST {
        match conn.try_recv(buf) {
            Ok(Some(n)) => {
                work = true;
                match wire::decode(&buf[..n]) {
                    Ok(m @ (Message::Dropped(_) | Message::Completion(..))) => {
                        if staging.route_message(&m).is_err() {
                            stats.bad_messages.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        stats.bad_messages.fetch_add(1, Ordering::Relaxed);
                        return Err(DataLinkError::Malformed(e));
                    }
                }
            }
            Ok(None) => return Ok(work),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(work)
}

#[cfg(test)]
#[path = "node_auth_tests.rs"]
mod auth_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use crate::models::ModelCatalog;
    use crate::service::{ClusterService, InferenceService, SubmitError};
    use crate::staging::{Outcome, StagingConfig, Ticket};
    use dataplane::mem::{Access, Region};
    use dataplane::transport::sim::{FaultConfig, NodeId, SimConn, SimNet, SimPeer};
    use dataplane::transport::Domain;
    use dataplane::wire::{CompletionHead, OutputKind, Register, Welcome};
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    // ---- what the tests read from and write to a peer's end ------------

    trait PeerExt {
        fn put<M: wire::FixedMessage>(&mut self, m: &M);
        fn put_completion(&mut self, task_id: u64, out: &[u8]);
        /// Every task received, in order (from `Task` and `Tasks`).
        fn tasks(&mut self) -> Vec<Task>;
        /// The tasks of each task message received.
        fn task_messages(&mut self) -> Vec<Vec<Task>>;
        fn heartbeats(&mut self) -> usize;
    }

    impl PeerExt for SimPeer {
        fn put<M: wire::FixedMessage>(&mut self, m: &M) {
            self.send(m).unwrap();
        }
        fn put_completion(&mut self, task_id: u64, out: &[u8]) {
            let head = CompletionHead {
                task_id,
                status: TaskStatus::Ok as u32,
                output_kind: OutputKind::Inline as u32,
                ..CompletionHead::default()
            };
            self.send_encoded(|b| wire::encode_completion(b, &head, out))
                .unwrap();
        }
        fn tasks(&mut self) -> Vec<Task> {
            self.task_messages().into_iter().flatten().collect()
        }
        fn task_messages(&mut self) -> Vec<Vec<Task>> {
            self.take_all()
                .iter()
                .filter_map(|m| match wire::decode(m) {
                    Ok(Message::Task(t)) => Some(vec![t]),
                    Ok(Message::Tasks(list)) => Some(list.iter().collect()),
                    _ => None,
                })
                .collect()
        }
        fn heartbeats(&mut self) -> usize {
            self.take_all()
                .iter()
                .filter(|m| matches!(wire::decode(m), Ok(Message::Heartbeat(_))))
                .count()
        }
    }

    // ---- a frontend on one thread: service, staging, node ---------------

    const T0: Instant = Instant::from_nanos(1_000_000_000);
    const MS: Duration = Duration::from_millis(1);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// The fake scheduler's challenge (it asks for no token).
    const NONCE: [u8; wire::NONCE_LEN] = [9; wire::NONCE_LEN];

    /// The fake scheduler's welcome for a list of `models`.
    fn welcome(models: u32) -> Welcome {
        Welcome { models, epoch: 0, control_delay_ns: 0 }
    }

    const FRONTEND: NodeId = 5;
    const SCHEDULER: NodeId = 0;
    /// Every data link's other end (backends, or impostors).
    const PEER: NodeId = 1;
    /// With groups: group g's scheduler is node `SCHEDULER_B + g`.
    const SCHEDULER_B: NodeId = 10;

    /// The node under test, its service, and the network its links run
    /// on (messages arrive at the instant they are sent).
    struct Frontend {
        net: SimNet,
        node: FrontendNode<SimConn>,
        service: ClusterService<NetSink>,
    }

    fn frontend() -> Frontend {
        frontend_coalescing(DEFAULT_COALESCE, Duration::ZERO)
    }

    /// A frontend sending up to `coalesce` tasks per message, holding a
    /// part batch up to `wait`.
    fn frontend_coalescing(coalesce: usize, wait: Duration) -> Frontend {
        let specs = scheduler::zoo::cluster_models(
            "a100",
            "none",
            &["m0=1,1,500".to_string(), "m1=1,2,500".to_string()],
        )
        .unwrap();
        let catalog = ModelCatalog::with_default_tensors(&specs);
        let slot_size = catalog.max_input_bytes() as u32;
        let net = SimNet::new(0, FaultConfig::same_instant());
        let region = Region::anonymous(slot_size as usize * 8).unwrap();
        let staging = Staging::new(
            net.domain(FRONTEND)
                .register(&region, Access::REMOTE_READ)
                .unwrap(),
            StagingConfig {
                frontend_id: 5,
                slots: 8,
                slot_size,
                max_output: catalog.max_output_bytes() as u32,
            },
        )
        .unwrap();
        let (sink, tasks) = NetSink::new(4, None);
        let node = FrontendNode::new(
            FrontendNodeConfig {
                id: 5,
                data_endpoint: "mem:frontend-5".into(),
                models: 2,
                heartbeat: ms(100),
                dead_after: ms(1000),
                handshake_timeout: ms(5000),
                coalesce,
                coalesce_wait: wait,
            },
            staging.clone(),
            tasks,
        );
        let metrics = Arc::new(Metrics::new(&catalog));
        let service = ClusterService::new(Arc::new(catalog), staging, sink, metrics, ms(100))
            .with_ready(node.stats().ready.clone());
        Frontend { net, node, service }
    }

    impl Frontend {
        fn submit(&self) -> Result<Ticket, SubmitError> {
            let len = self.service.catalog().by_id(0).unwrap().input.byte_len() as usize;
            self.service.submit(0, &vec![1u8; len], ms(400), Default::default())
        }
        fn events(&mut self) -> Vec<FrontendEvent> {
            std::iter::from_fn(|| self.node.poll_event()).collect()
        }
        /// Moves the clock to `now` and polls the node once.
        fn poll(&mut self, now: Instant) -> bool {
            self.net.set_now(now);
            self.node.poll(now)
        }
        /// A new link from this frontend to `peer`: ours, theirs.
        fn link(&self, peer: NodeId) -> (SimConn, SimPeer) {
            let (ours, theirs) = self.net.link(FRONTEND, peer).unwrap();
            (ours, SimPeer::new(theirs))
        }
        /// Hands over a scheduler link and completes the handshake at `T0`;
        /// returns the scheduler's end.
        fn registered(&mut self) -> SimPeer {
            self.registered_at(T0)
        }
        /// [`registered`](Self::registered) at `now`.
        fn registered_at(&mut self, now: Instant) -> SimPeer {
            let (ours, mut sched) = self.link(SCHEDULER);
            self.node.handle_scheduler_link(now, ours);
            sched.challenge(NONCE).unwrap();
            assert!(self.poll(now));
            assert!(sched.take_join().is_some());
            sched.put(&welcome(2));
            assert!(self.poll(now));
            assert_eq!(self.events(), [FrontendEvent::Registered { group: 0, models: 2 }]);
            sched.take_all();
            sched
        }
        /// [`registered`](Self::registered) on a link whose send queue
        /// holds `capacity` unread messages.
        fn registered_with_capacity(&mut self, capacity: usize) -> SimPeer {
            let (mut ours, mut sched) = self.link(SCHEDULER);
            ours.set_send_capacity(Some(capacity));
            self.node.handle_scheduler_link(T0, ours);
            sched.challenge(NONCE).unwrap();
            assert!(self.poll(T0));
            assert!(sched.take_join().is_some());
            sched.put(&welcome(2));
            assert!(self.poll(T0));
            assert_eq!(self.events(), [FrontendEvent::Registered { group: 0, models: 2 }]);
            sched.take_all();
            sched
        }
        /// With groups: group `g`'s scheduler link (its own peer node),
        /// registered at `now`; returns the scheduler's end.
        fn registered_group(&mut self, now: Instant, g: usize) -> SimPeer {
            let (ours, mut sched) = self.link(SCHEDULER_B + g as NodeId);
            self.node.handle_group_link(now, g, ours);
            sched.challenge(NONCE).unwrap();
            assert!(self.poll(now));
            assert!(sched.take_join().is_some());
            sched.put(&welcome(2));
            assert!(self.poll(now));
            assert_eq!(self.events(), [FrontendEvent::Registered { group: g as u16, models: 2 }]);
            sched.take_all();
            sched
        }
        /// A request for model `m`.
        fn submit_model(&self, m: u32) -> Ticket {
            let len = self.service.catalog().by_id(m).unwrap().input.byte_len() as usize;
            self.service.submit(m, &vec![1u8; len], ms(400), Default::default()).unwrap()
        }
        /// Hands over a data link that registers as backend `id`.
        fn backend(&mut self, now: Instant, id: u32) -> SimPeer {
            let (ours, mut theirs) = self.link(PEER);
            self.node.handle_backend_link(now, ours);
            theirs.put(&Register::new(Role::Backend, id, 1, ""));
            assert!(self.poll(now));
            theirs
        }
    }

    fn poll_now(t: &mut Ticket) -> Poll<Outcome> {
        Pin::new(t).poll(&mut Context::from_waker(std::task::Waker::noop()))
    }

    // ---- tests ----------------------------------------------------------

    #[test]
    fn registers_then_opens_the_sink_and_heartbeats_once_per_interval() {
        let mut f = frontend();
        assert!(!f.service.ready());
        assert_eq!(
            f.submit().unwrap_err(),
            SubmitError::SendFailed("not registered with the scheduler".into())
        );
        assert_eq!(f.node.poll_at(), None);

        let (ours, mut sched) = f.link(SCHEDULER);
        f.node.handle_scheduler_link(T0, ours);
        assert_eq!(f.node.poll_at(), Some(T0 + ms(5000)));
        // It answers the challenge with its Join (no token: no MAC).
        sched.challenge(NONCE).unwrap();
        assert!(f.poll(T0));
        let sent = sched.take_all();
        assert_eq!(sent.len(), 1);
        match wire::decode(&sent[0]) {
            Ok(Message::Join(j)) => {
                assert_eq!(j.role(), Some(Role::Frontend));
                assert_eq!((j.id, j.count, j.endpoint()), (5, 0, "mem:frontend-5"));
                assert!(!j.has_mac());
            }
            other => panic!("{other:?}"),
        }
        // Nothing until the ack; a heartbeat first is fine.
        assert!(!f.poll(T0));
        assert!(!f.node.is_registered());
        sched.put(&wire::Heartbeat {
            seq: 1,
            role: Role::Scheduler as u32,
            id: 0,
        });
        sched.put(&welcome(2));
        assert!(f.poll(T0 + MS));
        assert_eq!(f.events(), [FrontendEvent::Registered { group: 0, models: 2 }]);
        assert!(f.node.is_registered() && f.service.ready());
        assert!(f.node.stats().ready.load(Ordering::Relaxed));

        // The first heartbeat is due at once; time standing still sends no
        // second one, and an earlier `now` counts as the latest seen.
        assert_eq!(f.node.poll_at(), Some(T0 + MS));
        f.poll(T0 + MS);
        f.poll(T0 + MS);
        f.poll(T0);
        assert_eq!(sched.heartbeats(), 1);
        assert_eq!(f.node.poll_at(), Some(T0 + MS + ms(100)));
        f.poll(T0 + MS + ms(100));
        assert_eq!(sched.heartbeats(), 1);
        assert!(f.events().is_empty());
    }

    #[test]
    fn a_closed_link_a_model_mismatch_or_no_ack_in_time_is_a_refusal() {
        let mut f = frontend();
        // The scheduler hangs up: refused (duplicate id?).
        let (ours, sched) = f.link(SCHEDULER);
        f.node.handle_scheduler_link(T0, ours);
        f.poll(T0);
        drop(sched);
        f.poll(T0);
        match f.events().as_slice() {
            [FrontendEvent::Refused { why, .. }] => assert!(why.contains("refused"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert!(
            f.node.take_closed_link().is_some(),
            "the link is handed back"
        );
        assert_eq!(f.node.poll_at(), None);

        // Another model count.
        let (ours, mut sched) = f.link(SCHEDULER);
        f.node.handle_scheduler_link(T0, ours);
        sched.challenge(NONCE).unwrap();
        f.poll(T0);
        sched.put(&welcome(3));
        f.poll(T0);
        match f.events().as_slice() {
            [FrontendEvent::Refused { why, .. }] => assert!(why.contains("same --zoo"), "{why}"),
            other => panic!("{other:?}"),
        }

        // Silence after the Join: refused when the clock jumps to the
        // handshake deadline.
        let (ours, mut sched) = f.link(SCHEDULER);
        f.node.handle_scheduler_link(T0, ours);
        sched.challenge(NONCE).unwrap();
        f.poll(T0);
        assert!(sched.take_join().is_some());
        let deadline = f.node.poll_at().unwrap();
        assert_eq!(deadline, T0 + ms(5000));
        f.poll(deadline.saturating_sub(Duration::from_nanos(1)));
        assert!(f.events().is_empty());
        f.poll(deadline);
        match f.events().as_slice() {
            [FrontendEvent::Refused { why, .. }] => {
                assert!(
                    why.contains("did not acknowledge") && why.contains("5 s"),
                    "{why}"
                )
            }
            other => panic!("{other:?}"),
        }
        assert!(!f.node.is_registered() && !f.service.ready());
    }

    #[test]
    fn queued_tasks_leave_as_one_tasks_message_and_a_lone_task_as_a_task() {
        let mut f = frontend();
        let mut sched = f.registered();
        let tickets: Vec<Ticket> = (0..3).map(|_| f.submit().unwrap()).collect();
        let ids: Vec<u64> = tickets.iter().map(Ticket::task_id).collect();
        assert!(f.poll(T0));
        let raw: Vec<Vec<u8>> =
            sched.take_all().into_iter().filter(|m| !matches!(wire::decode(m), Ok(Message::Heartbeat(_)))).collect();
        assert_eq!(raw.len(), 1, "one message for the pass");
        match wire::decode(&raw[0]) {
            Ok(Message::Tasks(list)) => assert_eq!(list.iter().map(|t| t.task_id).collect::<Vec<_>>(), ids),
            other => panic!("{other:?}"),
        }
        assert_eq!(f.node.stats().tasks_sent.load(Ordering::Relaxed), 3);
        assert_eq!(f.node.stats().task_messages_sent.load(Ordering::Relaxed), 1);
        let lone = f.submit().unwrap();
        let id = lone.task_id();
        assert!(f.poll(T0));
        let raw = sched.take_all();
        assert!(matches!(wire::decode(&raw[0]), Ok(Message::Task(t)) if t.task_id == id), "a lone task is a Task");
        assert!(!f.poll(T0), "nothing staged");
    }

    #[test]
    fn a_batch_the_send_queue_has_no_room_for_stays_staged_and_leaves_once_in_order() {
        let mut f = frontend_coalescing(2, Duration::ZERO);
        let mut sched = f.registered_with_capacity(1);
        let tickets: Vec<Ticket> = (0..4).map(|_| f.submit().unwrap()).collect();
        let ids: Vec<u64> = tickets.iter().map(Ticket::task_id).collect();
        assert!(f.poll(T0));
        assert_eq!(f.node.stats().tasks_sent.load(Ordering::Relaxed), 2);
        // Still no room: nothing leaves, nothing is lost.
        f.poll(T0);
        assert_eq!(f.node.poll_at(), Some(T0 + ms(100)), "a full queue sets no timer (the heartbeat's)");
        assert_eq!(ids_of(&sched.task_messages()), [ids[..2].to_vec()]);
        assert!(f.poll(T0));
        assert_eq!(ids_of(&sched.task_messages()), [ids[2..].to_vec()]);
        assert_eq!(f.node.stats().tasks_sent.load(Ordering::Relaxed), 4);
        assert_eq!(f.node.stats().task_messages_sent.load(Ordering::Relaxed), 2, "a refused message is not counted");
        assert!(!f.poll(T0));
        assert!(sched.tasks().is_empty(), "each task once");
    }

    fn ids_of(msgs: &[Vec<Task>]) -> Vec<Vec<u64>> {
        msgs.iter().map(|m| m.iter().map(|t| t.task_id).collect()).collect()
    }

    #[test]
    fn with_a_hold_window_a_part_batch_waits_for_it_and_a_full_one_does_not() {
        let wait = Duration::from_micros(50);
        let mut f = frontend_coalescing(3, wait);
        let mut sched = f.registered();
        let ta = f.submit().unwrap();
        let a = ta.task_id();
        f.poll(T0);
        assert!(sched.tasks().is_empty(), "held for the window");
        assert_eq!(f.node.poll_at(), Some(T0 + wait));
        let tb = f.submit().unwrap();
        let b = tb.task_id();
        f.poll(T0 + Duration::from_micros(20));
        assert!(sched.tasks().is_empty(), "the window counts from the oldest");
        assert_eq!(f.node.poll_at(), Some(T0 + wait));
        assert!(f.poll(T0 + wait));
        assert_eq!(ids_of(&sched.task_messages()), [vec![a, b]]);
        assert_eq!(f.node.poll_at(), Some(T0 + ms(100)), "no window without staged tasks");
        let tickets: Vec<Ticket> = (0..3).map(|_| f.submit().unwrap()).collect();
        let ids: Vec<u64> = tickets.iter().map(Ticket::task_id).collect();
        assert!(f.poll(T0 + wait));
        assert_eq!(sched.tasks().iter().map(|t| t.task_id).collect::<Vec<_>>(), ids, "a full batch leaves at once");
    }

    #[test]
    fn a_task_goes_out_and_its_drop_reaches_the_ticket() {
        let mut f = frontend();
        let mut sched = f.registered();
        let mut ticket = f.submit().unwrap();
        assert!(f.node.has_queued_tasks());
        assert!(f.poll(T0));
        let tasks = sched.tasks();
        assert_eq!(tasks.len(), 1);
        assert_eq!(tasks[0].task_id, ticket.task_id());
        assert_eq!((tasks[0].model_id, tasks[0].frontend_id), (0, 5));
        assert_eq!(f.node.stats().tasks_sent.load(Ordering::Relaxed), 1);
        assert!(poll_now(&mut ticket).is_pending());

        sched.put(&wire::Dropped {
            task_id: ticket.task_id(),
            reason: DropReason::Overloaded as u32,
            reserved: 0,
        });
        assert!(f.poll(T0));
        assert_eq!(
            poll_now(&mut ticket),
            Poll::Ready(Outcome::Dropped(DropReason::Overloaded))
        );
        let c = f.service.counters();
        assert!(c.balanced() && (c.accepted, c.dropped) == (1, 1), "{c:?}");
    }

    #[test]
    fn a_cancel_answers_at_once_goes_to_the_scheduler_and_the_slot_frees_with_the_outcome() {
        let mut f = frontend();
        let mut sched = f.registered();
        let mut queued = f.submit().unwrap();
        let mut planned = f.submit().unwrap();
        assert!(f.poll(T0));
        assert_eq!(sched.tasks().len(), 2);

        assert!(f.service.sink().cancel(&mut queued));
        assert_eq!(
            poll_now(&mut queued),
            Poll::Ready(Outcome::Dropped(DropReason::Cancelled))
        );
        assert!(f.node.has_queued_tasks());
        assert!(f.poll(T0));
        let cancels: Vec<u64> = sched
            .take_all()
            .iter()
            .filter_map(|m| match wire::decode(m) {
                Ok(Message::Cancel(c)) => Some(c.task_id),
                _ => None,
            })
            .collect();
        assert_eq!(cancels, [queued.task_id()]);
        assert_eq!(f.node.stats().cancels_sent.load(Ordering::Relaxed), 1);
        // The slot is held until the scheduler's answer (a backend might
        // still READ it), which is then discarded.
        assert_eq!(f.node.staging().in_flight(), 2);
        sched.put(&wire::Dropped {
            task_id: queued.task_id(),
            reason: DropReason::Cancelled as u32,
            reserved: 0,
        });
        assert!(f.poll(T0));
        assert_eq!(f.node.staging().in_flight(), 1);

        // Already planned: the backend's result comes and is discarded.
        let mut backend = f.backend(T0, 9);
        assert!(f.service.sink().cancel(&mut planned));
        backend.put_completion(planned.task_id(), b"output");
        f.poll(T0);
        assert_eq!(f.node.staging().in_flight(), 0);
        let c = f.service.counters();
        assert!(c.balanced(), "{c:?}");
        assert_eq!((c.accepted, c.cancelled, c.succeeded, c.dropped, c.late), (2, 2, 0, 0, 0), "{c:?}");

        // Too late to cancel: the outcome is already here and still yields.
        let mut done = f.submit().unwrap();
        f.poll(T0);
        sched.put(&wire::Dropped {
            task_id: done.task_id(),
            reason: DropReason::Overloaded as u32,
            reserved: 0,
        });
        f.poll(T0);
        assert!(!f.service.sink().cancel(&mut done));
        assert_eq!(
            poll_now(&mut done),
            Poll::Ready(Outcome::Dropped(DropReason::Overloaded))
        );
        assert!(f.service.counters().balanced());
    }

    #[test]
    fn a_backend_completion_is_delivered_once_and_a_duplicate_is_counted() {
        let mut f = frontend();
        let mut sched = f.registered();
        let mut backend = f.backend(T0, 9);
        assert_eq!(f.events(), [FrontendEvent::BackendJoined(9)]);
        assert_eq!(f.node.stats().backends.load(Ordering::Relaxed), 1);

        let mut ticket = f.submit().unwrap();
        f.poll(T0);
        let id = sched.tasks()[0].task_id;
        // Delivered twice by the network: one outcome, one duplicate.
        backend.put_completion(id, b"output");
        backend.put_completion(id, b"output");
        assert!(f.poll(T0));
        assert_eq!(
            poll_now(&mut ticket),
            Poll::Ready(Outcome::Ok(b"output".to_vec()))
        );
        drop(ticket);
        // A third copy after the slot is free names nothing in flight.
        backend.put_completion(id, b"output");
        f.poll(T0);
        let c = f.service.counters();
        assert_eq!(
            (c.accepted, c.succeeded, c.duplicates, c.unroutable),
            (1, 1, 1, 1),
            "{c:?}"
        );
        assert!(c.balanced());
        assert_eq!(f.node.stats().bad_messages.load(Ordering::Relaxed), 0);
        assert!(f.events().is_empty());
    }

    #[test]
    fn with_failover_requests_outlive_the_scheduler_and_are_resent_with_the_budget_left() {
        let mut f = frontend();
        f.node = std::mem::replace(&mut f.node, frontend().node).with_failover(true);
        assert!(f.node.failover());
        let sched = f.registered();
        let mut sent: Vec<Ticket> = (0..2).map(|_| f.submit().unwrap()).collect();
        f.poll(T0);
        let cancelled = f.submit().unwrap();
        f.poll(T0);
        drop(cancelled); // its client has gone: never resent
        let queued = f.submit().unwrap(); // not sent yet
        drop(sched);
        assert!(f.poll(T0 + MS));
        assert!(matches!(
            f.events().as_slice(),
            [FrontendEvent::SchedulerLost { why, .. }] if why.contains("sending a task")
        ));
        assert!(f.node.take_closed_link().is_some());
        assert!(!f.service.ready(), "not ready while no scheduler is linked");
        for t in &mut sent {
            assert_eq!(poll_now(t), Poll::Pending, "held, not ended");
        }
        // Taken while the scheduler is away; held too.
        let during = f.submit().unwrap();
        f.poll(T0 + ms(2));
        assert!(f.node.poll_at().is_some(), "the sweep is timed");
        let back = T0 + ms(100);
        let mut sched = f.registered_at(back);
        assert!(f.service.ready());
        f.poll(back);
        let resent = sched.tasks();
        let ids: Vec<u64> = resent.iter().map(|t| t.task_id).collect();
        let want: Vec<u64> = [&sent[0], &sent[1], &queued, &during].iter().map(|t| t.task_id()).collect();
        assert_eq!(ids.len(), 4, "{resent:?}");
        for id in &want {
            assert!(ids.contains(id), "{id:x} resent");
        }
        let first = resent.iter().find(|t| t.task_id == want[0]).unwrap();
        let late = resent.iter().find(|t| t.task_id == want[3]).unwrap();
        assert!(first.budget_ns < late.budget_ns, "the budget left counts from the first send");
        assert!(first.budget_ns <= ms(400).as_nanos() - ms(100).as_nanos());
        let c = f.service.counters();
        // The request given up is ended (freeing its slot), not resent.
        assert_eq!((c.accepted, c.dropped, c.failed), (5, 1, 0), "{c:?}");
    }

    // ---- scheduler groups (issue 19) -------------------------------------

    fn grouped() -> Frontend {
        let mut f = frontend();
        f.node = std::mem::replace(&mut f.node, frontend().node).with_groups(2);
        assert!(f.node.failover(), "groups imply holding tasks");
        f
    }

    /// A group's `moved` answer to submission `attempt` of `task_id`.
    fn moved(task_id: u64, attempt: u16) -> wire::Dropped {
        wire::Dropped { task_id, reason: DropReason::Moved as u32, reserved: u32::from(attempt) }
    }

    #[test]
    fn with_groups_each_task_goes_to_its_owner_and_a_moved_one_is_resubmitted_with_the_budget_left() {
        let mut f = grouped();
        assert!(f.node.handle_routes(1, &[Some(0), Some(1)]));
        assert!(!f.node.handle_routes(1, &[Some(1), Some(1)]), "the same revision again is ignored");
        let mut a = f.registered_group(T0, 0);
        let mut b = f.registered_group(T0, 1);
        let (mut t0, t1) = (f.submit_model(0), f.submit_model(1));
        f.poll(T0);
        assert_eq!(a.tasks().iter().map(|t| t.task_id).collect::<Vec<_>>(), [t0.task_id()]);
        assert_eq!(b.tasks().iter().map(|t| t.task_id).collect::<Vec<_>>(), [t1.task_id()]);
        // Model 0 moves to group 1; group 0 hands its task back.
        let at = T0 + ms(10);
        assert!(f.node.handle_routes(2, &[Some(1), Some(1)]));
        a.put(&moved(t0.task_id(), 0));
        f.poll(at);
        f.poll(at);
        assert!(poll_now(&mut t0).is_pending(), "taken back, not ended");
        let resent = b.tasks();
        assert_eq!(resent.len(), 1, "{resent:?}");
        assert_eq!(resent[0].task_id, t0.task_id());
        assert_eq!(resent[0].budget_ns, ms(390).as_nanos(), "the budget left, same deadline");
        assert!(a.tasks().is_empty());
        assert_eq!(f.node.stats().moved_taken_back.load(Ordering::Relaxed), 1);
        assert!(!f.node.take_stale_table(), "sent by an older table: this one is not stale");
        // Its new owner answers: the one outcome reaches the ticket.
        b.put(&wire::Dropped { task_id: t0.task_id(), reason: DropReason::Overloaded as u32, reserved: 0 });
        f.poll(at);
        assert_eq!(poll_now(&mut t0), Poll::Ready(Outcome::Dropped(DropReason::Overloaded)));
        // New tasks of model 0 now go to group 1.
        let t2 = f.submit_model(0);
        f.poll(at);
        assert_eq!(b.tasks().iter().map(|t| t.task_id).collect::<Vec<_>>(), [t2.task_id()]);
    }

    #[test]
    fn with_groups_each_group_gets_one_batch_and_a_task_of_a_batch_answered_moved_is_resubmitted_alone() {
        let mut f = grouped();
        assert!(f.node.handle_routes(1, &[Some(0), Some(1)]));
        let mut a = f.registered_group(T0, 0);
        let mut b = f.registered_group(T0, 1);
        let mut t = [f.submit_model(0), f.submit_model(1), f.submit_model(0), f.submit_model(1)];
        f.poll(T0);
        let ids = |x: &[usize], t: &[Ticket]| vec![x.iter().map(|&i| t[i].task_id()).collect::<Vec<_>>()];
        assert_eq!(ids_of(&a.task_messages()), ids(&[0, 2], &t), "one batch per group, in order");
        assert_eq!(ids_of(&b.task_messages()), ids(&[1, 3], &t));
        // Model 0 moves to group 1; group 0 hands back one task of its batch.
        let at = T0 + ms(10);
        assert!(f.node.handle_routes(2, &[Some(1), Some(1)]));
        a.put(&moved(t[2].task_id(), 0));
        f.poll(at);
        f.poll(at);
        assert!(poll_now(&mut t[2]).is_pending(), "taken back, not ended");
        assert_eq!(ids_of(&b.task_messages()), ids(&[2], &t), "only the task handed back");
        assert!(a.tasks().is_empty());
        assert_eq!(f.node.stats().moved_taken_back.load(Ordering::Relaxed), 1);
        assert_eq!(f.node.stats().tasks_sent.load(Ordering::Relaxed), 5);
    }

    #[test]
    fn with_groups_a_task_refused_by_the_owner_its_table_names_waits_for_a_change_or_its_retry_then_its_deadline() {
        let mut f = grouped();
        f.node.handle_routes(1, &[Some(0), Some(1)]);
        let mut a = f.registered_group(T0, 0);
        let mut b = f.registered_group(T0, 1);
        let mut t0 = f.submit_model(0);
        f.poll(T0);
        assert_eq!(a.tasks().len(), 1);
        // Group 0 says moved, but the frontend's table (revision 1) still
        // names it: nothing goes out before the retry time...
        a.put(&moved(t0.task_id(), 0));
        f.poll(T0);
        assert!(f.node.take_stale_table(), "the host may read the table now");
        assert!(!f.node.take_stale_table(), "once");
        f.poll(T0 + ms(2));
        assert!(a.tasks().is_empty() && b.tasks().is_empty());
        // ...then it is offered to the owner again (the owner may have
        // applied the revision late).
        let retry = T0 + MOVED_RETRY + ms(10);
        f.poll(retry);
        f.poll(retry);
        assert_eq!(a.tasks().iter().map(|t| t.task_id).collect::<Vec<_>>(), [t0.task_id()]);
        // Refused again; a new table sends it to group 1 at once.
        a.put(&moved(t0.task_id(), 1));
        f.poll(retry);
        assert!(f.node.handle_routes(2, &[Some(1), Some(1)]));
        f.poll(retry);
        f.poll(retry);
        assert_eq!(b.tasks().iter().map(|t| t.task_id).collect::<Vec<_>>(), [t0.task_id()]);
        b.put(&wire::Dropped { task_id: t0.task_id(), reason: DropReason::Overloaded as u32, reserved: 0 });
        f.poll(retry);
        assert_eq!(poll_now(&mut t0), Poll::Ready(Outcome::Dropped(DropReason::Overloaded)));
        // A group that keeps refusing: the task is offered again every
        // retry until its deadline, then ends as dropped `moved`, once.
        let mut t1 = f.submit_model(1);
        let mut at = retry;
        let mut offers = 0;
        while at < retry + ms(500) {
            f.poll(at);
            for t in b.tasks() {
                assert_eq!(t.task_id, t1.task_id());
                offers += 1;
                b.put(&moved(t.task_id, t.attempt()));
            }
            at += ms(5);
        }
        assert!((20..=100).contains(&offers), "{offers} offers in 400 ms");
        assert_eq!(poll_now(&mut t1), Poll::Ready(Outcome::Dropped(DropReason::Moved)));
        let c = f.service.counters();
        assert!(c.balanced(), "{c:?}");
    }

    #[test]
    fn with_groups_losing_one_group_holds_its_tasks_for_its_next_link_and_cancels_go_to_the_tasks_group() {
        let mut f = grouped();
        // Before the first table, tasks wait (the sink opens at the first
        // registration).
        let mut a = f.registered_group(T0, 0);
        let early = f.submit_model(0);
        f.poll(T0);
        assert!(a.tasks().is_empty(), "no table yet");
        f.node.handle_routes(1, &[Some(0), Some(1)]);
        f.poll(T0);
        assert_eq!(a.tasks().iter().map(|t| t.task_id).collect::<Vec<_>>(), [early.task_id()]);
        let b = f.registered_group(T0, 1);
        let mut t1 = f.submit_model(1);
        f.poll(T0);
        drop(b);
        let t0 = f.submit_model(0);
        f.poll(T0 + MS);
        assert!(matches!(f.events().as_slice(), [FrontendEvent::SchedulerLost { group: 1, .. }]));
        assert!(f.service.ready(), "group 0 still serves");
        assert_eq!(a.tasks().iter().map(|t| t.task_id).collect::<Vec<_>>(), [t0.task_id()]);
        assert!(poll_now(&mut t1).is_pending(), "held for group 1");
        let mut b = f.registered_group(T0 + ms(50), 1);
        f.poll(T0 + ms(50));
        let resent = b.tasks();
        assert_eq!(resent.iter().map(|t| t.task_id).collect::<Vec<_>>(), [t1.task_id()]);
        assert_eq!(resent[0].budget_ns, ms(350).as_nanos());
        // A cancel goes to the group that has the task.
        let mut t0 = t0;
        assert!(f.service.cancel(&mut t0));
        f.poll(T0 + ms(50));
        let cancels = |p: &mut SimPeer| p.take_all().iter().filter(|m| matches!(wire::decode(m), Ok(Message::Cancel(_)))).count();
        assert_eq!((cancels(&mut a), cancels(&mut b)), (1, 0));
        assert_eq!(f.node.stats().cancels_sent.load(Ordering::Relaxed), 1);
    }

    /// A group the table adds after the start: the node grows a link for
    /// it, and tasks of a model the table gives it wait for that link.
    #[test]
    fn with_groups_a_group_added_later_gets_a_link_and_its_models_tasks() {
        let mut f = grouped();
        assert!(f.node.handle_routes(1, &[Some(0), Some(0)]));
        let mut a = f.registered_group(T0, 0);
        assert_eq!(f.node.add_group(), Some(2));
        assert_eq!(f.node.groups(), 3);
        assert!(f.node.handle_routes(2, &[Some(0), Some(2)]));
        let (t0, t1) = (f.submit_model(0), f.submit_model(1));
        f.poll(T0);
        assert_eq!(a.tasks().iter().map(|x| x.task_id).collect::<Vec<_>>(), [t0.task_id()]);
        let at = T0 + ms(5);
        let mut c = f.registered_group(at, 2);
        f.poll(at);
        assert_eq!(c.tasks().iter().map(|x| x.task_id).collect::<Vec<_>>(), [t1.task_id()], "held until the new group's link registered");
        let mut plain = frontend();
        assert_eq!(plain.node.add_group(), None, "without groups there is one scheduler");
        plain.poll(T0);
    }

    /// A task at a group whose link is lost goes back to that group, not
    /// to the model's new owner: the lost scheduler may have sent it in a
    /// batch its group's backends still run. Only that group's `moved`
    /// sends it on.
    #[test]
    fn with_groups_a_task_lost_with_its_groups_link_goes_back_to_that_group_even_after_its_model_moved() {
        let mut f = grouped();
        assert!(f.node.handle_routes(1, &[Some(0), Some(1)]));
        let a = f.registered_group(T0, 0);
        let mut b = f.registered_group(T0, 1);
        let mut t = f.submit_model(0);
        f.poll(T0);
        drop(a);
        assert!(f.node.handle_routes(2, &[Some(1), Some(1)]), "model 0 moves to group 1");
        for i in 1..=20 {
            f.poll(T0 + ms(i));
        }
        assert!(b.tasks().is_empty(), "not sent to the new owner while its group's link is down");
        assert!(poll_now(&mut t).is_pending(), "held");
        assert!(matches!(f.events().as_slice(), [FrontendEvent::SchedulerLost { group: 0, .. }]));
        let at = T0 + ms(30);
        let mut a = f.registered_group(at, 0);
        f.poll(at);
        let resent = a.tasks();
        assert_eq!(resent.iter().map(|x| (x.task_id, x.attempt())).collect::<Vec<_>>(), [(t.task_id(), 1)], "back to its group, as its next attempt");
        // A copy of an answer to the first attempt is stale: ignored.
        a.put(&moved(t.task_id(), 0));
        f.poll(at);
        f.poll(at);
        assert!(b.tasks().is_empty() && poll_now(&mut t).is_pending());
        // Group 0's next scheduler does not own model 0 any more: its
        // `moved` sends the task to group 1.
        a.put(&moved(t.task_id(), 1));
        f.poll(at);
        f.poll(at);
        assert!(!f.node.take_stale_table(), "its table names another group: not stale");
        assert_eq!(b.tasks().iter().map(|x| x.task_id).collect::<Vec<_>>(), [t.task_id()]);
        // A new task of model 0 goes to its owner at once.
        let t2 = f.submit_model(0);
        f.poll(at);
        assert_eq!(b.tasks().iter().map(|x| x.task_id).collect::<Vec<_>>(), [t2.task_id()]);
        assert!(a.tasks().is_empty());
    }

    #[test]
    fn with_failover_a_request_that_cannot_be_held_within_its_deadline_is_answered_overloaded() {
        let mut f = frontend();
        f.node = std::mem::replace(&mut f.node, frontend().node).with_failover(true);
        let sched = f.registered();
        let mut t = f.submit().unwrap();
        f.poll(T0);
        drop(sched);
        f.poll(T0 + MS);
        assert_eq!(poll_now(&mut t), Poll::Pending);
        let mut now = T0 + MS;
        let outcome = loop {
            if let Poll::Ready(o) = poll_now(&mut t) {
                break o;
            }
            assert!(now < T0 + ms(1000), "never answered");
            now = f.node.poll_at().unwrap();
            f.poll(now);
        };
        assert_eq!(outcome, Outcome::Dropped(DropReason::Overloaded));
        assert!(now <= T0 + ms(400) + HOLD_SWEEP + MS, "answered within a sweep of its deadline: {now:?}");
        let c = f.service.counters();
        assert!(c.balanced(), "{c:?}");
        assert_eq!(f.node.staging().in_flight(), 0);
    }

    #[test]
    fn losing_the_scheduler_ends_every_request_in_flight_once() {
        let mut f = frontend();
        let sched = f.registered();
        let mut sent: Vec<Ticket> = (0..2).map(|_| f.submit().unwrap()).collect();
        f.poll(T0);
        let orphan = f.submit().unwrap();
        f.poll(T0);
        drop(orphan); // its client has gone
        let mut queued = f.submit().unwrap(); // not sent yet
        drop(sched);

        // The queued task's send finds the link gone.
        assert!(f.poll(T0 + MS));
        assert!(matches!(
            f.events().as_slice(),
            [FrontendEvent::SchedulerLost { why, .. }] if why.contains("sending a task")
        ));
        for t in sent.iter_mut().chain([&mut queued]) {
            assert_eq!(
                poll_now(t),
                Poll::Ready(Outcome::Dropped(DropReason::Shutdown))
            );
        }
        let c = f.service.counters();
        assert_eq!((c.accepted, c.dropped, c.duplicates), (4, 4, 0), "{c:?}");
        assert!(c.balanced());
        assert!(f.node.take_closed_link().is_some());

        // Nothing more happens: no second event, no second outcome; new
        // requests are refused at once.
        f.poll(T0 + ms(5000));
        assert!(f.events().is_empty());
        assert!(!f.node.is_registered() && !f.service.ready());
        assert_eq!(f.node.poll_at(), None);
        assert!(matches!(f.submit(), Err(SubmitError::SendFailed(_))));
        let c = f.service.counters();
        assert_eq!((c.accepted, c.dropped, c.failed), (5, 4, 1), "{c:?}");
        assert!(c.balanced());
        assert_eq!(f.node.staging().in_flight(), 0);
    }

    #[test]
    fn a_silent_scheduler_is_lost_just_past_the_timeout_on_a_jumping_clock() {
        let mut f = frontend();
        let mut sched = f.registered();
        let mut ticket = f.submit().unwrap();
        // Jump from deadline to deadline, as a virtual clock does.
        let mut polls = 0;
        let lost_at = loop {
            let at = f.node.poll_at().expect("a timer while registered");
            f.poll(at);
            polls += 1;
            if !f.events().is_empty() {
                break at;
            }
            assert!(polls < 100);
        };
        assert_eq!(lost_at, T0 + ms(1000) + Duration::from_nanos(1));
        // Heartbeats at 0, 100, ..., 1000 ms.
        assert_eq!(sched.heartbeats(), 11);
        assert_eq!(
            poll_now(&mut ticket),
            Poll::Ready(Outcome::Dropped(DropReason::Shutdown))
        );
        assert!(!f.node.is_registered());
    }

    #[test]
    fn data_links_must_register_as_backends_in_time() {
        // (No scheduler link: its liveness would end it as the clock jumps.)
        let mut f = frontend();
        // Registers as something else.
        let (ours, mut other) = f.link(PEER);
        f.node.handle_backend_link(T0, ours);
        other.put(&Register::new(Role::Frontend, 1, 0, ""));
        // Sends something else first.
        let (ours, mut chatty) = f.link(PEER);
        f.node.handle_backend_link(T0, ours);
        chatty.put(&wire::Heartbeat {
            seq: 1,
            role: Role::Backend as u32,
            id: 3,
        });
        f.poll(T0);
        let why: Vec<String> = f
            .events()
            .into_iter()
            .map(|e| match e {
                FrontendEvent::LinkRefused { why } => why,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(why.len(), 2);
        assert!(why.iter().any(|w| w.contains("not a backend")), "{why:?}");
        assert!(
            why.iter().any(|w| w.contains("without Register")),
            "{why:?}"
        );
        assert_eq!(
            std::iter::from_fn(|| f.node.take_closed_link()).count(),
            2,
            "refused links are handed back"
        );

        // Silent: refused at its handshake deadline.
        let (ours, _silent) = f.link(PEER);
        f.node.handle_backend_link(T0 + MS, ours);
        let mut n = 0;
        f.node.for_each_conn(|_| n += 1);
        assert_eq!(n, 1, "the silent link");
        f.poll(T0 + ms(5000));
        assert!(f.events().is_empty(), "not yet");
        f.poll(T0 + MS + ms(5000));
        assert!(matches!(
            f.events().as_slice(),
            [FrontendEvent::LinkRefused { why }] if why.contains("without Register")
        ));

        // A backend that reconnects replaces its old link; one that sends
        // garbage is lost.
        let _old = f.backend(T0, 9);
        let mut new = f.backend(T0, 9);
        assert_eq!(
            f.events(),
            [
                FrontendEvent::BackendJoined(9),
                FrontendEvent::BackendJoined(9)
            ]
        );
        assert!(f.node.take_closed_link().is_some(), "the replaced link");
        assert_eq!(f.node.stats().backends.load(Ordering::Relaxed), 1);
        new.link.send(&[0xff; 16]).unwrap();
        f.poll(T0);
        assert!(matches!(
            f.events().as_slice(),
            [FrontendEvent::BackendLost { id: 9, why }] if why.contains("malformed")
        ));
        let s = f.node.stats();
        assert_eq!(s.backends.load(Ordering::Relaxed), 0);
        assert_eq!(s.backends_lost.load(Ordering::Relaxed), 1);
        assert_eq!(s.bad_messages.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_drain_sends_what_is_queued_then_shutdown_ends_the_rest() {
        let mut f = frontend();
        let mut sched = f.registered();
        let mut first = f.submit().unwrap();
        let mut second = f.submit().unwrap();
        f.node.begin_drain();
        assert!(!f.service.ready());
        assert_eq!(
            f.submit().unwrap_err(),
            SubmitError::SendFailed("the frontend is shutting down".into())
        );
        assert!(!f.node.drained());
        f.poll(T0);
        let tasks = sched.tasks();
        assert_eq!(tasks.len(), 2, "queued tasks still go out");
        sched.put(&wire::Dropped {
            task_id: tasks[0].task_id,
            reason: DropReason::Overloaded as u32,
            reserved: 0,
        });
        f.poll(T0);
        assert_eq!(
            poll_now(&mut first),
            Poll::Ready(Outcome::Dropped(DropReason::Overloaded))
        );
        assert!(!f.node.drained(), "one request is still in flight");
        f.node.shutdown();
        assert_eq!(
            poll_now(&mut second),
            Poll::Ready(Outcome::Dropped(DropReason::Shutdown))
        );
        assert!(f.node.drained());
        let c = f.service.counters();
        assert!(c.balanced() && c.accepted == 3 && c.failed == 1, "{c:?}");
        assert_eq!(f.node.into_links().len(), 1, "the scheduler link");
    }
}
