//! The backend daemon as a sans-IO node: a [`BatchWorker`] plus the
//! registration with the scheduler, frontend announcements, data links to
//! frontends, heartbeats, the scheduler's liveness, the graceful leave
//! (a drain the scheduler agrees to) and the shutdown drain.
//! Like the worker it never reads a clock, sleeps, spawns a thread or
//! connects: it is given `now` (real or virtual, possibly jumping), does
//! bounded work per [`poll`](BackendNode::poll), says when time alone next
//! makes progress ([`poll_at`](BackendNode::poll_at)) and asks the host
//! for what it cannot do itself through
//! [`poll_event`](BackendNode::poll_event) (open a data link to a
//! frontend: [`BackendEvent::ConnectFrontend`], answered with
//! [`handle_frontend_link`](BackendNode::handle_frontend_link)).

use std::collections::VecDeque;

use dataplane::control::Liveness;
use dataplane::join::{HandshakeNonces as Nonces, JoinToken, NonceSource, PeerProof, DATA_LINK_LABEL};
use dataplane::time::{Duration, Instant};
use dataplane::transport::{Connection, Error};
use dataplane::wire::{self, Join, Message, Register, Role, WireError};

use crate::exec::Executor;
use crate::worker::{BatchWorker, ControlMessage, FenceReason, FencedPlan, WorkerError, EARLY_CAPACITY};

/// Identity and timing of a [`BackendNode`].
#[derive(Clone, Debug)]
pub struct BackendNodeConfig {
    /// Backend id.
    pub id: u32,
    /// GPUs (the executor's devices).
    pub gpus: u32,
    /// Global ids of the models this backend holds.
    pub served: Vec<u32>,
    /// Models in the cluster list (the scheduler's ack must agree).
    pub cluster_models: u32,
    /// Frontend ids must be below this.
    pub max_frontends: u32,
    /// Heartbeat interval.
    pub heartbeat: Duration,
    /// Scheduler silence that makes it dead.
    pub dead_after: Duration,
    /// Registration must be acknowledged within this.
    pub handshake_timeout: Duration,
    /// How long a new link to a frontend waits for the old one's READs
    /// before it replaces it anyway.
    pub replace_timeout: Duration,
    /// Longest wait for the batches in hand when draining.
    pub drain_timeout: Duration,
}

/// What happened, for the host to act on or log (the `Display` text is the
/// daemon's log line without its prefix).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendEvent {
    /// The scheduler acknowledged the registration.
    Registered,
    /// The registration failed (why); the node does nothing more.
    Refused {
        /// Why.
        why: String,
    },
    /// Open a data link to this frontend and hand it over with
    /// [`BackendNode::handle_frontend_link`].
    ConnectFrontend {
        /// Frontend id.
        id: u32,
        /// Its data endpoint.
        endpoint: String,
    },
    /// The join gate: the data links to the frontends the scheduler
    /// announced at the registration are up (or the bound passed with
    /// `missing` of them not linked); the scheduler was told, and puts the
    /// GPUs into matchmaking.
    Ready {
        /// From the scheduler's request to the report.
        after: Duration,
        /// Frontends announced then that are not linked (waited for up
        /// to the handshake timeout).
        missing: usize,
    },
    /// A scheduler message the node ignores (why).
    Ignored {
        /// Why.
        why: String,
    },
    /// A data link to a frontend is in use.
    FrontendConnected {
        /// Frontend id.
        id: u32,
        /// It replaced an earlier link.
        replaced: bool,
    },
    /// A data link could not be used (why): counted as a failed connect.
    FrontendUnreachable {
        /// Why.
        why: String,
    },
    /// A frontend's data link went down (its tasks fail until the
    /// scheduler announces it again).
    FrontendLost(u32),
    /// The scheduler is gone (why); the node drains.
    SchedulerLost {
        /// Why.
        why: String,
    },
    /// Leaving: the scheduler released this backend (its GPUs are out of
    /// matchmaking and nothing planned to it is in flight); it drains what
    /// it still holds and leaves.
    Released,
    /// Leaving: no release from the scheduler within the drain bound; the
    /// backend leaves anyway (the scheduler fails back what it planned
    /// here and this backend did not run).
    LeaveUnanswered {
        /// The bound.
        after: Duration,
    },
    /// The drain bound passed with batches still in hand.
    DrainTimedOut {
        /// Batches left.
        in_hand: usize,
        /// The bound.
        after: Duration,
    },
    /// A plan was not executed because of its epoch (counted in the
    /// worker's `stale_plans` / `superseded_batches`).
    Fenced(FencedPlan),
    /// The node cannot go on (the executor refused a checked batch: a bug).
    Failed(ExecutorFailure),
}

/// The executor's error behind [`BackendEvent::Failed`]: shared, because
/// events are `Clone`, and compared by its text, because events are compared
/// in tests and an executor error is not `PartialEq`.
#[derive(Clone, Debug)]
pub struct ExecutorFailure(pub std::sync::Arc<crate::exec::ExecError>);

impl PartialEq for ExecutorFailure {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string()
    }
}

impl Eq for ExecutorFailure {}

impl std::fmt::Display for BackendEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackendEvent::Registered => write!(f, "registered"),
            BackendEvent::Refused { why }
            | BackendEvent::Ignored { why }
            | BackendEvent::FrontendUnreachable { why }
            | BackendEvent::SchedulerLost { why } => write!(f, "{why}"),
            BackendEvent::Failed(ExecutorFailure(e)) => write!(f, "executor: {e}"),
            BackendEvent::ConnectFrontend { id, endpoint } => {
                write!(f, "frontend {id} announced at '{endpoint}'; connecting")
            }
            BackendEvent::FrontendConnected { id, replaced } => write!(
                f,
                "data connection to frontend {id} open{}",
                if *replaced { " (replaced the previous one)" } else { "" }
            ),
            BackendEvent::FrontendLost(id) => write!(f, "data connection to frontend {id} lost"),
            BackendEvent::Ready { after, missing: 0 } => write!(
                f,
                "data links to every announced frontend are up; told the scheduler, its GPUs join matchmaking (ready_ms={:.3})",
                after.as_secs_f64() * 1e3
            ),
            BackendEvent::Ready { after, missing } => write!(
                f,
                "{missing} announced frontends still have no data link after {:.0} ms; told the scheduler ready anyway, its GPUs join matchmaking",
                after.as_secs_f64() * 1e3
            ),
            BackendEvent::Fenced(p) => match p.reason {
                FenceReason::StaleEpoch => write!(
                    f,
                    "refused batch {} of epoch {}: epoch {} was seen already",
                    p.batch_id, p.epoch, p.newest
                ),
                FenceReason::Superseded => write!(
                    f,
                    "dropped batch {} of epoch {} unstarted: a scheduler of epoch {} leads now",
                    p.batch_id, p.epoch, p.newest
                ),
            },
            BackendEvent::Released => write!(
                f,
                "the scheduler released this backend: its GPUs are out of matchmaking and every batch planned here was reported; leaving"
            ),
            BackendEvent::LeaveUnanswered { after } => write!(
                f,
                "no release from the scheduler within {} ms of the drain notice; leaving anyway (it fails back what it planned here)",
                after.as_nanos() / 1_000_000
            ),
            BackendEvent::DrainTimedOut { in_hand, after } => write!(
                f,
                "{in_hand} batches still in hand after {} ms; leaving them",
                after.as_nanos() / 1_000_000
            ),
        }
    }
}

/// The control delay bound a registered backend uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControlDelay {
    /// The bound subtracted from every plan's `exec_in`.
    pub bound: Duration,
    /// What the scheduler announced in its `Welcome`.
    pub announced: Duration,
    /// Whether `bound` is this backend's explicit override (else it is the
    /// announced one).
    pub overridden: bool,
}

impl std::fmt::Display for ControlDelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let us = |d: Duration| d.as_nanos() / 1000;
        if self.overridden {
            write!(
                f,
                "control delay bound {} µs (--control-delay-us override; the scheduler announced {} µs)",
                us(self.bound),
                us(self.announced)
            )
        } else {
            write!(f, "control delay bound {} µs (announced by the scheduler)", us(self.bound))
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Waiting for the scheduler's Challenge (since the first poll).
    AwaitChallenge { since: Option<Instant> },
    /// Join (then Models) to send, answering the challenge (`nonces`: its
    /// nonce and ours); how many went out.
    Hello {
        sent: u8,
        nonces: Nonces,
        since: Instant,
    },
    /// Waiting for the scheduler's ack since then; its MAC must cover
    /// `nonces`.
    AwaitAck { since: Instant, nonces: Nonces },
    Serving,
    /// With failover, the scheduler was lost (or refused us again): the
    /// batches in hand carry on while the host finds a scheduler.
    Lost,
    /// Refused or failed: nothing more happens.
    Done,
}

/// The join gate (see [`wire::Drain`]): the scheduler asks, once it has
/// announced every frontend, to be told when the data links to them are
/// up; its GPUs serve from then on.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Gate {
    /// Not asked (or answered).
    Open,
    /// Asked: these frontends must be linked; from `since` (the first poll
    /// after the request), up to the handshake timeout.
    Asked { frontends: Vec<u32>, since: Option<Instant> },
}

/// A graceful leave (see [`BackendNode::begin_leave`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Leave {
    /// Not leaving.
    No,
    /// The scheduler is told (again at `next_notice`, until released) and
    /// plans still run; at `until` the backend leaves unreleased.
    Asked { next_notice: Instant, until: Instant },
    /// Released: draining what is still in hand.
    Released,
    /// Not released (the bound passed, or the scheduler was lost or the
    /// node drained for another reason): draining.
    GaveUp,
}

/// A frontend link in use, with a key no other link of this node has (a
/// new link may reuse a replaced one's fd number).
#[derive(Clone, Copy, Debug)]
struct Installed {
    frontend: u32,
    key: u64,
    lost: bool,
}

