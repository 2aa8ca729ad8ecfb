//! Open-loop arrival processes: Poisson, Gamma and uniform gaps, equal or
//! Zipf popularity, and piecewise-constant rate schedules. Seeded, and
//! independent per model so adding a model does not perturb the others.
//!
//! [`Arrivals`] is the one arrival generator: the simulator, the live
//! runtime's load generator and open-loop clients outside this crate take
//! their requests' intended times and models from it.

use crate::types::ModelId;
use crate::zoo::ModelSpec;
use dataplane::time::{Duration, Instant};
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp, Gamma};
use rand_xoshiro::Xoshiro256PlusPlus;

/// Why a workload option was refused; each variant names the text given.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WorkloadParseError {
    /// Not an arrival process.
    #[error("unknown arrival '{value}' (expected poisson, uniform or gamma:SHAPE with SHAPE > 0)")]
    Arrival {
        /// The text given.
        value: String,
    },
    /// Not a popularity.
    #[error("unknown popularity '{value}' (expected equal or zipf:S)")]
    Popularity {
        /// The text given.
        value: String,
    },
    /// A rate schedule step is malformed.
    #[error("schedule step '{step}': {what}")]
    ScheduleStep {
        /// The step given.
        step: String,
        /// What is wrong.
        what: &'static str,
    },
    /// Rate schedule steps out of order.
    #[error("schedule steps must have increasing times")]
    ScheduleOrder,
}

/// Shape of the inter-arrival gaps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arrival {
    /// Exponential gaps.
    Poisson,
    /// Constant gaps (random phase per model).
    Uniform,
    /// Gamma-distributed gaps with this shape (< 1 is burstier than Poisson).
    Gamma(f64),
}

impl Arrival {
    /// Parses `poisson`, `uniform` or `gamma:SHAPE`.
    pub fn parse(s: &str) -> Result<Self, WorkloadParseError> {
        match s {
            "poisson" => Ok(Arrival::Poisson),
            "uniform" => Ok(Arrival::Uniform),
            _ => match s.strip_prefix("gamma:").map(str::parse::<f64>) {
                Some(Ok(k)) if k.is_finite() && k > 0.0 => Ok(Arrival::Gamma(k)),
                _ => Err(WorkloadParseError::Arrival { value: s.to_string() }),
            },
        }
    }

    /// The squared coefficient of variation of the gaps: 1 for Poisson, 0
    /// for constant gaps, `1 / k` for Gamma(k). For a renewal process it is
    /// also the long-run index of dispersion of the counts (variance over
    /// mean of the arrivals in a window), so a count measured under
    /// Gamma(0.2) carries as much information as one a fifth its size under
    /// Poisson.
    pub fn gap_cv2(&self) -> f64 {
        match *self {
            Arrival::Poisson => 1.0,
            Arrival::Uniform => 0.0,
            Arrival::Gamma(k) => 1.0 / k,
        }
    }
}

/// How the total rate is split across models.
#[derive(Clone, Debug, PartialEq)]
pub enum Popularity {
    /// Every model gets the same share.
    Equal,
    /// Model `i` (0-based) gets a share proportional to `1/(i+1)^s`.
    Zipf(f64),
    /// Explicit relative weights, one per model.
    Weights(Vec<f64>),
}

impl Popularity {
    /// Parses `equal` or `zipf:S`.
    pub fn parse(s: &str) -> Result<Self, WorkloadParseError> {
        match s {
            "equal" => Ok(Popularity::Equal),
            _ => match s.strip_prefix("zipf:").map(str::parse::<f64>) {
                Some(Ok(z)) if z.is_finite() && z >= 0.0 => Ok(Popularity::Zipf(z)),
                _ => Err(WorkloadParseError::Popularity { value: s.to_string() }),
            },
        }
    }

    /// Normalised shares for `n` models (sum to 1).
    pub fn shares(&self, n: usize) -> Vec<f64> {
        let raw: Vec<f64> = match self {
            Popularity::Equal => vec![1.0; n],
            Popularity::Zipf(s) => (0..n).map(|i| 1.0 / ((i + 1) as f64).powf(*s)).collect(),
            Popularity::Weights(w) => (0..n).map(|i| w.get(i).copied().unwrap_or(0.0).max(0.0)).collect(),
        };
        let total: f64 = raw.iter().sum();
        if total > 0.0 {
            raw.iter().map(|w| w / total).collect()
        } else {
            vec![0.0; n]
        }
    }
}

