//! The `symphony` binary's contract: JSON keys, the worked example, and
//! clear errors (exit code 2) on bad input.

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
fn sim_json_has_the_documented_keys() {
    let v = json(&["sim", "--model", "r=1.053,5.072,25", "--model", "i=5.090,18.368,70", "--gpus", "4", "--rate", "1500", "--duration-s", "3", "--json"]);
    for k in ["offered_rps", "bad_rate", "median_batch", "gpu_idle_fraction", "models", "autoscale", "batch_size_histogram"] {
        assert!(v.get(k).is_some(), "missing {k}");
    }
    let models = v["models"].as_array().unwrap();
    assert_eq!(models.len(), 2);
    for k in ["name", "good", "bad", "bad_rate", "p99_ms", "median_batch"] {
        assert!(models[0].get(k).is_some(), "missing models[].{k}");
    }
}

#[test]
fn goodput_json_for_every_policy() {
    for policy in ["deferred", "clockwork", "shepherd", "timeout", "nexus", "eager"] {
        let v = json(&[
            "goodput", "--zoo", "a100", "--models", "ResNet50,BERT", "--gpus", "4", "--policy", policy, "--duration-s", "4", "--arrival", "gamma:0.5", "--json",
        ]);
        assert!(v["goodput_rps"].as_f64().unwrap() > 0.0, "{policy}: {v}");
        for k in ["bad_rate", "median_batch", "gpu_idle_fraction", "models"] {
            assert!(v.get(k).is_some(), "{policy}: missing {k}");
        }
    }
}

#[test]
fn timeout_takes_one_k_or_one_per_model() {
    let run = |ks: &str| {
        let v = json(&["sim", "--policy", "timeout", "--timeout-ms", ks, "--model", "r=1.053,5.072,25", "--model", "i=5.090,18.368,70", "--gpus", "4", "--rate", "1500", "--duration-s", "3", "--json"]);
        v["models"].as_array().unwrap().iter().map(|m| m["mean_batch"].as_f64().unwrap()).collect::<Vec<f64>>()
    };
    // A list of equal `k`s is the single `k`; a list that differs per
    // model is neither of its values alone.
    assert_eq!(run("10"), run("10,10"));
    let mixed = run("10,0");
    assert_ne!(mixed, run("10"));
    assert_ne!(mixed, run("0"));
}

#[test]
fn worked_example_trace() {
    let (code, out, _) = symphony(&["example"]);
    assert_eq!(code, 0);
    assert!(out.contains("    2.25     2.25    11.25    1     4  R1 R2 R3 R4"), "{out}");
    // Eager drops requests where deferred drops none.
    let v = json(&["example", "--skip", "13,14,15", "--policy", "eager", "--json"]);
    assert!(v["dropped"].as_u64().unwrap() > 0, "{v}");
    let v = json(&["example", "--skip", "13,14,15", "--json"]);
    assert_eq!(v["dropped"].as_u64().unwrap(), 0, "{v}");
}

#[test]
fn bad_input_is_a_clear_error() {
    for (args, needle) in [
        (vec!["sim", "--model", "x=1,2", "--rate", "10"], "missing slo_ms"),
        (vec!["sim", "--model", "x", "--rate", "10"], "expected NAME=ALPHA_MS,BETA_MS,SLO_MS"),
        (vec!["sim", "--zoo", "h100", "--rate", "10"], "unknown zoo"),
        (vec!["sim", "--zoo", "a100", "--policy", "magic", "--rate", "10"], "unknown policy"),
        (vec!["sim", "--zoo", "a100", "--gpus", "0", "--rate", "10"], "--gpus must be at least 1"),
        (vec!["sim", "--zoo", "a100", "--arrival", "gamma:-1", "--rate", "10"], "unknown arrival"),
        (vec!["sim", "--zoo", "a100", "--rate", "-5"], "--rate must be >= 0"),
        (vec!["sim", "--zoo", "a100", "--rate", "10", "--network-delay", "/nonexistent.toml"], "cannot read"),
        (vec!["sim", "--rate", "10"], "no models"),
        (vec!["report", "nope"], "unknown report"),
        (vec!["daemon", "nope"], "unknown role"),
        (vec!["daemon", "scheduler", "--transport", "udp"], "unknown transport"),
        // `up` checks every option before it starts a child.
        (vec!["up", "--transport", "bogus"], "unknown transport 'bogus' (shm, tcp, tcp-blocking, rdma)"),
        (vec!["up", "--local-idle", "nope"], "unknown idle strategy"),
        (vec!["e2e", "--transport", "bogus"], "unknown transport"),
    ] {
        let (code, _, err) = symphony(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn network_delay_file_round_trips_into_the_simulator() {
    let dir = std::env::temp_dir().join(format!("symphony-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("delay.toml");
    std::fs::write(&path, "d_ctrl_us = 3000\nd_data_us = 50\npercentile = 99.99\nfabric = \"test\"\n").unwrap();
    let base = ["sim", "--model", "r=1.053,5.072,25", "--gpus", "8", "--rate", "4000", "--duration-s", "5", "--json"];
    let without = json(&base);
    let mut with: Vec<&str> = base.to_vec();
    let p = path.to_string_lossy().into_owned();
    with.extend(["--network-delay", p.as_str()]);
    let with = json(&with);
    assert!(with["median_batch"].as_u64() < without["median_batch"].as_u64(), "{} vs {}", with["median_batch"], without["median_batch"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_daemon_entry_point_has_help() {
    for args in [vec!["daemon", "--help"], vec!["daemon", "scheduler", "--help"], vec!["daemon", "frontend", "--help"], vec!["daemon", "backend", "--help"]] {
        let (code, out, err) = symphony(&args);
        assert_eq!(code, 0, "{args:?}: {err}");
        assert!(out.contains("Usage"), "{args:?}: {out}");
    }
}

#[test]
fn predict_json_picks_the_lowest_latency_concurrency() {
    let v = json(&["predict", "--model", "ResNet50", "--zoo", "a100", "--rate", "300", "--workers", "2", "--json"]);
    let rows = v["rows"].as_array().unwrap();
    assert!(!rows.is_empty());
    let best = rows.iter().min_by(|a, b| a["mean_latency_ms"].as_f64().unwrap().total_cmp(&b["mean_latency_ms"].as_f64().unwrap())).unwrap();
    assert_eq!(v["best_concurrency"], best["concurrency"]);
    // Measured service times replace the profile model; an overload has no stable c.
    let v = json(&["predict", "--model", "ResNet50", "--rate", "10", "--service-ms", "5,20", "--json"]);
    assert_eq!(v["best_concurrency"], 1);
    let v = json(&["predict", "--model", "ResNet50", "--rate", "1000", "--service-ms", "5,20", "--json"]);
    assert!(v["best_concurrency"].is_null());
    let (code, _, err) = symphony(&["predict", "--model", "NoSuchNet", "--rate", "10"]);
    assert_eq!(code, 2);
    assert!(err.contains("NoSuchNet"), "{err}");
}
