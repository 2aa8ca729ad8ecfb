//! The `symphony-frontend` binary against a fake scheduler and a fake
//! backend written here, over the real shm and tcp transports: the
//! registration handshake, an HTTP request that becomes a Task at the
//! scheduler, whose input the backend READs through its data connection
//! and answers with the reference output; a drop; a dead or refusing
//! scheduler; bad configurations; SIGTERM. Every wait is bounded.

#[path = "../../tests/lib/require.rs"]
mod require;

use dataplane::control::{self, TransportKind};
use dataplane::mem::Access;
use dataplane::time::Duration;
use dataplane::transport::shm::ShmDomain;
use dataplane::transport::tcp::{Engine, TcpConfig, TcpDomain};
use dataplane::transport::{Completion, Connection, Domain, Listener, ReadOp};
use dataplane::wire::{
    self, CompletionHead, Message, OutputKind, RefuseReason, Refused, Register, Role, Task,
    TaskStatus, Welcome,
};

/// The fake scheduler's Welcome for `models` models.
fn welcome(models: u32) -> Welcome {
    Welcome::new(models, 0, 0)
}
use frontend::loadgen::{verify, Verdict};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration as StdDuration, Instant as StdInstant};

const BIN: &str = env!("CARGO_BIN_EXE_symphony-frontend");
const WAIT: Duration = Duration::from_millis(10_000);

/// Kills the daemon if the test ends without it having exited.
struct Daemon {
    child: Child,
    stdout: mpsc::Receiver<String>,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Ready {
    http: SocketAddr,
    metrics: SocketAddr,
    data: String,
}

fn spawn(args: &[&str]) -> Daemon {
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_remove(dataplane::join::TOKEN_ENV)
        .spawn()
        .expect("start symphony-frontend");
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let err = child.stderr.take().unwrap();
    let sink = stderr.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            let mut s = sink.lock().unwrap();
            s.push_str(&line);
            s.push('\n');
        }
    });
    Daemon {
        child,
        stdout: rx,
        stderr,
    }
}

impl Daemon {
    fn ready(&self) -> Ready {
        let line = self
            .stdout
            .recv_timeout(StdDuration::from_secs(20))
            .unwrap_or_else(|_| panic!("no READY line; stderr: {}", self.stderr()));
        let field = |k: &str| {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(k))
                .unwrap_or_else(|| panic!("READY line without {k}: {line}"))
                .to_string()
        };
        assert!(line.starts_with("READY "), "{line}");
        Ready {
            http: field("http=").parse().unwrap(),
            metrics: field("metrics=").parse().unwrap(),
            data: field("data="),
        }
    }

    /// Waits (bounded) for the exit; returns the exit code.
    fn exit_code(&mut self, within: StdDuration) -> i32 {
        let until = StdInstant::now() + within;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s.code().unwrap_or(-1);
            }
            assert!(
                StdInstant::now() < until,
                "the daemon did not exit; stderr: {}",
                self.stderr()
            );
            std::thread::sleep(StdDuration::from_millis(10));
        }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Asserts that stderr comes to contain `want` (it is read by a
    /// thread, so the text may trail the exit; bounded wait).
    fn expect_stderr(&self, want: &str) {
        let until = StdInstant::now() + StdDuration::from_secs(5);
        while !self.stderr().contains(want) && StdInstant::now() < until {
            std::thread::sleep(StdDuration::from_millis(5));
        }
        assert!(
            self.stderr().contains(want),
            "want '{want}' in: {}",
            self.stderr()
        );
    }

    fn terminate(&self) {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok);
    }
}

/// Model 1's input: 16 FP32 values.
fn values(n: u32) -> Vec<f32> {
    (0..16).map(|i| (n * 16 + i) as f32 * 0.5 - 3.0).collect()
}

