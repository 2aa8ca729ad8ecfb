//! The deterministic cluster harness in CI: many seeds of every fault
//! class, with every invariant checked after each seed, and the contract
//! of `symphony chaos` (JSON keys, the same trace hash for the same seed).
//!
//! `CHAOS_SEEDS` sets the seeds per class (default 1000; a nightly soak
//! sets more, e.g. `CHAOS_SEEDS=100000`).

use std::process::Command;

use dataplane::time::Duration;
use tools::chaos::sweep::sweep;
use tools::chaos::{run, ChaosConfig, FaultClass, FaultSet};

/// Arrivals per seed: 0.8 s at 800 requests/s (about 640 requests; the
/// fewest over 1000 seeds stays above 500).
const SEED_DURATION: Duration = Duration::from_millis(800);

fn seeds() -> u64 {
    std::env::var("CHAOS_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(1000)
}

fn class_holds_over_many_seeds(class: FaultClass) {
    let cfg = ChaosConfig::new(1, FaultSet::only(class), SEED_DURATION);
    assert!(cfg.frontends >= 3 && cfg.backends >= 4);
    let n = seeds();
    let s = sweep(&cfg, n, 1, &|_| {}).expect("harness runs");
    assert_eq!(s.seeds, n);
    assert!(s.min_requests >= 500, "{}: a seed had only {} requests", class.as_str(), s.min_requests);
    for r in &s.failures {
        eprintln!("seed {} failed: {:?}\n  replay: {}", r.seed, r.violations, r.replay);
    }
    assert!(s.ok(), "{}: {} of {n} seeds broke an invariant; classes without hits: {:?}", class.as_str(), s.failed_seeds, s.classes_without_hits);
    eprintln!(
        "{}: {n} seeds, {} requests, {} succeeded, {} hits in flight, {} plans fenced off",
        class.as_str(),
        s.accepted,
        s.succeeded,
        s.faults.get(class.as_str()).copied().unwrap_or(0),
        s.fenced_plans
    );
}

#[test]
fn loss() {
    class_holds_over_many_seeds(FaultClass::Loss);
}
#[test]
fn dup() {
    class_holds_over_many_seeds(FaultClass::Dup);
}
#[test]
fn reorder() {
    class_holds_over_many_seeds(FaultClass::Reorder);
}
#[test]
fn partition() {
    class_holds_over_many_seeds(FaultClass::Partition);
}
#[test]
fn crash() {
    class_holds_over_many_seeds(FaultClass::Crash);
}
#[test]
fn slow_gpu() {
    class_holds_over_many_seeds(FaultClass::SlowGpu);
}
// Failover (issue 18): three schedulers elected through an in-memory store.
#[test]
fn leader_crash() {
    class_holds_over_many_seeds(FaultClass::LeaderCrash);
}
#[test]
fn leader_pause() {
    class_holds_over_many_seeds(FaultClass::LeaderPause);
}
#[test]
fn store_down() {
    class_holds_over_many_seeds(FaultClass::StoreDown);
}
#[test]
fn leader_partition() {
    class_holds_over_many_seeds(FaultClass::LeaderPartition);
}
// Several scheduler groups (issue 19): the routing table moves models away
// from the harness's scheduler and back at seeded times under load; every
// request ends once and no plan of a moved model leaves after the move.
#[test]
fn reroute() {
    class_holds_over_many_seeds(FaultClass::Reroute);
}
// Membership (issue 52): a backend told to leave (its SIGTERM drain) that
// crashes at a drawn moment, during its drain or after it left; a backend
// joining the running cluster while cut from the scheduler or a frontend.
// A backend whose leave the scheduler released answered every task
// planned to it.
#[test]
fn drain() {
    class_holds_over_many_seeds(FaultClass::Drain);
}
#[test]
fn join() {
    class_holds_over_many_seeds(FaultClass::Join);
}

/// Two active scheduler groups (issue 19): group b with its own backends,
/// every frontend linked to both, routing changes at seeded times under
/// load, each node applying each table after its own seeded lag. Every
/// request ends once, no plan of a model leaves either scheduler after it
/// applied a revision that took the model away, and the tasks a group
/// hands back are resubmitted: nearly all of them reach their owner rather
/// than end as dropped `moved`. Shorter seeds than the other classes (CI's budget).
#[test]
fn reroute2() {
    let cfg = ChaosConfig::new(1, FaultSet::only(FaultClass::Reroute2), Duration::from_millis(400));
    let n = seeds();
    let s = sweep(&cfg, n, 1, &|_| {}).expect("harness runs");
    for r in &s.failures {
        eprintln!("seed {} failed: {:?}\n  replay: {}", r.seed, r.violations, r.replay);
    }
    assert!(s.ok(), "reroute2: {} of {n} seeds broke an invariant", s.failed_seeds);
    eprintln!(
        "reroute2: {n} seeds, {} requests, {} succeeded, {} routing changes, {} tasks resubmitted, {} dropped moved",
        s.accepted,
        s.succeeded,
        s.faults.get("reroute2").copied().unwrap_or(0),
        s.resubmitted,
        s.moved_dropped
    );
    assert!(s.resubmitted >= 3 * n, "moves hand tasks back: {} over {n} seeds", s.resubmitted);
    // Measured on 2026-11-26: 3 of 22823 resubmitted tasks ended dropped
    // `moved` (their budget ran out while the owner lagged).
    assert!(s.moved_dropped * 100 <= s.resubmitted, "resubmitted tasks find their owner: {} of {} dropped moved", s.moved_dropped, s.resubmitted);
}

/// Two scheduler groups under every other fault at once: message faults,
/// node crashes, slow GPUs and group a's leader crashing, pausing, losing
/// its store or cut off from its standbys while tables move models between
/// the groups. Found on 2026-11-26 (10 of 500 seeds failed): a task whose
/// group lost its leader was resubmitted to the model's new owner while
/// the old leader's batch with it still ran on a group-a backend (executed
/// twice), and the harness's new terms owned every model before reading a
/// table. Every invariant holds over every seed.
#[test]
fn reroute2_under_every_fault_class() {
    let faults = FaultSet::parse("loss,dup,reorder,partition,crash,slow-gpu,leader-crash,leader-pause,store-down,leader-partition,reroute2").unwrap();
    let cfg = ChaosConfig::new(1, faults, Duration::from_millis(400));
    // Half the classes' count (CI's budget; 5000 seeds measured, see
    // docs/benchmarks.md, and `CHAOS_SEEDS` raises it).
    let n = seeds().div_ceil(2);
    let s = sweep(&cfg, n, 1, &|_| {}).expect("harness runs");
    for r in &s.failures {
        eprintln!("seed {} failed: {:?}\n  replay: {}", r.seed, r.violations, r.replay);
    }
    assert!(s.ok(), "{}: {} of {n} seeds broke an invariant; classes without hits: {:?}", faults.names(), s.failed_seeds, s.classes_without_hits);
    eprintln!("{}: {n} seeds, {} requests, {} succeeded, {} resubmitted", faults.names(), s.accepted, s.succeeded, s.resubmitted);
}

/// The seeds that found the defect above, each kept as a single replay
/// whatever `CHAOS_SEEDS` says: a leader crash (seed 3: a task executed
/// on both groups), a leader cut off from its standbys (seed 33: its
/// successor handed a task to group b while the old term's batch with it
/// still ran), and all eleven classes (seed 69: a new term planned a model
/// before it had read the table; seed 103476: a network copy of a task
/// handed back as moved was taken by its first group after a move back
/// while the task ran on the other).
#[test]
fn regression_reroute2_with_leader_faults() {
    let all = "loss,dup,reorder,partition,crash,slow-gpu,leader-crash,leader-pause,store-down,leader-partition,reroute2";
    for (seed, faults) in [(3, "leader-crash,reroute2"), (33, "leader-partition,reroute2"), (69, all), (103476, all)] {
        let r = run(ChaosConfig::new(seed, FaultSet::parse(faults).unwrap(), Duration::from_millis(400))).unwrap();
        assert!(r.ok(), "{:?}\n  replay: {}", r.violations, r.replay);
    }
}

/// Priorities, cancellations and bounded queues under faults: every
/// invariant (accounting with `cancelled`, nothing left at the scheduler)
/// holds; without message loss not even a staging slot is left behind.
fn admission_holds_over_many_seeds(faults: FaultSet) -> u64 {
    let cfg = ChaosConfig { priority_mix: 0.3, cancel_share: 0.1, max_queue: 48, rate_rps: 1200.0, ..ChaosConfig::new(1, faults, SEED_DURATION) };
    let n = seeds();
    let s = sweep(&cfg, n, 1, &|_| {}).expect("harness runs");
    for r in &s.failures {
        eprintln!("seed {} failed: {:?}\n  replay: {}", r.seed, r.violations, r.replay);
    }
    assert!(s.ok(), "{}: {} of {n} seeds broke an invariant; classes without hits: {:?}", faults.names(), s.failed_seeds, s.classes_without_hits);
    eprintln!("{}: {n} seeds, {} requests, {} cancelled", faults.names(), s.accepted, s.cancelled);
    s.cancelled
}

#[test]
fn priorities_cancels_and_queue_bounds_under_every_fault() {
    admission_holds_over_many_seeds(FaultSet::ALL);
}

/// Seed 567 of the sweep above (found on 2026-11-23): a restarted backend
/// was delivered its first plans before the scheduler's Welcome (the
/// network reordered them) and ignored them, so their tasks were never
/// answered. Kept as a single replay so that it runs whatever `CHAOS_SEEDS`
/// says.
#[test]
fn regression_seed_567_plans_before_the_welcome() {
    let cfg = ChaosConfig { seed: 567, priority_mix: 0.3, cancel_share: 0.1, max_queue: 48, rate_rps: 1200.0, ..ChaosConfig::new(567, FaultSet::ALL, SEED_DURATION) };
    let r = run(cfg).unwrap();
    assert!(r.ok(), "{:?}\n  replay: {}", r.violations, r.replay);
}

#[test]
fn cancels_leave_no_slot_queue_entry_or_task_id_behind() {
    let cancelled = admission_holds_over_many_seeds(FaultSet::parse("dup,reorder,slow-gpu").unwrap());
    assert!(cancelled >= 1000.min(seeds() * 40), "only {cancelled} cancellations");
}

#[test]
fn the_same_seed_replays_the_same_trace_and_another_seed_does_not() {
    let cfg = ChaosConfig::new(7, FaultSet::ALL, Duration::from_millis(2000));
    let a = run(cfg.clone()).unwrap();
    let b = run(cfg.clone()).unwrap();
    assert!(a.ok(), "{:?}", a.violations);
    assert_eq!(a.trace_hash, b.trace_hash);
    assert_eq!((a.accepted, a.succeeded, a.late, a.batches), (b.accepted, b.succeeded, b.late, b.batches));
    let c = run(ChaosConfig { seed: 8, ..cfg }).unwrap();
    assert_ne!(a.trace_hash, c.trace_hash);
}

#[test]
fn without_faults_nearly_everything_succeeds() {
    let r = run(ChaosConfig::new(3, FaultSet::NONE, Duration::from_millis(3000))).unwrap();
    assert!(r.ok(), "{:?}", r.violations);
    assert!(r.accepted > 2000, "{}", r.accepted);
    assert!(r.succeeded as f64 >= 0.99 * r.accepted as f64, "{r:?}");
    assert!(r.faults.is_empty());
}

#[test]
fn cli_json_has_the_documented_keys_and_a_stable_hash() {
    let json = |args: &[&str]| -> serde_json::Value {
        let out = Command::new(env!("CARGO_BIN_EXE_symphony")).args(args).output().expect("runs");
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("JSON")
    };
    let args = ["chaos", "--seed", "1", "--faults", "all", "--duration-s", "2", "--json"];
    let v = json(&args);
    for k in ["accepted", "succeeded", "dropped", "failed", "unaccounted", "faults", "trace_hash"] {
        assert!(v.get(k).is_some(), "missing {k}: {v}");
    }
    assert_eq!(v["unaccounted"], 0);
    assert_eq!(json(&args)["trace_hash"], v["trace_hash"]);
    let out = Command::new(env!("CARGO_BIN_EXE_symphony")).args(["chaos", "--faults", "loss,bogus"]).output().expect("runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("valid: all, none, loss"));
}
