//! `symphony report fig15 --quick --json`: the day's run under the
//! autoscaler (issue 52 item 3), measured against the acceptance.

use serde_json::Value;
use std::process::Command;

fn fig15(extra: &[&str]) -> Value {
    let mut args = vec!["report", "fig15", "--quick", "--json"];
    args.extend_from_slice(extra);
    let out = Command::new(env!("CARGO_BIN_EXE_symphony")).args(&args).output().expect("runs");
    assert!(out.status.success(), "report fig15: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}

fn f(v: &Value, path: &[&str]) -> f64 {
    path.iter().fold(v, |v, k| &v[*k]).as_f64().unwrap_or_else(|| panic!("no number at {path:?}"))
}

#[test]
fn deferred_scales_with_the_day_and_loses_nothing() {
    let v = fig15(&["--policy", "deferred,eager"]);
    let runs = v["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2);
    let d = &runs[0];
    assert_eq!(d["run"]["policy"], "deferred");
    assert_eq!(d["run"]["acting"], true);
    // GPUs went both ways over the day.
    assert!(f(d, &["run", "added"]) > 0.0 && f(d, &["run", "drained"]) > 0.0);
    // Every request was served once or dropped (the simulator fails the
    // run otherwise); the books balance.
    let s = &d["run"]["summary"];
    assert_eq!(f(s, &["offered"]), f(s, &["good"]) + f(s, &["dropped"]) + f(s, &["late"]));
    // Far under a static cluster sized for the peak, with few bad requests.
    assert!(f(d, &["acceptance", "gpu_seconds_ratio"]) <= 0.6, "{}", d["acceptance"]);
    assert!(f(d, &["acceptance", "settled_bad_rate"]) <= 0.01, "{}", d["acceptance"]);
    // The GPUs in use follow the day: the busiest hour's many times the
    // quietest's.
    let epochs = d["run"]["epochs"].as_array().expect("epochs");
    let in_use: Vec<f64> = epochs.iter().map(|e| e["gpus_in_use"].as_f64().unwrap_or(0.0)).collect();
    let (lo, hi) = in_use.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
    assert!(hi > 2.5 * lo, "GPUs in use from {lo} to {hi}");
    // The same day under eager: the same requests.
    let e = &runs[1];
    assert_eq!(e["run"]["policy"], "eager");
    assert_eq!(f(&e["run"]["summary"], &["offered"]), f(s, &["offered"]));
}
