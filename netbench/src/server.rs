//! `netbench serve`: exposes K objects of S bytes in one registered region,
//! hands its catalog to each client that says hello, echoes pings, and (tcp)
//! answers READs by polling its connections.

use std::sync::{mpsc, Arc};

use dataplane::mem::{Access, Region, RegionOptions};
use dataplane::time::Duration;
use dataplane::transport::{Connection, Domain, Listener, RemoteRef};
use dataplane::wire::MAX_MESSAGE_LEN;

use crate::fail::{Fail, Res};
use crate::transport::{TransportKind, WithDomain};
use crate::{pattern, perf_proto, proto};

/// How a server waits when it has nothing to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Idle {
    /// Sleep in the kernel until a connection has bytes (one client), else
    /// back off (spin, yield, then 50 us sleeps). Fair on shared cores.
    Block,
    /// Busy-poll without pause (a dedicated core per server).
    Spin,
}

/// What to serve.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// Transport.
    pub kind: TransportKind,
    /// Listen address ("" = transport default).
    pub listen: String,
    /// Objects.
    pub objects: u32,
    /// Bytes per object.
    pub size: u32,
    /// Id announced in the catalog.
    pub id: u32,
    /// Idle behaviour.
    pub idle: Idle,
    /// Exit when the parent process goes away (set by `netbench local`).
    pub exit_with_parent: bool,
    /// Stop after this long (None = until killed).
    pub duration: Option<std::time::Duration>,
    /// Stop once this many clients have come and gone (None = never).
    pub exit_after_clients: Option<u64>,
    /// Largest region allowed, bytes.
    pub max_region: u64,
    /// rdma: the objects are remote-writable too (RDMA WRITE targets).
    pub writable: bool,
}

/// Checks object count and size against the protocol and a transport's limit.
pub fn check_shape(
    objects: u32,
    size: u32,
    max_read: u32,
    max_region: u64,
    kind: TransportKind,
) -> Res<()> {
    if objects == 0 {
        return Err(Fail::usage("--objects must be at least 1"));
    }
    if objects as usize > proto::MAX_OBJECTS {
        return Err(Fail::usage(format!(
            "--objects {objects}: a server announces at most {} objects (one catalog message)",
            proto::MAX_OBJECTS
        )));
    }
    if size == 0 {
        return Err(Fail::usage("--size must be at least 1 byte"));
    }
    if size > max_read {
        return Err(Fail::usage(format!(
            "--size {size}: larger than the {} transport's longest READ ({max_read} bytes)",
            kind.name()
        )));
    }
    let total = u64::from(objects) * u64::from(size);
    if total > max_region {
        return Err(Fail::usage(format!(
            "--objects {objects} x --size {size} = {total} bytes: larger than the region limit \
             ({max_region} bytes, --max-region)"
        )));
    }
    Ok(())
}

/// Runs a server until killed (or `duration`, or the parent's exit).
pub fn serve(cfg: ServeConfig, opts: crate::transport::DomainOptions) -> Res<()> {
    crate::transport::with_domain(cfg.kind, opts, Serve(cfg))
}

struct Serve(ServeConfig);

