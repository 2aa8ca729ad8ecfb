//! Hot standby: the daemon's host for the election (issue 18).
//!
//! With `--etcd`, every scheduler runs an [`ElectionHost`] beside its poll
//! loop. Two threads:
//!
//! - `sched-elect` owns the sans-IO [`Candidate`] over [`Etcd`]: it polls
//!   it on the real clock, publishes the term this scheduler leads (0:
//!   none) and wakes the poll loop on every change. etcd calls block, so
//!   they never run on the planning thread.
//! - `sched-hb` owns a UDP socket: a standby pings the leader every
//!   heartbeat; the leader's `sched-hb` answers at once with its term,
//!   whatever its election thread is doing (an etcd call that takes long
//!   does not look like a dead leader). An answer reaches the candidate as
//!   a heartbeat. A standby that hears nothing for the failure timeout
//!   revokes the leader's lease and campaigns (the [`Candidate`]'s rule):
//!   sub-second takeover, where waiting for etcd's lease expiry would take
//!   1 to 1.5 s.
//!
//! The identity a scheduler campaigns with, and so the value of the
//! leadership key, is `CONTROL_ADDR|HEARTBEAT_ADDR`.
//!
//! Heartbeats are authenticated (issue 55): every datagram carries an
//! HMAC-SHA256 under a key derived from the join token ([`HeartbeatKey`]);
//! a ping carries a fresh random nonce and the pong must echo one of the
//! last few nonces sent, once, so a recorded pong cannot be replayed; the
//! leader answers at most [`PONGS_PER_WINDOW`] pings per
//! [`PONG_WINDOW`]; and the term a pong claims is checked against the
//! election store before anyone acts on it ([`Candidate::handle_heartbeat`]).
//! Every datagram refused on any of these grounds is counted
//! (`symphony_scheduler_heartbeats_refused`) and otherwise ignored.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use dataplane::time::{Duration, Instant, MonotonicClock};
use dataplane::waitset::Notifier;
use tracing::{info, warn};

use dataplane::join::{JoinToken, NonceSource};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::election::{Candidate, CandidateConfig, Etcd, EtcdConfig, Heard, RoleEvent};

/// The election options of a scheduler daemon.
#[derive(Clone, Debug)]
pub struct ElectionConfig {
    /// etcd client endpoints.
    pub endpoints: Vec<String>,
    /// The leadership key.
    pub key: String,
    /// UDP address of the heartbeat socket (must be reachable by the other
    /// schedulers; port 0: any).
    pub listen: SocketAddr,
    /// Heartbeat and lease renewal interval.
    pub heartbeat: Duration,
    /// Silence after which a standby takes over.
    pub failure_timeout: Duration,
    /// The etcd lease's TTL (whole seconds).
    pub lease_ttl: Duration,
    /// TLS to etcd (`None`: plain HTTP).
    pub tls: Option<crate::election::EtcdTls>,
}

/// The key heartbeats are authenticated with: derived from the cluster's
/// join token, so every scheduler of a cluster holds it and nobody else.
#[derive(Clone)]
pub struct HeartbeatKey([u8; 32]);

impl std::fmt::Debug for HeartbeatKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HeartbeatKey(<32 bytes>)")
    }
}

impl HeartbeatKey {
    /// The key of a cluster with join token `token`. Open membership (no
    /// token) authenticates nothing: the key is then public (all zero).
    /// Derived from the token under this use's own label
    /// ([`JoinToken::derive_key`]), so it is independent of every Join MAC.
    pub fn from_token(token: Option<&JoinToken>) -> HeartbeatKey {
        let Some(token) = token else { return HeartbeatKey([0; 32]) };
        HeartbeatKey(token.derive_key(b"symphony heartbeat key v1"))
    }

    fn mac(&self, body: &[u8]) -> Hmac<Sha256> {
        // HMAC takes keys of any length: this cannot fail.
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&self.0) else { unreachable!("HMAC accepts any key length") };
        mac.update(body);
        mac
    }
}

