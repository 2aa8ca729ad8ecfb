//! `symphony up --ha`: the local cluster with hot-standby schedulers
//! elected through a local etcd (issue 18). It offers a steady HTTP load,
//! SIGKILLs the leading scheduler (or, with `--kill-target random`, any
//! scheduler) after `--kill-leader-after-s` (and again every
//! `--kill-every-s` for `--kills` kills; each killed scheduler comes back
//! as a standby), and prints for each kill the takeover time, then
//! goodput in 250 ms bins and the accounting.
//!
//! Takeover is measured from the kill (CLOCK_MONOTONIC of this process)
//! to the first batch the new leader plans (its
//! `symphony_scheduler_term_first_plan_host_ns`, the same clock): the old
//! leader plans under load up to its death, so this bounds "last plan of
//! the old leader to first plan of the new" from above.
//!
//! The load has uniform gaps (not Poisson), so that every bin offers the
//! same number of requests and a bin's goodput shows the failover rather
//! than arrival noise.

use std::time::{Duration as StdDuration, Instant as StdInstant};

use dataplane::control::metric;
use dataplane::time::MonotonicClock;
use frontend::loadgen::{self, LoadReport, BIN};
use scheduler::sim::workload::Arrival;
use scheduler::zoo::ModelSpec;
use tools::cluster::{ClusterSpec, LocalCluster};
use tracing::{info, warn};

use crate::up::{run_err, sim_goodput, ClusterOpts, UpError};

/// The options of `up --ha`.
#[derive(clap::Args, Clone, Debug)]
pub struct HaOpts {
    /// Hot standby: several schedulers elected through a local etcd; the
    /// leader is killed under load (see --kill-leader-after-s).
    #[arg(long)]
    pub ha: bool,
    /// Schedulers with --ha (2 or 3).
    #[arg(long, default_value_t = 2)]
    pub schedulers: u32,
    /// Members of the local etcd with --ha (1 or 3).
    #[arg(long = "etcd-members", default_value_t = 1)]
    pub etcd_members: u32,
    /// SIGKILL the leading scheduler this long into the load.
    #[arg(long = "kill-leader-after-s", default_value_t = 3.0)]
    pub kill_after_s: f64,
    /// Kills in all (each killed scheduler restarts as a standby).
    #[arg(long, default_value_t = 1)]
    pub kills: u32,
    /// Seconds between kills.
    #[arg(long = "kill-every-s", default_value_t = 3.0)]
    pub kill_every_s: f64,
    /// Which scheduler each kill hits: the leader, or one drawn at random
    /// among all of them (seeded by --seed; a standby's death must change
    /// nothing).
    #[arg(long = "kill-target", value_enum, default_value_t = KillTarget::Leader)]
    pub kill_target: KillTarget,
}

/// `--kill-target`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum KillTarget {
    /// The leading scheduler.
    Leader,
    /// Any scheduler, drawn at random.
    Random,
}

/// One kill and the takeover after it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Takeover {
    /// Seconds into the load.
    pub at_s: f64,
    /// The scheduler killed (0-based) and its term.
    pub killed: usize,
    pub old_epoch: u64,
    /// The new leader and its term.
    pub leader: usize,
    pub new_epoch: u64,
    /// Kill to the new leader's first planned batch, ms.
    pub takeover_ms: f64,
}

/// Runs `up --ha` (see the module docs).
pub fn run(models_sel: &str, o: &ClusterOpts, ha: &HaOpts, load: f64, rate: Option<f64>, duration_s: f64, json: bool) -> Result<(), UpError> {
    node_shell::logging::init(&o.log);
    if !(2..=3).contains(&ha.schedulers) || !(ha.etcd_members == 1 || ha.etcd_members == 3) {
        return Err(UpError::Usage("--ha wants --schedulers 2 or 3 and --etcd-members 1 or 3".into()));
    }
    let last_kill = ha.kill_after_s + f64::from(ha.kills.saturating_sub(1)) * ha.kill_every_s;
    if ha.kills == 0 || !(ha.kill_after_s >= 2.0 && ha.kill_every_s >= 1.0 && last_kill + 2.5 <= duration_s) {
        return Err(UpError::Usage(
            "--ha: need --kills >= 1, --kill-leader-after-s >= 2 (the 2 s before a kill are its baseline), --kill-every-s >= 1, and --duration-s at least 2.5 s past the last kill".into(),
        ));
    }
    let models = scheduler::zoo::cluster_models(&o.zoo, models_sel, &o.extra)?;
    let mut spec = crate::up::spec(models_sel, o)?;
    spec.schedulers = ha.schedulers;
    spec.etcd_members = ha.etcd_members;
    dataplane::control::install_stop_signals()?;
    crate::up::with_logs(&spec, || run_with(&spec, &models, o, ha, load, rate, duration_s, json))
}

