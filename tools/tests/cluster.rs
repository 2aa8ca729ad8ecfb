//! The real daemons as processes on loopback: a scheduler, two frontends
//! and three emulated-GPU backends (`symphony daemon ...`), driven by the
//! open-loop HTTP load generator with a mixed workload. Checks, from the
//! daemons' own counters and the client's: every accepted request got
//! exactly one outcome; no response went to the wrong client; killing a
//! backend mid-run loses no request silently and the run continues on
//! the others; everything shuts down cleanly.

use std::path::PathBuf;
use std::time::{Duration as StdDuration, Instant};

use dataplane::control::{metric, metric_sum};
use frontend::loadgen::LoadReport;
use tools::cluster::{ClusterSpec, LocalCluster};

const MODELS: &str = "ResNet50,DenseNet121";
const EXTRA: &str = "Tiny=0.05,1.0,15";

fn spec(transport: &str, backends: u32) -> ClusterSpec {
    let mut s = ClusterSpec::new(PathBuf::from(env!("CARGO_BIN_EXE_symphony")), "a100", MODELS);
    s.extra = vec![EXTRA.into()];
    s.transport = transport.into();
    s.backends = backends;
    s.frontends = 2;
    s.log_dir = Some(std::env::temp_dir().join(format!("symphony-cluster-test-{}-{transport}", std::process::id())));
    s
}

/// A passing test leaves no log directory behind (a failing one keeps it).
fn remove_logs(transport: &str) {
    let _ = std::fs::remove_dir_all(std::env::temp_dir().join(format!("symphony-cluster-test-{}-{transport}", std::process::id())));
}

fn load(c: &LocalCluster, rate: f64, secs: f64, seed: u64) -> LoadReport {
    let specs = scheduler::zoo::cluster_models("a100", MODELS, &[EXTRA.to_string()]).unwrap();
    let mut cfg = tools::cluster::load_config(&specs, c.http_addrs().unwrap(), rate, secs, seed);
    cfg.max_in_flight = 4096;
    tools::cluster::run_load(cfg).unwrap()
}


/// Waits (bounded) until every frontend has an outcome for every request
/// it accepted; returns the counters.
fn settled(c: &LocalCluster) -> Vec<[f64; 4]> {
    let deadline = Instant::now() + StdDuration::from_secs(10);
    loop {
        let v = c.frontend_outcomes();
        if v.iter().all(|[a, s, d, f]| *a == s + d + f) || Instant::now() >= deadline {
            return v;
        }
        std::thread::sleep(StdDuration::from_millis(20));
    }
}

fn check_accounting(c: &LocalCluster, reports: &[&LoadReport]) {
    let v = settled(c);
    for (i, [a, s, d, f]) in v.iter().enumerate() {
        assert_eq!(*a, s + d + f, "frontend {}: accepted {a} != succeeded {s} + dropped {d} + failed {f}", i + 1);
    }
    let sent: u64 = reports.iter().map(|r| r.sent).sum();
    let ok: u64 = reports.iter().map(|r| r.ok + r.late).sum();
    let accepted: f64 = v.iter().map(|x| x[0]).sum();
    let succeeded: f64 = v.iter().map(|x| x[1]).sum();
    for r in reports {
        assert!(r.balanced(), "a request got no classified answer: {r}");
        assert_eq!(r.wrong_id, 0, "a response went to the wrong client: {r}");
        assert_eq!(r.wrong_output, 0, "a response carried another input's output: {r}");
        assert_eq!(r.transport_errors, 0, "{r}");
        // 503 (dropped, or no outcome by the deadline) and 500 (failed at
        // a backend: a lost batch, an input that could not be fetched in
        // time) are outcomes; a 4xx would be this client's fault.
        assert_eq!(r.client_errors, 0, "{r}");
    }
    assert_eq!(succeeded, ok as f64, "the client's 200s are the frontends' successes");
    // Triton's series in the daemons come from the backends' completions
    // (issue 16): non-zero, and one inference per success.
    let texts: Vec<String> = c.frontends.iter().map(|f| f.metrics().unwrap()).collect();
    let total = |name: &str| texts.iter().map(|t| metric_sum(t, name)).sum::<f64>();
    assert_eq!(total("nv_inference_request_success"), succeeded);
    assert_eq!(total("nv_inference_count"), succeeded);
    for name in ["nv_inference_exec_count", "nv_inference_queue_duration_us", "nv_inference_compute_infer_duration_us", "symphony_batch_size_sum"] {
        assert!(total(name) > 0.0, "{name} is 0 on every frontend");
    }
    assert!(total("symphony_batch_size_sum") <= succeeded + total("symphony_requests_failed_total"));
    assert!(accepted <= sent as f64 && accepted > 0.0, "accepted {accepted} of {sent}");
}

