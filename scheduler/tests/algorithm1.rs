//! The Symphony paper's Algorithm 1 with Appendix D's network delay
//! (`--policy algorithm1`): one test per rule of the algorithm, on hand-made
//! scenarios in virtual time (milliseconds), then whole simulated runs.
//! `tests/invariants.rs` covers it too, through `PolicyKind::ALL`.

use dataplane::time::{Duration, Instant};
use scheduler::baselines::Algorithm1Scheduler;
use scheduler::netdelay::NetworkDelay;
use scheduler::policy::{build, PolicyConfig, PolicyKind};
use scheduler::profile::LatencyProfile;
use scheduler::sim::{simulate, Arrival, Popularity, RateSchedule, SimConfig, Workload};
use scheduler::types::{Actions, DropReason, GpuId, ModelId, Request, Scheduler};
use scheduler::zoo::ModelSpec;

fn ms(t: f64) -> Instant {
    Instant::from_nanos((t * 1e6).round() as u64)
}

fn dur_ms(t: f64) -> Duration {
    Duration::from_nanos((t * 1e6).round() as u64)
}

/// `l(b) = alpha*b + beta` ms, up to `max_batch`.
fn model(alpha: f64, beta: f64, max_batch: u32) -> ModelSpec {
    ModelSpec { name: format!("l={alpha}b+{beta}"), profile: LatencyProfile::linear(alpha, beta, max_batch).unwrap(), slo: dur_ms(1000.0) }
}

/// What the policy did, and when it decided it.
#[derive(Debug, Clone, PartialEq)]
struct Dispatched {
    decided: Instant,
    gpu: GpuId,
    model: ModelId,
    exec_at: Instant,
    ids: Vec<u64>,
}

/// Drives the policy in virtual time: wakes it at every `poll_at` up to
/// the next arrival, and records its batches and drops.
struct Driver {
    policy: Algorithm1Scheduler,
    now: Instant,
    out: Actions,
    batches: Vec<Dispatched>,
    drops: Vec<(Instant, u64, DropReason)>,
}

impl Driver {
    fn new(models: &[ModelSpec], gpus: u32, delay: NetworkDelay) -> Self {
        Driver { policy: Algorithm1Scheduler::new(models, gpus, delay), now: Instant::ZERO, out: Actions::default(), batches: Vec::new(), drops: Vec::new() }
    }

    fn collect(&mut self) {
        for b in &self.out.batches {
            let ids = self.out.members_of(b).iter().map(|r| r.id).collect();
            assert!(b.finish_at <= self.out.members_of(b).iter().map(|r| r.deadline).min().unwrap(), "a batch finishing late: {b:?}");
            assert!(b.exec_at >= self.now, "a batch starting in the past");
            self.batches.push(Dispatched { decided: self.now, gpu: b.gpu, model: b.model, exec_at: b.exec_at, ids });
        }
        for &(r, why) in &self.out.drops {
            self.drops.push((self.now, r.id, why));
        }
        self.out.clear();
    }

    /// Wakes the policy at each time it asked for, up to and including `t`.
    fn run_until(&mut self, t: Instant) {
        for _ in 0..10_000 {
            match self.policy.poll_at() {
                Some(at) if at <= t => {
                    assert!(at >= self.now, "poll_at {at} went back before {}", self.now);
                    self.now = at;
                    self.policy.on_wake(at, &mut self.out);
                    self.collect();
                }
                _ => {
                    self.now = t;
                    return;
                }
            }
        }
        panic!("the policy kept asking to be woken before {t}");
    }

    /// A request of `model` with id `id` arriving at `at` ms, due at `due` ms.
    fn arrive(&mut self, id: u64, model: ModelId, at: f64, due: f64) {
        self.run_until(ms(at));
        self.policy.on_request(ms(at), Request::new(id, model, ms(at), ms(due)), &mut self.out);
        self.collect();
    }
}

/// The paper's example (section 3.3): `l(b) = b + 5`, SLO 12, a request
/// every 0.75. At R4's arrival (2.25) the frontrun of a batch of 4,
/// `12 - l(5) = 2`, has passed: the four go at once; not before, since the
/// frontrun of three is `12 - l(4) = 3`.
#[test]
fn the_papers_example_dispatches_four_requests_at_the_fourth_arrival() {
    let mut d = Driver::new(&[model(1.0, 5.0, 64)], 3, NetworkDelay::ZERO);
    for i in 0..3 {
        let at = 0.75 * i as f64;
        d.arrive(i, 0, at, at + 12.0);
    }
    assert!(d.batches.is_empty(), "dispatched before the window opened: {:?}", d.batches);
    assert_eq!(d.policy.poll_at(), Some(ms(3.0)), "the model timer of three is at 12 - l(4)");
    d.arrive(3, 0, 2.25, 14.25);
    assert_eq!(d.batches, vec![Dispatched { decided: ms(2.25), gpu: 0, model: 0, exec_at: ms(2.25), ids: vec![0, 1, 2, 3] }]);
}

