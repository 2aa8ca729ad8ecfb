//! Two active scheduler groups on a local etcd, a model moved between
//! them under load (issue 19): what `symphony up --groups 2
//! --reroute-at-s S` runs and `tools/tests/route.rs` checks.
//!
//! Each group is one scheduler daemon with its own election key and
//! `--group`, and one backend with one emulated GPU; one frontend follows
//! the table in etcd (`--etcd`) and links to both groups by the addresses
//! the table gives. Revision 1 gives every model to group a; at
//! `reroute_at_s` into the load, `symphony route set --move LAST=b` moves
//! the last model of the list. The report says how soon group a applied
//! the revision, its batch count of the moved model then and at the end
//! (equal: the ownership rule), its `moved` drops, how many tasks the
//! frontend took back and resubmitted to group b and how many of its
//! requests still ended dropped `moved`, and the frontend's accounting.

use std::path::PathBuf;
use std::time::{Duration as StdDuration, Instant};

use dataplane::control::{metric, unused_port};
use dataplane::join::JoinToken;
use frontend::loadgen::{self, LoadReport};
use scheduler::election::{Etcd, EtcdConfig, LocalEtcd};
use scheduler::routes::{RouteGroup, RouteTable, DEFAULT_ROUTES_KEY};
use serde::Serialize;

use crate::cluster::{spawn, ClusterSpec, Daemon};

/// What to run.
#[derive(Clone, Debug)]
pub struct GroupsRun {
    /// The `symphony` binary.
    pub exe: PathBuf,
    /// Zoo and models (comma-separated; the last one is moved).
    pub zoo: String,
    /// The models.
    pub models: String,
    /// Offered load, requests/s over all models.
    pub rate: f64,
    /// Load duration.
    pub duration_s: f64,
    /// When the model moves, seconds into the load.
    pub reroute_at_s: f64,
    /// Load seed.
    pub seed: u64,
    /// Daemon logs (none: inherited stderr).
    pub log_dir: Option<PathBuf>,
}

/// What happened.
#[derive(Clone, Debug, Serialize)]
pub struct GroupsReport {
    /// The model moved from group a to group b.
    pub moved_model: String,
    /// From the store of revision 2 to group a's gauge reading 2 (metrics
    /// polled every 5 ms), ms.
    pub applied_after_ms: f64,
    /// Group a's batches of the moved model when it applied revision 2.
    pub moved_batches_at_apply: f64,
    /// The same at the end (equal: nothing planned after the move).
    pub moved_batches_at_end: f64,
    /// Tasks group a answered `moved`.
    pub moved_drops: f64,
    /// Tasks the frontend took back (answered `moved`) and resubmitted.
    pub resubmitted: f64,
    /// Requests the frontend answered dropped `moved` (resubmission found
    /// no owner within the deadline).
    pub moved_dropped: f64,
    /// Batches of the moved model group b ran.
    pub moved_batches_b: f64,
    /// The revision group b applied.
    pub group_b_revision: f64,
    /// The frontend's accepted, succeeded, dropped, failed requests.
    pub frontend: [f64; 4],
    /// Requests the frontend accepted that did not end (must be 0).
    pub unaccounted: f64,
    /// The load generator's summary.
    pub load: String,
    /// Every load request got a classified answer, none a wrong one.
    pub load_clean: bool,
}

/// Why the run could not be made.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct GroupsError(String);

fn err(what: impl std::fmt::Display) -> GroupsError {
    GroupsError(what.to_string())
}

fn names_of(r: &GroupsRun) -> Vec<String> {
    r.models.split(',').map(str::trim).filter(|m| !m.is_empty()).map(String::from).collect()
}

fn metrics_of(d: &Daemon) -> String {
    d.metrics().unwrap_or_default()
}

