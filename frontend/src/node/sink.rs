//! The queue between the frontend's request handlers and its node: the
//! [`NetSink`] the service pushes tasks and cancellations into, the
//! [`TaskSource`] the node drains, and the node's counters they share.

use crate::service::{SinkError, TaskSink};
use crate::staging::Ticket;
use crossbeam_queue::ArrayQueue;
use node_shell::metrics::{Computed, MetricsRegistry};
use dataplane::waitset::Notifier;
use dataplane::wire::Task;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

/// Sink states: tasks are refused until registration, taken while
/// registered, refused again once the node drains or lost its scheduler.
pub(super) const SINK_CLOSED: u8 = 0;
pub(super) const SINK_OPEN: u8 = 1;
pub(super) const SINK_DRAINING: u8 = 2;

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
    /// Data links refused before registering (no or a wrong proof, none in
    /// time, evicted while handshaking, too many backends).
    pub data_links_refused: AtomicU64,
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
        let counters: [(&str, &str, Read); 9] = [
            ("symphony_frontend_data_links_refused", "Data connections refused before registering (no or a wrong join proof, none in time, evicted while handshaking, too many backends)", |s| {
                s.data_links_refused.load(Ordering::Relaxed)
            }),
            ("symphony_frontend_refused_memory_keys", "READs and accesses of this process refused for a key naming no live registration (wrong, guessed or stale)", |_| {
                dataplane::mem::refused_key_accesses()
            }),
            ("symphony_frontend_refused_reads", "READs of staging memory refused: their capability did not verify for the reading backend (another task's input, a forged or missing capability; tcp only)", |_| {
                dataplane::capability::refused_reads()
            }),
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
pub(super) struct TaskQueue {
    pub(super) tasks: ArrayQueue<Task>,
    /// Ids of cancelled tasks, for the scheduler.
    pub(super) cancels: ArrayQueue<u64>,
    pub(super) state: AtomicU8,
    waker: Option<Notifier>,
    pub(super) stats: Arc<FrontendStats>,
}

/// The [`TaskSink`] in front of a `FrontendNode`: a bounded lock-free
/// queue the node drains (waking its host through the optional
/// [`Notifier`]). Never blocks; a full queue, or a sink the node has not
/// opened (not registered with the scheduler) or has closed, is an error,
/// so the request fails at once (counted) instead of waiting.
#[derive(Clone, Debug)]
pub struct NetSink {
    queue: Arc<TaskQueue>,
}

/// The node's end of a [`NetSink`]'s queue (give it to
/// `FrontendNode::new`).
#[derive(Debug)]
pub struct TaskSource {
    pub(super) queue: Arc<TaskQueue>,
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
