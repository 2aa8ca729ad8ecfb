//! Behaviour pinned by trace hashes (issue 48): for a fixed set of seeds
//! per named fault class, the deterministic harness must replay exactly
//! the trace it replayed when the hashes were recorded. A refactor that is
//! meant to change nothing (splitting the control plane or the frontend
//! node into parts) keeps every hash; a commit that changes behaviour on
//! purpose updates the table below in the same commit and says why.
//!
//! `trace_hash` hashes every message and fault the simulated network
//! carried, in order, so any change in what a node sends, or when, moves
//! it. On a mismatch the test prints the whole table as it now is, ready
//! to paste once the change is known to be intended.

use dataplane::time::Duration;
use tools::chaos::{run, ChaosConfig, FaultSet};

/// Arrivals per seed, as in `tests/chaos.rs`: the whole table runs in a
/// second or two in release and every class hits traffic in flight.
const SEED_DURATION: Duration = Duration::from_millis(800);

/// The configurations pinned: a label, the fault set, and whether the
/// admission features (priorities, cancellations, bounded queues) are on.
const CASES: &[(&str, &str, bool)] = &[
    ("loss", "loss", false),
    ("dup", "dup", false),
    ("reorder", "reorder", false),
    ("partition", "partition", false),
    ("crash", "crash", false),
    ("slow-gpu", "slow-gpu", false),
    ("leader-crash", "leader-crash", false),
    ("leader-pause", "leader-pause", false),
    ("store-down", "store-down", false),
    ("leader-partition", "leader-partition", false),
    ("reroute", "reroute", false),
    ("reroute2", "reroute2", false),
    ("drain", "drain", false),
    ("join", "join", false),
    ("stall", "stall", false),
    ("none+admission", "none", true),
    ("all+admission", "all", true),
];

/// Seeds run for every case.
const SEEDS: [u64; 3] = [1, 2, 3];

/// `(case label, seed, trace_hash)`, recorded at commit dda3c52
/// (2026-11-28), before `scheduler/src/daemon/plane.rs` was split;
/// re-recorded the same day when the frontends began challenging their
/// data links (a Challenge and a Join replace each backend's Register);
/// re-recorded 2026-11-29 for wire version 8 (every header's version, and
/// each plan's task and each completion carrying the scheduler's 16-byte
/// capability, issue 55); the membership classes `drain` and `join`
/// (issue 52) added the same day, the other hashes unchanged; re-recorded
/// the same day when the capability's MAC became SipHash-2-4-128 (the
/// 16 capability bytes of every plan task and completion changed; their
/// length and every message's kind, order and timing did not);
/// re-recorded the same day for wire version 9 (each Join's peer nonce
/// and each Welcome's MAC, mutual authentication; the READ request's task
/// and capability), the join gate (a backend's GPUs serve after its
/// `Drain{Ready}`) and the deferred policy's item 34 (issue 49);
/// re-recorded the same day for wire version 10: a batch the scheduler
/// gives up is failed back as `Abandoned` (status 3), not `ExecFailed`
/// (issue 54); the class `stall` (a GPU 201x slower than its profile for
/// 1.1-2.5 s, past the scheduler's grace: late reports learned from, stale
/// plans skipped) added 2026-11-29 and, with it in `all`, all+admission
/// re-recorded; the other 45 hashes unchanged. Re-recorded 2026-11-29
/// (session 37) for 9da740c/49c71eb: a GPU with a batch 20 ms (or twice
/// its run) past its planned finish unreported, or given up, stays out of
/// matchmaking until it reports (crash 1/3: a restarted frontend's tasks
/// held until the backends' links are reported; slow-gpu 3, stall 2/3 and
/// all+admission 1-3: overdue GPUs held); the other 43 unchanged.
const PINNED: &[(&str, u64, &str)] = &[
    ("loss", 1, "ad7a3cc44b0a0489"),
    ("loss", 2, "80106dda4a35b690"),
    ("loss", 3, "a1d392a2d054e06b"),
    ("dup", 1, "88cd8455ec51a0ad"),
    ("dup", 2, "7a3a9eae9ca46ec4"),
    ("dup", 3, "960a8f611ff232cd"),
    ("reorder", 1, "76d47cb9455d6ade"),
    ("reorder", 2, "69e29e1fb9dd9536"),
    ("reorder", 3, "7ba6520625d626e8"),
    ("partition", 1, "dbf8709955ebe721"),
    ("partition", 2, "95dd58b00dff140f"),
    ("partition", 3, "1f066a5b5e416ad2"),
    ("crash", 1, "740fe76a2fa37d44"),
    ("crash", 2, "331dc9cc8678b26c"),
    ("crash", 3, "e8e83f1f93906289"),
    ("slow-gpu", 1, "1fb72b7ef9c3753e"),
    ("slow-gpu", 2, "a5a6ee55d48a2ba5"),
    ("slow-gpu", 3, "488360870fca10ec"),
    ("leader-crash", 1, "7ecc29dd99802665"),
    ("leader-crash", 2, "20ca71bf425899f2"),
    ("leader-crash", 3, "1c6f1a78e61f26b9"),
    ("leader-pause", 1, "bc065e245045896b"),
    ("leader-pause", 2, "8f282290f1df75d8"),
    ("leader-pause", 3, "37dc9f5ee0145dc9"),
    ("store-down", 1, "3e74de2e61b80ba4"),
    ("store-down", 2, "032eb0f0a2a6e511"),
    ("store-down", 3, "31ac6c332bf6680b"),
    ("leader-partition", 1, "7647212bdb0ae8a8"),
    ("leader-partition", 2, "52ac2e31d1aaffa9"),
    ("leader-partition", 3, "fc8253aba4de0989"),
    ("reroute", 1, "d7ffb5334f628cf7"),
    ("reroute", 2, "380995690706caec"),
    ("reroute", 3, "20610c62a8b89c12"),
    ("reroute2", 1, "67efd259976964e7"),
    ("reroute2", 2, "e9d61937eab4a382"),
    ("reroute2", 3, "6af80f201e86218b"),
    ("drain", 1, "93122f5d9c868987"),
    ("drain", 2, "aec5b775b8c3e4a8"),
    ("drain", 3, "17af7c1198c9564c"),
    ("join", 1, "9ce4b97cba42f8de"),
    ("join", 2, "ad68498035d2798a"),
    ("join", 3, "67dbee1959b937b9"),
    ("stall", 1, "e04ebec8c9578d31"),
    ("stall", 2, "2e90e8b79b31c407"),
    ("stall", 3, "eb3994728ea85c72"),
    ("none+admission", 1, "3ef6e56fa0c7822a"),
    ("none+admission", 2, "b1d9f7393fac2130"),
    ("none+admission", 3, "bb3c3e504ab94dc4"),
    ("all+admission", 1, "e25f1b91e2c5dd40"),
    ("all+admission", 2, "dad4fe670045c2ee"),
    ("all+admission", 3, "92770b7014d1a06b"),
];

