//! The real binary against bad input: every case ends with a clear message
//! and a non-zero exit, quickly (never a hang); and the happy paths produce
//! parseable output.

mod common;
#[path = "../../tests/lib/require.rs"]
mod require;

use std::time::Duration;

use common::{run, Scratch, Server};

const LIMIT: Duration = Duration::from_secs(30);

fn assert_fails(args: &[&str], code: i32, needle: &str) {
    let o = run(args, LIMIT);
    assert_eq!(
        o.code, code,
        "{args:?}: exit {} stderr {}",
        o.code, o.stderr
    );
    assert!(
        o.stderr.contains(needle),
        "{args:?}: stderr lacks {needle:?}: {}",
        o.stderr
    );
}

/// A loopback port with nothing listening on it.
fn dead_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap().to_string();
    drop(l);
    a
}

#[test]
fn unknown_transport_is_a_usage_error() {
    assert_fails(
        &[
            "incast",
            "--transport",
            "carrier-pigeon",
            "--peers",
            "127.0.0.1:1",
        ],
        2,
        "invalid value 'carrier-pigeon'",
    );
}

#[test]
fn unreachable_peer_fails_fast() {
    let addr = dead_port();
    let o = run(
        &[
            "incast",
            "-t",
            "tcp-blocking",
            "--peers",
            &addr,
            "--iters",
            "3",
        ],
        LIMIT,
    );
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(
        o.stderr.contains(&format!("cannot connect to peer {addr}")),
        "{}",
        o.stderr
    );
    let o = run(
        &[
            "incast",
            "-t",
            "shm",
            "--peers",
            "@netbench-test-nobody-home",
            "--iters",
            "3",
        ],
        LIMIT,
    );
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(
        o.stderr
            .contains("cannot connect to peer @netbench-test-nobody-home"),
        "{}",
        o.stderr
    );
}

#[test]
fn silent_peer_times_out_within_the_connect_bound() {
    // Accepts (kernel backlog) but never speaks netbench.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let o = run(
        &[
            "incast",
            "-t",
            "tcp",
            "--peers",
            &addr,
            "--connect-timeout-ms",
            "300",
            "--iters",
            "3",
        ],
        LIMIT,
    );
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(
        o.stderr.contains("sent no catalog within 0.3 s"),
        "{}",
        o.stderr
    );
    assert!(o.elapsed < Duration::from_secs(10), "took {:?}", o.elapsed);
    drop(l);
}

#[test]
fn bad_sizes_and_counts_are_usage_errors() {
    let addr = dead_port();
    let base = ["incast", "-t", "tcp", "--peers", addr.as_str()];
    let with = |extra: &[&'static str]| -> Vec<String> {
        base.iter().chain(extra).map(|s| s.to_string()).collect()
    };
    let assert_fails = |args: &[String], code: i32, needle: &str| {
        let v: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_fails(&v, code, needle);
    };
    assert_fails(&with(&["--size", "0"]), 2, "--size must be at least 1 byte");
    assert_fails(&with(&["--size", "17MiB"]), 2, "longest READ");
    assert_fails(&with(&["--size", "12 parsecs"]), 2, "unknown size unit");
    assert_fails(
        &with(&["--objects", "0"]),
        2,
        "--objects must be at least 1",
    );
    assert_fails(&with(&["--objects", "513"]), 2, "at most 512 objects");
    assert_fails(
        &with(&["--objects", "100", "--size", "16MiB"]),
        2,
        "larger than the region limit",
    );
    assert_fails(&with(&["--iters", "0"]), 2, "--iters must be at least 1");
    assert_fails(&with(&["--ping-size", "40"]), 2, "--ping-size 40");
    let own = |v: &[&str]| -> Vec<String> { v.iter().map(|s| s.to_string()).collect() };
    assert_fails(
        &own(&["serve", "-t", "shm", "--size", "0"]),
        2,
        "--size must be at least 1 byte",
    );
    assert_fails(
        &own(&["local", "-t", "shm", "--servers", "0", "--iters", "1"]),
        2,
        "--servers must be at least 1",
    );
    assert_fails(
        &own(&["local", "-t", "shm", "--netns", "--iters", "1"]),
        2,
        "--netns works with tcp",
    );
    assert_fails(
        &own(&[
            "calibrate",
            "-t",
            "shm",
            "--percentile",
            "100",
            "--out",
            "/nonexistent/x.toml",
        ]),
        2,
        "--percentile 100",
    );
}

/// Without verbs in the build (the dataplane's `rdma` feature, which this
/// crate's feature or a workspace build with `dataplane/rdma` turns on) rdma
/// is a usage error naming the feature; with them and no device here, a
/// runtime error naming the transport. Either way no panic and no hang.
#[test]
fn rdma_says_how_to_get_it_or_what_is_missing() {
    let o = run(&["incast", "-t", "rdma", "--peers", "127.0.0.1:1"], LIMIT);
    if o.stderr.contains("built without") {
        assert_eq!(o.code, 2, "stderr {}", o.stderr);
        assert!(o.stderr.contains("--features rdma"), "stderr {}", o.stderr);
    } else {
        assert_eq!(o.code, 1, "stderr {}", o.stderr);
        assert!(o.stderr.contains("rdma"), "stderr {}", o.stderr);
    }
}

