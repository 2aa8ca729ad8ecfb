//! The etcd [`Election`] against a real local etcd (Debian's etcd-server,
//! installed by scripts/setup.sh): the same contract the in-memory store
//! keeps for the harness, and the [`Candidate`] over it.

use dataplane::time::{Duration, Instant};
use scheduler::election::{Candidate, CandidateConfig, Election, ElectionError, Etcd, EtcdConfig, LocalEtcd, RoleEvent};

const START: std::time::Duration = std::time::Duration::from_secs(20);

fn etcd(members: usize) -> LocalEtcd {
    LocalEtcd::start(members, START).unwrap_or_else(|e| panic!("{e}"))
}

fn election(local: &LocalEtcd, key: &str) -> Etcd {
    Etcd::new(EtcdConfig {
        endpoints: local.endpoints(),
        key: key.into(),
        lease_ttl: Duration::from_millis(1000),
        op_timeout: Duration::from_millis(1000),
    })
    .expect("runtime")
}

fn now() -> Instant {
    Instant::ZERO
}

#[test]
fn one_campaign_wins_the_other_sees_it_and_a_revoke_frees_the_key_at_once() {
    let local = etcd(1);
    let mut a = election(&local, "/t/leader");
    let mut b = election(&local, "/t/leader");
    assert_eq!(a.leader(now()).unwrap(), None, "nobody leads yet");
    let ea = a.campaign(now(), "a").unwrap().expect("a wins a free key");
    assert_eq!(b.campaign(now(), "b").unwrap(), None, "b loses while a holds it");
    let seen = b.leader(now()).unwrap().expect("a leads");
    assert_eq!((seen.leader.as_str(), seen.epoch), ("a", ea));
    a.keep_alive(now(), ea).expect("a renews its own lease");
    // b revokes a's term (a silent leader): the key is free at once, not
    // after the TTL, and b's new term is a larger epoch.
    let t = std::time::Instant::now();
    b.revoke(now(), ea).unwrap();
    let eb = b.campaign(now(), "b").unwrap().expect("b wins after the revoke");
    assert!(t.elapsed() < std::time::Duration::from_millis(500), "took {:?}", t.elapsed());
    assert!(eb > ea, "epochs grow: {ea} then {eb}");
    // a learns at its next renewal that its lease is gone.
    assert!(matches!(a.keep_alive(now(), ea), Err(ElectionError::LeaseLost(e)) if e == ea));
    // Revoking a term that is already gone is not an error and leaves the
    // current one alone.
    a.revoke(now(), ea).unwrap();
    assert_eq!(b.leader(now()).unwrap().map(|l| l.epoch), Some(eb));
}

#[test]
fn revoking_a_lease_that_etcd_no_longer_has_is_not_an_error() {
    let local = etcd(1);
    let mut a = election(&local, "/t/gone");
    let mut b = election(&local, "/t/gone");
    let ea = a.campaign(now(), "a").unwrap().expect("a wins a free key");
    b.revoke(now(), ea).unwrap();
    // a still holds the lease id: its revoke reaches etcd, which answers
    // NotFound (the same end as a revoke that succeeds).
    a.revoke(now(), ea).expect("a lease that is already gone");
    assert_eq!(a.leader(now()).unwrap(), None);
}