/// POSTs an infer request in a thread; the answer comes on the handle.
fn infer(
    http: SocketAddr,
    model: &str,
    id: &str,
    v: &[f32],
) -> std::thread::JoinHandle<(u16, Vec<u8>)> {
    let body = serde_json::to_vec(&serde_json::json!({"id": id,
        "inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": v}]}))
    .unwrap();
    let path = format!("/v2/models/{model}/infer");
    std::thread::spawn(move || {
        let mut s = std::net::TcpStream::connect(http).unwrap();
        s.set_read_timeout(Some(StdDuration::from_secs(20)))
            .unwrap();
        write!(s, "POST {path} HTTP/1.1\r\nhost: {http}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len()).unwrap();
        s.write_all(&body).unwrap();
        let mut resp = Vec::new();
        s.read_to_end(&mut resp).unwrap();
        let split = resp
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("response head");
        let head = String::from_utf8_lossy(&resp[..split]).to_string();
        let status: u16 = head.split_whitespace().nth(1).unwrap().parse().unwrap();
        (status, resp[split + 4..].to_vec())
    })
}

/// The next message of `conn` that `pick` accepts (heartbeats and the like
/// are skipped), within `WAIT`.
fn next<C: Connection, T>(conn: &mut C, mut pick: impl FnMut(&Message<'_>) -> Option<T>) -> T {
    let until = StdInstant::now() + StdDuration::from_nanos(WAIT.as_nanos());
    let mut buf = vec![0u8; wire::MAX_MESSAGE_LEN];
    loop {
        let left = until.saturating_duration_since(StdInstant::now());
        assert!(!left.is_zero(), "no expected message in time");
        let n = control::recv_within(conn, &mut buf, Duration::from_nanos(left.as_nanos() as u64))
            .expect("receive");
        if let Some(t) = pick(&wire::decode(&buf[..n]).expect("decode")) {
            return t;
        }
    }
}

fn next_task<C: Connection>(conn: &mut C) -> Task {
    next(conn, |m| match m {
        Message::Task(t) => Some(*t),
        _ => None,
    })
}

fn write_config(name: &str, text: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!(
        "symphony-frontend-{}-{name}.toml",
        std::process::id()
    ));
    std::fs::write(&p, text).unwrap();
    p
}

/// The cluster's model list given to the daemon: two extra models, ids 0 and 1.
const MODELS: &str =
    "zoo = \"a100\"\nmodels = \"none\"\nmodel = [\"m0=1,1,500\", \"m1=1,2,500\"]\nid = 1\n";

