//! The local-process [`Provider`]: backend processes on this host, each
//! a child `symphony daemon backend` (as [`crate::cluster`] starts them).
//!
//! - `add_gpus` starts backends with fresh ids (one per
//!   `gpus_per_backend` GPUs asked, rounded up), each waited for until it
//!   registered (its READY line); its GPUs are joining until the scheduler
//!   lists the backend in matchmaking (its data links to the frontends are
//!   up, the join gate), then serving;
//! - `drain_gpus` sends each named GPU's backend SIGTERM, its graceful
//!   leave; the backend's GPUs are draining until the process exits (once
//!   the scheduler released it), then gone;
//! - a GPU's id is `backend id × gpus_per_backend + local index`, so the
//!   newest backends have the highest ids, the ones deferred consolidation
//!   idles and [`pick_drain`](scheduler::autoscale::pick_drain) drains
//!   first among equals.
//!
//! Every change is recorded ([`LocalBackends::events`]) with its time, for
//! the report of `up --autoscale`.

use std::time::{Duration as StdDuration, Instant as StdInstant};

use dataplane::join::JoinToken;
use dataplane::time::Instant;
use scheduler::autoscale::{GpuMember, GpuPhase, ScaleError, ScaleProvider};
use scheduler::types::GpuId;
use tracing::{info, warn};

use super::Provider;
use crate::cluster::{backend_args, spawn, ClusterSpec, Daemon};

/// Where a local backend is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendPhase {
    /// Started and registered; not yet in matchmaking.
    Joining,
    /// In matchmaking.
    Serving,
    /// Told to leave (SIGTERM); not exited yet.
    Draining,
}

/// A change of a local backend, at a time of the controller's clock.
#[derive(Clone, Debug, PartialEq)]
pub struct MemberEvent {
    /// When it was seen.
    pub at: Instant,
    /// The backend's id.
    pub backend: u32,
    /// What happened.
    pub what: MemberChange,
}

/// What happened to a local backend.
#[derive(Clone, Debug, PartialEq)]
pub enum MemberChange {
    /// Started; registered after `register_ms` (process start to READY).
    Started {
        /// Milliseconds from the process start to its READY line.
        register_ms: f64,
    },
    /// Found in matchmaking.
    Serving,
    /// Sent SIGTERM.
    Draining,
    /// Exited; `clean` if with status 0.
    Exited {
        /// Whether it exited 0.
        clean: bool,
        /// Whether it was draining (else it died on its own).
        drained: bool,
    },
}

struct Local {
    id: u32,
    daemon: Daemon,
    phase: BackendPhase,
    added_at: Instant,
}

/// Backend processes on this host (see the module docs).
pub struct LocalBackends {
    spec: ClusterSpec,
    control: String,
    token: JoinToken,
    next_id: u32,
    max_backends: u32,
    backends: Vec<Local>,
    /// The ids of the backends it was given running.
    initial: Vec<u32>,
    events: Vec<MemberEvent>,
    exited: Vec<Daemon>,
}

impl LocalBackends {
    /// A provider that starts backends like `spec`'s, registering with the
    /// schedulers at `control` (comma-separated) with `token`, at most
    /// `max_backends` at once; `running` are the backends already up
    /// (serving, ids `1..=running.len()` in order). The backends it starts
    /// are children of the thread that calls `add_gpus`, and every local
    /// daemon has `--exit-with-parent`: that thread must live as long as
    /// the backends should (the controller's own thread does).
    pub fn new(spec: &ClusterSpec, control: &str, token: &JoinToken, running: Vec<Daemon>, max_backends: u32) -> Self {
        let backends: Vec<Local> = running
            .into_iter()
            .zip(1u32..)
            .map(|(daemon, id)| Local { id, daemon, phase: BackendPhase::Serving, added_at: Instant::ZERO })
            .collect();
        LocalBackends {
            spec: spec.clone(),
            control: control.to_string(),
            token: token.clone(),
            next_id: backends.len() as u32 + 1,
            initial: backends.iter().map(|b| b.id).collect(),
            max_backends,
            backends,
            events: Vec::new(),
            exited: Vec::new(),
        }
    }

    /// Every change so far, in order.
    pub fn events(&self) -> &[MemberEvent] {
        &self.events
    }

    /// The ids of the backends it was given running.
    pub fn initial_backends(&self) -> &[u32] {
        &self.initial
    }

    /// Backends started (joining, serving or draining) now.
    pub fn running(&self) -> usize {
        self.backends.len()
    }

    /// Backends in each phase now: (joining, serving, draining).
    pub fn phases(&self) -> (usize, usize, usize) {
        let n = |p| self.backends.iter().filter(|b| b.phase == p).count();
        (n(BackendPhase::Joining), n(BackendPhase::Serving), n(BackendPhase::Draining))
    }

    /// Waits (up to `timeout`) for the draining backends to exit, noting
    /// each at `now()`; returns how many are still draining.
    pub fn wait_drained(&mut self, timeout: StdDuration, now: &dyn Fn() -> Instant) -> usize {
        let until = StdInstant::now() + timeout;
        loop {
            self.reap(now());
            let left = self.phases().2;
            if left == 0 || StdInstant::now() >= until {
                return left;
            }
            std::thread::sleep(StdDuration::from_millis(20));
        }
    }

    /// The daemons still running and those that exited (for the cluster's
    /// own stop, which checks each exit).
    pub fn into_daemons(self) -> (Vec<Daemon>, Vec<Daemon>) {
        (self.backends.into_iter().map(|b| b.daemon).collect(), self.exited)
    }

