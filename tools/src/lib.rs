//! Library side of the `symphony` CLI: what its integration tests drive
//! directly (the local multi-process cluster).

pub mod autoscale;
pub mod chaos;
pub mod cluster;
pub mod groups;
pub mod inproc;
pub mod cli_doc;
pub mod throwaway_tls;
