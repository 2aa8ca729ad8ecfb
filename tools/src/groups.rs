//! Two active scheduler groups on a local etcd, a model moved between
//! them under load (issue 19): what `symphony up --groups 2
//! --reroute-at-s S` runs and `tools/tests/route.rs` checks.
//!
//! Each group is one scheduler daemon with its own election key and
//! `--group` (with `standby`, two: a leader and a standby on the same key,
//! both listed in the table), and one backend with one emulated GPU; one
//! frontend follows the table in etcd (`--etcd`) and links to both groups
//! by the addresses the table gives. Revision 1 gives every model to group a; at
//! `reroute_at_s` into the load, `symphony route set --move LAST=b` moves
//! the last model of the list. The report says how soon group a applied
//! the revision, its batch count of the moved model then and at the end
//! (equal: the ownership rule), its `moved` drops, how many tasks the
//! frontend took back and resubmitted to group b and how many of its
//! requests still ended dropped `moved`, and the frontend's accounting.
//! With `kill_a_leader_at_s`, group a's leader is killed (SIGKILL) at that
//! moment, after the move: its standby takes over the group, must plan
//! nothing of the moved model (a new term owns nothing until it has read
//! the table) and serves the group's other models.

use std::path::PathBuf;
use std::time::{Duration as StdDuration, Instant};

use dataplane::control::{metric, unused_port};
use dataplane::join::JoinToken;
use frontend::loadgen::LoadReport;
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
    /// A standby scheduler per group (same election key and group).
    pub standby: bool,
    /// With `standby`: group a's leader is killed this many seconds into
    /// the load (after the move; later than `reroute_at_s`).
    pub kill_a_leader_at_s: Option<f64>,
    /// Group b is not in the table until the move: the move's revision
    /// adds it (its schedulers run from the start and own nothing), so the
    /// frontend, which started knowing group a only, must link to it.
    pub b_added_at_move: bool,
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
    /// The same at the end, or just before the kill of group a's leader
    /// (equal: nothing planned after the move).
    pub moved_batches_at_end: f64,
    /// Tasks group a answered `moved` (with a kill: the old leader's until
    /// the kill plus the new leader's).
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
    /// With a kill of group a's leader: what followed.
    pub takeover: Option<Takeover>,
}

/// Group a's leader killed, its standby leading (see the module docs).
#[derive(Clone, Debug, Serialize)]
pub struct Takeover {
    /// The killed leader's epoch.
    pub old_epoch: u64,
    /// The new leader's epoch.
    pub new_epoch: u64,
    /// From the kill to the new leader's epoch gauge, ms.
    pub leads_after_ms: f64,
    /// The routing revision the new leader applied.
    pub revision: f64,
    /// Batches of the moved model the new leader of group a planned (must be 0).
    pub moved_batches: f64,
    /// Batches of group a's other models the new leader planned.
    pub kept_batches: f64,
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
    // Per group: the scheduler, then its standby (if any).
    let per_group = if r.standby { 2 } else { 1 };
    let mut listens: Vec<Vec<String>> = Vec::new();
    for _ in ["a", "b"] {
        let mut l = Vec::new();
        for _ in 0..per_group {
            l.push(format!("127.0.0.1:{}", unused_port().map_err(err)?));
        }
        listens.push(l);
    }
    let mut table = RouteTable { revision: 1, groups: vec![group("a", &names), group("b", &[])] };
    for (g, listen) in table.groups.iter_mut().zip(&listens) {
        g.schedulers = listen.clone();
    }
    // With `b_added_at_move`, revision 1 names group a only and the move
    // stores revision 2 with group b and the moved model in it.
    let added = r.b_added_at_move.then(|| {
        let mut next = table.clone();
        next.revision = 2;
        next.groups[0].models.retain(|m| *m != moved);
        next.groups[1].models = vec![moved.clone()];
        table.groups.truncate(1);
        next
    });
    let mut store = Etcd::new(EtcdConfig {
        endpoints: etcd.endpoints(),
        key: DEFAULT_ROUTES_KEY.into(),
        lease_ttl: dataplane::time::Duration::from_millis(1000),
        op_timeout: dataplane::time::Duration::from_millis(2000),
    })
    .map_err(err)?;
    store.put_routes(DEFAULT_ROUTES_KEY, &table).map_err(err)?;

