//! The live runtime makes the simulator's decisions: exactly, under the
//! lockstep driver on a recorded trace; and on the real clock it keeps every
//! invariant and accounts for every request.

use dataplane::idle::IdleStrategy;
use dataplane::time::{Duration, Instant};
use scheduler::deferred::{CoreConfig, DeferredScheduler, Gather};
use scheduler::runtime::{run_live, run_lockstep, LiveConfig, RuntimeConfig};
use scheduler::sim::{simulate_observed, Arrivals, BatchObserver, SimConfig, Workload};
use scheduler::types::{GpuId, Request};
use scheduler::zoo::{ModelSpec, Zoo, ZooSelection};

#[derive(Default)]
struct Record(Vec<(GpuId, u32, Instant, Vec<u64>)>);
impl BatchObserver for Record {
    fn on_batch(&mut self, _now: Instant, gpu: GpuId, model: u32, exec_at: Instant, members: &[Request]) {
        self.0.push((gpu, model, exec_at, members.iter().map(|r| r.id).collect()));
    }
}

fn trace(models: usize, rate: f64, secs: u64, seed: u64, arrival: scheduler::sim::Arrival) -> Vec<(Instant, u32)> {
    let w = Workload { arrival, ..Workload::poisson(rate) };
    Arrivals::for_model_count(models, &w, seed, Duration::from_millis(secs * 1_000)).collect()
}

fn agree(models: Vec<ModelSpec>, gpus: u32, rate: f64, core: CoreConfig, arrival: scheduler::sim::Arrival) {
    let tr = trace(models.len(), rate, 3, 9, arrival);
    let n = tr.len();
    let cfg = SimConfig {
        models: models.clone(),
        gpus,
        workload: Workload::poisson(0.0),
        duration: Duration::from_millis(3_000),
        warmup: Duration::ZERO,
        seed: 0,
        trace: Some(tr.clone()),
        admission: Default::default(),
    };
    let mut sim = DeferredScheduler::new(&models, gpus, core);
    let mut rec = Record::default();
    let report = simulate_observed(&cfg, &mut sim, &mut rec).unwrap();
    let live = run_lockstep(&RuntimeConfig { models, gpus, model_threads: 1, core, ring_capacity: 1024 }, tr);
    assert_eq!(live.violations, 0);
    assert_eq!(live.dropped, report.dropped);
    assert!(rec.0.len() > n / 64, "enough batches to compare: {}", rec.0.len());
    assert_eq!(live.batches.len(), rec.0.len());
    for (i, (a, b)) in live.batches.iter().zip(&rec.0).enumerate() {
        assert_eq!(a, b, "batch {i} differs");
    }
}

#[test]
fn lockstep_runtime_makes_exactly_the_simulators_decisions() {
    let r50 = ModelSpec::linear("ResNet50", 1.053, 5.072, 25.0).unwrap();
    agree(vec![r50.clone()], 8, 5_000.0, CoreConfig::default(), scheduler::sim::Arrival::Poisson);
    let strong = ZooSelection::Strong.select(Zoo::A100.models()).unwrap();
    agree(strong, 32, 30_000.0, CoreConfig { gather: Gather::Lazy, ..CoreConfig::default() }, scheduler::sim::Arrival::Gamma(0.3));
    let delay = scheduler::netdelay::NetworkDelay { d_ctrl: Duration::from_micros(50), d_data: Duration::from_micros(5) };
    agree(Zoo::Gtx1080Ti.models(), 48, 6_000.0, CoreConfig { delay, ..CoreConfig::default() }, scheduler::sim::Arrival::Poisson);
}

#[test]
fn live_runtime_on_the_real_clock_keeps_invariants_and_accounts_for_everything() {
    let models: Vec<ModelSpec> = (0..4).map(|i| ModelSpec::linear(&format!("m{i}"), 1.0, 5.0, 40.0).unwrap()).collect();
    let cfg = LiveConfig {
        runtime: RuntimeConfig { models, gpus: 16, model_threads: 2, core: CoreConfig::default(), ring_capacity: 4096 },
        workload: Workload::poisson(4_000.0),
        duration: Duration::from_millis(700),
        seed: 3,
        idle: IdleStrategy::GENTLE,
        pin: false,
    };
    let r = run_live(&cfg).unwrap();
    assert_eq!(r.violations, 0, "{:?}", r.first_violation);
    assert!(r.accounted, "{r:?}");
    assert!(r.requests > 2_000, "{r:?}");
    assert!(r.batches > 0 && r.completed + r.dropped == r.requests, "{r:?}");
    // No bound on the bad rate or lag here: on a shared machine under test
    // load, threads wait for a CPU for milliseconds, and a test must not
    // depend on that. Timing is what `symphony bench-scheduler` and
    // `symphony report live-curve` measure.
}