fn config(seed: u64, faults: &str, admission: bool) -> ChaosConfig {
    let faults = FaultSet::parse(faults).expect("a pinned fault set parses");
    let base = ChaosConfig::new(seed, faults, SEED_DURATION);
    if admission {
        ChaosConfig { priority_mix: 0.3, cancel_share: 0.1, max_queue: 48, rate_rps: 1200.0, ..base }
    } else {
        base
    }
}

#[test]
fn trace_hashes_match_the_pinned_table() {
    let mut actual = Vec::new();
    for &(label, faults, admission) in CASES {
        for seed in SEEDS {
            let report = run(config(seed, faults, admission)).expect("harness runs");
            assert!(report.ok(), "{label} seed {seed}: {:?}\n  replay: {}", report.violations, report.replay);
            assert!(report.accepted > 0, "{label} seed {seed}: no traffic");
            actual.push((label, seed, report.trace_hash));
        }
    }
    let table: String = actual.iter().map(|(l, s, h)| format!("    (\"{l}\", {s}, \"{h}\"),\n")).collect();
    let mismatches: Vec<String> = actual
        .iter()
        .filter_map(|(label, seed, hash)| {
            let pinned = PINNED.iter().find(|(l, s, _)| l == label && s == seed).map(|(_, _, h)| *h);
            (pinned != Some(hash.as_str())).then(|| format!("{label} seed {seed}: pinned {pinned:?}, now {hash}"))
        })
        .collect();
    assert_eq!(PINNED.len(), actual.len(), "the table pins every case and seed; now:\n{table}");
    assert!(mismatches.is_empty(), "behaviour changed:\n{}\nthe table as it now is:\n{table}", mismatches.join("\n"));
}

/// The hash is a function of the seed alone: two runs of one seed agree,
/// and two seeds differ (so the table above can catch a change at all).
#[test]
fn the_hash_is_a_function_of_the_seed() {
    let a = run(config(7, "all", true)).expect("harness runs").trace_hash;
    let b = run(config(7, "all", true)).expect("harness runs").trace_hash;
    let c = run(config(8, "all", true)).expect("harness runs").trace_hash;
    assert_eq!(a, b);
    assert_ne!(a, c);
}
