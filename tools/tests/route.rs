//! Several active schedulers (issue 19) as real daemons on loopback (tcp)
//! with a real local etcd: two scheduler groups, each with its own
//! election key and backend, the routing table in etcd, and a model moved
//! from group a to group b by `symphony route set --move` under load.
//!
//! What it holds: every request the frontend accepted ends classified
//! (`unaccounted` 0: the moved model's requests that group a hands back
//! end as dropped `moved`, since this frontend links to group a only; see
//! docs/architecture.md), group a applies revision 2, and from the moment
//! its `symphony_route_revision` gauge reads 2, its count of batches of the
//! moved model never grows again (the ownership rule, from its metrics).

use std::path::PathBuf;
use std::time::{Duration as StdDuration, Instant};

use dataplane::control::{metric, unused_port};
use dataplane::join::JoinToken;
use frontend::loadgen::{self, LoadReport};
use scheduler::election::{Etcd, EtcdConfig, LocalEtcd};
use scheduler::routes::{RouteGroup, RouteTable, DEFAULT_ROUTES_KEY};
use tools::cluster::{spawn, ClusterSpec, Daemon};

const MODELS: &str = "ResNet50,InceptionV3";
const MOVED: &str = "InceptionV3";

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_symphony"))
}

fn common(spec: &ClusterSpec) -> Vec<String> {
    let mut v: Vec<String> = ["--transport", "tcp", "--idle", &spec.idle, "--exit-with-parent"].map(String::from).to_vec();
    v.extend(spec.model_flags());
    v
}

fn metrics_of(d: &Daemon) -> String {
    d.metrics().unwrap_or_default()
}

fn load_at(addrs: Vec<std::net::SocketAddr>, rate: f64, secs: f64, seed: u64) -> LoadReport {
    let specs = scheduler::zoo::cluster_models("a100", MODELS, &[]).unwrap();
    let cfg = tools::cluster::load_config(&specs, addrs, rate, secs, seed);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    rt.block_on(loadgen::run(cfg)).unwrap()
}