/// A frontend link the host opened, not yet in use.
struct PendingFrontend<C> {
    frontend: u32,
    conn: C,
    /// Used even if the frontend's old link still has READs outstanding
    /// from then on.
    replace_at: Instant,
    /// With a join token: the frontend's `Challenge` must come by then
    /// (none once answered, or without a token: `Register` was sent).
    challenge_by: Option<Instant>,
}

/// The backend's logic over links `C` and executor `E`.
pub struct BackendNode<C: Connection, E: Executor> {
    cfg: BackendNodeConfig,
    worker: BatchWorker<C, E>,
    state: State,
    liveness: Option<Liveness>,
    seen_heard: Instant,
    hb: [u8; 64],
    msg: Vec<u8>,
    /// New links waiting for the frontend's challenge or the old link's
    /// READs.
    pending: Vec<PendingFrontend<C>>,
    installed: Vec<Installed>,
    next_key: u64,
    draining: bool,
    drain_until: Option<Instant>,
    drained: bool,
    leave: Leave,
    events: VecDeque<BackendEvent>,
    scheduler_heartbeats: u64,
    /// The cluster's join token (its MAC answers the challenge, and the
    /// scheduler's Welcome must prove it back), our Joins' nonces.
    proof: PeerProof,
    /// The token's data-link form (answers the frontends' challenges).
    data_token: Option<JoinToken>,
    /// A control delay bound that wins over the announced one.
    delay_override: Option<Duration>,
    /// The bound in force, once registered.
    control_delay: Option<ControlDelay>,
    /// Whether the node outlives its scheduler ([`BackendNode::with_failover`]).
    failover: bool,
    /// Scratch for the busy report sent with the model list.
    busy: Vec<wire::GpuBusy>,
    /// Frontends the scheduler announced since its last join-gate request.
    announced: Vec<u32>,
    /// The join gate, once the scheduler asked.
    gate: Gate,
    /// Plans and announcements that came before the Welcome: the worker's
    /// once the Welcome proves the token, dropped otherwise.
    early: Vec<Vec<u8>>,
}

/// The key of the scheduler link in [`BackendNode::for_each_conn`].
pub const SCHEDULER_LINK: u64 = 0;

impl<C: Connection, E: Executor> BackendNode<C, E> {
    /// A node around `worker`, whose scheduler connection is connected:
    /// polls wait for the scheduler's `Challenge`, answer with
    /// `Join{Backend}` and `Models`, and wait for the `Welcome`.
    pub fn new(cfg: BackendNodeConfig, mut worker: BatchWorker<C, E>) -> Self {
        worker.set_backend_id(cfg.id);
        // The scheduler gives a batch up its dead_after past the planned end.
        worker.set_plan_grace(Some(cfg.dead_after));
        BackendNode {
            cfg,
            worker,
            state: State::AwaitChallenge { since: None },
            liveness: None,
            seen_heard: Instant::ZERO,
            hb: [0; 64],
            msg: vec![0; wire::MAX_MESSAGE_LEN],
            pending: Vec::with_capacity(8),
            installed: Vec::with_capacity(16),
            next_key: SCHEDULER_LINK + 1,
            draining: false,
            drain_until: None,
            drained: false,
            leave: Leave::No,
            events: VecDeque::new(),
            scheduler_heartbeats: 0,
            proof: PeerProof::new(None),
            data_token: None,
            delay_override: None,
            control_delay: None,
            failover: false,
            busy: Vec::new(),
            announced: Vec::new(),
            gate: Gate::Open,
            early: Vec::new(),
        }
    }

    /// With `on`, the node outlives its scheduler: losing it (or being
    /// refused by the next one) leaves the node waiting for the host's
    /// next scheduler link ([`handle_scheduler_link`](Self::handle_scheduler_link))
    /// while the batches in hand finish and their results reach the
    /// frontends; it does not drain.
    pub fn with_failover(mut self, on: bool) -> Self {
        self.failover = on;
        self
    }

    /// Whether the node waits for a new scheduler link (failover, lost).
    pub fn scheduler_lost(&self) -> bool {
        self.state == State::Lost
    }

    /// A new scheduler link, connected by the host after
    /// [`BackendEvent::SchedulerLost`] (failover): the node registers over
    /// it as at start (challenge, `Join`, `Models`, `Welcome`), re-announcing
    /// its GPUs. Returns the previous link for the host to take out of its
    /// wait set. Ignored (returned at once) unless the node is lost.
    pub fn handle_scheduler_link(&mut self, conn: C) -> C {
        if self.state != State::Lost || self.draining {
            return conn;
        }
        self.state = State::AwaitChallenge { since: None };
        self.liveness = None;
        self.worker.replace_scheduler(conn)
    }

    /// This node proving `token` when it registers (none: it registers
    /// without, which a scheduler that requires one refuses).
    pub fn with_join_token(mut self, token: Option<JoinToken>) -> Self {
        self.data_token = token.as_ref().map(|t| t.for_purpose(DATA_LINK_LABEL));
        self.proof.set_token(token);
        self
    }

    /// This backend's Joins carry nonces of `nonces` (a harness seeds
    /// them so that its runs replay; else the OS generator's).
    pub fn with_join_nonces(mut self, nonces: NonceSource) -> Self {
        self.proof.set_nonces(nonces);
        self
    }

    /// Registrations refused because the scheduler's Welcome did not
    /// prove the join token (nothing of it was taken).
    pub fn forged_welcomes(&self) -> u64 {
        self.proof.forged_welcomes()
    }

    /// A control delay bound that wins over the one the scheduler
    /// announces (none: the announced one).
    pub fn with_control_delay_override(mut self, bound: Option<Duration>) -> Self {
        self.delay_override = bound;
        self
    }

    /// The control delay bound in force and where it came from (once
    /// registered).
    pub fn control_delay(&self) -> Option<ControlDelay> {
        self.control_delay
    }

    /// The link the host opened to `frontend` after
    /// [`BackendEvent::ConnectFrontend`]. With a join token the node waits
    /// (up to the handshake timeout) for the frontend's `Challenge` and
    /// answers with a `Join{Backend}` signed with the token's data-link
    /// form (see `frontend::node::data`); without one it sends a bare
    /// `Register{Backend}` at once. It uses the link once the frontend's
    /// previous link (if any) has no READs outstanding or `replace_timeout`
    /// from `now` passed. Ignored while draining.
    pub fn handle_frontend_link(&mut self, now: Instant, frontend: u32, mut conn: C) {
        if self.draining || self.state == State::Done {
            return;
        }
        let replace_at = now + self.cfg.replace_timeout;
        if self.data_token.is_some() {
            let challenge_by = Some(now + self.cfg.handshake_timeout);
            self.pending.push(PendingFrontend { frontend, conn, replace_at, challenge_by });
            return;
        }
        let me = Register::new(Role::Backend, self.cfg.id, self.cfg.gpus, "");
        let sent = wire::encode(&mut self.msg, &me)
            .map_err(Error::from)
            .and_then(|n| send_or_progress(&mut conn, &self.msg[..n]));
        match sent {
            Ok(()) => self.pending.push(PendingFrontend { frontend, conn, replace_at, challenge_by: None }),
            Err(e) => self.events.push_back(BackendEvent::FrontendUnreachable {
                why: format!("registering with frontend {frontend}: {e}"),
            }),
        }
    }

    /// All due work at `now`; returns whether anything happened (then
    /// poll again before idling).
    pub fn poll(&mut self, now: Instant) -> bool {
        match self.state {
            State::Done => false,
            State::Lost => self.serve_lost(now),
            // Draining before registered: the registration stops; what is
            // in hand finishes.
            State::AwaitChallenge { .. } | State::Hello { .. } | State::AwaitAck { .. } if self.draining => {
                self.serve_lost(now)
            }
            State::AwaitChallenge { .. } | State::Hello { .. } | State::AwaitAck { .. } => {
                self.handshake(now)
            }
            State::Serving => self.serve(now),
        }
    }

    /// The earliest instant at which time alone makes progress: a device
    /// finishing, a planned start or fetch deadline, a heartbeat, the
    /// scheduler's liveness or acknowledgement deadline, a link
    /// replacement, the drain bound. `None` when only I/O can (or the
    /// node is done).
    pub fn poll_at(&self) -> Option<Instant> {
        let handshake = match self.state {
            State::Done => return None,
            // Draining: no registration goes on.
            _ if self.draining => None,
            State::Hello { .. } | State::AwaitChallenge { since: None } => {
                return Some(Instant::ZERO)
            }
            State::AwaitChallenge { since: Some(since) } | State::AwaitAck { since, .. } => {
                Some(since + self.cfg.handshake_timeout + Duration::from_nanos(1))
            }
            State::Serving | State::Lost => None,
        };
        let live = self.liveness.iter().flat_map(|l| {
            let expiry = (!self.draining).then(|| l.expires_at());
            [Some(l.next_send()), expiry].into_iter().flatten()
        });
        let replaced = self.pending.iter().filter_map(|p| match p.challenge_by {
            Some(by) => Some(by),
            None => self
                .worker
                .frontend_ref(p.frontend)
                .is_some_and(|c| c.outstanding_reads() > 0)
                .then_some(p.replace_at),
        });
        let leave = match self.leave {
            Leave::Asked { next_notice, until } => Some(next_notice.min(until)),
            Leave::No | Leave::Released | Leave::GaveUp => None,
        };
        let gate = match &self.gate {
            Gate::Asked { since: Some(since), .. } => Some(*since + self.cfg.handshake_timeout),
            Gate::Asked { since: None, .. } => Some(Instant::ZERO),
            Gate::Open => None,
        };
        [handshake, self.worker.next_wakeup(), self.drain_until, leave, gate]
            .into_iter()
            .flatten()
            .chain(live)
            .chain(replaced)
            .min()
    }