    let mut daemons: Vec<Daemon> = Vec::new();
    for k in 0..per_group {
        for (name, listen) in ["a", "b"].into_iter().zip(&listens) {
            let mut args = common(&spec);
            let key = format!("/symphony/leader/{name}");
            args.extend(["--listen", &listen[k], "--etcd", &endpoints, "--election-key", &key, "--group", name, "--routes-poll-ms", "10", "--control-delay-us", "1000"].map(String::from));
            let role = if k == 0 { format!("scheduler-{name}") } else { format!("scheduler-{name}-standby") };
            daemons.push(spawn(&spec, &role, "scheduler", args, Some(&token), deadline).map_err(err)?);
        }
    }
    for (i, listen) in listens.iter().enumerate() {
        let mut args = common(&spec);
        let list = listen.join(",");
        args.extend(["--id", &(i + 1).to_string(), "--scheduler", &list, "--gpus-per-backend", "1"].map(String::from));
        daemons.push(spawn(&spec, &format!("backend-{}", i + 1), "backend", args, Some(&token), deadline).map_err(err)?);
    }
    let mut args = common(&spec);
    // The frontend re-reads the table less often than the schedulers: group
    // a hands tasks back before the frontend knows of the move, which is
    // the path worth measuring (a `moved` answer from the group its table
    // names makes it read the table at once).
    args.extend(["--id", "1", "--etcd", &endpoints, "--routes-poll-ms", "200"].map(String::from));
    daemons.push(spawn(&spec, "frontend-1", "frontend", args, Some(&token), deadline).map_err(err)?);
    let result = drive(r, &daemons, per_group, &endpoints, &moved, deadline, added.map(|t| (store, t)));
    for mut d in daemons.into_iter().rev() {
        d.signal(libc::SIGTERM);
        let _ = d.wait_or_kill(StdDuration::from_secs(10));
    }
    drop(etcd);
    result
}

/// The daemon of group `g` (0: a, 1: b; the schedulers are listed group
/// by group per `per_group` round) that leads, and its epoch.
fn leader_of(daemons: &[Daemon], per_group: usize, g: usize) -> Option<(usize, u64)> {
    (0..per_group)
        .map(|k| 2 * k + g)
        .filter_map(|i| {
            let e = metric(&metrics_of(&daemons[i]), "symphony_scheduler_leader_epoch")?;
            (e > 0.0).then_some((i, e as u64))
        })
        .max_by_key(|(_, e)| *e)
}

/// What killing group a's leader left: its count of the moved model's
/// batches just before, and the new leader's index, epochs, delay.
struct Killed {
    moved_batches_before: f64,
    moved_drops_before: f64,
    new_leader: usize,
    old_epoch: u64,
    new_epoch: u64,
    leads_after_ms: f64,
}