/// A1 lines 5 and 18-20: alone, a request waits for its frontrun
/// `d - l(2)`, and the model timer then takes the lowest-id free GPU.
#[test]
fn the_model_timer_dispatches_at_the_frontrun() {
    let mut d = Driver::new(&[model(1.0, 5.0, 64)], 2, NetworkDelay::ZERO);
    d.arrive(7, 0, 0.0, 12.0);
    assert_eq!(d.policy.poll_at(), Some(ms(5.0)));
    d.run_until(ms(20.0));
    assert_eq!(d.batches, vec![Dispatched { decided: ms(5.0), gpu: 0, model: 0, exec_at: ms(5.0), ids: vec![7] }]);
}

/// A1 line 5 with a growing `|B|`: each arrival pulls the frontrun
/// `d - l(|B| + 1)` earlier.
#[test]
fn the_window_moves_earlier_as_the_batch_grows() {
    let mut d = Driver::new(&[model(1.0, 5.0, 64)], 1, NetworkDelay::ZERO);
    d.arrive(0, 0, 0.0, 12.0);
    assert_eq!(d.policy.poll_at(), Some(ms(5.0)));
    d.arrive(1, 0, 1.0, 13.0);
    assert_eq!(d.policy.poll_at(), Some(ms(4.0)));
    d.arrive(2, 0, 2.0, 14.0);
    assert_eq!(d.policy.poll_at(), Some(ms(3.0)));
    d.run_until(ms(20.0));
    assert_eq!(d.batches, vec![Dispatched { decided: ms(3.0), gpu: 0, model: 0, exec_at: ms(3.0), ids: vec![0, 1, 2] }]);
}

/// `GetBatch` (A1 line 2): the longest prefix that finishes by the head's
/// deadline, not the whole queue.
#[test]
fn get_batch_stops_at_the_heads_deadline() {
    let mut d = Driver::new(&[model(1.0, 5.0, 64)], 1, NetworkDelay::ZERO);
    d.arrive(0, 0, 0.0, 12.0);
    for id in 1..6 {
        d.arrive(id, 0, 3.5, 15.5);
    }
    // At 3.5 the head (due 12) allows l(b) <= 8.5: b = 3; its frontrun
    // 12 - l(4) = 3 has passed.
    assert_eq!(d.batches[0], Dispatched { decided: ms(3.5), gpu: 0, model: 0, exec_at: ms(3.5), ids: vec![0, 1, 2] });
}

/// A1 lines 21-23: a GPU that frees inside a waiting candidate's window
/// `(exec, latest)` takes it at once, at its free time.
#[test]
fn a_gpu_freeing_inside_the_window_takes_the_batch() {
    let mut d = Driver::new(&[model(1.0, 5.0, 64)], 1, NetworkDelay::ZERO);
    d.arrive(0, 0, 0.0, 12.0); // runs 5..11
    d.arrive(1, 0, 5.5, 17.5); // window 10.5..11.5; the GPU frees at 11
    d.run_until(ms(30.0));
    assert_eq!(d.batches.len(), 2);
    assert_eq!(d.batches[1], Dispatched { decided: ms(11.0), gpu: 0, model: 0, exec_at: ms(11.0), ids: vec![1] });
}

/// A1 line 22: among the waiting candidates the GPU takes the one whose
/// `latest` is the closest, whatever the model ids; the other follows when
/// the GPU frees again inside its window.
#[test]
fn a_free_gpu_takes_the_candidate_with_the_closest_latest() {
    // Model 0 keeps the only GPU busy 5..11. Models 1 (l = 3b + 1) and
    // 2 (l = b + 1) both wait from 10.5: latest 13.5 and 11.5.
    let mut d = Driver::new(&[model(1.0, 5.0, 64), model(3.0, 1.0, 64), model(1.0, 1.0, 64)], 1, NetworkDelay::ZERO);
    d.arrive(0, 0, 0.0, 12.0);
    d.arrive(1, 1, 5.5, 17.5);
    d.arrive(2, 2, 5.5, 13.5);
    d.run_until(ms(30.0));
    let order: Vec<(ModelId, Instant)> = d.batches.iter().map(|b| (b.model, b.exec_at)).collect();
    assert_eq!(order, vec![(0, ms(5.0)), (2, ms(11.0)), (1, ms(13.0))]);
    assert!(d.drops.is_empty());
}

