//! The `symphony-backend` daemon (protocol: the daemon protocol spec).
//!
//! Start-up: check the configuration, build the staging region and the
//! executor (so a missing CUDA driver is reported before anything
//! connects), connect to the scheduler, send `Register{Backend, id, gpus}`
//! and the `Models` it holds, wait for the scheduler's acknowledgement,
//! start `/metrics`, print `READY metrics=HOST:PORT gpus=N`.
//!
//! Then one thread runs the loop: [`BatchWorker::poll`] on the monotonic
//! clock; scheduler control messages (`Register{Frontend}`: open a data
//! connection to that frontend; heartbeats); our heartbeats; the scheduler's
//! liveness; counters for the metrics thread; and the idle strategy, whose
//! parks never outlast the next timer (a device finishing, a planned start,
//! a heartbeat). Opening a data connection may take seconds (the frontend
//! may still be starting), so a helper thread connects, sends
//! `Register{Backend}` first and hands the connection back over a channel:
//! the loop never blocks.
//!
//! Shutdown: on SIGINT/SIGTERM, or when the scheduler is gone (disconnect,
//! or silent for `--dead-after-ms`), the worker stops reading plans, the
//! batches in hand finish (bounded by [`DRAIN_TIMEOUT`]), queued messages
//! are flushed, and the process exits: 0 after a stop signal, 1 when the
//! scheduler went away.

pub mod config;
pub mod metrics;

use std::io::Write;
use std::process::ExitCode;
use std::sync::mpsc;
use std::sync::Arc;

use dataplane::control::{
    self, connect_retrying, expect_register, flush_within, send_register, send_within,
    MetricsEndpoint, WithDomain,
};
use dataplane::waitset::{IdleWait, Notifier};
use dataplane::mem::{Access, Region};
use dataplane::time::{Duration, Instant, MonotonicClock};
use dataplane::transport::{Connection, Domain, Error, Registration};
use dataplane::wire::{self, Register, Role};

use crate::exec::{ExecModel, Executor};
use crate::worker::{BatchWorker, ControlMessage, WorkerConfig, WorkerError, WorkerStats};
use crate::EmulatedExecutor;
pub use config::{Args, ExecutorKind, Settings};
use metrics::BackendMetrics;

/// Longest wait for the batches in hand when shutting down.
pub const DRAIN_TIMEOUT: Duration = Duration::from_millis(10_000);
/// Bound on each handshake step (a send, the scheduler's ack).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_millis(5_000);
/// How long a new connection to a frontend waits for the old one's READs
/// before it replaces it anyway.
const REPLACE_TIMEOUT: Duration = Duration::from_millis(5_000);

/// Why the daemon stopped.
#[derive(Debug, PartialEq, Eq)]
pub enum Exit {
    /// A stop was requested (signal): clean, exit code 0.
    Stopped,
    /// The scheduler disconnected or went silent: exit code 1.
    SchedulerGone,
}

/// Runs `symphony-backend` with a command line (`args[0]` is the program
/// name); for the binary and for a multi-call binary. Installs the
/// SIGINT/SIGTERM handlers. Exit code 0 after a stop signal, 1 on a
/// runtime failure (scheduler gone or refusing us, executor unavailable),
/// 2 on a bad command line or configuration.
pub fn main_with_args(args: Vec<String>) -> ExitCode {
    let parsed = match Args::parse_from_args(&args) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let settings = match parsed.with_config_file().and_then(Args::resolve) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("symphony-backend: configuration error: {e}");
            return ExitCode::from(2);
        }
    };
    if settings.exit_with_parent {
        control::terminate_with_parent();
    }
    if let Err(e) = control::install_stop_signals() {
        eprintln!("symphony-backend: {e}");
        return ExitCode::from(1);
    }
    let announce = |ready: &Ready| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "READY metrics={} gpus={}", ready.metrics, ready.gpus);
        let _ = out.flush();
    };
    match run(&settings, &control::stop_requested, &announce) {
        Ok(Exit::Stopped) => {
            eprintln!("symphony-backend[{}]: stopped", settings.id);
            ExitCode::SUCCESS
        }
        Ok(Exit::SchedulerGone) => {
            eprintln!("symphony-backend[{}]: scheduler gone; exiting", settings.id);
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("symphony-backend[{}]: error: {e}", settings.id);
            ExitCode::from(1)
        }
    }
}