/// Heartbeat datagram, little endian: magic, kind, term, nonce, MAC (the
/// first [`MAC_LEN`] bytes of HMAC-SHA256 over everything before it).
const MAGIC: u32 = u32::from_le_bytes(*b"SYH2");
const PING: u32 = 1;
const PONG: u32 = 2;
const NONCE_LEN: usize = 16;
const MAC_LEN: usize = 16;
const BODY_LEN: usize = 16 + NONCE_LEN;
const DATAGRAM_LEN: usize = BODY_LEN + MAC_LEN;

/// The leader answers at most this many pings per [`PONG_WINDOW`]: a
/// standby pings once per heartbeat, so this is room for dozens of them
/// while a flood cannot turn the leader into an amplifier.
const PONGS_PER_WINDOW: u32 = 64;
const PONG_WINDOW: std::time::Duration = std::time::Duration::from_millis(100);
/// A pong may answer any of the last this many pings (one in flight per
/// heartbeat; a late answer to an earlier one is still a sign of life).
const OUTSTANDING_PINGS: usize = 4;

type Nonce = [u8; NONCE_LEN];

fn datagram(key: &HeartbeatKey, kind: u32, epoch: u64, nonce: &Nonce) -> [u8; DATAGRAM_LEN] {
    let mut b = [0u8; DATAGRAM_LEN];
    b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    b[4..8].copy_from_slice(&kind.to_le_bytes());
    b[8..16].copy_from_slice(&epoch.to_le_bytes());
    b[16..BODY_LEN].copy_from_slice(nonce);
    let tag = key.mac(&b[..BODY_LEN]).finalize().into_bytes();
    b[BODY_LEN..].copy_from_slice(&tag[..MAC_LEN]);
    b
}

/// What arrived on the heartbeat socket.
#[derive(Debug, PartialEq, Eq)]
enum Datagram {
    /// A well-formed datagram whose MAC holds: `(kind, epoch, nonce)`.
    Authentic(u32, u64, Nonce),
    /// Our magic, but a bad MAC, kind or length: counted as forged.
    Forged,
    /// Not a heartbeat at all.
    Stray,
}

fn parse(key: &HeartbeatKey, b: &[u8]) -> Datagram {
    if b.get(0..4) != Some(&MAGIC.to_le_bytes()[..]) {
        return Datagram::Stray;
    }
    let Ok(b) = <&[u8; DATAGRAM_LEN]>::try_from(b) else { return Datagram::Forged };
    // Constant time: a forger learns nothing from how fast it is refused.
    if key.mac(&b[..BODY_LEN]).verify_truncated_left(&b[BODY_LEN..]).is_err() {
        return Datagram::Forged;
    }
    let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let mut e = [0u8; 8];
    e.copy_from_slice(&b[8..16]);
    let mut nonce = [0u8; NONCE_LEN];
    nonce.copy_from_slice(&b[16..BODY_LEN]);
    match word(4) {
        k @ (PING | PONG) => Datagram::Authentic(k, u64::from_le_bytes(e), nonce),
        _ => Datagram::Forged,
    }
}

/// A fresh ping nonce (the OS generator; `None` if it failed).
fn fresh_nonce() -> Option<Nonce> {
    let wide = NonceSource::Os.next_nonce()?;
    let mut n = [0u8; NONCE_LEN];
    n.copy_from_slice(&wide[..NONCE_LEN]);
    Some(n)
}

/// The heartbeat address in a leadership value `CONTROL|HEARTBEAT`.
fn heartbeat_addr(identity: &str) -> Option<SocketAddr> {
    identity.rsplit_once('|')?.1.parse().ok()
}

struct Shared {
    /// The term this scheduler leads; 0: it does not lead.
    leading: AtomicU64,
    /// Polls of the candidate so far (a leader's poll renews its lease
    /// when due): the poll loop waits for one after a stall.
    polls: AtomicU64,
    /// Heartbeat datagrams refused (see the module docs).
    refused: AtomicU64,
    stop: AtomicBool,
}

