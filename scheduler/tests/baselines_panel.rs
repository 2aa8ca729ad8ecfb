//! The baseline panel's new variants (issue 49) against second
//! implementations written from their stated rules: deliberately plain
//! (linear scans over every model, GPU and batch size on every event), run
//! through the same simulator. Each must reach within 3% of its twin's
//! goodput on every case, in both directions.

use dataplane::time::{Duration, Instant};
use scheduler::goodput::ideal_throughput;
use scheduler::netdelay::NetworkDelay;
use scheduler::policy::{build, PolicyConfig, PolicyKind};
use scheduler::sim::{simulate, Arrival, Popularity, RateSchedule, SimConfig, Workload};
use scheduler::types::{Actions, DropReason, GpuId, Request, Scheduler};
use scheduler::zoo::{ModelSpec, Zoo};

/// How the plain twin ranks and batches.
#[derive(Clone, Copy, PartialEq)]
enum Rule {
    /// Head-deadline EDF with today's eager batch (skip heads where that pays).
    Edf,
    /// The largest feasible batch of the model whose latest start is earliest.
    LatestStart,
    /// Every (model, batch size) candidate: the earliest latest-executable moment.
    ClockworkPaper,
    /// Shepherd's Flex without preemption: the model whose head's largest
    /// feasible batch is the largest.
    Flex,
}

/// The twin of every new panel variant.
struct Plain {
    models: Vec<ModelSpec>,
    delay: NetworkDelay,
    rule: Rule,
    early: bool,
    queues: Vec<Vec<Request>>,
    free_at: Vec<Instant>,
}

impl Plain {
    fn new(models: &[ModelSpec], gpus: u32, delay: NetworkDelay, rule: Rule, early: bool) -> Self {
        Plain { models: models.to_vec(), delay, rule, early, queues: vec![Vec::new(); models.len()], free_at: vec![Instant::ZERO; gpus as usize] }
    }

    /// When a batch of `b` of model `m` started now finishes.
    fn done(&self, now: Instant, m: usize, b: u32) -> Instant {
        now + self.delay.of(b) + self.models[m].profile.latency(b)
    }

    /// The largest batch within the model's SLO (the early-drop window's cap).
    fn full(&self, m: usize) -> u32 {
        let p = &self.models[m].profile;
        (1..=p.max_batch()).filter(|&b| p.latency(b) <= self.models[m].slo).max().unwrap_or(1)
    }

    /// The largest `b` whose `b` requests from `from` finish by `q[from]`'s deadline (at least 1).
    fn feasible(&self, now: Instant, m: usize, from: usize) -> u32 {
        let q = &self.queues[m];
        let n = (q.len() - from).min(self.models[m].profile.max_batch() as usize) as u32;
        (1..=n).filter(|&b| self.done(now, m, b) <= q[from].deadline).max().unwrap_or(1)
    }

    /// Nexus's sliding window: the heads skipped before one finishes in a
    /// batch of the window's length (the rest of the queue, at most `full`).
    fn window_skip(&self, now: Instant, m: usize) -> usize {
        let q = &self.queues[m];
        (0..q.len()).find(|&i| self.done(now, m, ((q.len() - i) as u32).min(self.full(m))) <= q[i].deadline).unwrap_or(q.len())
    }