#[test]
fn mismatched_object_count_or_size_is_refused() {
    let s = Server::start(&[
        "-t",
        "tcp-blocking",
        "--listen",
        "127.0.0.1:0",
        "--objects",
        "4",
        "--size",
        "1KiB",
    ]);
    let o = run(
        &[
            "incast",
            "-t",
            "tcp-blocking",
            "--peers",
            &s.addr,
            "--objects",
            "8",
            "--size",
            "1KiB",
            "--iters",
            "3",
        ],
        LIMIT,
    );
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(
        o.stderr.contains("serves 4 object(s) of 1024 bytes"),
        "{}",
        o.stderr
    );
    assert!(o.stderr.contains("--objects 8"), "{}", o.stderr);
    let o = run(
        &[
            "incast",
            "-t",
            "tcp-blocking",
            "--peers",
            &s.addr,
            "--objects",
            "4",
            "--size",
            "2KiB",
            "--iters",
            "3",
        ],
        LIMIT,
    );
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(o.stderr.contains("--size 2048"), "{}", o.stderr);
}

#[test]
fn incast_against_a_server_reads_verified_bytes() {
    let mut a = Server::start(&[
        "-t",
        "tcp",
        "--listen",
        "127.0.0.1:0",
        "--objects",
        "3",
        "--size",
        "5000",
        "--exit-after-clients",
        "1",
    ]);
    let b = Server::start(&[
        "-t",
        "tcp",
        "--listen",
        "127.0.0.1:0",
        "--objects",
        "3",
        "--size",
        "5000",
    ]);
    let peers = format!("{},{}", a.addr, b.addr);
    let o = run(
        &[
            "incast",
            "-t",
            "tcp",
            "--peers",
            &peers,
            "--objects",
            "3",
            "--size",
            "5000",
            "--iters",
            "30",
            "--csv",
        ],
        LIMIT,
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{}", o.stdout);
    assert!(lines[0].starts_with("transport,metric,bytes,iterations,t_min_us"));
    assert!(lines[1].starts_with("tcp,round,30000,30,"), "{}", lines[1]);
    assert!(lines[2].starts_with("tcp,read,5000,180,"), "{}", lines[2]);
    assert!(lines[3].starts_with("tcp,ctrl_rtt,32,30,"), "{}", lines[3]);
    // Without pings the control metric is empty, not an error.
    let o = run(
        &[
            "incast",
            "-t",
            "tcp",
            "--peers",
            &b.addr,
            "--objects",
            "3",
            "--size",
            "5000",
            "--iters",
            "5",
            "--ping-every",
            "0",
            "--csv",
        ],
        LIMIT,
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("tcp,ctrl_rtt,32,0,0.000"), "{}", o.stdout);
    // --exit-after-clients 1: the server leaves once its one client has.
    assert_eq!(a.wait_exit(Duration::from_secs(10)), Some(0));
}

/// `--reader-idle block`: the reader sleeps on its one connection for READ
/// completions and ping echoes (tcp and shm wait in the kernel), and every
/// round, READ and ping still completes with verified bytes.
#[test]
fn a_blocking_reader_completes_every_round() {
    for t in ["tcp-blocking", "tcp", "shm"] {
        let o = run(
            &[
                "local",
                "-t",
                t,
                "--servers",
                "1",
                "--objects",
                "2",
                "--size",
                "70KiB",
                "--iters",
                "50",
                "--reader-idle",
                "block",
                "--csv",
            ],
            LIMIT,
        );
        assert_eq!(o.code, 0, "{t}: {}", o.stderr);
        let lines: Vec<&str> = o.stdout.lines().collect();
        assert_eq!(lines.len(), 4, "{t}: {}", o.stdout);
        assert!(lines[2].contains(",read,71680,100,"), "{t}: {}", lines[2]);
        assert!(lines[3].contains(",ctrl_rtt,32,50,"), "{t}: {}", lines[3]);
    }
}

#[test]
fn local_json_then_plot() {
    let dir = Scratch::new("plot");
    let mut saved = Vec::new();
    for t in ["shm", "tcp-blocking"] {
        let file = dir.path(&format!("{t}.json"));
        let o = run(
            &[
                "local",
                "-t",
                t,
                "--servers",
                "2",
                "--objects",
                "2",
                "--size",
                "3KiB",
                "--iters",
                "40",
                "--ping-size",
                "128",
                "--json",
                "--save",
                &file,
            ],
            LIMIT,
        );
        assert_eq!(o.code, 0, "{}", o.stderr);
        let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("stdout is JSON");
        assert_eq!(v["transport"], t);
        assert_eq!(
            v["verified_reads"], 44,
            "one verified READ per round incl. warm-up"
        );
        let names: Vec<&str> = v["metrics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["round", "read", "ctrl_rtt"]);
        let ctrl = &v["metrics"][2];
        assert_eq!(ctrl["bytes"], 128);
        assert_eq!(ctrl["iterations"], 40);
        assert!(
            ctrl["histogram"].as_str().unwrap().starts_with("HISTF"),
            "V2 compressed cookie, base64"
        );
        let m = &v["metrics"][0];
        assert!(m["t_min"].as_f64().unwrap() <= m["t_typical"].as_f64().unwrap());
        assert!(m["t_typical"].as_f64().unwrap() <= m["p99_99"].as_f64().unwrap());
        saved.push(file);
    }
    let svg = dir.path("fig.svg");
    let o = run(&["plot", &saved[0], &saved[1], "--out", &svg], LIMIT);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg") && text.trim_end().ends_with("</svg>"));
    assert_eq!(text.matches("<polyline").count(), 6, "3 panels x 2 runs");
    assert!(text.contains("99.9%"));
    let o = run(
        &["plot", &saved[0], "--out", &svg, "--metric", "nope"],
        LIMIT,
    );
    assert_eq!(o.code, 2, "{}", o.stderr);
    let o = run(&["plot", &svg, "--out", &svg], LIMIT);
    assert_eq!(o.code, 1);
    assert!(
        o.stderr.contains("is not a netbench JSON report"),
        "{}",
        o.stderr
    );
}

/// Namespaces + veth + netem: needs root and `ip netns` (iproute2); skips
/// without them outside CI only.
#[test]
fn local_in_network_namespaces_with_netem() {
    let probe = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output();
    let root = std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false);
    // CI runs as root with iproute2 (installable): no capability skip.
    let netns = root && probe.map(|o| o.status.success()).unwrap_or(false);
    if !require::capability(
        "netns",
        netns,
        "network namespaces need root and `ip netns` (iproute2)",
    ) {
        return;
    }
    let netem = run(
        &[
            "local",
            "-t",
            "tcp-blocking",
            "--servers",
            "2",
            "--objects",
            "2",
            "--size",
            "2KiB",
            "--iters",
            "20",
            "--netns",
            "--netem",
            "delay 200us",
            "--json",
        ],
        LIMIT,
    );
    if netem.code == 0 {
        let v: serde_json::Value = serde_json::from_str(&netem.stdout).expect("JSON");
        assert!(v["fabric"]
            .as_str()
            .unwrap()
            .contains("qdisc 'netem delay 200us'"));
        // 200 us on the server's egress: every ping pays it.
        assert!(
            v["metrics"][2]["t_min"].as_f64().unwrap() >= 200.0,
            "{}",
            v["metrics"][2]
        );
    } else {
        // Kernels without sch_netem say so plainly (and exit as a usage error).
        assert_eq!(netem.code, 2, "{}", netem.stderr);
        assert!(
            netem.stderr.contains("CONFIG_NET_SCH_NETEM"),
            "{}",
            netem.stderr
        );
    }
    let o = run(
        &[
            "local",
            "-t",
            "tcp",
            "--servers",
            "2",
            "--objects",
            "2",
            "--size",
            "2KiB",
            "--iters",
            "20",
            "--netns",
            "--client-qdisc",
            "tbf rate 1gbit burst 64kb latency 2ms",
            "--json",
        ],
        LIMIT,
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("JSON");
    assert!(v["fabric"]
        .as_str()
        .unwrap()
        .contains("reader port qdisc 'tbf rate 1gbit"));
    assert!(v["peers"][0].as_str().unwrap().starts_with("10.201.0.1:"));
    // Everything it made is gone (stale ones of killed runs are removed at start).
    let list = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    let left: Vec<String> = String::from_utf8_lossy(&list.stdout)
        .lines()
        .filter(|l| l.starts_with("nb") && l.chars().nth(2).is_some_and(|c| c.is_ascii_digit()))
        .map(str::to_string)
        .collect();
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
}

#[test]
fn a_server_takes_clients_while_serving_others() {
    // shm's accept includes a handshake: the server accepts on a thread of its own.
    let s = Server::start(&["-t", "shm", "--objects", "2", "--size", "4KiB"]);
    let runs: Vec<_> = (0..3)
        .map(|_| {
            let addr = s.addr.clone();
            std::thread::spawn(move || {
                run(
                    &[
                        "incast",
                        "-t",
                        "shm",
                        "--peers",
                        &addr,
                        "--objects",
                        "2",
                        "--size",
                        "4KiB",
                        "--iters",
                        "200",
                        "--csv",
                    ],
                    LIMIT,
                )
            })
        })
        .collect();
    for r in runs {
        let o = r.join().unwrap();
        assert_eq!(o.code, 0, "{}", o.stderr);
    }
}
