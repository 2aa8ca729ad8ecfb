//! The `symphony-backend` binary against a fake scheduler and a fake
//! frontend written here, over real shm and tcp: registration and Models,
//! the frontend announcement and the data connection (Register first), a
//! plan's completions with the reference output, BatchDone, heartbeats,
//! metrics, and every way the process ends (scheduler disconnect or
//! silence, SIGTERM, refused registration, bad configuration).
//!
//! Every wait has a deadline; ports and shm names are ephemeral.

mod common;
#[path = "../../tests/lib/require.rs"]
mod require;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

use backend::output::expected_output;
use common::{Net, Rng, Shm, Tcp, TIMEOUT};
use dataplane::control::{
    expect_register, http_get, metric, recv_within, send_register, send_within,
};
use dataplane::mem::{Access, Region};
use dataplane::time::Duration;
use dataplane::transport::tcp::TcpDomain;
use dataplane::transport::{Connection, Domain, Listener, Registration};
use dataplane::wire::{self, BatchPlanHead, BatchTask, Message, Register, Role, TaskStatus};

const BIN: &str = env!("CARGO_BIN_EXE_symphony-backend");
/// Output bytes of every model (the daemon's default, FP32 [1,10]).
const OUT: usize = 40;
/// Input slot (the daemon's default, FP32 [1,16]).
const IN: usize = 64;

fn dp(d: std::time::Duration) -> Duration {
    Duration::from_nanos(d.as_nanos() as u64)
}

/// The `--transport` name matching the test's domain.
fn transport_name<N: Net>(net: N) -> &'static str {
    match net.name() {
        "shm" => "shm",
        _ if TcpDomain::uring().is_ok() => "tcp",
        _ => "tcp-blocking",
    }
}

/// A running `symphony-backend`.
struct Proc {
    child: Child,
    ready: mpsc::Receiver<String>,
    stderr: Arc<Mutex<String>>,
    stderr_thread: Option<JoinHandle<()>>,
}

impl Proc {
    fn spawn(args: &[&str]) -> Proc {
        Proc::spawn_env(args, &[])
    }

