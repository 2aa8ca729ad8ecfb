//! What the HTTP layer calls: [`InferenceService`] (submit a validated
//! request, get exactly one outcome; look up models), and its real
//! implementation [`ClusterService`], which stages the input in registered
//! memory and hands a [`wire::Task`] to a [`TaskSink`] (the daemon's
//! transport to the scheduler, or the in-process cluster in tests).

use crate::metrics::{Execution, LevelOutcome, Metrics, Stage};
use crate::models::{LateAnswers, ModelCatalog, ModelEntry, ModelStates, Resend};
use crate::staging::{CounterSnapshot, Outcome, RequestOptions, StageError, Staging, Ticket};
use dataplane::time::Duration;
use dataplane::wire::{self, DropReason, TaskStatus};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Why a task could not be handed on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SinkError(pub String);

/// Where tasks go: the daemon implements it over a dataplane transport to
/// the scheduler. `send` must not block for long (it runs on the HTTP
/// worker threads); a full queue is an error, not a wait.
pub trait TaskSink: Send + Sync + 'static {
    /// Hands `task` to the scheduler.
    fn send(&self, task: &wire::Task) -> Result<(), SinkError>;
    /// The client gave `ticket`'s request up: ends it as cancelled
    /// ([`Ticket::cancel`]; false if its outcome was already there). A sink
    /// with a scheduler link also tells the scheduler, so the task leaves
    /// its queue at once. Never blocks.
    fn cancel(&self, ticket: &mut Ticket) -> bool {
        ticket.cancel()
    }
}

/// A submitted request's outcome, still to come.
pub trait PendingOutcome: Future<Output = Outcome> + Send + Unpin {
    /// Gives up waiting: returns the outcome if it has arrived, otherwise
    /// ends the request as [`Outcome::TimedOut`] (counted as failed).
    fn expire(&mut self) -> Outcome;
    /// The execution the request was part of, once its outcome is in.
    fn execution(&self) -> Option<Execution> {
        None
    }
}

impl PendingOutcome for Ticket {
    fn expire(&mut self) -> Outcome {
        Ticket::expire(self)
    }
    fn execution(&self) -> Option<Execution> {
        Ticket::execution(self)
    }
}

/// Why a request was refused before it was accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SubmitError {
    /// No such model id.
    UnknownModel,
    /// The input does not have the model's byte length.
    BadInput(String),
    /// No capacity right now (every staging slot in use).
    Unavailable(String),
    /// The task could not be sent (the request counts as failed).
    SendFailed(String),
    /// Anything else.
    Internal(String),
}

/// The final result of one inference request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InferResult {
    /// The output tensor's bytes (little-endian elements).
    Ok(Vec<u8>),
    /// Dropped by the cluster, with the reason.
    Dropped(DropReason),
    /// Failed at the backend.
    Failed(TaskStatus),
    /// No outcome within the deadline plus grace.
    TimedOut,
    /// Refused before it was accepted.
    Refused(SubmitError),
    /// Its model was unloaded while it waited (model control): cancelled.
    Unloaded,
}

/// One request as [`InferenceService::submit`] takes it.
#[derive(Clone, Copy, Debug)]
pub struct Submission<'a> {
    /// The model's cluster id.
    pub model_id: u32,
    /// Exactly the model's input bytes.
    pub input: &'a [u8],
    /// Time until its deadline.
    pub budget: Duration,
    /// Priority and timeout.
    pub options: RequestOptions,
}

