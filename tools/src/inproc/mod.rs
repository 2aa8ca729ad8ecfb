//! The cluster of real nodes in one process: [`cluster::NodeCluster`]
//! (every node over the `sim` transport, driven by the caller's clock),
//! which the chaos harness runs on virtual time and [`server`] runs on the
//! real clock behind a KServe v2 HTTP server.

pub mod cluster;
pub mod server;