/// Load, the move, the readings; `daemons`: the schedulers (a, b per
/// round of `per_group`), backends, frontend.
fn drive(
    r: &GroupsRun,
    daemons: &[Daemon],
    per_group: usize,
    endpoints: &str,
    moved: &str,
    deadline: Instant,
    mut added: Option<(Etcd, RouteTable)>,
) -> Result<GroupsReport, GroupsError> {
    // Group b links to the frontend only once the table names it.
    let b_frontends = if added.is_some() { 0.0 } else { 1.0 };
    let fe = &daemons[daemons.len() - 1];
    let (ia, ib) = wait_for_groups(daemons, per_group, b_frontends, deadline)?;
    let (sched_a, sched_b) = (&daemons[ia], &daemons[ib]);
    let batches = |text: &str| batches_of(text, moved);
    let specs = scheduler::zoo::cluster_models(&r.zoo, &r.models, &[]).map_err(err)?;
    let load_cfg = crate::cluster::load_config(&specs, vec![fe.addr("http").map_err(err)?], r.rate, r.duration_s, r.seed);
    let start = Instant::now();
    let (report, applied) = std::thread::scope(|s| {
        let h = s.spawn(move || -> Result<LoadReport, GroupsError> {
            crate::cluster::run_load(load_cfg).map_err(err)
        });
        let reroute = Reroute { r, daemons, per_group, endpoints, moved, sched_a, start };
        let applied = reroute.run(added.as_mut());
        (h.join().map_err(|_| err("the load thread panicked")), applied)
    });
    let report = report??;
    let (applied_after_ms, at_apply, killed) = applied?;
    let frontend = settled_accounting(fe);
    let (f, b) = (metrics_of(fe), metrics_of(sched_b));
    let moved_dropped = names_of(r)
        .iter()
        .map(|m| metric(&f, &format!("symphony_dropped_total{{model=\"{m}\",reason=\"moved\"}}")).unwrap_or(0.0))
        .sum();
    // The killed leader's count stops at the kill; its moved drops are gone with it.
    let a = killed.as_ref().map_or_else(|| metrics_of(sched_a), |k| metrics_of(&daemons[k.new_leader]));
    let moved_batches_at_end = killed.as_ref().map_or_else(|| batches(&a), |k| k.moved_batches_before);
    let moved_drops = killed.as_ref().map_or_else(|| moved_drops(&a), |k| k.moved_drops_before + moved_drops(&a));
    let takeover = killed.map(|k| Takeover {
        old_epoch: k.old_epoch,
        new_epoch: k.new_epoch,
        leads_after_ms: k.leads_after_ms,
        revision: metric(&a, "symphony_route_revision").unwrap_or(0.0),
        moved_batches: batches(&a),
        kept_batches: names_of(r).iter().filter(|m| m.as_str() != moved).map(|m| batches_of(&a, m)).sum(),
    });
    Ok(GroupsReport {
        resubmitted: metric(&f, "symphony_frontend_moved_resubmits_total").unwrap_or(0.0),
        moved_dropped,
        moved_batches_b: batches(&b),
        moved_model: moved.to_string(),
        applied_after_ms,
        moved_batches_at_apply: at_apply,
        moved_batches_at_end,
        moved_drops,
        group_b_revision: metric(&b, "symphony_route_revision").unwrap_or(0.0),
        frontend,
        unaccounted: frontend[0] - frontend[1] - frontend[2] - frontend[3],
        load_clean: report.balanced() && report.wrong_id == 0 && report.wrong_output == 0 && report.client_errors == 0,
        load: report.to_string(),
        takeover,
    })
}

/// Waits (until `deadline`) for both groups' leaders to hold revision 1 with
/// their links up; returns their indices in `daemons`.
fn wait_for_groups(daemons: &[Daemon], per_group: usize, b_frontends: f64, deadline: Instant) -> Result<(usize, usize), GroupsError> {
    loop {
        if let (Some((ia, _)), Some((ib, _))) = (leader_of(daemons, per_group, 0), leader_of(daemons, per_group, 1)) {
            let (a, b) = (metrics_of(&daemons[ia]), metrics_of(&daemons[ib]));
            if metric(&a, "symphony_route_revision") == Some(1.0)
                && metric(&b, "symphony_route_revision") == Some(1.0)
                && metric(&a, "symphony_frontends") == Some(1.0)
                && metric(&b, "symphony_frontends") == Some(b_frontends)
                && metric(&a, "symphony_backends") == Some(1.0)
                && metric(&b, "symphony_backends") == Some(1.0)
            {
                return Ok((ia, ib));
            }
        }
        if Instant::now() >= deadline {
            return Err(err("the two groups did not come up within 60 s"));
        }
        std::thread::sleep(StdDuration::from_millis(20));
    }
}

/// Batches of `model` a scheduler's metrics `text` counts.
fn batches_of(text: &str, model: &str) -> f64 {
    metric(text, &format!("symphony_model_batches_total{{model=\"{model}\"}}")).unwrap_or(0.0)
}

