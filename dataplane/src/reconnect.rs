//! When to try the scheduler again, and which one: a sans-IO schedule of
//! reconnection attempts over a list of scheduler addresses, with capped
//! exponential backoff. Peers (frontends, backends) outlive their
//! scheduler: when the link dies they walk this schedule instead of
//! exiting, so a restarted or newly elected scheduler finds them again.
//!
//! The schedule never reads a clock: its host passes `now` and asks
//! [`Reconnect::due`] whether an attempt is due, makes it, and reports
//! [`Reconnect::failed`] or [`Reconnect::linked`], then, once the peer
//! registered over the link (the scheduler's Welcome verified),
//! [`Reconnect::registered`]. Only a registration starts the backoff over:
//! a listener that accepts and then refuses (a standby, or a fake
//! scheduler whose Welcome does not prove the join token) is an attempt
//! that failed, so it is retried at the doubling pauses and not in a spin.

use crate::time::{Duration, Instant};
use crate::transport::{Domain, Error};

/// Shortest pause between attempts (after the first, which is immediate).
pub const DEFAULT_MIN_BACKOFF: Duration = Duration::from_millis(10);
/// Longest pause between attempts.
pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_millis(1000);
/// For this long after the link was lost, rounds over the list are at most
/// [`TAKEOVER_PAUSE`] apart: a hot standby takes over within a few hundred
/// milliseconds (failure timeout plus election), and a peer whose pause had
/// already doubled past that would find the new leader only at its next
/// round. After the window the pauses double to the cap as before.
pub const TAKEOVER_WINDOW: Duration = Duration::from_millis(1000);
/// The longest pause between rounds within [`TAKEOVER_WINDOW`].
pub const TAKEOVER_PAUSE: Duration = Duration::from_millis(40);

/// Splits a `--scheduler` value naming one or more addresses
/// (comma-separated, blanks ignored).
pub fn split_addrs(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(str::to_string)
        .collect()
}

/// Connects to the first of `addrs` that answers, trying them in turn
/// (each with [`crate::control::connect_retrying`] for its share) for at
/// most `timeout`; returns the link and the address's index. For a
/// daemon's start, where blocking is fine.
pub fn connect_first<D: Domain>(domain: &D, addrs: &[String], timeout: Duration) -> Result<(D::Conn, usize), Error> {
    if addrs.is_empty() {
        // Nothing to try: as if none answered in time.
        return Err(Error::Timeout);
    }
    let start = std::time::Instant::now();
    let per_try = Duration::from_nanos((timeout.as_nanos() / addrs.len() as u64).min(1_000_000_000));
    let mut i = 0;
    loop {
        match crate::control::connect_retrying(domain, &addrs[i], per_try) {
            Ok(c) => return Ok((c, i)),
            Err(e) if start.elapsed().as_nanos() as u64 >= timeout.as_nanos() => return Err(e),
            Err(_) => i = (i + 1) % addrs.len(),
        }
    }
}

/// The reconnection schedule (see the module docs).
#[derive(Clone, Debug)]
pub struct Reconnect {
    addrs: Vec<String>,
    /// Index of the address the next attempt goes to.
    next: usize,
    min: Duration,
    max: Duration,
    /// The pause after the next failure.
    pause: Duration,
    /// When the next attempt is due; `None` while connected.
    due_at: Option<Instant>,
    /// Failed attempts since the link was lost.
    failures: u32,
    /// When the link was lost (the takeover window's start).
    lost_at: Option<Instant>,
    /// A link is up but the peer has not registered over it yet: losing
    /// it is a failed attempt, not a lost registration.
    linking: bool,
}

impl Reconnect {
    /// A schedule over `addrs` (at least one), connected for now, with
    /// pauses doubling from `min` up to `max`.
    pub fn new(addrs: Vec<String>, min: Duration, max: Duration) -> Self {
        let min = if min.as_nanos() == 0 { Duration::from_nanos(1) } else { min };
        Reconnect { addrs, next: 0, min, max: max.max(min), pause: min, due_at: None, failures: 0, lost_at: None, linking: false }
    }

    /// The addresses, in the order they are tried.
    pub fn addrs(&self) -> &[String] {
        &self.addrs
    }

    /// The link was lost at `now`. A registered link's loss starts the
    /// schedule over: the first attempt is due at once, at the address
    /// that served last (a restarted scheduler comes back there). A link
    /// lost before its peer registered is an attempt that
    /// [`failed`](Self::failed).
    pub fn lost(&mut self, now: Instant) {
        if self.linking {
            self.failed(now);
            return;
        }
        self.pause = self.min;
        self.failures = 0;
        self.due_at = Some(now);
        self.lost_at = Some(now);
    }

    /// When the next attempt is due (`None`: connected).
    pub fn due_at(&self) -> Option<Instant> {
        self.due_at
    }

