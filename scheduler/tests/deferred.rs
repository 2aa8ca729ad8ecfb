//! Deferred scheduling: the paper's worked example, the window rule, the
//! network delay, and the acceptance goodputs (all on the virtual clock).

use dataplane::time::{Duration, Instant};
use scheduler::baselines::EagerScheduler;
use scheduler::deferred::{CoreConfig, DeferredScheduler, Gather};
use scheduler::goodput::{search, GoodputSearch};
use scheduler::netdelay::NetworkDelay;
use scheduler::policy::{PolicyConfig, PolicyKind};
use scheduler::sim::{simulate, simulate_observed, BatchObserver, SimConfig, Workload};
use scheduler::types::{GpuId, Request};
use scheduler::zoo::ModelSpec;

#[derive(Default)]
struct Log(Vec<(f64, GpuId, f64, Vec<u64>)>);
impl BatchObserver for Log {
    fn on_batch(&mut self, now: Instant, gpu: GpuId, _m: u32, exec_at: Instant, members: &[Request]) {
        self.0.push((now.as_millis_f64(), gpu, exec_at.as_millis_f64(), members.iter().map(|r| r.id + 1).collect()));
    }
}

fn example_trace(skip: &[u64], n: u64) -> Vec<(Instant, u32)> {
    (1..=n).filter(|i| !skip.contains(i)).map(|i| (Instant::from_nanos((i - 1) * 750_000), 0)).collect()
}

fn example_cfg(trace: Vec<(Instant, u32)>) -> SimConfig {
    SimConfig {
        models: vec![ModelSpec::linear("ex", 1.0, 5.0, 12.0).unwrap()],
        gpus: 3,
        workload: Workload::poisson(0.0),
        duration: Duration::from_millis(60),
        warmup: Duration::ZERO,
        seed: 0,
        trace: Some(trace),
        admission: Default::default(),
    }
}

#[test]
fn worked_example_forms_the_staggered_pattern() {
    let cfg = example_cfg(example_trace(&[], 36));
    let mut s = DeferredScheduler::new(&cfg.models, 3, CoreConfig { gather: Gather::Lazy, ..CoreConfig::default() });
    let mut log = Log::default();
    let r = simulate_observed(&cfg, &mut s, &mut log).unwrap();
    assert_eq!(r.dropped, 0);
    // Section 3.3: at t = 2.25, R4 arrives; frontrun of R1's batch is 2 and
    // latest 3, so R1-R4 go to a GPU. Then every 3 time units, batches of 4,
    // round robin over the three GPUs.
    for (k, (decided, gpu, exec, ids)) in log.0.iter().take(9).enumerate() {
        let k = k as u64;
        assert_eq!(*decided, 2.25 + 3.0 * k as f64, "batch {k}");
        assert_eq!(*exec, *decided);
        assert_eq!(*gpu, (k % 3) as GpuId);
        assert_eq!(ids, &(4 * k + 1..=4 * k + 4).collect::<Vec<_>>());
    }
}

#[test]
fn worked_example_recovers_after_missing_requests_while_eager_collapses() {
    let trace = example_trace(&[13, 14, 15], 60);
    let mut deferred = DeferredScheduler::new(&[ModelSpec::linear("ex", 1.0, 5.0, 12.0).unwrap()], 3, CoreConfig { gather: Gather::Lazy, ..CoreConfig::default() });
    let mut log = Log::default();
    let d = simulate_observed(&example_cfg(trace.clone()), &mut deferred, &mut log).unwrap();
    assert_eq!(d.dropped, 0, "deferred drops nothing");
    // After the gap it settles back into batches of four.
    assert!(log.0.iter().skip(3).take(8).all(|b| b.3.len() == 4), "{:?}", log.0);
    let mut eager = EagerScheduler::eager(&[ModelSpec::linear("ex", 1.0, 5.0, 12.0).unwrap()], 3, NetworkDelay::ZERO);
    let e = simulate(&example_cfg(trace), &mut eager).unwrap();
    // 18 with batches sized by the head alone, 8 since eager skips heads
    // where batching pays (docs/decisions.md, "Eager").
    assert!(e.dropped > 0, "eager drops where deferred drops none: {}", e.dropped);
}

fn resnet50() -> ModelSpec {
    ModelSpec::linear("ResNet50", 1.053, 5.072, 25.0).unwrap()
}

