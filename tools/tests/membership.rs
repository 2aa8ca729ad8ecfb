//! Authenticated membership with the real daemons as processes on
//! loopback (tcp): while a client's load runs, a backend with a wrong join
//! token, one with none, and a hand-written peer of the next wire version
//! try to join. Each is refused with a log line naming it and the reason
//! and counted in the scheduler's `/metrics`; the cluster keeps serving
//! and no intruder's GPUs join.

use std::path::PathBuf;
use std::time::{Duration as StdDuration, Instant};

use dataplane::control::{self, metric};
use dataplane::join::JoinToken;
use dataplane::time::Duration;
use dataplane::transport::tcp::{Engine, TcpConfig, TcpDomain};
use dataplane::wire::{self, Join, Message, RefuseReason, Role};
use frontend::loadgen::LoadReport;
use tools::cluster::{spawn, ClusterSpec, LocalCluster};

const MODELS: &str = "ResNet50,DenseNet121";
const WAIT: Duration = Duration::from_millis(10_000);

fn spec() -> ClusterSpec {
    let mut s = ClusterSpec::new(PathBuf::from(env!("CARGO_BIN_EXE_symphony")), "a100", MODELS);
    s.transport = "tcp".into();
    s.backends = 2;
    s.frontends = 1;
    s.log_dir = Some(std::env::temp_dir().join(format!("symphony-membership-test-{}", std::process::id())));
    s
}

fn load(c: &LocalCluster, rate: f64, secs: f64, seed: u64) -> LoadReport {
    let specs = scheduler::zoo::cluster_models("a100", MODELS, &[]).unwrap();
    let cfg = tools::cluster::load_config(&specs, c.http_addrs().unwrap(), rate, secs, seed);
    tools::cluster::run_load(cfg).unwrap()
}

fn refused(c: &LocalCluster, reason: &str) -> f64 {
    let text = c.scheduler.metrics().unwrap();
    metric(&text, &format!("symphony_peers_refused_total{{reason=\"{reason}\"}}")).unwrap_or(f64::NAN)
}

fn log(s: &ClusterSpec, name: &str) -> String {
    s.log_path(name).and_then(|p| std::fs::read_to_string(p).ok()).unwrap_or_default()
}

/// Waits (bounded) until `text()` contains `want`.
fn wait_text(what: &str, want: &str, text: impl Fn() -> String) {
    let deadline = Instant::now() + StdDuration::from_secs(20);
    loop {
        let t = text();
        if t.contains(want) {
            return;
        }
        assert!(Instant::now() < deadline, "{what} never said {want:?}:\n{t}");
        std::thread::sleep(StdDuration::from_millis(20));
    }
}

/// A peer of the next wire version, written by hand: it reads the
/// challenge (whose layout every version keeps), answers with a Join whose
/// header says `VERSION + 1`, and reads the refusal.
fn next_version_peer(control_addr: &str) -> wire::Refused {
    let domain = TcpDomain::new(TcpConfig::new(Engine::Blocking)).unwrap();
    let mut conn = control::connect_retrying(&domain, control_addr, WAIT).unwrap();
    let mut buf = vec![0u8; wire::MAX_MESSAGE_LEN];
    let n = control::recv_within(&mut conn, &mut buf, WAIT).unwrap();
    let Ok(Message::Challenge(c)) = wire::decode(&buf[..n]) else { panic!("no challenge first") };
    assert_eq!((c.scheduler_version, c.token_required()), (wire::VERSION, true));
    let n = wire::encode(&mut buf, &Join::new(Role::Backend, 9, 1, "")).unwrap();
    let mut msg = buf[..n].to_vec();
    msg[4..6].copy_from_slice(&(wire::VERSION + 1).to_le_bytes());
    control::send_within(&mut conn, &msg, WAIT).unwrap();
    control::flush_within(&mut conn, WAIT).unwrap();
    let n = control::recv_within(&mut conn, &mut buf, WAIT).unwrap();
    match wire::decode(&buf[..n]) {
        Ok(Message::Refused(r)) => r,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn wrong_or_missing_tokens_and_another_version_are_refused_while_the_cluster_serves() {
    let s = spec();
    let c = LocalCluster::start(&s).expect("cluster starts");
    let control_addr = c.scheduler.ready["control"].clone();
    let intruder = |id: u32, token: Option<&JoinToken>| {
        let args: Vec<String> = [
            "--transport", "tcp", "--idle", "wait", "--exit-with-parent", "--zoo", "a100", "--models", MODELS,
            "--scheduler", &control_addr, "--id", &id.to_string(), "--gpus-per-backend", "4",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        let deadline = Instant::now() + StdDuration::from_secs(20);
        let err = spawn(&s, &format!("intruder-{id}"), "backend", args, token, deadline)
            .expect_err("an intruder never becomes ready");
        assert!(err.to_string().contains("exited before it was ready"), "{err}");
    };
    let wrong = JoinToken::new(b"a token of some other cluster").unwrap();
    let report = std::thread::scope(|scope| {
        let h = scope.spawn(|| load(&c, 200.0, 3.0, 7));
        intruder(7, Some(&wrong));
        intruder(8, None);
        let r = next_version_peer(&control_addr);
        let v = wire::VERSION;
        assert_eq!((r.reason(), r.scheduler_version, r.peer_version), (Some(RefuseReason::Version), v, v + 1));
        assert!(r.to_string().contains(&format!("it speaks wire version {}", v + 1)), "{r}");
        h.join().expect("load thread")
    });
    // The intruders' own logs say why.
    let v = wire::VERSION;
    assert!(log(&s, "intruder-7").contains(&format!("refused the registration of backend 7: bad_token (scheduler wire version {v}, ours {v})")), "{}", log(&s, "intruder-7"));
    assert!(log(&s, "intruder-8").contains("refused the registration of backend 8: no_token"), "{}", log(&s, "intruder-8"));
    // The scheduler's log names each and its reason; its counters agree.
    let sched_log = || log(&s, "scheduler");
    wait_text("the scheduler", "registration refused: backend 7: its join token is not this cluster's [bad_token]", sched_log);
    wait_text("the scheduler", "registration refused: backend 8: it has no join token", sched_log);
    wait_text("the scheduler", &format!("registration refused: backend 9: it speaks wire version {}", v + 1), sched_log);
    assert_eq!((refused(&c, "bad_token"), refused(&c, "no_token"), refused(&c, "version")), (1.0, 1.0, 1.0));
    // No intruder's GPUs joined; the cluster kept serving.
    let text = c.scheduler.metrics().unwrap();
    assert_eq!((metric(&text, "symphony_backends"), metric(&text, "symphony_gpus_online")), (Some(2.0), Some(2.0)));
    assert!(report.balanced() && report.wrong_id == 0 && report.wrong_output == 0, "{report}");
    assert!((report.ok + report.late) as f64 >= 0.95 * report.sent as f64, "{report}");
    let after = load(&c, 200.0, 1.0, 8);
    assert!((after.ok + after.late) as f64 >= 0.95 * after.sent as f64, "{after}");
    c.stop().expect("clean shutdown");
}
