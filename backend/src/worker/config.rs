//! The worker's configuration and its errors.

use dataplane::time::Duration;
use dataplane::transport::Error;

use crate::exec::ExecError;

/// Sizes and delays of a [`BatchWorker`].
#[derive(Clone, Copy, Debug)]
pub struct WorkerConfig {
    /// Largest batch (at most [`dataplane::wire::MAX_BATCH_TASKS`]).
    pub max_batch: u32,
    /// Bytes of one input slot (longest input).
    pub input_slot: u32,
    /// Bytes of one output slot (longest model output, at most
    /// [`dataplane::wire::MAX_INLINE_OUTPUT`]).
    pub output_slot: u32,
    /// Batch buffers: batches fetching, waiting, running or sending at
    /// once, over all devices (2-3 per device is plenty: one running, one
    /// fetching).
    pub batch_slots: u32,
    /// Largest frontend id + 1.
    pub max_frontends: u32,
    /// One-way control delay bound subtracted from a plan's `exec_in`.
    pub control_delay: Duration,
    /// How long after `exec_at` missing inputs are waited for before the
    /// batch runs without them.
    pub fetch_grace: Duration,
    /// Finished-batch reports kept for [`BatchWorker::pop_report`].
    pub report_capacity: u32,
    /// Start a batch as soon as its inputs are in and its device is idle,
    /// even before its planned `exec_at`. The plan fixed the batch's
    /// members, so starting early costs nothing and finishing early leaves
    /// slack for a late wake-up; the scheduler's plan for the device is
    /// unaffected (the device is free no later than it assumed).
    pub start_when_ready: bool,
}

impl WorkerConfig {
    /// Bytes of one batch buffer.
    pub fn batch_buffer_bytes(&self) -> u64 {
        u64::from(self.max_batch) * (u64::from(self.input_slot) + u64::from(self.output_slot))
    }
    /// Bytes the staging region needs.
    pub fn staging_bytes(&self) -> u64 {
        self.batch_buffer_bytes() * u64::from(self.batch_slots)
    }
    /// Where task `task`'s input of batch buffer `slot` lands: the input
    /// slots of a batch are contiguous (`input_slot` apart), which is what
    /// lets an executor read a whole batch in place.
    pub fn input_offset(&self, slot: usize, task: usize) -> u64 {
        slot as u64 * self.batch_buffer_bytes() + task as u64 * u64::from(self.input_slot)
    }
    /// Where output 0 of batch buffer `slot` goes (outputs `output_slot` apart).
    pub fn output_offset(&self, slot: usize) -> u64 {
        slot as u64 * self.batch_buffer_bytes()
            + u64::from(self.max_batch) * u64::from(self.input_slot)
    }
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            max_batch: 64,
            input_slot: 4096,
            output_slot: 1024,
            batch_slots: 8,
            max_frontends: 64,
            control_delay: Duration::ZERO,
            fetch_grace: Duration::from_millis(5),
            report_capacity: 1024,
            start_when_ready: false,
        }
    }
}

/// Worker failures.
#[derive(Debug)]
pub enum WorkerError {
    /// The configuration cannot work (why).
    Config(&'static str),
    /// The scheduler connection is gone.
    SchedulerGone,
    /// A transport call failed in a way that is not a task's failure.
    Transport(Error),
    /// The executor refused a batch that the worker checked (a bug).
    Executor(ExecError),
}

impl std::fmt::Display for WorkerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WorkerError::Config(w) => write!(f, "bad worker configuration: {w}"),
            WorkerError::SchedulerGone => write!(f, "scheduler connection lost"),
            WorkerError::Transport(e) => write!(f, "transport: {e}"),
            WorkerError::Executor(e) => write!(f, "executor: {e}"),
        }
    }
}

impl std::error::Error for WorkerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            WorkerError::Transport(e) => Some(e),
            WorkerError::Executor(e) => Some(e),
            WorkerError::Config(_) | WorkerError::SchedulerGone => None,
        }
    }
}