/// The whole round trip on one transport.
fn round_trip<D: Domain>(domain: D, kind: TransportKind) {
    let cfg = write_config(kind.name(), MODELS);
    let mut listener = domain.listen(&kind.ephemeral_listen("127.0.0.1")).unwrap();
    let sched_addr = listener.local_addr();
    let mut daemon = spawn(&[
        "--config",
        cfg.to_str().unwrap(),
        "--id",
        "3",
        "--scheduler",
        &sched_addr,
        "--transport",
        kind.name(),
        "--dead-after-ms",
        "60000",
    ]);

    // Registration: our challenge, its Join{Frontend, 3, 0, data endpoint},
    // our Welcome.
    let mut sched = listener.accept(WAIT).expect("the frontend connects");
    let reg = control::admit_peer(&mut sched, &welcome(2), WAIT).unwrap();
    assert_eq!(reg.role(), Some(Role::Frontend));
    assert_eq!((reg.id, reg.count, reg.has_mac()), (3, 0, false), "flags override the file's id");
    let ready = daemon.ready();
    assert_eq!(ready.data, reg.endpoint());
    assert!(control::http_get(ready.http, "/v2/health/ready", StdDuration::from_secs(5)).is_ok());

    // The fake backend's data connection.
    let mut data = control::connect_retrying(&domain, &ready.data, WAIT).unwrap();
    control::send_register(&mut data, &Register::new(Role::Backend, 9, 1, ""), WAIT).unwrap();
    let landing_region = kind.readable_region(4096).unwrap();
    let landing = domain
        .register(&landing_region, Access::LOCAL_WRITE)
        .unwrap();

    // A request: Task at the scheduler, READ by the backend, Completion.
    let v = values(1);
    let answer = infer(ready.http, "m1", "r-1", &v);
    let task = next_task(&mut sched);
    assert_eq!((task.model_id, task.frontend_id), (1, 3));
    assert_eq!(task.input.len, 64);
    assert!(task.budget_ns > 0 && task.budget_ns <= 500_000_000);
    let op = ReadOp {
        wr_id: 77,
        remote: task.input,
        local: landing.local_ref(0, task.input.len).unwrap(),
    };
    data.post_read(&op).expect("post the READ");
    let until = StdInstant::now() + StdDuration::from_secs(10);
    let mut done = [Completion::default(); 1];
    while data.poll_completions(&mut done).unwrap() == 0 {
        assert!(StdInstant::now() < until, "READ did not complete");
        std::thread::yield_now();
    }
    assert_eq!(done[0].wr_id, 77);
    assert_eq!(done[0].status, Ok(()));
    let mut input = vec![0u8; task.input.len as usize];
    landing_region.read_at(0, &mut input).unwrap();
    let sent: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    assert_eq!(input, sent, "the READ returns the staged input");
    let mut out = [0u8; 40];
    dataplane::reference::expected_output(task.model_id, &input, &mut out);
    let head = CompletionHead {
        task_id: task.task_id,
        status: TaskStatus::Ok as u32,
        output_kind: OutputKind::Inline as u32,
        ..CompletionHead::default()
    };
    let mut msg = vec![0u8; wire::MAX_MESSAGE_LEN];
    let n = wire::encode_completion(&mut msg, &head, &out).unwrap();
    control::send_within(&mut data, &msg[..n], WAIT).unwrap();
    let (status, body) = answer.join().unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(verify(&body, "r-1", 1, &v, 40), Verdict::Ok);
    assert_eq!(
        verify(&body, "r-2", 1, &v, 40),
        Verdict::WrongId,
        "the verifier catches a response for another request"
    );
    assert_eq!(verify(&body, "r-1", 0, &v, 40), Verdict::WrongOutput);

    // A drop from the scheduler is a 503.
    let answer = infer(ready.http, "m0", "r-2", &values(2));
    let task = next_task(&mut sched);
    assert_eq!(task.model_id, 0);
    let n = wire::encode(
        &mut msg,
        &wire::Dropped {
            task_id: task.task_id,
            reason: wire::DropReason::Overloaded as u32,
            reserved: 0,
        },
    )
    .unwrap();
    control::send_within(&mut sched, &msg[..n], WAIT).unwrap();
    let (status, body) = answer.join().unwrap();
    assert_eq!(status, 503, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("overloaded"));

    // The daemon's own accounting, on both metrics endpoints.
    for at in [ready.metrics, ready.http] {
        let text = control::http_get(at, "/metrics", StdDuration::from_secs(5)).unwrap();
        let m = |name: &str| control::metric(&text, name).unwrap_or(-1.0);
        assert_eq!(m("symphony_requests_accepted_total"), 2.0, "{text}");
        assert_eq!(m("symphony_requests_succeeded_total"), 1.0);
        assert_eq!(m("symphony_requests_dropped_total"), 1.0);
        assert_eq!(m("symphony_requests_failed_total"), 0.0);
        assert_eq!(m("symphony_frontend_ready"), 1.0);
        assert_eq!(m("symphony_frontend_backends"), 1.0);
        assert_eq!(m("symphony_frontend_tasks_sent_total"), 2.0);
        assert_eq!(m("symphony_frontend_task_messages_sent_total"), 2.0, "one request at a time: a Task each");
    }

    // The fake scheduler's heartbeats were never needed (--dead-after-ms
    // 60000), but the frontend sends its own.
    next(&mut sched, |m| match m {
        Message::Heartbeat(h) if h.role == Role::Frontend as u32 && h.id == 3 => Some(()),
        _ => None,
    });

    // SIGTERM: clean exit 0.
    daemon.terminate();
    assert_eq!(
        daemon.exit_code(StdDuration::from_secs(15)),
        0,
        "{}",
        daemon.stderr()
    );
    let _ = std::fs::remove_file(cfg);
}

#[test]
fn round_trip_over_shm() {
    round_trip(ShmDomain::new().unwrap(), TransportKind::Shm);
}