fn single(m: ModelSpec, gpus: u32, rate: f64) -> SimConfig {
    SimConfig {
        models: vec![m],
        gpus,
        workload: Workload::poisson(rate),
        duration: Duration::from_millis(30_000),
        warmup: Duration::from_millis(2_000),
        seed: 1,
        trace: None,
        admission: Default::default(),
    }
}

#[test]
fn acceptance_goodputs_of_table2() {
    let p = PolicyConfig::new(PolicyKind::Deferred);
    let g = search(&single(resnet50(), 8, 0.0), &p, &GoodputSearch::default(), &mut |_, _, _, _| {}).unwrap();
    assert!(g.goodput_rps >= 5000.0 && g.goodput_rps <= 5994.0, "ResNet50 {}", g.goodput_rps);
    let irv2 = ModelSpec::linear("InceptionResNetV2", 5.090, 18.368, 70.0).unwrap();
    let g = search(&single(irv2, 8, 0.0), &p, &GoodputSearch::default(), &mut |_, _, _, _| {}).unwrap();
    assert!(g.goodput_rps >= 830.0 && g.goodput_rps <= 1083.0, "InceptionResNetV2 {}", g.goodput_rps);
}

#[test]
fn deferred_gpu_use_is_load_proportional() {
    let p = PolicyConfig::new(PolicyKind::Deferred);
    let g = search(&single(resnet50(), 8, 0.0), &p, &GoodputSearch::default(), &mut |_, _, _, _| {}).unwrap();
    let cfg = single(resnet50(), 8, g.goodput_rps / 2.0);
    let mut s = scheduler::policy::build(&cfg.models, 8, &p).unwrap();
    let r = simulate(&cfg, s.as_mut()).unwrap();
    assert!(r.gpu_idle_fraction >= 0.45, "idle {}", r.gpu_idle_fraction);
    assert!(r.bad_rate <= 0.01);
    // Low GPU ids do the work; the highest ones stay (almost) idle, which is
    // what lets an autoscaler release them.
    let busy = &r.gpu_busy_fraction;
    assert!(busy[0] > busy[7] + 0.3, "{busy:?}");
    assert!(r.autoscale.remove_gpus >= 3.0, "{:?}", r.autoscale);
}

#[test]
fn with_many_gpus_idle_a_batch_grows_to_what_its_deadline_allows() {
    // Half of Table 2's load: at 2704 rps a ResNet50 batch of 14 fills
    // (13 gaps of 0.37 ms) and runs (19.8 ms) within the 25 ms SLO; the
    // rate's target says 13 or 14 as the estimate moves. Stopping at the
    // target's efficiency gave batches of 13 and 51.3% idle (deferred item
    // 30); with three GPUs idle the batch defers to its deadline.
    let cfg = single(resnet50(), 8, 2704.0);
    let mut s = scheduler::policy::build(&cfg.models, 8, &PolicyConfig::new(PolicyKind::Deferred)).unwrap();
    let r = simulate(&cfg, s.as_mut()).unwrap();
    assert_eq!(r.median_batch, 14);
    assert!(r.gpu_idle_fraction >= 0.52, "idle {}", r.gpu_idle_fraction);
    assert!(r.bad_rate <= 0.001, "bad {}", r.bad_rate);
}

#[test]
fn on_a_saturated_cluster_one_model_does_not_take_the_losses_alone() {
    // A100 ResNet50 + VGG16 on 2 GPUs at 50 ms, Poisson, at the goodput
    // (the grid's lowest cell, 2026-11-27): early drop, judged against each
    // model's own target batch, fell almost all on ResNet50 (1.77% against
    // 0.04% over 20 s) until a model losing more than twice every other
    // model's share early-drops less (deferred item 27).
    let models = vec![ModelSpec::linear("ResNet50", 0.268, 5.172, 50.0).unwrap(), ModelSpec::linear("VGG16", 0.660, 2.252, 50.0).unwrap()];
    let cfg = SimConfig { models, gpus: 2, workload: Workload::poisson(3520.0), duration: Duration::from_millis(20_000), warmup: Duration::from_millis(1_000), seed: 1, trace: None, admission: Default::default() };
    let mut s = scheduler::policy::build(&cfg.models, 2, &PolicyConfig::new(PolicyKind::Deferred)).unwrap();
    let r = simulate(&cfg, s.as_mut()).unwrap();
    let [r50, vgg] = [&r.models[0], &r.models[1]];
    assert!(r.max_model_bad_rate <= 0.01, "{} / {}", r50.bad_rate, vgg.bad_rate);
    assert!(r50.bad_rate <= 5.0 * vgg.bad_rate, "{} / {}", r50.bad_rate, vgg.bad_rate);
}

