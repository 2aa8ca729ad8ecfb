//! The routing table's etcd side (issue 19), apart from the scheduler
//! daemon so that a frontend follows the table without building the
//! daemon, its election or its partitioner.
//!
//! - [`EtcdClient`]: a blocking etcd v3 client (a private current-thread
//!   runtime, connect on first use, every call bounded); the scheduler's
//!   election runs over it too.
//! - [`EtcdTlsArgs`]: the TLS flags of every command that reaches etcd.
//! - [`EtcdClient::get_routes`], [`EtcdClient::put_routes`]: the table's
//!   key, written with a compare on the stored revision.
//! - [`watch`]: the follower thread ([`RoutesWatch`]) that re-reads the key
//!   and wakes its daemon's poll loop when the table changes.
//!
//! The table itself ([`scheduler_core::routes::RouteTable`]) is a pure
//! value in `scheduler-core`.
#![warn(missing_docs)]

mod client;
mod store;
mod tls;
pub mod watch;

pub use client::{EtcdClient, Unavailable};
pub use store::RoutesStoreError;
pub use tls::{EtcdTls, EtcdTlsArgs};
pub use watch::{RoutesConfig, RoutesWatch};
