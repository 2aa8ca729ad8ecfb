//! [`EtcdClient`]: etcd v3 (crate `etcd-v3`, the workspace's own client;
//! plain or TLS) behind blocking calls.
//!
//! The client is async; each call runs to completion on a private
//! current-thread runtime within the op timeout, so the calls block their
//! caller (an election or routes thread, never a planning loop). Every
//! failure to reach the store within the timeout is [`Unavailable`]; a
//! failed call drops the connection so the next call reconnects.

use std::future::Future;
use std::sync::Arc;

use dataplane::time::Duration;
use etcd_v3::{Client, ConnectOptions};

use crate::EtcdTls;

/// etcd could not be reached, or refused a call, within the op timeout.
/// Clone (election outcomes are), so the client's error is held in an
/// `Arc`.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Unavailable {
    /// The call failed: etcd answered with an error, or the connection
    /// could not be made or broke.
    #[error("etcd {call}: {source}")]
    Failed {
        /// The call (e.g. "lease revoke").
        call: &'static str,
        /// Why it failed.
        #[source]
        source: Arc<etcd_v3::Error>,
    },
    /// Nothing came back within the op timeout.
    #[error("etcd {call}: no answer within {timeout:?}")]
    NoAnswer {
        /// The call.
        call: &'static str,
        /// The op timeout it ran under.
        timeout: Duration,
    },
}

impl Unavailable {
    /// Whether etcd answered that what the call named does not exist
    /// (gRPC NotFound, e.g. revoking a lease that already lapsed).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Unavailable::Failed { source, .. }
            if matches!(&**source, etcd_v3::Error::Status(status) if status.code() == tonic::Code::NotFound))
    }
}

/// A blocking etcd v3 client (see the module docs).
pub struct EtcdClient {
    endpoints: Vec<String>,
    op_timeout: Duration,
    tls: Option<EtcdTls>,
    rt: tokio::runtime::Runtime,
    client: Option<Client>,
}

impl std::fmt::Debug for EtcdClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdClient")
            .field("endpoints", &self.endpoints)
            .field("op_timeout", &self.op_timeout)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

impl EtcdClient {
    /// A client of `endpoints` (`http://host:port`, `https://host:port`, or
    /// `host:port`: https with TLS, else http), over TLS when `tls` is
    /// given; each call, connecting included, bounded by `op_timeout`.
    /// Connects on first use: a store that is down at start is not an
    /// error (calls report [`Unavailable`] until it answers).
    pub fn new(endpoints: Vec<String>, op_timeout: Duration, tls: Option<EtcdTls>) -> std::io::Result<EtcdClient> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        Ok(EtcdClient { endpoints, op_timeout, tls, rt, client: None })
    }

    /// The bound on each call.
    pub fn op_timeout(&self) -> Duration {
        self.op_timeout
    }

    /// Runs `f` on the client within the op timeout, connecting first if
    /// needed; a failure drops the client so the next call reconnects.
    /// `what` names the call in the error.
    pub fn call<T, F, Fut>(&mut self, what: &'static str, f: F) -> Result<T, Unavailable>
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_v3::Error>>,
    {
        let timeout = std::time::Duration::from_nanos(self.op_timeout.as_nanos());
        let endpoints = self.endpoints.clone();
        let client = self.client.clone();
        let options = ConnectOptions { timeout, tls: self.tls.clone() };
        let out = self.rt.block_on(async move {
            tokio::time::timeout(timeout, async move {
                let client = match client {
                    Some(c) => c,
                    None => Client::connect(&endpoints, &options)?,
                };
                let out = f(client.clone()).await?;
                Ok::<_, etcd_v3::Error>((client, out))
            })
            .await
        });
        match out {
            Ok(Ok((client, out))) => {
                self.client = Some(client);
                Ok(out)
            }
            Ok(Err(e)) => {
                self.client = None;
                Err(Unavailable::Failed { call: what, source: Arc::new(e) })
            }
            Err(_) => {
                self.client = None;
                Err(Unavailable::NoAnswer { call: what, timeout: self.op_timeout })
            }
        }
    }

    /// Runs `fut` to completion on the client's runtime (for a stream the
    /// caller holds between calls, e.g. a lease keep-alive).
    pub fn block_on<F: Future>(&self, fut: F) -> F::Output {
        self.rt.block_on(fut)
    }

    /// Drops the connection: the next call reconnects.
    pub fn disconnect(&mut self) {
        self.client = None;
    }
}