#[test]
fn a_model_holding_out_for_its_pair_leaves_gpus_to_the_model_taking_the_losses() {
    // 1080Ti ResNet50 + MobileNet + Xception + EfficientNetB0 on 2 GPUs at
    // 15 ms, Gamma(0.2), near the goodput (the grid's lowest cell,
    // 2026-11-27): Xception takes the losses (about 1% against 0.2% and
    // less), and ResNet50 and EfficientNetB0, pair-locked, held their lone
    // requests to the frontrun, taking both GPUs late when Xception's next
    // burst came. While another model takes the losses alone they wait
    // only while a partner is fairly likely (deferred item 28); Xception
    // then loses less than under the timeout policy at its searched `k`.
    let models = [("ResNet50", 2.050, 5.378), ("MobileNet", 1.009, 2.390), ("Xception", 4.751, 2.046), ("EfficientNetB0", 1.569, 5.586)];
    xception_loses_less_than_under_timeout(&models, 2, 12.0, 20_000, &[2.25, 0.75, 0.75, 0.75]);
}

#[test]
fn a_gpu_the_most_urgent_batch_can_spare_goes_to_the_model_taking_the_losses() {
    // 1080Ti ResNet50 + MobileNet + Xception on 8 GPUs at 15 ms,
    // Gamma(0.2), near the goodput (the grid's lowest cell, 2026-11-28):
    // Xception takes the losses (about 1.1% against ResNet50's 0.5%) and
    // loses them in bursts that the cluster's GPUs cannot all take in
    // time. Where the most urgent candidate can still start on the next
    // GPU to free, a candidate of the model taking the losses alone takes
    // this one (deferred item 29); the cell's worst bad rate is then below
    // the timeout policy's at its searched `k` (0.75 ms) on each seed.
    let models = [("ResNet50", 2.050, 5.378), ("MobileNet", 1.009, 2.390), ("Xception", 4.751, 2.046)];
    xception_loses_less_than_under_timeout(&models, 8, 885.0, 300, &[0.75; 3]);
}

/// 1080Ti `models` (name, alpha, beta) at 15 ms on `gpus` GPUs, Gamma(0.2)
/// at `rate` for `secs` simulated seconds, seeds 1-3: under deferred
/// scheduling Xception (model 2) takes the worst bad rate, and that rate is
/// below the timeout policy's worst at `timeouts_ms`.
fn xception_loses_less_than_under_timeout(models: &[(&str, f64, f64)], gpus: u32, rate: f64, secs: u64, timeouts_ms: &[f64]) {
    let models: Vec<ModelSpec> = models.iter().map(|(name, alpha, beta)| ModelSpec::linear(name, *alpha, *beta, 15.0).unwrap()).collect();
    let timeout = PolicyConfig { timeouts: timeouts_ms.iter().map(|k| Duration::from_millis_f64(*k)).collect(), ..PolicyConfig::new(PolicyKind::Timeout) };
    for seed in 1..=3 {
        let workload = Workload { arrival: scheduler::sim::Arrival::Gamma(0.2), ..Workload::poisson(rate) };
        let cfg = SimConfig { models: models.clone(), gpus, workload, duration: Duration::from_millis(secs * 1000), warmup: Duration::from_millis(1_000), seed, trace: None, admission: Default::default() };
        let run = |policy: &PolicyConfig| {
            let mut s = scheduler::policy::build(&cfg.models, gpus, policy).unwrap();
            let r = simulate(&cfg, s.as_mut()).unwrap();
            (r.max_model_bad_rate, r.models[2].bad_rate)
        };
        let (deferred, deferred_xception) = run(&PolicyConfig::new(PolicyKind::Deferred));
        let (timeout, timeout_xception) = run(&timeout);
        assert_eq!(deferred, deferred_xception, "seed {seed}: Xception takes the losses");
        assert!(deferred < timeout, "seed {seed}: {deferred} / {timeout} ({timeout_xception})");
    }
}