/// Piecewise-constant multiplier of the base rate: `(start, multiplier)`
/// steps sorted by start; before the first step the multiplier is 1.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RateSchedule {
    /// The steps.
    pub steps: Vec<(Duration, f64)>,
}

impl RateSchedule {
    /// Parses `T0:M0,T1:M1,...` (seconds : multiplier).
    pub fn parse(s: &str) -> Result<Self, WorkloadParseError> {
        let mut steps = Vec::new();
        for part in s.split(',').filter(|p| !p.trim().is_empty()) {
            let bad = |what| WorkloadParseError::ScheduleStep { step: part.to_string(), what };
            let (t, m) = part.split_once(':').ok_or(bad("expected SECONDS:MULTIPLIER"))?;
            let t: f64 = t.trim().parse().map_err(|_| bad("bad time"))?;
            let m: f64 = m.trim().parse().map_err(|_| bad("bad multiplier"))?;
            if !(t.is_finite() && t >= 0.0 && m.is_finite() && m >= 0.0) {
                return Err(bad("must have time >= 0 and multiplier >= 0"));
            }
            steps.push((Duration::from_secs_f64(t), m));
        }
        if steps.windows(2).any(|w| w[1].0 <= w[0].0) {
            return Err(WorkloadParseError::ScheduleOrder);
        }
        Ok(RateSchedule { steps })
    }

    /// The multiplier in force at `t` and when it next changes.
    fn at(&self, t: Instant) -> (f64, Option<Instant>) {
        let t = Duration::from_nanos(t.as_nanos());
        let idx = self.steps.partition_point(|(s, _)| *s <= t);
        let mult = if idx == 0 { 1.0 } else { self.steps[idx - 1].1 };
        let next = self.steps.get(idx).map(|(s, _)| Instant::from_nanos(s.as_nanos()));
        (mult, next)
    }
}

/// The offered load of one run.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    /// Total base rate over all models, requests per second.
    pub rate_rps: f64,
    /// Gap distribution.
    pub arrival: Arrival,
    /// Split across models.
    pub popularity: Popularity,
    /// Optional rate schedule.
    pub schedule: RateSchedule,
}

impl Workload {
    /// Poisson, equal popularity, constant rate.
    pub fn poisson(rate_rps: f64) -> Self {
        Workload { rate_rps, arrival: Arrival::Poisson, popularity: Popularity::Equal, schedule: RateSchedule::default() }
    }
}

/// Arrival times of one model.
pub struct ArrivalStream {
    rng: Xoshiro256PlusPlus,
    base_rps: f64,
    arrival: Arrival,
    schedule: RateSchedule,
    next: Instant,
    /// The gap distribution at the rate it was built for: rebuilt only when
    /// the rate changes (a schedule step), not per draw (for `Gamma`, a
    /// square root and several divisions per arrival). The draws are the
    /// same either way.
    gaps: Option<(f64, Gaps)>,
    /// Without a schedule (a constant rate, every generated workload
    /// without `--schedule`): the gap distribution at that rate, built
    /// once, so an arrival is one draw and one addition (the general path
    /// looks the rate up, checks it and matches the kept distribution per
    /// draw). `None` with a schedule or a rate that is not positive.
    steady: Option<Gaps>,
}

/// A random gap distribution, or the mean where its parameters are invalid.
#[derive(Clone, Copy)]
enum Gaps {
    Exp(Exp<f64>),
    Gamma(Gamma<f64>),
    Mean,
}

