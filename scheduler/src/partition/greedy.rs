//! The heuristic partitioner: a greedy start (longest rate first, each model
//! to the least loaded sub-cluster it fits) and a seeded iterated local
//! search of single moves and pairwise swaps.
//!
//! States are compared lexicographically by (constraint violation,
//! objective `ΔR + w·ΔS`, sum of squared relative deviations): the first
//! key lets the search repair an infeasible start (a re-partition whose new
//! models do not fit), the third breaks the plateaus of the max-based
//! objective so that moves away from the extremes still count as progress.
//! A move that would exceed `C_max` is never taken, so `C_max` holds in
//! every state the search visits. Deterministic for a given seed: no clock
//! is read, the work is bounded by a round count.

use super::{Assignment, PartitionError, Problem, MIB};
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

/// Search effort.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// Seed of the perturbations.
    pub seed: u64,
    /// Perturb-and-descend rounds after the first descent.
    pub rounds: u32,
}

impl Options {
    /// Rounds scaled so that every instance size takes a bounded time
    /// (about a second of CPU at 800 models × 20 sub-clusters, release build).
    pub fn for_problem(p: &Problem, seed: u64) -> Options {
        let (n, k) = (p.models.len() as f64, p.sub_clusters as f64);
        let work_per_round = n * k * k + 4.0 * n * n + 1.0;
        let rounds = (3.0e7 / work_per_round).clamp(4.0, 400.0) as u32;
        Options { seed, rounds }
    }
}

/// Finds a feasible assignment, or says none was found.
pub fn solve(p: &Problem, opts: &Options) -> Result<Assignment, PartitionError> {
    p.validate()?;
    let mut st = State::new(p);
    st.greedy_start();
    st.descend();
    let mut best = st.assign.clone();
    let mut best_score = st.score();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(opts.seed);
    for _ in 0..opts.rounds {
        st.perturb(&mut rng);
        st.descend();
        let s = st.score();
        if s.better_than(&best_score) {
            best.clone_from(&st.assign);
            best_score = s;
        } else {
            st.reset_to(&best);
        }
    }
    if best_score.violation > VIOLATION_EPS {
        return Err(PartitionError::Infeasible(format!(
            "the heuristic found no assignment within memory{}{} ({:.1} over)",
            if p.rate_max.is_some() { ", R_max" } else { "" },
            if p.c_max_bytes.is_some() { " and C_max" } else { "" },
            best_score.violation
        )));
    }
    Ok(Assignment { sub_cluster: best })
}

const VIOLATION_EPS: f64 = 1e-9;

/// A state's rank: lower is better, compared lexicographically.
#[derive(Clone, Copy, Debug)]
struct Score {
    violation: f64,
    objective: f64,
    spread: f64,
}

impl Score {
    fn better_than(&self, o: &Score) -> bool {
        let tol = |a: f64, b: f64| 1e-9 * (1.0 + a.abs().max(b.abs()));
        if (self.violation - o.violation).abs() > tol(self.violation, o.violation) {
            return self.violation < o.violation;
        }
        if (self.objective - o.objective).abs() > tol(self.objective, o.objective) {
            return self.objective < o.objective;
        }
        self.spread < o.spread - tol(self.spread, o.spread)
    }
}

/// One sub-cluster's totals after a tentative change.
#[derive(Clone, Copy)]
struct Totals {
    rate: f64,
    static_mib: f64,
    max_dynamic_mib: f64,
}

struct State<'a> {
    p: &'a Problem,
    rate: Vec<f64>,
    size: Vec<f64>,
    dynamic: Vec<f64>,
    prev: Vec<Option<usize>>,
    cap: f64,
    rate_max: f64,
    c_max: f64,
    rbar: f64,
    sbar: f64,
    w: f64,
    assign: Vec<usize>,
    members: Vec<Vec<usize>>,
    totals: Vec<Totals>,
    /// Per sub-cluster: the largest dynamic size, its model, and the second largest.
    top2: Vec<(f64, usize, f64)>,
    moved: f64,
}

