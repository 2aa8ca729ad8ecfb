//! What a frontend node is configured with, what it tells its host, and
//! the bounds of its work: a leaf of the node's modules (it imports none of
//! them, so the link, the router and the node share these without a loop).

use dataplane::time::Duration;

/// Most tasks sent, and messages taken from one link, per poll: bounds the
/// work of one call. A poll that reaches it reports progress, so its host
/// polls again at once.
pub(super) const BURST: usize = 256;

/// How often a frontend without a scheduler answers the held requests that
/// can no longer meet their deadline (with failover on).
pub(super) const HOLD_SWEEP: Duration = Duration::from_millis(10);
/// How long a task answered `moved` by the group the frontend's table
/// still names waits before it is offered again (the table unchanged): the
/// owner may not have applied the revision the frontend has. Also the
/// period of the held table's sweep while tasks wait (with groups). 5 ms
/// rather than 20: in the `reroute2` harness class (per-node lags up to
/// 8 ms, budgets 25-50 ms) 20 ms let 9% of the resubmitted tasks end
/// dropped `moved`, 5 ms none (300 seeds).
pub const MOVED_RETRY: Duration = Duration::from_millis(5);
/// What a `FrontendNode` is.
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
    /// 1 ..= [`wire::MAX_TASKS_PER_MESSAGE`](dataplane::wire::MAX_TASKS_PER_MESSAGE)): a full batch leaves at once
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
    /// (`FrontendNode::with_failover`) the requests are held and resent
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

/// `d` for an operator: whole seconds as "5 s", otherwise milliseconds.
pub(super) fn human(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns >= 1_000_000_000 && ns.is_multiple_of(1_000_000_000) {
        format!("{} s", ns / 1_000_000_000)
    } else {
        format!("{} ms", ns / 1_000_000)
    }
}