/// Mean time from a batch's oldest request's arrival to the dispatch decision.
#[derive(Default)]
struct DecisionAge(f64, u64);
impl BatchObserver for DecisionAge {
    fn on_batch(&mut self, now: Instant, _gpu: GpuId, _m: u32, _exec: Instant, members: &[Request]) {
        let head = members.iter().map(|r| r.arrival).min().unwrap_or(now);
        self.0 += now.saturating_since(head).as_millis_f64();
        self.1 += 1;
    }
}

#[test]
fn network_delay_makes_dispatch_earlier_and_batches_smaller() {
    let run = |d_ctrl_us: u64| {
        let cfg = single(resnet50(), 8, 4000.0);
        let delay = NetworkDelay { d_ctrl: Duration::from_micros(d_ctrl_us), d_data: Duration::from_micros(20) };
        let mut s = DeferredScheduler::new(&cfg.models, 8, CoreConfig { delay, ..CoreConfig::default() });
        let mut age = DecisionAge::default();
        let r = simulate_observed(&cfg, &mut s, &mut age).unwrap();
        (r.mean_batch, age.0 / age.1 as f64, r.bad_rate)
    };
    let (b0, age0, bad0) = run(0);
    let (b1, age1, bad1) = run(3_000);
    assert!(b1 < b0, "batches shrink: {b0} -> {b1}");
    assert!(age1 < 0.9 * age0, "dispatch is decided earlier: {age0} -> {age1} ms after the head arrived");
    assert!(bad0 <= 0.01 && bad1 <= 0.01, "{bad0} {bad1}");
}

#[test]
fn same_seed_same_report_byte_for_byte() {
    let cfg = SimConfig { workload: Workload { arrival: scheduler::sim::Arrival::Gamma(0.3), ..Workload::poisson(4000.0) }, ..single(resnet50(), 8, 0.0) };
    let run = || {
        let mut s = DeferredScheduler::new(&cfg.models, 8, CoreConfig::default());
        serde_json::to_string(&simulate(&cfg, &mut s).unwrap()).unwrap()
    };
    assert_eq!(run(), run());
}

// ---- admission: priorities, timeouts, queue bounds, cancellation ----------

use scheduler::deferred::Admission;
use scheduler::sim::SimAdmission;
use scheduler::types::{Actions, DropReason, Scheduler};

fn at_ms(n: u64) -> Instant {
    Instant::from_nanos(n * 1_000_000)
}

/// What a scheduler answered, with when.
#[derive(Default)]
struct Answers {
    drops: Vec<(Instant, u64, DropReason)>,
    dispatched: Vec<u64>,
}

impl Answers {
    fn take(&mut self, now: Instant, out: &mut Actions) {
        self.drops.extend(out.drops.iter().map(|&(r, why)| (now, r.id, why)));
        self.dispatched.extend(out.members.iter().map(|r| r.id));
        out.clear();
    }

    fn drop_of(&self, id: u64) -> Option<(Instant, DropReason)> {
        self.drops.iter().find(|d| d.1 == id).map(|d| (d.0, d.2))
    }
}

/// Runs `s`'s timers on the virtual clock up to `until`.
fn run_until(s: &mut DeferredScheduler, until: Instant, out: &mut Actions, seen: &mut Answers) {
    while let Some(t) = s.poll_at().filter(|&t| t <= until) {
        s.on_wake(t, out);
        seen.take(t, out);
    }
}

fn lazy() -> CoreConfig {
    CoreConfig { gather: Gather::Lazy, ..CoreConfig::default() }
}