#[allow(clippy::too_many_arguments)]
fn run_with(spec: &ClusterSpec, models: &[ModelSpec], o: &ClusterOpts, ha: &HaOpts, load: f64, rate: Option<f64>, duration_s: f64, json: bool) -> Result<(), UpError> {
    info!(schedulers = ha.schedulers, etcd_members = ha.etcd_members, transport = %o.transport.name(), "starting a local cluster with hot-standby schedulers");
    let mut cluster = LocalCluster::start(spec).map_err(run_err)?;
    let gpus = o.backends * o.gpus_per_backend;
    let rate = match rate {
        Some(r) => r,
        None => sim_goodput(models, gpus, o.seed)? * load,
    };
    let mut cfg = tools::cluster::load_config(models, cluster.http_addrs().map_err(run_err)?, rate, duration_s, o.seed);
    cfg.workload.arrival = Arrival::Uniform;
    info!(rate_rps = rate, duration_s, kills = ha.kills, "offering load over HTTP");
    let load_thread = std::thread::Builder::new()
        .name("up-load".into())
        .spawn(move || -> Result<LoadReport, String> {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().map_err(|e| e.to_string())?;
            rt.block_on(loadgen::run(cfg)).map_err(|e| e.to_string())
        })
        .map_err(run_err)?;
    let clock = MonotonicClock::new();
    let start = StdInstant::now();
    let mut takeovers = Vec::new();
    let mut draw = o.seed ^ 0x9E37_79B9_7F4A_7C15;
    for k in 0..ha.kills {
        let at = ha.kill_after_s + f64::from(k) * ha.kill_every_s;
        sleep_until(start + StdDuration::from_secs_f64(at));
        let target = match ha.kill_target {
            KillTarget::Leader => None,
            KillTarget::Random => {
                // xorshift64: a fixed sequence per seed.
                draw ^= draw << 13;
                draw ^= draw >> 7;
                draw ^= draw << 17;
                Some((draw % u64::from(ha.schedulers)) as usize)
            }
        };
        takeovers.push(kill_scheduler(&mut cluster, spec, &clock, start, target)?);
    }
    let report = load_thread.join().map_err(|_| run_err("the load thread panicked"))?.map_err(run_err)?;
    let outcomes = cluster.frontend_outcomes();
    let stopped = cluster.stop().map_err(run_err);
    let summary = Summary::new(&report, &outcomes, &takeovers, ha, rate);
    if json {
        println!("{}", serde_json::to_string_pretty(&summary.json()).map_err(run_err)?);
    } else {
        summary.print();
    }
    stopped?;
    if summary.unaccounted > 0 || report.wrong_id > 0 || report.wrong_output > 0 {
        return Err(UpError::Check);
    }
    Ok(())
}

