//! [`Etcd`]: the [`Election`] over an etcd v3 cluster (crate `etcd-v3`, the
//! workspace's own client; plain or TLS, see [`Etcd::with_tls`]).
//!
//! The leadership is one key holding the leader's identity, attached to a
//! lease of the leader's. The term (epoch) is the key's create revision:
//! etcd's revisions only grow, so a later election always has a larger
//! epoch, across every member and restart of the store.
//!
//! - `campaign`: grant a lease, then one transaction "if the key does not
//!   exist, put it on that lease". The put's revision is the epoch. A lost
//!   campaign revokes the lease it granted (nothing is left behind).
//! - `keep_alive`: one keep-alive on the term's lease over a stream that
//!   stays open between renewals; a TTL of 0 in the answer means the lease
//!   is gone (revoked by a standby, or expired).
//! - `revoke`: read the key; if it is still the term's, revoke its lease
//!   (which deletes the key). A standby uses it on a silent leader instead
//!   of waiting for etcd's expiry (TTL granularity 1 s, checked every
//!   500 ms: never sub-second).
//!
//! The client is async; each call runs to completion on a private
//! current-thread runtime within `op_timeout`, so the calls block their
//! caller (the election thread of the daemon, never the planning loop).
//! Every failure to reach the store within the timeout is
//! [`ElectionError::Store`] (the client's error as its source; a
//! keep-alive stream that ended is [`ElectionError::Unavailable`]): the [`Candidate`](super::Candidate)
//! decides what it means (a leader steps down before its lease can lapse).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use etcd_v3::{Client, Compare, KeepAliveStream, LeaseKeeper, RequestOp, TxnRequest};
pub use routing::{EtcdTls, EtcdTlsArgs, RoutesStoreError};
use routing::{EtcdClient, Unavailable};

use super::{Election, ElectionError, Epoch, Leadership};
use dataplane::time::{Duration, Instant};

/// Where and how to reach etcd.
#[derive(Clone, Debug)]
pub struct EtcdConfig {
    /// Client endpoints (`http://host:port`, `https://host:port`, or
    /// `host:port`: https with TLS, else http).
    pub endpoints: Vec<String>,
    /// The leadership key.
    pub key: String,
    /// Lease time to live; rounded up to whole seconds (etcd's
    /// granularity), at least 1 s. etcd itself raises it to 1.5 times its
    /// election timeout.
    pub lease_ttl: Duration,
    /// Bound on each call, connecting included.
    pub op_timeout: Duration,
}

/// The etcd election (see the module docs).
pub struct Etcd {
    cfg: EtcdConfig,
    client: EtcdClient,
    /// Leases of the terms this process leads (usually one).
    leases: HashMap<Epoch, i64>,
    /// The open keep-alive stream of one lease.
    keeper: Option<(i64, LeaseKeeper, KeepAliveStream)>,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd").field("cfg", &self.cfg).field("client", &self.client).field("leases", &self.leases).finish_non_exhaustive()
    }
}

impl Etcd {
    /// An election over `cfg.endpoints`; connects on first use (a store
    /// that is down at start is not an error: calls report `Unavailable`
    /// until it answers).
    pub fn new(cfg: EtcdConfig) -> std::io::Result<Etcd> {
        Etcd::with_tls(cfg, None)
    }

    /// As [`Etcd::new`], over TLS when `tls` is given (the CA of etcd's
    /// members and, for its `--client-cert-auth`, a client certificate).
    pub fn with_tls(cfg: EtcdConfig, tls: Option<EtcdTls>) -> std::io::Result<Etcd> {
        let client = EtcdClient::new(cfg.endpoints.clone(), cfg.op_timeout, tls)?;
        Ok(Etcd { cfg, client, leases: HashMap::new(), keeper: None })
    }

    /// The lease TTL granted, in whole seconds.
    pub fn ttl_secs(&self) -> i64 {
        let ns = self.cfg.lease_ttl.as_nanos();
        i64::try_from(ns.div_ceil(1_000_000_000)).unwrap_or(i64::MAX).max(1)
    }

