//! The backends' data links: accepted by the host, each must register as a
//! backend within the handshake timeout (only then may it READ staging
//! memory); registered, it brings completions (and, on tcp, serves its
//! READs of our slots when polled).

use super::config::{FrontendEvent, BURST};
use super::sink::FrontendStats;
use crate::staging::Staging;
use dataplane::time::Instant;
use dataplane::transport::{Connection, Error as TransportError};
use dataplane::wire::{self, Message, Role, WireError};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;

struct PendingLink<C> {
    conn: C,
    deadline: Instant,
}

struct BackendLink<C> {
    id: u32,
    conn: C,
}

/// The data links: those still handshaking and the registered backends.
pub(super) struct DataLinks<C> {
    pending: Vec<PendingLink<C>>,
    backends: Vec<BackendLink<C>>,
}

/// Where the node's data-link polls put what they let go of and report.
pub(super) struct DataCtx<'a, C> {
    pub buf: &'a mut [u8],
    pub staging: &'a Staging,
    pub stats: &'a FrontendStats,
    pub closed: &'a mut Vec<C>,
    pub events: &'a mut VecDeque<FrontendEvent>,
}

impl<C: Connection> DataLinks<C> {
    pub fn new() -> Self {
        DataLinks { pending: Vec::new(), backends: Vec::new() }
    }

    /// A data link accepted at `now`, to register by `deadline`.
    pub fn handle_link(&mut self, conn: C, deadline: Instant) {
        self.pending.push(PendingLink { conn, deadline });
    }

    /// The handshake deadlines.
    pub fn poll_at(&self, mut consider: impl FnMut(Instant)) {
        for p in &self.pending {
            consider(p.deadline);
        }
    }

    /// The links still handshaking, then the backends'.
    pub fn for_each_conn(&self, mut f: impl FnMut(&C)) {
        for p in &self.pending {
            f(&p.conn);
        }
        for b in &self.backends {
            f(&b.conn);
        }
    }

    /// Every link, handshaking ones first.
    pub fn drain(&mut self) -> impl Iterator<Item = C> + '_ {
        self.pending.drain(..).map(|p| p.conn).chain(self.backends.drain(..).map(|b| b.conn))
    }

    /// Completions from the backends (and, on tcp, their READs of our slots).
    pub fn poll_backends(&mut self, ctx: &mut DataCtx<'_, C>) -> bool {
        let mut work = false;
        let mut i = 0;
        while i < self.backends.len() {
            match poll_backend(&mut self.backends[i].conn, ctx.buf, ctx.staging, ctx.stats) {
                Ok(w) => {
                    work |= w;
                    i += 1;
                }
                Err(why) => {
                    // Its tasks are failed back by the scheduler.
                    work = true;
                    let gone = self.backends.swap_remove(i);
                    ctx.closed.push(gone.conn);
                    ctx.stats.backends_lost.fetch_add(1, Ordering::Relaxed);
                    ctx.stats.backends.store(self.backends.len() as u64, Ordering::Relaxed);
                    ctx.events.push_back(FrontendEvent::BackendLost { id: gone.id, why: why.to_string() });
                }
            }
        }
        work
    }

    /// Data links waiting for their `Register{Backend}`.
    pub fn poll_pending(&mut self, now: Instant, ctx: &mut DataCtx<'_, C>) -> bool {
        let mut work = false;
        let mut i = 0;
        while i < self.pending.len() {
            let p = &mut self.pending[i];
            // None: still waiting; Some(Ok(backend id)) or Some(Err(why)).
            let verdict: Option<Result<u32, DataLinkError>> = match p.conn.try_recv(ctx.buf) {
                Ok(Some(n)) => Some(match wire::decode(&ctx.buf[..n]) {
                    Ok(Message::Register(r)) if r.role() == Some(Role::Backend) => Ok(r.id),
                    Ok(Message::Register(r)) => Err(DataLinkError::NotABackend(r.role)),
                    Ok(_) => Err(DataLinkError::NoRegister(TransportError::Protocol(WireError::BadValue(
                        "first message is not Register",
                    )))),
                    Err(e) => Err(DataLinkError::NoRegister(e.into())),
                }),
                Ok(None) if now >= p.deadline => Some(Err(DataLinkError::NoRegister(TransportError::Timeout))),
                Ok(None) => None,
                Err(e) => Some(Err(DataLinkError::NoRegister(e))),
            };
            let Some(verdict) = verdict else {
                i += 1;
                continue;
            };
            work = true;
            let mut link = self.pending.swap_remove(i);
            match verdict {
                Ok(id) => {
                    // Only a registered backend may READ staging memory.
                    link.conn.allow_remote_reads();
                    // A backend that reconnects replaces its old link.
                    if let Some(at) = self.backends.iter().position(|b| b.id == id) {
                        let old = self.backends.swap_remove(at);
                        ctx.closed.push(old.conn);
                    }
                    self.backends.push(BackendLink { id, conn: link.conn });
                    ctx.stats.backends.store(self.backends.len() as u64, Ordering::Relaxed);
                    ctx.events.push_back(FrontendEvent::BackendJoined(id));
                }
                Err(why) => {
                    ctx.closed.push(link.conn);
                    ctx.events.push_back(FrontendEvent::LinkRefused { why: why.to_string() });
                }
            }
        }
        work
    }

    /// How many data links are open (handshaking, registered).
    pub fn len(&self) -> (usize, usize) {
        (self.pending.len(), self.backends.len())
    }
}

/// Why a backend's data link is let go.
#[derive(Debug, thiserror::Error)]
enum DataLinkError {
    /// It registered as another role.
    #[error("refused a data connection registering as role {0} (not a backend)")]
    NotABackend(u32),
    /// Its first message was not a `Register`, or did not come in time.
    #[error("data connection without Register: {0}")]
    NoRegister(TransportError),
    /// It sent bytes that do not decode.
    #[error("malformed message: {0}")]
    Malformed(WireError),
    /// The link broke.
    #[error(transparent)]
    Transport(#[from] TransportError),
}

/// Receives what a backend has sent (at most a burst); `Ok(found work)`,
/// `Err` if the link is dead or the backend sent garbage (it is then let
/// go).
fn poll_backend<C: Connection>(
    conn: &mut C,
    buf: &mut [u8],
    staging: &Staging,
    stats: &FrontendStats,
) -> Result<bool, DataLinkError> {
    let mut work = false;
    for _ in 0..BURST {
        match conn.try_recv(buf) {
            Ok(Some(n)) => {
                work = true;
                match wire::decode(&buf[..n]) {
                    Ok(m @ (Message::Dropped(_) | Message::Completion(..))) => {
                        if staging.route_message(&m).is_err() {
                            stats.bad_messages.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        stats.bad_messages.fetch_add(1, Ordering::Relaxed);
                        return Err(DataLinkError::Malformed(e));
                    }
                }
            }
            Ok(None) => return Ok(work),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(work)
}