    /// `(model, heads to drop, heads to leave queued, batch)` to run now
    /// (a batch of 0: drop, then choose again), if any.
    fn choose(&self, now: Instant) -> Option<(usize, usize, usize, u32)> {
        let models = (0..self.queues.len()).filter(|&m| !self.queues[m].is_empty());
        let skip = |m: usize| if self.early { self.window_skip(now, m) } else { 0 };
        match self.rule {
            Rule::Edf => {
                let m = models.min_by_key(|&m| (self.queues[m][0].deadline, m))?;
                let s = skip(m);
                if s > 0 {
                    return Some((m, s, 0, 0));
                }
                let q = &self.queues[m];
                let p = &self.models[m].profile;
                // Today's eager batch: the head's largest feasible batch, or
                // a larger one past the first heads where its GPU time per
                // request, counting the skipped heads run alone, is lower.
                let cost = |n: u32, t: Duration| t.as_secs_f64() / f64::from(n);
                let b0 = self.feasible(now, m, 0);
                let mut best = (0usize, b0);
                for i in 1..q.len().min(p.max_batch() as usize + 1) {
                    for b in 1..=(q.len() - i).min(p.max_batch() as usize) as u32 {
                        let fits = self.done(now, m, b) <= q[i].deadline;
                        let pays = cost(b + i as u32, p.latency(b) + p.latency(i as u32)) < cost(b0, p.latency(b0));
                        if fits && pays && b > best.1 {
                            best = (i, b);
                        }
                    }
                }
                Some((m, 0, best.0, best.1))
            }
            Rule::LatestStart => models
                .filter_map(|m| {
                    let s = skip(m);
                    let q = &self.queues[m];
                    (s < q.len()).then(|| {
                        let b = self.feasible(now, m, s);
                        (q[s].deadline - self.delay.of(b) - self.models[m].profile.latency(b), m, s, b)
                    })
                })
                .min()
                .map(|(_, m, s, b)| (m, s, 0, b)),
            Rule::ClockworkPaper => {
                // Literally: every batch size of every model, the `b` oldest
                // requests at the head's deadline; executable only if it
                // can still start by its latest moment.
                let mut best: Option<(Instant, std::cmp::Reverse<u32>, Instant, usize)> = None;
                for m in models {
                    let q = &self.queues[m];
                    for b in 1..=q.len().min(self.models[m].profile.max_batch() as usize) as u32 {
                        let latest = q[0].deadline - self.delay.of(b) - self.models[m].profile.latency(b);
                        let key = (latest, std::cmp::Reverse(b), q[0].arrival, m);
                        if self.done(now, m, b) <= q[0].deadline && best.is_none_or(|k| key < k) {
                            best = Some(key);
                        }
                    }
                }
                best.map(|(_, b, _, m)| (m, 0, 0, b.0))
            }
            // The largest batch over the models, each the head's largest
            // feasible one; ties to the earlier head, then the lower id.
            Rule::Flex => models.map(|m| (std::cmp::Reverse(self.feasible(now, m, 0)), self.queues[m][0].deadline, m)).min().map(|(b, _, m)| (m, 0, 0, b.0)),
        }
    }

    fn step(&mut self, now: Instant, out: &mut Actions) {
        loop {
            let Some(gpu) = (0..self.free_at.len()).find(|&g| self.free_at[g] <= now) else { return };
            for m in 0..self.queues.len() {
                while !self.queues[m].is_empty() && self.done(now, m, 1) > self.queues[m][0].deadline {
                    out.drops.push((self.queues[m].remove(0), DropReason::DeadlineUnmeetable));
                }
            }
            let Some((m, drop, leave, b)) = self.choose(now) else { return };
            for r in self.queues[m].drain(..drop) {
                out.drops.push((r, DropReason::EarlyDrop));
            }
            if b == 0 {
                continue;
            }
            let finish = self.done(now, m, b);
            let members: Vec<Request> = self.queues[m].drain(leave..leave + b as usize).collect();
            out.push_batch(gpu as GpuId, m as u32, now + self.delay.of(b), finish, now, members);
            self.free_at[gpu] = finish;
        }
    }
}

impl Scheduler for Plain {
    fn on_request(&mut self, now: Instant, req: Request, out: &mut Actions) {
        let q = &mut self.queues[req.model as usize];
        let pos = q.iter().position(|r| r.deadline > req.deadline).unwrap_or(q.len());
        q.insert(pos, req);
        self.step(now, out);
    }
    fn on_batch_done(&mut self, now: Instant, _gpu: GpuId, out: &mut Actions) {
        self.step(now, out);
    }
    fn on_wake(&mut self, now: Instant, out: &mut Actions) {
        self.step(now, out);
    }
    fn poll_at(&self) -> Option<Instant> {
        None
    }
    fn name(&self) -> &'static str {
        "plain-panel"
    }
}

fn config(models: Vec<ModelSpec>, gpus: u32, arrival: Arrival, popularity: Popularity, seed: u64) -> SimConfig {
    SimConfig {
        models,
        gpus,
        workload: Workload { rate_rps: 0.0, arrival, popularity, schedule: RateSchedule::default() },
        duration: Duration::from_millis(4000),
        warmup: Duration::from_millis(1000),
        seed,
        trace: None,
        admission: Default::default(),
    }
}

