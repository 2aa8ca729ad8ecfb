//! `symphony up --autoscale` end to end (issue 52): the real daemons as
//! processes on loopback, a load that rises and falls, and the autoscale
//! controller acting through backend processes: it adds backends when
//! the load rises, drains them (SIGTERM, their graceful leave) when it
//! falls, and no request is lost or left unsettled.

use std::process::Command;

#[test]
fn up_autoscale_adds_backends_under_load_and_drains_them_after_losing_nothing() {
    let out = Command::new(env!("CARGO_BIN_EXE_symphony"))
        .args([
            "up", "--autoscale", "--json", "--transport", "tcp", "--frontends", "1", "--backends", "1",
            "--autoscale-min-backends", "1", "--autoscale-max-backends", "3",
            "--autoscale-interval-ms", "500", "--autoscale-cooldown-s", "1", "--autoscale-stabilisation-s", "1",
            // ~16 s: a low start, a peak a single backend cannot serve, a low end.
            "--schedule", "0:0.1,4:1.0,9:0.1", "--duration-s", "16",
        ])
        .env_remove("SYMPHONY_JOIN_TOKEN")
        .output()
        .expect("symphony runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}\nstdout: {stdout}\nstderr: {stderr}", out.status);
    let r: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let n = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k} missing: {r}"));
    eprintln!(
        "backends {}..{}, added {}, drained {}, GPU-seconds {:.0}% of the peak-sized cluster's, bad rate {:.2}%",
        n("backends_min"),
        n("backends_max"),
        n("backends_added"),
        n("backends_drained"),
        n("gpu_seconds_share") * 100.0,
        n("bad_rate") * 100.0
    );
    assert!(n("backends_added") >= 1.0, "the peak added backends: {r}");
    assert!(n("backends_drained") >= 1.0, "the low end drained some: {r}");
    assert!(n("backends_max") > n("backends_min"), "{r}");
    assert_eq!(n("lost"), 0.0, "{r}");
    assert_eq!(n("unaccounted"), 0.0, "{r}");
    assert_eq!(n("unclean_exits"), 0.0, "{r}");
    // Fewer GPU-seconds than a cluster sized for the peak.
    assert!(n("gpu_seconds_share") < 1.0, "{r}");
}