/// What a started backend tells its launcher.
#[derive(Clone, Debug)]
pub struct Ready {
    /// The bound metrics address.
    pub metrics: std::net::SocketAddr,
    /// GPUs.
    pub gpus: u32,
}

/// Runs the daemon until `stop()` returns true (then `Ok(Exit::Stopped)`)
/// or the scheduler is gone; `ready` is called once registered and
/// serving. `Err` says why it could not start or had to give up.
pub fn run(s: &Settings, stop: &dyn Fn() -> bool, ready: &dyn Fn(&Ready)) -> Result<Exit, String> {
    control::with_domain(s.transport, Launch { s, stop, ready })?
}

struct Launch<'a> {
    s: &'a Settings,
    stop: &'a dyn Fn() -> bool,
    ready: &'a dyn Fn(&Ready),
}

impl WithDomain for Launch<'_> {
    type Out = Result<Exit, String>;
    fn run<D: Domain>(self, domain: D) -> Self::Out {
        let s = self.s;
        if s.input_bytes > domain.max_read_len() {
            return Err(format!(
                "--input-bytes {}: above the {} transport's longest READ ({})",
                s.input_bytes,
                s.transport.name(),
                domain.max_read_len()
            ));
        }
        let cfg = worker_config(s);
        // Private memory is enough: the staging region is written by READs
        // this process issues, never read by peers.
        let staging = Region::anonymous(cfg.staging_bytes() as usize)
            .map_err(|e| format!("staging region ({} bytes): {e}", cfg.staging_bytes()))?;
        let staging_reg = domain
            .register(&staging, Access::LOCAL_WRITE)
            .map_err(|e| format!("registering the staging region: {e}"))?;
        let models: Vec<ExecModel> = s
            .models
            .iter()
            .map(|m| ExecModel {
                profile: m.profile.clone(),
                output_len: s.output_bytes,
            })
            .collect();
        match s.executor {
            ExecutorKind::Emulated => {
                let exec = EmulatedExecutor::new(staging, s.gpus, s.max_batch, models);
                serve(domain, cfg, exec, staging_reg, self)
            }
            ExecutorKind::Cuda => cuda(domain, cfg, staging, staging_reg, models, self),
        }
    }
}

#[cfg(feature = "cuda")]
fn cuda<D: Domain>(
    domain: D,
    cfg: WorkerConfig,
    staging: Arc<Region>,
    staging_reg: Registration,
    models: Vec<ExecModel>,
    launch: Launch<'_>,
) -> Result<Exit, String> {
    let s = launch.s;
    let ordinals: Vec<usize> = (0..s.gpus as usize).collect();
    let exec = crate::CudaExecutor::new(
        &ordinals,
        staging,
        s.max_batch,
        s.input_bytes,
        s.output_bytes,
        models,
    )
    .map_err(|e| format!("executor cuda: {e}"))?;
    serve(domain, cfg, exec, staging_reg, launch)
}

#[cfg(not(feature = "cuda"))]
fn cuda<D: Domain>(
    _domain: D,
    _cfg: WorkerConfig,
    _staging: Arc<Region>,
    _staging_reg: Registration,
    _models: Vec<ExecModel>,
    _launch: Launch<'_>,
) -> Result<Exit, String> {
    Err("executor cuda: built without CUDA support (rebuild with `--features cuda`)".into())
}

fn worker_config(s: &Settings) -> WorkerConfig {
    WorkerConfig {
        max_batch: s.max_batch,
        input_slot: s.input_bytes,
        output_slot: s.output_bytes,
        batch_slots: s.batch_slots,
        max_frontends: config::MAX_FRONTENDS,
        control_delay: s.control_delay,
        fetch_grace: s.fetch_grace,
        report_capacity: 4096,
        start_when_ready: s.start_when_ready,
    }
}

