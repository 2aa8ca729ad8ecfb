//! The client-facing side (see docs/architecture.md): the Open Inference
//! Protocol (KServe v2) over HTTP and gRPC, input staging in registered memory,
//! completion routing, Prometheus metrics, the sans-IO frontend node and
//! an open-loop HTTP load generator. (The in-process stack that runs the
//! nodes behind this HTTP server is `tools::inproc`.)
#![warn(missing_docs)]

pub mod api;
/// The `symphony-frontend` daemon (feature `etcd`, on by default).
#[cfg(feature = "etcd")]
pub mod daemon;
pub mod grpc;
pub use node::held;
pub mod http;
pub mod loadgen;
pub mod metrics;
pub mod models;
pub mod node;
pub mod protocol;
pub mod service;
pub mod staging;
pub mod tensor;
pub mod tls;
pub mod types;
