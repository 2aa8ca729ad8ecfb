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
    assert!(e.dropped > 10, "eager degrades into batches of one and drops: {}", e.dropped);
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