impl<'a> State<'a> {
    fn new(p: &'a Problem) -> Self {
        let k = p.sub_clusters;
        let n = p.models.len();
        State {
            p,
            rate: p.models.iter().map(|m| m.rate).collect(),
            size: p.models.iter().map(|m| m.static_bytes as f64 / MIB).collect(),
            dynamic: p.models.iter().map(|m| m.dynamic_bytes as f64 / MIB).collect(),
            prev: (0..n).map(|i| p.previous_of(i)).collect(),
            cap: p.memory_bytes as f64 / MIB,
            rate_max: p.rate_max.unwrap_or(f64::INFINITY),
            c_max: p.c_max_bytes.map_or(f64::INFINITY, |c| c as f64 / MIB),
            rbar: p.mean_rate(),
            sbar: p.mean_static_mib(),
            w: p.w(),
            assign: vec![usize::MAX; n],
            members: vec![Vec::new(); k],
            totals: vec![Totals { rate: 0.0, static_mib: 0.0, max_dynamic_mib: 0.0 }; k],
            top2: vec![(0.0, usize::MAX, 0.0); k],
            moved: 0.0,
        }
    }

    fn move_cost(&self, i: usize, to: usize) -> f64 {
        match self.prev[i] {
            Some(p) if p != to => self.size[i],
            _ => 0.0,
        }
    }

    /// Places models: previous ones where they were, the others longest
    /// rate first into the least loaded sub-cluster that fits them.
    fn greedy_start(&mut self) {
        let n = self.p.models.len();
        let mut fresh = Vec::new();
        for i in 0..n {
            match self.prev[i] {
                Some(j) => self.assign[i] = j,
                None => fresh.push(i),
            }
        }
        self.rebuild();
        fresh.sort_by(|&a, &b| self.rate[b].total_cmp(&self.rate[a]).then(self.size[b].total_cmp(&self.size[a])).then(a.cmp(&b)));
        let sw = if self.sbar > 0.0 { self.p.memory_weight / self.sbar } else { 0.0 };
        let rw = if self.rbar > 0.0 { 1.0 / self.rbar } else { 0.0 };
        for i in fresh {
            let mut best: Option<(bool, f64, usize)> = None;
            for j in 0..self.p.sub_clusters {
                let t = self.totals[j];
                let mem = t.static_mib + self.size[i] + t.max_dynamic_mib.max(self.dynamic[i]);
                let fits = mem <= self.cap && t.rate + self.rate[i] <= self.rate_max;
                // Among sub-clusters that fit: least loaded; if none fits: least overflow.
                let key = if fits { t.rate * rw + t.static_mib * sw } else { mem - self.cap };
                if best.is_none_or(|(bf, bk, _)| (fits && !bf) || (fits == bf && key < bk)) {
                    best = Some((fits, key, j));
                }
            }
            let j = best.map_or(0, |b| b.2);
            self.place(i, j);
        }
    }

    fn place(&mut self, i: usize, j: usize) {
        self.assign[i] = j;
        self.members[j].push(i);
        let t = &mut self.totals[j];
        t.rate += self.rate[i];
        t.static_mib += self.size[i];
        self.refresh_top2(j);
    }

    /// Recomputes every total from `assign` (also clears float drift).
    fn rebuild(&mut self) {
        for m in &mut self.members {
            m.clear();
        }
        for t in &mut self.totals {
            *t = Totals { rate: 0.0, static_mib: 0.0, max_dynamic_mib: 0.0 };
        }
        self.moved = 0.0;
        for i in 0..self.assign.len() {
            let j = self.assign[i];
            if j == usize::MAX {
                continue;
            }
            self.members[j].push(i);
            self.totals[j].rate += self.rate[i];
            self.totals[j].static_mib += self.size[i];
            self.moved += self.move_cost(i, j);
        }
        for j in 0..self.p.sub_clusters {
            self.refresh_top2(j);
        }
    }

