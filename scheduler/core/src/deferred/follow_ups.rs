//! Telling a closed-loop client from the arrivals: each of a model's
//! batches is followed, shortly after it finishes, by exactly as many new
//! requests as it held (every client whose answer came back sends its
//! next request), and no request comes otherwise.
//!
//! Deferral waits for the requests that arrive meanwhile. Its arrival
//! model takes arrivals as independent of service; under a closed loop they
//! are not: once every client of the finished batches is back, nothing more
//! comes until a batch is dispatched, and the gaps the rate estimate sees
//! are the ones the deferral itself made: a fixed point, seen once in CI at
//! 34.7 infer/s where the same run over gRPC made 346 (docs/decisions.md,
//! deferred item 31). [`FollowUps::all_back_at`] says
//! when waiting stops buying requests (by count: once every request of
//! the batches still in their window has been followed, no client is out),
//! only while the evidence is strict:
//! the last [`FOLLOW_ARRIVALS`] arrivals all followed a finish within
//! [`FOLLOW_MAX`], and the last [`EXACT_BATCHES`] batches whose follow-up
//! window closed were each followed by exactly their size. Open-loop
//! arrivals meet both only by chance (Poisson counts match a batch's size
//! exactly with probability at most about 0.37 per batch).

use dataplane::time::{Duration, Instant};

/// Longest time from a batch's planned finish to a request it caused
/// (the answer's way back, the client's turnaround, the request's way in).
pub const FOLLOW_MAX: Duration = Duration::from_micros(5_000);
/// Consecutive arrivals that must all be follow-ups.
pub const FOLLOW_ARRIVALS: u32 = 16;
/// Consecutive judged batches that must each be followed by exactly their size.
pub const EXACT_BATCHES: u32 = 8;
/// Batches remembered (a follow-up is attributed among these).
const BATCHES: usize = 16;
const _: () = assert!(BATCHES <= u16::BITS as usize, "FollowUps::live has a bit per batch");
/// Follow-up delays remembered (their maximum bounds the wait for a
/// client still out).
const DELAYS: usize = 32;

#[derive(Clone, Copy, Debug)]
struct Batch {
    finish: Instant,
    size: u32,
    followed: u32,
    judged: bool,
}

const NO_BATCH: Batch = Batch { finish: Instant::NEVER, size: 0, followed: 0, judged: true };

/// See the module docs. Fixed size; no allocation.
#[derive(Clone, Debug)]
pub struct FollowUps {
    batches: [Batch; BATCHES],
    /// Bit `i` set: batch `i` can still matter to an arrival (it holds
    /// requests, and is not both judged and past its follow-up window).
    /// Arrivals only come later, so a batch that leaves never returns
    /// until its slot is reused: [`Self::arrived`] visits these few
    /// instead of every slot, in the same (index) order.
    live: u16,
    next: usize,
    delays: [Duration; DELAYS],
    next_delay: usize,
    follow_streak: u32,
    exact_streak: u32,
    latest_finish: Instant,
    /// The latest arrival: when the last client came back.
    last_arrival: Instant,
}

impl Default for FollowUps {
    fn default() -> Self {
        FollowUps {
            batches: [NO_BATCH; BATCHES],
            live: 0,
            next: 0,
            delays: [Duration::ZERO; DELAYS],
            next_delay: 0,
            follow_streak: 0,
            exact_streak: 0,
            latest_finish: Instant::ZERO,
            last_arrival: Instant::ZERO,
        }
    }
}

impl FollowUps {
    /// A batch of `size` was dispatched to finish at `finish` (planned).
    pub fn dispatched(&mut self, finish: Instant, size: u32) {
        self.close(self.next);
        self.batches[self.next] = Batch { finish, size, followed: 0, judged: false };
        if size > 0 {
            self.live |= 1 << self.next;
        } else {
            self.live &= !(1 << self.next);
        }
        self.next = (self.next + 1) % BATCHES;
        self.latest_finish = self.latest_finish.max(finish);
    }

