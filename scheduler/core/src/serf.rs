//! SERF's latency predictor: the interference-aware `M/D_interf/c` queue of
//! Wang et al., "SERF: Efficient Scheduling for Fast Deep Neural Network
//! Serving via Judicious Parallelism" (SC'16), section IV-C.
//!
//! A worker runs up to `c` requests (here: batches) at once. Its input is a
//! profile `t_i`, `i = 1..=c`: the service time of one batch while `i` run
//! concurrently (interference makes `t_i` grow with `i`), i.e. the
//! per-batch service rate `mu_i = 1 / t_i`. Arrivals are Poisson at rate
//! `lambda` per worker (a cluster of `N` workers gives each `lambda_all / N`,
//! SERF section IV-C3's last paragraph).
//!
//! The mean latency is Eq. 13 = service time (Eq. 12, by PASTA) + waiting
//! time (Eq. 11: the `M/M_interf/c` queue of Eqs. 2-7, scaled by
//! Cosmetatos' M/D/c correction, Eqs. 8-10). One correction to the printed
//! formulas: Eq. 12's tail term (and Eq. 13's) misses the factor `p_0` that
//! Eq. 2 gives every `p_n` with `n >= c`; without it the service time of a
//! queue without interference would not be `t_1`. We keep `p_0`.

/// The predicted steady state of one worker at one `c`.
#[derive(Clone, Debug, PartialEq)]
pub struct Prediction {
    /// Maximum concurrent batches on the worker.
    pub concurrency: usize,
    /// `rho = lambda / (c mu_c)`: the queue is stable only below 1.
    pub utilisation: f64,
    /// Probability the worker is idle (Eq. 4).
    pub p_idle: f64,
    /// Mean time in the queue, seconds (Eq. 11).
    pub wait_s: f64,
    /// Mean service time, seconds (Eq. 12).
    pub service_s: f64,
    /// Mean latency = wait + service, seconds (Eq. 13).
    pub latency_s: f64,
}

/// Cosmetatos' `f(s) = (c - 1)(sqrt(4 + 5c) - 2) / (16 c)` (Eq. 9).
pub fn cosmetatos_f(c: usize) -> f64 {
    let c = c as f64;
    (c - 1.0) * ((4.0 + 5.0 * c).sqrt() - 2.0) / (16.0 * c)
}

/// The factor `(1 + f(c) g(rho)) / 2` that turns an M/M/c waiting time into
/// an M/D/c one (Eqs. 8 and 10, `g(rho) = (1 - rho) / rho`).
pub fn cosmetatos_factor(c: usize, rho: f64) -> f64 {
    0.5 * (1.0 + cosmetatos_f(c) * (1.0 - rho) / rho)
}

/// Predicts one worker with at most `c` concurrent batches, arrivals at
/// `lambda` batches/s, and `service_s[i - 1] = t_i` (seconds; at least `c`
/// entries). `None` when the inputs are not positive and finite or the
/// queue is unstable (`rho >= 1`: the latency grows without bound).
pub fn predict(service_s: &[f64], c: usize, lambda: f64) -> Option<Prediction> {
    if c == 0 || service_s.len() < c || !(lambda > 0.0 && lambda.is_finite()) {
        return None;
    }
    if service_s[..c].iter().any(|&t| !(t > 0.0 && t.is_finite())) {
        return None;
    }
    let mu = |i: usize| 1.0 / service_s[i - 1];
    let rho = lambda / (c as f64 * mu(c));
    if rho >= 1.0 {
        return None;
    }
    // a[n] = prod_{i<=n} rho_i / n! for n = 0..=c (Eq. 2 without p_0).
    let mut a = Vec::with_capacity(c + 1);
    a.push(1.0);
    for n in 1..=c {
        let prev = a[n - 1];
        a.push(prev * (lambda / mu(n)) / n as f64);
    }
    // Eq. 3-4: p_0 = 1 / H, H = sum_{n<c} a_n + a_c / (1 - rho).
    let h: f64 = a[..c].iter().sum::<f64>() + a[c] / (1.0 - rho);
    let p0 = 1.0 / h;
    // Eq. 7 (M/M_interf/c waiting time by Little's law), then Eq. 11.
    let wait_mm = p0 * a[c] / lambda * rho / ((1.0 - rho) * (1.0 - rho));
    let wait_s = cosmetatos_factor(c, rho) * wait_mm;
    // Eq. 12 (PASTA): an arrival that finds n < c in the system runs with
    // n + 1 concurrent; one that finds >= c waits and runs with c.
    let service_s_mean: f64 =
        (1..=c).map(|i| p0 * a[i - 1] / mu(i)).sum::<f64>() + p0 * a[c] / (mu(c) * (1.0 - rho));
    Some(Prediction {
        concurrency: c,
        utilisation: rho,
        p_idle: p0,
        wait_s,
        service_s: service_s_mean,
        latency_s: wait_s + service_s_mean,
    })
}