/// Runs it (see the module docs).
pub fn run(r: &GroupsRun) -> Result<GroupsReport, GroupsError> {
    let names: Vec<&str> = r.models.split(',').map(str::trim).filter(|m| !m.is_empty()).collect();
    let moved = names.last().ok_or_else(|| err("no model"))?.to_string();
    let etcd = LocalEtcd::start(1, StdDuration::from_secs(20)).map_err(err)?;
    let endpoints = etcd.endpoints().join(",");
    let mut spec = ClusterSpec::new(r.exe.clone(), &r.zoo, &r.models);
    spec.transport = "tcp".into();
    spec.log_dir = r.log_dir.clone();
    let common = |spec: &ClusterSpec| {
        let mut v: Vec<String> = ["--transport", "tcp", "--idle", &spec.idle, "--exit-with-parent"].map(String::from).to_vec();
        v.extend(spec.model_flags());
        v
    };
    let token = JoinToken::generate().map_err(err)?;
    let deadline = Instant::now() + StdDuration::from_secs(60);
    let group = |name: &str, models: &[&str]| RouteGroup {
        name: name.into(),
        election_key: format!("/symphony/leader/{name}"),
        schedulers: vec![],
        models: models.iter().map(|m| m.to_string()).collect(),
        backends: vec![],
    };
    let mut listens = Vec::new();
    for _ in ["a", "b"] {
        listens.push(format!("127.0.0.1:{}", unused_port().map_err(err)?));
    }
    let mut table = RouteTable { revision: 1, groups: vec![group("a", &names), group("b", &[])] };
    for (g, listen) in table.groups.iter_mut().zip(&listens) {
        g.schedulers = vec![listen.clone()];
    }
    let mut store = Etcd::new(EtcdConfig {
        endpoints: etcd.endpoints(),
        key: DEFAULT_ROUTES_KEY.into(),
        lease_ttl: dataplane::time::Duration::from_millis(1000),
        op_timeout: dataplane::time::Duration::from_millis(2000),
    })
    .map_err(err)?;
    store.put_routes(DEFAULT_ROUTES_KEY, &table).map_err(err)?;

    let mut daemons: Vec<Daemon> = Vec::new();
    for (name, listen) in ["a", "b"].into_iter().zip(&listens) {
        let mut args = common(&spec);
        let key = format!("/symphony/leader/{name}");
        args.extend(["--listen", listen, "--etcd", &endpoints, "--election-key", &key, "--group", name, "--routes-poll-ms", "10", "--control-delay-us", "1000"].map(String::from));
        daemons.push(spawn(&spec, &format!("scheduler-{name}"), "scheduler", args, Some(&token), deadline).map_err(err)?);
    }
    for (i, listen) in listens.iter().enumerate() {
        let mut args = common(&spec);
        args.extend(["--id", &(i + 1).to_string(), "--scheduler", listen, "--gpus", "1"].map(String::from));
        daemons.push(spawn(&spec, &format!("backend-{}", i + 1), "backend", args, Some(&token), deadline).map_err(err)?);
    }
    let mut args = common(&spec);
    // The frontend re-reads the table less often than the schedulers: group
    // a hands tasks back before the frontend knows of the move, which is
    // the path worth measuring (a `moved` answer from the group its table
    // names makes it read the table at once).
    args.extend(["--id", "1", "--etcd", &endpoints, "--routes-poll-ms", "200"].map(String::from));
    daemons.push(spawn(&spec, "frontend-1", "frontend", args, Some(&token), deadline).map_err(err)?);
    let result = drive(r, &daemons, &endpoints, &moved, deadline);
    for mut d in daemons.into_iter().rev() {
        d.signal(libc::SIGTERM);
        let _ = d.wait_or_kill(StdDuration::from_secs(10));
    }
    drop(etcd);
    result
}