/// Connects to the scheduler and registers; returns the connection once
/// the scheduler acknowledged.
fn register_with_scheduler<D: Domain>(domain: &D, s: &Settings) -> Result<D::Conn, String> {
    let mut conn = connect_retrying(domain, &s.scheduler, s.connect_timeout)
        .map_err(|e| format!("cannot reach the scheduler at '{}': {e}", s.scheduler))?;
    let me = Register::new(Role::Backend, s.id, s.gpus, "");
    // The scheduler refuses a registration by closing the connection, which
    // the backend may notice at any step of the handshake.
    let lost = |e: Error| {
        match e {
        Error::PeerDisconnected => format!(
            "the scheduler refused the registration of backend {} (closed the connection): duplicate id, or a model it does not know",
            s.id
        ),
        e => format!("registering with the scheduler: {e}"),
    }
    };
    send_register(&mut conn, &me, HANDSHAKE_TIMEOUT).map_err(lost)?;
    let mut buf = vec![0u8; wire::MAX_MESSAGE_LEN];
    let n = wire::encode_models(&mut buf, &s.served).map_err(|e| lost(e.into()))?;
    send_within(&mut conn, &buf[..n], HANDSHAKE_TIMEOUT).map_err(lost)?;
    flush_within(&mut conn, HANDSHAKE_TIMEOUT).map_err(lost)?;
    let ack = match expect_register(&mut conn, HANDSHAKE_TIMEOUT) {
        Ok(r) => r,
        Err(Error::Timeout) => {
            return Err(format!(
                "no acknowledgement from the scheduler within {} ms",
                HANDSHAKE_TIMEOUT.as_nanos() / 1_000_000
            ))
        }
        Err(e) => return Err(lost(e)),
    };
    if ack.role() != Some(Role::Scheduler) {
        return Err(format!(
            "the scheduler answered with a registration of role {} instead of Scheduler",
            ack.role
        ));
    }
    if ack.count as usize != s.models.len() {
        return Err(format!(
            "model list mismatch: the scheduler has {} models, this backend {} (give every daemon the same --zoo/--models/--model)",
            ack.count,
            s.models.len()
        ));
    }
    Ok(conn)
}

/// A data connection opened by the connector thread.
type Opened<C> = (u32, Result<C, String>);
/// Requests to the connector thread: frontend id and data endpoint.
type ConnectRequests = mpsc::Sender<(u32, String)>;

/// The poll loop's ends of the connector thread's channels.
struct Connector<C> {
    requests: ConnectRequests,
    opened: mpsc::Receiver<Opened<C>>,
}

/// Starts the thread that opens frontend data connections: it connects
/// (retrying for `timeout`), sends our `Register{Backend}` first, and hands
/// the connection back. It ends when the request channel closes.
fn spawn_connector<D: Domain>(
    domain: D,
    me: Register,
    timeout: Duration,
    wake: Notifier,
) -> Result<Connector<D::Conn>, String> {
    let (req_tx, req_rx) = mpsc::channel::<(u32, String)>();
    let (done_tx, done_rx) = mpsc::channel::<Opened<D::Conn>>();
    std::thread::Builder::new()
        .name("backend-connect".into())
        .spawn(move || {
            for (fid, endpoint) in req_rx {
                let opened = connect_retrying(&domain, &endpoint, timeout)
                    .map_err(|e| format!("cannot connect to frontend {fid} at '{endpoint}': {e}"))
                    .and_then(|mut c| {
                        send_register(&mut c, &me, timeout)
                            .map(|()| c)
                            .map_err(|e| format!("registering with frontend {fid}: {e}"))
                    });
                if done_tx.send((fid, opened)).is_err() {
                    return;
                }
                wake.signal();
            }
        })
        .map_err(|e| format!("cannot start the connector thread: {e}"))?;
    Ok(Connector {
        requests: req_tx,
        opened: done_rx,
    })
}

