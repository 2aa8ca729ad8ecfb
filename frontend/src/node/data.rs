//! The backends' data links: accepted by the host, each must prove it is
//! a backend of this cluster within the handshake timeout (only then may
//! it READ staging memory); registered, it brings completions (and, on
//! tcp, serves its READs of our slots when polled).
//!
//! With a join token the proof is the scheduler links' challenge-response
//! ([`dataplane::join`]): every accepted link gets a fresh
//! [`Challenge`](wire::Challenge), and only a `Join{Backend}` whose MAC
//! answers that nonce registers it. The MAC is made with the token
//! [`for_purpose`](JoinToken::for_purpose)([`DATA_LINK_LABEL`]), not the
//! cluster token itself: a backend's answer to a scheduler's challenge
//! (or to a rogue "scheduler" replaying our nonce) never verifies here,
//! and a data-link answer never admits anyone to a scheduler. Without a
//! token (open membership) a bare `Register{Backend}` registers, as the
//! wire always allowed; with one it is refused.
//!
//! The data port is bounded (issue 55): at most [`MAX_HANDSHAKING`] links
//! handshake at once (a new one evicts the oldest, so idle connections
//! cannot lock a backend out: it answers its challenge at once, they never
//! do; the oldest of the address holding most of them, so one source's
//! flood cannot push out a backend still handshaking from another), and
//! at most [`MAX_BACKEND_LINKS`] are registered. Every
//! refused or evicted link is counted (`symphony_frontend_data_links_refused`).
//!
//! With a join token, an admitted backend's READs are checked (on tcp,
//! where this side serves each READ): the link gets a
//! [`ReadVerifier`] for that backend's id, so it reads only the inputs of
//! tasks planned to it (`dataplane::capability`).
//!
//! A registered backend's completions are routed as its own
//! ([`Sender::Backend`]): with a join token, one whose capability does not
//! verify for that backend (a task planned to another, a forged one) is
//! refused and counted by the staging area, and the link stays up.

use super::config::{FrontendEvent, BURST};
use super::sink::FrontendStats;
use crate::staging::{Sender, Staging};
use dataplane::capability::{CapabilityKey, ReadVerifier};
use dataplane::join::{JoinToken, NonceSource, DATA_LINK_LABEL};
use dataplane::time::Instant;
use dataplane::transport::tcp::most_frequent_source;
use dataplane::transport::{Connection, Error as TransportError};
use dataplane::wire::{self, Challenge, Message, Role, WireError, NONCE_LEN};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Most data links handshaking at once; a new one evicts the oldest.
pub(super) const MAX_HANDSHAKING: usize = 64;
/// Most registered backend links (backend ids are 16 bits; a cluster has
/// far fewer backends): a Join beyond it, not replacing a backend's own
/// link, is refused.
pub(super) const MAX_BACKEND_LINKS: usize = 1024;

struct PendingLink<C> {
    conn: C,
    /// Its peer's address (none where the transport tells none).
    source: Option<std::net::IpAddr>,
    deadline: Instant,
    proof: Proof,
}

/// What a handshaking link must send to register.
enum Proof {
    /// Open membership: a `Register{Backend}`.
    Open,
    /// A `Join{Backend}` whose MAC answers this nonce.
    Challenged([u8; NONCE_LEN]),
    /// The challenge could not be drawn or sent (why): refused at the
    /// next poll.
    Unchallenged(ChallengeError),
}

/// Why a link's challenge could not be drawn or sent. Clone (the proof is
/// judged by reference), so the transport error is held in an `Arc`.
#[derive(Clone, Debug, thiserror::Error)]
enum ChallengeError {
    /// The OS gave no randomness for a nonce.
    #[error("no OS randomness for a nonce")]
    NoRandomness,
    /// Encoding or sending the challenge failed.
    #[error(transparent)]
    Send(Arc<TransportError>),
}

struct BackendLink<C> {
    id: u32,
    conn: C,
}