    fn gpus_per_backend(&self) -> u32 {
        self.spec.gpus_per_backend.max(1)
    }

    /// Notes the backends that exited at `now`.
    fn reap(&mut self, now: Instant) {
        let mut k = 0;
        while k < self.backends.len() {
            let Some(status) = self.backends[k].daemon.try_exit() else {
                k += 1;
                continue;
            };
            let b = self.backends.swap_remove(k);
            let drained = b.phase == BackendPhase::Draining;
            if !drained || !status.success() {
                warn!(backend = b.id, %status, drained, "a local backend exited");
            }
            self.events.push(MemberEvent { at: now, backend: b.id, what: MemberChange::Exited { clean: status.success(), drained } });
            self.exited.push(b.daemon);
        }
    }

    /// Starts backends `ids`, one after the other, each waited for until
    /// its READY line (registration: milliseconds); those that did not
    /// start are reported (and not members). They are children of the
    /// calling thread: with `--exit-with-parent` (as every local daemon
    /// has) they end with it, so the caller must be the thread that owns
    /// the provider for its whole life (not a short-lived helper thread).
    fn start(&mut self, now: Instant, ids: &[u32]) -> Result<(), ScaleError> {
        let started: Vec<(u32, Result<Daemon, _>, f64)> = ids
            .iter()
            .map(|&id| {
                let t0 = StdInstant::now();
                let args = backend_args(&self.spec, id, &self.control);
                let d = spawn(&self.spec, &format!("backend-{id}"), "backend", args, Some(&self.token), t0 + self.spec.start_timeout);
                (id, d, t0.elapsed().as_secs_f64() * 1e3)
            })
            .collect();
        let mut failed = 0;
        let mut last_error = String::new();
        for (id, daemon, register_ms) in started {
            match daemon {
                Ok(daemon) => {
                    info!(backend = id, register_ms, "autoscale: started a backend");
                    self.events.push(MemberEvent { at: now, backend: id, what: MemberChange::Started { register_ms } });
                    self.backends.push(Local { id, daemon, phase: BackendPhase::Joining, added_at: now });
                }
                Err(e) => {
                    warn!(backend = id, "a local backend did not start: {e}");
                    last_error = format!("backend {id}: {e}");
                    failed += 1;
                }
            }
        }
        if failed > 0 {
            // A process that did not start is the provider failing to act,
            // not a lack of capacity: the next interval tries again.
            return Err(ScaleError::Provider { provider: "local", reason: format!("{failed} of {} backends did not start (last: {last_error})", ids.len()) });
        }
        Ok(())
    }
}

impl ScaleProvider for LocalBackends {
    fn add_gpus(&mut self, now: Instant, n: u32) -> Result<Vec<GpuId>, ScaleError> {
        let per = self.gpus_per_backend();
        let wanted = n.div_ceil(per);
        let available = self.max_backends.saturating_sub(self.backends.len() as u32);
        if wanted > available {
            return Err(ScaleError::NoCapacity { wanted: n, available: available * per });
        }
        let backends: Vec<u32> = (self.next_id..self.next_id + wanted).collect();
        self.next_id += wanted;
        self.start(now, &backends)?;
        Ok(backends.iter().flat_map(|&id| (0..per).map(move |g| id * per + g)).collect())
    }

    fn drain_gpus(&mut self, now: Instant, gpus: &[GpuId]) -> Result<(), ScaleError> {
        let per = self.gpus_per_backend();
        // Every named GPU's backend must serve, checked before any leaves.
        for &gpu in gpus {
            if !self.backends.iter().any(|b| b.id == gpu / per && b.phase == BackendPhase::Serving) {
                return Err(ScaleError::NotServing { gpu });
            }
        }
        for &gpu in gpus {
            let Some(b) = self.backends.iter_mut().find(|b| b.id == gpu / per && b.phase == BackendPhase::Serving) else {
                continue;
            };
            b.daemon.signal(libc::SIGTERM);
            b.phase = BackendPhase::Draining;
            info!(backend = b.id, "autoscale: draining a backend (SIGTERM)");
            self.events.push(MemberEvent { at: now, backend: b.id, what: MemberChange::Draining });
        }
        Ok(())
    }

    fn members(&self) -> Vec<GpuMember> {
        let per = self.gpus_per_backend();
        self.backends
            .iter()
            .flat_map(|b| {
                let phase = match b.phase {
                    // When it will serve is not known ahead: it says when.
                    BackendPhase::Joining => GpuPhase::Joining { ready_at: b.added_at },
                    BackendPhase::Serving => GpuPhase::Serving,
                    BackendPhase::Draining => GpuPhase::Draining,
                };
                (0..per).map(move |g| GpuMember { gpu: b.id * per + g, phase, idle_fraction: 1.0 })
            })
            .collect()
    }
}

impl Provider for LocalBackends {
    fn backend_of(&self, gpu: GpuId) -> Option<u32> {
        let id = gpu / self.gpus_per_backend();
        self.backends.iter().any(|b| b.id == id).then_some(id)
    }

    fn observe(&mut self, now: Instant, serving: &[u32]) -> Result<(), ScaleError> {
        self.reap(now);
        for b in self.backends.iter_mut().filter(|b| b.phase == BackendPhase::Joining && serving.contains(&b.id)) {
            b.phase = BackendPhase::Serving;
            info!(backend = b.id, "autoscale: a backend serves");
            self.events.push(MemberEvent { at: now, backend: b.id, what: MemberChange::Serving });
        }
        Ok(())
    }
}