#[test]
fn at_twice_the_capacity_high_priority_keeps_its_slo_and_low_absorbs_the_loss() {
    // Capacity (goodput at 1% bad) of this model on 2 GPUs: about 590 rps.
    let m = ModelSpec::linear("a", 2.0, 1.0, 20.0).unwrap();
    let base = SimConfig { duration: Duration::from_millis(10_000), ..single(m.clone(), 2, 1200.0) };
    let plain = simulate(&base, &mut DeferredScheduler::new(&base.models, 2, CoreConfig::default())).unwrap();
    assert!(plain.classes.is_none(), "a run without priorities reports as before");
    let cfg = SimConfig { admission: SimAdmission { priority_mix: 0.3, max_queue: 0 }, ..base };
    let r = simulate(&cfg, &mut DeferredScheduler::new(&cfg.models, 2, CoreConfig::default())).unwrap();
    let classes = r.classes.clone().unwrap();
    let (high, low) = (&classes[0], &classes[1]);
    assert!(high.offered > 2000 && low.offered > 5000, "{classes:?}");
    assert!(high.bad_rate <= 0.01, "high priority bad rate {}", high.bad_rate);
    assert!(low.bad_rate >= 0.3, "low priority absorbs the overload: {}", low.bad_rate);
    // Preferring one class costs little goodput. Was 2% until early drop
    // protected throughput per GPU rather than batch size (docs/decisions.md,
    // deferred item 10): this weak batcher's lowest level now drops below a
    // batch of 3 instead of 6, and at twice the capacity the small batches
    // the high level forces cost 6% (6554 vs 6957 requests).
    assert!(r.good as f64 >= 0.93 * plain.good as f64, "{} vs {}", r.good, plain.good);
}

#[test]
fn a_request_is_answered_by_its_timeout_with_reason_timeout() {
    // No GPU: nothing can run, so every request ends by its deadline.
    let m = ModelSpec::linear("a", 2.0, 1.0, 100.0).unwrap();
    let mut s = DeferredScheduler::new(&[m], 0, lazy());
    let (mut out, mut seen) = (Actions::default(), Answers::default());
    let timed = Request { timed: true, ..Request::new(1, 0, at_ms(0), at_ms(30)) };
    s.on_request(at_ms(0), timed, &mut out);
    s.on_request(at_ms(0), Request::new(2, 0, at_ms(0), at_ms(100)), &mut out);
    seen.take(at_ms(0), &mut out);
    run_until(&mut s, at_ms(200), &mut out, &mut seen);
    let (t, why) = seen.drop_of(1).unwrap();
    assert_eq!(why, DropReason::Timeout);
    assert!(t <= at_ms(30), "answered at {t}, after its 30 ms timeout");
    let (t, why) = seen.drop_of(2).unwrap();
    assert_eq!(why, DropReason::DeadlineUnmeetable);
    assert!(t <= at_ms(100) && t > at_ms(30));
    assert_eq!(s.queued_of(0), 0);
}

#[test]
fn a_low_priority_timeout_behind_high_priority_work_is_answered_on_time() {
    // The low request is outside the candidate (the highs fill it): its
    // own expiry still wakes the model.
    let m = ModelSpec::linear("a", 2.0, 1.0, 100.0).unwrap();
    let max = m.profile.max_batch() as u64;
    let mut s = DeferredScheduler::new(&[m], 0, lazy());
    s.set_admission(0, Admission { levels: 2, default_level: 1, max_queue: 0 });
    let (mut out, mut seen) = (Actions::default(), Answers::default());
    for id in 0..max {
        s.on_request(at_ms(0), Request::new(id, 0, at_ms(0), at_ms(100)), &mut out);
    }
    let low = Request { priority: 2, timed: true, ..Request::new(1000, 0, at_ms(0), at_ms(20)) };
    s.on_request(at_ms(0), low, &mut out);
    seen.take(at_ms(0), &mut out);
    run_until(&mut s, at_ms(50), &mut out, &mut seen);
    let (t, why) = seen.drop_of(1000).unwrap();
    assert_eq!(why, DropReason::Timeout);
    assert!(t <= at_ms(20), "answered at {t}");
}

