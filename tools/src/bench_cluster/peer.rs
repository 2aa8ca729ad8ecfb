//! What both synthetic peer processes of `symphony bench-cluster` share:
//! their command line, the real join handshake over a dataplane
//! connection, heartbeats, and the report file they leave for the
//! orchestrator.

use super::BenchClusterError;
use std::path::PathBuf;

use dataplane::control::{self, connect_retrying, recv_within, send_within, Liveness, TransportKind};
use dataplane::join::{JoinToken, PeerProof};
use dataplane::time::{Duration, Instant, MonotonicClock};
use dataplane::transport::{Connection, Domain, Error};
use dataplane::wire::{self, Join, Message, Role, Welcome};
use hdrhistogram::Histogram;

/// Bound on connecting and on one registration.
pub const JOIN_TIMEOUT: Duration = Duration::from_millis(20_000);
/// Heartbeat interval of the synthetic peers (the scheduler's default
/// liveness bound is far above it).
pub const HEARTBEAT: Duration = Duration::from_millis(100);

/// Command line of `symphony daemon bench-frontends|bench-backends`
/// (started by `symphony bench-cluster`, not meant to be typed).
#[derive(clap::Parser, Debug, Clone)]
pub struct PeerArgs {
    /// Transport: shm or tcp.
    #[arg(long, value_parser = TransportKind::parse)]
    pub transport: TransportKind,
    /// The scheduler's control address.
    #[arg(long)]
    pub scheduler: String,
    /// Connections (peers) this process holds.
    #[arg(long)]
    pub peers: u32,
    /// Id of the first peer (the others follow).
    #[arg(long, default_value_t = 1)]
    pub first_id: u32,
    /// Models in the cluster list (ids 0..N).
    #[arg(long)]
    pub models: u32,
    /// Model profile ALPHA_MS,BETA_MS,SLO_MS (every model).
    #[arg(long)]
    pub profile: String,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub link_tls: node_shell::LinkTlsArgs,
    /// Frontends: offered tasks/s over all peers of this process.
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Frontends: seconds of load.
    #[arg(long = "duration-s", default_value_t = 1.0)]
    pub duration_s: f64,
    /// Frontends: every Nth task is preceded by a clock stamp.
    #[arg(long = "stamp-every", default_value_t = 16)]
    pub stamp_every: u64,
    /// Frontends: most tasks per message (1: one `Task` message each, >1:
    /// batched `Tasks` messages).
    #[arg(long, default_value_t = 1)]
    pub coalesce: u32,
    /// Frontends: longest a task waits for its batch, µs.
    #[arg(long = "coalesce-us", default_value_t = 50)]
    pub coalesce_us: u64,
    /// Frontends: an arrival the generator reaches more than this late is
    /// refused (counted), not sent; 0: every arrival is sent however late.
    #[arg(long = "max-lag-us", default_value_t = 0)]
    pub max_lag_us: u64,
    /// Frontends: a link whose oldest message not yet read by the
    /// scheduler has waited longer than this (µs) refuses further tasks
    /// (counted as queue full) instead of queueing them; 0: no bound.
    #[arg(long = "queue-budget-us", default_value_t = 0)]
    pub queue_budget_us: u64,
    /// Backends: total emulated GPUs, spread over the peers.
    #[arg(long, default_value_t = 0)]
    pub gpus: u32,
    /// Seed of the arrivals.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Where to write the JSON report at exit.
    #[arg(long)]
    pub report: PathBuf,
    /// Exit when the parent does.
    #[arg(long)]
    pub exit_with_parent: bool,
    /// Run this process under `SCHED_FIFO` at this priority (1-99; 0: the
    /// default policy). See `bench-cluster --backend-rt-priority`.
    #[arg(long = "rt-priority", default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=99))]
    pub rt_priority: u8,
    /// Run this process on this CPU only (`bench-cluster --layout auto`).
    #[arg(long = "pin-cpu")]
    pub pin_cpu: Option<usize>,
}

/// Puts the calling thread (and the threads it starts after this) under
/// `SCHED_FIFO` at `priority`.
pub fn set_realtime_fifo(priority: u8) -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: i32::from(priority) };
    // SAFETY: `param` is a valid sched_param on this stack frame; pid 0 is
    // the calling thread.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// GPUs of peer `i` of `peers` when `total` are spread as evenly as
/// possible (the first ones get one more).
pub fn gpus_of(i: u32, peers: u32, total: u32) -> u32 {
    total / peers + u32::from(i < total % peers)
}

/// The synthetic peers never declare the scheduler silent (a failed link
/// ends them instead).
const NEVER_SILENT: Duration = Duration::from_millis(3_600_000);

/// One registered link and its heartbeat state.
pub struct PeerLink<C> {
    pub id: u32,
    pub conn: C,
    pub live: Liveness,
}