fn sleep_until(t: StdInstant) {
    let now = StdInstant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

fn host_ns(clock: &MonotonicClock) -> u64 {
    clock.origin_host_ns().saturating_add(clock.now().as_nanos())
}

/// SIGKILLs scheduler `target` (`None`: the leader); if it led, waits for
/// the next leader's first plan; restarts the killed one as a standby.
fn kill_scheduler(cluster: &mut LocalCluster, spec: &ClusterSpec, clock: &MonotonicClock, start: StdInstant, target: Option<usize>) -> Result<Takeover, UpError> {
    let (leading, old_epoch) = cluster.leader_index().ok_or_else(|| run_err("no scheduler leads at the kill"))?;
    let killed = target.unwrap_or(leading);
    let at_s = start.elapsed().as_secs_f64();
    let kill_ns = host_ns(clock);
    if let Some(d) = cluster.scheduler_mut(killed) {
        d.kill();
    }
    if killed != leading {
        warn!(scheduler = killed, at_s, "killed a standby scheduler (SIGKILL)");
        std::thread::sleep(StdDuration::from_millis(300));
        let still = cluster.leader_index();
        cluster.respawn_scheduler(killed, spec).map_err(run_err)?;
        if still != Some((leading, old_epoch)) {
            return Err(run_err(format!("a standby's death moved the leadership: {still:?}")));
        }
        return Ok(Takeover { at_s, killed, old_epoch, leader: leading, new_epoch: old_epoch, takeover_ms: 0.0 });
    }
    warn!(scheduler = killed, epoch = old_epoch, at_s, "killed the leading scheduler (SIGKILL)");
    let deadline = StdInstant::now() + StdDuration::from_secs(10);
    let (leader, new_epoch, first_ns) = loop {
        if let Some((i, e)) = cluster.leader_index().filter(|(_, e)| *e > old_epoch) {
            let first = cluster
                .schedulers()
                .nth(i)
                .and_then(|d| d.metrics().ok())
                .and_then(|m| metric(&m, "symphony_scheduler_term_first_plan_host_ns"))
                .unwrap_or(0.0) as u64;
            if first > 0 {
                break (i, e, first);
            }
        }
        if StdInstant::now() >= deadline {
            return Err(run_err("no scheduler planned a batch within 10 s of the kill"));
        }
        std::thread::sleep(StdDuration::from_millis(5));
    };
    let takeover_ms = first_ns.saturating_sub(kill_ns) as f64 / 1e6;
    info!(leader, epoch = new_epoch, takeover_ms, "the new leader planned its first batch");
    cluster.respawn_scheduler(killed, spec).map_err(run_err)?;
    Ok(Takeover { at_s, killed, old_epoch, leader, new_epoch, takeover_ms })
}

/// What `up --ha` prints.
struct Summary {
    rate: f64,
    bins: Vec<(f64, u64, u64)>,
    takeovers: Vec<Takeover>,
    /// Per kill: mean goodput of the 2 s before it, and the smallest bin
    /// ratio from 2 s after it to the next kill (or the end).
    windows: Vec<(f64, f64)>,
    unaccounted: u64,
    report: LoadReport,
}

impl Summary {
    fn new(report: &LoadReport, outcomes: &[[f64; 4]], takeovers: &[Takeover], ha: &HaOpts, rate: f64) -> Summary {
        let bin_s = BIN.as_nanos() as f64 / 1e9;
        let bins: Vec<(f64, u64, u64)> = report.bins.iter().enumerate().map(|(i, b)| (i as f64 * bin_s, b.sent, b.ok)).collect();
        let kills: Vec<f64> = (0..ha.kills).map(|k| ha.kill_after_s + f64::from(k) * ha.kill_every_s).collect();
        // Whole bins only: the last one may be cut by the end of the load.
        let full = bins.len().saturating_sub(1);
        let rps = |b: &(f64, u64, u64)| b.2 as f64 / bin_s;
        let windows = kills
            .iter()
            .enumerate()
            .map(|(k, &t)| {
                let before: Vec<f64> = bins[..full].iter().filter(|b| b.0 >= t - 2.0 && b.0 + bin_s <= t).map(rps).collect();
                let mean = before.iter().sum::<f64>() / before.len().max(1) as f64;
                let until = kills.get(k + 1).copied().unwrap_or(f64::INFINITY);
                let after = bins[..full]
                    .iter()
                    .filter(|b| b.0 >= t + 2.0 && b.0 + bin_s <= until)
                    .map(|b| if mean > 0.0 { rps(b) / mean } else { 0.0 })
                    .fold(f64::INFINITY, f64::min);
                (mean, after)
            })
            .collect();
        let classified = report.ok
            + report.late
            + report.wrong_output
            + report.wrong_id
            + report.unavailable
            + report.client_errors
            + report.server_errors
            + report.transport_errors;
        let frontends: f64 = outcomes.iter().map(|o| (o[0] - o[1] - o[2] - o[3]).abs()).filter(|d| d.is_finite()).sum();
        let unaccounted = report.sent.abs_diff(classified) + frontends as u64;
        Summary { rate, bins, takeovers: takeovers.to_vec(), windows, unaccounted, report: report.clone() }
    }

    fn json(&self) -> serde_json::Value {
        let r = &self.report;
        serde_json::json!({
            "offered_rps": self.rate,
            "takeover_ms": self.takeovers.iter().map(|t| t.takeover_ms).fold(0.0, f64::max),
            "takeovers": self.takeovers,
            "unaccounted": self.unaccounted,
            "bins": self.bins.iter().map(|(t, sent, ok)| serde_json::json!({ "t_s": t, "sent": sent, "ok": ok })).collect::<Vec<_>>(),
            "before_goodput_rps": self.windows.iter().map(|w| w.0).collect::<Vec<_>>(),
            "after_min_ratio": self.windows.iter().map(|w| w.1).fold(f64::INFINITY, f64::min),
            "sent": r.sent, "ok": r.ok, "late": r.late, "unavailable": r.unavailable,
            "server_errors": r.server_errors, "transport_errors": r.transport_errors,
            "wrong_output": r.wrong_output, "wrong_id": r.wrong_id,
        })
    }

    fn print(&self) {
        println!("up --ha: {:.0} rps offered (uniform gaps), {} kill(s) of the leading scheduler", self.rate, self.takeovers.len());
        for (t, (before, after)) in self.takeovers.iter().zip(&self.windows) {
            if t.new_epoch == t.old_epoch {
                println!(
                    "  kill at {:.2} s: standby scheduler {}; scheduler {} led on (epoch {}); goodput 2 s before {:.0} rps, lowest 250 ms bin from 2 s after: {:.3} of it",
                    t.at_s, t.killed, t.leader, t.old_epoch, before, after
                );
                continue;
            }
            println!(
                "  kill at {:.2} s: leader scheduler {} (epoch {}) -> scheduler {} (epoch {}), takeover {:.1} ms (kill to first plan); goodput 2 s before {:.0} rps, lowest 250 ms bin from 2 s after: {:.3} of it",
                t.at_s, t.killed, t.old_epoch, t.leader, t.new_epoch, t.takeover_ms, before, after
            );
        }
        let line: Vec<String> = self.bins.iter().map(|(t, sent, ok)| format!("{t:.2}:{ok}/{sent}")).collect();
        println!("  bins (start s: ok/sent): {}", line.join(" "));
        println!("  accounting: {} (unaccounted {})", self.report, self.unaccounted);
    }
}