#[test]
fn round_trip_over_tcp() {
    // io_uring is the kernel's (any CI kernel has it): no capability skip.
    let uring = TcpDomain::new(TcpConfig::new(Engine::Uring));
    let why = match &uring {
        Ok(_) => String::new(),
        Err(e) => format!("the io_uring tcp engine: {e}"),
    };
    if let (true, Ok(d)) = (require::capability("io_uring", uring.is_ok(), &why), uring) {
        round_trip(d, TransportKind::Tcp);
    }
}

#[test]
fn round_trip_over_tcp_blocking() {
    round_trip(
        TcpDomain::new(TcpConfig::new(Engine::Blocking)).unwrap(),
        TransportKind::TcpBlocking,
    );
}

/// Starts a daemon on shm and completes the handshake.
fn registered(extra: &[&str]) -> (Daemon, ShmDomain, <ShmDomain as Domain>::Conn, Ready) {
    let (daemon, domain, _listener, sched, ready) = registered_on(extra);
    (daemon, domain, sched, ready)
}

/// [`registered`], keeping the scheduler's listener (where the frontend
/// reconnects).
fn registered_on(
    extra: &[&str],
) -> (Daemon, ShmDomain, <ShmDomain as Domain>::Listener, <ShmDomain as Domain>::Conn, Ready) {
    let domain = ShmDomain::new().unwrap();
    let mut listener = domain.listen("").unwrap();
    let addr = listener.local_addr();
    let mut args = vec![
        "--scheduler",
        &addr,
        "--models",
        "none",
        "--model",
        "m0=1,1,500",
    ];
    args.extend_from_slice(extra);
    let daemon = spawn(&args);
    let mut sched = listener.accept(WAIT).expect("the frontend connects");
    control::admit_peer(&mut sched, &welcome(1), WAIT).unwrap();
    let ready = daemon.ready();
    (daemon, domain, listener, sched, ready)
}

#[test]
fn a_dead_schedulers_requests_are_held_and_resent_to_the_next_one() {
    let (mut daemon, _domain, mut listener, mut sched, ready) = registered_on(&["--dead-after-ms", "60000"]);
    let answer = infer(ready.http, "m0", "x", &values(3));
    let first = next_task(&mut sched);
    drop(sched);
    daemon.expect_stderr("scheduler lost; holding requests and reconnecting");
    // The frontend comes back to the same address and resends the task
    // with the budget it has left.
    let mut sched = listener.accept(WAIT).expect("the frontend reconnects");
    control::admit_peer(&mut sched, &welcome(1), WAIT).unwrap();
    let again = next_task(&mut sched);
    assert_eq!(again.task_id, first.task_id);
    assert!(again.budget_ns < first.budget_ns);
    let mut msg = [0u8; wire::MAX_MESSAGE_LEN];
    let n = wire::encode(
        &mut msg,
        &wire::Dropped { task_id: again.task_id, reason: wire::DropReason::Overloaded as u32, reserved: 0 },
    )
    .unwrap();
    control::send_within(&mut sched, &msg[..n], WAIT).unwrap();
    let (status, body) = answer.join().unwrap();
    assert_eq!(status, 503, "{}", String::from_utf8_lossy(&body));
    daemon.terminate();
    assert_eq!(daemon.exit_code(StdDuration::from_secs(15)), 0);
    daemon.expect_stderr("accepted=1 succeeded=0 dropped=1 failed=0");
}

#[test]
fn a_silent_scheduler_is_dead_after_the_timeout() {
    let (mut daemon, _domain, _sched, _ready) =
        registered(&["--heartbeat-ms", "20", "--dead-after-ms", "200"]);
    // The fake scheduler never speaks: the daemon gives up on it (and
    // keeps running, reconnecting).
    daemon.expect_stderr("silent");
    daemon.terminate();
    assert_eq!(daemon.exit_code(StdDuration::from_secs(15)), 0);
}

