//! The per-task cost of capabilities (issue 55): the scheduler signs every
//! task it plans ([`CapabilityKey::sign`]) and the frontend checks every
//! completion ([`CapabilityKey::verify`]). Thread CPU time per operation,
//! median of RUNS runs of OPS operations each, over distinct grants (as a
//! plan's tasks are). Run: `cargo bench -p dataplane --bench capability`.

use std::hint::black_box;

use dataplane::capability::{CapabilityKey, Grant};
use dataplane::join::JoinToken;
use dataplane::mem::RemoteRef;
use dataplane::stats::median;

const RUNS: usize = 5;
const OPS: u64 = 1_000_000;

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn grant(i: u64) -> Grant {
    Grant {
        backend: (i % 64) as u32,
        frontend: (i % 7) as u32,
        task: i,
        input: RemoteRef { key: 0x5a5a_0001, len: 602_112, offset: (i % 4096) * 602_112 },
    }
}

/// Median ns of CPU per call of `op` over grants 0..OPS.
fn per_op(mut op: impl FnMut(&Grant) -> bool) -> f64 {
    let mut runs = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let start = thread_cpu_ns();
        let mut ok = 0u64;
        for i in 0..OPS {
            ok += u64::from(op(&grant(i)));
        }
        black_box(ok);
        runs.push((thread_cpu_ns() - start) as f64 / OPS as f64);
    }
    median(&mut runs).unwrap_or(f64::NAN)
}

fn main() {
    let key = CapabilityKey::from_token(&JoinToken::new(b"a bench's sixteen-byte token").expect("token"));
    let sign = per_op(|g| black_box(key.sign(g))[0] != 0);
    let cap = key.sign(&grant(0));
    let verify = per_op(|g| key.verify(g, black_box(&cap)));
    println!("capability sign: {sign:.0} ns per task (thread CPU, median of {RUNS} x {OPS})");
    println!("capability verify: {verify:.0} ns per completion (thread CPU, median of {RUNS} x {OPS})");
}
