//! [`Candidate`]: one scheduler's part in the election, sans-IO (see the
//! module docs of [`super`]).

use super::{Election, ElectionError, Epoch, Leadership};
use dataplane::time::{Duration, Instant};
use std::collections::VecDeque;

/// Timings of a [`Candidate`].
#[derive(Clone, Debug)]
pub struct CandidateConfig {
    /// This scheduler's control address: what the key names as leader.
    pub me: String,
    /// Leader -> standby heartbeat interval, and the leader's lease
    /// renewal interval.
    pub heartbeat: Duration,
    /// A standby that hears no heartbeat from the leader for this long
    /// revokes its lease and campaigns.
    pub failure_timeout: Duration,
    /// The lease's time to live in the store: a leader that could not
    /// renew it for this long (less one heartbeat, for safety) steps down.
    pub lease_ttl: Duration,
}

/// Where a candidate stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Not leading; following `leader` if known, last heard at `heard_at`.
    Standby {
        /// The leadership known.
        leader: Option<Leadership>,
        /// When the leader was last heard (or learnt of).
        heard_at: Instant,
    },
    /// Leading term `epoch`; the lease was last renewed at `renewed_at`.
    Leader {
        /// The term.
        epoch: Epoch,
        /// Last successful renewal.
        renewed_at: Instant,
        /// When to renew next.
        next_renew: Instant,
    },
}

/// What the host must act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RoleEvent {
    /// This scheduler leads term `epoch`: it may plan once every reachable
    /// backend has acknowledged the epoch.
    Elected {
        /// The term.
        epoch: Epoch,
    },
    /// It no longer leads: stop planning at once.
    SteppedDown {
        /// The term it led.
        epoch: Epoch,
        /// Why, for the operator.
        why: String,
    },
    /// Another scheduler leads: peers that join here are sent there.
    Following(Leadership),
    /// The leader went silent; its lease was revoked.
    LeaderSilent(Leadership),
}

/// One scheduler's election logic over store `E` (see the module docs).
#[derive(Debug)]
pub struct Candidate<E: Election> {
    cfg: CandidateConfig,
    election: E,
    standing: Standing,
    events: VecDeque<RoleEvent>,
    /// Time never goes back.
    now: Instant,
    /// A standby's next try at the store when it could not reach it.
    retry_at: Option<Instant>,
    /// Deposed (its lease revoked by a standby, or a newer term heard), it
    /// does not revoke in turn until then: a partition between leader and
    /// standby that both still reach the store would otherwise move the
    /// leadership back and forth every failure timeout. Meanwhile it
    /// campaigns only once the store itself expires the lease.
    deposed_until: Option<Instant>,
    /// When a heartbeat last made it consult the store (see
    /// [`Candidate::handle_heartbeat`]).
    store_checked_at: Option<Instant>,
}

/// What a [`Candidate`] made of a heartbeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Heard {
    /// Taken as the leader's sign of life (or, by a leader, as proof of a
    /// newer term: it stepped down).
    Accepted,
    /// Not believed: a term the store did not confirm, a stale one, or a
    /// claim beyond the store-check rate (the host counts it).
    Ignored,
}

impl<E: Election> Candidate<E> {
    /// A standby that knows no leader yet: its first poll campaigns.
    pub fn new(cfg: CandidateConfig, election: E) -> Self {
        Candidate {
            cfg,
            election,
            standing: Standing::Standby { leader: None, heard_at: Instant::ZERO },
            events: VecDeque::new(),
            now: Instant::ZERO,
            retry_at: None,
            deposed_until: None,
            store_checked_at: None,
        }
    }

    /// Where it stands.
    pub fn standing(&self) -> &Standing {
        &self.standing
    }

    /// The term it leads, if it leads.
    pub fn leading(&self) -> Option<Epoch> {
        match self.standing {
            Standing::Leader { epoch, .. } => Some(epoch),
            Standing::Standby { .. } => None,
        }
    }

    /// The leadership a standby follows (where to send joining peers).
    pub fn following(&self) -> Option<&Leadership> {
        match &self.standing {
            Standing::Standby { leader, .. } => leader.as_ref(),
            Standing::Leader { .. } => None,
        }
    }

