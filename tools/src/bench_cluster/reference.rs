//! The in-process reference of `bench-cluster` (issue 50 item 2): the
//! runtime of `bench-scheduler` on the same workload, with a thread layout
//! this host can carry, and the comparison with the daemon. A side
//! "held" when its bad rate is at most [`HELD_BAD_RATE`]; the ratio
//! daemon / reference is reported only when the reference held at the
//! offered rate. A reference that did not hold is also run at halved rates
//! (bounded) until one holds: its own maximum, stated as such.

use scheduler::runtime::LiveReport;

use super::{BenchClusterArgs, BenchClusterError};

/// A side held the offered rate: bad rate (drops, late, unplanned) at most this.
pub const HELD_BAD_RATE: f64 = 0.01;

/// Halvings of the rate tried when the reference does not hold the offered one.
const MAX_HALVINGS: u32 = 6;
/// Seconds per run of that search.
const SEARCH_RUN_S: f64 = 2.0;

/// How the reference's threads are laid out.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ReferenceLayout {
    /// ModelThreads of the runtime (the RankThread, load generator and
    /// emulated GPUs share one more thread).
    pub model_threads: usize,
    /// Threads pinned to cores.
    pub pin: bool,
    /// The threads' idle strategy.
    pub idle: &'static str,
}

impl ReferenceLayout {
    /// For a host of `cores` CPUs and `models` models: a ModelThread per
    /// core but the one the RankThread's thread takes (at most one per
    /// model, and 1 at least), pinned and spinning when every thread has a
    /// core, parking and unpinned when they share (a spinning thread that
    /// shares its core takes its neighbour's time slice).
    pub fn for_host(cores: usize, models: usize) -> Self {
        let model_threads = cores.saturating_sub(1).clamp(1, models.max(1));
        let own_cores = cores > model_threads;
        ReferenceLayout { model_threads, pin: own_cores, idle: if own_cores { "spin" } else { "park" } }
    }

    fn bench_args(&self, a: &BenchClusterArgs, gpus: u32, duration_s: f64) -> crate::bench::BenchArgs {
        crate::bench::BenchArgs {
            models: a.models as usize,
            gpus,
            model_threads: self.model_threads,
            rate: String::new(),
            duration_s,
            profile: a.profile.clone(),
            idle: self.idle.into(),
            pin: self.pin,
            seed: a.seed,
            json: false,
        }
    }
}

/// One side's headline: on-time tasks per second and the bad rate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Side {
    pub tasks_per_s: f64,
    pub bad_rate: f64,
}

impl Side {
    /// The bad rate is within [`HELD_BAD_RATE`] (a NaN never holds).
    pub fn held(self) -> bool {
        self.bad_rate <= HELD_BAD_RATE
    }
}

/// The reference's runs.
pub struct Reference {
    pub layout: ReferenceLayout,
    /// The run at the offered rate.
    pub at_offered: LiveReport,
    /// When that did not hold: the highest halved rate that held, and its
    /// on-time tasks/s (None: none held, or not searched).
    pub max_held: Option<(f64, f64)>,
    /// Every run of that search: (offered rate, bad rate).
    pub search: Vec<(f64, f64)>,
}

impl Reference {
    pub fn side(&self) -> Side {
        Side { tasks_per_s: self.at_offered.goodput_rps, bad_rate: self.at_offered.bad_rate }
    }
}

/// Runs the reference on `a`'s workload at `offered` tasks/s for
/// `duration_s`, then, if it did not hold, at halved rates until one holds.
pub fn run(a: &BenchClusterArgs, gpus: u32, duration_s: f64, offered: f64) -> Result<Reference, BenchClusterError> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let layout = ReferenceLayout::for_host(cores, a.models as usize);
    let at_offered = crate::bench::live_report(&layout.bench_args(a, gpus, duration_s), offered)?;
    let mut reference = Reference { layout, at_offered, max_held: None, search: Vec::new() };
    if reference.side().held() {
        return Ok(reference);
    }
    let short = reference.layout.bench_args(a, gpus, SEARCH_RUN_S.min(duration_s));
    let mut rate = offered;
    for _ in 0..MAX_HALVINGS {
        rate /= 2.0;
        let r = crate::bench::live_report(&short, rate)?;
        reference.search.push((rate, r.bad_rate));
        if (Side { tasks_per_s: r.goodput_rps, bad_rate: r.bad_rate }).held() {
            reference.max_held = Some((rate, r.goodput_rps));
            break;
        }
    }
    Ok(reference)
}

/// daemon / reference on-time tasks/s, only when the reference held.
pub fn ratio(daemon: Side, reference: Side) -> Option<f64> {
    (reference.held() && reference.tasks_per_s > 0.0).then(|| daemon.tasks_per_s / reference.tasks_per_s)
}