/// `Duration::from_secs_f64(s)`, the same nanoseconds for every `s`,
/// without its call to the C library's `round` (the x86-64 baseline has no
/// rounding instruction; about a tenth of an arrival's cost). Below 2^52
/// the integer part `i` is exact and so is `x - i` (Sterbenz: `i <= x <
/// i + 1 <= 2i`), so comparing it with 0.5 rounds half away from zero
/// exactly as `round` does; from 2^52 up every double is an integer.
#[inline]
fn secs_to_duration(s: f64) -> Duration {
    // NaN, infinities and non-positive values: zero, as `from_secs_f64`.
    if !(s.is_finite() && s > 0.0) {
        return Duration::ZERO;
    }
    let x = s * 1e9;
    const EXACT_INTEGERS: f64 = (1u64 << 52) as f64;
    if x < EXACT_INTEGERS {
        let i = x as u64;
        // Added, not branched on: the fraction is a coin toss per draw.
        Duration::from_nanos(i + u64::from(x - i as f64 >= 0.5))
    } else if x >= u64::MAX as f64 {
        Duration::from_nanos(u64::MAX)
    } else {
        Duration::from_nanos(x as u64)
    }
}

fn mix_seed(seed: u64, stream: u64) -> u64 {
    // SplitMix64 finaliser: decorrelates per-model streams of one seed.
    let mut z = seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl ArrivalStream {
    /// The stream of model `index` under `workload` with `seed`.
    pub fn new(workload: &Workload, share: f64, index: usize, seed: u64) -> Self {
        let mut s = ArrivalStream {
            rng: Xoshiro256PlusPlus::seed_from_u64(mix_seed(seed, index as u64 + 1)),
            base_rps: workload.rate_rps * share,
            arrival: workload.arrival,
            schedule: workload.schedule.clone(),
            next: Instant::ZERO,
            gaps: None,
            steady: None,
        };
        let rate = s.base_rps;
        if s.schedule.steps.is_empty() && rate > 0.0 && rate.is_finite() {
            // What `gap_at(rate, 1.0)` would build and use on every draw.
            let mean = 1.0 / rate;
            s.steady = Some(match s.arrival {
                Arrival::Uniform => Gaps::Mean,
                Arrival::Poisson => Exp::new(rate).map_or(Gaps::Mean, Gaps::Exp),
                Arrival::Gamma(k) => Gamma::new(k, mean / k).map_or(Gaps::Mean, Gaps::Gamma),
            });
        }
        s.next = match s.arrival {
            // A random phase, so uniform streams of several models interleave.
            Arrival::Uniform => {
                let phase = s.rng.random::<f64>();
                s.advance_from(Instant::ZERO, phase)
            }
            _ => s.advance_from(Instant::ZERO, 1.0),
        };
        s
    }

    /// The next arrival time (`Instant::NEVER` if the rate is zero forever).
    pub fn peek(&self) -> Instant {
        self.next
    }

    /// Consumes the next arrival and draws the one after.
    #[inline]
    pub fn advance(&mut self) -> Instant {
        let t = self.next;
        self.next = match self.steady {
            // `advance_from(t, 1.0)` at a constant rate: the same draw
            // (`mean * 1.0` is `mean` for uniform gaps) and the same sum.
            Some(gaps) => {
                let gap_s = match gaps {
                    Gaps::Exp(d) => d.sample(&mut self.rng),
                    Gaps::Gamma(d) => d.sample(&mut self.rng),
                    Gaps::Mean => 1.0 / self.base_rps,
                };
                t + secs_to_duration(gap_s)
            }
            None => self.advance_from(t, 1.0),
        };
        t
    }

    /// One gap at `rate` (finite, positive); `fraction` scales a uniform gap.
    fn gap_at(&mut self, rate: f64, fraction: f64) -> f64 {
        let mean = 1.0 / rate;
        let gaps = match (self.arrival, self.gaps) {
            (Arrival::Uniform, _) => return mean * fraction,
            (_, Some((r, g))) if r == rate => g,
            (Arrival::Poisson, _) => Exp::new(rate).map_or(Gaps::Mean, Gaps::Exp),
            (Arrival::Gamma(k), _) => Gamma::new(k, mean / k).map_or(Gaps::Mean, Gaps::Gamma),
        };
        self.gaps = Some((rate, gaps));
        match gaps {
            Gaps::Exp(d) => d.sample(&mut self.rng),
            Gaps::Gamma(d) => d.sample(&mut self.rng),
            Gaps::Mean => mean,
        }
    }

    /// Draws the gap after `from`; `fraction` scales a uniform gap (phase).
    fn advance_from(&mut self, mut from: Instant, fraction: f64) -> Instant {
        if self.schedule.steps.is_empty() {
            // A constant rate (every generated workload without
            // `--schedule`): the loop below with one pass and no step to
            // cross, without looking the step up per arrival.
            let rate = self.base_rps;
            if rate <= 0.0 || !rate.is_finite() {
                return Instant::NEVER;
            }
            return from + secs_to_duration(self.gap_at(rate, fraction));
        }
        // Bounded: each pass either returns or moves to the next schedule step.
        for _ in 0..=self.schedule.steps.len() + 1 {
            let (mult, step_end) = self.schedule.at(from);
            let rate = self.base_rps * mult;
            if rate <= 0.0 || !rate.is_finite() {
                match step_end {
                    Some(t) => {
                        from = t;
                        continue;
                    }
                    None => return Instant::NEVER,
                }
            }
            let gap_s = self.gap_at(rate, fraction);
            let t = from + secs_to_duration(gap_s);
            match step_end {
                // The draw crosses into a new rate: restart the gap there
                // (exact for Poisson, a close approximation otherwise).
                Some(end) if t > end => from = end,
                _ => return t,
            }
        }
        Instant::NEVER
    }
}

/// The arrivals of one run, in time order: each model's [`ArrivalStream`]
/// merged by a [`LoserTree`] (equal times go to the lower model id), or a recorded
/// trace. Every arrival is `(intended time, model)`, shifted by the origin.
pub struct Arrivals {
    source: Source,
    /// Added to every time of the source.
    origin: Duration,
}

enum Source {
    Streams { streams: Vec<ArrivalStream>, merge: LoserTree, end: Instant },
    /// One Poisson stream at the total rate, each arrival's model drawn
    /// uniformly by `pick` (see [`Arrivals::pooled_for_model_count`]).
    Pooled { stream: ArrivalStream, pick: Xoshiro256PlusPlus, models: u32, model: ModelId, end: Instant },
    Trace { trace: Vec<(Instant, ModelId)>, next: usize },
}

impl Arrivals {
    /// `workload` over `models` (model id = index) with `seed`, for arrivals
    /// before `duration`.
    pub fn generated(models: &[ModelSpec], workload: &Workload, seed: u64, duration: Duration) -> Self {
        Self::for_model_count(models.len(), workload, seed, duration)
    }

    /// [`Arrivals::generated`] for `models` models known only by count.
    pub fn for_model_count(models: usize, workload: &Workload, seed: u64, duration: Duration) -> Self {
        let end = Instant::ZERO + duration;
        let shares = workload.popularity.shares(models);
        let streams: Vec<ArrivalStream> =
            shares.iter().enumerate().map(|(i, &s)| ArrivalStream::new(workload, s, i, seed)).collect();
        let merge = LoserTree::new(streams.iter().map(|s| Some(s.peek()).filter(|&t| t < end)));
        Arrivals { source: Source::Streams { streams, merge, end }, origin: Duration::ZERO }
    }

    /// Each model `i` under its own `workloads[i]` (its whole rate, its
    /// own schedule: a mix whose shares change over the run), with
    /// `seed`, for arrivals before `duration`. Model `i`'s stream is the
    /// one [`Arrivals::for_model_count`] would draw for it at share 1.
    pub fn per_model(workloads: &[Workload], seed: u64, duration: Duration) -> Self {
        let end = Instant::ZERO + duration;
        let streams: Vec<ArrivalStream> = workloads.iter().enumerate().map(|(i, w)| ArrivalStream::new(w, 1.0, i, seed)).collect();
        let merge = LoserTree::new(streams.iter().map(|s| Some(s.peek()).filter(|&t| t < end)));
        Arrivals { source: Source::Streams { streams, merge, end }, origin: Duration::ZERO }
    }

    /// The same process as [`Arrivals::for_model_count`] when the models
    /// share the rate equally and arrive as Poisson processes: then their
    /// superposition is one Poisson process at the total rate (under the
    /// same rate schedule) whose arrivals belong to each model with equal
    /// probability, independently. Drawn that way, an arrival costs one
    /// exponential and one uniform draw instead of a heap turn over every
    /// model's stream (a third of the bench-cluster frontends' CPU at
    /// 20 models). Equal in distribution, not in sequence: the simulator's
    /// seeded figures keep [`Arrivals::for_model_count`]. Other workloads
    /// (Zipf, uniform or Gamma gaps) fall back to it.
    pub fn pooled_for_model_count(models: usize, workload: &Workload, seed: u64, duration: Duration) -> Self {
        let Ok(count) = u32::try_from(models) else { return Self::for_model_count(models, workload, seed, duration) };
        if count == 0 || workload.arrival != Arrival::Poisson || workload.popularity != Popularity::Equal {
            return Self::for_model_count(models, workload, seed, duration);
        }
        let end = Instant::ZERO + duration;
        // Seeds no model's stream uses (theirs are `mix_seed(seed, 1..)`
        // for model indices far below 2^32).
        let stream = ArrivalStream::new(workload, 1.0, u32::MAX as usize, seed);
        let mut pick = Xoshiro256PlusPlus::seed_from_u64(mix_seed(seed, 0));
        let model = pick_model(&mut pick, count);
        Arrivals { source: Source::Pooled { stream, pick, models: count, model, end }, origin: Duration::ZERO }
    }

    /// A recorded trace of `(time, model)`, replayed in its order (sorted by
    /// time for a meaningful run).
    pub fn trace(trace: Vec<(Instant, ModelId)>) -> Self {
        Arrivals { source: Source::Trace { trace, next: 0 }, origin: Duration::ZERO }
    }

    /// Shifts every arrival by `origin` (time zero of the source is `origin`).
    pub fn with_origin(mut self, origin: Instant) -> Self {
        self.origin = Duration::from_nanos(origin.as_nanos());
        self
    }

    /// The next arrival `(time, model)` without consuming it.
    pub fn peek(&self) -> Option<(Instant, ModelId)> {
        let (t, m) = match &self.source {
            Source::Streams { merge, .. } => merge.peek()?,
            Source::Pooled { stream, model, end, .. } => Some((stream.peek(), *model)).filter(|&(t, _)| t < *end)?,
            Source::Trace { trace, next } => *trace.get(*next)?,
        };
        Some((t + self.origin, m))
    }

    /// The next arrival's time.
    pub fn peek_time(&self) -> Option<Instant> {
        self.peek().map(|(t, _)| t)
    }
}

impl Iterator for Arrivals {
    type Item = (Instant, ModelId);

    /// Consumes the next arrival `(time, model)`.
    fn next(&mut self) -> Option<(Instant, ModelId)> {
        let (t, m) = match &mut self.source {
            Source::Streams { streams, merge, end } => {
                let (t, m) = merge.peek()?;
                let s = &mut streams[m as usize];
                s.advance();
                merge.replace_winner(m, Some(s.peek()).filter(|&next| next < *end));
                (t, m)
            }
            Source::Pooled { stream, pick, models, model, end } => {
                if stream.peek() >= *end {
                    return None;
                }
                let a = (stream.advance(), *model);
                *model = pick_model(pick, *models);
                a
            }
            Source::Trace { trace, next } => {
                let a = *trace.get(*next)?;
                *next += 1;
                a
            }
        };
        Some((t + self.origin, m))
    }
}

/// The next arrival of every stream, merged: a tree of losers (a
/// tournament over the streams where each inner node keeps the stream that
/// lost there and the root the overall winner). Only the winner's time ever
/// changes (its stream draws its next arrival), so replaying its path
/// takes one comparison per level against the loser kept there, reading
/// no sibling (a winner tree reads both children per level). Which side
/// wins is a coin toss per level, so the replay selects without branching
/// (a branch there mispredicted about 3.5 times per arrival in
/// cachegrind's model and cost the cycles the tree saved). Every key
/// `(time, stream)` is distinct, so any correct merge yields the same
/// order: earliest time, then the lower model id.
struct LoserTree {
    /// Each stream's next arrival in nanoseconds (`NEVER`: none left).
    times: Vec<u64>,
    /// `nodes[0]`: the winning stream; `nodes[k]` for inner node `k`
    /// (`1..streams`): the stream that lost there. Leaf `i` is node
    /// `streams + i` (not stored), and node `k`'s children are `2k` and
    /// `2k + 1`, for any number of streams.
    nodes: Vec<u32>,
}

impl LoserTree {
    /// `None`: the stream has no arrival left.
    fn new(next: impl ExactSizeIterator<Item = Option<Instant>>) -> Self {
        let times: Vec<u64> = next.map(|t| t.unwrap_or(Instant::NEVER).as_nanos()).collect();
        let streams = times.len();
        let mut tree = LoserTree { times, nodes: vec![0; streams.max(1)] };
        // Every node's winner, leaves included, bottom-up; an inner node
        // keeps the other child's winner.
        let mut winners = vec![0u32; 2 * streams.max(1)];
        for (i, w) in winners.iter_mut().skip(streams).enumerate() {
            *w = i as u32;
        }
        for k in (1..streams).rev() {
            let (a, b) = (winners[2 * k], winners[2 * k + 1]);
            let (win, lose) = if tree.before(b, a) { (b, a) } else { (a, b) };
            winners[k] = win;
            tree.nodes[k] = lose;
        }
        // Node 1 is the root (with one stream, its leaf).
        tree.nodes[0] = winners[1];
        tree
    }

    /// Whether stream `a`'s key `(time, id)` is below stream `b`'s,
    /// computed without branching.
    #[inline]
    fn before(&self, a: u32, b: u32) -> bool {
        let (ta, tb) = (self.times[a as usize], self.times[b as usize]);
        (ta < tb) | ((ta == tb) & (a < b))
    }

    /// The earliest `(time, model)`, `None` when every stream has ended.
    #[inline]
    fn peek(&self) -> Option<(Instant, ModelId)> {
        let w = self.nodes[0];
        // Streams only hold times before the end, so `NEVER` marks one
        // that ended; no stream at all has no time.
        let t = *self.times.get(w as usize)?;
        (t != u64::MAX).then_some((Instant::from_nanos(t), w))
    }

    /// The winning stream, `model`, has its next arrival at `next`
    /// (`None`: it ended).
    #[inline]
    fn replace_winner(&mut self, model: ModelId, next: Option<Instant>) {
        self.times[model as usize] = next.unwrap_or(Instant::NEVER).as_nanos();
        let mut cur = model;
        let mut k = (self.times.len() + model as usize) / 2;
        while k >= 1 {
            let lost = self.nodes[k];
            let lost_wins = self.before(lost, cur);
            self.nodes[k] = std::hint::select_unpredictable(lost_wins, cur, lost);
            cur = std::hint::select_unpredictable(lost_wins, lost, cur);
            k /= 2;
        }
        self.nodes[0] = cur;
    }
}

/// A model id uniform over `0..models` (`models` > 0): the high half of a
/// 64 x 32-bit product (bias below 2^-32, no division).
#[inline]
fn pick_model(rng: &mut Xoshiro256PlusPlus, models: u32) -> ModelId {
    ((u64::from(rng.random::<u32>()) * u64::from(models)) >> 32) as ModelId
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_match_on_average_and_are_seeded() {
        for arrival in [Arrival::Poisson, Arrival::Uniform, Arrival::Gamma(0.2)] {
            let w = Workload { rate_rps: 1000.0, arrival, popularity: Popularity::Equal, schedule: RateSchedule::default() };
            let mut s = ArrivalStream::new(&w, 1.0, 0, 7);
            let mut n = 0;
            while s.advance() < Instant::from_nanos(20_000_000_000) {
                n += 1;
            }
            assert!((n as f64 - 20_000.0).abs() < 20_000.0 * 0.05, "{arrival:?}: {n}");
            let mut a = ArrivalStream::new(&w, 1.0, 3, 7);
            let mut b = ArrivalStream::new(&w, 1.0, 3, 7);
            for _ in 0..100 {
                assert_eq!(a.advance(), b.advance());
            }
        }
    }

    /// Every gap as a distribution built afresh for each draw gives it (the
    /// stream keeps one per rate), across a schedule's rate steps.
    #[test]
    fn the_kept_gap_distribution_draws_what_a_fresh_one_draws() {
        let schedule = RateSchedule::parse("0:1,0.5:3,1:0.5").unwrap();
        for arrival in [Arrival::Poisson, Arrival::Gamma(0.2), Arrival::Gamma(2.0)] {
            let w = Workload { rate_rps: 800.0, arrival, popularity: Popularity::Equal, schedule: schedule.clone() };
            let mut s = ArrivalStream::new(&w, 1.0, 2, 11);
            let mut rng = Xoshiro256PlusPlus::seed_from_u64(mix_seed(11, 3));
            let mut from = Instant::ZERO;
            let mut n = 0;
            while from < Instant::ZERO + Duration::from_millis(1500) {
                let (mult, step_end) = schedule.at(from);
                let rate = 800.0 * mult;
                let gap = match arrival {
                    Arrival::Gamma(k) => Gamma::new(k, 1.0 / rate / k).unwrap().sample(&mut rng),
                    _ => Exp::new(rate).unwrap().sample(&mut rng),
                };
                let t = from + Duration::from_secs_f64(gap);
                match step_end {
                    Some(end) if t > end => from = end,
                    _ => {
                        assert_eq!(s.advance(), t, "{arrival:?}, arrival {n}");
                        from = t;
                        n += 1;
                    }
                }
            }
            assert!(n > 1000, "{arrival:?}: {n}");
        }
    }

    /// At a constant rate the stream's one-time distribution draws the
    /// gaps a fresh one draws, summed as `Duration::from_secs_f64` rounds.
    #[test]
    fn the_steady_gap_distribution_draws_what_a_fresh_one_draws() {
        for arrival in [Arrival::Poisson, Arrival::Gamma(0.2), Arrival::Gamma(2.0), Arrival::Uniform] {
            let w = Workload { rate_rps: 777.0, arrival, popularity: Popularity::Equal, schedule: RateSchedule::default() };
            let mut s = ArrivalStream::new(&w, 1.0, 4, 13);
            let mut rng = Xoshiro256PlusPlus::seed_from_u64(mix_seed(13, 5));
            let mut t = match arrival {
                Arrival::Uniform => Instant::ZERO + Duration::from_secs_f64(rng.random::<f64>() / 777.0),
                _ => Instant::ZERO,
            };
            for n in 0..5_000 {
                let gap = match arrival {
                    Arrival::Gamma(k) => Gamma::new(k, 1.0 / 777.0 / k).unwrap().sample(&mut rng),
                    Arrival::Poisson => Exp::new(777.0).unwrap().sample(&mut rng),
                    Arrival::Uniform => 1.0 / 777.0,
                };
                if n > 0 || arrival != Arrival::Uniform {
                    t += Duration::from_secs_f64(gap);
                }
                assert_eq!(s.advance(), t, "{arrival:?}, arrival {n}");
            }
        }
    }

    /// The rounding without `round` gives `Duration::from_secs_f64`'s
    /// nanoseconds: at every half-nanosecond edge, at the exact-integer
    /// boundary, at saturation and on random seconds of every magnitude.
    #[test]
    fn secs_to_duration_rounds_as_from_secs_f64() {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(3);
        let mut cases = vec![0.0, -0.0, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, f64::MIN_POSITIVE, 1e-300, f64::MAX, 1.8e10, 1.9e10, 1e300];
        for ns in [0.5f64, 1.5, 2.5, 0.49999999999999994, 4503599627370495.5, 4503599627370496.0, 9007199254740993.0, u64::MAX as f64] {
            for x in [ns, next_up(ns), next_down(ns)] {
                cases.push(x / 1e9);
            }
        }
        cases.extend((0..200_000).map(|_| rng.random::<f64>() * 10f64.powi(rng.random_range(-12..12))));
        cases.extend((0..20_000).map(|_| f64::from_bits(rng.random::<u64>())));
        for s in cases {
            assert_eq!(secs_to_duration(s), Duration::from_secs_f64(s), "{s:e} s");
        }
    }

    fn next_up(x: f64) -> f64 {
        f64::from_bits(x.to_bits() + 1)
    }

    fn next_down(x: f64) -> f64 {
        f64::from_bits(x.to_bits() - 1)
    }

    #[test]
    fn pooled_arrivals_match_the_merged_streams_in_rate_and_mix() {
        let w = Workload::poisson(20_000.0);
        let d = Duration::from_millis(2000);
        let pooled: Vec<_> = Arrivals::pooled_for_model_count(20, &w, 5, d).collect();
        assert_eq!(pooled, Arrivals::pooled_for_model_count(20, &w, 5, d).collect::<Vec<_>>(), "seeded");
        let merged = Arrivals::for_model_count(20, &w, 5, d).count();
        assert!((pooled.len() as f64 - 40_000.0).abs() < 40_000.0 * 0.03, "{}", pooled.len());
        assert!((merged as f64 - 40_000.0).abs() < 40_000.0 * 0.03, "{merged}");
        assert!(pooled.windows(2).all(|p| p[0].0 <= p[1].0) && pooled.iter().all(|&(t, _)| t < Instant::ZERO + d));
        let mut per_model = [0u32; 20];
        for &(_, m) in &pooled {
            per_model[m as usize] += 1;
        }
        assert!(per_model.iter().all(|&n| (1_700..2_300).contains(&n)), "{per_model:?}");
        // Not Poisson with equal shares: the merged streams, seed for seed.
        let z = Workload { popularity: Popularity::parse("zipf:1").unwrap(), ..Workload::poisson(1000.0) };
        assert!(Arrivals::pooled_for_model_count(4, &z, 3, d).eq(Arrivals::for_model_count(4, &z, 3, d)));
    }

    /// The merge yields every stream's arrivals before the end, sorted by
    /// (time, model), for any number of streams (padding, one, none) and
    /// streams that end early (a zero share, a rate that drops to zero).
    #[test]
    fn merged_streams_are_every_arrival_in_time_then_model_order() {
        let d = Duration::from_millis(300);
        let end = Instant::ZERO + d;
        for (models, workload) in [
            (0, Workload::poisson(1000.0)),
            (1, Workload::poisson(1000.0)),
            (5, Workload { popularity: Popularity::Weights(vec![1.0, 0.0, 2.0, 1.0, 0.5]), ..Workload::poisson(3000.0) }),
            (9, Workload { arrival: Arrival::Uniform, ..Workload::poisson(900.0) }),
            (37, Workload { schedule: RateSchedule::parse("0:1,0.1:0").unwrap(), arrival: Arrival::Gamma(0.3), ..Workload::poisson(20_000.0) }),
        ] {
            let shares = workload.popularity.shares(models);
            let mut want = Vec::new();
            for (i, &share) in shares.iter().enumerate() {
                let mut s = ArrivalStream::new(&workload, share, i, 7);
                while s.peek() < end {
                    want.push((s.advance(), i as ModelId));
                }
            }
            want.sort_unstable();
            let got: Vec<_> = Arrivals::for_model_count(models, &workload, 7, d).collect();
            assert!(!got.is_empty() || models == 0);
            assert_eq!(got, want, "{models} models");
        }
    }

    #[test]
    fn schedule_changes_the_rate() {
        let sched = RateSchedule::parse("0:1,1:0,2:3").unwrap();
        let w = Workload { rate_rps: 1000.0, arrival: Arrival::Poisson, popularity: Popularity::Equal, schedule: sched };
        let mut s = ArrivalStream::new(&w, 1.0, 0, 1);
        let mut per_second = [0u32; 3];
        loop {
            let t = s.advance();
            let sec = (t.as_nanos() / 1_000_000_000) as usize;
            if sec >= 3 {
                break;
            }
            per_second[sec] += 1;
        }
        assert_eq!(per_second[1], 0);
        assert!((900..1100).contains(&per_second[0]), "{per_second:?}");
        assert!((2800..3200).contains(&per_second[2]), "{per_second:?}");
        assert!(RateSchedule::parse("1:1,0:2").is_err());
        assert!(Arrival::parse("gamma:-1").is_err());
        assert_eq!(Popularity::parse("zipf:1").unwrap().shares(2), vec![2.0 / 3.0, 1.0 / 3.0]);
    }
}
