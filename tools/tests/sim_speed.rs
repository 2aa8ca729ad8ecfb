//! The simulator's speed, checked in CI (issue 49, item 5): the marginal
//! cost of one simulated request under the deferred policy, in instructions
//! counted by Valgrind's callgrind, must stay within a pinned budget.
//!
//! Why instructions and not time: CI runs on a loaded 2-core machine where
//! wall-clock and even CPU-time figures of the same binary vary by more than
//! the slowdown to catch; an instruction count does not depend on the load
//! (or on the machine's clock), so the budget can sit well below the 1.5x
//! slowdown it must catch and still never fail by chance. The cost is
//! taken as the difference between two runs of the same workload that
//! differ only in length, divided by the difference in simulated requests:
//! process start, argument parsing and the report cancel out.
//!
//! How the budget was set and checked: the workload of the issue (the A100
//! zoo's models on 64 GPUs at 17000 requests/s, deferred, seed 1) costs
//! [`MEASURED_INSTRUCTIONS_PER_REQUEST`] (3183 after commit 43e9698, rustc
//! 1.95.0; 3511 at 0b92033, 3629 at e83b7d7, 4187 before it, 2721 at
//! 5c2b95e, the start of the baselines issue, whose 1.54x went unnoticed);
//! the budget is [`BUDGET_FACTOR`] of that. A simulator slowed by a busy
//! loop on every arrival to about 1.5x the instructions per request fails
//! this test. Lower the pinned figure when the simulator gets faster, so
//! that the budget keeps catching 1.5x.

#[path = "../../tests/lib/require.rs"]
mod require;

use std::process::Command;

/// Instructions per simulated request measured by this test's own
/// procedure on the build that pinned it (see the module docs).
const MEASURED_INSTRUCTIONS_PER_REQUEST: f64 = 3_183.0;

/// Budget over the measured cost: far above the run-to-run spread of an
/// instruction count (well under 1%) and a compiler update's usual drift,
/// and far enough below 1.5 that a 1.5x slowdown fails.
const BUDGET_FACTOR: f64 = 1.25;

/// Simulated seconds of the two runs: long enough that the arrivals
/// dominate the difference, short enough that both runs under callgrind
/// (about 50x slower than native) take a few seconds.
const SHORT_S: u32 = 1;
const LONG_S: u32 = 3;

fn valgrind_present() -> bool {
    Command::new("valgrind").arg("--version").output().is_ok_and(|o| o.status.success())
}

/// Instructions of one `symphony sim` run of `duration_s` simulated
/// seconds under callgrind, and the requests it simulated.
fn counted_run(duration_s: u32) -> (u64, u64) {
    let dir = std::env::temp_dir().join(format!("sim_speed_{}_{duration_s}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let profile = dir.join("callgrind.out");
    let out = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", profile.display()))
        .arg(env!("CARGO_BIN_EXE_symphony"))
        .args(["sim", "--zoo", "a100", "--models", "all", "--gpus", "64", "--rate", "17000", "--policy", "deferred", "--seed", "1", "--json"])
        .args(["--duration-s", &duration_s.to_string()])
        .output()
        .expect("run valgrind");
    assert!(out.status.success(), "valgrind symphony sim failed: {}", String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(&dir);
    // callgrind's summary: "==PID== Collected : N" on stderr.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let instructions = stderr
        .lines()
        .find_map(|l| l.split_once("Collected :").map(|(_, n)| n.trim().replace(',', "")))
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no instruction count in callgrind's output:\n{stderr}"));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("sim --json output");
    let requests = report["simulated_requests"].as_u64().expect("simulated_requests in the report");
    (instructions, requests)
}

#[test]
fn a_simulated_request_costs_no_more_instructions_than_the_pinned_budget() {
    if cfg!(debug_assertions) {
        // The budget is an optimised build's; an unoptimised one runs
        // several times the instructions by design.
        eprintln!("SKIPPED sim speed: the instruction budget is for the release profile (cargo test --release)");
        return;
    }
    if !require::capability("valgrind", valgrind_present(), "valgrind (callgrind) counts the simulator's instructions") {
        return;
    }
    let (short_ir, short_req) = counted_run(SHORT_S);
    let (long_ir, long_req) = counted_run(LONG_S);
    assert!(long_req > short_req + 10_000 && long_ir > short_ir, "runs too alike: {short_req}/{long_req} requests, {short_ir}/{long_ir} instructions");
    let per_request = (long_ir - short_ir) as f64 / (long_req - short_req) as f64;
    let budget = MEASURED_INSTRUCTIONS_PER_REQUEST * BUDGET_FACTOR;
    eprintln!(
        "sim speed: {per_request:.0} instructions per simulated request ({} requests, {} instructions between the {SHORT_S} s and {LONG_S} s runs); budget {budget:.0}",
        long_req - short_req,
        long_ir - short_ir
    );
    assert!(
        per_request <= budget,
        "the simulator got slower: {per_request:.0} instructions per simulated request against a budget of {budget:.0} \
         ({BUDGET_FACTOR} x the {MEASURED_INSTRUCTIONS_PER_REQUEST} measured when it was pinned)"
    );
}