    /// The store (for the harness's faults).
    pub fn election(&self) -> &E {
        &self.election
    }

    /// The next event, oldest first.
    pub fn poll_event(&mut self) -> Option<RoleEvent> {
        self.events.pop_front()
    }

    /// A heartbeat from the leader of term `epoch` arrived at `now`.
    ///
    /// A heartbeat is a claim, not a fact (issue 55): the host has checked
    /// its MAC, but a term the store never granted is believed by nobody.
    /// A standby takes a heartbeat of the term it follows as a sign of
    /// life; one of a newer term only once the store confirms that term. A
    /// leader that hears of a newer term asks the store whether its own
    /// lease still holds, and steps down only if it does not. The store is
    /// asked at most once per heartbeat interval, so a flood of claims
    /// costs it nothing.
    pub fn handle_heartbeat(&mut self, now: Instant, epoch: Epoch) -> Heard {
        let now = self.observe(now);
        match self.standing.clone() {
            Standing::Standby { leader: Some(l), .. } if epoch == l.epoch => {
                self.standing = Standing::Standby { leader: Some(l), heard_at: now };
                Heard::Accepted
            }
            Standing::Standby { leader: Some(l), .. } if epoch > l.epoch => {
                if !self.may_ask_store(now) {
                    return Heard::Ignored;
                }
                match self.election.leader(now) {
                    Ok(Some(granted)) if granted.epoch == epoch => {
                        let changed = granted.leader != l.leader;
                        self.standing = Standing::Standby { leader: Some(granted.clone()), heard_at: now };
                        if changed {
                            self.events.push_back(RoleEvent::Following(granted));
                        }
                        Heard::Accepted
                    }
                    _ => Heard::Ignored,
                }
            }
            Standing::Standby { .. } => Heard::Ignored,
            Standing::Leader { epoch: mine, next_renew, .. } if epoch > mine => {
                if !self.may_ask_store(now) {
                    return Heard::Ignored;
                }
                match self.election.keep_alive(now, mine) {
                    // Its lease holds: no newer term exists.
                    Ok(()) => {
                        self.standing = Standing::Leader { epoch: mine, renewed_at: now, next_renew };
                        Heard::Ignored
                    }
                    Err(ElectionError::LeaseLost(_)) => {
                        self.deposed_until = Some(now.saturating_add(self.cfg.lease_ttl));
                        self.step_down(now, mine, format!("a leader of the newer epoch {epoch} is heard and its own lease is gone"));
                        Heard::Accepted
                    }
                    // The renewal path decides (it steps down before the
                    // lease could lapse).
                    Err(ElectionError::Unavailable(_) | ElectionError::Store(_)) => Heard::Ignored,
                }
            }
            Standing::Leader { .. } => Heard::Ignored,
        }
    }

    /// Whether a heartbeat may make it consult the store now (at most once
    /// per heartbeat interval).
    fn may_ask_store(&mut self, now: Instant) -> bool {
        if self.store_checked_at.is_some_and(|t| now < t.saturating_add(self.cfg.heartbeat)) {
            return false;
        }
        self.store_checked_at = Some(now);
        true
    }

    /// Gives the leadership up at `now` (a clean shutdown): revokes its own
    /// lease so that a standby wins at its next try instead of after the
    /// failure timeout. Not leading: nothing to do.
    pub fn resign(&mut self, now: Instant) -> Result<(), ElectionError> {
        let now = self.observe(now);
        let Some(epoch) = self.leading() else { return Ok(()) };
        self.step_down(now, epoch, "it resigned".into());
        self.election.revoke(now, epoch)
    }