    fn refresh_top2(&mut self, j: usize) {
        let mut top = (0.0, usize::MAX, 0.0);
        for &i in &self.members[j] {
            let d = self.dynamic[i];
            if top.1 == usize::MAX || d > top.0 {
                top = (d, i, top.0);
            } else if d > top.2 {
                top.2 = d;
            }
        }
        self.top2[j] = top;
        self.totals[j].max_dynamic_mib = top.0;
    }

    /// The largest dynamic size of sub-cluster `j` without model `i`.
    fn max_dynamic_without(&self, j: usize, i: usize) -> f64 {
        let (m1, who, m2) = self.top2[j];
        if who == i {
            m2
        } else {
            m1
        }
    }

    fn violation_of(&self, t: &Totals) -> f64 {
        (t.static_mib + t.max_dynamic_mib - self.cap).max(0.0) + (t.rate - self.rate_max).max(0.0)
    }

    /// The score with sub-clusters `a` and `b` replaced by `ta`, `tb`.
    fn score_with(&self, a: usize, ta: Totals, b: usize, tb: Totals, moved: f64) -> Score {
        let mut violation = (moved - self.c_max).max(0.0);
        let (mut dr, mut ds, mut spread) = (0.0f64, 0.0f64, 0.0);
        let rn = if self.rbar > 0.0 { 1.0 / self.rbar } else { 0.0 };
        let sn = if self.sbar > 0.0 { self.p.memory_weight / self.sbar } else { 0.0 };
        for (j, t) in self.totals.iter().enumerate() {
            let t = if j == a {
                &ta
            } else if j == b {
                &tb
            } else {
                t
            };
            violation += self.violation_of(t);
            let (er, es) = ((t.rate - self.rbar).abs(), (t.static_mib - self.sbar).abs());
            dr = dr.max(er);
            ds = ds.max(es);
            spread += (er * rn).powi(2) + (es * sn).powi(2);
        }
        Score { violation, objective: dr + self.w * ds, spread }
    }

    fn score(&self) -> Score {
        self.score_with(usize::MAX, self.totals[0], usize::MAX, self.totals[0], self.moved)
    }

    /// Totals of `j` after removing `out` (if any) and adding `inn` (if any).
    fn totals_after(&self, j: usize, out: Option<usize>, inn: Option<usize>) -> Totals {
        let mut t = self.totals[j];
        if let Some(o) = out {
            t.rate -= self.rate[o];
            t.static_mib -= self.size[o];
            t.max_dynamic_mib = self.max_dynamic_without(j, o);
        }
        if let Some(x) = inn {
            t.rate += self.rate[x];
            t.static_mib += self.size[x];
            t.max_dynamic_mib = t.max_dynamic_mib.max(self.dynamic[x]);
        }
        t
    }

    fn apply_move(&mut self, i: usize, to: usize) {
        let from = self.assign[i];
        self.moved += self.move_cost(i, to) - self.move_cost(i, from);
        if let Some(pos) = self.members[from].iter().position(|&x| x == i) {
            self.members[from].swap_remove(pos);
        }
        self.totals[from].rate -= self.rate[i];
        self.totals[from].static_mib -= self.size[i];
        self.refresh_top2(from);
        self.place(i, to);
    }

    /// One pass over every single move, taking each that improves the
    /// score as it is found; whether any did.
    fn move_pass(&mut self) -> bool {
        let k = self.p.sub_clusters;
        let mut improved = false;
        let mut current = self.score();
        for i in 0..self.assign.len() {
            let a = self.assign[i];
            let ta = self.totals_after(a, Some(i), None);
            for b in 0..k {
                if b == a {
                    continue;
                }
                let moved = self.moved - self.move_cost(i, a) + self.move_cost(i, b);
                if moved > self.c_max + VIOLATION_EPS && moved > self.moved {
                    continue;
                }
                let tb = self.totals_after(b, None, Some(i));
                let s = self.score_with(a, ta, b, tb, moved);
                if s.better_than(&current) {
                    self.apply_move(i, b);
                    current = s;
                    improved = true;
                    break;
                }
            }
        }
        improved
    }