    /// Runs `f` on the client (see [`EtcdClient::call`]).
    fn call<T, F, Fut>(&mut self, what: &'static str, f: F) -> Result<T, ElectionError>
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_v3::Error>>,
    {
        Ok(self.client.call(what, f)?)
    }

    /// One keep-alive of `lease` on its open stream (opened if needed):
    /// the TTL etcd answers (0: the lease is gone).
    fn keep_alive_once(&mut self, lease: i64) -> Result<i64, ElectionError> {
        if self.keeper.as_ref().is_none_or(|(id, _, _)| *id != lease) {
            let (keeper, stream) = self.call("lease keep-alive", |mut c| async move { c.lease_keep_alive(lease).await })?;
            self.keeper = Some((lease, keeper, stream));
        }
        let Some((_, mut keeper, mut stream)) = self.keeper.take() else {
            return Err(ElectionError::Unavailable("etcd lease keep-alive: no stream".into()));
        };
        let timeout = std::time::Duration::from_nanos(self.cfg.op_timeout.as_nanos());
        let answer = self.client.block_on(async {
            tokio::time::timeout(timeout, async {
                keeper.keep_alive().await?;
                stream.message().await.map_err(etcd_v3::Error::from)
            })
            .await
        });
        match answer {
            Ok(Ok(Some(resp))) => {
                self.keeper = Some((lease, keeper, stream));
                Ok(resp.ttl)
            }
            // The stream ended or failed: the next renewal opens another.
            Ok(Ok(None)) => Err(ElectionError::Unavailable("etcd lease keep-alive: the stream ended".into())),
            Ok(Err(e)) => {
                self.client.disconnect();
                Err(Unavailable::Failed { call: "lease keep-alive", source: Arc::new(e) }.into())
            }
            Err(_) => Err(Unavailable::NoAnswer { call: "lease keep-alive", timeout: self.cfg.op_timeout }.into()),
        }
    }

    /// The key's holder and term, with its lease id.
    fn read(&mut self) -> Result<Option<(Leadership, i64)>, ElectionError> {
        let key = self.cfg.key.clone();
        let resp = self.call("get", |mut c| async move { c.get(key).await })?;
        Ok(resp.kvs.first().map(|kv| {
            let leader = String::from_utf8_lossy(&kv.value).into_owned();
            let epoch = u64::try_from(kv.create_revision).unwrap_or(0);
            (Leadership { leader, epoch }, kv.lease)
        }))
    }
}

impl Election for Etcd {
    fn campaign(&mut self, _now: Instant, me: &str) -> Result<Option<Epoch>, ElectionError> {
        let ttl = self.ttl_secs();
        let lease = self.call("lease grant", |mut c| async move { c.lease_grant(ttl).await })?.id;
        let key = self.cfg.key.clone();
        let value = me.to_string();
        let txn = TxnRequest::when(vec![Compare::create_revision_is(key.clone(), 0)], vec![RequestOp::put(key, value, lease)]);
        let won = self.call("campaign", |mut c| async move { c.txn(txn).await });
        match won {
            Ok(resp) if resp.succeeded => {
                let epoch = resp.header.map_or(0, |h| u64::try_from(h.revision).unwrap_or(0));
                self.leases.insert(epoch, lease);
                Ok(Some(epoch))
            }
            other => {
                // Lost (or unknown): give the fresh lease back; if that
                // fails too it lapses within its TTL, holding nothing.
                let _ = self.call("lease revoke", |mut c| async move { c.lease_revoke(lease).await });
                other.map(|_| None)
            }
        }
    }

    fn keep_alive(&mut self, _now: Instant, epoch: Epoch) -> Result<(), ElectionError> {
        let Some(&lease) = self.leases.get(&epoch) else {
            return Err(ElectionError::LeaseLost(epoch));
        };
        match self.keep_alive_once(lease)? {
            ttl if ttl > 0 => Ok(()),
            _ => {
                self.leases.remove(&epoch);
                self.keeper = None;
                Err(ElectionError::LeaseLost(epoch))
            }
        }
    }

    fn leader(&mut self, _now: Instant) -> Result<Option<Leadership>, ElectionError> {
        Ok(self.read()?.map(|(l, _)| l))
    }

    fn revoke(&mut self, _now: Instant, epoch: Epoch) -> Result<(), ElectionError> {
        let lease = match self.leases.remove(&epoch) {
            Some(lease) => lease,
            None => match self.read()? {
                Some((l, lease)) if l.epoch == epoch => lease,
                // Another term holds the key, or nobody: nothing to do.
                _ => return Ok(()),
            },
        };
        if self.keeper.as_ref().is_some_and(|(id, _, _)| *id == lease) {
            self.keeper = None;
        }
        match self.call("lease revoke", |mut c| async move { c.lease_revoke(lease).await }) {
            Ok(_) => Ok(()),
            // Already gone (expired or revoked by another): the same end.
            Err(ElectionError::Store(why)) if why.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// The routing table's key (issue 19), on the election's connection; see
/// [`EtcdClient::get_routes`] and [`EtcdClient::put_routes`].
impl Etcd {
    /// The table under `key`, if any (bad bytes: `Malformed`).
    pub fn get_routes(&mut self, key: &str) -> Result<Option<scheduler_core::routes::RouteTable>, RoutesStoreError> {
        self.client.get_routes(key)
    }

    /// Writes `table` under `key` if it follows the stored table's
    /// revision (see [`EtcdClient::put_routes`]).
    pub fn put_routes(&mut self, key: &str, table: &scheduler_core::routes::RouteTable) -> Result<(), RoutesStoreError> {
        self.client.put_routes(key, table)
    }
}