    /// Failed attempts since the link was lost.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// The address to try now, if an attempt is due at `now`.
    pub fn due(&self, now: Instant) -> Option<&str> {
        match self.due_at {
            Some(t) if t <= now => self.addrs.get(self.next).map(String::as_str),
            _ => None,
        }
    }

    /// The attempt made at `now` failed (unreachable, refused, or it
    /// redirected us): the next address is tried after the current pause,
    /// which then doubles up to the cap. A whole round over the list counts
    /// as one step of the backoff, so a standby that refuses does not slow
    /// the way to the leader.
    pub fn failed(&mut self, now: Instant) {
        self.linking = false;
        self.failures = self.failures.saturating_add(1);
        self.next = (self.next + 1) % self.addrs.len().max(1);
        if self.next == 0 {
            let in_takeover = self.lost_at.is_some_and(|t| now.saturating_since(t) < TAKEOVER_WINDOW);
            let pause = if in_takeover { self.pause.min(TAKEOVER_PAUSE.max(self.min)) } else { self.pause };
            self.due_at = Some(now.saturating_add(pause));
            self.pause = Duration::from_nanos(self.pause.as_nanos().saturating_mul(2)).min(self.max);
        } else {
            self.due_at = Some(now);
        }
    }

    /// Prefers `addr` for the next attempt (a standby named the leader);
    /// an address not in the list is added.
    pub fn prefer(&mut self, addr: &str) {
        match self.addrs.iter().position(|a| a == addr) {
            Some(i) => self.next = i,
            None => {
                self.addrs.push(addr.to_string());
                self.next = self.addrs.len() - 1;
            }
        }
    }

    /// Replaces the addresses (the routing table listed others): the
    /// address the next attempt goes to stays next if it is still listed.
    /// An empty list is ignored.
    pub fn set_addrs(&mut self, addrs: Vec<String>) {
        if addrs.is_empty() || addrs == self.addrs {
            return;
        }
        let current = self.addrs.get(self.next).cloned();
        self.addrs = addrs;
        self.next = current.and_then(|c| self.addrs.iter().position(|a| *a == c)).unwrap_or(0);
    }

    /// The attempt opened a link: nothing is due until the registration
    /// over it succeeds ([`registered`](Self::registered)), is refused
    /// ([`failed`](Self::failed)) or the link is [`lost`](Self::lost). The
    /// backoff stands until the peer registered.
    pub fn linked(&mut self) {
        self.due_at = None;
        self.linking = true;
    }

