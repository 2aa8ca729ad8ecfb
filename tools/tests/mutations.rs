//! Mutation testing of the chaos harness: each deliberate bug (compiled
//! in only with the `mutations` feature) must be caught within 100 seeds,
//! and the replay command the harness prints must reproduce the failure.
//! Run with `cargo test -p tools --release --features mutations --test mutations`.
#![cfg(feature = "mutations")]

use std::process::Command;

use dataplane::time::Duration;
use tools::chaos::{run, ChaosConfig, FaultSet, Mutation};

fn caught_within_100_seeds(m: Mutation, needle: &str) {
    for seed in 1..=100 {
        let mut cfg = ChaosConfig::new(seed, FaultSet::ALL, Duration::from_millis(800));
        cfg.mutation = Some(m);
        let r = run(cfg.clone()).expect("harness runs");
        if r.ok() {
            continue;
        }
        assert!(r.violations.iter().any(|v| v.contains(needle)), "{}: seed {seed}: {:?}", m.as_str(), r.violations);
        // The printed replay command reproduces it, through the binary.
        let args: Vec<&str> = r.replay.split_whitespace().skip(1).collect();
        assert!(r.replay.contains(m.as_str()), "{}", r.replay);
        let out = Command::new(env!("CARGO_BIN_EXE_symphony")).args(&args).arg("--json").output().expect("runs");
        assert!(!out.status.success(), "{}: replay passed: {}", m.as_str(), r.replay);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(v["trace_hash"].as_str(), Some(r.trace_hash.as_str()), "replay took another path");
        eprintln!("{}: caught at seed {seed}: {:?}", m.as_str(), r.violations);
        return;
    }
    panic!("{}: not caught within 100 seeds", m.as_str());
}

#[test]
fn backend_omitting_a_completion_is_caught() {
    caught_within_100_seeds(Mutation::BackendOmitsCompletion, "never answered");
}

#[test]
fn scheduler_planning_onto_a_busy_gpu_is_caught() {
    caught_within_100_seeds(Mutation::SchedulerPlansOntoBusyGpu, "planned onto a GPU still busy");
}

#[test]
fn frontend_answering_twice_is_caught() {
    caught_within_100_seeds(Mutation::FrontendAnswersTwice, "differ from what the client saw");
}