    /// The next thing that happened, oldest first.
    pub fn poll_event(&mut self) -> Option<BackendEvent> {
        self.events.pop_front()
    }

    /// Stops taking plans; the batches in hand finish (bounded by the
    /// drain timeout from the next poll) and [`drained`](Self::drained)
    /// becomes true.
    pub fn begin_drain(&mut self) {
        if !self.draining {
            self.draining = true;
            self.worker.set_taking_plans(false);
            self.pending.clear();
        }
        if matches!(self.leave, Leave::Asked { .. }) {
            self.leave = Leave::GaveUp;
        }
    }

    /// Leaves gracefully (a stop request, e.g. SIGTERM on a scale-in): the
    /// scheduler is sent `Drain{Draining}` (again every heartbeat until it
    /// answers) and takes this backend's GPUs out of matchmaking; plans it
    /// sent before still come and run as usual. Once every batch planned
    /// here was reported it answers `Drain{Released}`: the node then
    /// stops taking plans, finishes anything still in hand and is
    /// [`drained`](Self::drained). No release within the drain timeout (an
    /// unreachable scheduler): it drains anyway, and the scheduler fails
    /// back what it planned here. Not registered (or lost): a plain
    /// [`begin_drain`](Self::begin_drain), as nothing can be planned here.
    pub fn begin_leave(&mut self, now: Instant) {
        if self.leave != Leave::No || self.draining {
            return;
        }
        if self.state != State::Serving {
            self.begin_drain();
            return;
        }
        self.leave = Leave::Asked { next_notice: now, until: now + self.cfg.drain_timeout };
    }

    /// Whether [`begin_leave`](Self::begin_leave) was called.
    pub fn leaving(&self) -> bool {
        self.leave != Leave::No
    }

    /// Whether the scheduler released this leaving node: every batch it
    /// planned here was reported, so the leave loses nothing.
    pub fn leave_released(&self) -> bool {
        self.leave == Leave::Released
    }

    /// Whether [`begin_drain`](Self::begin_drain) was called (or the
    /// scheduler was lost).
    pub fn draining(&self) -> bool {
        self.draining
    }

    /// Drained (every batch in hand finished or the bound passed), or
    /// refused, or failed: the host may stop polling.
    pub fn drained(&self) -> bool {
        self.drained || self.state == State::Done
    }

    /// Whether the scheduler acknowledged the registration.
    pub fn registered(&self) -> bool {
        self.liveness.is_some()
    }

    /// The worker.
    pub fn worker(&self) -> &BatchWorker<C, E> {
        &self.worker
    }

    /// The worker, mutably (reports, final flushes).
    pub fn worker_mut(&mut self) -> &mut BatchWorker<C, E> {
        &mut self.worker
    }

    /// Heartbeats received from the scheduler.
    pub fn scheduler_heartbeats(&self) -> u64 {
        self.scheduler_heartbeats
    }

    /// Calls `f` with each connected link in use (the scheduler's, key
    /// [`SCHEDULER_LINK`], and every frontend's) and a key no other link
    /// of this node ever has: for the host's wait set.
    pub fn for_each_conn(&self, mut f: impl FnMut(u64, &C)) {
        let s = self.worker.scheduler_ref();
        if s.is_connected() {
            f(SCHEDULER_LINK, s);
        }
        for i in &self.installed {
            if let Some(c) = self.worker.frontend_ref(i.frontend).filter(|c| c.is_connected()) {
                f(i.key, c);
            }
        }
    }

    fn refuse(&mut self, why: String) {
        // What came before a Welcome is taken from a registered link only.
        self.early.clear();
        // The scheduler sees the refused link end now, not when the next
        // attempt replaces it (or never, for a node that is done).
        self.worker.scheduler().close();
        // Registered once, a failover node waits for another scheduler.
        self.state = if self.failover && self.control_delay.is_some() { State::Lost } else { State::Done };
        self.events.push_back(BackendEvent::Refused { why });
    }

    /// Why a registration step failed, from the error that ended it.
    fn refusal(&self, e: &Error) -> String {
        match e {
            Error::PeerDisconnected => format!(
                "the scheduler closed the connection while backend {} registered (refused it without saying why)",
                self.cfg.id
            ),
            e => format!("registering with the scheduler: {e}"),
        }
    }

    /// Our Join answering the challenge of `nonces` (with our nonce and a
    /// MAC if we hold a token).
    fn join(&self, nonces: &Nonces) -> Join {
        // This backend reports its readiness (the join gate).
        self.proof.sign(Join::new(Role::Backend, self.cfg.id, self.cfg.gpus, "").reporting_ready(), nonces)
    }

    /// The scheduler's Welcome after our Join of `nonces`: with a token it
    /// must prove it (`JoinToken::verify_welcome`), or nothing of it (no
    /// epoch, no model count, none of the plans that came before it) is
    /// taken and the registration is refused. Then the plans and
    /// announcements that came early are the worker's.
    fn check_welcome(&mut self, now: Instant, nonces: &Nonces, w: wire::Welcome) {
        let join = self.join(nonces);
        if !self.proof.check_welcome(nonces, &join, &w) {
            self.refuse(format!(
                "the scheduler's Welcome to backend {} does not prove the join token (unsigned or forged): not a scheduler of this cluster; ignored",
                self.cfg.id
            ));
            return;
        }
        self.welcomed(now, w);
        // A refusal of welcomed's (epoch, models) dropped them already.
        for m in self.early.drain(..) {
            self.worker.push_early(&m);
        }
    }

    /// The registration, on the scheduler link directly (the worker takes
    /// the link over once registered): the challenge in, Join and Models
    /// out (retrying a full queue on later polls), the Welcome or a
    /// refusal in, all within the handshake timeout.
    fn handshake(&mut self, now: Instant) -> bool {
        let mut progressed = false;
        if let State::AwaitChallenge { since: None } = self.state {
            self.state = State::AwaitChallenge { since: Some(now) };
            progressed = true;
        }
        for _ in 0..64 {
            if let State::Hello { sent, nonces, since } = self.state {
                match self.hello(now, sent, &nonces) {
                    Ok(2) => self.state = State::AwaitAck { since, nonces },
                    Ok(sent) => {
                        self.state = State::Hello { sent, nonces, since };
                        break;
                    }
                    Err(e) => {
                        let why = self.refusal(&e);
                        self.refuse(why);
                        return true;
                    }
                }
                progressed = true;
            }
            let conn = self.worker.scheduler();
            let _ = conn.progress();
            let n = match conn.try_recv(&mut self.msg) {
                Ok(Some(n)) => n,
                Ok(None) => break,
                Err(e) => {
                    let why = self.refusal(&e);
                    self.refuse(why);
                    return true;
                }
            };
            progressed = true;
            match (wire::decode(&self.msg[..n]), self.state) {
                (Ok(Message::Challenge(c)), State::AwaitChallenge { since }) => {
                    let Some(nonces) = self.proof.nonces(c.nonce) else {
                        self.refuse("registering with the scheduler: no OS randomness for a nonce".into());
                        return true;
                    };
                    self.state = State::Hello { sent: 0, nonces, since: since.unwrap_or(now) };
                }
                (Ok(Message::Welcome(w)), State::AwaitAck { nonces, .. }) => {
                    self.check_welcome(now, &nonces, w);
                    // What follows (announcements, plans) is the worker's.
                    return true;
                }
                (Ok(Message::Refused(r)), _) => {
                    self.refuse(format!(
                        "the scheduler refused the registration of backend {}: {r}",
                        self.cfg.id
                    ));
                    return true;
                }
                (Err(WireError::BadVersion(v)), _) => {
                    self.refuse(format!(
                        "the scheduler speaks wire version {v}, this backend {}: run one version in the whole cluster",
                        wire::VERSION
                    ));
                    return true;
                }
                (Ok(Message::Heartbeat(_)), _) => self.scheduler_heartbeats += 1,
                // The scheduler sends plans and announcements right after
                // the Welcome; a reordering network can deliver them before
                // it. They are the worker's, in their order, once the
                // Welcome proves the token.
                (Ok(Message::BatchPlan(..) | Message::Register(_) | Message::Drain(_)), State::AwaitAck { .. }) => {
                    if self.early.len() < EARLY_CAPACITY {
                        self.early.push(self.msg[..n].to_vec());
                    } else {
                        self.events.push_back(BackendEvent::Ignored { why: "an early plan past the bound".into() });
                    }
                }
                (Ok(_), _) => {
                    self.events.push_back(BackendEvent::Ignored {
                        why: "a scheduler message out of the registration's order".into(),
                    });
                }
                (Err(e), _) => {
                    self.refuse(format!("the scheduler sent a malformed message: {e}"));
                    return true;
                }
            }
        }
        let since = match self.state {
            State::AwaitChallenge { since: Some(s) } | State::Hello { since: s, .. } | State::AwaitAck { since: s, .. } => s,
            _ => return progressed,
        };
        if now.saturating_since(since) > self.cfg.handshake_timeout {
            let ms = self.cfg.handshake_timeout.as_nanos() / 1_000_000;
            let what = match self.state {
                State::AwaitAck { .. } => "acknowledgement",
                _ => "challenge",
            };
            self.refuse(format!("no {what} from the scheduler within {ms} ms"));
            return true;
        }
        progressed
    }

    /// Sends what remains of Join and Models (with how long each GPU stays
    /// busy with the batches in hand, as of `now`: a scheduler that takes
    /// over plans nothing on it before then); returns how many went out.
    fn hello(&mut self, now: Instant, mut sent: u8, nonces: &Nonces) -> Result<u8, Error> {
        while sent < 2 {
            let encoded = if sent == 0 {
                let join = self.join(nonces);
                wire::encode(&mut self.msg, &join)
            } else {
                self.worker.busy_report(now, &mut self.busy);
                wire::encode_models_busy(&mut self.msg, &self.cfg.served, &self.busy)
            };
            let n = encoded?;
            match self.worker.scheduler().send(&self.msg[..n]) {
                Ok(()) => sent += 1,
                Err(Error::QueueFull) => break,
                Err(e) => return Err(e),
            }
        }
        Ok(sent)
    }

