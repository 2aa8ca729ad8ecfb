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

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use dataplane::time::{Duration, Instant, MonotonicClock};
use dataplane::waitset::Notifier;
use tracing::{info, warn};

use crate::election::{Candidate, CandidateConfig, Etcd, EtcdConfig, RoleEvent};

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

/// Heartbeat datagram: magic, kind, term. 16 bytes, little endian.
const MAGIC: u32 = u32::from_le_bytes(*b"SYHB");
const PING: u32 = 1;
const PONG: u32 = 2;

fn datagram(kind: u32, epoch: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    b[4..8].copy_from_slice(&kind.to_le_bytes());
    b[8..16].copy_from_slice(&epoch.to_le_bytes());
    b
}

/// `(kind, epoch)` of a well-formed datagram; anything else is ignored.
fn parse(b: &[u8]) -> Option<(u32, u64)> {
    let b: &[u8; 16] = b.try_into().ok()?;
    let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    if word(0) != MAGIC {
        return None;
    }
    let mut e = [0u8; 8];
    e.copy_from_slice(&b[8..16]);
    match word(4) {
        k @ (PING | PONG) => Some((k, u64::from_le_bytes(e))),
        _ => None,
    }
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
    /// where peers reach this scheduler; `wake` is notified at every change
    /// of standing.
    pub fn spawn(cfg: &ElectionConfig, control: &str, wake: Notifier) -> std::io::Result<ElectionHost> {
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
        let shared = Arc::new(Shared { leading: AtomicU64::new(0), polls: AtomicU64::new(0), stop: AtomicBool::new(false) });
        let (pongs, heard) = mpsc::sync_channel::<u64>(64);
        let hb = {
            let (shared, socket) = (shared.clone(), socket.try_clone()?);
            std::thread::Builder::new().name("sched-hb".into()).spawn(move || answer_heartbeats(&socket, &shared, &pongs))?
        };
        let elect = {
            let shared = shared.clone();
            let heartbeat = cfg.heartbeat;
            std::thread::Builder::new()
                .name("sched-elect".into())
                .spawn(move || run_candidate(candidate, &socket, heartbeat, &shared, &heard, &wake))?
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

/// `sched-hb`: answers pings with the term led (none: no answer) and
/// passes pongs on to the candidate.
fn answer_heartbeats(socket: &UdpSocket, shared: &Shared, pongs: &mpsc::SyncSender<u64>) {
    let mut buf = [0u8; 64];
    while !shared.stop.load(Ordering::Acquire) {
        let Ok((n, from)) = socket.recv_from(&mut buf) else { continue };
        match buf.get(..n).and_then(parse) {
            Some((PING, _)) => {
                let epoch = shared.leading.load(Ordering::Acquire);
                if epoch != 0 {
                    let _ = socket.send_to(&datagram(PONG, epoch), from);
                }
            }
            // Full: the candidate is behind; a dropped pong is one
            // heartbeat less, never a wrong one.
            Some((PONG, epoch)) => {
                let _ = pongs.try_send(epoch);
            }
            _ => {}
        }
    }
}

/// `sched-elect`: polls the candidate, pings the leader while standing by,
/// and publishes every change of standing.
fn run_candidate(mut cand: Candidate<Etcd>, socket: &UdpSocket, heartbeat: Duration, shared: &Shared, heard: &mpsc::Receiver<u64>, wake: &Notifier) {
    let clock = MonotonicClock::new();
    let mut next_ping = Instant::ZERO;
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
                let _ = socket.send_to(&datagram(PING, 0), leader);
                next_ping = now + heartbeat;
            }
        }
        let until = cand.poll_at().unwrap_or(now + heartbeat).min(next_ping.max(now)).min(now + heartbeat);
        let wait = std::time::Duration::from_nanos(until.saturating_since(clock.now()).as_nanos().max(100_000));
        if let Ok(epoch) = heard.recv_timeout(wait) {
            cand.handle_heartbeat(clock.now(), epoch);
            while let Ok(epoch) = heard.try_recv() {
                cand.handle_heartbeat(clock.now(), epoch);
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

    #[test]
    fn heartbeats_parse_back_and_anything_else_is_ignored() {
        assert_eq!(parse(&datagram(PING, 0)), Some((PING, 0)));
        assert_eq!(parse(&datagram(PONG, 77)), Some((PONG, 77)));
        assert_eq!(parse(&datagram(3, 1)), None);
        assert_eq!(parse(&[0u8; 16]), None);
        assert_eq!(parse(&datagram(PING, 0)[..15]), None);
        assert_eq!(heartbeat_addr("/tmp/x.sock|127.0.0.1:9"), Some("127.0.0.1:9".parse().unwrap()));
        assert_eq!(heartbeat_addr("127.0.0.1:5|[::1]:7"), Some("[::1]:7".parse().unwrap()));
        assert_eq!(heartbeat_addr("no-separator"), None);
    }
}
