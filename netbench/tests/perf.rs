//! `netbench lat` and `netbench bw` on the transports a machine without
//! RDMA has (tcp over io_uring, tcp-blocking, shm): whole sweeps give one
//! entry per size with perftest's fields, every verb moves the bytes it
//! claims (the tool checks them and fails otherwise), `--under-load`
//! reports both sets of percentiles, and the flags an RDMA user needs are
//! documented. Iterations are kept small: these check behaviour, not speed.

mod common;

use std::time::Duration;

use common::{run, Scratch};
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(120);

fn json_of(args: &[&str]) -> Value {
    let o = run(args, LIMIT);
    assert_eq!(o.code, 0, "{args:?}: exit {} stderr {}", o.code, o.stderr);
    serde_json::from_str(&o.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {}", o.stdout))
}

fn sweep_sizes() -> Vec<u64> {
    (1..=23).map(|k| 1u64 << k).collect()
}

fn assert_lat_entry(m: &Value, bytes: u64, iterations: u64) {
    assert_eq!(m["bytes"], bytes, "{m}");
    assert_eq!(m["iterations"], iterations, "{m}");
    let f = |k: &str| {
        m[k].as_f64()
            .unwrap_or_else(|| panic!("{k} missing in {m}"))
    };
    let (min, typ, avg, max) = (f("t_min"), f("t_typical"), f("t_avg"), f("t_max"));
    assert!(
        min > 0.0 && min <= typ && typ <= max && min <= avg && avg <= max,
        "{m}"
    );
    let (p99, p999, p9999) = (f("p99"), f("p99_9"), f("p99_99"));
    // Percentiles come from the histogram (0.1% resolution), min/max are exact.
    assert!(
        typ <= p99 && p99 <= p999 && p999 <= p9999 && p9999 <= max * 1.001 + 0.001,
        "{m}"
    );
    assert!(f("t_stdev") >= 0.0);
    assert!(
        m["histogram"].as_str().is_some_and(|h| !h.is_empty()),
        "{m}"
    );
    assert_eq!(m["histogram_unit"], "ns");
}

fn assert_bw_entry(b: &Value, bytes: u64, iterations: u64) {
    assert_eq!(b["bytes"], bytes, "{b}");
    assert_eq!(b["iterations"], iterations, "{b}");
    let f = |k: &str| {
        b[k].as_f64()
            .unwrap_or_else(|| panic!("{k} missing in {b}"))
    };
    let (peak, avg, rate, secs) = (
        f("bw_peak_mb_s"),
        f("bw_avg_mb_s"),
        f("msg_rate_mpps"),
        f("elapsed_s"),
    );
    assert!(avg > 0.0 && peak >= avg * 0.999, "{b}");
    // The columns agree with each other: MB/s = Mpps x bytes / 2^20.
    let from_rate = rate * 1e6 * bytes as f64 / f64::from(1u32 << 20);
    assert!((from_rate - avg).abs() <= avg * 1e-6, "{b}");
    assert!(
        (iterations as f64 * bytes as f64 / secs / f64::from(1u32 << 20) - avg).abs() <= avg * 1e-6,
        "{b}"
    );
}

#[test]
fn bw_over_tcp_sweeps_2_bytes_to_8_mib() {
    let r = json_of(&[
        "bw",
        "-t",
        "tcp",
        "-a",
        "--json",
        "-n",
        "12",
        "--tx-depth",
        "4",
    ]);
    assert_eq!(
        (r["test"].as_str(), r["verb"].as_str()),
        (Some("bw"), Some("read"))
    );
    let rows = r["bw"].as_array().expect("bw entries");
    let sizes = sweep_sizes();
    assert_eq!(rows.len(), sizes.len());
    for (row, &size) in rows.iter().zip(&sizes) {
        assert_bw_entry(row, size, 12);
    }
    assert!(r["lat"].as_array().is_some_and(|l| l.is_empty()));
}

#[test]
fn lat_over_shm_sweeps_2_bytes_to_8_mib() {
    let r = json_of(&["lat", "-t", "shm", "-a", "--json", "-n", "12"]);
    assert_eq!(r["test"], "lat");
    let rows = r["lat"].as_array().expect("lat entries");
    let sizes = sweep_sizes();
    assert_eq!(rows.len(), sizes.len());
    for (row, &size) in rows.iter().zip(&sizes) {
        assert_lat_entry(row, size, 12);
    }
}

#[test]
fn every_verb_on_every_transport_without_rdma() {
    for t in ["tcp", "tcp-blocking", "shm"] {
        for verb in ["read", "write", "send"] {
            // 40 KiB: more than one 32 KiB wire message for write and send.
            let r = json_of(&[
                "lat", "-t", t, "--verb", verb, "-s", "40KiB", "-n", "30", "--json",
            ]);
            assert_eq!(r["verb"], verb);
            assert!(r["semantics"].as_str().is_some_and(|s| !s.is_empty()));
            assert_lat_entry(&r["lat"][0], 40 << 10, 30);
            let r = json_of(&[
                "bw",
                "-t",
                t,
                "--verb",
                verb,
                "-s",
                "40KiB",
                "-n",
                "30",
                "--tx-depth",
                "8",
                "--json",
            ]);
            assert_bw_entry(&r["bw"][0], 40 << 10, 30);
            assert_eq!(r["tx_depth"], 8);
            assert_eq!(r["post_list"], 1, "perftest's default post list");
            if verb == "read" {
                // 5 per post call against a depth of 8: calls of 5 and 3,
                // every operation still counted once.
                let r = json_of(&[
                    "bw", "-t", t, "-s", "40KiB", "-n", "30", "--tx-depth", "8", "-l", "5",
                    "--json",
                ]);
                assert_bw_entry(&r["bw"][0], 40 << 10, 30);
                assert_eq!(r["post_list"], 5);
            }
        }
    }
}

#[test]
fn write_and_send_over_tcp_and_shm_say_they_are_emulated() {
    for t in ["tcp", "shm"] {
        for verb in ["write", "send"] {
            let r = json_of(&["lat", "-t", t, "--verb", verb, "-n", "5", "--json"]);
            assert!(
                r["semantics"].as_str().unwrap().starts_with("emulated"),
                "{t} {verb}: {}",
                r["semantics"]
            );
        }
    }
}

#[test]
fn under_load_reports_both_sets_of_percentiles_on_every_transport() {
    for t in ["tcp", "tcp-blocking", "shm"] {
        let r = json_of(&[
            "lat",
            "-t",
            t,
            "--verb",
            "send",
            "-s",
            "4KiB",
            "-n",
            "40",
            "--under-load",
            "--load-size",
            "64KiB",
            "--load-depth",
            "4",
            "--json",
        ]);
        assert_lat_entry(&r["lat"][0], 4096, 40);
        let u = &r["under_load"];
        assert_eq!(
            (u["verb"].as_str(), u["size"].as_u64()),
            (Some("send"), Some(65536)),
            "{u}"
        );
        assert_lat_entry(&u["lat"][0], 4096, 40);
        assert_eq!(u["lat"][0]["name"], "lat_under_load");
        // The stream really ran beside the measurement.
        let load = &u["load_bw"][0];
        assert!(load["iterations"].as_u64().unwrap() > 0, "{t}: {load}");
        assert!(load["bw_avg_mb_s"].as_f64().unwrap() > 0.0, "{t}: {load}");
    }
    // The table shows both.
    let o = run(
        &[
            "lat",
            "-t",
            "shm",
            "-n",
            "20",
            "--under-load",
            "--load-verb",
            "read",
        ],
        LIMIT,
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout.contains("without load:") && o.stdout.contains("under load (read 65536 B"),
        "{}",
        o.stdout
    );
    assert_eq!(
        o.stdout.matches("99.99% percentile[usec]").count(),
        2,
        "{}",
        o.stdout
    );
}

#[test]
fn incast_and_queue_pairs_count_every_operation() {
    // 2 servers x 2 queue pairs: every lat round is 4 operations.
    let r = json_of(&[
        "lat",
        "-t",
        "tcp-blocking",
        "--servers",
        "2",
        "-q",
        "2",
        "--verb",
        "write",
        "-s",
        "2",
        "-n",
        "25",
        "--json",
    ]);
    assert_eq!(r["peers"].as_array().unwrap().len(), 2);
    assert_eq!(r["queue_pairs"], 2);
    assert_lat_entry(&r["lat"][0], 2, 100);
    let r = json_of(&[
        "bw",
        "-t",
        "tcp",
        "--servers",
        "2",
        "-q",
        "3",
        "-s",
        "8KiB",
        "-n",
        "20",
        "--json",
    ]);
    assert_bw_entry(&r["bw"][0], 8192, 120);
    // An unanswered SEND stream over 2 servers x 3 queue pairs: each link's
    // server must tally exactly the link's operations (a server counting
    // per server instead of per connection, or losing one, fails the run),
    // 40 KiB operations being two messages each.
    for t in ["tcp", "shm"] {
        let r = json_of(&[
            "bw", "-t", t, "--servers", "2", "-q", "3", "--verb", "send", "-s", "40KiB", "-n",
            "20", "--tx-depth", "4", "--json",
        ]);
        assert_bw_entry(&r["bw"][0], 40 << 10, 120);
    }
}

#[test]
fn bidirectional_counts_both_directions_and_duration_mode_runs_for_its_time() {
    let r = json_of(&[
        "bw", "-t", "tcp", "--verb", "send", "-b", "-s", "4KiB", "-n", "50", "--json",
    ]);
    assert_eq!(r["bidirectional"], true);
    assert_bw_entry(&r["bw"][0], 4096, 100);
    let r = json_of(&["bw", "-t", "shm", "-s", "64KiB", "-D", "0.3", "--json"]);
    assert!((r["duration_s"].as_f64().unwrap() - 0.3).abs() < 1e-9);
    let b = &r["bw"][0];
    let secs = b["elapsed_s"].as_f64().unwrap();
    assert!((0.3..5.0).contains(&secs), "{b}");
    assert!(b["iterations"].as_u64().unwrap() > 0);
    let r = json_of(&["lat", "-t", "shm", "-D", "0.2", "--json"]);
    assert!(r["lat"][0]["iterations"].as_u64().unwrap() > 0);
}

#[test]
fn csv_table_and_sweep_plot() {
    let o = run(
        &["bw", "-t", "shm", "-s", "1KiB", "-n", "10", "--csv"],
        LIMIT,
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(
        lines[0],
        "transport,verb,bytes,iterations,bw_peak_mb_s,bw_avg_mb_s,msg_rate_mpps"
    );
    assert!(lines[1].starts_with("shm,read,1024,10,"), "{}", o.stdout);
    let o = run(&["bw", "-t", "shm", "-s", "1KiB", "-n", "10"], LIMIT);
    for c in [
        "#bytes",
        "#iterations",
        "BW peak[MB/sec]",
        "BW average[MB/sec]",
        "MsgRate[Mpps]",
    ] {
        assert!(o.stdout.contains(c), "{c}: {}", o.stdout);
    }
    let o = run(&["lat", "-t", "shm", "-n", "10"], LIMIT);
    for c in [
        "t_min[usec]",
        "t_typical[usec]",
        "t_stdev[usec]",
        "99% percentile[usec]",
        "99.9% percentile[usec]",
    ] {
        assert!(o.stdout.contains(c), "{c}: {}", o.stdout);
    }
    let dir = Scratch::new("sweep-plot");
    let lat = dir.0.join("lat.json");
    let bw = dir.0.join("bw.json");
    let one = dir.0.join("one.svg");
    let lat_s = lat.to_str().unwrap();
    let bw_s = bw.to_str().unwrap();
    let o = run(
        &[
            "lat",
            "-t",
            "shm",
            "-s",
            "64",
            "-n",
            "5",
            "--save",
            lat_s,
            "--svg",
            one.to_str().unwrap(),
        ],
        LIMIT,
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(std::fs::read_to_string(&one).unwrap().contains("<polyline"));
    let o = run(
        &[
            "bw", "-t", "tcp", "--verb", "send", "-s", "64", "-n", "5", "--save", bw_s,
        ],
        LIMIT,
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let svg = dir.0.join("sweep.svg");
    let o = run(
        &["sweep-plot", lat_s, bw_s, "-o", svg.to_str().unwrap()],
        LIMIT,
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let svg = std::fs::read_to_string(&svg).unwrap();
    // Two latency lines (typical, 99%) and two bandwidth lines (average, peak).
    assert_eq!(svg.matches("<polyline").count(), 4, "{svg}");
    assert!(svg.contains("shm read") && svg.contains("tcp send"));
    // A non-report is refused clearly.
    let o = run(&["sweep-plot", "/dev/null", "-o", "/dev/null"], LIMIT);
    assert_eq!(o.code, 1);
    assert!(
        o.stderr.contains("not a netbench lat/bw JSON report"),
        "{}",
        o.stderr
    );
}

#[test]
fn help_documents_device_port_gid_and_each_transports_semantics() {
    for cmd in ["lat", "bw"] {
        let o = run(&[cmd, "--help"], LIMIT);
        assert_eq!(o.code, 0);
        for needle in [
            "-d, --rdma-device <NAME>",
            "-i, --rdma-port <PORT>",
            "-x, --gid-index <INDEX>",
            "-a, --all-sizes",
            "-q, --qp <QPS>",
            "--tx-depth",
            "-D, --duration",
            "--bidirectional",
            "--under-load",
            "EMULATED",
            "ib_write_lat",
        ] {
            assert!(
                o.stdout.contains(needle),
                "{cmd} --help lacks {needle:?}:\n{}",
                o.stdout
            );
        }
    }
}

#[test]
fn bad_combinations_are_usage_errors() {
    for (args, needle) in [
        (
            &["bw", "-t", "tcp", "--bidirectional"][..],
            "--bidirectional applies to bw with --verb write or send",
        ),
        (
            &["lat", "-t", "tcp", "--verb", "send", "-b"][..],
            "--bidirectional applies",
        ),
        (
            &["bw", "-t", "tcp", "--under-load"][..],
            "--under-load applies to lat",
        ),
        (&["lat", "-t", "tcp", "-q", "0"][..], "--qp must be"),
        (
            &["bw", "-t", "tcp", "--tx-depth", "0"][..],
            "--tx-depth must be",
        ),
        (
            &["bw", "-t", "tcp", "--post-list", "0"][..],
            "--post-list must be",
        ),
        (&["bw", "-t", "tcp", "-l", "17"][..], "--post-list must be"),
        (&["lat", "-t", "tcp", "-D", "0"][..], "-D must be"),
        (
            &["lat", "-t", "tcp", "-s", "32MiB"][..],
            "longest operation",
        ),
        (&["lat", "-t", "tcp", "-n", "0"][..], "-n must be"),
    ] {
        let o = run(args, LIMIT);
        assert_eq!(o.code, 2, "{args:?}: {}", o.stderr);
        assert!(o.stderr.contains(needle), "{args:?}: {}", o.stderr);
    }
    // -a and -s together, and -n with -D: clap refuses.
    assert_eq!(run(&["lat", "-t", "tcp", "-a", "-s", "4"], LIMIT).code, 2);
    assert_eq!(
        run(&["lat", "-t", "tcp", "-n", "4", "-D", "1"], LIMIT).code,
        2
    );
}

#[test]
fn against_a_running_server_with_peers() {
    let server =
        common::Server::start(&["-t", "tcp-blocking", "--objects", "1", "--size", "64KiB"]);
    let r = json_of(&[
        "bw",
        "-t",
        "tcp-blocking",
        "--peers",
        &server.addr,
        "--verb",
        "write",
        "-s",
        "64KiB",
        "-n",
        "20",
        "--json",
    ]);
    assert_eq!(r["peers"][0].as_str(), Some(server.addr.as_str()));
    assert_bw_entry(&r["bw"][0], 65536, 20);
    // A size the server's buffers cannot hold is refused before anything is measured.
    let o = run(
        &[
            "lat",
            "-t",
            "tcp-blocking",
            "--peers",
            &server.addr,
            "-s",
            "128KiB",
            "-n",
            "5",
        ],
        LIMIT,
    );
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(
        o.stderr
            .contains("serves 65536-byte objects; this run needs 131072"),
        "{}",
        o.stderr
    );
}