    /// The scheduler's Welcome: check the model count, adopt the control
    /// delay bound (unless overridden), start serving.
    fn welcomed(&mut self, now: Instant, w: wire::Welcome) {
        if w.epoch < self.worker.epoch() {
            // A deposed leader that does not know it yet (or a stale
            // address): its plans would be refused anyway. On to the next.
            self.refuse(format!(
                "the scheduler leads epoch {}, but epoch {} was seen already; trying the next scheduler",
                w.epoch,
                self.worker.epoch()
            ));
            return;
        }
        // Held batches of older epochs that have not started never will.
        self.worker.see_epoch(w.epoch);
        self.drain_fenced();
        if w.models != self.cfg.cluster_models {
            self.refuse(format!(
                "model list mismatch: the scheduler has {} models, this backend {} (give every daemon the same --zoo/--models/--model)",
                w.models, self.cfg.cluster_models
            ));
            return;
        }
        let announced = Duration::from_nanos(w.control_delay_ns);
        let delay = ControlDelay {
            bound: self.delay_override.unwrap_or(announced),
            announced,
            overridden: self.delay_override.is_some(),
        };
        self.worker.set_control_delay(delay.bound);
        self.control_delay = Some(delay);
        self.state = State::Serving;
        self.liveness = Some(Liveness::new(now, self.cfg.heartbeat, self.cfg.dead_after));
        self.events.push_back(BackendEvent::Registered);
    }

    /// Reports the plans the worker refused for their epoch.
    fn drain_fenced(&mut self) -> bool {
        let mut any = false;
        while let Some(p) = self.worker.pop_fenced() {
            self.events.push_back(BackendEvent::Fenced(p));
            any = true;
        }
        any
    }

    fn serve(&mut self, now: Instant) -> bool {
        let mut progressed = match self.worker.poll(now) {
            Ok(p) => p,
            Err(WorkerError::Executor(e)) => {
                self.state = State::Done;
                self.events.push_back(BackendEvent::Failed(ExecutorFailure(std::sync::Arc::new(e))));
                return true;
            }
            Err(e) => {
                if !self.draining {
                    let why = match e {
                        WorkerError::SchedulerGone => "scheduler disconnected".to_string(),
                        // A malformed message or a broken connection: the
                        // scheduler is the only source of plans, so the
                        // backend leaves (the scheduler fails its batches).
                        e => format!("scheduler connection: {e}"),
                    };
                    self.lose_scheduler(now, why);
                    true
                } else {
                    // Draining without a scheduler: every poll reports it
                    // gone; that is not progress (the loop must not spin).
                    false
                }
            }
        };
        progressed |= self.drain_fenced();
        while let Some(msg) = self.worker.pop_control() {
            progressed = true;
            self.handle_control(msg);
            if self.state == State::Done {
                return true;
            }
        }
        let Some(liveness) = self.liveness.as_mut() else {
            return progressed;
        };
        // Any message is proof of life; a worker that reads nothing (every
        // batch buffer held) cannot judge the scheduler's silence.
        if self.worker.scheduler_heard_at() != self.seen_heard {
            self.seen_heard = self.worker.scheduler_heard_at();
            liveness.heard(self.seen_heard);
        }
        if self.worker.scheduler_backlogged() {
            liveness.heard(now);
        }
        if !self.pending.is_empty() {
            progressed |= self.answer_challenges(now);
            progressed |= self.install_pending(now);
        }
        self.notice_lost_frontends();
        progressed |= self.progress_gate(now);
        progressed |= self.progress_leave(now);
        // Heartbeats continue while finishing the batches in hand after a
        // stop, so that the scheduler does not fail them back meanwhile.
        let Some(liveness) = self.liveness.as_mut() else {
            return progressed;
        };
        if let Some(n) = liveness.due(now, Role::Backend, self.cfg.id, &mut self.hb) {
            // A full send queue skips this beat: the next one follows.
            let sent = self.worker.scheduler().send(&self.hb[..n]);
            if !self.draining && matches!(sent, Err(Error::PeerDisconnected)) {
                self.lose_scheduler(now, "scheduler disconnected".into());
            }
        }
        if !self.draining && self.liveness.is_some_and(|l| l.expired(now)) {
            let ms = self.cfg.dead_after.as_nanos() / 1_000_000;
            self.lose_scheduler(now, format!("scheduler silent for more than {ms} ms"));
        }
        self.check_drained(now);
        progressed
    }

    /// The join gate, asked: reports `Drain{Ready}` once every frontend
    /// announced before the request has a data link in use, or once the
    /// handshake timeout passed since (a frontend that cannot be reached
    /// must not keep the GPUs out of matchmaking for ever; its tasks fail
    /// at their READs as before). Returns whether anything happened.
    fn progress_gate(&mut self, now: Instant) -> bool {
        let Gate::Asked { frontends, since } = &mut self.gate else { return false };
        let since = *since.get_or_insert(now);
        let linked = |f: &u32| self.installed.iter().any(|i| i.frontend == *f && !i.lost);
        let missing = frontends.iter().filter(|f| !linked(f)).count();
        if missing > 0 && now.saturating_since(since) < self.cfg.handshake_timeout {
            return false;
        }
        if self.draining || self.leave != Leave::No {
            self.gate = Gate::Open;
            return true;
        }
        let Ok(n) = wire::encode(&mut self.hb, &wire::Drain::ready(self.cfg.id)) else { return false };
        // A full queue retries at the next poll; a broken link is the
        // liveness check's.
        if matches!(self.worker.scheduler().send(&self.hb[..n]), Err(Error::QueueFull)) {
            return false;
        }
        self.gate = Gate::Open;
        self.events.push_back(BackendEvent::Ready { after: now.saturating_since(since), missing });
        true
    }

    /// Leaving and not released: the drain notice when due, or the end of
    /// the wait at the bound. Returns whether anything happened.
    fn progress_leave(&mut self, now: Instant) -> bool {
        let Leave::Asked { next_notice, until } = self.leave else { return false };
        if now >= until {
            self.leave = Leave::GaveUp;
            self.events.push_back(BackendEvent::LeaveUnanswered { after: self.cfg.drain_timeout });
            self.begin_drain();
            // Held batches get no second bound: they were waited for.
            self.drain_until = Some(now);
            return true;
        }
        if now < next_notice {
            return false;
        }
        let Ok(n) = wire::encode(&mut self.hb, &wire::Drain::draining(self.cfg.id)) else { return false };
        // A full queue retries at the next poll; a broken link is the
        // liveness check's (the node drains then).
        if !matches!(self.worker.scheduler().send(&self.hb[..n]), Err(Error::QueueFull)) {
            self.leave = Leave::Asked { next_notice: now + self.cfg.heartbeat, until };
        }
        true
    }

    /// The scheduler released this leaving backend: no more plans come.
    fn released(&mut self) {
        if matches!(self.leave, Leave::Asked { .. }) {
            self.leave = Leave::Released;
            self.events.push_back(BackendEvent::Released);
            self.begin_drain();
        }
    }

    /// Draining: done once no batch is in hand or the drain bound passed.
    fn check_drained(&mut self, now: Instant) {
        if self.draining && !self.drained {
            let until = *self.drain_until.get_or_insert(now + self.cfg.drain_timeout);
            let in_hand = self.worker.batches_in_flight();
            if in_hand == 0 || now >= until {
                if in_hand > 0 {
                    self.events.push_back(BackendEvent::DrainTimedOut {
                        in_hand,
                        after: self.cfg.drain_timeout,
                    });
                }
                self.drained = true;
            }
        }
    }

    /// Lost with failover: the batches in hand run and answer their
    /// frontends; nothing comes from a scheduler.
    fn serve_lost(&mut self, now: Instant) -> bool {
        self.check_drained(now);
        match self.worker.poll(now) {
            Ok(p) => p | self.drain_fenced(),
            Err(WorkerError::Executor(e)) => {
                self.state = State::Done;
                self.events.push_back(BackendEvent::Failed(ExecutorFailure(std::sync::Arc::new(e))));
                true
            }
            // The old link reports its loss on every poll: not progress.
            Err(_) => false,
        }
    }

    fn lose_scheduler(&mut self, now: Instant, why: String) {
        self.events.push_back(BackendEvent::SchedulerLost { why });
        // Leaving, no new scheduler is looked for: the node drains.
        if self.failover && self.leave == Leave::No {
            self.state = State::Lost;
            self.liveness = None;
            return;
        }
        self.begin_drain();
        self.drain_until = Some(now + self.cfg.drain_timeout);
    }

    fn handle_control(&mut self, msg: ControlMessage) {
        match msg {
            ControlMessage::Heartbeat(_) => self.scheduler_heartbeats += 1,
            ControlMessage::Drain(d) => match d.stage() {
                Some(wire::DrainStage::Released) if d.backend_id == self.cfg.id => self.released(),
                Some(wire::DrainStage::Ready) if d.backend_id == self.cfg.id => {
                    let frontends = std::mem::take(&mut self.announced);
                    self.gate = Gate::Asked { frontends, since: None };
                }
                _ => self.events.push_back(BackendEvent::Ignored {
                    why: format!("ignoring a drain message (stage {}, backend {}) not meant for this backend", d.stage, d.backend_id),
                }),
            },
            ControlMessage::Register(r) if r.role() == Some(Role::Frontend) => {
                if self.draining {
                    return;
                }
                if r.id >= self.cfg.max_frontends {
                    self.events.push_back(BackendEvent::Ignored {
                        why: format!(
                            "ignoring frontend {} (ids must be < {})",
                            r.id, self.cfg.max_frontends
                        ),
                    });
                    return;
                }
                if !self.announced.contains(&r.id) && self.announced.len() < self.cfg.max_frontends as usize {
                    self.announced.push(r.id);
                }
                self.events.push_back(BackendEvent::ConnectFrontend {
                    id: r.id,
                    endpoint: r.endpoint().to_string(),
                });
            }
            ControlMessage::Register(r) => {
                self.events.push_back(BackendEvent::Ignored {
                    why: format!("ignoring a registration of role {} from the scheduler", r.role),
                });
            }
        }
    }