/// A1 line 22's validity bound `G.free < latest`: a GPU freeing after the
/// candidate's latest start does not take it, and the drop timer at the
/// head's deadline drops it (lazy drop).
#[test]
fn a_candidate_past_its_latest_is_dropped_at_its_deadline() {
    // Model 1: l = b + 1, due 12.5, window 9.5..10.5; the GPU frees at 11.
    // Taking it then would drop the head at 11 (it cannot finish alone).
    let mut d = Driver::new(&[model(1.0, 5.0, 64), model(1.0, 1.0, 64)], 1, NetworkDelay::ZERO);
    d.arrive(0, 0, 0.0, 12.0);
    d.arrive(1, 1, 5.5, 12.5);
    d.run_until(ms(30.0));
    assert_eq!(d.batches.len(), 1, "{:?}", d.batches);
    assert_eq!(d.drops, vec![(ms(12.5), 1, DropReason::DeadlineUnmeetable)]);
}

/// The drop timer's update reaches the matchmaking (the reading taken where
/// Figure 18 is silent): once the expired head goes, the request behind it
/// gets its own window without waiting for another arrival.
#[test]
fn after_a_drop_the_next_request_gets_a_window() {
    let mut d = Driver::new(&[model(1.0, 5.0, 64), model(1.0, 1.0, 64)], 1, NetworkDelay::ZERO);
    d.arrive(0, 0, 0.0, 12.0); // holds the GPU 5..11
    d.arrive(1, 1, 5.5, 9.5);
    d.arrive(2, 1, 5.6, 30.0); // batched with 1, too late for the GPU
    d.run_until(ms(40.0));
    assert_eq!(d.drops, vec![(ms(9.5), 1, DropReason::DeadlineUnmeetable)]);
    // Alone, due 30: frontrun 30 - l(2) = 27.
    assert_eq!(d.batches.last(), Some(&Dispatched { decided: ms(27.0), gpu: 0, model: 1, exec_at: ms(27.0), ids: vec![2] }));
}

/// `GetBatch`'s lazy drop: a head that cannot finish even alone is dropped
/// when the queue is next looked at, and the requests behind it batch.
#[test]
fn an_expired_head_is_dropped_and_the_rest_batch() {
    // Model 0 holds the only GPU 0..11 (a full batch of 1 goes at once);
    // model 1's first request (due 7) cannot finish alone after 5, and at
    // the next arrival (6, before its drop timer) it goes.
    let mut d = Driver::new(&[model(1.0, 10.0, 1), model(1.0, 1.0, 64)], 1, NetworkDelay::ZERO);
    d.arrive(0, 0, 0.0, 11.0);
    d.arrive(1, 1, 0.5, 7.0);
    d.arrive(2, 1, 6.0, 20.0);
    d.arrive(3, 1, 6.0, 20.0);
    d.run_until(ms(30.0));
    assert_eq!(d.drops, vec![(ms(6.0), 1, DropReason::DeadlineUnmeetable)]);
    assert_eq!(d.batches.last().map(|b| (b.model, b.ids.clone(), b.exec_at)), Some((1, vec![2, 3], ms(16.0))), "{:?}", d.batches);
}

/// Appendix D: the window is shifted by the network delay. The batch may
/// start no sooner than `now + delay(b)`, and the model timer fires
/// `delay(b)` before `exec_at`, so the inputs arrive in time.
#[test]
fn the_network_delay_moves_the_decision_before_exec_at() {
    let delay = NetworkDelay { d_ctrl: dur_ms(0.5), d_data: dur_ms(0.25) };
    let mut d = Driver::new(&[model(1.0, 5.0, 64)], 1, delay);
    d.arrive(0, 0, 0.0, 12.0);
    // exec_at = max(0 + delay(1), 12 - l(2)) = 5; timer at 5 - 0.75.
    assert_eq!(d.policy.poll_at(), Some(ms(4.25)));
    d.arrive(1, 0, 4.0, 16.0);
    // Two: exec_at = max(4 + delay(2), 12 - l(3)) = 4 + 1 = 5; decided at 4.
    assert_eq!(d.batches, vec![Dispatched { decided: ms(4.0), gpu: 0, model: 0, exec_at: ms(5.0), ids: vec![0, 1] }]);
}

/// Appendix D's GPU timer: `delay(bs)` before the earliest GPU frees, so
/// the batch's inputs are there when it does.
#[test]
fn the_gpu_timer_fires_a_network_delay_before_the_gpu_frees() {
    let delay = NetworkDelay { d_ctrl: dur_ms(0.5), d_data: Duration::ZERO };
    let mut d = Driver::new(&[model(1.0, 5.0, 64)], 1, delay);
    d.arrive(0, 0, 0.0, 12.0); // exec 5, runs 5..11
    d.arrive(1, 0, 5.5, 17.5); // window 10.5..11.5, no GPU by 10.5
    d.run_until(ms(30.0));
    assert_eq!(d.batches.len(), 2);
    assert_eq!(d.batches[1], Dispatched { decided: ms(10.5), gpu: 0, model: 0, exec_at: ms(11.0), ids: vec![1] });
}

