//! The follower of the routing table (issue 19), run by the scheduler
//! daemon (with `--group`) and the frontend (with `--etcd`).
//!
//! A thread `sched-routes` reads the table from etcd
//! every `--routes-poll-ms` on its own client (etcd calls block; never on
//! the planning thread), keeps the newest revision it has read, and wakes
//! the poll loop when it changes. The poll loop hands it to the node
//! (the scheduler's `SchedulerNode::handle_routes`, the frontend's router),
//! which applies it only if it is newer than the one it has. A re-read of
//! the key is the whole watch: the table is small and changes rarely, and
//! a re-read needs no resumption logic after an etcd failover (an older
//! revision read from a lagging member is ignored by the revision rule).
//! [`RoutesWatch::read_now`] asks for a read before the period is over
//! (a frontend told `moved` by the group its table names: its table may be
//! old), at most one per [`MIN_GAP`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use dataplane::time::Duration;
use dataplane::waitset::Notifier;
use tracing::warn;

use scheduler_core::routes::RouteTable;

use crate::{EtcdClient, EtcdTls};

/// What `--group` configures.
#[derive(Clone, Debug)]
pub struct RoutesConfig {
    /// etcd client endpoints (the election's).
    pub endpoints: Vec<String>,
    /// This scheduler's group in the table.
    pub group: String,
    /// The table's key.
    pub key: String,
    /// How often the key is re-read.
    pub poll: Duration,
    /// TLS to etcd (`None`: plain HTTP).
    pub tls: Option<EtcdTls>,
}

/// The least time between two reads, however often one is asked for.
pub const MIN_GAP: std::time::Duration = std::time::Duration::from_millis(2);

struct Shared {
    newest: Mutex<Option<Arc<RouteTable>>>,
    revision: AtomicU64,
    stop: AtomicBool,
}

/// The `sched-routes` thread (see the module docs).
pub struct RoutesWatch {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl RoutesWatch {
    /// Starts the thread.
    pub fn spawn(cfg: &RoutesConfig, wake: Notifier) -> std::io::Result<RoutesWatch> {
        let mut store = EtcdClient::new(cfg.endpoints.clone(), Duration::from_millis(1000), cfg.tls.clone())?;
        let shared = Arc::new(Shared { newest: Mutex::new(None), revision: AtomicU64::new(0), stop: AtomicBool::new(false) });
        let s = shared.clone();
        let (key, poll) = (cfg.key.clone(), std::time::Duration::from_nanos(cfg.poll.as_nanos()));
        let thread = std::thread::Builder::new().name("sched-routes".into()).spawn(move || {
            let mut warned = false;
            while !s.stop.load(Ordering::Acquire) {
                match store.get_routes(&key) {
                    Ok(Some(t)) if t.revision > s.revision.load(Ordering::Acquire) => {
                        let rev = t.revision;
                        *s.newest.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(t));
                        s.revision.store(rev, Ordering::Release);
                        wake.notify();
                        warned = false;
                    }
                    Ok(_) => warned = false,
                    Err(e) if !warned => {
                        warn!("reading the routing table at {key}: {e}");
                        warned = true;
                    }
                    Err(_) => {}
                }
                std::thread::park_timeout(poll);
                std::thread::sleep(MIN_GAP);
            }
        })?;
        Ok(RoutesWatch { shared, thread: Some(thread) })
    }

    /// Reads the table again soon (within [`MIN_GAP`] of the last read)
    /// rather than at the end of the period.
    pub fn read_now(&self) {
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
    }

    /// The newest revision read (0: none yet).
    pub fn revision(&self) -> u64 {
        self.shared.revision.load(Ordering::Acquire)
    }

    /// The newest table read, if its revision is above `applied`. Cheap
    /// when nothing changed (one atomic load): the poll loop calls it every
    /// pass.
    pub fn newer_than(&self, applied: u64) -> Option<Arc<RouteTable>> {
        if self.revision() <= applied {
            return None;
        }
        self.shared.newest.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Drop for RoutesWatch {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}