    /// One pass over swaps between a model of an extreme (or overfull)
    /// sub-cluster and any model elsewhere; whether any improved.
    fn swap_pass(&mut self) -> bool {
        let mut improved = false;
        let mut current = self.score();
        for a in self.extreme_sub_clusters() {
            let mut m = 0;
            while m < self.members[a].len() {
                let i = self.members[a][m];
                let mut swapped = false;
                for x in 0..self.assign.len() {
                    let b = self.assign[x];
                    if b == a {
                        continue;
                    }
                    let moved = self.moved - self.move_cost(i, a) - self.move_cost(x, b) + self.move_cost(i, b) + self.move_cost(x, a);
                    if moved > self.c_max + VIOLATION_EPS && moved > self.moved {
                        continue;
                    }
                    let ta = self.totals_after(a, Some(i), Some(x));
                    let tb = self.totals_after(b, Some(x), Some(i));
                    let s = self.score_with(a, ta, b, tb, moved);
                    if s.better_than(&current) {
                        self.apply_move(i, b);
                        self.apply_move(x, a);
                        current = s;
                        improved = true;
                        swapped = true;
                        break;
                    }
                }
                // A swap replaced members[a][m] (swap_remove + push): look at the same slot again
                // only if the model there changed; otherwise go on.
                if !swapped {
                    m += 1;
                }
            }
        }
        improved
    }

    /// Sub-clusters with the largest and smallest rate and static memory,
    /// and any over its memory or rate bound.
    fn extreme_sub_clusters(&self) -> Vec<usize> {
        let k = self.p.sub_clusters;
        let by = |f: &dyn Fn(&Totals) -> f64, max: bool| {
            (0..k)
                .max_by(|&x, &y| {
                    let (fx, fy) = (f(&self.totals[x]), f(&self.totals[y]));
                    if max {
                        fx.total_cmp(&fy)
                    } else {
                        fy.total_cmp(&fx)
                    }
                })
                .unwrap_or(0)
        };
        let mut v = vec![
            by(&|t| t.rate, true),
            by(&|t| t.rate, false),
            by(&|t| t.static_mib, true),
            by(&|t| t.static_mib, false),
        ];
        v.extend((0..k).filter(|&j| self.violation_of(&self.totals[j]) > 0.0));
        v.sort_unstable();
        v.dedup();
        v
    }

    fn descend(&mut self) {
        loop {
            let moved = self.move_pass();
            if !self.swap_pass() && !moved {
                break;
            }
        }
        // Clear the float drift of the incremental totals.
        self.rebuild();
    }

    /// Moves a few random models to random sub-clusters, each only if it
    /// adds no violation.
    fn perturb(&mut self, rng: &mut Xoshiro256PlusPlus) {
        let (n, k) = (self.assign.len(), self.p.sub_clusters);
        if k < 2 {
            return;
        }
        let count = rng.random_range(1..=(n / 8).clamp(2, 12));
        for _ in 0..count {
            let i = rng.random_range(0..n);
            let a = self.assign[i];
            let b = (a + rng.random_range(1..k)) % k;
            let moved = self.moved - self.move_cost(i, a) + self.move_cost(i, b);
            let tb = self.totals_after(b, None, Some(i));
            if moved <= self.c_max + VIOLATION_EPS && self.violation_of(&tb) <= self.violation_of(&self.totals[b]) {
                self.apply_move(i, b);
            }
        }
    }

    fn reset_to(&mut self, assign: &[usize]) {
        self.assign.copy_from_slice(assign);
        self.rebuild();
    }
}