/// The network delay also bounds `GetBatch`: with `delay(b)` charged, a
/// request that would fit without it is dropped at once.
#[test]
fn the_network_delay_counts_in_the_lazy_drop() {
    let delay = NetworkDelay { d_ctrl: dur_ms(2.0), d_data: Duration::ZERO };
    let mut d = Driver::new(&[model(1.0, 5.0, 64)], 1, delay);
    d.arrive(0, 0, 0.0, 7.5); // alone: 0 + 2 + 6 > 7.5
    assert_eq!(d.drops, vec![(ms(0.0), 0, DropReason::DeadlineUnmeetable)]);
    assert!(d.batches.is_empty());
}

/// A1 line 19: with several GPUs free, the lowest id, so high ids stay idle.
#[test]
fn free_gpus_are_taken_lowest_id_first() {
    let mut d = Driver::new(&[model(1.0, 5.0, 1), model(1.0, 5.0, 1)], 4, NetworkDelay::ZERO);
    d.arrive(0, 0, 0.0, 20.0);
    d.arrive(1, 1, 0.0, 20.0);
    d.run_until(ms(7.0)); // both GPUs free again at 6
    d.arrive(2, 1, 7.0, 30.0);
    let gpus: Vec<GpuId> = d.batches.iter().map(|b| b.gpu).collect();
    assert_eq!(gpus, vec![0, 1, 0]);
}

/// At the profile's largest batch `l(|B| + 1)` is undefined and the batch
/// cannot grow: it goes at once rather than at `d - l(|B|)`.
#[test]
fn a_batch_of_the_largest_size_does_not_wait() {
    let mut d = Driver::new(&[model(1.0, 5.0, 2)], 1, NetworkDelay::ZERO);
    d.arrive(0, 0, 0.0, 50.0);
    d.arrive(1, 0, 1.0, 51.0);
    assert_eq!(d.batches, vec![Dispatched { decided: ms(1.0), gpu: 0, model: 0, exec_at: ms(1.0), ids: vec![0, 1] }]);
}

#[test]
fn the_policy_is_selectable_by_name() {
    assert_eq!(PolicyKind::parse("algorithm1"), Ok(PolicyKind::Algorithm1));
    assert_eq!(PolicyKind::Algorithm1.as_str(), "algorithm1");
    assert!(PolicyKind::ALL.contains(&PolicyKind::Algorithm1));
    let s = build(&[model(1.0, 5.0, 8)], 2, &PolicyConfig::new(PolicyKind::Algorithm1)).unwrap();
    assert_eq!(s.name(), "algorithm1");
}

fn table2_config(spec: ModelSpec, gpus: u32, rate_rps: f64, seed: u64) -> SimConfig {
    SimConfig {
        models: vec![spec],
        gpus,
        workload: Workload { rate_rps, arrival: Arrival::Poisson, popularity: Popularity::Equal, schedule: RateSchedule::default() },
        duration: Duration::from_millis(4000),
        warmup: Duration::from_millis(1000),
        seed,
        trace: None,
        admission: Default::default(),
    }
}

fn run(spec: &ModelSpec, rate_rps: f64, seed: u64, policy: &PolicyConfig) -> scheduler::sim::SimReport {
    let cfg = table2_config(spec.clone(), 8, rate_rps, seed);
    let mut s = build(&cfg.models, cfg.gpus, policy).unwrap();
    simulate(&cfg, s.as_mut()).unwrap()
}

/// Whole runs keep the simulator's invariants (it checks every batch) and
/// account for every request; at half the paper's Table 2 ResNet50 load
/// Algorithm 1 drops almost nothing, with or without a network delay.
#[test]
fn simulated_runs_keep_the_invariants_and_serve_table2_load() {
    let resnet = ModelSpec::linear("ResNet50", 1.053, 5.072, 25.0).unwrap();
    let mut delayed = PolicyConfig::new(PolicyKind::Algorithm1);
    delayed.delay = NetworkDelay { d_ctrl: Duration::from_micros(300), d_data: Duration::from_micros(40) };
    for (seed, policy) in [(1, PolicyConfig::new(PolicyKind::Algorithm1)), (2, delayed)] {
        let r = run(&resnet, 2750.0, seed, &policy);
        assert_eq!(r.good + r.dropped + r.late, r.offered);
        assert_eq!(r.late, 0);
        assert!((r.dropped as f64) < 0.01 * r.offered as f64, "{} of {} dropped at half load", r.dropped, r.offered);
    }
}