fn sched(c: &LocalCluster, name: &str) -> f64 {
    metric(&c.scheduler.metrics().unwrap(), name).unwrap_or(f64::NAN)
}

/// Polls the scheduler until `name` reaches `at_least` (bounded).
fn wait_for(c: &LocalCluster, name: &str, at_least: f64) {
    let deadline = Instant::now() + StdDuration::from_secs(20);
    while sched(c, name) < at_least {
        assert!(Instant::now() < deadline, "{name} never reached {at_least}");
        std::thread::sleep(StdDuration::from_millis(10));
    }
}

#[test]
fn mixed_workload_survives_a_backend_kill_with_every_request_accounted_for() {
    let mut c = LocalCluster::start(&spec("shm", 3)).expect("cluster starts");
    let victim = c.backends[1].pid() as libc::pid_t;
    // Phase 1: load; once batches are flowing, backend 2 is killed
    // (SIGKILL: no goodbye, batches in flight on it are lost).
    let report1 = std::thread::scope(|s| {
        let h = s.spawn(|| load(&c, 300.0, 4.0, 1));
        wait_for(&c, "symphony_batches_done_total", 30.0);
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(victim, libc::SIGKILL) }, 0);
        h.join().expect("load thread")
    });
    c.backends[1].kill();
    wait_for(&c, "symphony_backend_deaths_total", 1.0);
    assert_eq!(sched(&c, "symphony_backends"), 2.0);
    check_accounting(&c, &[&report1]);
    assert!((report1.ok + report1.late) as f64 >= 0.8 * report1.sent as f64, "{report1}");
    // Phase 2: the run continues on the two backends left.
    let report2 = load(&c, 300.0, 2.0, 2);
    assert!((report2.ok + report2.late) as f64 >= 0.95 * report2.sent as f64, "{report2}");
    check_accounting(&c, &[&report1, &report2]);
    c.stop().expect("clean shutdown");
    remove_logs("shm");
}

#[test]
fn tcp_transport_serves_a_mixed_workload_end_to_end() {
    let c = LocalCluster::start(&spec("tcp", 2)).expect("cluster starts");
    let r = load(&c, 300.0, 2.0, 3);
    check_accounting(&c, &[&r]);
    assert!((r.ok + r.late) as f64 >= 0.95 * r.sent as f64, "{r}");
    assert_eq!(sched(&c, "symphony_backend_deaths_total"), 0.0);
    c.stop().expect("clean shutdown");
    remove_logs("tcp");
}

/// CPU seconds (user + system) process `pid` has used, from /proc.
fn cpu_s_of(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    // SAFETY: sysconf has no memory effects.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// The acceptance bound on an idle scheduler (2 frontends, 2 backends
/// connected, heartbeats only) is 5% of a core over 10 s
/// (docs/benchmarks.md); the test samples 3 s.
#[test]
fn an_idle_scheduler_on_the_pinned_engine_uses_under_five_percent_of_a_core() {
    let mut s = spec("shm", 2);
    s.log_dir = Some(std::env::temp_dir().join(format!("symphony-cluster-test-{}-shm-idle", std::process::id())));
    let c = LocalCluster::start(&s).expect("cluster starts");
    wait_for(&c, "symphony_backends", 2.0);
    wait_for(&c, "symphony_frontends", 2.0);
    let pid = c.scheduler.pid();
    let (t0, c0) = (Instant::now(), cpu_s_of(pid));
    std::thread::sleep(StdDuration::from_secs(3));
    let busy = (cpu_s_of(pid) - c0) / t0.elapsed().as_secs_f64();
    assert!(busy <= 0.05, "idle scheduler busy {:.1}% of a core", busy * 100.0);
    c.stop().expect("clean shutdown");
    remove_logs("shm-idle");
}