fn serve<D: Domain, E: Executor>(
    domain: D,
    cfg: WorkerConfig,
    exec: E,
    staging_reg: Registration,
    launch: Launch<'_>,
) -> Result<Exit, String> {
    let s = launch.s;
    let sched = register_with_scheduler(&domain, s)?;
    let mut worker =
        BatchWorker::new(cfg, exec, staging_reg, sched).map_err(|e| format!("worker: {e}"))?;
    let metrics = Arc::new(BackendMetrics::new(
        s.id,
        s.gpus,
        s.models.iter().map(|m| m.name.clone()).collect(),
    ));
    let render = metrics.clone();
    let endpoint = MetricsEndpoint::start(s.metrics, Arc::new(move || render.render()))
        .map_err(|e| format!("metrics endpoint on {}: {e}", s.metrics))?;
    let me = Register::new(Role::Backend, s.id, s.gpus, "");
    let mut idle = IdleWait::new(s.idle).map_err(|e| format!("wait set: {e}"))?;
    let connector = spawn_connector(domain.clone(), me, s.connect_timeout, idle.notifier())?;
    eprintln!(
        "symphony-backend[{}]: registered with {} over {} ({} GPUs, {} executor, {} of {} models); metrics on {}",
        s.id,
        s.scheduler,
        s.transport.name(),
        s.gpus,
        match s.executor {
            ExecutorKind::Emulated => "emulated",
            ExecutorKind::Cuda => "cuda",
        },
        s.served.len(),
        s.models.len(),
        endpoint.addr()
    );
    (launch.ready)(&Ready {
        metrics: endpoint.addr(),
        gpus: s.gpus,
    });
    let exit = run_loop(&mut worker, s, &metrics, launch.stop, &connector, &mut idle);
    // Closing the request channel ends the connector thread once its
    // current attempt (if any) is over; it is not waited for.
    drop(connector);
    flush_all(&mut worker);
    drop(endpoint);
    exit
}

/// Gives queued completions and BatchDones their chance to leave.
fn flush_all<C: Connection, E: Executor>(worker: &mut BatchWorker<C, E>) {
    let t = Duration::from_millis(100);
    let _ = flush_within(worker.scheduler(), t);
    for fid in 0..config::MAX_FRONTENDS {
        if let Some(c) = worker.frontend(fid) {
            let _ = flush_within(c, t);
        }
    }
}

/// Poll-loop state that is not the worker's.
struct Loop<C> {
    draining: Option<(Exit, std::time::Instant)>,
    /// New connections waiting for the old one's READs (frontend id,
    /// connection, when to replace anyway).
    pending: Vec<(u32, C, std::time::Instant)>,
    seen_heard: Instant,
    /// Frontend connections installed in the worker, with a generation
    /// that changes when a connection is replaced (its fd number may be
    /// reused by the new one).
    installed: Vec<(u32, u64)>,
    generation: u64,
}