impl WithDomain for Serve {
    type Out = ();
    fn run<D: Domain>(self, domain: D) -> Res<()> {
        let cfg = self.0;
        check_shape(
            cfg.objects,
            cfg.size,
            domain.max_read_len(),
            cfg.max_region,
            cfg.kind,
        )?;
        let total = cfg.objects as usize * cfg.size as usize;
        let opts = if cfg.kind == TransportKind::Shm {
            RegionOptions::shared(total)
        } else {
            RegionOptions::anonymous(total)
        };
        let region: Arc<Region> = Region::with_options(&opts)
            .map_err(Fail::caused(format!("cannot map {total} bytes")))?;
        let mut obj = vec![0u8; cfg.size as usize];
        for j in 0..cfg.objects {
            pattern::fill(&mut obj, j);
            region.write_at(u64::from(j) * u64::from(cfg.size), &obj)?;
        }
        drop(obj);
        // Remote-writable only when asked, and only where WRITE is one-sided.
        let access = if cfg.writable && cfg.kind == TransportKind::Rdma {
            Access::REMOTE_READ | Access::REMOTE_WRITE
        } else {
            Access::REMOTE_READ
        };
        let reg = domain.register(&region, access)?;
        let refs: Vec<RemoteRef> = (0..cfg.objects)
            .map(|j| reg.remote_ref(u64::from(j) * u64::from(cfg.size), cfg.size))
            .collect::<Result<_, _>>()?;
        let listener = domain
            .listen(&cfg.listen)
            .map_err(Fail::caused(format!("cannot listen on {:?}", cfg.listen)))?;
        // The first stdout line is the contract with `netbench local`.
        println!("listening {}", listener.local_addr());
        println!(
            "serving {} objects x {} bytes over {} (key {:#x}, first offset {:#x}); \
             clients get the catalog on connect",
            cfg.objects,
            cfg.size,
            domain.kind(),
            refs[0].key,
            refs[0].offset
        );
        use std::io::Write;
        let _ = std::io::stdout().flush();

        // WRITE/SEND operations of `netbench lat`/`bw` land here: as large
        // as the objects together (clients size their operations by the
        // catalog), at most 16 MiB, the tcp and shm transports' longest READ.
        let mut sink = perf_proto::Sink::new(total.min(16 << 20));
        let mut catalog = vec![0u8; MAX_MESSAGE_LEN];
        let clen = proto::encode_catalog(&mut catalog, cfg.id, &refs)?;
        let catalog = &catalog[..clen];
        let parent = std::os::unix::process::parent_id();
        let started = std::time::Instant::now();
        let mut conns: Vec<Client<D::Conn>> = Vec::new();
        let mut buf = vec![0u8; MAX_MESSAGE_LEN];
        let mut idle_steps = 0u32;
        let mut departed = 0u64;
        let mut last_check = std::time::Instant::now();
        let incoming = spawn_acceptor(listener);
        loop {
            // Housekeeping a few times a second: new clients, exit conditions.
            let now = std::time::Instant::now();
            if conns.is_empty()
                || now.duration_since(last_check) >= std::time::Duration::from_millis(20)
            {
                last_check = now;
                if cfg.exit_with_parent && std::os::unix::process::parent_id() != parent {
                    return Ok(());
                }
                if cfg.duration.is_some_and(|d| started.elapsed() >= d) {
                    return Ok(());
                }
                if conns.is_empty() && cfg.exit_after_clients.is_some_and(|n| departed >= n) {
                    return Ok(());
                }
                if conns.is_empty() {
                    match incoming.recv_timeout(std::time::Duration::from_millis(50)) {
                        Ok(c) => conns.push(Client::new(c)),
                        Err(mpsc::RecvTimeoutError::Timeout) => continue,
                        Err(mpsc::RecvTimeoutError::Disconnected) => {
                            return Err(Fail::runtime("the listener stopped accepting"));
                        }
                    }
                }
                conns.extend(incoming.try_iter().map(Client::new));
            }
            let mut busy = false;
            let shape = (cfg.objects, cfg.size);
            conns.retain_mut(|c| {
                match serve_one(c, &domain, &mut buf, catalog, shape, &mut sink) {
                    Ok(worked) => {
                        busy |= worked;
                        true
                    }
                    Err(e) => {
                        if e.kind() != dataplane::transport::ErrorKind::PeerDisconnected {
                            tracing::warn!("dropping a client: {e}");
                        }
                        departed += 1;
                        false
                    }
                }
            });
            idle_steps = if busy {
                0
            } else {
                idle_steps.saturating_add(1)
            };
            pause(idle_now(cfg.idle, &conns), &mut conns, busy, idle_steps);
        }
    }
}

/// How to idle after this pass: raw queues have no completion channel, so
/// while a client's raw phase is open the server polls, whatever
/// `--server-idle` says.
fn idle_now<C>(idle: Idle, conns: &[Client<C>]) -> Idle {
    let raw_open = conns
        .iter()
        .any(|c| c.raw.as_ref().is_some_and(|r| r.is_open()));
    if raw_open {
        Idle::Spin
    } else {
        idle
    }
}

/// Between two passes over the clients: nothing after work when spinning;
/// otherwise sleep on the one client's connection or back off.
fn pause<C: Connection>(idle: Idle, conns: &mut [Client<C>], busy: bool, idle_steps: u32) {
    match idle {
        Idle::Spin if busy => {}
        Idle::Spin => std::hint::spin_loop(),
        Idle::Block => {
            // With one client, sleep in the kernel right after the
            // work too: `wait` returns at once if anything is
            // pending, and polling again first would only add
            // syscalls to every wake-up (the last `try_recv` of the
            // pass just found the connection empty).
            let waited = if let [only] = conns {
                // An error is noticed by the next poll.
                only.conn.wait(Duration::from_millis(20)).unwrap_or(true)
            } else {
                false
            };
            if !waited && !busy {
                backoff(idle_steps);
            }
        }
    }
}

/// Accepts on a thread of its own and hands connections over a channel.
///
/// Why a thread: a transport's `accept` includes its connection setup
/// (the rdma queue-pair exchange, the shm registry handshake) within the
/// timeout it is given, so polling it with a zero timeout from the serving
/// loop would cut setups short, and a long timeout would stall the clients
/// already connected. Accepting is not on any measured path.
fn spawn_acceptor<L: Listener + 'static>(mut listener: L) -> mpsc::Receiver<L::Conn> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || loop {
        match listener.accept(Duration::from_millis(5_000)) {
            Ok(mut c) => {
                // A benchmark server serves its clients' READs at once.
                c.allow_remote_reads();
                if tx.send(c).is_err() {
                    return; // the server is gone
                }
            }
            Err(dataplane::transport::Error::Timeout) => {}
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
    });
    rx
}