    /// As `spawn`, with extra environment variables.
    fn spawn_env(args: &[&str], env: &[(&str, &str)]) -> Proc {
        let mut child = Command::new(BIN)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .env_remove(dataplane::join::TOKEN_ENV)
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn symphony-backend");
        let out = child.stdout.take().unwrap();
        let (tx, ready) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut err = child.stderr.take().unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        let stderr_thread = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let text = String::from_utf8_lossy(&buf[..n]);
                eprint!("{text}");
                sink.lock().unwrap().push_str(&text);
            }
        });
        Proc {
            child,
            ready,
            stderr,
            stderr_thread: Some(stderr_thread),
        }
    }

    /// The READY line's `key=value` pairs.
    fn ready(&self) -> Vec<(String, String)> {
        let line = self.ready.recv_timeout(TIMEOUT).expect("READY line");
        assert!(line.starts_with("READY "), "first stdout line: {line}");
        line[6..]
            .split_whitespace()
            .map(|kv| {
                let (k, v) = kv.split_once('=').expect("key=value");
                (k.to_string(), v.to_string())
            })
            .collect()
    }

    /// Waits (bounded) for the process to end.
    fn wait(&mut self, timeout: std::time::Duration) -> ExitStatus {
        let until = std::time::Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                if let Some(t) = self.stderr_thread.take() {
                    let _ = t.join();
                }
                return st;
            }
            if std::time::Instant::now() >= until {
                let _ = self.child.kill();
                panic!("symphony-backend did not exit within {timeout:?}");
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits (bounded) until the log contains `needle`; the process must
    /// still be running then.
    fn until_logged(&mut self, needle: &str) {
        let until = std::time::Instant::now() + TIMEOUT;
        while !self.stderr().contains(needle) {
            assert!(std::time::Instant::now() < until, "never logged {needle:?}: {}", self.stderr());
            assert!(self.child.try_wait().expect("try_wait").is_none(), "exited: {}", self.stderr());
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
        assert_eq!(rc, 0, "kill");
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A completion as the fake frontend got it.
#[derive(Clone, Debug)]
struct Got {
    task_id: u64,
    status: u32,
    output: Vec<u8>,
}

/// A fake frontend: staged inputs in a readable region, a data listener
/// that expects `Register{Backend}` first, then serves READs and collects
/// completions until stopped.
struct FakeFrontend {
    id: u32,
    addr: String,
    reg: Registration,
    inputs: Vec<Vec<u8>>,
    registered: mpsc::Receiver<Register>,
    got: Arc<Mutex<Vec<Got>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    _region: Arc<Region>,
}

impl FakeFrontend {
    fn start<N: Net>(net: N, id: u32, n: usize, seed: u64) -> FakeFrontend {
        let dom = net.domain();
        let region = net.region(n * IN);
        let mut rng = Rng::new(seed);
        let inputs: Vec<Vec<u8>> = (0..n)
            .map(|k| {
                let len = 1 + rng.next() as usize % IN;
                let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                region.write_at((k * IN) as u64, &bytes).unwrap();
                bytes
            })
            .collect();
        let reg = dom.register(&region, Access::REMOTE_READ).unwrap();
        let mut listener = dom.listen("").unwrap();
        let addr = listener.local_addr();
        let (reg_tx, registered) = mpsc::channel();
        let got = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (got2, stop2) = (got.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let _keep = dom;
            let mut conn = listener.accept(dp(TIMEOUT)).expect("frontend accept");
            let r = expect_register(&mut conn, dp(TIMEOUT))
                .expect("Register first on the data connection");
            conn.allow_remote_reads();
            let _ = reg_tx.send(r);
            let mut buf = vec![0u8; wire::MAX_MESSAGE_LEN];
            let deadline = std::time::Instant::now() + TIMEOUT * 3;
            while !stop2.load(Ordering::Acquire) && std::time::Instant::now() < deadline {
                loop {
                    match conn.try_recv(&mut buf) {
                        Ok(Some(n)) => match wire::decode(&buf[..n]) {
                            Ok(Message::Completion(h, inline)) => got2.lock().unwrap().push(Got {
                                task_id: h.task_id,
                                status: h.status,
                                output: inline.to_vec(),
                            }),
                            other => panic!("frontend got {other:?}"),
                        },
                        Ok(None) => break,
                        Err(_) => return,
                    }
                }
                match conn.wait(Duration::from_millis(2)) {
                    Ok(true) => {}
                    Ok(false) => std::thread::sleep(std::time::Duration::from_micros(100)),
                    Err(_) => return,
                }
            }
        });
        FakeFrontend {
            id,
            addr,
            reg,
            inputs,
            registered,
            got,
            stop,
            thread: Some(thread),
            _region: region,
        }
    }

    fn task(&self, k: usize) -> BatchTask {
        BatchTask {
            task_id: (u64::from(self.id) << 32) | k as u64,
            frontend_id: self.id,
            queued_us: 0,
            input: self
                .reg
                .remote_ref((k * IN) as u64, self.inputs[k].len() as u32)
                .unwrap(),
            capability: Default::default(),
        }
    }

    fn wait_completions(&self, n: usize) -> Vec<Got> {
        let until = std::time::Instant::now() + TIMEOUT;
        loop {
            let got = self.got.lock().unwrap().clone();
            if got.len() >= n {
                return got;
            }
            assert!(
                std::time::Instant::now() < until,
                "{} of {n} completions",
                got.len()
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

impl Drop for FakeFrontend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The scheduler's side: its listener (before the backend starts) and,
/// once accepted, the connection.
struct FakeScheduler<D: Domain> {
    _dom: D,
    listener: D::Listener,
    conn: Option<D::Conn>,
    buf: Vec<u8>,
    heartbeats: u64,
    hb_seq: u64,
    next_hb: std::time::Instant,
}

impl<D: Domain> FakeScheduler<D> {
    fn listen(dom: D) -> Self {
        let listener = dom.listen("").unwrap();
        FakeScheduler {
            _dom: dom,
            listener,
            conn: None,
            buf: vec![0; wire::MAX_MESSAGE_LEN],
            heartbeats: 0,
            hb_seq: 0,
            next_hb: std::time::Instant::now(),
        }
    }

    fn addr(&self) -> String {
        self.listener.local_addr()
    }

    fn conn(&mut self) -> &mut D::Conn {
        self.conn.as_mut().expect("accepted")
    }

    /// Accepts the backend, challenges it; returns its Join and model ids.
    fn accept(&mut self) -> (wire::Join, Vec<u32>) {
        let mut c = self.listener.accept(dp(TIMEOUT)).expect("scheduler accept");
        let n = wire::encode(&mut self.buf, &wire::Challenge::new([7; wire::NONCE_LEN], false)).unwrap();
        send_within(&mut c, &self.buf[..n], dp(TIMEOUT)).expect("send the challenge");
        let n = recv_within(&mut c, &mut self.buf, dp(TIMEOUT)).expect("Join");
        let r = match wire::decode(&self.buf[..n]) {
            Ok(Message::Join(j)) => j,
            other => panic!("expected Join, got {other:?}"),
        };
        let n = recv_within(&mut c, &mut self.buf, dp(TIMEOUT)).expect("Models");
        let ids = match wire::decode(&self.buf[..n]) {
            Ok(Message::Models(ids, _)) => ids.iter().collect(),
            other => panic!("expected Models, got {other:?}"),
        };
        self.conn = Some(c);
        (r, ids)
    }

    fn send(&mut self, msg: &[u8]) {
        send_within(self.conn(), msg, dp(TIMEOUT)).expect("scheduler send");
    }

    fn send_register(&mut self, r: &Register) {
        send_register(self.conn(), r, dp(TIMEOUT)).expect("scheduler send Register");
    }

    /// Acknowledges the registration: `models` models, control delay 0.
    fn welcome(&mut self, models: u32) -> Result<(), dataplane::transport::Error> {
        self.welcome_with(models, 0)
    }

    /// Acknowledges the registration announcing a control delay bound.
    fn welcome_with(&mut self, models: u32, control_delay_ns: u64) -> Result<(), dataplane::transport::Error> {
        let w = wire::Welcome::new(models, 0, control_delay_ns);
        let n = wire::encode(&mut self.buf, &w).unwrap();
        let msg = self.buf[..n].to_vec();
        send_within(self.conn(), &msg, dp(TIMEOUT))
    }

    /// Sends our heartbeat when due (the backend must hear us).
    fn beat(&mut self) {
        if std::time::Instant::now() < self.next_hb {
            return;
        }
        self.next_hb = std::time::Instant::now() + std::time::Duration::from_millis(50);
        self.hb_seq += 1;
        let hb = wire::Heartbeat {
            seq: self.hb_seq,
            role: Role::Scheduler as u32,
            id: 0,
        };
        let mut b = [0u8; 64];
        let n = wire::encode(&mut b, &hb).unwrap();
        self.send(&b[..n]);
    }

    /// Receives (heartbeating meanwhile) until a BatchDone arrives.
    fn until_batch_done(&mut self, backend_id: u32) -> wire::BatchDone {
        let until = std::time::Instant::now() + TIMEOUT;
        loop {
            self.beat();
            let c = self.conn.as_mut().unwrap();
            match c.try_recv(&mut self.buf) {
                Ok(Some(n)) => match wire::decode(&self.buf[..n]) {
                    Ok(Message::BatchDone(d)) => return d,
                    Ok(Message::Heartbeat(h)) => {
                        assert_eq!((h.role, h.id), (Role::Backend as u32, backend_id));
                        self.heartbeats += 1;
                    }
                    other => panic!("scheduler got {other:?}"),
                },
                Ok(None) => {
                    let _ = c.wait(Duration::from_millis(2));
                }
                Err(e) => panic!("scheduler recv: {e}"),
            }
            assert!(std::time::Instant::now() < until, "no BatchDone");
        }
    }

    /// Heartbeats until `n` of the backend's heartbeats were counted.
    fn until_heartbeats(&mut self, n: u64) {
        let until = std::time::Instant::now() + TIMEOUT;
        while self.heartbeats < n {
            self.beat();
            let c = self.conn.as_mut().unwrap();
            match c.try_recv(&mut self.buf) {
                Ok(Some(k)) => {
                    if let Ok(Message::Heartbeat(_)) = wire::decode(&self.buf[..k]) {
                        self.heartbeats += 1;
                    }
                }
                Ok(None) => {
                    let _ = c.wait(Duration::from_millis(2));
                }
                Err(e) => panic!("scheduler recv: {e}"),
            }
            assert!(std::time::Instant::now() < until, "heartbeats missing");
        }
    }
}

fn scrape(metrics: &str) -> String {
    http_get(metrics.parse().unwrap(), "/metrics", TIMEOUT).expect("scrape /metrics")
}

/// Scrapes until `name` reaches `want` (the poll thread publishes right
/// after the batch, possibly just after the scheduler saw its BatchDone).
fn wait_metric(metrics: &str, name: &str, want: f64) -> String {
    let until = std::time::Instant::now() + TIMEOUT;
    loop {
        let text = scrape(metrics);
        if metric(&text, name) == Some(want) {
            return text;
        }
        assert!(
            std::time::Instant::now() < until,
            "{name} = {:?}, want {want}\n{text}",
            metric(&text, name)
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

const MODELS: [&str; 6] = [
    "--models",
    "none",
    "--model",
    "small=0.2,1,50",
    "--model",
    "big=0.1,2,50",
];

/// Registration, the frontend announcement, one plan end to end, metrics,
/// heartbeats, then the scheduler disconnects and the process exits 1.
fn serves_a_plan_and_outlives_the_scheduler<N: Net>(net: N, seed: u64) {
    let mut sched = FakeScheduler::listen(net.domain());
    let fe = FakeFrontend::start(net, 3, 16, seed);
    let addr = sched.addr();
    let mut args = vec![
        "--scheduler",
        &addr,
        "--transport",
        transport_name(net),
        "--id",
        "5",
        "--gpus-per-backend",
        "2",
        "--heartbeat-ms",
        "20",
        "--dead-after-ms",
        "20000",
        "--exit-with-parent",
    ];
    args.extend(MODELS);
    let mut p = Proc::spawn(&args);
    let (r, ids) = sched.accept();
    assert_eq!(
        (r.role(), r.id, r.count, r.endpoint()),
        (Some(Role::Backend), 5, 2, "")
    );
    assert_eq!(ids, vec![0, 1]);
    sched.welcome(2).expect("send the Welcome");
    let ready = p.ready();
    assert_eq!(ready[1], ("gpus".to_string(), "2".to_string()));
    assert_eq!(ready[0].0, "metrics");
    let metrics = ready[0].1.clone();

    sched.send_register(&Register::new(Role::Frontend, fe.id, 0, &fe.addr));
    let data_reg = fe
        .registered
        .recv_timeout(TIMEOUT)
        .expect("backend connected to the frontend");
    assert_eq!(
        (data_reg.role(), data_reg.id, data_reg.count),
        (Some(Role::Backend), 5, 2)
    );
    // The frontend is installed by the backend's poll loop right after the
    // handshake; scraping for it orders the plan after that.
    wait_metric(&metrics, "symphony_backend_frontend_connections_total", 1.0);

    let tasks: Vec<BatchTask> = (0..8).map(|k| fe.task(k)).collect();
    let head = BatchPlanHead {
        batch_id: 42,
        exec_in_ns: Duration::from_millis(2).as_nanos(),
        model_id: 1,
        gpu_id: 1,
        count: 0,
        run_ns: 0,
            epoch: 0,
    };
    let mut b = vec![0u8; wire::MAX_MESSAGE_LEN];
    let n = wire::encode_batch_plan(&mut b, &head, &tasks).unwrap();
    sched.send(&b[..n]);
    let done = sched.until_batch_done(5);
    assert_eq!((done.batch_id, done.gpu_id, done.count), (42, 1, 8));
    // l(8) of "big" = 0.1 * 8 + 2 ms, exactly (emulated).
    assert_eq!(done.actual_ns(), Duration::from_micros(2_800).as_nanos());
    let mut got = fe.wait_completions(8);
    got.sort_by_key(|g| g.task_id);
    for (k, g) in got.iter().enumerate() {
        assert_eq!(g.task_id, tasks[k].task_id);
        assert_eq!(g.status, TaskStatus::Ok as u32);
        let mut want = vec![0u8; OUT];
        expected_output(1, &fe.inputs[k], &mut want);
        assert_eq!(g.output, want, "task {k}: reference output");
    }
    sched.until_heartbeats(3);

    let text = wait_metric(&metrics, "symphony_backend_tasks_ok_total", 8.0);
    assert_eq!(
        metric(&text, "symphony_backend_batches_executed_total"),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &text,
            "nv_inference_exec_count{model=\"big\",version=\"1\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &text,
            "nv_inference_exec_count{model=\"small\",version=\"1\"}"
        ),
        Some(0.0)
    );
    assert_eq!(
        metric(&text, "symphony_batch_size_bucket{le=\"8.0\"}"),
        Some(1.0)
    );
    assert_eq!(
        metric(&text, "symphony_backend_read_failures_total"),
        Some(0.0)
    );
    assert!(metric(&text, "nv_gpu_utilization{gpu=\"1\"}").unwrap() > 0.0);
    assert_eq!(metric(&text, "nv_gpu_utilization{gpu=\"0\"}"), Some(0.0));
    assert!(metric(&text, "symphony_backend_scheduler_heartbeats_total").unwrap() >= 1.0);

    sched.conn = None; // the scheduler goes away: the backend outlives it
    p.until_logged("reconnecting");
    p.signal(libc::SIGTERM);
    let st = p.wait(TIMEOUT);
    assert_eq!(st.code(), Some(0), "exit status {st:?}: {}", p.stderr());
}

#[test]
fn shm_serves_a_plan_and_outlives_the_scheduler() {
    serves_a_plan_and_outlives_the_scheduler(Shm, 0x5eed_0001);
}

#[test]
fn tcp_serves_a_plan_and_outlives_the_scheduler() {
    serves_a_plan_and_outlives_the_scheduler(Tcp, 0x5eed_0002);
}

/// Starts a backend and takes its registration without answering yet.
fn joined(extra: &[&str]) -> (Proc, FakeScheduler<<Shm as Net>::D>) {
    let mut sched = FakeScheduler::listen(Shm.domain());
    let addr = sched.addr();
    let mut args = vec!["--scheduler", &addr, "--transport", transport_name(Shm)];
    args.extend(MODELS);
    args.extend(extra);
    let p = Proc::spawn(&args);
    let _ = sched.accept();
    (p, sched)
}

/// Starts a backend and acknowledges it with `ack_models` models.
fn started<N: Net>(net: N, extra: &[&str], ack_models: Option<u32>) -> (Proc, FakeScheduler<N::D>) {
    let mut sched = FakeScheduler::listen(net.domain());
    let addr = sched.addr();
    let mut args = vec!["--scheduler", &addr, "--transport", transport_name(net)];
    args.extend(MODELS);
    args.extend(extra);
    let p = Proc::spawn(&args);
    let _ = sched.accept();
    match ack_models {
        // A backend that refuses the ack may be gone before the flush.
        Some(n) => {
            let _ = sched.welcome(n);
        }
        None => sched.conn = None,
    }
    (p, sched)
}

#[test]
fn sigterm_finishes_and_exits_zero() {
    let (mut p, mut sched) = started(
        Shm,
        &["--heartbeat-ms", "20", "--dead-after-ms", "20000"],
        Some(2),
    );
    let _ = p.ready();
    sched.until_heartbeats(1);
    p.signal(libc::SIGTERM);
    let st = p.wait(TIMEOUT);
    assert_eq!(st.code(), Some(0), "{}", p.stderr());
    assert!(p.stderr().contains("stop requested"));
}

#[test]
fn a_silent_scheduler_is_declared_dead_and_the_backend_stays_up() {
    // The fake scheduler acknowledges and then never speaks.
    let (mut p, _sched) = started(
        Tcp,
        &["--heartbeat-ms", "20", "--dead-after-ms", "300"],
        Some(2),
    );
    let _ = p.ready();
    let t0 = std::time::Instant::now();
    p.until_logged("silent");
    assert!(
        t0.elapsed() >= std::time::Duration::from_millis(250),
        "{:?}",
        t0.elapsed()
    );
    p.signal(libc::SIGTERM);
    assert_eq!(p.wait(TIMEOUT).code(), Some(0), "{}", p.stderr());
}

#[test]
fn a_refused_registration_exits_nonzero_with_a_reason() {
    let (mut p, _sched) = started(Shm, &[], None);
    let st = p.wait(TIMEOUT);
    assert_eq!(st.code(), Some(1));
    assert!(p.stderr().contains("refused"), "{}", p.stderr());
}

#[test]
fn the_announced_control_delay_is_used_unless_overridden_and_the_log_says_which() {
    for (extra, want) in [
        (&[][..], "control delay bound 300 µs (announced by the scheduler)"),
        (&["--control-delay-us", "50"][..], "control delay bound 50 µs (--control-delay-us override; the scheduler announced 300 µs)"),
    ] {
        let (mut p, mut sched) = joined(extra);
        sched.welcome_with(2, 300_000).expect("send the Welcome");
        let _ = p.ready();
        p.signal(libc::SIGINT);
        assert_eq!(p.wait(TIMEOUT).code(), Some(0));
        assert!(p.stderr().contains(want), "{}", p.stderr());
    }
}

#[test]
fn a_refusal_is_logged_with_its_reason_and_both_versions() {
    let (mut p, mut sched) = joined(&[]);
    let r = wire::Refused::new(wire::RefuseReason::Version, 9, "it speaks wire version 9");
    let n = wire::encode(&mut sched.buf, &r).unwrap();
    let msg = sched.buf[..n].to_vec();
    sched.send(&msg);
    assert_eq!(p.wait(TIMEOUT).code(), Some(1));
    let want = format!("refused the registration of backend 0: version (scheduler wire version {}, ours 9)", wire::VERSION);
    assert!(p.stderr().contains(&want), "{}", p.stderr());
}

#[test]
fn a_model_list_mismatch_exits_nonzero_with_a_reason() {
    let (mut p, _sched) = started(Shm, &[], Some(37));
    let st = p.wait(TIMEOUT);
    assert_eq!(st.code(), Some(1));
    assert!(p.stderr().contains("model list mismatch"), "{}", p.stderr());
}

fn fails_with(args: &[&str], code: i32, want: &str) {
    let mut p = Proc::spawn(args);
    let st = p.wait(TIMEOUT);
    assert_eq!(st.code(), Some(code), "{args:?}: {}", p.stderr());
    assert!(
        p.stderr().contains(want),
        "{args:?}: '{}' lacks '{want}'",
        p.stderr()
    );
    assert!(p.ready.try_recv().is_err(), "no READY on failure");
}

#[test]
fn bad_configuration_is_a_clear_error_and_nonzero_exit() {
    fails_with(&["--model", "a=1,2,50"], 2, "--scheduler is required");
    fails_with(&["--scheduler", "x", "--models", "none"], 2, "no models");
    fails_with(
        &["--scheduler", "x", "--model", "a=1,2"],
        2,
        "missing slo_ms",
    );
    fails_with(
        &["--scheduler", "x", "--zoo", "a100", "--models", "NoSuchNet"],
        2,
        "no model named",
    );
    fails_with(
        &["--scheduler", "x", "--model", "a=1,2,50", "--idle", "nap"],
        2,
        "unknown idle",
    );
    fails_with(
        &["--scheduler", "x", "--model", "a=1,2,50", "--gpus-per-backend", "0"],
        2,
        "--gpus-per-backend",
    );
    fails_with(&["--scheduler", "x", "--bogus"], 2, "--bogus");
    fails_with(
        &["--config", "/nonexistent/backend.toml"],
        2,
        "cannot read the config file",
    );
    let dir = std::env::temp_dir();
    let path = dir.join(format!("symphony-backend-test-{}.toml", std::process::id()));
    std::fs::write(&path, "scheduler = \"x\"\ngpu = 2\n").unwrap();
    let p = path.to_str().unwrap().to_string();
    fails_with(&["--config", &p], 2, "unknown key `gpu`");
    std::fs::write(&path, "scheduler = \"127.0.0.1:1\"\nmodel = [\"a=1,2,50\"]\ntransport = \"tcp-blocking\"\nconnect_timeout_ms = 200\n").unwrap();
    fails_with(&["--config", &p], 1, "cannot reach the scheduler");
    std::fs::remove_file(&path).unwrap();
}

/// `symphony-backend --executor cuda` against an unreachable scheduler.
const CUDA_ARGS: &[&str] = &[
    "--scheduler",
    "127.0.0.1:1",
    "--connect-timeout-ms",
    "200",
    "--model",
    "a=1,2,50",
    "--gpus-per-backend",
    "1",
    "--executor",
    "cuda",
];

/// The CUDA executor is built before anything connects: where its libraries
/// are not (here: the search is pointed at an empty folder, so this runs
/// the same on a host with a GPU), it says what is missing and where it
/// looked; a build without the feature says so.
#[test]
fn cuda_executor_without_its_libraries_names_what_is_missing() {
    let empty = std::env::temp_dir().join(format!("symphony-nocuda-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let dir = empty.to_str().unwrap();
    let want = if cfg!(feature = "cuda") {
        "no CUDA driver library (libcuda: libcuda.so.1 or libcuda.so); no NVRTC library"
    } else {
        "built without CUDA support"
    };
    let mut p = Proc::spawn_env(CUDA_ARGS, &[("SYMPHONY_CUDA_LIB_DIRS", dir)]);
    let st = p.wait(TIMEOUT);
    assert_eq!(st.code(), Some(1), "{}", p.stderr());
    assert!(p.stderr().contains(want), "'{}' lacks '{want}'", p.stderr());
    if cfg!(feature = "cuda") {
        assert!(p.stderr().contains(dir), "the folder searched is named: {}", p.stderr());
    }
    std::fs::remove_dir_all(&empty).unwrap();
}

/// On a host with a GPU the executor initialises (libraries, context,
/// NVRTC kernel, page-locked staging) and the daemon fails only at the
/// unreachable scheduler, which it reaches after that. A capability skip
/// without a GPU (tests/capability-skips.txt).
#[test]
fn cuda_executor_on_a_gpu_initialises_before_it_needs_the_scheduler() {
    #[cfg(feature = "cuda")]
    let gpu = backend::exec::cuda::gpu_present();
    #[cfg(not(feature = "cuda"))]
    let gpu = false;
    if !require::capability(
        "gpu",
        gpu,
        "no GPU with its CUDA 12/13 driver and NVRTC here (or a build without the cuda feature)",
    ) {
        return;
    }
    fails_with(CUDA_ARGS, 1, "cannot reach the scheduler");
}

#[test]
fn help_exits_zero() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--scheduler",
        "--gpus-per-backend",
        "--serve",
        "--executor",
        "--input-bytes",
        "--control-delay-us",
    ] {
        assert!(text.contains(flag), "help lacks {flag}");
    }
}

#[test]
fn frontend_connect_failure_is_counted_and_serving_continues() {
    let (mut p, mut sched) = started(
        Shm,
        &[
            "--heartbeat-ms",
            "20",
            "--dead-after-ms",
            "20000",
            "--connect-timeout-ms",
            "200",
        ],
        Some(2),
    );
    let metrics = p.ready()[0].1.clone();
    sched.send_register(&Register::new(
        Role::Frontend,
        9,
        0,
        "@no-such-symphony-frontend",
    ));
    wait_metric(
        &metrics,
        "symphony_backend_frontend_connect_failures_total",
        1.0,
    );
    sched.until_heartbeats(2);
    p.signal(libc::SIGINT);
    assert_eq!(p.wait(TIMEOUT).code(), Some(0));
}
