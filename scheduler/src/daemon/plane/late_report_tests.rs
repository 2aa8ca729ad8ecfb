//! A backend lagging past the batch grace, on a virtual clock: its GPU
//! runs 2x slower than the profile, so every batch planned at profile
//! speed overruns its planned finish by more than the grace and is given
//! up before its report comes. The scheduler must still learn from those
//! late reports (speed ratio and GPU free time), and a backend that skips
//! the plans the scheduler gave up catches up.

use std::collections::{HashMap, HashSet};

use super::*;

use dataplane::wire::{Message, RemoteRef};

/// l(b) = b + 5 ms, SLO 50 ms.
fn model() -> Vec<ModelSpec> {
    vec![ModelSpec::linear("a", 1.0, 5.0, 50.0).unwrap()]
}

const BACKEND: u32 = 10;
const FRONTEND: u32 = 1;
/// Far under a 2x batch's overrun (at least l(1) = 6 ms).
const GRACE: Duration = Duration::from_millis(2);
/// The requests' budget.
const BUDGET: Duration = Duration::from_millis(40);

/// The lagging backend: one GPU running each plan, in the order sent,
/// `SLOWDOWN` times slower than the profile. With `skips`, a plan that
/// has not started by its planned end plus the grace is reported with
/// nothing run when its turn comes (what the backend's worker does).
struct Lagging {
    skips: bool,
    /// The host stalls: nothing starts in `[from, to)`.
    stall: (Instant, Instant),
    gpu_free: Instant,
    /// (when, report), in no order.
    reports: Vec<(Instant, wire::BatchDone)>,
    /// Tasks run, by id: when they finished.
    finished: HashMap<u64, Instant>,
    skipped: u64,
}

const SLOWDOWN: u64 = 2;

impl Lagging {
    fn take_plan(&mut self, now: Instant, head: &BatchPlanHead, tasks: &[u64]) {
        let exec_at = now + Duration::from_nanos(head.exec_in_ns);
        let mut start = exec_at.max(self.gpu_free);
        if start >= self.stall.0 && start < self.stall.1 {
            start = self.stall.1;
        }
        let given_up_at = exec_at + Duration::from_nanos(head.run_ns) + GRACE;
        let mut done = wire::BatchDone { batch_id: head.batch_id, gpu_id: 0, ..Default::default() };
        if self.skips && start > given_up_at {
            self.skipped += 1;
            self.reports.push((start, done));
            return;
        }
        let run = Duration::from_nanos(model()[0].profile.latency(head.count).as_nanos() * SLOWDOWN);
        let finish = start + run;
        self.gpu_free = finish;
        done.count = head.count;
        done.start_ago_ns = run.as_nanos();
        self.reports.push((finish, done));
        for &t in tasks {
            self.finished.insert(t, finish);
        }
    }

    fn next_report(&self) -> Option<Instant> {
        self.reports.iter().map(|r| r.0).min()
    }

    fn pop_report(&mut self, at: Instant) -> wire::BatchDone {
        let k = self.reports.iter().position(|r| r.0 == at).unwrap();
        self.reports.swap_remove(k).1
    }
}

/// What a run did: the ratio learned by the end, how many reports (late
/// or not) it took to reach 1.8, and the bad share of each second's
/// arrivals (failed back, dropped, or finished past the deadline).
struct Outcome {
    ratio: Ratio,
    reports_to_1_8: Option<u64>,
    bad_by_second: Vec<f64>,
    late_reports: u64,
    skipped: u64,
}