#[test]
fn a_full_queue_refuses_at_once_and_a_higher_priority_evicts_a_lower_one() {
    let m = ModelSpec::linear("a", 2.0, 1.0, 100.0).unwrap();
    let mut s = DeferredScheduler::new(&[m], 0, lazy());
    s.set_admission(0, Admission { levels: 2, default_level: 2, max_queue: 3 });
    let (mut out, mut seen) = (Actions::default(), Answers::default());
    for id in 1..=3 {
        s.on_request(at_ms(id), Request::new(id, 0, at_ms(id), at_ms(100 + id)), &mut out);
    }
    seen.take(at_ms(3), &mut out);
    assert!(seen.drops.is_empty());
    // Over the bound, at the default (lowest) level: refused now.
    s.on_request(at_ms(4), Request::new(4, 0, at_ms(4), at_ms(104)), &mut out);
    seen.take(at_ms(4), &mut out);
    assert_eq!(seen.drop_of(4), Some((at_ms(4), DropReason::Overloaded)));
    // A high-priority request takes the place of the latest low one.
    s.on_request(at_ms(5), Request { priority: 1, ..Request::new(5, 0, at_ms(5), at_ms(105)) }, &mut out);
    seen.take(at_ms(5), &mut out);
    assert_eq!(seen.drop_of(3), Some((at_ms(5), DropReason::Overloaded)));
    assert_eq!(seen.drop_of(5), None);
    assert_eq!(s.queued_of(0), 3);
    assert_eq!(s.stats().0.refused, 2);
    // Over a lower bound, highs evict the lows one by one, latest first;
    // with no low left, a high is refused too.
    s.set_admission(0, Admission { levels: 2, default_level: 2, max_queue: 1 });
    for id in 6..=8 {
        s.on_request(at_ms(id), Request { priority: 1, ..Request::new(id, 0, at_ms(id), at_ms(100 + id)) }, &mut out);
        seen.take(at_ms(id), &mut out);
    }
    assert_eq!(seen.drop_of(2), Some((at_ms(6), DropReason::Overloaded)));
    assert_eq!(seen.drop_of(1), Some((at_ms(7), DropReason::Overloaded)));
    assert_eq!(seen.drop_of(8), Some((at_ms(8), DropReason::Overloaded)));
    assert_eq!(s.queued_of(0), 3, "a lowered bound evicts nothing by itself");
}

#[test]
fn a_cancelled_request_leaves_the_queue_and_a_dispatched_one_is_left_alone() {
    let m = ModelSpec::linear("a", 2.0, 1.0, 100.0).unwrap();
    let mut s = DeferredScheduler::new(std::slice::from_ref(&m), 0, lazy());
    let (mut out, mut seen) = (Actions::default(), Answers::default());
    for id in 1..=3 {
        s.on_request(at_ms(0), Request::new(id, 0, at_ms(0), at_ms(100)), &mut out);
    }
    assert!(s.cancel(at_ms(1), 0, 2, &mut out));
    seen.take(at_ms(1), &mut out);
    assert_eq!(seen.drop_of(2), Some((at_ms(1), DropReason::Cancelled)));
    assert_eq!(s.queued_of(0), 2);
    assert!(!s.cancel(at_ms(1), 0, 2, &mut out), "already gone");
    assert!(!s.cancel(at_ms(1), 0, 77, &mut out), "never known");
    assert!(!s.cancel(at_ms(1), 5, 1, &mut out), "unknown model");
    assert!(out.is_empty());
    assert_eq!(s.stats().0.cancelled, 1);

    // With a GPU the request is planned; then a cancel changes nothing.
    let mut s = DeferredScheduler::new(&[m], 1, lazy());
    s.on_request(at_ms(0), Request::new(9, 0, at_ms(0), at_ms(100)), &mut out);
    seen.take(at_ms(0), &mut out);
    run_until(&mut s, at_ms(100), &mut out, &mut seen);
    assert!(seen.dispatched.contains(&9));
    assert!(!s.cancel(at_ms(100), 0, 9, &mut out));
    assert!(out.is_empty());
}

/// Runs one high request (deadline `high_ms`) and ten lows (deadline 100 ms)
/// on one GPU of l(b) = 2b + 1 ms with `reserve`; returns the first batch
/// (finish time, members) and whether the high request was dropped.
fn first_batch_with_reserve(reserve: Duration, high_ms: u64) -> (Instant, Vec<u64>, bool) {
    let m = ModelSpec::linear("a", 2.0, 1.0, 100.0).unwrap();
    let mut s = DeferredScheduler::new(&[m], 1, CoreConfig { priority_reserve: reserve, ..lazy() });
    s.set_admission(0, Admission { levels: 2, default_level: 2, max_queue: 0 });
    let mut out = Actions::default();
    for id in 1..=10 {
        s.on_request(at_ms(0), Request::new(id, 0, at_ms(0), at_ms(100)), &mut out);
    }
    s.on_request(at_ms(0), Request { priority: 1, ..Request::new(100, 0, at_ms(0), at_ms(high_ms)) }, &mut out);
    while out.batches.is_empty() {
        let Some(t) = s.poll_at() else { break };
        s.on_wake(t, &mut out);
    }
    let dropped = out.drops.iter().any(|(r, _)| r.id == 100);
    let plan = out.batches.first().cloned().expect("a batch");
    let members = out.members_of(&plan).iter().map(|r| r.id).collect();
    (plan.finish_at, members, dropped)
}