fn run_loop<C: Connection, E: Executor>(
    worker: &mut BatchWorker<C, E>,
    s: &Settings,
    metrics: &BackendMetrics,
    stop: &dyn Fn() -> bool,
    connector: &Connector<C>,
    idler: &mut IdleWait,
) -> Result<Exit, String> {
    let clock = MonotonicClock::new();
    // Live connections whose fds the idle wait sleeps on: (frontend id or
    // u32::MAX for the scheduler, fd). A dead connection's fd stays
    // readable for ever, so it leaves the set as soon as it is known dead.
    let mut watched: Vec<(u32, std::os::fd::RawFd, u64)> = Vec::with_capacity(16);
    let mut liveness = control::Liveness::new(clock.now(), s.heartbeat, s.dead_after);
    let mut hb = [0u8; 64];
    let mut published = WorkerStats::default();
    let mut st = Loop {
        draining: None,
        pending: Vec::with_capacity(8),
        seen_heard: Instant::ZERO,
        installed: Vec::with_capacity(16),
        generation: 0,
    };
    loop {
        let now = clock.now();
        let mut progressed = match worker.poll(now) {
            Ok(p) => p,
            // The executor refused a batch the worker checked: a bug, and
            // the batch would be refused again on every pass.
            Err(WorkerError::Executor(e)) => return Err(format!("executor: {e}")),
            Err(e) => {
                if st.draining.is_none() {
                    match e {
                        WorkerError::SchedulerGone => {
                            eprintln!("symphony-backend[{}]: scheduler disconnected", s.id)
                        }
                        // A malformed message or a broken connection: the
                        // scheduler is the only source of plans, so the
                        // backend leaves (the scheduler fails its batches).
                        e => eprintln!("symphony-backend[{}]: scheduler connection: {e}", s.id),
                    }
                    begin_drain(worker, &mut st, Exit::SchedulerGone);
                    true
                } else {
                    // Draining without a scheduler: every poll reports it
                    // gone; that is not progress (the loop must not spin).
                    false
                }
            }
        };
        // Any message is proof of life; a worker that reads nothing (every
        // batch buffer held) cannot judge the scheduler's silence.
        if worker.scheduler_heard_at() != st.seen_heard {
            st.seen_heard = worker.scheduler_heard_at();
            liveness.heard(st.seen_heard);
        }
        if worker.scheduler_backlogged() {
            liveness.heard(now);
        }
        while let Some(msg) = worker.pop_control() {
            progressed = true;
            handle_control(msg, s, metrics, &st, &connector.requests);
        }
        while let Ok((fid, opened)) = connector.opened.try_recv() {
            progressed = true;
            match opened {
                Ok(conn) if st.draining.is_none() => {
                    st.pending.push((
                        fid,
                        conn,
                        std::time::Instant::now() + std_dur(REPLACE_TIMEOUT),
                    ));
                }
                Ok(_) => {}
                Err(e) => {
                    metrics
                        .frontend_connect_failures
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    eprintln!("symphony-backend[{}]: {e}", s.id);
                }
            }
        }
        if !st.pending.is_empty() {
            progressed |= install_pending(worker, &mut st, s, metrics);
        }
        // Heartbeats continue while finishing the batches in hand after a
        // stop, so that the scheduler does not fail them back meanwhile.
        if let Some(n) = liveness.due(now, Role::Backend, s.id, &mut hb) {
            // A full send queue skips this beat: the next one follows.
            let sent = worker.scheduler().send(&hb[..n]);
            if st.draining.is_none() && matches!(sent, Err(Error::PeerDisconnected)) {
                eprintln!("symphony-backend[{}]: scheduler disconnected", s.id);
                begin_drain(worker, &mut st, Exit::SchedulerGone);
            }
        }
        if st.draining.is_none() {
            if liveness.expired(now) {
                eprintln!(
                    "symphony-backend[{}]: scheduler silent for more than {} ms",
                    s.id,
                    s.dead_after.as_nanos() / 1_000_000
                );
                begin_drain(worker, &mut st, Exit::SchedulerGone);
            } else if stop() {
                eprintln!(
                    "symphony-backend[{}]: stop requested; finishing {} batches in hand",
                    s.id,
                    worker.batches_in_flight()
                );
                begin_drain(worker, &mut st, Exit::Stopped);
            }
        }
        while let Some(r) = worker.pop_report() {
            metrics.record_batch(&r);
        }
        let stats = worker.stats();
        if stats != published {
            metrics.store_stats(&stats);
            published = stats;
        }
        if let Some((_, deadline)) = &st.draining {
            let in_hand = worker.batches_in_flight();
            if in_hand == 0 || std::time::Instant::now() >= *deadline {
                if in_hand > 0 {
                    eprintln!(
                        "symphony-backend[{}]: {in_hand} batches still in hand after {} ms; leaving them",
                        s.id,
                        DRAIN_TIMEOUT.as_nanos() / 1_000_000
                    );
                }
                if let Some((why, _)) = st.draining.take() {
                    return Ok(why);
                }
            }
        }
        if progressed {
            idler.reset();
        } else {
            let mut wake = liveness.next_send();
            if let Some(w) = worker.next_wakeup() {
                wake = wake.min(w);
            }
            if let Some((_, deadline)) = &st.draining {
                // Bounded: the drain deadline is checked on the next pass.
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                wake = wake.min(now + Duration::from_nanos(left.as_nanos() as u64));
            }
            sync_watched(worker, &st.installed, &mut watched, idler);
            idler.idle(wake.saturating_since(now));
        }
    }
}