    /// A request arrived at `t`: batches whose follow-up window ended are
    /// judged, and the latest batch finished by `t` takes the arrival if
    /// its window is still open.
    pub fn arrived(&mut self, t: Instant) {
        self.last_arrival = self.last_arrival.max(t);
        let mut owner: Option<usize> = None;
        let mut visit = self.live;
        while visit != 0 {
            let i = visit.trailing_zeros() as usize;
            visit &= visit - 1;
            let b = self.batches[i];
            if b.size == 0 || b.finish > t {
                continue;
            }
            if b.finish + FOLLOW_MAX < t {
                self.close(i);
                // Judged and past its window: no later arrival can close
                // it again or be its follow-up.
                self.live &= !(1 << i);
            } else if owner.is_none_or(|o| self.batches[o].finish < b.finish) {
                owner = Some(i);
            }
        }
        match owner {
            Some(i) => {
                let b = &mut self.batches[i];
                b.followed += 1;
                self.delays[self.next_delay] = t.saturating_since(b.finish);
                self.next_delay = (self.next_delay + 1) % DELAYS;
                self.follow_streak = (self.follow_streak + 1).min(FOLLOW_ARRIVALS);
            }
            None => self.follow_streak = 0,
        }
    }

    /// Judges batch `i` once: followed by exactly its size or not.
    fn close(&mut self, i: usize) {
        let b = &mut self.batches[i];
        if b.size == 0 || b.judged {
            return;
        }
        b.judged = true;
        if b.followed == b.size {
            self.exact_streak = (self.exact_streak + 1).min(EXACT_BATCHES);
        } else {
            self.exact_streak = 0;
        }
    }

    /// Whether the arrivals are, by the strict test of the module docs, a
    /// closed loop's.
    pub fn closed_loop(&self) -> bool {
        self.follow_streak >= FOLLOW_ARRIVALS && self.exact_streak >= EXACT_BATCHES
    }

    /// Under a closed loop: when every client of the batches dispatched so
    /// far is back; waiting past it buys no request. `None` otherwise.
    ///
    /// Decided by count, not by time: under the strict test each request
    /// of a batch is followed by exactly one request, so the clients still
    /// out are the members of the batches still in their follow-up window
    /// less the follow-ups those batches have had. None out: every client
    /// is back (at the last arrival), and nothing comes until a batch goes.
    /// Some out: they are back by the latest planned finish plus the
    /// longest recent follow-up delay, which only bounds the wait for a
    /// client slower than any of the last [`DELAYS`]; one that comes sooner
    /// ends the wait by the count. (Bounding every wait by time alone,
    /// as before, held a lone closed-loop request for the slowest recent
    /// turnaround even when its only client was already back.)
    pub fn all_back_at(&self) -> Option<Instant> {
        if !self.closed_loop() {
            return None;
        }
        if self.clients_out() == 0 {
            return Some(self.last_arrival);
        }
        let delay = self.delays.iter().copied().max().unwrap_or(Duration::ZERO);
        Some(self.latest_finish + delay)
    }