    /// Puts the links the host opened in use, once the frontend's previous
    /// link (if any) has no READs outstanding (its READs would be lost
    /// with it) or waited long enough. Returns whether any was added.
    fn install_pending(&mut self, now: Instant) -> bool {
        let mut added = false;
        let mut k = 0;
        while k < self.pending.len() {
            let p = &self.pending[k];
            let busy = self
                .worker
                .frontend_ref(p.frontend)
                .is_some_and(|c| c.outstanding_reads() > 0);
            if p.challenge_by.is_some() || (busy && now < p.replace_at) {
                k += 1;
                continue;
            }
            let PendingFrontend { frontend: fid, conn, .. } = self.pending.swap_remove(k);
            match self.worker.add_frontend(fid, conn) {
                Ok(old) => {
                    let key = self.next_key;
                    self.next_key += 1;
                    self.installed.retain(|i| i.frontend != fid);
                    self.installed.push(Installed { frontend: fid, key, lost: false });
                    self.events.push_back(BackendEvent::FrontendConnected {
                        id: fid,
                        replaced: old.is_some(),
                    });
                    added = true;
                }
                Err(e) => self.events.push_back(BackendEvent::Ignored {
                    why: format!("frontend {fid}: {e}"),
                }),
            }
        }
        added
    }

    /// Answers the frontends' challenges on the links waiting for one
    /// (with a join token); a link whose frontend sends anything else,
    /// breaks or stays silent past the handshake timeout is let go.
    /// Returns whether anything happened.
    fn answer_challenges(&mut self, now: Instant) -> bool {
        let Some(token) = self.data_token.as_ref() else {
            return false;
        };
        let mut progressed = false;
        let mut k = 0;
        while k < self.pending.len() {
            let p = &mut self.pending[k];
            let Some(by) = p.challenge_by else {
                k += 1;
                continue;
            };
            // None: still waiting; Some(Ok) answered; Some(Err(why)) let go.
            let outcome: Option<Result<(), String>> = match p.conn.try_recv(&mut self.msg) {
                Ok(Some(n)) => Some(match wire::decode(&self.msg[..n]) {
                    Ok(Message::Challenge(c)) => {
                        let j = Join::new(Role::Backend, self.cfg.id, self.cfg.gpus, "");
                        let j = j.with_mac(token.sign(&c.nonce, wire::VERSION, &j));
                        wire::encode(&mut self.msg, &j)
                            .map_err(Error::from)
                            .and_then(|n| send_or_progress(&mut p.conn, &self.msg[..n]))
                            .map_err(|e| format!("answering its challenge: {e}"))
                    }
                    Ok(_) => Err("it sent another message before its challenge".into()),
                    Err(e) => Err(format!("malformed challenge: {e}")),
                }),
                Ok(None) if now >= by => Some(Err("no challenge within the handshake timeout".into())),
                Ok(None) => None,
                Err(e) => Some(Err(e.to_string())),
            };
            match outcome {
                None => k += 1,
                Some(Ok(())) => {
                    progressed = true;
                    p.challenge_by = None;
                    k += 1;
                }
                Some(Err(why)) => {
                    progressed = true;
                    let gone = self.pending.swap_remove(k);
                    self.events.push_back(BackendEvent::FrontendUnreachable {
                        why: format!("frontend {}'s data link: {why}", gone.frontend),
                    });
                }
            }
        }
        progressed
    }

    /// Reports each installed link that went down, once.
    fn notice_lost_frontends(&mut self) {
        for i in self.installed.iter_mut().filter(|i| !i.lost) {
            if self.worker.frontend_ref(i.frontend).is_some_and(|c| !c.is_connected()) {
                i.lost = true;
                self.events.push_back(BackendEvent::FrontendLost(i.frontend));
            }
        }
    }
}