    /// Does what is due at `now`; whether anything changed.
    pub fn poll(&mut self, now: Instant) -> bool {
        let now = self.observe(now);
        match self.standing.clone() {
            Standing::Standby { leader, heard_at } => self.poll_standby(now, leader, heard_at),
            Standing::Leader { epoch, renewed_at, next_renew } => {
                if now < next_renew {
                    return false;
                }
                match self.election.keep_alive(now, epoch) {
                    Ok(()) => {
                        self.standing = Standing::Leader { epoch, renewed_at: now, next_renew: now + self.cfg.heartbeat };
                        false
                    }
                    Err(ElectionError::LeaseLost(_)) => {
                        self.deposed_until = Some(now.saturating_add(self.cfg.lease_ttl));
                        self.step_down(now, epoch, "its lease is gone (revoked or expired)".into());
                        true
                    }
                    Err(why @ (ElectionError::Unavailable(_) | ElectionError::Store(_))) => {
                        if now >= renewed_at.saturating_add(self.safe_lease()) {
                            self.step_down(now, epoch, format!("the lease could not be renewed before it would lapse: {why}"));
                            return true;
                        }
                        self.standing = Standing::Leader { epoch, renewed_at, next_renew: now + self.cfg.heartbeat };
                        false
                    }
                }
            }
        }
    }

    /// When it next has timed work.
    pub fn poll_at(&self) -> Option<Instant> {
        match &self.standing {
            Standing::Leader { next_renew, renewed_at, .. } => {
                Some((*next_renew).min(renewed_at.saturating_add(self.safe_lease())))
            }
            Standing::Standby { leader: Some(_), heard_at } => {
                let silent = heard_at.saturating_add(self.cfg.failure_timeout) + Duration::from_nanos(1);
                Some(self.retry_at.map_or(silent, |r| r.max(silent)))
            }
            Standing::Standby { leader: None, .. } => Some(self.retry_at.unwrap_or(self.now)),
        }
    }

    /// How long a leader trusts an unrenewed lease: its TTL less one
    /// heartbeat, so that it has stopped before any standby can win.
    fn safe_lease(&self) -> Duration {
        Duration::from_nanos(self.cfg.lease_ttl.as_nanos().saturating_sub(self.cfg.heartbeat.as_nanos()))
    }

    fn observe(&mut self, now: Instant) -> Instant {
        self.now = self.now.max(now);
        self.now
    }

    fn step_down(&mut self, now: Instant, epoch: Epoch, why: String) {
        self.standing = Standing::Standby { leader: None, heard_at: now };
        self.retry_at = Some(now + self.cfg.heartbeat);
        self.events.push_back(RoleEvent::SteppedDown { epoch, why });
    }