/// Runs the real registration on `conn`: waits for the scheduler's
/// Challenge, answers with `Join{role, id, gpus}` (with our nonce and a
/// MAC when `proof` holds a token) and, for a backend, the model list;
/// returns the Welcome once it proves the token as the daemons check it
/// (`PeerProof::check_welcome`), and refuses one that does not.
pub fn join<C: Connection>(
    conn: &mut C,
    role: Role,
    id: u32,
    gpus: u32,
    models: u32,
    proof: &mut PeerProof,
) -> Result<Welcome, BenchClusterError> {
    let mut buf = vec![0u8; wire::MAX_MESSAGE_LEN];
    let err = |e: Error| BenchClusterError::caused(format!("{role:?} {id}: registering"))(e);
    let n = recv_within(conn, &mut buf, JOIN_TIMEOUT).map_err(err)?;
    let nonce = match wire::decode(&buf[..n]) {
        Ok(Message::Challenge(c)) => c.nonce,
        other => return Err(BenchClusterError::Peer(format!("{role:?} {id}: expected a Challenge, got {other:?}"))),
    };
    let nonces = proof
        .nonces(nonce)
        .ok_or_else(|| BenchClusterError::Peer(format!("{role:?} {id}: no OS randomness for a nonce")))?;
    let j = proof.sign(Join::new(role, id, gpus, "bench-cluster:none"), &nonces);
    let n = wire::encode(&mut buf, &j)?;
    send_within(conn, &buf[..n], JOIN_TIMEOUT).map_err(err)?;
    if role == Role::Backend {
        let ids: Vec<u32> = (0..models).collect();
        let n = wire::encode_models(&mut buf, &ids)?;
        send_within(conn, &buf[..n], JOIN_TIMEOUT).map_err(err)?;
    }
    control::flush_within(conn, JOIN_TIMEOUT).map_err(err)?;
    loop {
        let n = recv_within(conn, &mut buf, JOIN_TIMEOUT).map_err(err)?;
        match wire::decode(&buf[..n]) {
            Ok(Message::Welcome(w)) if proof.check_welcome(&nonces, &j, &w) => return Ok(w),
            Ok(Message::Welcome(_)) => {
                return Err(BenchClusterError::Peer(format!(
                    "{role:?} {id}: the Welcome does not prove the join token (unsigned or forged): not this cluster's scheduler"
                )))
            }
            Ok(Message::Refused(r)) => return Err(BenchClusterError::Peer(format!("{role:?} {id}: refused: {r}"))),
            Ok(Message::Heartbeat(_)) => {}
            other => return Err(BenchClusterError::Peer(format!("{role:?} {id}: expected a Welcome, got {other:?}"))),
        }
    }
}

/// Registered links and the last Welcome.
pub type Joined<C> = (Vec<PeerLink<C>>, Option<Welcome>);

/// Connects and registers `a.peers` links of `role` one after the other
/// (ids from `a.first_id`; peer `i` announces `gpus(i)` GPUs), keeping
/// the links already registered alive meanwhile (hundreds of joins take
/// longer than the scheduler's liveness bound). Returns the links and the
/// last Welcome.
pub fn join_all<D: Domain>(
    domain: &D,
    a: &PeerArgs,
    role: Role,
    clock: &MonotonicClock,
    gpus: impl Fn(u32) -> u32,
) -> Result<Joined<D::Conn>, BenchClusterError> {
    let mut proof = PeerProof::new(JoinToken::from_file_or_env(None)?);
    let mut links: Vec<PeerLink<D::Conn>> = Vec::with_capacity(a.peers as usize);
    let mut welcome = None;
    let mut buf = vec![0u8; wire::MAX_MESSAGE_LEN];
    for i in 0..a.peers {
        let id = a.first_id + i;
        let mut conn = connect_retrying(domain, &a.scheduler, JOIN_TIMEOUT).map_err(BenchClusterError::caused(format!("{role:?} {id}: connect")))?;
        welcome = Some(join(&mut conn, role, id, gpus(i), a.models, &mut proof)?);
        let now = clock.now();
        links.push(PeerLink { id, conn, live: Liveness::new(now, HEARTBEAT, NEVER_SILENT) });
        for l in links.iter_mut() {
            // What the scheduler sends meanwhile (heartbeats, peer
            // announcements) is read and dropped.
            while let Ok(Some(_)) = l.conn.try_recv(&mut buf) {}
            beat(l, now, role, &mut buf).map_err(BenchClusterError::caused(format!("{role:?} {}", l.id)))?;
        }
    }
    Ok((links, welcome))
}

/// Sends `link`'s heartbeat when due (a full queue skips a beat); an
/// error means the scheduler is gone.
pub fn beat<C: Connection>(link: &mut PeerLink<C>, now: Instant, role: Role, buf: &mut [u8]) -> Result<(), Error> {
    if let Some(n) = link.live.due(now, role, link.id, buf) {
        match link.conn.send(&buf[..n]) {
            Ok(()) | Err(Error::QueueFull) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A lag histogram in ns (1 ns .. 100 s, 3 significant digits).
pub fn ns_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("static histogram bounds are valid")
}

/// p50/p99/p99.9/max of a ns histogram, in µs (zeros when empty).
#[derive(Clone, Copy, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct LagUs {
    pub samples: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p99_9_us: f64,
    pub max_us: f64,
}

impl LagUs {
    pub fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return LagUs::default();
        }
        let q = |p: f64| h.value_at_quantile(p) as f64 / 1e3;
        LagUs { samples: h.len(), p50_us: q(0.5), p99_us: q(0.99), p99_9_us: q(0.999), max_us: h.max() as f64 / 1e3 }
    }
}

/// CPU seconds (user + system) this process has used so far.
pub fn cpu_s_self() -> f64 {
    // SAFETY: an all-zero rusage is a valid value of this plain C struct.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes one rusage into the valid, owned `u`.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0.0;
    }
    let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    s(u.ru_utime) + s(u.ru_stime)
}

/// Writes `report` as JSON to `path`.
pub fn write_report<T: serde::Serialize>(path: &std::path::Path, report: &T) -> Result<(), BenchClusterError> {
    let text = serde_json::to_string(report)?;
    // Whole or not at all: the runner reads it as soon as it appears.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).map_err(BenchClusterError::caused(tmp.display().to_string()))?;
    std::fs::rename(&tmp, path).map_err(BenchClusterError::caused(path.display().to_string()))
}