/// The election threads of one scheduler daemon (see the module docs).
pub struct ElectionHost {
    shared: Arc<Shared>,
    elect: Option<JoinHandle<()>>,
    heartbeat: Option<JoinHandle<()>>,
    /// The heartbeat socket's address.
    pub heartbeat_addr: SocketAddr,
}

impl ElectionHost {
    /// Binds the heartbeat socket and starts both threads; `control` is
    /// where peers reach this scheduler; `key` authenticates heartbeats;
    /// `wake` is notified at every change of standing.
    pub fn spawn(cfg: &ElectionConfig, control: &str, key: HeartbeatKey, wake: Notifier) -> std::io::Result<ElectionHost> {
        let socket = UdpSocket::bind(cfg.listen)?;
        // Bounds how long a stop waits for `sched-hb`.
        socket.set_read_timeout(Some(std::time::Duration::from_millis(50)))?;
        let heartbeat_addr = socket.local_addr()?;
        let me = format!("{control}|{heartbeat_addr}");
        let etcd = Etcd::with_tls(
            EtcdConfig {
                endpoints: cfg.endpoints.clone(),
                key: cfg.key.clone(),
                lease_ttl: cfg.lease_ttl,
                // A call never holds the candidate past a heartbeat or two.
                op_timeout: Duration::from_nanos(cfg.failure_timeout.as_nanos().max(cfg.heartbeat.as_nanos() * 2)),
            },
            cfg.tls.clone(),
        )?;
        let candidate = Candidate::new(
            CandidateConfig { me, heartbeat: cfg.heartbeat, failure_timeout: cfg.failure_timeout, lease_ttl: cfg.lease_ttl },
            etcd,
        );
        let shared = Arc::new(Shared { leading: AtomicU64::new(0), polls: AtomicU64::new(0), refused: AtomicU64::new(0), stop: AtomicBool::new(false) });
        let (pongs, heard) = mpsc::sync_channel::<(u64, Nonce)>(64);
        let hb = {
            let (shared, socket, key) = (shared.clone(), socket.try_clone()?, key.clone());
            std::thread::Builder::new().name("sched-hb".into()).spawn(move || answer_heartbeats(&socket, &key, &shared, &pongs))?
        };
        let elect = {
            let shared = shared.clone();
            let heartbeat = cfg.heartbeat;
            std::thread::Builder::new()
                .name("sched-elect".into())
                .spawn(move || run_candidate(candidate, &socket, &key, heartbeat, &shared, &heard, &wake))?
        };
        info!(heartbeat = %heartbeat_addr, key = %cfg.key, endpoints = %cfg.endpoints.join(","), "standing for election");
        Ok(ElectionHost { shared, elect: Some(elect), heartbeat: Some(hb), heartbeat_addr })
    }

    /// The term this scheduler leads now, if it leads.
    pub fn leading(&self) -> Option<u64> {
        match self.shared.leading.load(Ordering::Acquire) {
            0 => None,
            e => Some(e),
        }
    }

    /// How many times the candidate has been polled: after a stall of the
    /// poll loop, the first poll that follows has tried to renew the
    /// lease (and stepped down if it was revoked meanwhile).
    pub fn polls(&self) -> u64 {
        self.shared.polls.load(Ordering::Acquire)
    }

    /// Heartbeat datagrams refused so far: a bad MAC, a replayed or
    /// unsolicited pong, or a term the election store did not confirm.
    pub fn heartbeats_refused(&self) -> u64 {
        self.shared.refused.load(Ordering::Relaxed)
    }