    fn poll_standby(&mut self, now: Instant, leader: Option<Leadership>, heard_at: Instant) -> bool {
        if self.retry_at.is_some_and(|r| now < r) {
            return false;
        }
        let deposed = self.deposed_until.is_some_and(|d| now < d);
        let silent = leader
            .as_ref()
            .filter(|_| now.saturating_since(heard_at) > self.cfg.failure_timeout);
        if leader.is_some() && silent.is_none() {
            return false;
        }
        // Deposed: the store's own expiry decides (see `deposed_until`).
        let silent = silent.filter(|_| !deposed);
        let mut changed = false;
        if let Some(l) = silent {
            // Faster than waiting for the store to expire the lease.
            if self.election.revoke(now, l.epoch).is_err() {
                self.retry_at = Some(now + self.cfg.heartbeat);
                return false;
            }
            self.events.push_back(RoleEvent::LeaderSilent(l.clone()));
            changed = true;
        }
        let me = self.cfg.me.clone();
        match self.election.campaign(now, &me) {
            Ok(Some(epoch)) => {
                self.retry_at = None;
                self.standing = Standing::Leader { epoch, renewed_at: now, next_renew: now + self.cfg.heartbeat };
                self.events.push_back(RoleEvent::Elected { epoch });
                true
            }
            Ok(None) => match self.election.leader(now) {
                Ok(Some(l)) => {
                    self.retry_at = None;
                    let new = leader.as_ref() != Some(&l);
                    // A new leader gets a whole failure timeout to be heard.
                    self.standing = Standing::Standby { leader: Some(l.clone()), heard_at: now };
                    if new {
                        self.events.push_back(RoleEvent::Following(l));
                    }
                    new || changed
                }
                // Lapsed in between: campaign again next time.
                Ok(None) | Err(_) => {
                    self.retry_at = Some(now + self.cfg.heartbeat);
                    changed
                }
            },
            Err(_) => {
                self.retry_at = Some(now + self.cfg.heartbeat);
                self.standing = Standing::Standby { leader: None, heard_at };
                changed
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::InMemory;
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn cfg(me: &str) -> CandidateConfig {
        CandidateConfig { me: me.into(), heartbeat: ms(10), failure_timeout: ms(50), lease_ttl: ms(1000) }
    }

    /// Two candidates over one store; the leader's heartbeats reach the
    /// standby only while `linked`.
    struct Pair {
        store: InMemory,
        c: [Candidate<InMemory>; 2],
        events: Vec<(usize, Instant, RoleEvent)>,
    }

    impl Pair {
        fn new() -> Pair {
            let store = InMemory::new(ms(1000));
            let c = [Candidate::new(cfg("a"), store.handle("a")), Candidate::new(cfg("b"), store.handle("b"))];
            Pair { store, c, events: Vec::new() }
        }

        /// Runs both from `from` to `to` in 1 ms steps; `alive[i]` false
        /// pauses candidate i; heartbeats flow while `linked`. Checks at
        /// every step that at most one candidate leads a live term past
        /// its safe lease.
        fn run(&mut self, from: Instant, to: Instant, alive: [bool; 2], linked: bool) {
            let mut t = from;
            let mut step = 0u64;
            while t <= to {
                for (i, c) in self.c.iter_mut().enumerate().filter(|(i, _)| alive[*i]) {
                    c.poll(t);
                    while let Some(e) = c.poll_event() {
                        self.events.push((i, t, e));
                    }
                }
                for i in 0..2 {
                    let j = 1 - i;
                    if let (Some(e), true, true, true) = (self.c[i].leading(), alive[i], alive[j], linked) {
                        if step.is_multiple_of(10) {
                            self.c[j].handle_heartbeat(t, e);
                        }
                    }
                }
                let leaders: Vec<Epoch> = self.c.iter().filter_map(|c| c.leading()).collect();
                if leaders.len() == 2 {
                    // The older term must be fenced: its lease is gone.
                    let old = leaders.iter().min().copied().unwrap_or(0);
                    assert!(old < self.store.revision(), "two leaders of live terms at {t:?}: {leaders:?}");
                }
                t += ms(1);
                step += 1;
            }
        }
    }

    #[test]
    fn the_first_campaign_wins_and_the_other_follows() {
        let mut p = Pair::new();
        let t0 = Instant::from_nanos(1);
        p.run(t0, t0 + ms(200), [true, true], true);
        assert_eq!(p.c[0].leading(), Some(1));
        assert_eq!(p.c[1].following().map(|l| l.leader.as_str()), Some("a"));
        assert_eq!(p.events.len(), 2, "{:?}", p.events);
    }

    #[test]
    fn a_crashed_leader_is_replaced_after_the_failure_timeout_not_the_lease() {
        let mut p = Pair::new();
        let t0 = Instant::from_nanos(1);
        p.run(t0, t0 + ms(100), [true, true], true);
        let crash = t0 + ms(101);
        p.run(crash, crash + ms(200), [false, true], true);
        let (_, at, _) = p.events.iter().find(|(i, _, e)| *i == 1 && matches!(e, RoleEvent::Elected { epoch: 2 })).cloned().expect("b elected");
        let takeover = at.saturating_since(crash);
        assert!(takeover <= ms(50 + 10 + 2), "took {takeover:?}");
        // The old leader comes back (a pause, not a crash): it steps down
        // at its next renewal.
        let back = crash + ms(201);
        p.run(back, back + ms(20), [true, true], true);
        assert_eq!(p.c[0].leading(), None);
        assert!(p.events.iter().any(|(i, _, e)| *i == 0 && matches!(e, RoleEvent::SteppedDown { epoch: 1, .. })));
    }

    #[test]
    fn without_the_store_the_leader_serves_until_its_lease_would_lapse_and_nobody_else_is_elected() {
        let mut p = Pair::new();
        let t0 = Instant::from_nanos(1);
        p.run(t0, t0 + ms(100), [true, true], true);
        p.store.set_down(true);
        let down = t0 + ms(101);
        p.run(down, down + ms(1500), [true, true], true);
        let stepped = p
            .events
            .iter()
            .find(|(i, _, e)| *i == 0 && matches!(e, RoleEvent::SteppedDown { .. }))
            .map(|(_, t, _)| *t)
            .expect("the leader steps down");
        assert!(stepped.saturating_since(down) < ms(1000), "before its lease could lapse");
        assert!(p.events.iter().all(|(_, _, e)| !matches!(e, RoleEvent::Elected { epoch: 2.. })));
        p.store.set_down(false);
        let up = down + ms(1501);
        p.run(up, up + ms(100), [true, true], true);
        let leaders: Vec<Epoch> = p.c.iter().filter_map(|c| c.leading()).collect();
        assert_eq!(leaders, vec![2]);
    }

    #[test]
    fn a_partition_between_leader_and_standby_moves_leadership_once() {
        let mut p = Pair::new();
        let t0 = Instant::from_nanos(1);
        p.run(t0, t0 + ms(100), [true, true], true);
        let cut = t0 + ms(101);
        p.run(cut, cut + ms(300), [true, true], false);
        // b revoked a's lease and won; a learnt at its next renewal.
        assert_eq!(p.c[1].leading(), Some(2));
        assert_eq!(p.c[0].leading(), None);
        // Healed: a follows b and stays a standby.
        let healed = cut + ms(301);
        p.run(healed, healed + ms(300), [true, true], true);
        assert_eq!(p.c[1].leading(), Some(2));
        assert_eq!(p.store.revision(), 2, "{:?}", p.events);
    }

    #[test]
    fn a_heartbeat_claiming_a_term_the_store_never_granted_deposes_nobody() {
        let mut p = Pair::new();
        let t0 = Instant::from_nanos(1);
        p.run(t0, t0 + ms(100), [true, true], true);
        assert_eq!(p.c[0].leading(), Some(1));
        let forged = t0 + ms(101);
        assert_eq!(p.c[0].handle_heartbeat(forged, u64::MAX), Heard::Ignored);
        // A flood within the store-check interval is not even checked.
        for k in 0..100 {
            assert_eq!(p.c[0].handle_heartbeat(forged + Duration::from_nanos(k), 1 << 40), Heard::Ignored);
        }
        p.run(forged + ms(1), forged + ms(300), [true, true], true);
        assert_eq!(p.c[0].leading(), Some(1));
        assert!(p.events.iter().all(|(_, _, e)| !matches!(e, RoleEvent::SteppedDown { .. })), "{:?}", p.events);
        assert_eq!(p.store.revision(), 1);
    }

    #[test]
    fn a_leader_whose_lease_is_gone_steps_down_on_a_newer_terms_heartbeat() {
        let mut p = Pair::new();
        let t0 = Instant::from_nanos(1);
        p.run(t0, t0 + ms(100), [true, true], true);
        let mut other = p.store.handle("b");
        other.revoke(t0 + ms(101), 1).unwrap();
        let e = other.campaign(t0 + ms(101), "b").unwrap().expect("b wins the free key");
        assert_eq!(p.c[0].handle_heartbeat(t0 + ms(102), e), Heard::Accepted);
        assert_eq!(p.c[0].leading(), None);
    }

    #[test]
    fn heartbeats_of_terms_the_store_never_granted_do_not_keep_a_standby_from_taking_over() {
        let mut p = Pair::new();
        let t0 = Instant::from_nanos(1);
        p.run(t0, t0 + ms(100), [true, true], true);
        // The leader dies; a forger sends the standby heartbeats of newer
        // (never granted) terms every millisecond.
        let crash = t0 + ms(101);
        let mut t = crash;
        let mut claimed = 2;
        while t <= crash + ms(200) && p.c[1].leading().is_none() {
            assert_eq!(p.c[1].handle_heartbeat(t, claimed), Heard::Ignored);
            claimed += 1;
            p.c[1].poll(t);
            t += ms(1);
        }
        assert_eq!(p.c[1].leading(), Some(2), "the standby took over at {:?}", t.saturating_since(crash));
        assert!(t.saturating_since(crash) <= ms(50 + 10 + 2), "took {:?}", t.saturating_since(crash));
    }
}