#[test]
fn an_unrenewed_lease_lapses_and_frees_the_key() {
    let local = etcd(1);
    let mut a = election(&local, "/t/lapse");
    let mut b = election(&local, "/t/lapse");
    let ea = a.campaign(now(), "a").unwrap().expect("a wins");
    // No keep-alive: etcd expires the 1 s lease within TTL..TTL+0.5 s.
    let t = std::time::Instant::now();
    let eb = loop {
        if let Some(e) = b.campaign(now(), "b").unwrap() {
            break e;
        }
        assert!(t.elapsed() < std::time::Duration::from_secs(5), "the lease never lapsed");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(eb > ea);
    assert!(t.elapsed() >= std::time::Duration::from_millis(500), "lapsed after {:?}", t.elapsed());
}

#[test]
fn a_store_that_is_gone_is_unavailable_not_an_answer() {
    let mut local = etcd(1);
    let mut a = Etcd::new(EtcdConfig {
        endpoints: local.endpoints(),
        key: "/t/down".into(),
        lease_ttl: Duration::from_millis(1000),
        op_timeout: Duration::from_millis(300),
    })
    .unwrap();
    let ea = a.campaign(now(), "a").unwrap().expect("a wins");
    local.kill_all();
    assert!(matches!(a.keep_alive(now(), ea), Err(ElectionError::Unavailable(_) | ElectionError::Store(_))));
    assert!(matches!(a.leader(now()), Err(ElectionError::Store(_))));
    assert!(matches!(a.campaign(now(), "a"), Err(ElectionError::Store(_))));
}

#[test]
fn with_three_members_losing_one_changes_nothing() {
    let mut local = etcd(3);
    let mut a = election(&local, "/t/quorum");
    let ea = a.campaign(now(), "a").unwrap().expect("a wins");
    local.kill_member(0);
    // A request that went to the dead member fails over to a live one
    // within a few tries; the lease is kept throughout.
    let mut renewed = 0;
    for _ in 0..20 {
        if a.keep_alive(now(), ea).is_ok() {
            renewed += 1;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(renewed >= 10, "renewed {renewed} of 20 with 2 of 3 members");
    let mut b = election(&local, "/t/quorum");
    let mut seen = None;
    for _ in 0..10 {
        if let Ok(l) = b.leader(now()) {
            seen = l;
            break;
        }
    }
    assert_eq!(seen.map(|l| l.epoch), Some(ea));
}

/// Two candidates over real etcd on the real clock: the standby takes
/// over from a silent leader after the failure timeout (by revoking its
/// lease), far sooner than the 1 s lease would lapse.
#[test]
fn a_candidate_over_etcd_takes_over_from_a_silent_leader_in_the_failure_timeout() {
    let local = etcd(1);
    let cfg = |me: &str| CandidateConfig {
        me: me.into(),
        heartbeat: Duration::from_millis(20),
        failure_timeout: Duration::from_millis(100),
        lease_ttl: Duration::from_millis(1000),
    };
    let mut a = Candidate::new(cfg("a"), election(&local, "/t/cand"));
    let mut b = Candidate::new(cfg("b"), election(&local, "/t/cand"));
    let clock = dataplane::time::MonotonicClock::new();
    // a campaigns first and leads; b follows and hears a's heartbeats.
    a.poll(clock.now());
    b.poll(clock.now());
    assert!(a.leading().is_some() && b.following().is_some());
    let ea = a.leading().unwrap();
    let until = clock.now() + Duration::from_millis(200);
    while clock.now() < until {
        a.poll(clock.now());
        b.handle_heartbeat(clock.now(), ea);
        b.poll(clock.now());
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(a.leading(), Some(ea), "a renewed throughout");
    assert!(b.leading().is_none());
    // a goes silent (crash or pause): b takes over.
    let silent = clock.now();
    let elected = loop {
        b.poll(clock.now());
        if let Some(e) = std::iter::from_fn(|| b.poll_event()).find_map(|e| match e {
            RoleEvent::Elected { epoch } => Some(epoch),
            _ => None,
        }) {
            break e;
        }
        assert!(clock.now().saturating_since(silent) < Duration::from_millis(3000), "no takeover");
        std::thread::sleep(std::time::Duration::from_millis(2));
    };
    let took = clock.now().saturating_since(silent);
    assert!(elected > ea);
    assert!(took < Duration::from_millis(600), "takeover took {took:?}");
    // a comes back: its next renewal finds the lease gone; it steps down.
    a.poll(clock.now() + Duration::from_millis(30));
    assert_eq!(a.leading(), None);
}

#[test]
fn the_routing_table_is_stored_with_its_revision_and_a_stale_write_is_refused() {
    use scheduler::election::RoutesStoreError;
    use scheduler::routes::{RouteGroup, RouteTable};
    let local = etcd(1);
    let mut a = election(&local, "/t/unused");
    let mut b = election(&local, "/t/unused");
    let key = "/t/routes";
    assert_eq!(a.get_routes(key).unwrap(), None, "nothing stored yet");
    let g = |name: &str, model: &str| RouteGroup {
        name: name.into(),
        election_key: format!("/t/leader/{name}"),
        schedulers: vec![],
        models: vec![model.into()],
        backends: vec![],
    };
    let t1 = RouteTable { revision: 1, groups: vec![g("a", "ResNet50"), g("b", "InceptionV3")] };
    a.put_routes(key, &t1).unwrap();
    assert_eq!(b.get_routes(key).unwrap(), Some(t1.clone()));
    let t2 = t1.with_move("ResNet50", "b").unwrap();
    b.put_routes(key, &t2).unwrap();
    // a writes its own move on the stale revision 1: refused.
    let stale = t1.with_move("InceptionV3", "a").unwrap();
    assert!(matches!(a.put_routes(key, &stale), Err(RoutesStoreError::Conflict { stored: 2, written: 2 })));
    assert_eq!(a.get_routes(key).unwrap(), Some(t2));
}