/// Predictions for every `c = 1..=service_s.len()` that is stable, and the
/// index of the one with the lowest mean latency (SERF's configuration
/// reference table and its scheduler's choice, section IV-D).
pub fn table(service_s: &[f64], lambda: f64) -> (Vec<Prediction>, Option<usize>) {
    let rows: Vec<Prediction> = (1..=service_s.len()).filter_map(|c| predict(service_s, c, lambda)).collect();
    let best = rows.iter().enumerate().min_by(|a, b| a.1.latency_s.total_cmp(&b.1.latency_s)).map(|(i, _)| i);
    (rows, best)
}

/// Service times `t_i` of a batch while `i = 1..=c_max` run on one GPU, from
/// a batch-latency profile: `i` concurrent batches of `batch` overlap at
/// best like one batch of `i * batch` (so each takes `l(i * batch)`), and
/// interference adds `interference * (i - 1)` of that (SERF section III-C:
/// contention grows with the number of co-runners). A model of a GPU, to be
/// replaced by measured `t_i` where they exist.
pub fn service_times_from_profile(latency_s: impl Fn(u32) -> f64, batch: u32, c_max: usize, interference: f64) -> Vec<f64> {
    (1..=c_max).map(|i| latency_s(batch * i as u32) * (1.0 + interference * (i - 1) as f64)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * b.abs().max(1e-12)
    }

    #[test]
    fn one_server_is_pollaczek_khinchine_m_d_1() {
        // c = 1: f = 0, the factor is 1/2, and M/M/1's W_q halves into
        // M/D/1's rho t / (2 (1 - rho)) exactly.
        let t = 0.010;
        for lambda in [10.0, 50.0, 90.0] {
            let p = predict(&[t], 1, lambda).unwrap();
            let rho = lambda * t;
            assert!(close(p.wait_s, rho * t / (2.0 * (1.0 - rho)), 1e-12), "{p:?}");
            assert!(close(p.service_s, t, 1e-12));
            assert!(close(p.p_idle, 1.0 - rho, 1e-12));
        }
    }

    #[test]
    fn without_interference_the_queue_is_erlang_c_with_cosmetatos() {
        // c = 2, lambda = 1, mu = 1: rho = 0.5, Erlang C = 1/3,
        // M/M/2 W_q = C / (c mu - lambda) = 1/3 (a textbook value).
        let p = predict(&[1.0, 1.0], 2, 1.0).unwrap();
        let mm = p.wait_s / cosmetatos_factor(2, 0.5);
        assert!(close(mm, 1.0 / 3.0, 1e-12), "{mm}");
        assert!(close(p.p_idle, 1.0 / 3.0, 1e-12));
        assert!(close(p.service_s, 1.0, 1e-12), "equal t_i: the service time is t");
        // c = 3, lambda = 2, mu = 1: Erlang C = 4/9, W_q = 4/9.
        let p = predict(&[1.0, 1.0, 1.0], 3, 2.0).unwrap();
        assert!(close(p.wait_s / cosmetatos_factor(3, 2.0 / 3.0), 4.0 / 9.0, 1e-12));
    }

    #[test]
    fn cosmetatos_terms_match_eq_9_and_10() {
        assert_eq!(cosmetatos_f(1), 0.0);
        assert!(close(cosmetatos_f(2), (14f64.sqrt() - 2.0) / 32.0, 1e-12));
        assert!(close(cosmetatos_f(4), 3.0 * (24f64.sqrt() - 2.0) / 64.0, 1e-12));
        // Heavy traffic: g -> 0 and the M/D/c wait is half the M/M/c one.
        assert!(close(cosmetatos_factor(8, 0.999_999), 0.5, 1e-5));
    }

    /// A plain FCFS M/D/c simulation (no interference): mean wait.
    fn simulated_m_d_c_wait(c: usize, t: f64, lambda: f64, n: usize) -> f64 {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut uniform = || {
            // xorshift64*, seeded: deterministic.
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            ((state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        let mut free = vec![0.0f64; c];
        let (mut now, mut total) = (0.0, 0.0);
        for _ in 0..n {
            now += -uniform().ln() / lambda;
            let (i, &f) = free.iter().enumerate().min_by(|a, b| a.1.total_cmp(b.1)).unwrap();
            let start = f.max(now);
            total += start - now;
            free[i] = start + t;
        }
        total / n as f64
    }

    #[test]
    fn the_m_d_c_approximation_is_near_a_simulated_m_d_c() {
        for (c, lambda) in [(1, 0.7), (2, 1.6), (3, 2.4), (4, 3.0)] {
            let p = predict(&vec![1.0; c], c, lambda).unwrap();
            let sim = simulated_m_d_c_wait(c, 1.0, lambda, 400_000);
            assert!(close(p.wait_s, sim, 0.06), "c {c} lambda {lambda}: model {} sim {sim}", p.wait_s);
        }
    }

    #[test]
    fn interference_lengthens_service_by_the_occupancy_seen_on_arrival() {
        // t_2 = 1.5 t_1: the mean service is between t_1 and t_2, rising with load.
        let ts = [1.0, 1.5];
        let low = predict(&ts, 2, 0.1).unwrap();
        let high = predict(&ts, 2, 1.2).unwrap();
        assert!(low.service_s > 1.0 && low.service_s < high.service_s && high.service_s < 1.5, "{low:?} {high:?}");
        // Eq. 12 by hand at lambda = 0.1: rho_1 = 0.1, rho_2 = 0.15, rho = 0.075.
        let a1 = 0.1;
        let a2 = 0.1 * 0.15 / 2.0;
        let p0 = 1.0 / (1.0 + a1 + a2 / (1.0 - 0.075));
        let s = p0 * 1.0 + p0 * a1 * 1.5 + p0 * a2 * 1.5 / (1.0 - 0.075);
        assert!(close(low.service_s, s, 1e-12));
    }

    #[test]
    fn the_best_concurrency_follows_the_load_as_in_serf_section_v() {
        // Strong interference (t_i > i t_1: concurrency adds no throughput):
        // one at a time is best at every load. Weak interference: more
        // concurrency pays once waiting dominates; at low load it barely
        // matters (a second batch runs only when one is already running).
        let strong = [1.0, 2.2, 3.5];
        for lambda in [0.1, 0.5, 0.9] {
            let (rows, best) = table(&strong, lambda);
            assert_eq!(rows[best.unwrap()].concurrency, 1, "lambda {lambda}: {rows:?}");
        }
        let weak = [1.0, 1.1, 1.25];
        let (rows, best) = table(&weak, 0.05);
        assert!(rows[0].latency_s / rows[best.unwrap()].latency_s < 1.03, "{rows:?}");
        let (rows, best) = table(&weak, 1.5);
        assert!(rows[best.unwrap()].concurrency >= 2, "{rows:?}");
        // Above one worker's c = 1 capacity only c >= 2 is stable.
        let (rows, _) = table(&weak, 1.2);
        assert!(rows.iter().all(|r| r.concurrency >= 2));
    }

    #[test]
    fn unstable_or_invalid_inputs_have_no_prediction() {
        assert!(predict(&[1.0], 1, 1.0).is_none());
        assert!(predict(&[1.0], 2, 0.5).is_none());
        assert!(predict(&[0.0], 1, 0.5).is_none());
        assert!(predict(&[1.0], 1, 0.0).is_none());
        assert!(predict(&[1.0], 0, 0.5).is_none());
    }

    #[test]
    fn profile_service_times_overlap_like_batching_plus_interference() {
        let l = |b: u32| 0.005 + 0.001 * f64::from(b);
        let t = service_times_from_profile(l, 1, 3, 0.1);
        assert!(close(t[0], 0.006, 1e-12));
        assert!(close(t[1], 0.007 * 1.1, 1e-12));
        assert!(close(t[2], 0.008 * 1.2, 1e-12));
    }
}
