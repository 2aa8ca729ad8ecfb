//! The scheduler daemon and what only it needs.
//!
//! - [`daemon`]: `symphony-scheduler`, the sans-IO control plane, the
//!   `SchedulerNode` around it, its host and metrics.
//! - [`election`]: leader election over etcd (and in memory for tests).
//! - [`partition`]: models over sub-clusters (Appendix A): heuristic and MILP.
//!
//! The scheduling cores, policies and simulator live in the `scheduler-core`
//! crate (no etcd, tokio or MILP solver); they are re-exported here under
//! their old paths so `scheduler::sim`, `scheduler::zoo`, ... keep working.
#![warn(missing_docs)]

pub use scheduler_core::{
    analysis, autoscale, baselines, batch_past_heads, closed_loop, deferred, delay_watch, goodput,
    gpu, netdelay, policy, profile, repository, routes, runtime, serf, sim, types, zoo,
};

pub mod daemon;
pub mod election;
pub mod partition;
