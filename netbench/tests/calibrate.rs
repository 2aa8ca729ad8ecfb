//! `netbench calibrate` writes a delay file that the scheduler's own parser
//! (`scheduler::netdelay::NetworkDelay::from_toml`) accepts.

mod common;

use std::time::Duration;

use common::{run, Scratch, Server};
use scheduler::netdelay::{DelayFile, NetworkDelay};

fn check_file(path: &str, percentile: f64) -> DelayFile {
    let text = std::fs::read_to_string(path).expect("delay file written");
    let delay = NetworkDelay::from_toml(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let file: DelayFile = toml::from_str(&text).expect("DelayFile");
    assert_eq!(file.percentile, Some(percentile));
    assert!(file.fabric.as_deref().is_some_and(|f| !f.is_empty()));
    assert!(file.d_ctrl_us > 0.0, "a round trip takes time: {text}");
    assert!(file.d_data_us >= 0.0);
    assert_eq!(delay, file.to_delay().unwrap());
    assert!(
        text.contains("half the 32-byte control message round trip"),
        "{text}"
    );
    file
}

#[test]
fn calibrate_shm_locally() {
    let dir = Scratch::new("cal-shm");
    let out = dir.path("delay.toml");
    let o = run(
        &[
            "calibrate",
            "-t",
            "shm",
            "--servers",
            "2",
            "--objects",
            "2",
            "--size",
            "8KiB",
            "--iters",
            "60",
            "--batches",
            "1,2,4",
            "--percentile",
            "99",
            "--out",
            &out,
            "--extra-percentiles",
            "50",
        ],
        Duration::from_secs(60),
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("d_ctrl_us ="), "{}", o.stdout);
    let p99 = check_file(&out, 99.0);
    let p50 = check_file(&dir.path("delay.p50.toml"), 50.0);
    assert!(
        p50.d_ctrl_us <= p99.d_ctrl_us,
        "same measurement, lower percentile"
    );
}

#[test]
fn calibrate_tcp_against_given_peers() {
    let a = Server::start(&[
        "-t",
        "tcp",
        "--listen",
        "127.0.0.1:0",
        "--objects",
        "2",
        "--size",
        "4KiB",
    ]);
    let dir = Scratch::new("cal-tcp");
    let out = dir.path("delay.toml");
    let o = run(
        &[
            "calibrate",
            "-t",
            "tcp",
            "--peers",
            &a.addr,
            "--objects",
            "2",
            "--size",
            "4KiB",
            "--iters",
            "40",
            "--out",
            &out,
            "--fabric",
            "tcp on loopback",
        ],
        Duration::from_secs(60),
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let f = check_file(&out, 99.99);
    assert_eq!(f.fabric.as_deref(), Some("tcp on loopback"));
}