#[test]
fn a_refused_registration_is_a_clear_error() {
    let domain = ShmDomain::new().unwrap();
    let mut listener = domain.listen("").unwrap();
    let addr = listener.local_addr();
    let mut daemon = spawn(&["--scheduler", &addr, "--models", "ResNet50"]);
    let mut sched = listener.accept(WAIT).expect("the frontend connects");
    let mut buf = [0u8; wire::MAX_MESSAGE_LEN];
    let refusal = Refused::new(RefuseReason::BadToken, wire::VERSION, "frontend 0: its join token is not this cluster's");
    let n = wire::encode(&mut buf, &refusal).unwrap();
    control::send_within(&mut sched, &buf[..n], WAIT).unwrap();
    control::flush_within(&mut sched, WAIT).unwrap();
    assert_eq!(daemon.exit_code(StdDuration::from_secs(15)), 1);
    drop(sched);
    daemon.expect_stderr("refused the registration of frontend 0: bad_token");
    daemon.expect_stderr("join token is not this cluster's");
}

#[test]
fn a_model_list_that_differs_from_the_schedulers_is_refused() {
    let domain = ShmDomain::new().unwrap();
    let mut listener = domain.listen("").unwrap();
    let addr = listener.local_addr();
    let mut daemon = spawn(&["--scheduler", &addr, "--models", "ResNet50,DenseNet121"]);
    let mut sched = listener.accept(WAIT).expect("the frontend connects");
    control::admit_peer(&mut sched, &welcome(5), WAIT).unwrap();
    assert_eq!(daemon.exit_code(StdDuration::from_secs(15)), 1);
    daemon.expect_stderr("same --zoo");
}

#[test]
fn bad_configurations_are_clear_errors_with_non_zero_exit() {
    let unknown_key = write_config("unknown-key", "scheduler = \"x\"\nslotz = 4\n");
    let not_toml = write_config("not-toml", "scheduler = \n");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec![], "--scheduler is required"),
        (
            vec!["--scheduler", "x", "--transport", "udp"],
            "unknown transport 'udp'",
        ),
        (vec!["--scheduler", "x", "--id", "5000"], "must be < 4096"),
        (
            vec!["--scheduler", "x", "--idle", "nap"],
            "unknown idle strategy",
        ),
        (
            vec!["--scheduler", "x", "--http", "nowhere"],
            "'nowhere' is not HOST:PORT",
        ),
        (
            vec!["--scheduler", "x", "--models", "NoSuchNet"],
            "no model named 'NoSuchNet'",
        ),
        (
            vec!["--scheduler", "x", "--model", "bad"],
            "expected NAME=ALPHA_MS",
        ),
        (vec!["--scheduler", "x", "--slots", "0"], "--slots: 0: must be"),
        (vec!["--scheduler", "x", "--coalesce", "0"], "--coalesce: 0: must be"),
        (vec!["--scheduler", "x", "--zoo", "h100"], "unknown zoo"),
        (vec!["--scheduler", "x", "--etcd", "127.0.0.1:1"], "give one of the two"),
        (vec!["--etcd", "127.0.0.1:1", "--routes-poll-ms", "0"], "must be positive"),
        (
            vec!["--config", "/nonexistent/frontend.toml"],
            "/nonexistent/frontend.toml",
        ),
        (
            vec!["--config", unknown_key.to_str().unwrap()],
            "unknown key `slotz`",
        ),
        (vec!["--config", not_toml.to_str().unwrap()], "not valid TOML"),
        (vec!["--no-such-flag"], "--no-such-flag"),
    ]
    .into_iter()
    .map(|(a, e)| (a.into_iter().map(String::from).collect(), e))
    .collect();
    for (args, want) in cases {
        let mut d = spawn(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(
            d.exit_code(StdDuration::from_secs(15)),
            2,
            "{args:?}: {}",
            d.stderr()
        );
        d.expect_stderr(want);
    }
    let _ = std::fs::remove_file(unknown_key);
    let _ = std::fs::remove_file(not_toml);
}

#[test]
fn an_unreachable_scheduler_is_a_clear_error() {
    let mut d = spawn(&[
        "--scheduler",
        "127.0.0.1:1",
        "--transport",
        "tcp-blocking",
        "--models",
        "ResNet50",
    ]);
    assert_eq!(d.exit_code(StdDuration::from_secs(20)), 1);
    d.expect_stderr("cannot reach the scheduler");
}