/// Queues `msg` on a fresh link, driving it once if its queue is full.
fn send_or_progress<C: Connection>(conn: &mut C, msg: &[u8]) -> Result<(), Error> {
    match conn.send(msg) {
        Err(Error::QueueFull) => {
            conn.progress()?;
            conn.send(msg)?;
        }
        other => other?,
    }
    // Bytes leave during polls; this link is not polled until it is in use.
    match conn.progress() {
        Ok(()) | Err(Error::PeerDisconnected) => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
#[path = "node_auth_tests.rs"]
mod auth_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::ExecModel;
    use crate::worker::WorkerConfig;
    use crate::EmulatedExecutor;
    use dataplane::mem::{Access, Region};
    use dataplane::transport::sim::{FaultConfig, NodeId, SimConn, SimNet, SimPeer};
    use dataplane::transport::Domain;
    use dataplane::wire::{BatchPlanHead, BatchTask, Message, RemoteRef, Welcome};
    use scheduler_core::profile::LatencyProfile;

    const BACKEND: NodeId = 5;
    const SCHEDULER: NodeId = 0;
    const FRONTEND: NodeId = 3;

    /// What the tests read from and write to a peer's end.
    trait PeerExt {
        /// Sends a plan of one task from frontend 3.
        fn plan(&mut self, batch_id: u64);
        /// [`plan`](Self::plan) of scheduler epoch `epoch`, holding its GPU
        /// for 5 ms.
        fn plan_of(&mut self, batch_id: u64, epoch: u32);
        /// Every message received, debug-formatted (heartbeats left out),
        /// and how many heartbeats.
        fn received(&mut self) -> (Vec<String>, usize);
    }

    impl PeerExt for SimPeer {
        fn plan(&mut self, batch_id: u64) {
            self.plan_of(batch_id, 0);
        }
        fn plan_of(&mut self, batch_id: u64, epoch: u32) {
            let head = BatchPlanHead { batch_id, exec_in_ns: 1_000_000, model_id: 0, gpu_id: 0, count: 0, run_ns: 5_000_000, epoch };
            let task = BatchTask { task_id: batch_id, frontend_id: 3, queued_us: 0, input: RemoteRef { key: 1, len: 16, offset: 0 }, capability: Default::default() };
            self.send_encoded(|buf| wire::encode_batch_plan(buf, &head, &[task])).unwrap();
        }
        fn received(&mut self) -> (Vec<String>, usize) {
            let mut out = Vec::new();
            let mut beats = 0;
            for m in self.take_all() {
                match wire::decode(&m).unwrap() {
                    Message::Heartbeat(_) => beats += 1,
                    m => out.push(format!("{m:?}")),
                }
            }
            (out, beats)
        }
    }

    const MODELS: u32 = 2;

    fn config() -> BackendNodeConfig {
        BackendNodeConfig {
            id: 5,
            gpus: 1,
            served: vec![0, 1],
            cluster_models: MODELS,
            max_frontends: 8,
            heartbeat: Duration::from_millis(100),
            dead_after: Duration::from_millis(1000),
            handshake_timeout: Duration::from_millis(5000),
            replace_timeout: Duration::from_millis(5000),
            drain_timeout: Duration::from_millis(10_000),
        }
    }

    /// The node under test and the network its links run on (messages
    /// arrive at the instant they are sent; the scheduler is node 0, the
    /// backend node 5).
    struct Backend {
        net: SimNet,
        node: BackendNode<SimConn, EmulatedExecutor>,
    }

    fn node() -> (Backend, SimPeer) {
        node_with(false)
    }

    /// [`node`], outliving its scheduler if `failover`.
    fn node_with(failover: bool) -> (Backend, SimPeer) {
        // READs held by a partition (see `hold_reads`) last longer than any test.
        let net = SimNet::new(0, FaultConfig { read_timeout: Duration::from_millis(3_600_000), ..FaultConfig::same_instant() });
        let wcfg = WorkerConfig { max_batch: 4, input_slot: 16, output_slot: 16, batch_slots: 2, max_frontends: 8, ..WorkerConfig::default() };
        let staging = Region::anonymous(wcfg.staging_bytes() as usize).unwrap();
        let reg = net.domain(BACKEND).register(&staging, Access::LOCAL_WRITE).unwrap();
        let models = (0..MODELS)
            .map(|_| ExecModel { profile: LatencyProfile::linear(0.2, 1.0, 64).unwrap(), output_len: 16 })
            .collect();
        let exec = EmulatedExecutor::new(staging, 1, 4, models);
        let (ours, theirs) = net.link(BACKEND, SCHEDULER).unwrap();
        let worker = BatchWorker::new(wcfg, exec, reg, ours).unwrap();
        let node = BackendNode::new(config(), worker).with_failover(failover);
        (Backend { net, node }, SimPeer::new(theirs))
    }

    impl Backend {
        fn events(&mut self) -> Vec<BackendEvent> {
            std::iter::from_fn(|| self.node.poll_event()).collect()
        }

        /// Moves the clock to `now` and polls until quiet.
        fn settle(&mut self, now: Instant) {
            assert!(self.net.settle(now, 100, |t| self.node.poll(t)), "node never quiet");
        }

        /// Settles at `from`, then at each time the node asks for up to
        /// `until` (at most 50 steps).
        fn run_until(&mut self, from: Instant, until: Instant) {
            let mut now = from;
            for _ in 0..50 {
                self.settle(now);
                match self.node.poll_at() {
                    Some(t) if t <= until => now = t.max(now),
                    _ => break,
                }
            }
        }

        /// Hands the node a link to frontend 3 at `now`; returns the
        /// frontend's end. With `hold_reads`, the backend's READs of the
        /// frontend never complete (the two are cut from each other).
        fn connect_frontend(&mut self, now: Instant, hold_reads: bool) -> SimPeer {
            self.net.set_now(now);
            let (ours, theirs) = self.net.link(BACKEND, FRONTEND).unwrap();
            if hold_reads {
                self.net.partition(BACKEND, FRONTEND);
            }
            self.node.handle_frontend_link(now, 3, ours);
            SimPeer::new(theirs)
        }
    }

    /// The fake scheduler's challenge (it asks for no token).
    const NONCE: [u8; wire::NONCE_LEN] = [9; wire::NONCE_LEN];

    /// The fake scheduler's welcome for a list of `models`.
    fn welcome(models: u32) -> Welcome {
        Welcome::new(models, 0, 0)
    }

    /// With a token, a Welcome that does not prove it (unsigned, forged,
    /// another cluster's, or signed for another Join of ours: a replay) is
    /// refused and counted, and nothing of it is taken: not its epoch
    /// (u32::MAX would make the backend refuse every real leader), nor a
    /// plan that came before it. A Welcome that proves it is taken, with
    /// the plan.
    #[test]
    fn a_welcome_that_does_not_prove_the_token_is_refused_and_nothing_of_it_taken() {
        let t0 = Instant::ZERO;
        let held = JoinToken::new(b"backend welcome test token").unwrap();
        for case in 0..5u8 {
            let (Backend { net, node }, mut s) = node();
            let node = node.with_join_token(Some(held.clone())).with_join_nonces(NonceSource::Seeded(u64::from(case)));
            let mut n = Backend { net, node };
            s.challenge(NONCE).unwrap();
            n.settle(t0);
            let sent = s.take_all();
            let Ok(Message::Join(join)) = wire::decode(&sent[0]) else { panic!("{sent:?}") };
            assert!(join.has_mac() && join.nonce != [0; wire::NONCE_LEN], "{join:?}");
            // A plan before the Welcome (as a reordering network delivers).
            s.plan_of(1, u32::MAX);
            let w = Welcome::new(MODELS, u32::MAX, 0);
            let mac = match case {
                0 => [0; wire::MAC_LEN],
                1 => [0xa5; wire::MAC_LEN],
                2 => JoinToken::new(b"another cluster's token").unwrap().sign_welcome(&NONCE, &join, &w),
                3 => held.sign_welcome(&NONCE, &join.with_nonce([2; wire::NONCE_LEN]), &w),
                _ => held.sign_welcome(&NONCE, &join, &w),
            };
            s.send(&Welcome { mac, ..w }).unwrap();
            n.settle(t0);
            let ev = n.events();
            if case == 4 {
                assert_eq!(ev, [BackendEvent::Registered]);
                assert_eq!((n.node.worker().epoch(), n.node.forged_welcomes()), (u32::MAX, 0));
                n.settle(t0 + Duration::from_millis(10));
                assert_eq!(n.node.worker().stats().plans, 1, "the early plan is the worker's");
                continue;
            }
            let want = "the scheduler's Welcome to backend 5 does not prove the join token";
            assert!(matches!(&ev[..], [BackendEvent::Refused { why }] if why.starts_with(want)), "case {case}: {ev:?}");
            assert_eq!(n.node.forged_welcomes(), 1);
            assert_eq!(n.node.worker().epoch(), 0, "no epoch taken");
            assert!(!n.node.registered());
            n.settle(t0 + Duration::from_millis(10));
            assert_eq!(n.node.worker().stats().plans, 0, "the early plan never reached the worker");
        }
    }

    /// Registered at t0; the scheduler's received messages cleared.
    fn registered(t0: Instant) -> (Backend, SimPeer) {
        registered_with(t0, node())
    }

    /// [`registered`] for the node and scheduler end given.
    fn registered_with(t0: Instant, (mut n, mut s): (Backend, SimPeer)) -> (Backend, SimPeer) {
        s.challenge(NONCE).unwrap();
        n.settle(t0);
        let msgs: Vec<_> = s.take_all().iter().filter_map(|m| wire::decode(m).ok().map(|m| format!("{m:?}"))).collect();
        assert!(msgs[0].starts_with("Join") && msgs[0].contains("id: 5"), "{msgs:?}");
        assert!(msgs[1].starts_with("Models"), "{msgs:?}");
        // A node holding a token takes a Welcome that proves it only.
        let w = welcome(MODELS);
        let State::AwaitAck { nonces, .. } = n.node.state else { panic!("{:?}", n.node.state) };
        let mac = n.node.proof.token().map_or([0; wire::MAC_LEN], |t| t.sign_welcome(&NONCE, &n.node.join(&nonces), &w));
        s.send(&Welcome { mac, ..w }).unwrap();
        n.settle(t0);
        assert_eq!(n.events(), vec![BackendEvent::Registered]);
        assert!(n.node.registered());
        (n, s)
    }

    #[test]
    fn with_a_token_a_frontend_link_is_used_once_its_challenge_is_answered() {
        let t0 = Instant::from_nanos(1_000_000_000);
        let tok = JoinToken::new(b"backend data-link test token").unwrap();
        let data = tok.for_purpose(DATA_LINK_LABEL);
        let (Backend { net, node }, s) = node();
        let (mut n, _s) = registered_with(t0, (Backend { net, node: node.with_join_token(Some(tok.clone())) }, s));
        let mut fe = n.connect_frontend(t0, false);
        n.settle(t0);
        assert!(fe.take_all().is_empty(), "nothing before the frontend's challenge");
        assert!(n.events().is_empty(), "not in use before it is answered");
        assert!(n.node.poll_at().is_some_and(|t| t <= t0 + config().handshake_timeout));
        let nonce = [4u8; wire::NONCE_LEN];
        fe.send(&wire::Challenge::new(nonce, true)).unwrap();
        n.settle(t0);
        let j = fe.take_join().expect("a Join answers the challenge");
        assert_eq!((j.role, j.id), (Role::Backend as u32, 5));
        assert!(data.verify(&nonce, wire::VERSION, &j), "signed for the data link");
        assert!(!tok.verify(&nonce, wire::VERSION, &j), "not a scheduler-link answer");
        assert_eq!(n.events(), vec![BackendEvent::FrontendConnected { id: 3, replaced: false }]);

        // A "frontend" that sends anything but a challenge first is let go.
        let mut odd = n.connect_frontend(t0, false);
        odd.send(&Register::new(Role::Frontend, 3, 0, "")).unwrap();
        n.settle(t0);
        let ev = n.events();
        assert!(
            matches!(&ev[..], [BackendEvent::FrontendUnreachable { why }] if why.contains("before its challenge")),
            "{ev:?}"
        );
        assert!(odd.take_all().is_empty(), "it got no Join");
    }

    #[test]
    fn registers_then_asks_the_host_to_connect_announced_frontends() {
        let t0 = Instant::from_nanos(7);
        let (mut n, mut s) = registered(t0);
        s.send(&Register::new(Role::Frontend, 3, 0, "fe3")).unwrap();
        s.send(&Register::new(Role::Frontend, 99, 0, "too-high")).unwrap();
        n.settle(t0);
        let ev = n.events();
        assert_eq!(ev[0], BackendEvent::ConnectFrontend { id: 3, endpoint: "fe3".into() });
        assert!(matches!(&ev[1], BackendEvent::Ignored { why } if why.contains("ids must be < 8")), "{ev:?}");
        // The host connected: Register{Backend} goes first on the link.
        let mut fe = n.connect_frontend(t0, false);
        n.settle(t0);
        assert_eq!(n.events(), vec![BackendEvent::FrontendConnected { id: 3, replaced: false }]);
        let (msgs, _) = fe.received();
        assert!(msgs[0].starts_with("Register") && msgs[0].contains("role: 2"), "{msgs:?}");
        drop(fe);
        n.settle(t0);
        assert_eq!(n.events(), vec![BackendEvent::FrontendLost(3)]);
    }

    #[test]
    fn with_failover_a_lost_scheduler_is_replaced_and_the_backend_registers_again() {
        let t0 = Instant::from_nanos(1_000);
        let (mut n, s) = registered_with(t0, node_with(true));
        drop(s);
        let t1 = t0 + Duration::from_millis(1);
        n.settle(t1);
        let ev = n.events();
        assert!(matches!(&ev[..], [BackendEvent::SchedulerLost { .. }]), "{ev:?}");
        assert!(n.node.scheduler_lost() && !n.node.draining() && !n.node.drained());
        // A scheduler that refuses leaves the node lost, not done.
        let (ours, theirs) = n.net.link(BACKEND, SCHEDULER).unwrap();
        let _old = n.node.handle_scheduler_link(ours);
        drop(theirs);
        n.settle(t1);
        let ev = n.events();
        assert!(matches!(&ev[..], [BackendEvent::Refused { .. }]), "{ev:?}");
        assert!(n.node.scheduler_lost());
        // The next one welcomes it: Join and Models (its GPUs) again.
        let (ours, theirs) = n.net.link(BACKEND, SCHEDULER).unwrap();
        let _old = n.node.handle_scheduler_link(ours);
        let (n, _s) = registered_with(t1, (n, SimPeer::new(theirs)));
        assert!(!n.node.scheduler_lost());
    }

    #[test]
    fn a_closed_link_or_a_wrong_model_count_is_a_refusal() {
        let t0 = Instant::ZERO;
        let (mut n, s) = node();
        n.settle(t0);
        drop(s);
        n.settle(t0);
        let ev = n.events();
        assert!(matches!(&ev[..], [BackendEvent::Refused { why }] if why.contains("refused it without saying why")), "{ev:?}");
        assert!(n.node.drained() && n.node.poll_at().is_none());

        let (mut n, mut s) = node();
        s.challenge(NONCE).unwrap();
        n.settle(t0);
        s.send(&welcome(MODELS + 1)).unwrap();
        n.settle(t0);
        let ev = n.events();
        assert!(matches!(&ev[..], [BackendEvent::Refused { why }] if why.contains("model list mismatch")), "{ev:?}");
    }

    #[test]
    fn no_ack_within_the_handshake_timeout_is_a_refusal_on_a_jumping_clock() {
        let t0 = Instant::from_nanos(1_000);
        let (mut n, mut s) = node();
        s.challenge(NONCE).unwrap();
        n.settle(t0);
        assert!(s.take_join().is_some(), "answered");
        let due = n.node.poll_at().unwrap();
        assert_eq!(due, t0 + config().handshake_timeout + Duration::from_nanos(1));
        n.settle(due);
        let ev = n.events();
        assert!(matches!(&ev[..], [BackendEvent::Refused { why }] if why.contains("no acknowledgement")), "{ev:?}");
    }

    #[test]
    fn heartbeats_and_a_silent_scheduler_on_a_virtual_clock() {
        let t0 = Instant::from_nanos(1_000);
        let (mut n, mut s) = registered(t0);
        let (_, beats) = s.received();
        assert_eq!(beats, 1, "the first beat at registration");
        // Polling again at the same instant sends nothing more.
        n.settle(t0);
        assert_eq!(s.received().1, 0);
        // The clock jumps from deadline to deadline; the scheduler says nothing.
        let mut now = t0;
        let mut polls = 0;
        while !n.node.draining() {
            now = n.node.poll_at().unwrap();
            n.settle(now);
            polls += 1;
            assert!(polls < 100);
        }
        assert_eq!(now, t0 + config().dead_after + Duration::from_nanos(1));
        let ev = n.events();
        assert!(matches!(&ev[..], [BackendEvent::SchedulerLost { why }] if why.contains("silent")), "{ev:?}");
        assert_eq!(s.received().1, 10, "a beat every 100 ms");
        assert!(n.node.drained(), "nothing in hand");
    }

    #[test]
    fn a_duplicated_plan_runs_once() {
        let t0 = Instant::ZERO;
        let (mut n, mut s) = registered(t0);
        s.plan(1);
        s.plan(1);
        s.plan(2);
        n.run_until(t0, t0 + Duration::from_millis(50));
        let (msgs, _) = s.received();
        let done: Vec<&String> = msgs.iter().filter(|m| m.starts_with("BatchDone")).collect();
        assert_eq!(done.len(), 2, "{msgs:?}");
        assert!(done[0].contains("batch_id: 1") && done[1].contains("batch_id: 2"), "{done:?}");
        assert_eq!(n.node.worker().stats().duplicate_plans, 1);
        assert_eq!(n.node.worker().stats().plans, 2);
    }

    /// A plan that has not started by its planned end plus the scheduler's
    /// grace (its dead_after) is one the scheduler has failed back: it is
    /// skipped, its task answered `Abandoned` and its BatchDone reporting
    /// nothing run, so a lagging backend catches up instead of running it.
    #[test]
    fn a_plan_the_scheduler_has_given_up_is_skipped_not_run() {
        let t0 = Instant::ZERO;
        let (mut n, mut s) = registered(t0);
        let mut fe = n.connect_frontend(t0, false);
        n.settle(t0);
        n.events();
        // The frontend's input region (the staging registration is key 1).
        let region = Region::anonymous(64).unwrap();
        let reg = n.net.domain(FRONTEND).register(&region, Access::REMOTE_READ).unwrap();
        // l(1) = 1.2 ms at profile; 1000x slower, plan 1 holds the GPU 1.2 s,
        // past plan 2's planned end (7 ms) plus the 1 s grace.
        assert!(n.node.worker_mut().executor_mut().set_slowdown(0, 1000.0));
        for batch_id in 1..=2u64 {
            let head = BatchPlanHead { batch_id, exec_in_ns: 1_000_000 * batch_id, model_id: 0, gpu_id: 0, count: 0, run_ns: 5_000_000, epoch: 0 };
            let input = RemoteRef { key: reg.key(), len: 16, offset: 16 * batch_id };
            let task = BatchTask { task_id: batch_id, frontend_id: 3, queued_us: 0, input, capability: Default::default() };
            s.send_encoded(|buf| wire::encode_batch_plan(buf, &head, &[task])).unwrap();
        }
        n.run_until(t0, t0 + Duration::from_millis(3000));
        let (msgs, _) = s.received();
        let done: Vec<&String> = msgs.iter().filter(|m| m.starts_with("BatchDone")).collect();
        // Plan 2 is skipped at the first poll past its grace, while plan 1
        // still runs: its report comes first.
        assert_eq!(done.len(), 2, "{msgs:?}");
        assert!(done[0].contains("batch_id: 2,") && done[0].contains("count: 0,"), "nothing run: {done:?}");
        assert!(done[1].contains("batch_id: 1,") && done[1].contains("count: 1,"), "{done:?}");
        let st = n.node.worker().stats();
        assert_eq!((st.batches_executed, st.plans_skipped, st.tasks_ok, st.tasks_failed), (1, 1, 1, 1));
        let statuses: Vec<(u64, u32)> = fe
            .take_all()
            .iter()
            .filter_map(|m| match wire::decode(m) {
                Ok(Message::Completion(h, _)) => Some((h.task_id, h.status)),
                _ => None,
            })
            .collect();
        assert_eq!(statuses, [(2, wire::TaskStatus::Abandoned as u32), (1, wire::TaskStatus::Ok as u32)]);
    }

    #[test]
    fn a_plan_delivered_before_the_welcome_still_runs() {
        // A reordering network may hand the node the scheduler's first plan
        // before the Welcome that precedes it on the link.
        let t0 = Instant::ZERO;
        let (mut n, mut s) = node();
        s.challenge(NONCE).unwrap();
        n.settle(t0);
        let _ = s.received();
        s.plan(1);
        s.send(&welcome(MODELS)).unwrap();
        s.plan(2);
        n.run_until(t0, t0 + Duration::from_millis(50));
        assert!(n.node.registered());
        let (msgs, _) = s.received();
        let done: Vec<&String> = msgs.iter().filter(|m| m.starts_with("BatchDone")).collect();
        assert_eq!(done.len(), 2, "{msgs:?}");
        assert!(done[0].contains("batch_id: 1") && done[1].contains("batch_id: 2"), "{done:?}");
        assert_eq!(n.node.worker().stats().plans, 2);
    }

    #[test]
    fn a_drain_keeps_beating_takes_no_plan_and_gives_up_at_its_bound() {
        let t0 = Instant::ZERO;
        let (mut n, mut s) = registered(t0);
        // Frontend 3's READs never complete: the batch's buffer stays held.
        let _fe = n.connect_frontend(t0, true);
        n.settle(t0);
        n.events();
        s.plan(1);
        n.settle(t0);
        assert_eq!(n.node.worker().batches_in_flight(), 1);
        n.node.begin_drain();
        n.settle(t0);
        s.plan(2);
        let (_, beats_before) = s.received();
        let mut now = t0;
        while !n.node.drained() {
            now = n.node.poll_at().unwrap();
            n.settle(now);
        }
        assert_eq!(now, t0 + config().drain_timeout);
        let (msgs, beats) = s.received();
        assert_eq!(msgs.iter().filter(|m| m.starts_with("BatchDone")).count(), 1, "plan 2 was not taken: {msgs:?}");
        assert!(beats + beats_before >= 100, "beats continue while draining: {beats}");
        assert_eq!(
            n.events(),
            vec![BackendEvent::DrainTimedOut { in_hand: 1, after: config().drain_timeout }]
        );
    }

    /// Registers the node over scheduler end `s` at `t0` with a Welcome of
    /// `epoch`; returns the Models message the node sent.
    fn register_epoch(t0: Instant, n: &mut Backend, s: &mut SimPeer, epoch: u32) -> Vec<u8> {
        s.challenge(NONCE).unwrap();
        n.settle(t0);
        let msgs = s.take_all();
        assert!(matches!(wire::decode(&msgs[0]), Ok(Message::Join(_))));
        s.send(&Welcome::new(MODELS, epoch, 0)).unwrap();
        n.settle(t0);
        msgs[1].clone()
    }

    #[test]
    fn a_plan_of_an_older_epoch_than_the_newest_seen_is_refused_and_reported() {
        let t0 = Instant::ZERO;
        let (mut n, mut s) = node();
        register_epoch(t0, &mut n, &mut s, 1);
        assert_eq!(n.events(), vec![BackendEvent::Registered]);
        assert_eq!(n.node.worker().epoch(), 1);
        let _fe = n.connect_frontend(t0, false);
        n.settle(t0);
        n.events();
        // A plan teaches a newer epoch too; then one of epoch 1 is stale.
        s.plan_of(1, 2);
        n.settle(t0);
        assert_eq!(n.node.worker().epoch(), 2);
        s.plan_of(2, 1);
        n.settle(t0);
        let st = n.node.worker().stats();
        assert_eq!((st.plans, st.stale_plans), (1, 1));
        let fenced = FencedPlan { batch_id: 2, epoch: 1, newest: 2, reason: FenceReason::StaleEpoch };
        assert_eq!(n.events(), vec![BackendEvent::Fenced(fenced)]);
        assert!(BackendEvent::Fenced(fenced).to_string().contains("refused batch 2 of epoch 1"));
    }

    #[test]
    fn a_new_leader_learns_the_busy_gpu_and_its_epoch_drops_the_old_unstarted_batch() {
        let t0 = Instant::ZERO;
        let (mut n, mut s) = node_with(true);
        register_epoch(t0, &mut n, &mut s, 1);
        // The batch cannot start: its input never arrives.
        let _fe = n.connect_frontend(t0, true);
        n.settle(t0);
        s.plan_of(1, 1);
        n.settle(t0);
        assert_eq!(n.node.worker().batches_in_flight(), 1);
        n.events();
        // The leader dies; a new one takes over.
        drop(s);
        let t1 = t0 + Duration::from_micros(500);
        n.settle(t1);
        assert!(n.node.scheduler_lost());
        n.events();
        let (ours, theirs) = n.net.link(BACKEND, SCHEDULER).unwrap();
        let _old = n.node.handle_scheduler_link(ours);
        let mut s2 = SimPeer::new(theirs);
        let models = register_epoch(t1, &mut n, &mut s2, 2);
        // The Models message said: GPU 0 busy until the batch's planned
        // start (t0 + 1 ms) plus its 5 ms.
        match wire::decode(&models).unwrap() {
            Message::Models(ids, busy) => {
                assert_eq!(ids.iter().collect::<Vec<_>>(), [0, 1]);
                let busy: Vec<_> = busy.iter().collect();
                assert_eq!(busy, [wire::GpuBusy { busy_ns: 5_500_000, gpu_id: 0, batches: 1 }]);
            }
            m => panic!("{m:?}"),
        }
        // Epoch 2's Welcome: the unstarted batch of epoch 1 never runs.
        let ev = n.events();
        let fenced = FencedPlan { batch_id: 1, epoch: 1, newest: 2, reason: FenceReason::Superseded };
        assert_eq!(ev, vec![BackendEvent::Fenced(fenced), BackendEvent::Registered]);
        assert_eq!(n.node.worker().stats().superseded_batches, 1);
        n.run_until(t1, t1 + Duration::from_millis(50));
        assert_eq!(n.node.worker().stats().batches_executed, 0);
        let (msgs, _) = s2.received();
        assert!(!msgs.iter().any(|m| m.starts_with("BatchDone")), "{msgs:?}");
    }

    #[test]
    fn a_welcome_of_an_older_epoch_than_the_newest_seen_sends_the_node_to_the_next_scheduler() {
        let t0 = Instant::ZERO;
        let (mut n, mut s) = node_with(true);
        register_epoch(t0, &mut n, &mut s, 3);
        n.events();
        drop(s);
        n.settle(t0);
        assert!(n.node.scheduler_lost());
        n.events();
        // A deposed leader of epoch 2 answers first: the link is dropped.
        let (ours, theirs) = n.net.link(BACKEND, SCHEDULER).unwrap();
        let _old = n.node.handle_scheduler_link(ours);
        let mut stale = SimPeer::new(theirs);
        register_epoch(t0, &mut n, &mut stale, 2);
        let ev = n.events();
        assert!(matches!(&ev[..], [BackendEvent::Refused { why }] if why.contains("epoch 2") && why.contains("epoch 3")), "{ev:?}");
        assert!(n.node.scheduler_lost() && !n.node.registered());
        // The leader of epoch 3 (or later) is taken.
        let (ours, theirs) = n.net.link(BACKEND, SCHEDULER).unwrap();
        let _old = n.node.handle_scheduler_link(ours);
        let mut leader = SimPeer::new(theirs);
        register_epoch(t0, &mut n, &mut leader, 3);
        assert_eq!(n.events(), vec![BackendEvent::Registered]);
    }

    /// Drain messages the scheduler end received, by stage code.
    fn drain_notices(msgs: &[String]) -> usize {
        msgs.iter().filter(|m| m.starts_with("Drain") && m.contains("backend_id: 5, stage: 1")).count()
    }

    #[test]
    fn a_leave_tells_the_scheduler_runs_what_it_still_plans_and_ends_at_its_release() {
        let t0 = Instant::ZERO;
        let (mut n, mut s) = registered(t0);
        n.node.begin_leave(t0);
        n.settle(t0);
        let (msgs, _) = s.received();
        assert_eq!(drain_notices(&msgs), 1, "{msgs:?}");
        assert!(n.node.leaving() && !n.node.draining());
        // A plan sent before the scheduler took the notice still runs.
        s.plan(1);
        let t1 = t0 + Duration::from_millis(250);
        n.run_until(t0, t1);
        let (msgs, _) = s.received();
        assert_eq!(msgs.iter().filter(|m| m.starts_with("BatchDone") && m.contains("batch_id: 1")).count(), 1, "{msgs:?}");
        // Unreleased, the notice is repeated every heartbeat.
        assert_eq!(drain_notices(&msgs), 2, "{msgs:?}");
        assert!(!n.node.drained());
        // Another backend's release, or a notice echoed back, is not one.
        s.send(&wire::Drain::released(6)).unwrap();
        s.send(&wire::Drain::draining(5)).unwrap();
        n.settle(t1);
        assert!(!n.node.drained());
        assert_eq!(n.events().iter().filter(|e| matches!(e, BackendEvent::Ignored { .. })).count(), 2);
        s.send(&wire::Drain::released(5)).unwrap();
        n.settle(t1);
        assert_eq!(n.events(), vec![BackendEvent::Released]);
        assert!(n.node.drained() && n.node.leave_released());
    }

    #[test]
    fn an_unanswered_leave_ends_at_the_drain_bound_and_a_lost_scheduler_ends_it_without_failover() {
        let t0 = Instant::ZERO;
        let (mut n, mut s) = registered(t0);
        n.node.begin_leave(t0);
        let mut now = t0;
        let mut polls = 0;
        while !n.node.drained() {
            now = n.node.poll_at().unwrap().max(now);
            // The scheduler is alive: it beats, but never releases.
            s.send(&wire::Heartbeat { seq: polls, role: Role::Scheduler as u32, id: 0 }).unwrap();
            n.settle(now);
            polls += 1;
            assert!(polls < 1000);
        }
        assert_eq!(now, t0 + config().drain_timeout);
        let ev = n.events();
        assert_eq!(ev, vec![BackendEvent::LeaveUnanswered { after: config().drain_timeout }]);
        assert!(!n.node.leave_released());
        let (msgs, _) = s.received();
        assert_eq!(drain_notices(&msgs), 100, "one per heartbeat over the bound");

        // With failover, a leaving node does not look for a new scheduler.
        let (mut n, s) = registered_with(t0, node_with(true));
        n.node.begin_leave(t0);
        n.settle(t0);
        drop(s);
        n.settle(t0);
        let ev = n.events();
        assert!(matches!(&ev[..], [BackendEvent::SchedulerLost { .. }]), "{ev:?}");
        assert!(n.node.drained() && !n.node.scheduler_lost());
    }

    #[test]
    fn a_leave_before_registration_is_a_plain_drain() {
        let t0 = Instant::ZERO;
        let (mut n, _s) = node();
        n.node.begin_leave(t0);
        assert!(n.node.draining() && !n.node.leaving());
        n.settle(t0);
        assert!(n.node.drained());
    }

    /// Join-gate requests and reports the scheduler end saw.
    fn ready_reports(msgs: &[String]) -> usize {
        msgs.iter().filter(|m| m.starts_with("Drain") && m.contains("backend_id: 5, stage: 3")).count()
    }

    #[test]
    fn the_join_gate_is_reported_once_every_announced_frontend_is_linked_or_at_its_bound() {
        let t0 = Instant::from_nanos(11);
        let (mut n, mut s) = node();
        s.challenge(NONCE).unwrap();
        n.settle(t0);
        let (msgs, _) = s.received();
        assert!(msgs[0].starts_with("Join") && msgs[0].contains("flags: 2"), "it reports readiness: {msgs:?}");
        s.send(&welcome(MODELS)).unwrap();
        // The announcements, then the request; frontend 4 is never linked.
        s.send(&Register::new(Role::Frontend, 3, 0, "fe3")).unwrap();
        s.send(&wire::Drain::ready(5)).unwrap();
        n.settle(t0);
        assert_eq!(n.events(), [BackendEvent::Registered, BackendEvent::ConnectFrontend { id: 3, endpoint: "fe3".into() }]);
        assert_eq!(ready_reports(&s.received().0), 0, "not before the link is up");
        let t1 = t0 + Duration::from_millis(3);
        let _fe = n.connect_frontend(t1, false);
        n.settle(t1);
        let ev = n.events();
        assert_eq!(ev[0], BackendEvent::FrontendConnected { id: 3, replaced: false });
        assert_eq!(ev[1], BackendEvent::Ready { after: Duration::from_millis(3), missing: 0 });
        assert_eq!(ready_reports(&s.received().0), 1);
        // A frontend announced later, then a new request (as after a
        // re-registration): it cannot be reached; the report comes at the
        // bound.
        s.send(&Register::new(Role::Frontend, 4, 0, "fe4")).unwrap();
        s.send(&wire::Drain::ready(5)).unwrap();
        let t2 = t1 + Duration::from_millis(1);
        n.settle(t2);
        assert_eq!(n.events(), [BackendEvent::ConnectFrontend { id: 4, endpoint: "fe4".into() }]);
        // The scheduler keeps beating meanwhile (its silence would end
        // the registration).
        let bound = t2 + config().handshake_timeout;
        let mut now = t2;
        for seq in 0..100 {
            now = n.node.poll_at().expect("a deadline").max(now).min(now + Duration::from_millis(200));
            if now >= bound {
                break;
            }
            s.send(&wire::Heartbeat { seq, role: Role::Scheduler as u32, id: 0 }).unwrap();
            n.settle(now);
        }
        assert_eq!(ready_reports(&s.received().0), 0, "waits up to the bound");
        n.settle(bound);
        assert!(n.events().contains(&BackendEvent::Ready { after: config().handshake_timeout, missing: 1 }));
        assert_eq!(ready_reports(&s.received().0), 1);
    }
}
