//! What the worker hands its caller: counters, finished-batch reports,
//! refused plans and the scheduler's control messages.

use dataplane::time::{Duration, Instant};
use dataplane::wire;

/// Counters (monotone).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// Batch plans received.
    pub plans: u64,
    /// Batches the executor ran.
    pub batches_executed: u64,
    /// Tasks answered with an output.
    pub tasks_ok: u64,
    /// Tasks answered with an error status.
    pub tasks_failed: u64,
    /// READs posted.
    pub reads_posted: u64,
    /// READs that completed with an error or never got posted.
    pub reads_failed: u64,
    /// Error completions sent to the scheduler (frontend gone or unknown).
    pub rerouted_to_scheduler: u64,
    /// Completions that could not be sent anywhere.
    pub undeliverable: u64,
    /// Batches that started more than
    /// [`LATE_START_THRESHOLD`](crate::worker::LATE_START_THRESHOLD)
    /// after their `exec_at`.
    pub late_starts: u64,
    /// Messages from peers that the worker does not handle.
    pub ignored_messages: u64,
    /// Control messages (Register, Heartbeat) queued for the caller.
    pub control_messages: u64,
    /// Reports dropped because nobody popped them.
    pub reports_dropped: u64,
    /// Plans ignored because their batch id was not above every earlier
    /// plan's (a duplicated or replayed plan: never executed twice).
    pub duplicate_plans: u64,
    /// Plans refused on arrival because their epoch was older than the
    /// newest seen (reason `stale_epoch`): never executed.
    pub stale_plans: u64,
    /// Batches held but not started when a newer epoch was seen, dropped
    /// unexecuted (reason `superseded`): the new leader plans their tasks
    /// again (frontends resubmit what they still await).
    pub superseded_batches: u64,
    /// Plans skipped unexecuted because they had not started by the time
    /// the scheduler gives them up ([`BatchWorker::set_plan_grace`](crate::BatchWorker::set_plan_grace)):
    /// a lagging backend catching up.
    pub plans_skipped: u64,
}

/// Why a plan was not executed because of its epoch (metric label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceReason {
    /// It arrived with an epoch older than the newest seen.
    StaleEpoch,
    /// It was held, not started, when a newer epoch was seen.
    Superseded,
}

impl FenceReason {
    /// Stable snake_case name: metric label.
    pub const fn as_str(self) -> &'static str {
        match self {
            FenceReason::StaleEpoch => "stale_epoch",
            FenceReason::Superseded => "superseded",
        }
    }
}

/// A plan refused for its epoch, for the host's log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FencedPlan {
    /// The batch.
    pub batch_id: u64,
    /// Its epoch.
    pub epoch: u32,
    /// The newest epoch seen when it was refused.
    pub newest: u32,
    /// Why.
    pub reason: FenceReason,
}

/// Refusals kept for [`BatchWorker::pop_fenced`] (older ones are only
/// counted).
pub(super) const FENCED_CAPACITY: usize = 64;

/// A scheduler message that is not a plan, handed to the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControlMessage {
    /// A registration, e.g. `Register{Frontend, fid, 0, endpoint}`: a
    /// frontend the backend should open a data connection to.
    Register(wire::Register),
    /// The scheduler's heartbeat.
    Heartbeat(wire::Heartbeat),
    /// The scheduler's answer to this backend's drain notice.
    Drain(wire::Drain),
}

/// One finished batch, for observers and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchReport {
    /// Scheduler's batch id.
    pub batch_id: u64,
    /// Device.
    pub gpu: u32,
    /// Model.
    pub model: u32,
    /// When the plan arrived.
    pub received: Instant,
    /// Planned start on this process's clock.
    pub exec_at: Instant,
    /// When its inputs were in place and it was handed to its device
    /// (`None`: nothing ran).
    pub submitted: Option<Instant>,
    /// Actual start (`None`: nothing ran, every input failed).
    pub start: Option<Instant>,
    /// Actual finish.
    pub finish: Option<Instant>,
    /// Tasks answered with an output.
    pub ok: u32,
    /// Tasks answered with an error.
    pub failed: u32,
    /// The slowest successful input READ, post to completion.
    pub read_max: Duration,
    /// The planning scheduler's election epoch.
    pub epoch: u32,
}
