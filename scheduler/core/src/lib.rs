//! The scheduling cores of the serving system, with no daemon around them:
//! no etcd client, no async runtime and no MILP solver (those live in the
//! `scheduler` crate's daemon, election and partitioner).
//!
//! - [`profile`], [`zoo`]: batch latency profiles and the paper's model zoo.
//! - [`types`]: requests, actions and the sans-IO [`types::Scheduler`] trait.
//! - [`deferred`]: Symphony's deferred batch scheduling (ModelThread and
//!   RankThread cores), and the timeout/eager rules.
//! - [`baselines`]: the Clockwork, Shepherd and Nexus policies.
//! - [`policy`]: one constructor for every policy.
//! - [`netdelay`]: the network delay bound charged before each batch.
//! - [`gpu`]: the emulated GPUs every simulated or emulated backend uses.
//! - [`sim`]: the simulator, its arrival generator and the event order.
//! - [`goodput`]: the goodput search over simulated runs.
//! - [`autoscale`]: the autoscaler acting on the paper's add/remove rule.
//! - [`repository`]: Triton-layout model repositories and `config.pbtxt`.
//! - [`routes`]: the routing table of several active scheduler groups.
//! - [`serf`]: SERF's M/D/c-with-interference latency predictor.
//! - [`runtime`]: the live ModelThread/RankThread runtime over SPSC rings.
#![warn(missing_docs)]

pub mod analysis;
pub mod autoscale;
pub mod baselines;
pub mod batch_past_heads;
pub mod closed_loop;
pub mod deferred;
pub mod delay_watch;
pub mod goodput;
pub mod gpu;
pub mod netdelay;
pub mod policy;
pub mod profile;
pub mod repository;
pub mod routes;
pub mod runtime;
pub mod serf;
pub mod sim;
pub mod types;
pub mod zoo;