#[test]
fn a_model_moved_between_two_scheduler_groups_under_load_leaves_nothing_unaccounted_and_the_old_owner_plans_it_no_more() {
    let etcd = LocalEtcd::start(1, StdDuration::from_secs(20)).expect("local etcd");
    let endpoints = etcd.endpoints().join(",");
    let mut spec = ClusterSpec::new(exe(), "a100", MODELS);
    spec.transport = "tcp".into();
    let log_dir = std::env::temp_dir().join(format!("symphony-route-test-{}", std::process::id()));
    spec.log_dir = Some(log_dir.clone());
    let token = JoinToken::generate().expect("token");
    let deadline = Instant::now() + StdDuration::from_secs(60);

    // Revision 1: group a owns both models, group b none.
    let group = |name: &str, models: &[&str]| RouteGroup {
        name: name.into(),
        election_key: format!("/symphony/test/leader/{name}"),
        schedulers: vec![],
        models: models.iter().map(|m| m.to_string()).collect(),
        backends: vec![],
    };
    let table = RouteTable { revision: 1, groups: vec![group("a", &["ResNet50", MOVED]), group("b", &[])] };
    let mut store = Etcd::new(EtcdConfig {
        endpoints: etcd.endpoints(),
        key: DEFAULT_ROUTES_KEY.into(),
        lease_ttl: dataplane::time::Duration::from_millis(1000),
        op_timeout: dataplane::time::Duration::from_millis(2000),
    })
    .unwrap();
    store.put_routes(DEFAULT_ROUTES_KEY, &table).expect("table stored");

    let mut schedulers = Vec::new();
    for name in ["a", "b"] {
        let listen = format!("127.0.0.1:{}", unused_port().unwrap());
        let mut args = common(&spec);
        args.extend(
            [
                "--listen", &listen, "--etcd", &endpoints, "--election-key", &format!("/symphony/test/leader/{name}"),
                "--group", name, "--control-delay-us", "1000",
            ]
            .map(String::from),
        );
        let d = spawn(&spec, &format!("scheduler-{name}"), "scheduler", args, Some(&token), deadline).expect("scheduler starts");
        schedulers.push((listen, d));
    }
    let mut peers = Vec::new();
    for (i, (listen, _)) in schedulers.iter().enumerate() {
        let mut args = common(&spec);
        args.extend(["--id", &(i + 1).to_string(), "--scheduler", listen, "--gpus", "1"].map(String::from));
        peers.push(spawn(&spec, &format!("backend-{}", i + 1), "backend", args, Some(&token), deadline).expect("backend starts"));
    }
    let mut args = common(&spec);
    args.extend(["--id", "1", "--scheduler", &schedulers[0].0].map(String::from));
    let fe = spawn(&spec, "frontend-1", "frontend", args, Some(&token), deadline).expect("frontend starts");
    // Both groups lead and hold revision 1; group a has its frontend and backend.
    let sched_a = &schedulers[0].1;
    let sched_b = &schedulers[1].1;
    loop {
        let (a, b) = (metrics_of(sched_a), metrics_of(sched_b));
        let ok = metric(&a, "symphony_route_revision") == Some(1.0)
            && metric(&b, "symphony_route_revision") == Some(1.0)
            && metric(&a, "symphony_frontends") == Some(1.0)
            && metric(&a, "symphony_backends") == Some(1.0);
        if ok {
            break;
        }
        assert!(Instant::now() < deadline, "the groups did not come up: a {:?} b {:?}", metric(&a, "symphony_route_revision"), metric(&b, "symphony_route_revision"));
        std::thread::sleep(StdDuration::from_millis(20));
    }

    let moved_batches = |text: &str| metric(text, &format!("symphony_model_batches_total{{model=\"{MOVED}\"}}")).unwrap_or(0.0);
    let addrs = vec![fe.addr("http").unwrap()];
    let (report, at_ack) = std::thread::scope(|s| {
        let h = s.spawn(move || load_at(addrs, 200.0, 3.0, 19));
        std::thread::sleep(StdDuration::from_millis(1000));
        let out = std::process::Command::new(exe())
            .args(["route", "set", "--etcd", &endpoints, "--move", &format!("{MOVED}=b")])
            .output()
            .expect("symphony route set");
        assert!(out.status.success(), "route set: {}", String::from_utf8_lossy(&out.stderr));
        let stored = Instant::now();
        // The moment group a says it applied revision 2: its batches of the
        // moved model then.
        let at_ack = loop {
            let a = metrics_of(sched_a);
            if metric(&a, "symphony_route_revision") == Some(2.0) {
                eprintln!("group a applied revision 2 within {:?} of the store (5 ms metric polls)", stored.elapsed());
                break moved_batches(&a);
            }
            assert!(Instant::now() < deadline, "group a did not apply revision 2");
            std::thread::sleep(StdDuration::from_millis(5));
        };
        (h.join().expect("load thread"), at_ack)
    });
    assert!(report.balanced(), "a request got no classified answer: {report}");
    assert_eq!((report.wrong_id, report.wrong_output, report.client_errors), (0, 0, 0), "{report}");
    // The frontend's own accounting balances (bounded wait for the last answers).
    let settle = Instant::now() + StdDuration::from_secs(10);
    loop {
        let t = metrics_of(&fe);
        let get = |n: &str| metric(&t, n).unwrap_or(f64::NAN);
        let (acc, ok, dr, fail) = (
            get("symphony_requests_accepted_total"),
            get("symphony_requests_succeeded_total"),
            get("symphony_requests_dropped_total"),
            get("symphony_requests_failed_total"),
        );
        if acc == ok + dr + fail {
            break;
        }
        assert!(Instant::now() < settle, "unaccounted: accepted {acc} succeeded {ok} dropped {dr} failed {fail}");
        std::thread::sleep(StdDuration::from_millis(20));
    }
    let a = metrics_of(sched_a);
    assert!(at_ack > 0.0, "group a planned the model before the move");
    assert_eq!(moved_batches(&a), at_ack, "group a planned {MOVED} after it applied the revision that moved it away");
    let moved_drops = metric(&a, "symphony_tasks_dropped_total{reason=\"moved\"}").unwrap_or(0.0);
    assert!(moved_drops > 0.0, "group a answered the moved model's tasks as moved");
    assert_eq!(metric(&metrics_of(sched_b), "symphony_route_revision"), Some(2.0), "group b follows the table too");
    eprintln!("batches of {MOVED} at group a when it applied revision 2: {at_ack}; moved drops {moved_drops}; {report}");

    for mut d in [fe].into_iter().chain(peers).chain(schedulers.into_iter().map(|(_, d)| d)) {
        d.signal(libc::SIGTERM);
        let _ = d.wait_or_kill(StdDuration::from_secs(10));
    }
    drop(etcd);
    let _ = std::fs::remove_dir_all(log_dir);
}