/// The comparison's JSON fields: `held`, `in_process_held`,
/// `in_process_tasks_per_s`, `in_process_layout`, `in_process_max_held`
/// and `ratio` (absent unless the reference held).
pub fn comparison_json(daemon: Side, r: &Reference) -> serde_json::Map<String, serde_json::Value> {
    let reference = r.side();
    let mut m = serde_json::Map::new();
    m.insert("held".into(), daemon.held().into());
    m.insert("in_process_held".into(), reference.held().into());
    m.insert("in_process_tasks_per_s".into(), reference.tasks_per_s.into());
    m.insert("in_process_bad_rate".into(), reference.bad_rate.into());
    m.insert("in_process_layout".into(), serde_json::json!(r.layout));
    m.insert(
        "in_process_max_held".into(),
        serde_json::json!({
            "offered_rps": r.max_held.map(|(rate, _)| rate),
            "tasks_per_s": r.max_held.map(|(_, t)| t),
            "search": r.search,
        }),
    );
    if let Some(x) = ratio(daemon, reference) {
        m.insert("ratio".into(), x.into());
    }
    m
}

/// The comparison in words (one line).
pub fn comparison_text(daemon: Side, r: &Reference) -> String {
    let reference = r.side();
    let l = &r.layout;
    let mut s = format!(
        "in-process runtime, same workload ({} ModelThread(s), {}, idle {}): {:.0} tasks/s on time, bad {:.3}%; ",
        l.model_threads,
        if l.pin { "pinned" } else { "unpinned" },
        l.idle,
        reference.tasks_per_s,
        reference.bad_rate * 100.0
    );
    match ratio(daemon, reference) {
        Some(x) => s.push_str(&format!("held; ratio {x:.3}")),
        None => {
            s.push_str("did NOT hold the offered rate, so no ratio");
            match r.max_held {
                Some((rate, t)) => s.push_str(&format!("; its maximum here: held {rate:.0} offered ({t:.0} on time)")),
                None => s.push_str(&format!("; held none of {} halved rates", r.search.len())),
            }
        }
    }
    s.push_str(&format!("; daemon {}", if daemon.held() { "held" } else { "did NOT hold" }));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real (10 ms) run's report with the two fields the comparison
    /// reads set to `goodput_rps` and `bad_rate`.
    fn live(goodput_rps: f64, bad_rate: f64) -> LiveReport {
        let mut r = base_report();
        r.goodput_rps = goodput_rps;
        r.bad_rate = bad_rate;
        r
    }

    fn base_report() -> LiveReport {
        let a = crate::bench::BenchArgs {
            models: 1,
            gpus: 1,
            model_threads: 1,
            rate: String::new(),
            duration_s: 0.01,
            profile: "0.1,5,50".into(),
            idle: "park".into(),
            pin: false,
            seed: 1,
            json: false,
        };
        crate::bench::live_report(&a, 100.0).unwrap_or_else(|e| panic!("a 10 ms run of the runtime: {e}"))
    }

    fn reference(goodput_rps: f64, bad_rate: f64, max_held: Option<(f64, f64)>) -> Reference {
        Reference { layout: ReferenceLayout::for_host(2, 20), at_offered: live(goodput_rps, bad_rate), max_held, search: vec![(500_000.0, 0.5), (250_000.0, 0.004)] }
    }

    #[test]
    fn a_collapsed_reference_prints_no_ratio() {
        // The figures of the issue: the reference at 0.99 bad, 9,897 tasks/s.
        let daemon = Side { tasks_per_s: 1_050_000.0, bad_rate: 0.45 };
        let r = reference(9_897.0, 0.99, Some((250_000.0, 249_000.0)));
        let json = comparison_json(daemon, &r);
        assert!(!json.contains_key("ratio"), "{json:?}");
        assert_eq!(json["in_process_held"], false);
        assert_eq!(json["held"], false);
        assert_eq!(json["in_process_max_held"]["offered_rps"], 250_000.0);
        let text = comparison_text(daemon, &r);
        assert!(!text.contains("ratio "), "{text}");
        assert!(text.contains("did NOT hold the offered rate") && text.contains("held 250000 offered"), "{text}");
        assert_eq!(ratio(daemon, r.side()), None);
        // Not even NaN or a bad rate just over the bound gives one.
        assert_eq!(ratio(daemon, Side { tasks_per_s: 1e6, bad_rate: f64::NAN }), None);
        assert_eq!(ratio(daemon, Side { tasks_per_s: 1e6, bad_rate: 0.0101 }), None);
    }

    #[test]
    fn a_reference_that_held_gives_the_ratio() {
        let daemon = Side { tasks_per_s: 990_000.0, bad_rate: 0.005 };
        let r = reference(1_000_000.0, 0.002, None);
        let json = comparison_json(daemon, &r);
        assert_eq!(json["ratio"], 0.99);
        assert_eq!((json["held"].as_bool(), json["in_process_held"].as_bool()), (Some(true), Some(true)));
        assert!(comparison_text(daemon, &r).contains("held; ratio 0.990; daemon held"));
    }

    #[test]
    fn the_layout_gives_each_thread_a_core_when_it_can() {
        assert_eq!(ReferenceLayout::for_host(2, 20), ReferenceLayout { model_threads: 1, pin: true, idle: "spin" });
        assert_eq!(ReferenceLayout::for_host(1, 20), ReferenceLayout { model_threads: 1, pin: false, idle: "park" });
        assert_eq!(ReferenceLayout::for_host(16, 20).model_threads, 15);
        assert_eq!(ReferenceLayout::for_host(64, 20).model_threads, 20);
    }
}
