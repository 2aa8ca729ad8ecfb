//! Leader election for hot-standby schedulers (issue 18), behind a trait
//! so that the deterministic harness and the tests run it in memory and a
//! deployment runs it over etcd.
//!
//! * [`Election`]: the store's side — a lease-backed leadership key with
//!   an epoch (etcd: the revision of the election; [`InMemory`]: a
//!   counter), kept alive, revoked, read.
//! * [`Candidate`]: one scheduler's side, sans-IO (explicit `now`, no
//!   clock, no thread): a standby campaigns when no leader holds the key
//!   or when the leader's heartbeats stop for the failure timeout (it then
//!   revokes the silent leader's lease at once instead of waiting for etcd
//!   to expire it: etcd's lease TTL has 1 s granularity); a leader that
//!   cannot renew its lease steps down once the lease could have lapsed,
//!   so two leaders never plan at once.
//! * [`Etcd`]: the store over etcd v3; [`LocalEtcd`]: a throwaway local
//!   etcd cluster for tests and `symphony up --ha`.

mod candidate;
mod etcd;
mod local_etcd;
mod memory;

pub use candidate::{Candidate, CandidateConfig, Heard, RoleEvent, Standing};
pub use etcd::{Etcd, EtcdConfig, EtcdTls, EtcdTlsArgs, RoutesStoreError};
pub use local_etcd::{etcd_binary, LocalEtcd, LocalEtcdError};
pub use memory::InMemory;

use dataplane::time::Instant;

/// A leadership term: strictly increasing across elections, carried in
/// every plan so that backends can fence off an old leader.
pub type Epoch = u64;

/// Who leads, in which term.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leadership {
    /// The leader's control address (where peers join).
    pub leader: String,
    /// Its term.
    pub epoch: Epoch,
}

/// Why an election call failed. Not PartialEq: `Store` holds the etcd
/// client's error; callers match on the variant.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ElectionError {
    /// The store cannot be reached (partitioned away in the in-memory
    /// store; a keep-alive stream that ended in etcd's).
    #[error("the election store is unavailable: {0}")]
    Unavailable(String),
    /// An etcd call failed or went unanswered (etcd down or partitioned
    /// away); the client's error is its source.
    #[error("the election store is unavailable: {0}")]
    Store(#[from] routing::Unavailable),
    /// The lease of this term is gone (expired or revoked).
    #[error("the lease of epoch {0} is gone")]
    LeaseLost(Epoch),
}

/// The store's side of leader election (see the module docs). Calls may
/// block on the network in the etcd implementation; hosts call them off
/// the planning thread.
pub trait Election {
    /// Tries to become leader as `me` with a fresh lease: the new term if
    /// the key was free (or its lease had lapsed), `None` if another
    /// holds it.
    fn campaign(&mut self, now: Instant, me: &str) -> Result<Option<Epoch>, ElectionError>;
    /// Renews the lease of term `epoch` (the leader, once per heartbeat).
    fn keep_alive(&mut self, now: Instant, epoch: Epoch) -> Result<(), ElectionError>;
    /// The current leadership, if a live lease holds the key.
    fn leader(&mut self, now: Instant) -> Result<Option<Leadership>, ElectionError>;
    /// Revokes the lease of term `epoch` (a standby that saw its leader go
    /// silent); revoking a term that is already gone is not an error.
    fn revoke(&mut self, now: Instant, epoch: Epoch) -> Result<(), ElectionError>;
}