/// Goodput by bisection (10 halvings of `[0, ceiling]`, the cluster's
/// ceiling at the largest batches): the highest rate at which every
/// model's bad rate is at most 1%.
fn goodput(cfg: &SimConfig, make: &dyn Fn() -> Box<dyn Scheduler>) -> f64 {
    let (mut lo, mut hi) = (0.0, ideal_throughput(cfg));
    for _ in 0..10 {
        let mid = 0.5 * (lo + hi);
        let mut c = cfg.clone();
        c.workload.rate_rps = mid;
        let mut s = make();
        let r = simulate(&c, s.as_mut()).unwrap_or_else(|e| panic!("{}: {e}", s.name()));
        if r.max_model_bad_rate <= 0.01 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

fn a100(names: &[&str], slo_ms: Option<f64>) -> Vec<ModelSpec> {
    let zoo = Zoo::A100.models();
    names
        .iter()
        .map(|n| {
            let m = zoo.iter().find(|m| m.name == *n).unwrap_or_else(|| panic!("no {n} in the A100 zoo"));
            match slo_ms {
                Some(slo) => {
                    let (a, b) = m.profile.linear_coefficients().unwrap();
                    ModelSpec::linear(n, a, b, slo).unwrap()
                }
                None => m.clone(),
            }
        })
        .collect()
}

/// The cases: the (a 2-GPU, 2-model mix at a 16 ms SLO; six A100
/// models on 12 GPUs with Zipf popularity; nine on 16 GPUs), a bursty
/// strong-plus-weak pair, and a network delay.
fn cases() -> Vec<SimConfig> {
    let six = ["ResNet50", "VGG16", "EfficientNetV2S", "MobileNet", "DenseNet121", "ResNet101"];
    let nine = ["ResNet50", "VGG16", "EfficientNetV2S", "MobileNet", "DenseNet121", "ResNet101", "InceptionV3", "Xception", "ResNet152"];
    vec![
        config(a100(&["ResNet50", "VGG16"], Some(16.0)), 2, Arrival::Poisson, Popularity::Equal, 1),
        config(a100(&six, None), 12, Arrival::Poisson, Popularity::Zipf(0.9), 2),
        config(a100(&nine, None), 16, Arrival::Poisson, Popularity::Equal, 3),
        config(a100(&["ResNet50", "VGG16"], Some(25.0)), 4, Arrival::Gamma(0.2), Popularity::Equal, 4),
    ]
}

fn assert_within_3_percent(kind: PolicyKind, rule: Rule, early: bool) {
    for (i, cfg) in cases().into_iter().enumerate() {
        let delay = if i == 3 { NetworkDelay { d_ctrl: Duration::from_micros(200), d_data: Duration::from_micros(20) } } else { NetworkDelay::ZERO };
        let mut policy = PolicyConfig::new(kind);
        policy.delay = delay;
        let ours = goodput(&cfg, &|| build(&cfg.models, cfg.gpus, &policy).unwrap());
        let plain = goodput(&cfg, &|| Box::new(Plain::new(&cfg.models, cfg.gpus, delay, rule, early)));
        eprintln!("{kind} case {i}: ours {ours:.0} rps, second implementation {plain:.0} rps");
        assert!(plain > 0.0, "{kind} case {i}: the second implementation serves nothing");
        assert!((ours - plain).abs() <= 0.03 * plain, "{kind} case {i}: {ours:.0} rps is not within 3% of the second implementation's {plain:.0} rps");
    }
}

#[test]
fn eager_latest_start_matches_its_second_implementation() {
    assert_within_3_percent(PolicyKind::EagerLatestStart, Rule::LatestStart, false);
}

#[test]
fn eager_latest_start_with_early_drop_matches_its_second_implementation() {
    assert_within_3_percent(PolicyKind::EagerLatestStartEarly, Rule::LatestStart, true);
}

#[test]
fn clockwork_as_the_paper_describes_it_matches_its_second_implementation() {
    assert_within_3_percent(PolicyKind::ClockworkPaper, Rule::ClockworkPaper, false);
}

#[test]
fn eager_with_early_drop_matches_its_second_implementation() {
    assert_within_3_percent(PolicyKind::EagerEarly, Rule::Edf, true);
}

#[test]
fn eager_matches_its_second_implementation_on_the_panel_cases() {
    assert_within_3_percent(PolicyKind::Eager, Rule::Edf, false);
}

#[test]
fn shepherd_flex_without_preemption_matches_its_second_implementation() {
    assert_within_3_percent(PolicyKind::ShepherdFlex, Rule::Flex, false);
}