#[test]
fn a_priority_reserve_keeps_lows_from_pushing_a_high_request_to_its_deadline() {
    // Without a reserve the lows fill the batch up to the high request's
    // deadline (40 ms); with 10 ms the batch ends by 30 ms.
    let (finish, members, dropped) = first_batch_with_reserve(Duration::ZERO, 40);
    assert!(!dropped && members[0] == 100 && members.len() > 1);
    assert!(finish <= at_ms(40) && finish > at_ms(30), "finish {finish}");
    let (finish, members, dropped) = first_batch_with_reserve(Duration::from_millis(10), 40);
    assert!(!dropped && members[0] == 100 && members.len() > 1, "{members:?}");
    assert!(finish <= at_ms(30), "finish {finish}");
    // A high head that cannot keep the reserve still runs by its deadline,
    // alone (no low joins a batch that already eats into it).
    let (finish, members, dropped) = first_batch_with_reserve(Duration::from_millis(10), 6);
    assert!(!dropped, "the drop test is the true deadline's");
    assert_eq!(members, [100]);
    assert!(finish <= at_ms(6), "finish {finish}");
}

/// A closed loop of `clients` on `gpus` GPUs of one model (tests/
/// perf_analyzer.sh's: `l(b)` = 0.268 ms times b plus 5.172 ms, SLO 200 ms),
/// each client sending its next request `turn` after its answer. Returns
/// the completions per second over 8 s to 10 s (telling the loop takes a
/// few cycles, and at concurrency 1 a cycle starts near the SLO) and the
/// requests dropped.
fn closed_loop_rate(clients: u64, gpus: u32, turn: Duration) -> (f64, u64) {
    use scheduler::types::{Actions, Scheduler};
    let models = vec![ModelSpec::linear("tc_model", 0.268, 5.172, 200.0).unwrap()];
    let mut s = DeferredScheduler::new(&models, gpus, CoreConfig::default());
    let mut out = Actions::default();
    let mut sends: Vec<Instant> = (0..clients).map(|i| Instant::from_nanos(i * 10_000)).collect();
    let mut running: Vec<Option<(Instant, Vec<u64>)>> = vec![None; gpus as usize];
    let (mut done, mut dropped, mut next_id) = (0u64, 0u64, 0u64);
    let (from, to) = (Instant::from_nanos(8_000_000_000), Instant::from_nanos(10_000_000_000));
    let mut client_of = std::collections::HashMap::new();
    for _ in 0..10_000_000 {
        let send = sends.iter().copied().enumerate().min_by_key(|&(_, t)| t).unwrap();
        let finish = running.iter().enumerate().filter_map(|(g, r)| r.as_ref().map(|r| (g, r.0))).min_by_key(|&(_, t)| t);
        let wake = s.poll_at().unwrap_or(Instant::NEVER);
        let now = send.1.min(finish.map_or(Instant::NEVER, |f| f.1)).min(wake);
        if now >= to {
            break;
        }
        if finish.is_some_and(|f| f.1 == now) {
            let (g, _) = finish.unwrap();
            let (_, ids) = running[g].take().unwrap();
            for id in ids {
                let c: usize = client_of.remove(&id).unwrap();
                // Clients answer a little apart (client c after `turn +
                // 20 c` µs), as they do.
                sends[c] = now + turn + Duration::from_micros(20 * c as u64);
                done += u64::from(now >= from);
            }
            s.on_batch_done(now, g as GpuId, &mut out);
        } else if send.1 == now {
            let id = next_id;
            next_id += 1;
            client_of.insert(id, send.0);
            sends[send.0] = Instant::NEVER;
            let r = Request { id, model: 0, arrival: now, deadline: now + Duration::from_millis(200), priority: 0, timed: false };
            s.on_request(now, r, &mut out);
        } else {
            s.on_wake(now, &mut out);
        }
        for b in &out.batches {
            let ids: Vec<u64> = out.members[b.members.clone()].iter().map(|r| r.id).collect();
            assert!(running[b.gpu as usize].is_none(), "a batch on a busy GPU");
            running[b.gpu as usize] = Some((b.finish_at, ids));
        }
        for (r, _) in &out.drops {
            dropped += 1;
            let c = client_of.remove(&r.id).unwrap();
            sends[c] = now + turn;
        }
        out.clear();
    }
    (done as f64 / 2.0, dropped)
}