/// Tasks a scheduler's metrics `text` dropped as moved.
fn moved_drops(text: &str) -> f64 {
    metric(text, "symphony_tasks_dropped_total{reason=\"moved\"}").unwrap_or(0.0)
}

/// The frontend's accounting (accepted, succeeded, dropped, failed), once
/// the last answers are in (bounded: 10 s).
fn settled_accounting(fe: &Daemon) -> [f64; 4] {
    let settle = Instant::now() + StdDuration::from_secs(10);
    loop {
        let t = metrics_of(fe);
        let v = ["accepted", "succeeded", "dropped", "failed"].map(|n| metric(&t, &format!("symphony_requests_{n}_total")).unwrap_or(f64::NAN));
        if v[0] == v[1] + v[2] + v[3] || Instant::now() >= settle {
            return v;
        }
        std::thread::sleep(StdDuration::from_millis(20));
    }
}

/// The run's reroute, beside the load: the move stored at `reroute_at_s`,
/// group a's leader seen applying it, and with `kill_a_leader_at_s` that
/// leader killed and its standby seen taking over.
struct Reroute<'a> {
    r: &'a GroupsRun,
    daemons: &'a [Daemon],
    per_group: usize,
    endpoints: &'a str,
    moved: &'a str,
    sched_a: &'a Daemon,
    start: Instant,
}

impl Reroute<'_> {
    /// Stores the move (`added`: group b's whole table into the store
    /// given; otherwise `symphony route set --move`) and returns how long
    /// group a took to apply it, its moved batches then, and the takeover.
    fn run(&self, added: Option<&mut (Etcd, RouteTable)>) -> Result<(f64, f64, Option<Killed>), GroupsError> {
        std::thread::sleep(StdDuration::from_secs_f64(self.r.reroute_at_s));
        if let Some((store, table)) = added {
            store.put_routes(DEFAULT_ROUTES_KEY, table).map_err(err)?;
        } else {
            let out = std::process::Command::new(&self.r.exe)
                .args(["route", "set", "--etcd", self.endpoints, "--move", &format!("{}=b", self.moved)])
                .output()
                .map_err(err)?;
            if !out.status.success() {
                return Err(err(format!("route set: {}", String::from_utf8_lossy(&out.stderr))));
            }
        }
        let stored = Instant::now();
        let (applied_ms, at_apply) = loop {
            let a = metrics_of(self.sched_a);
            if metric(&a, "symphony_route_revision") == Some(2.0) {
                break (stored.elapsed().as_secs_f64() * 1e3, batches_of(&a, self.moved));
            }
            if stored.elapsed() > StdDuration::from_secs(10) {
                return Err(err("group a did not apply revision 2 within 10 s"));
            }
            std::thread::sleep(StdDuration::from_millis(5));
        };
        let Some(kill_at) = self.r.kill_a_leader_at_s.filter(|_| self.per_group > 1) else {
            return Ok((applied_ms, at_apply, None));
        };
        std::thread::sleep(StdDuration::from_secs_f64(kill_at).saturating_sub(self.start.elapsed()));
        let (old, old_epoch) = leader_of(self.daemons, self.per_group, 0).ok_or_else(|| err("group a has no leader at the kill"))?;
        let text = metrics_of(&self.daemons[old]);
        let (moved_batches_before, moved_drops_before) = (batches_of(&text, self.moved), moved_drops(&text));
        self.daemons[old].signal(libc::SIGKILL);
        let killed = Instant::now();
        loop {
            if let Some((i, e)) = leader_of(self.daemons, self.per_group, 0).filter(|&(i, e)| i != old && e > old_epoch) {
                let leads_after_ms = killed.elapsed().as_secs_f64() * 1e3;
                return Ok((applied_ms, at_apply, Some(Killed { moved_batches_before, moved_drops_before, new_leader: i, old_epoch, new_epoch: e, leads_after_ms })));
            }
            if killed.elapsed() > StdDuration::from_secs(10) {
                return Err(err("group a's standby did not lead within 10 s of the kill"));
            }
            std::thread::sleep(StdDuration::from_millis(5));
        }
    }
}
