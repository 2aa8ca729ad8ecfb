//! Plain data types several frontend modules share: the statistics the API
//! layer computes and the protocol encodes, and the execution a completion
//! reports, which the staging area carries and the metrics count. A leaf
//! (it imports no frontend module), so no two modules import each other
//! through them; `api` and `metrics` re-export them under their old paths.

use dataplane::wire::CompletionHead;

/// The execution a task was part of, as its backend reported it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Execution {
    /// Tasks the execution ran.
    pub batch_size: u32,
    /// This task's position in it (0: the leader, which counts the
    /// execution).
    pub batch_index: u32,
    /// Plan arrival at the backend to hand-over to the device, ns.
    pub input_ns: u64,
    /// On the device, ns.
    pub compute_ns: u64,
    /// Execution start to the completion's sending, ns.
    pub since_start_ns: u64,
    /// Ingress at the scheduler to the plan's sending, µs.
    pub queued_us: u32,
}

impl Execution {
    /// The execution a completion names (`None`: not executed).
    pub fn from_head(h: &CompletionHead) -> Option<Execution> {
        (h.batch_size > 0).then_some(Execution {
            batch_size: h.batch_size,
            batch_index: h.batch_index,
            input_ns: h.input_ns,
            compute_ns: h.compute_ns,
            since_start_ns: h.since_start_ns,
            queued_us: h.queued_us,
        })
    }
}

/// One repository index entry (name, version, state, reason).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    /// Model name.
    pub name: String,
    /// Model version.
    pub version: String,
    /// `READY` or `UNAVAILABLE`.
    pub state: &'static str,
    /// Why not ready ("" when ready).
    pub reason: &'static str,
}

/// A count and a total duration (Triton's `StatisticDuration`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CountNs {
    /// How many.
    pub count: u64,
    /// Their total duration, nanoseconds.
    pub ns: u64,
}

/// Executions of one batch size (Triton's `InferBatchStatistics`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// The batch size: the upper bound of a `metrics::BATCH_BUCKETS` bucket (the
    /// counters keep a histogram, not every size).
    pub batch_size: u64,
    /// Executions in the bucket (duration not kept per bucket: 0).
    pub compute_infer: CountNs,
}

/// One model's statistics (Triton's `ModelStatistics`), from the same
/// counters as `/metrics`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelStats {
    /// Model name.
    pub name: String,
    /// Model version.
    pub version: String,
    /// Last successful inference, milliseconds since the Unix epoch (0: none).
    pub last_inference: u64,
    /// Inferences performed (= successful requests, batch 1 each).
    pub inference_count: u64,
    /// Model executions (batches).
    pub execution_count: u64,
    /// Successful requests and their end-to-end time.
    pub success: CountNs,
    /// Failed requests and their end-to-end time.
    pub fail: CountNs,
    /// Requests executed and their summed queueing time.
    pub queue: CountNs,
    /// Requests executed and their summed input time (backend READs until the device took the batch).
    pub compute_input: CountNs,
    /// Requests executed and their summed compute time.
    pub compute_infer: CountNs,
    /// Requests executed and their summed output time (device finish until the backend sent the result).
    pub compute_output: CountNs,
    /// Executions per batch-size bucket (buckets with none left out).
    pub batch_stats: Vec<BatchStats>,
}