/// Spin a little, then yield, then sleep: for transports that cannot block
/// in the kernel (rdma: READs need no server CPU, only pings and hellos do).
/// Sleeps are 50 us for the first ~10 ms of idleness, then 1 ms, so that
/// idle servers on few (or emulated) cores cost little CPU. The spin phase
/// is short: under emulation (QEMU TCG) each PAUSE costs microseconds.
fn backoff(step: u32) {
    if step < 200 {
        std::hint::spin_loop();
    } else if step < 300 {
        std::thread::yield_now();
    } else if step < 500 {
        std::thread::sleep(std::time::Duration::from_micros(50));
    } else {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// One client's connection and what the server counts for it.
struct Client<C> {
    conn: C,
    /// SEND-stream operations landed since the client last asked
    /// (`perf_proto::Reply::None`, and raw SENDs).
    landed: u64,
    /// rdma: the raw-SEND receive buffer (`crate::server_raw`), registered
    /// at the client's first raw phase.
    raw: Option<crate::server_raw::RawRx>,
}

impl<C> Client<C> {
    fn new(conn: C) -> Self {
        Client {
            conn,
            landed: 0,
            raw: None,
        }
    }
}

/// Polls one client: answers hellos and pings, serves READs (tcp, inside
/// its polls). Returns whether a message was handled.
/// `shape` = (objects, their size: the longest raw SEND a client may send).
fn serve_one<D: Domain>(
    client: &mut Client<D::Conn>,
    domain: &D,
    buf: &mut [u8],
    catalog: &[u8],
    (objects, raw_len): (u32, u32),
    sink: &mut perf_proto::Sink,
) -> Result<bool, dataplane::transport::Error>
where
    D::Conn: 'static,
{
    let Client { conn, landed, raw } = client;
    let mut worked = crate::server_raw::pump(raw.as_mut(), conn, landed)?;
    while let Some(n) = conn.try_recv(buf)? {
        worked = true;
        let msg = &buf[..n];
        match perf_proto::decode(msg) {
            Some(perf_proto::PerfMsg::RawOpen { rx_depth, echo }) => {
                *landed = 0;
                if raw.is_none() {
                    *raw = crate::server_raw::raw_rx(domain, conn, raw_len);
                }
                let posted = crate::server_raw::open(raw.as_mut(), conn, rx_depth, echo)?;
                let mut out = [0u8; 128];
                let n = perf_proto::encode_raw_ready(&mut out, posted).map_err(|_| {
                    dataplane::transport::Error::Protocol(dataplane::wire::WireError::BadLength)
                })?;
                send_retrying(conn, &out[..n])?;
                continue;
            }
            Some(perf_proto::PerfMsg::WriteOpen(peer)) => {
                if raw.is_none() {
                    *raw = crate::server_raw::raw_rx(domain, conn, raw_len);
                }
                let mine = crate::server_raw::write_open(raw.as_mut(), conn, peer)?;
                let mut out = [0u8; 128];
                let n = perf_proto::encode_write_ready(&mut out, mine).map_err(|_| {
                    dataplane::transport::Error::Protocol(dataplane::wire::WireError::BadLength)
                })?;
                send_retrying(conn, &out[..n])?;
                continue;
            }
            // Every raw SEND the client counts has completed there, so its
            // receive completion is here: count them before the tally.
            Some(perf_proto::PerfMsg::TallyQuery) => {
                crate::server_raw::pump(raw.as_mut(), conn, landed)?;
            }
            _ => {}
        }
        if sink.handle(conn, landed, msg, send_retrying)? {
            // A WRITE/SEND chunk of `netbench lat`/`bw`, landed (and answered).
        } else if proto::is_ping(msg) {
            send_retrying(conn, msg)?;
        } else if let Some(want) = proto::decode_hello(msg) {
            if want != objects {
                tracing::warn!(
                    "a client asked for {want} objects; this server has {objects} \
                     (sending the catalog; the client will refuse it)"
                );
            }
            send_retrying(conn, catalog)?;
        } else {
            tracing::warn!("ignoring an unexpected {n}-byte message");
        }
    }
    // No separate `progress` call: a `try_recv` that finds no message does
    // the connection's background work itself (tcp and shm: a full poll,
    // which serves READ requests and sends; rdma: the peer check; rdma send
    // completions are reaped by `send` when its queue fills, and
    // `send_retrying` polls on QueueFull). An extra poll per pass would be
    // an extra syscall on every wake-up of a blocking server.
    Ok(worked)
}

fn send_retrying<C: Connection>(
    conn: &mut C,
    msg: &[u8],
) -> Result<(), dataplane::transport::Error> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match conn.send(msg) {
            Err(dataplane::transport::Error::QueueFull) if std::time::Instant::now() < deadline => {
                conn.progress()?;
            }
            other => return other,
        }
    }
}
