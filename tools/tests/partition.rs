//! `symphony partition`: the JSON contract, memory within bounds, a
//! re-partition that keeps C_max, and clear errors for infeasible input.

use std::process::Command;

fn symphony(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_symphony")).args(args).output().expect("runs");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn json(args: &[&str]) -> serde_json::Value {
    let (code, out, err) = symphony(args);
    assert_eq!(code, 0, "{args:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {out}"))
}

#[test]
fn partition_json_has_the_documented_keys_and_fits_memory() {
    let v = json(&["partition", "--model-count", "60", "--sub-clusters", "4", "--zoo", "1080ti", "--json"]);
    for k in ["objective", "imbalance", "memory_imbalance", "rate_spread", "memory_spread", "moved", "elapsed_s", "sub_cluster", "assignment"] {
        assert!(v.get(k).is_some(), "missing {k}: {v}");
    }
    assert_eq!(v["within_memory"], true);
    assert_eq!(v["feasible"], true);
    let subs = v["sub_cluster"].as_array().unwrap();
    assert_eq!(subs.len(), 4);
    for s in subs {
        assert!(s["memory_used_bytes"].as_u64().unwrap() <= s["memory_capacity_bytes"].as_u64().unwrap(), "{s}");
    }
    assert_eq!(v["assignment"].as_array().unwrap().len(), 60);
    assert!(v["imbalance"].as_f64().unwrap() < 0.05, "{}", v["imbalance"]);
}

#[test]
fn repartition_from_a_previous_assignment_keeps_c_max() {
    let dir = std::env::temp_dir().join(format!("symphony-partition-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let first = dir.join("first.json");
    let (code, out, err) = symphony(&["partition", "--model-count", "40", "--sub-clusters", "3", "--seed", "2", "--json"]);
    assert_eq!(code, 0, "{err}");
    std::fs::write(&first, out).unwrap();
    let from = first.to_str().unwrap();
    // Same models, new rates: at most 200 MiB of models may move.
    let v = json(&["partition", "--model-count", "40", "--sub-clusters", "3", "--seed", "2", "--rate-seed", "9", "--from", from, "--c-max", "200", "--json"]);
    assert!(v["moved"]["bytes"].as_u64().unwrap() <= 200 << 20, "{}", v["moved"]);
    assert_eq!(v["feasible"], true);
    // C_max 0: nothing moves.
    let v = json(&["partition", "--model-count", "40", "--sub-clusters", "3", "--seed", "2", "--rate-seed", "9", "--from", from, "--c-max", "0", "--json"]);
    assert_eq!(v["moved"]["count"], 0);
    // The exact solver on a small instance agrees or does better.
    let v = json(&["partition", "--model-count", "8", "--sub-clusters", "2", "--exact-s", "60", "--json"]);
    assert_eq!(v["exact"]["proven_optimal"], true, "{v}");
    assert!(v["exact"]["objective"].as_f64().unwrap() <= v["heuristic"]["objective"].as_f64().unwrap() + 1e-9);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn infeasible_input_is_a_clear_error() {
    for (args, needle) in [
        (vec!["partition", "--model-count", "400", "--sub-clusters", "1", "--zoo", "1080ti"], "no feasible assignment"),
        (vec!["partition", "--model-count", "10", "--sub-clusters", "2", "--gpu-memory-gib", "0.2"], "needs"),
        (vec!["partition", "--model-count", "10", "--sub-clusters", "0"], "at least one sub-cluster"),
        (vec!["partition", "--model-count", "10", "--zoo", "/nonexistent.json"], "--zoo"),
        (vec!["partition", "--model-count", "10", "--c-max=-1"], "--c-max"),
    ] {
        let (code, _, err) = symphony(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