/// Load, the move, the readings; `daemons`: scheduler a, b, backends, frontend.
fn drive(r: &GroupsRun, daemons: &[Daemon], endpoints: &str, moved: &str, deadline: Instant) -> Result<GroupsReport, GroupsError> {
    let (sched_a, sched_b, fe) = (&daemons[0], &daemons[1], &daemons[daemons.len() - 1]);
    loop {
        let (a, b) = (metrics_of(sched_a), metrics_of(sched_b));
        if metric(&a, "symphony_route_revision") == Some(1.0)
            && metric(&b, "symphony_route_revision") == Some(1.0)
            && metric(&a, "symphony_frontends") == Some(1.0)
            && metric(&b, "symphony_frontends") == Some(1.0)
            && metric(&a, "symphony_backends") == Some(1.0)
            && metric(&b, "symphony_backends") == Some(1.0)
        {
            break;
        }
        if Instant::now() >= deadline {
            return Err(err("the two groups did not come up within 60 s"));
        }
        std::thread::sleep(StdDuration::from_millis(20));
    }
    let batches = |text: &str| metric(text, &format!("symphony_model_batches_total{{model=\"{moved}\"}}")).unwrap_or(0.0);
    let specs = scheduler::zoo::cluster_models(&r.zoo, &r.models, &[]).map_err(err)?;
    let load_cfg = crate::cluster::load_config(&specs, vec![fe.addr("http").map_err(err)?], r.rate, r.duration_s, r.seed);
    let (report, applied) = std::thread::scope(|s| {
        let h = s.spawn(move || -> Result<LoadReport, GroupsError> {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().map_err(err)?;
            rt.block_on(loadgen::run(load_cfg)).map_err(err)
        });
        let applied = (|| {
            std::thread::sleep(StdDuration::from_secs_f64(r.reroute_at_s));
            let out = std::process::Command::new(&r.exe)
                .args(["route", "set", "--etcd", endpoints, "--move", &format!("{moved}=b")])
                .output()
                .map_err(err)?;
            if !out.status.success() {
                return Err(err(format!("route set: {}", String::from_utf8_lossy(&out.stderr))));
            }
            let stored = Instant::now();
            loop {
                let a = metrics_of(sched_a);
                if metric(&a, "symphony_route_revision") == Some(2.0) {
                    return Ok((stored.elapsed().as_secs_f64() * 1e3, batches(&a)));
                }
                if stored.elapsed() > StdDuration::from_secs(10) {
                    return Err(err("group a did not apply revision 2 within 10 s"));
                }
                std::thread::sleep(StdDuration::from_millis(5));
            }
        })();
        (h.join().map_err(|_| err("the load thread panicked")), applied)
    });
    let report = report??;
    let (applied_after_ms, at_apply) = applied?;
    // The frontend's accounting, once the last answers are in (bounded).
    let settle = Instant::now() + StdDuration::from_secs(10);
    let frontend = loop {
        let t = metrics_of(fe);
        let v = ["accepted", "succeeded", "dropped", "failed"].map(|n| metric(&t, &format!("symphony_requests_{n}_total")).unwrap_or(f64::NAN));
        if v[0] == v[1] + v[2] + v[3] || Instant::now() >= settle {
            break v;
        }
        std::thread::sleep(StdDuration::from_millis(20));
    };
    let a = metrics_of(sched_a);
    let (f, b) = (metrics_of(fe), metrics_of(sched_b));
    let moved_dropped = names_of(r)
        .iter()
        .map(|m| metric(&f, &format!("symphony_dropped_total{{model=\"{m}\",reason=\"moved\"}}")).unwrap_or(0.0))
        .sum();
    Ok(GroupsReport {
        resubmitted: metric(&f, "symphony_frontend_moved_resubmits_total").unwrap_or(0.0),
        moved_dropped,
        moved_batches_b: batches(&b),
        moved_model: moved.to_string(),
        applied_after_ms,
        moved_batches_at_apply: at_apply,
        moved_batches_at_end: batches(&a),
        moved_drops: metric(&a, "symphony_tasks_dropped_total{reason=\"moved\"}").unwrap_or(0.0),
        group_b_revision: metric(&metrics_of(sched_b), "symphony_route_revision").unwrap_or(0.0),
        frontend,
        unaccounted: frontend[0] - frontend[1] - frontend[2] - frontend[3],
        load_clean: report.balanced() && report.wrong_id == 0 && report.wrong_output == 0 && report.client_errors == 0,
        load: report.to_string(),
    })
}