/// The service behind the HTTP API.
pub trait InferenceService: Send + Sync + 'static {
    /// The pending outcome of an accepted request.
    type Pending: PendingOutcome;

    /// The served models.
    fn catalog(&self) -> &ModelCatalog;
    /// Whether the service takes requests.
    fn ready(&self) -> bool;
    /// Submits `input` (exactly the model's input bytes) for model
    /// `model_id` with `budget` until its deadline, at `options.priority`;
    /// `options.timeout`, when shorter, becomes the budget and running out
    /// of it is answered as [`DropReason::Timeout`].
    fn submit(
        &self,
        model_id: u32,
        input: &[u8],
        budget: Duration,
        options: RequestOptions,
    ) -> Result<Self::Pending, SubmitError> {
        self.submit_one(Submission { model_id, input, budget, options })
    }
    /// [`submit`](Self::submit) with its arguments in one value: what an
    /// implementation provides.
    fn submit_one(&self, request: Submission<'_>) -> Result<Self::Pending, SubmitError>;
    /// The client gave `pending` up (disconnected, cancelled): unless its
    /// outcome is already in (then false), it ends as cancelled and the
    /// cluster is told to drop the task.
    fn cancel(&self, pending: &mut Self::Pending) -> bool;
    /// How long past the budget a caller waits before giving up.
    fn grace(&self) -> Duration;
    /// The metrics registry.
    fn metrics(&self) -> &Metrics;
    /// The global outcome counters.
    fn counters(&self) -> CounterSnapshot;
    /// Which models take requests (model control).
    fn model_states(&self) -> &ModelStates;

    /// Model metadata lookup by name (and version, if given).
    fn model(&self, name: &str, version: Option<&str>) -> Option<&ModelEntry> {
        self.catalog()
            .by_name(name)
            .filter(|m| version.is_none_or(|v| v == m.version))
    }
}

/// Submits and waits for exactly one outcome, giving up at
/// `budget + service.grace()`, and accounts for it in the service's
/// metrics (`arrived`: when the request arrived, for its durations). The
/// one accounting path of every protocol.
///
/// Dropping the returned future before it completes (the client
/// disconnected or cancelled the call) cancels the request
/// ([`InferenceService::cancel`]); a request whose outcome is in is not.
pub async fn infer<S: InferenceService>(
    service: &S,
    model_id: u32,
    input: &[u8],
    budget: Duration,
    options: RequestOptions,
    arrived: std::time::Instant,
) -> InferResult {
    let request = Submission { model_id, input, budget, options };
    let (result, exec) = wait_serving_late(service, request, arrived).await;
    let request_ns = arrived.elapsed().as_nanos() as u64;
    let metrics = service.metrics();
    match &result {
        InferResult::Ok(_) => metrics.record_success(model_id, request_ns / 1_000),
        other => {
            metrics.record_failure(model_id, request_ns / 1_000);
            if let InferResult::Dropped(r) = other {
                metrics.record_drop(model_id, *r);
            }
        }
    }
    if let Some(e) = exec {
        metrics.record_execution(model_id, request_ns, &e);
    }
    let outcome = match &result {
        InferResult::Ok(_) if request_ns > options.timeout.map_or(budget, |t| t.min(budget)).as_nanos() => LevelOutcome::Late,
        InferResult::Ok(_) => LevelOutcome::Ok,
        InferResult::Dropped(r) => LevelOutcome::Dropped(*r),
        InferResult::Failed(_) => LevelOutcome::Failed,
        InferResult::TimedOut => LevelOutcome::TimedOut,
        InferResult::Refused(_) => LevelOutcome::Refused,
        InferResult::Unloaded => LevelOutcome::Unloaded,
    };
    metrics.record_level(model_id, options.priority, outcome, exec.map(|e| Stage::split_us(request_ns, &e)));
    result
}

/// Cancels the request it holds when dropped before [`disarm`](Self::disarm):
/// the waiting future was dropped, so nobody is left to answer.
struct CancelOnDrop<'s, S: InferenceService> {
    service: &'s S,
    model_id: u32,
    pending: S::Pending,
    armed: bool,
}

impl<S: InferenceService> CancelOnDrop<'_, S> {
    /// The outcome is in: dropping no longer cancels.
    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl<S: InferenceService> Drop for CancelOnDrop<'_, S> {
    fn drop(&mut self) {
        if self.armed && self.service.cancel(&mut self.pending) {
            self.service
                .metrics()
                .record_drop(self.model_id, DropReason::Cancelled);
        }
    }
}

/// Most tries of one request under [`LateAnswers::Serve`], whatever its
/// bound: each is a task the scheduler plans, so a model whose every try
/// is dropped at once (an SLO below its batch of one) costs the cluster a
/// bounded multiple of a request, not a busy loop until the bound.
const LATE_TRIES_CAP: u32 = 64;

