//! The routing table's key (issue 19): read, written with a compare on
//! the stored revision so that two writers never lose each other's move.

use etcd_v3::{Compare, RequestOp, TxnRequest};

use crate::{EtcdClient, Unavailable};

impl EtcdClient {
    /// The table under `key`, if any (bad bytes: `Malformed`).
    pub fn get_routes(&mut self, key: &str) -> Result<Option<scheduler_core::routes::RouteTable>, RoutesStoreError> {
        let key = key.to_string();
        let resp = self.call("get routes", |mut c| async move { c.get(key).await })?;
        match resp.kvs.first() {
            None => Ok(None),
            Some(kv) => Ok(Some(scheduler_core::routes::RouteTable::decode(&kv.value)?)),
        }
    }

    /// Writes `table` under `key` if the stored table's revision is
    /// `table.revision - 1` (or, for revision 1, nothing is stored yet):
    /// a table written on a stale read is refused as `Conflict`.
    pub fn put_routes(&mut self, key: &str, table: &scheduler_core::routes::RouteTable) -> Result<(), RoutesStoreError> {
        table.validate()?;
        let current = self.get_routes(key)?;
        let expected = table.revision.saturating_sub(1);
        let found = current.as_ref().map_or(0, |t| t.revision);
        if found != expected {
            return Err(RoutesStoreError::Conflict { stored: found, written: table.revision });
        }
        // The compare: the key is unchanged since the read (its mod
        // revision, or absent).
        let k = key.to_string();
        let read = self.call("get routes", |mut c| async move { c.get(k).await })?;
        let cmp = match read.kvs.first() {
            Some(kv) if current.is_some() => Compare::mod_revision_is(key, kv.mod_revision),
            _ => Compare::create_revision_is(key, 0),
        };
        let txn = TxnRequest::when(vec![cmp], vec![RequestOp::put(key, table.encode(), 0)]);
        let resp = self.call("put routes", |mut c| async move { c.txn(txn).await })?;
        if resp.succeeded {
            Ok(())
        } else {
            Err(RoutesStoreError::Conflict { stored: found, written: table.revision })
        }
    }
}

/// Why reading or writing the routing table failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RoutesStoreError {
    /// etcd cannot be reached.
    #[error(transparent)]
    Store(#[from] Unavailable),
    /// The stored bytes (or the table to write) are not a valid table.
    #[error(transparent)]
    Table(#[from] scheduler_core::routes::RouteError),
    /// Another writer got there first.
    #[error("the stored table has revision {stored}; revision {written} must follow revision {}", written.saturating_sub(1))]
    Conflict {
        /// The revision found.
        stored: u64,
        /// The revision offered.
        written: u64,
    },
}