    /// Requests of the unjudged batches not yet followed. Summed over the
    /// batches, not per batch: a follow-up credited to a later batch than
    /// its own (its client's turnaround outlasted the gap between the two
    /// finishes) is still a client back.
    fn clients_out(&self) -> u32 {
        let (mut sent, mut back) = (0u32, 0u32);
        let mut visit = self.live;
        while visit != 0 {
            let i = visit.trailing_zeros() as usize;
            visit &= visit - 1;
            sent = sent.saturating_add(self.batches[i].size);
            back = back.saturating_add(self.batches[i].followed);
        }
        sent.saturating_sub(back)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at_us(us: u64) -> Instant {
        Instant::ZERO + Duration::from_micros(us)
    }

    /// A closed loop of `c` clients on one GPU: each batch takes everyone
    /// queued, runs `run_us`, and every client is back `turn_us` later.
    fn closed(c: u32, cycles: u32, run_us: u64, turn_us: u64) -> (FollowUps, u64) {
        let mut f = FollowUps::default();
        let mut t = 0;
        for _ in 0..cycles {
            for k in 0..c {
                f.arrived(at_us(t + u64::from(k) * 10));
            }
            let start = t + 1_000;
            f.dispatched(at_us(start + run_us), c);
            t = start + run_us + turn_us;
        }
        (f, t)
    }

    #[test]
    fn a_closed_loop_is_told_after_enough_exact_batches_and_says_when_all_are_back() {
        let (f, _) = closed(4, 4, 6_000, 800);
        assert!(!f.closed_loop(), "too few batches judged");
        let (f, t) = closed(4, 12, 6_000, 800);
        assert!(f.closed_loop());
        // The last batch finished at t - 800 µs; its clients are back within
        // the longest recent turnaround (800 µs + 30 µs of spread).
        assert_eq!(f.all_back_at(), Some(at_us(t - 800 + 830)));
    }

    #[test]
    fn once_every_client_is_back_the_wait_ends_at_the_last_arrival_whatever_the_slowest_turnaround() {
        // One client: a single slow turnaround (4 ms) among fast ones (300 µs).
        let mut f = FollowUps::default();
        let mut t = 0;
        for cycle in 0..20 {
            f.arrived(at_us(t));
            let finish = t + 1_000 + 1_100;
            f.dispatched(at_us(finish), 1);
            t = finish + if cycle == 5 { 4_000 } else { 300 };
        }
        assert!(f.closed_loop());
        // The last batch's client is out: bounded by the slowest recent
        // turnaround after its planned finish.
        let finish = t - 300;
        assert_eq!(f.all_back_at(), Some(at_us(finish + 4_000)));
        // It is back: nothing more comes until a batch goes.
        f.arrived(at_us(t));
        assert_eq!(f.all_back_at(), Some(at_us(t)));
    }

    #[test]
    fn clients_out_counts_members_not_followed_across_batches() {
        // Four clients over two GPUs: two batches of two in flight.
        let (mut f, t) = closed(4, 12, 6_000, 800);
        assert!(f.closed_loop());
        let last = t - 800;
        assert_eq!(f.clients_out(), 4);
        f.arrived(at_us(t));
        f.arrived(at_us(t + 10));
        f.arrived(at_us(t + 20));
        assert_eq!(f.clients_out(), 1);
        assert_eq!(f.all_back_at(), Some(at_us(last + 830)), "one still out: bounded by time");
        f.arrived(at_us(t + 30));
        assert_eq!(f.clients_out(), 0);
        assert_eq!(f.all_back_at(), Some(at_us(t + 30)));
        // Split across two batches that finish 100 µs apart; the first's
        // clients come back after the second finished and are credited to
        // it, still counted as back.
        f.dispatched(at_us(t + 7_000), 2);
        f.dispatched(at_us(t + 7_100), 2);
        assert_eq!(f.clients_out(), 4);
        for k in 0..4 {
            f.arrived(at_us(t + 7_200 + k * 10));
        }
        assert_eq!(f.clients_out(), 0);
    }

    #[test]
    fn an_arrival_that_follows_no_finish_or_an_extra_one_ends_it() {
        let (mut f, t) = closed(4, 12, 6_000, 800);
        assert!(f.closed_loop());
        f.arrived(at_us(t + 50_000));
        assert!(!f.closed_loop());
        let (mut f, t) = closed(2, 40, 6_000, 800);
        assert!(f.closed_loop());
        // A third request after a batch of two (all follow-ups): once that
        // batch is judged, not a closed loop of two.
        f.arrived(at_us(t + 100));
        f.arrived(at_us(t + 200));
        f.arrived(at_us(t + 300));
        assert!(f.closed_loop(), "not judged yet");
        f.dispatched(at_us(t + 6_000), 3);
        f.arrived(at_us(t + 6_100));
        assert_eq!(f.follow_streak, FOLLOW_ARRIVALS, "every arrival followed a finish");
        assert!(!f.closed_loop());
    }

    #[test]
    fn poisson_arrivals_around_dense_finishes_are_not_a_closed_loop() {
        // Open loop: arrivals at a fixed seeded Poisson rate, a batch of
        // everything queued every 2 ms (finishes dense, every arrival within
        // FOLLOW_MAX of one): counts match batch sizes only by chance.
        let mut f = FollowUps::default();
        let mut s: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut t = 0.0f64;
        let mut queued = 0u32;
        let mut next_batch = 2_000.0;
        let mut told = 0;
        for _ in 0..200_000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = ((s >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            t += -u.ln() * 400.0; // mean gap 400 µs
            while next_batch <= t {
                if queued > 0 {
                    f.dispatched(at_us(next_batch as u64 + 3_000), queued);
                    queued = 0;
                }
                next_batch += 2_000.0;
            }
            f.arrived(at_us(t as u64));
            queued += 1;
            told += u32::from(f.closed_loop());
        }
        assert_eq!(told, 0);
    }
}
