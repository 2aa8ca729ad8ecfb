//! [`InMemory`]: the election store for the deterministic harness and the
//! tests. Every candidate holds a clone; they share one key. Time is the
//! callers' `now`; the store can be made unavailable to model an etcd
//! outage or a partition from it.

use super::{Election, ElectionError, Epoch, Leadership};
use dataplane::time::{Duration, Instant};
use std::sync::{Arc, Mutex};

#[derive(Debug)]
struct Lease {
    holder: String,
    epoch: Epoch,
    expires: Instant,
}

#[derive(Debug, Default)]
struct Store {
    lease: Option<Lease>,
    /// The last term granted (etcd: the revision).
    revision: Epoch,
    /// Names of candidates cut off from the store (all if `down`).
    cut: Vec<String>,
    down: bool,
}

/// An in-memory election store (see the module docs).
#[derive(Clone, Debug)]
pub struct InMemory {
    store: Arc<Mutex<Store>>,
    ttl: Duration,
    /// Whose handle this is (for partitions from the store).
    me: String,
}

impl InMemory {
    /// A store whose leases last `ttl` past their last renewal.
    pub fn new(ttl: Duration) -> Self {
        InMemory { store: Arc::default(), ttl, me: String::new() }
    }

    /// A handle on the same store for candidate `me`.
    pub fn handle(&self, me: &str) -> Self {
        InMemory { store: self.store.clone(), ttl: self.ttl, me: me.to_string() }
    }

    /// Makes the whole store (un)reachable.
    pub fn set_down(&self, down: bool) {
        self.lock().down = down;
    }

    /// Cuts candidate `who` off the store (or reconnects it).
    pub fn set_cut(&self, who: &str, cut: bool) {
        let mut s = self.lock();
        s.cut.retain(|c| c != who);
        if cut {
            s.cut.push(who.to_string());
        }
    }

    /// The term granted last.
    pub fn revision(&self) -> Epoch {
        self.lock().revision
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        // A panic elsewhere while holding it leaves the data consistent
        // (every update is one assignment).
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The store, if this handle reaches it; expired leases dropped.
    fn reach(&self, now: Instant) -> Result<std::sync::MutexGuard<'_, Store>, ElectionError> {
        let mut s = self.lock();
        if s.down || s.cut.contains(&self.me) {
            return Err(ElectionError::Unavailable(format!("{} cannot reach the store", self.me)));
        }
        if s.lease.as_ref().is_some_and(|l| l.expires <= now) {
            s.lease = None;
        }
        Ok(s)
    }
}

impl Election for InMemory {
    fn campaign(&mut self, now: Instant, me: &str) -> Result<Option<Epoch>, ElectionError> {
        let ttl = self.ttl;
        let mut s = self.reach(now)?;
        if s.lease.is_some() {
            return Ok(None);
        }
        s.revision += 1;
        let epoch = s.revision;
        s.lease = Some(Lease { holder: me.to_string(), epoch, expires: now.saturating_add(ttl) });
        Ok(Some(epoch))
    }

    fn keep_alive(&mut self, now: Instant, epoch: Epoch) -> Result<(), ElectionError> {
        let ttl = self.ttl;
        let mut s = self.reach(now)?;
        match s.lease.as_mut() {
            Some(l) if l.epoch == epoch => {
                l.expires = now.saturating_add(ttl);
                Ok(())
            }
            _ => Err(ElectionError::LeaseLost(epoch)),
        }
    }

    fn leader(&mut self, now: Instant) -> Result<Option<Leadership>, ElectionError> {
        let s = self.reach(now)?;
        Ok(s.lease.as_ref().map(|l| Leadership { leader: l.holder.clone(), epoch: l.epoch }))
    }

    fn revoke(&mut self, now: Instant, epoch: Epoch) -> Result<(), ElectionError> {
        let mut s = self.reach(now)?;
        if s.lease.as_ref().is_some_and(|l| l.epoch == epoch) {
            s.lease = None;
        }
        Ok(())
    }
}