/// [`wait_outcome`]; for a model that serves late answers
/// ([`LateAnswers::Serve`]) and a request whose client set no timeout of
/// its own, the wait for an outcome lasts until the model's bound from
/// `arrived` (a batch that runs late on a busy host is still answered),
/// and each try that ended for a [`Resend`] cause ([`resend_cause`]: a
/// drop for the deadline, a batch the scheduler gave up, an input not
/// fetched) submits it again with a fresh SLO, behind the requests that
/// can still meet theirs (their deadlines are earlier), as long as
/// another SLO keeps it within the bound and within `bound / SLO + 1`
/// tries ([`LATE_TRIES_CAP`] at most); each resend is counted
/// (`symphony_late_resends`). The scheduler sees each try as a new
/// request: its policy for the others is unchanged.
async fn wait_serving_late<S: InferenceService>(
    service: &S,
    request: Submission<'_>,
    arrived: std::time::Instant,
) -> (InferResult, Option<Execution>) {
    let late = match service.catalog().late_answers(request.model_id) {
        LateAnswers::Serve { max_wait } if request.options.timeout.is_none() => {
            service.catalog().by_id(request.model_id).map(|m| (max_wait, m.spec.slo))
        }
        _ => None,
    };
    let Some((max_wait, slo)) = late else {
        return wait_outcome(service, request, std::time::Duration::ZERO).await;
    };
    let patience = || max_wait.saturating_sub(arrived.elapsed());
    let slo_std = std::time::Duration::from_nanos(slo.as_nanos());
    let tries = (max_wait.as_nanos() / slo_std.as_nanos().max(1)).min(u128::from(LATE_TRIES_CAP - 1)) as u32 + 1;
    let mut outcome = wait_outcome(service, request, patience()).await;
    for _ in 1..tries {
        let Some(cause) = resend_cause(&outcome.0) else { break };
        if arrived.elapsed() + slo_std > max_wait {
            break;
        }
        service.metrics().record_resend(request.model_id, cause);
        outcome = wait_outcome(service, Submission { budget: slo, ..request }, patience()).await;
    }
    outcome
}

/// The one rule of which tries a late-serving model sends again: the
/// [`Resend`] cause of a try that ended in `result`, or `None` if it is
/// answered as it ended.
pub fn resend_cause(result: &InferResult) -> Option<Resend> {
    match result {
        InferResult::Dropped(DropReason::DeadlineUnmeetable | DropReason::EarlyDrop) => Some(Resend::Deadline),
        InferResult::Failed(TaskStatus::Abandoned) => Some(Resend::Abandoned),
        InferResult::Failed(TaskStatus::InputUnavailable) | InferResult::Dropped(DropReason::InputUnavailable) => {
            Some(Resend::InputUnavailable)
        }
        _ => None,
    }
}

/// Submits one try and waits for its outcome until `budget` plus the
/// service's grace, or `patience` if that is longer (a model serving late
/// answers), then gives it up as timed out.
async fn wait_outcome<S: InferenceService>(
    service: &S,
    request: Submission<'_>,
    patience: std::time::Duration,
) -> (InferResult, Option<Execution>) {
    let Submission { model_id, budget, options, .. } = request;
    let pending = match service.submit_one(request) {
        Ok(p) => p,
        Err(e) => return (InferResult::Refused(e), None),
    };
    let mut guard = CancelOnDrop {
        service,
        model_id,
        pending,
        armed: true,
    };
    let wait = options.timeout.map_or(budget, |t| t.min(budget));
    let limit = std::time::Duration::from_nanos(wait.saturating_add(service.grace()).as_nanos()).max(patience);
    let outcome = tokio::select! {
        o = &mut guard.pending => Some(o),
        _ = tokio::time::sleep(limit) => Some(guard.pending.expire()),
        () = service.model_states().unloaded(model_id) => None,
    };
    let outcome = match outcome {
        Some(o) => o,
        // The model was unloaded while the request waited: it is cancelled
        // (slot freed, accounted as cancelled) and answered as unloaded,
        // unless its outcome came in first.
        None if service.cancel(&mut guard.pending) => {
            guard.disarm();
            service.metrics().record_drop(model_id, DropReason::Cancelled);
            return (InferResult::Unloaded, None);
        }
        None => (&mut guard.pending).await,
    };
    guard.disarm();
    let pending = &guard.pending;
    let result = match outcome {
        Outcome::Ok(b) => InferResult::Ok(b),
        Outcome::Dropped(r) => InferResult::Dropped(r),
        Outcome::Failed(s) => InferResult::Failed(s),
        Outcome::TimedOut => InferResult::TimedOut,
    };
    (result, pending.execution())
}

