//! The client-facing side (see docs/architecture.md): the Open Inference
//! Protocol (KServe v2) over HTTP, input staging in registered memory,
//! completion routing, Prometheus metrics, an in-process cluster for tests
//! and an open-loop HTTP load generator.
#![warn(missing_docs)]

pub mod cluster;
pub mod daemon;
pub mod http;
pub mod loadgen;
pub mod local;
pub mod metrics;
pub mod models;
pub mod node;
pub mod protocol;
pub mod service;
pub mod staging;
pub mod tensor;