#[test]
fn a_closed_loop_client_is_not_held_to_the_window_its_own_gaps_make() {
    // perf_analyzer at concurrency 4 and 1 over 2 GPUs, answers back 500 µs
    // after each finish. Deferral alone settles at a cycle of about
    // SLO / (1 + window share) for concurrency 4 (once seen in CI: 34.7
    // infer/s) and at the deadline for a lone client; told a closed loop
    // (scheduler::deferred's follow-ups), a batch goes once every client of
    // the finished batches is back.
    let turn = Duration::from_micros(500);
    let (four, dropped) = closed_loop_rate(4, 2, turn);
    eprintln!("concurrency 4: {four} completions/s, {dropped} dropped");
    assert_eq!(dropped, 0);
    // A batch of 4 runs 6.244 ms; a cycle of run + turn + the wait for the
    // last client is under 7.5 ms: more than 4 / 7.5 ms = 533 per second.
    assert!(four > 533.0, "{four}");
    let (one, dropped) = closed_loop_rate(1, 2, turn);
    eprintln!("concurrency 1: {one} completions/s, {dropped} dropped");
    assert_eq!(dropped, 0);
    // l(1) = 5.44 ms + 0.5 ms: about 168 per second, not 5 (the SLO).
    assert!(one > 150.0, "{one}");
}

#[test]
fn a_long_batch_leaves_the_last_gpu_to_the_tight_models() {
    // 1080Ti EfficientNetV2B2, V2B3 and V2L on 2 GPUs, SLOs 1.58 x the
    // table's, Gamma(0.74), equal shares (the drawn grid's worst cell at
    // sample seed 1, 2026-11-29: deferred 25 rps against Nexus's 51,
    // which dedicates a GPU to V2L). V2L's batch of 4 runs 189 ms, four
    // times V2B2's whole SLO: with V2L batches on both GPUs the tight
    // models found no GPU for a whole batch. A batch longer than another
    // model's budget stays off the last GPU freeing within it while it can
    // still start in time on the next (deferred item 34).
    use scheduler::deferred::{Departure, DepartureSet};
    use scheduler::sim::{Arrival, Popularity, RateSchedule};
    let models = vec![
        ModelSpec::linear("EfficientNetV2B2", 2.254, 5.896, 29.0 * 1.58).unwrap(),
        ModelSpec::linear("EfficientNetV2B3", 4.072, 5.981, 44.0 * 1.58).unwrap(),
        ModelSpec::linear("EfficientNetV2L", 40.313, 28.208, 378.0 * 1.58).unwrap(),
    ];
    let workload = Workload { rate_rps: 45.0, arrival: Arrival::Gamma(0.74), popularity: Popularity::Equal, schedule: RateSchedule::default() };
    let worst = |departures: DepartureSet, seed: u64| {
        let cfg = SimConfig { models: models.clone(), gpus: 2, workload: workload.clone(), duration: Duration::from_millis(120_000), warmup: Duration::from_millis(5_000), seed, trace: None, admission: Default::default() };
        let policy = PolicyConfig { departures, ..PolicyConfig::new(PolicyKind::Deferred) };
        let mut s = scheduler::policy::build(&cfg.models, 2, &policy).unwrap();
        simulate(&cfg, s.as_mut()).unwrap().max_model_bad_rate
    };
    for seed in 1..=3 {
        let on = worst(DepartureSet::default(), seed);
        let off = worst(DepartureSet::default().without(Departure::LongBatchOffLastGpu), seed);
        eprintln!("seed {seed}: worst bad rate {on} with item 34, {off} without");
        assert!(on <= 0.01 && off > 2.0 * on.max(0.005), "seed {seed}: {on} with item 34, {off} without");
    }
}