    /// The peer registered over the link (its Welcome verified): nothing is
    /// due until the link is lost again, and the backoff starts over.
    pub fn registered(&mut self) {
        self.due_at = None;
        self.linking = false;
        self.failures = 0;
        self.pause = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_addresses_keep_the_next_one_if_still_listed() {
        let list = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let mut r = Reconnect::new(list(&["a", "b"]), ms(10), ms(100));
        r.lost(Instant::ZERO);
        r.failed(Instant::ZERO);
        assert_eq!(r.due(Instant::ZERO), Some("b"));
        r.set_addrs(list(&["c", "b"]));
        assert_eq!(r.due(Instant::ZERO), Some("b"), "b stays next");
        r.set_addrs(list(&["d"]));
        assert_eq!(r.due(Instant::ZERO), Some("d"));
        r.set_addrs(Vec::new());
        assert_eq!(r.addrs(), ["d"], "an empty list is ignored");
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_list_is_split_on_commas() {
        assert_eq!(split_addrs(" a:1, b:2 ,,"), vec!["a:1".to_string(), "b:2".to_string()]);
        assert!(split_addrs("").is_empty());
    }

    #[test]
    fn rounds_back_off_exponentially_up_to_the_cap() {
        let t0 = Instant::ZERO;
        let mut r = Reconnect::new(vec!["a".into(), "b".into()], ms(10), ms(35));
        assert_eq!(r.due(t0), None, "connected: nothing due");
        r.lost(t0);
        assert_eq!(r.due(t0), Some("a"));
        r.failed(t0);
        assert_eq!(r.due(t0), Some("b"), "the next address at once");
        r.failed(t0);
        assert_eq!(r.due(t0), None);
        assert_eq!(r.due_at(), Some(t0 + ms(10)));
        let mut t = t0 + ms(10);
        let mut pauses = Vec::new();
        // Past the takeover window (a connect attempt may take that long).
        t += TAKEOVER_WINDOW;
        r.due_at = Some(t);
        for _ in 0..4 {
            assert_eq!(r.due(t), Some("a"));
            r.failed(t);
            r.failed(t);
            let next = r.due_at().unwrap();
            pauses.push(next.saturating_since(t));
            t = next;
        }
        assert_eq!(pauses, vec![ms(20), ms(35), ms(35), ms(35)]);
        assert_eq!(r.failures(), 10);
        r.linked();
        r.registered();
        assert_eq!(r.due_at(), None);
        r.lost(t);
        assert_eq!(r.due(t), Some("a"), "the pause starts over");
    }

    #[test]
    fn a_named_leader_is_tried_next() {
        let t0 = Instant::ZERO;
        let mut r = Reconnect::new(vec!["a".into()], ms(10), ms(100));
        r.lost(t0);
        r.prefer("c");
        assert_eq!(r.due(t0), Some("c"));
        r.prefer("a");
        assert_eq!(r.due(t0), Some("a"));
    }

    #[test]
    fn rounds_stay_close_together_while_a_standby_may_be_taking_over() {
        let t0 = Instant::ZERO;
        let mut r = Reconnect::new(vec!["leader".into(), "standby".into()], ms(10), ms(1000));
        r.registered();
        r.lost(t0);
        let mut t = t0;
        let mut rounds = Vec::new();
        while t.saturating_since(t0) < ms(2500) {
            assert_eq!(r.due(t), Some("leader"));
            r.failed(t);
            r.failed(t);
            rounds.push(t.saturating_since(t0).as_nanos() / 1_000_000);
            t = r.due_at().unwrap();
        }
        // 10, 20, then 40 ms apart for the first second; doubling after.
        assert_eq!(&rounds[..5], &[0, 10, 30, 70, 110]);
        assert!(rounds.windows(2).filter(|w| w[0] < 1000).all(|w| w[1] - w[0] <= 40), "{rounds:?}");
        let last = rounds.len() - 1;
        assert!(rounds[last] - rounds[last - 1] > 40, "back to doubling after the window: {rounds:?}");
    }

    /// Walks a schedule against a listener that accepts every link and
    /// then refuses it (or drops it) before the peer registers, as a fake
    /// scheduler does: the attempts within `span` of the loss, in ms.
    fn attempts_against_a_refusing_listener(span: Duration, lose_the_link: bool) -> Vec<u64> {
        let t0 = Instant::ZERO;
        let mut r = Reconnect::new(vec!["fake".into()], DEFAULT_MIN_BACKOFF, DEFAULT_MAX_BACKOFF);
        r.lost(t0);
        let mut t = t0;
        let mut attempts = Vec::new();
        while t.saturating_since(t0) < span {
            assert_eq!(r.due(t), Some("fake"));
            attempts.push(t.saturating_since(t0).as_nanos() / 1_000_000);
            r.linked();
            assert_eq!((r.due_at(), r.due(t)), (None, None), "nothing due while the registration is pending");
            if lose_the_link {
                r.lost(t);
            } else {
                r.failed(t);
            }
            t = r.due_at().expect("a refused link is retried");
        }
        attempts
    }

    #[test]
    fn links_refused_before_registering_back_off_as_failed_attempts() {
        for lose_the_link in [false, true] {
            let attempts = attempts_against_a_refusing_listener(ms(4000), lose_the_link);
            // As if no link had opened: 10, 20, then 40 ms apart in the
            // takeover window, then doubling to the 1 s cap.
            assert_eq!(&attempts[..5], &[0, 10, 30, 70, 110], "{attempts:?}");
            assert!(attempts.windows(2).all(|w| w[1] > w[0]), "never twice at once: {attempts:?}");
            let last = attempts.len() - 1;
            assert_eq!(attempts[last] - attempts[last - 1], 1000, "at the cap by 4 s: {attempts:?}");
            // The old spin (the pause reset on every link) made ~400.
            assert!(attempts.len() <= 40, "{} attempts in 4 s: {attempts:?}", attempts.len());
        }
    }

    #[test]
    fn only_a_registration_starts_the_backoff_over() {
        let t0 = Instant::ZERO;
        let mut r = Reconnect::new(vec!["a".into()], ms(10), ms(1000));
        r.lost(t0);
        let mut t = t0 + TAKEOVER_WINDOW;
        r.due_at = Some(t);
        for _ in 0..3 {
            r.linked();
            r.failed(t);
            t = r.due_at().unwrap();
        }
        assert_eq!(r.failures(), 3);
        r.linked();
        assert_eq!(r.failures(), 3, "a link is not a registration");
        r.failed(t);
        assert_eq!(r.due_at(), Some(t + ms(80)), "the pause kept doubling across the links");
        r.linked();
        r.registered();
        assert_eq!((r.failures(), r.due_at()), (0, None));
        r.lost(t);
        assert_eq!(r.due(t), Some("a"), "a registered link's loss: at once");
        r.failed(t);
        assert_eq!(r.due_at(), Some(t + ms(10)), "from the shortest pause again");
    }
}