/// The real service: stages inputs in a [`Staging`] area and sends tasks
/// through a [`TaskSink`]; outcomes come back through
/// [`Staging::route`] / [`Staging::route_message`].
pub struct ClusterService<S: TaskSink> {
    catalog: Arc<ModelCatalog>,
    staging: Arc<Staging>,
    sink: S,
    metrics: Arc<Metrics>,
    grace: Duration,
    ready: Arc<AtomicBool>,
    return_margin: Duration,
    states: ModelStates,
}

impl<S: TaskSink> std::fmt::Debug for ClusterService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterService")
            .field("staging", &self.staging)
            .finish()
    }
}

impl<S: TaskSink> ClusterService<S> {
    /// A service over `staging` sending to `sink`; requests wait at most
    /// their budget plus `grace` for an outcome.
    pub fn new(
        catalog: Arc<ModelCatalog>,
        staging: Arc<Staging>,
        sink: S,
        metrics: Arc<Metrics>,
        grace: Duration,
    ) -> Self {
        metrics.register_staging(&staging);
        ClusterService {
            states: ModelStates::all_loaded(&catalog),
            catalog,
            staging,
            sink,
            metrics,
            grace,
            ready: Arc::new(AtomicBool::new(true)),
            return_margin: Duration::ZERO,
        }
    }
    /// Keeps `margin` of every request's budget for the way back: the
    /// scheduler is told the budget minus `margin`, so a batch that
    /// finishes at its deadline still leaves time for the output's trip
    /// and the answer.
    pub fn with_return_margin(mut self, margin: Duration) -> Self {
        self.return_margin = margin;
        self
    }
    /// Makes [`InferenceService::ready`] follow `flag` (a daemon is ready
    /// only while registered with the scheduler).
    pub fn with_ready(mut self, flag: Arc<AtomicBool>) -> Self {
        self.ready = flag;
        self
    }
    /// The task sink.
    pub fn sink(&self) -> &S {
        &self.sink
    }
    /// The staging area (completions are routed through it).
    pub fn staging(&self) -> &Arc<Staging> {
        &self.staging
    }
}

impl<S: TaskSink> InferenceService for ClusterService<S> {
    type Pending = Ticket;

    fn catalog(&self) -> &ModelCatalog {
        &self.catalog
    }
    fn ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
    fn submit_one(&self, request: Submission<'_>) -> Result<Ticket, SubmitError> {
        let Submission { model_id, input, budget, options } = request;
        let model = self
            .catalog
            .by_id(model_id)
            .ok_or(SubmitError::UnknownModel)?;
        if input.len() as u64 != model.input.byte_len() {
            return Err(SubmitError::BadInput(format!(
                "input has {} bytes, model '{}' takes {}",
                input.len(),
                model.spec.name,
                model.input.byte_len()
            )));
        }
        // The way back needs its margin whichever of budget and timeout
        // ends first.
        let options = RequestOptions {
            timeout: options.timeout.map(|t| t.saturating_sub(self.return_margin)),
            ..options
        };
        let (task, ticket) = self
            .staging
            .stage_with(model_id, input, budget.saturating_sub(self.return_margin), options)
            .map_err(|e| match e {
                StageError::Full => SubmitError::Unavailable(e.to_string()),
                StageError::TooLarge => SubmitError::BadInput(e.to_string()),
                StageError::Memory(_) | StageError::Reference(_) => SubmitError::Internal(e.to_string()),
            })?;
        if let Err(e) = self.sink.send(&task) {
            ticket.fail_unsent();
            return Err(SubmitError::SendFailed(e.0));
        }
        Ok(ticket)
    }
    fn cancel(&self, ticket: &mut Ticket) -> bool {
        self.sink.cancel(ticket)
    }
    fn grace(&self) -> Duration {
        self.grace
    }
    fn metrics(&self) -> &Metrics {
        &self.metrics
    }
    fn counters(&self) -> CounterSnapshot {
        self.staging.counters().snapshot()
    }
    fn model_states(&self) -> &ModelStates {
        &self.states
    }
}