/// One task every 10 ms for `seconds` (about half of what the 2x GPU
/// serves within the SLO, in batches of 3), the host stalling 300 ms at
/// 2.5 s.
fn run(skips: bool, seconds: u64) -> Outcome {
    let metrics = Arc::new(SchedulerMetrics::new(&model()));
    let mut p = ControlPlane::new(model(), &[vec![0]], CoreConfig::default(), metrics).unwrap();
    p.set_batch_grace(GRACE);
    let t0 = Instant::ZERO;
    p.frontend_joined(FRONTEND, "fe").unwrap();
    p.backend_joined(t0, BACKEND, 1, &[0], &[]).unwrap();
    p.outbox().clear();
    let stall = (t0 + Duration::from_millis(2500), t0 + Duration::from_millis(2800));
    let mut be = Lagging { skips, stall, gpu_free: t0, reports: Vec::new(), finished: HashMap::new(), skipped: 0 };
    let (mut failed_back, mut dropped) = (HashMap::new(), HashSet::new());
    let mut arrivals: Vec<(u64, Instant)> = Vec::new();
    let (gap, end) = (Duration::from_millis(10), t0 + Duration::from_millis(1000 * seconds));
    let (mut now, mut next_task, mut reports, mut reports_to_1_8) = (t0, t0, 0u64, None);
    for _ in 0..1_000_000 {
        let arrival = Some(next_task).filter(|&t| t < end);
        let due = [arrival, p.poll_at(), p.next_expiry(), be.next_report()].into_iter().flatten().min();
        let Some(t) = due else { break };
        now = t.max(now);
        if be.next_report() == Some(t) {
            let done = be.pop_report(t);
            p.on_batch_done(now, BACKEND, &done);
            reports += 1;
            let ratio = p.gpu_ratio(BACKEND, 0).unwrap().value();
            if ratio >= 1.8 && reports_to_1_8.is_none() {
                reports_to_1_8 = Some(reports);
            }
        } else if arrival == Some(t) {
            let seq = arrivals.len() as u64;
            let id = TaskId::new(FRONTEND, 1 + seq / 256, (seq % 256) as u32).0;
            let input = RemoteRef { key: 1, len: 16, offset: 0 };
            let task = Task { task_id: id, budget_ns: BUDGET.as_nanos(), model_id: 0, frontend_id: FRONTEND, input, ..Default::default() };
            p.on_task(now, FRONTEND, &task);
            arrivals.push((id, now));
            next_task = now + gap;
        } else {
            p.expire_overdue(now);
            p.on_wake(now);
        }
        for (to, b) in p.outbox().iter() {
            match wire::decode(b).unwrap() {
                Message::BatchPlan(h, tasks) => {
                    assert_eq!(to, PeerId::Backend(BACKEND));
                    let ids: Vec<u64> = tasks.iter().map(|t| t.task_id).collect();
                    be.take_plan(now, &h, &ids);
                }
                Message::Completion(h, _) if h.status == wire::TaskStatus::Abandoned as u32 => {
                    failed_back.insert(h.task_id, now);
                }
                Message::Dropped(d) => {
                    dropped.insert(d.task_id);
                }
                _ => {}
            }
        }
        p.outbox().clear();
    }
    assert!(be.reports.is_empty() && p.batches_in_flight() == 0, "the run ends quiet");
    let mut bad_by_second = vec![(0u64, 0u64); seconds as usize];
    for &(id, at) in &arrivals {
        let second = &mut bad_by_second[(at.saturating_since(t0).as_nanos() / 1_000_000_000) as usize];
        second.0 += 1;
        // The frontend keeps the first answer: a run that finished in
        // time, unless the task was failed back or dropped before.
        let served = be.finished.get(&id).is_some_and(|&f| f <= at + BUDGET && failed_back.get(&id).is_none_or(|&fb| fb > f));
        if !served || dropped.contains(&id) {
            second.1 += 1;
        }
    }
    Outcome {
        ratio: p.gpu_ratio(BACKEND, 0).unwrap(),
        reports_to_1_8,
        bad_by_second: bad_by_second.iter().map(|&(n, bad)| bad as f64 / n.max(1) as f64).collect(),
        late_reports: p.metrics().late_batch_reports.get(),
        skipped: be.skipped,
    }
}

#[test]
fn a_backend_lagging_past_the_grace_is_learned_from_and_catches_up() {
    let o = run(true, 5);
    let no_skips = run(false, 5);
    for (name, o) in [("skips", &o), ("runs every plan", &no_skips)] {
        eprintln!(
            "{name}: ratio {:.3} ({} samples), 1.8 after {:?} reports, late reports {}, skipped {}, bad by second {:?}",
            o.ratio.value(),
            o.ratio.samples(),
            o.reports_to_1_8,
            o.late_reports,
            o.skipped,
            o.bad_by_second
        );
    }
    // Every early batch overran the grace: the loop learned from reports
    // of batches already given up, and the speed within a few of them.
    assert!(o.late_reports >= 5, "{}", o.late_reports);
    assert!(o.reports_to_1_8.is_some_and(|n| n <= 16), "{:?}", o.reports_to_1_8);
    assert!((o.ratio.value() - 2.0).abs() < 0.05, "{:?}", o.ratio);
    // Planned at the learned speed, the second before the stall is served.
    assert!(o.bad_by_second[0] > 0.02, "the first second lags: {:?}", o.bad_by_second);
    assert!(o.bad_by_second[1] <= 0.01, "{:?}", o.bad_by_second);
    // The stall: the plans it held past their grace are skipped, not run
    // late, and the second after it is served again.
    assert!(o.skipped >= 1, "{}", o.skipped);
    assert_eq!(no_skips.skipped, 0);
    assert!(o.bad_by_second[3] <= 0.01 && o.bad_by_second[4] <= 0.01, "{:?}", o.bad_by_second);
    assert!(o.bad_by_second[2] <= no_skips.bad_by_second[2], "{:?} {:?}", o.bad_by_second, no_skips.bad_by_second);
}
