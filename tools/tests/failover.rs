//! Peers outlive the scheduler (issue 18): the real daemons on loopback
//! (tcp), a scheduler SIGKILLed under load. The frontends and backends
//! must not exit; once a scheduler listens on the same control address
//! again, they reconnect and register, and the cluster serves again, with
//! every request the frontends accepted answered exactly once.

use std::path::PathBuf;
use std::time::{Duration as StdDuration, Instant};

use dataplane::control::metric;
use frontend::loadgen::LoadReport;
use tools::cluster::{ClusterSpec, LocalCluster};

const MODELS: &str = "ResNet50";

fn spec() -> ClusterSpec {
    let mut s = ClusterSpec::new(PathBuf::from(env!("CARGO_BIN_EXE_symphony")), "a100", MODELS);
    s.transport = "tcp".into();
    s.backends = 2;
    s.frontends = 2;
    s.log_dir = Some(std::env::temp_dir().join(format!("symphony-failover-test-{}", std::process::id())));
    s
}

fn load(c: &LocalCluster, rate: f64, secs: f64, seed: u64) -> LoadReport {
    load_at(c.http_addrs().unwrap(), rate, secs, seed)
}

fn load_at(addrs: Vec<std::net::SocketAddr>, rate: f64, secs: f64, seed: u64) -> LoadReport {
    let specs = scheduler::zoo::cluster_models("a100", MODELS, &[]).unwrap();
    let cfg = tools::cluster::load_config(&specs, addrs, rate, secs, seed);
    tools::cluster::run_load(cfg).unwrap()
}

fn sched(c: &LocalCluster, name: &str) -> f64 {
    c.scheduler.metrics().ok().and_then(|t| metric(&t, name)).unwrap_or(f64::NAN)
}

/// Accepted = succeeded + dropped + failed on every frontend, once every
/// request has its outcome (bounded wait).
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

#[test]
fn frontends_and_backends_outlive_a_killed_scheduler_and_serve_again_through_its_successor() {
    let spec = spec();
    let mut c = LocalCluster::start(&spec).expect("cluster starts");
    // The bars are low on purpose: a shared 2-core machine running debug
    // builds drops some requests at any time; what is tested is that the
    // cluster serves again at all.
    let before = load(&c, 200.0, 1.0, 1);
    assert!((before.ok + before.late) as f64 >= 0.5 * before.sent as f64, "{before}");

    // SIGKILL: no goodbye. Load keeps coming while no scheduler runs.
    let during = std::thread::scope(|s| {
        let addrs = c.http_addrs().unwrap();
        let h = s.spawn(move || load_at(addrs, 200.0, 1.5, 2));
        std::thread::sleep(StdDuration::from_millis(300));
        c.scheduler.kill();
        std::thread::sleep(StdDuration::from_millis(500));
        for d in c.frontends.iter_mut().chain(c.backends.iter_mut()) {
            assert!(d.try_exit().is_none(), "a peer exited with the scheduler");
        }
        c.restart_scheduler(&spec).expect("a new scheduler on the same address");
        h.join().expect("load thread")
    });
    assert!(during.balanced(), "a request got no classified answer: {during}");
    assert_eq!((during.wrong_id, during.wrong_output, during.client_errors), (0, 0, 0), "{during}");

    // Every peer registers with the new scheduler.
    let deadline = Instant::now() + StdDuration::from_secs(10);
    while sched(&c, "symphony_frontends") < 2.0 || sched(&c, "symphony_backends") < 2.0 {
        assert!(Instant::now() < deadline, "the peers never registered again");
        std::thread::sleep(StdDuration::from_millis(20));
    }
    // Registered is not serving: the GPUs join matchmaking past the join gate.
    c.wait_gpus_online(spec.backends * spec.gpus_per_backend, deadline).expect("the GPUs came back online");
    let after = load(&c, 200.0, 1.0, 3);
    assert!((after.ok + after.late) as f64 >= 0.5 * after.sent as f64, "{after}");
    assert!(after.balanced(), "{after}");
    for (i, [a, s, d, f]) in settled(&c).iter().enumerate() {
        assert_eq!(*a, s + d + f, "frontend {}: accepted {a} != succeeded {s} + dropped {d} + failed {f}", i + 1);
    }
    c.stop().expect("clean shutdown");
    let _ = std::fs::remove_dir_all(spec.log_dir.as_ref().unwrap());
}