    /// A gauge-like reader of [`Self::heartbeats_refused`] for a metrics
    /// registry (it outlives a borrow of the host).
    pub fn refused_reader(&self) -> impl Fn() -> u64 + Send + Sync + 'static {
        let shared = self.shared.clone();
        move || shared.refused.load(Ordering::Relaxed)
    }

    /// Stops both threads; a leader resigns first (revokes its lease), so
    /// a standby takes over at its next try.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for t in [self.elect.take(), self.heartbeat.take()].into_iter().flatten() {
            let _ = t.join();
        }
    }
}

impl Drop for ElectionHost {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// `sched-hb`: answers authentic pings with the term led (none: no
/// answer), at most [`PONGS_PER_WINDOW`] per window, and passes authentic
/// pongs on to the candidate; counts and drops everything forged.
fn answer_heartbeats(socket: &UdpSocket, key: &HeartbeatKey, shared: &Shared, pongs: &mpsc::SyncSender<(u64, Nonce)>) {
    let mut buf = [0u8; 64];
    let mut window = std::time::Instant::now();
    let mut answered = 0u32;
    while !shared.stop.load(Ordering::Acquire) {
        let Ok((n, from)) = socket.recv_from(&mut buf) else { continue };
        match parse(key, buf.get(..n).unwrap_or(&[])) {
            Datagram::Authentic(PING, _, nonce) => {
                let epoch = shared.leading.load(Ordering::Acquire);
                if epoch == 0 {
                    continue;
                }
                if window.elapsed() >= PONG_WINDOW {
                    window = std::time::Instant::now();
                    answered = 0;
                }
                if answered >= PONGS_PER_WINDOW {
                    shared.refused.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                answered += 1;
                let _ = socket.send_to(&datagram(key, PONG, epoch, &nonce), from);
            }
            // Full: the candidate is behind; a dropped pong is one
            // heartbeat less, never a wrong one.
            Datagram::Authentic(_, epoch, nonce) => {
                let _ = pongs.try_send((epoch, nonce));
            }
            Datagram::Forged => {
                shared.refused.fetch_add(1, Ordering::Relaxed);
            }
            Datagram::Stray => {}
        }
    }
}

/// `sched-elect`: polls the candidate, pings the leader while standing by,
/// and publishes every change of standing.
fn run_candidate(
    mut cand: Candidate<Etcd>,
    socket: &UdpSocket,
    key: &HeartbeatKey,
    heartbeat: Duration,
    shared: &Shared,
    heard: &mpsc::Receiver<(u64, Nonce)>,
    wake: &Notifier,
) {
    let clock = MonotonicClock::new();
    let mut next_ping = Instant::ZERO;
    // Nonces of the last pings sent, each answerable once.
    let mut outstanding: [Option<Nonce>; OUTSTANDING_PINGS] = [None; OUTSTANDING_PINGS];
    let mut next_slot = 0usize;
    while !shared.stop.load(Ordering::Acquire) {
        let now = clock.now();
        cand.poll(now);
        while let Some(ev) = cand.poll_event() {
            publish(&ev, shared, wake);
        }
        // No wake here: a poll loop holding after a stall re-checks within
        // its 5 ms hold wait, and waking it at every poll (50 a second)
        // would cost an idle daemon its quiet.
        shared.polls.fetch_add(1, Ordering::AcqRel);
        if let Some(leader) = cand.following().and_then(|l| heartbeat_addr(&l.leader)) {
            if now >= next_ping {
                if let Some(nonce) = fresh_nonce() {
                    outstanding[next_slot] = Some(nonce);
                    next_slot = (next_slot + 1) % OUTSTANDING_PINGS;
                    let _ = socket.send_to(&datagram(key, PING, 0, &nonce), leader);
                }
                next_ping = now + heartbeat;
            }
        }
        let until = cand.poll_at().unwrap_or(now + heartbeat).min(next_ping.max(now)).min(now + heartbeat);
        let wait = std::time::Duration::from_nanos(until.saturating_since(clock.now()).as_nanos().max(100_000));
        let mut take = |(epoch, nonce): (u64, Nonce)| {
            // Only an answer to a ping of ours, and only once.
            let Some(slot) = outstanding.iter_mut().find(|s| s.as_ref() == Some(&nonce)) else {
                shared.refused.fetch_add(1, Ordering::Relaxed);
                return;
            };
            *slot = None;
            if cand.handle_heartbeat(clock.now(), epoch) == Heard::Ignored {
                shared.refused.fetch_add(1, Ordering::Relaxed);
            }
            while let Some(ev) = cand.poll_event() {
                publish(&ev, shared, wake);
            }
        };
        if let Ok(pong) = heard.recv_timeout(wait) {
            take(pong);
            while let Ok(pong) = heard.try_recv() {
                take(pong);
            }
        }
    }
    if let Err(e) = cand.resign(clock.now()) {
        warn!(error = %e, "could not resign: a standby takes over once the failure timeout or the lease runs out");
    }
    while let Some(ev) = cand.poll_event() {
        publish(&ev, shared, wake);
    }
}

fn publish(ev: &RoleEvent, shared: &Shared, wake: &Notifier) {
    match ev {
        RoleEvent::Elected { epoch } => {
            info!(epoch, "elected leader");
            shared.leading.store(*epoch, Ordering::Release);
        }
        RoleEvent::SteppedDown { epoch, why } => {
            warn!(epoch, why = %why, "stepped down");
            shared.leading.store(0, Ordering::Release);
        }
        RoleEvent::Following(l) => info!(leader = %l.leader, epoch = l.epoch, "following"),
        RoleEvent::LeaderSilent(l) => warn!(leader = %l.leader, epoch = l.epoch, "the leader went silent: its lease is revoked"),
    }
    wake.notify();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(token: &str) -> HeartbeatKey {
        HeartbeatKey::from_token(Some(&JoinToken::new(token.as_bytes()).unwrap()))
    }

    #[test]
    fn heartbeats_parse_back_and_anything_else_is_ignored() {
        let k = key("a cluster's join token, long enough");
        let n = [7u8; NONCE_LEN];
        assert_eq!(parse(&k, &datagram(&k, PING, 0, &n)), Datagram::Authentic(PING, 0, n));
        assert_eq!(parse(&k, &datagram(&k, PONG, 77, &n)), Datagram::Authentic(PONG, 77, n));
        assert_eq!(parse(&k, &datagram(&k, 3, 1, &n)), Datagram::Forged);
        assert_eq!(parse(&k, &[0u8; DATAGRAM_LEN]), Datagram::Stray);
        assert_eq!(parse(&k, &datagram(&k, PING, 0, &n)[..DATAGRAM_LEN - 1]), Datagram::Forged);
        assert_eq!(heartbeat_addr("/tmp/x.sock|127.0.0.1:9"), Some("127.0.0.1:9".parse().unwrap()));
        assert_eq!(heartbeat_addr("127.0.0.1:5|[::1]:7"), Some("[::1]:7".parse().unwrap()));
        assert_eq!(heartbeat_addr("no-separator"), None);
    }

    #[test]
    fn a_heartbeat_under_another_key_or_altered_is_forged() {
        let ours = key("a cluster's join token, long enough");
        let theirs = key("an attacker's guess at the token!!");
        let n = [1u8; NONCE_LEN];
        assert_eq!(parse(&ours, &datagram(&theirs, PONG, u64::MAX, &n)), Datagram::Forged);
        assert_eq!(parse(&ours, &datagram(&HeartbeatKey::from_token(None), PONG, 9, &n)), Datagram::Forged);
        let mut d = datagram(&ours, PONG, 5, &n);
        d[8] ^= 0x80; // the term raised in flight
        assert_eq!(parse(&ours, &d), Datagram::Forged);
        let mut d = datagram(&ours, PONG, 5, &n);
        d[DATAGRAM_LEN - 1] ^= 1;
        assert_eq!(parse(&ours, &d), Datagram::Forged);
        assert_ne!(ours.0, theirs.0);
        assert_ne!(ours.0, [0; 32]);
    }
}