/// Makes the wait set hold exactly the live connections' fds.
fn sync_watched<C: Connection, E: Executor>(
    worker: &mut BatchWorker<C, E>,
    frontends: &[(u32, u64)],
    watched: &mut Vec<(u32, std::os::fd::RawFd, u64)>,
    idler: &mut IdleWait,
) {
    let live = |worker: &mut BatchWorker<C, E>, who: u32| -> Option<std::os::fd::RawFd> {
        let c = if who == u32::MAX {
            Some(worker.scheduler())
        } else {
            worker.frontend(who)
        }?;
        if c.is_connected() {
            c.wait_fd()
        } else {
            None
        }
    };
    let generation = |who: u32| -> u64 {
        frontends
            .iter()
            .find(|&&(f, _)| f == who)
            .map_or(0, |&(_, g)| g)
    };
    watched.retain(|&(who, fd, g)| {
        let keep = g == generation(who) && live(worker, who) == Some(fd);
        if !keep {
            idler.set().remove(fd);
        }
        keep
    });
    for who in std::iter::once(u32::MAX).chain(frontends.iter().map(|&(f, _)| f)) {
        if watched.iter().any(|&(w, _, _)| w == who) {
            continue;
        }
        if let Some(fd) = live(worker, who) {
            if idler.set().add(fd).is_ok() {
                watched.push((who, fd, generation(who)));
            }
        }
    }
}

fn std_dur(d: Duration) -> std::time::Duration {
    std::time::Duration::from_nanos(d.as_nanos())
}

fn begin_drain<C: Connection, E: Executor>(
    worker: &mut BatchWorker<C, E>,
    st: &mut Loop<C>,
    why: Exit,
) {
    worker.set_taking_plans(false);
    st.pending.clear();
    st.draining = Some((why, std::time::Instant::now() + std_dur(DRAIN_TIMEOUT)));
}

fn handle_control<C>(
    msg: ControlMessage,
    s: &Settings,
    metrics: &BackendMetrics,
    st: &Loop<C>,
    connect_tx: &ConnectRequests,
) {
    match msg {
        ControlMessage::Heartbeat(_) => {
            metrics
                .scheduler_heartbeats
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        ControlMessage::Register(r) if r.role() == Some(Role::Frontend) => {
            if st.draining.is_some() {
                return;
            }
            if r.id >= config::MAX_FRONTENDS {
                eprintln!(
                    "symphony-backend[{}]: ignoring frontend {} (ids must be < {})",
                    s.id,
                    r.id,
                    config::MAX_FRONTENDS
                );
                return;
            }
            eprintln!(
                "symphony-backend[{}]: frontend {} announced at '{}'; connecting",
                s.id,
                r.id,
                r.endpoint()
            );
            // The connector thread outlives the loop, so a send only fails
            // if it died; the frontend's tasks then fail as unreachable.
            let _ = connect_tx.send((r.id, r.endpoint().to_string()));
        }
        ControlMessage::Register(r) => {
            eprintln!(
                "symphony-backend[{}]: ignoring a registration of role {} from the scheduler",
                s.id, r.role
            );
        }
    }
}

/// Adds the connections the connector opened, once the frontend's previous
/// connection (if any) has no READs outstanding (its READs would be lost
/// with it) or waited long enough. Returns whether any was added.
fn install_pending<C: Connection, E: Executor>(
    worker: &mut BatchWorker<C, E>,
    st: &mut Loop<C>,
    s: &Settings,
    metrics: &BackendMetrics,
) -> bool {
    let mut added = false;
    let mut k = 0;
    while k < st.pending.len() {
        let fid = st.pending[k].0;
        let busy = worker
            .frontend(fid)
            .is_some_and(|c| c.outstanding_reads() > 0);
        if busy && std::time::Instant::now() < st.pending[k].2 {
            k += 1;
            continue;
        }
        let (fid, conn, _) = st.pending.swap_remove(k);
        match worker.add_frontend(fid, conn) {
            Ok(old) => {
                st.generation += 1;
                st.installed.retain(|&(f, _)| f != fid);
                st.installed.push((fid, st.generation));
                metrics
                    .frontends_connected
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                eprintln!(
                    "symphony-backend[{}]: data connection to frontend {fid} open{}",
                    s.id,
                    if old.is_some() {
                        " (replaced the previous one)"
                    } else {
                        ""
                    }
                );
                added = true;
            }
            Err(e) => eprintln!("symphony-backend[{}]: frontend {fid}: {e}", s.id),
        }
    }
    added
}