/// The data links: those still handshaking and the registered backends.
pub(super) struct DataLinks<C> {
    pending: Vec<PendingLink<C>>,
    backends: Vec<BackendLink<C>>,
    /// The join token's data-link form; none: open membership.
    token: Option<JoinToken>,
    /// The key admitted backends' READs are checked under (with a token).
    capabilities: Option<CapabilityKey>,
    /// Where the challenges' nonces come from.
    nonces: NonceSource,
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
        DataLinks { pending: Vec::new(), backends: Vec::new(), token: None, capabilities: None, nonces: NonceSource::Os }
    }

    /// Links accepted from now on must prove `token` (the cluster's join
    /// token; none: open membership).
    pub fn set_join_token(&mut self, token: Option<&JoinToken>) {
        self.token = token.map(|t| t.for_purpose(DATA_LINK_LABEL));
        self.capabilities = token.map(CapabilityKey::from_token);
    }

    /// The challenges' nonces come from `nonces` (the OS generator unless
    /// set; seeded only in a deterministic harness).
    pub fn set_nonces(&mut self, nonces: NonceSource) {
        self.nonces = nonces;
    }

    /// A data link accepted at `now`, to register by `deadline`; with a
    /// token it is challenged at once. With [`MAX_HANDSHAKING`] links
    /// handshaking already, the oldest of them from the address most of
    /// them come from (any, where none is known) is evicted (returned, to
    /// close; counted as refused).
    pub fn handle_link(&mut self, mut conn: C, deadline: Instant, stats: &FrontendStats) -> Option<C> {
        let source = conn.peer_addr();
        let evicted = (self.pending.len() >= MAX_HANDSHAKING).then(|| {
            stats.data_links_refused.fetch_add(1, Ordering::Relaxed);
            let crowd = most_frequent_source(self.pending.iter().map(|p| p.source));
            // Deadlines are accept times plus one timeout: the oldest link
            // has the earliest. Order is kept (`remove`), as links are
            // judged oldest first.
            let oldest = (0..self.pending.len())
                .filter(|&i| crowd.is_none() || self.pending[i].source == crowd)
                .min_by_key(|&i| self.pending[i].deadline)
                .unwrap_or(0);
            self.pending.remove(oldest).conn
        });
        let proof = match &self.token {
            None => Proof::Open,
            Some(_) => match self.nonces.next_nonce() {
                None => Proof::Unchallenged(ChallengeError::NoRandomness),
                Some(nonce) => match challenge(&mut conn, nonce) {
                    Ok(()) => Proof::Challenged(nonce),
                    Err(e) => Proof::Unchallenged(ChallengeError::Send(Arc::new(e))),
                },
            },
        };
        self.pending.push(PendingLink { conn, source, deadline, proof });
        evicted
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
            let link = &mut self.backends[i];
            match poll_backend(&mut link.conn, link.id, ctx.buf, ctx.staging, ctx.stats) {
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

    /// Data links waiting for their proof (`Join{Backend}` answering the
    /// challenge, or without a token `Register{Backend}`).
    pub fn poll_pending(&mut self, now: Instant, ctx: &mut DataCtx<'_, C>) -> bool {
        let mut work = false;
        let mut i = 0;
        while i < self.pending.len() {
            let p = &mut self.pending[i];
            let token = self.token.as_ref();
            // None: still waiting; Some(Ok(backend id)) or Some(Err(why)).
            let verdict: Option<Result<u32, DataLinkError>> = match &p.proof {
                Proof::Unchallenged(why) => Some(Err(DataLinkError::NoChallenge(why.clone()))),
                proof => match p.conn.try_recv(ctx.buf) {
                    Ok(Some(n)) => Some(judge(proof, token, wire::decode(&ctx.buf[..n]))),
                    Ok(None) if now >= p.deadline => {
                        Some(Err(DataLinkError::NoRegister(TransportError::Timeout)))
                    }
                    // The challenge leaves during polls.
                    Ok(None) => p.conn.progress().err().map(|e| Err(DataLinkError::NoRegister(e))),
                    Err(e) => Some(Err(DataLinkError::NoRegister(e))),
                },
            };
            let Some(verdict) = verdict else {
                i += 1;
                continue;
            };
            work = true;
            let mut link = self.pending.swap_remove(i);
            let full = self.backends.len() >= MAX_BACKEND_LINKS;
            let verdict = verdict.and_then(|id| match full && !self.backends.iter().any(|b| b.id == id) {
                true => Err(DataLinkError::TooMany(id)),
                false => Ok(id),
            });
            match verdict {
                Ok(id) => {
                    // Only a registered backend may READ staging memory,
                    // and with a token only its planned inputs.
                    match &self.capabilities {
                        Some(key) => link.conn.allow_verified_remote_reads(ReadVerifier::new(
                            key.clone(),
                            id,
                            ctx.staging.frontend_id(),
                        )),
                        None => link.conn.allow_remote_reads(),
                    }
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
                    ctx.stats.data_links_refused.fetch_add(1, Ordering::Relaxed);
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

/// Queues a [`Challenge`] of `nonce` on a fresh data link.
fn challenge<C: Connection>(conn: &mut C, nonce: [u8; NONCE_LEN]) -> Result<(), TransportError> {
    let mut msg = [0u8; 128];
    let n = wire::encode(&mut msg, &Challenge::new(nonce, true))?;
    conn.send(&msg[..n])?;
    match conn.progress() {
        Ok(()) | Err(TransportError::PeerDisconnected) => Ok(()),
        Err(e) => Err(e),
    }
}

/// What a handshaking link's first message proves: the backend's id, or
/// why it is refused. `token` is the data-link token when `proof` is
/// [`Proof::Challenged`].
fn judge(proof: &Proof, token: Option<&JoinToken>, msg: Result<Message<'_>, WireError>) -> Result<u32, DataLinkError> {
    match (proof, token, msg) {
        (Proof::Open, _, Ok(Message::Register(r))) if r.role() == Some(Role::Backend) => Ok(r.id),
        (Proof::Open, _, Ok(Message::Register(r))) => Err(DataLinkError::NotABackend(r.role)),
        (Proof::Challenged(nonce), Some(token), Ok(Message::Join(j))) => {
            if j.role != Role::Backend as u32 {
                Err(DataLinkError::NotABackend(j.role))
            } else if token.verify(nonce, wire::VERSION, &j) {
                Ok(j.id)
            } else {
                Err(DataLinkError::BadProof(j.id))
            }
        }
        (Proof::Challenged(_), _, Ok(Message::Register(r))) => Err(DataLinkError::Unsigned(r.id)),
        (_, _, Ok(_)) => Err(DataLinkError::NoRegister(TransportError::Protocol(WireError::BadValue(
            "first message is neither Register nor Join",
        )))),
        (_, _, Err(e)) => Err(DataLinkError::NoRegister(e.into())),
    }
}

/// Why a backend's data link is let go.
#[derive(Debug, thiserror::Error)]
enum DataLinkError {
    /// It registered as another role.
    #[error("refused a data connection registering as role {0} (not a backend)")]
    NotABackend(u32),
    /// It claimed a backend id without the token's proof (wrong token, or
    /// an answer to another link's nonce).
    #[error("refused a data connection claiming backend {0}: its Join does not answer our challenge with the join token")]
    BadProof(u32),
    /// It sent a bare Register where the token's proof is required.
    #[error("refused a data connection claiming backend {0} with an unsigned Register (this frontend requires the join token)")]
    Unsigned(u32),
    /// It proved membership, but [`MAX_BACKEND_LINKS`] backends are
    /// registered already.
    #[error("refused backend {0}'s data connection: {MAX_BACKEND_LINKS} backends are registered already")]
    TooMany(u32),
    /// Its challenge could not be drawn or sent.
    #[error("could not challenge a data connection: {0}")]
    NoChallenge(#[source] ChallengeError),
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

/// Receives what backend `id` has sent (at most a burst); `Ok(found
/// work)`, `Err` if the link is dead or the backend sent garbage (it is
/// then let go).
fn poll_backend<C: Connection>(
    conn: &mut C,
    id: u32,
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
                        if staging.route_message_from(&m, Sender::Backend(id)).is_err() {
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
