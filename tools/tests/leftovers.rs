//! No leftovers: after `kill -9` of every daemon of `symphony up --serve`,
//! the next `symphony up` run leaves no `symphony-*` file of a dead process
//! in the private shm directory, /dev/shm or the temporary directory when it exits (shared-memory
//! files and log directories are named after their owner's pid; every
//! process sweeps those of dead owners, and `up` removes its own logs when
//! it succeeds). Files of live processes (tests running in parallel) are
//! left alone, so the check is about dead owners only.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dataplane::mem::process_alive;

/// `symphony-<pid>-..`, `symphony-reg-<pid>-..`, `symphony-up-<pid>`.
fn owner(name: &str) -> Option<u32> {
    let rest = ["symphony-reg-", "symphony-up-", "symphony-"].iter().find_map(|p| name.strip_prefix(p))?;
    rest.split('-').next()?.parse().ok()
}

fn dead_owned_files() -> Vec<String> {
    let mut v = Vec::new();
    // The private shm directory (dataplane::mem::shm_dir) holds the files; /dev/shm
    // itself is scanned too, for files of builds from before it.
    let private = dataplane::mem::shm_dir().expect("the private shm directory").to_path_buf();
    for dir in [private, std::path::PathBuf::from("/dev/shm"), std::env::temp_dir()] {
        let Ok(rd) = std::fs::read_dir(&dir) else { continue };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(pid) = owner(&name) {
                if !process_alive(pid) {
                    v.push(format!("{}/{name}", dir.display()));
                }
            }
        }
    }
    v
}

fn children_of(pid: u32) -> Vec<u32> {
    let mut v = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return v };
    for t in tasks.flatten() {
        if let Ok(s) = std::fs::read_to_string(t.path().join("children")) {
            v.extend(s.split_whitespace().filter_map(|x| x.parse::<u32>().ok()));
        }
    }
    v
}

#[test]
fn kill_9_of_every_daemon_leaves_nothing_after_the_next_run() {
    let bin = env!("CARGO_BIN_EXE_symphony");
    let mut up = Command::new(bin)
        .args(["up", "--serve", "--models", "ResNet50", "--backends", "1", "--frontends", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("up starts");
    let stdout = up.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let line = lines.next().expect("up prints its addresses").expect("utf-8");
        if line.starts_with("serving") {
            break;
        }
        assert!(Instant::now() < deadline, "up --serve did not come up");
    }
    let daemons = children_of(up.id());
    assert_eq!(daemons.len(), 3, "scheduler, frontend, backend: {daemons:?}");
    for &d in &daemons {
        // SAFETY: sends SIGKILL to a child process this test started (through up).
        unsafe { libc::kill(d as libc::pid_t, libc::SIGKILL) };
    }
    // up notices and exits (its daemons are gone).
    let status = up.wait().expect("up exits");
    assert!(!status.success(), "up should fail when its daemons are killed");
    drop(lines);
    let leftovers = dead_owned_files();
    assert!(!leftovers.is_empty(), "the killed cluster left its files (else this test proves nothing)");
    let out = Command::new(bin)
        .args(["up", "--models", "ResNet50", "--backends", "1", "--frontends", "1", "--duration-s", "1", "--load", "0.3", "--plot", &std::env::temp_dir().join(format!("leftovers-plot-{}", std::process::id())).to_string_lossy()])
        .output()
        .expect("second up runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(std::env::temp_dir().join(format!("leftovers-plot-{}", std::process::id())));
    let after = dead_owned_files();
    assert!(after.is_empty(), "left behind: {after:?} (before the second run: {leftovers:?})");
}
