//! The per-task cost of capabilities (issue 55): the scheduler signs every
//! task it plans ([`CapabilityKey::sign`]) and the frontend checks every
//! completion ([`CapabilityKey::verify`]). Thread CPU time per operation,
//! median of RUNS runs of OPS operations each, over distinct grants (as a
//! plan's tasks are). Side by side: the capability's MAC (SipHash-2-4-128)
//! and the HMAC-SHA256 truncated to 16 bytes it replaced, under the same
//! derived key and over the same 32 grant bytes.
//! Run: `cargo bench -p dataplane --bench capability`.

use std::hint::black_box;

use dataplane::capability::{Capability, CapabilityKey, Grant, CAPABILITY_LABEL, CAPABILITY_LEN};
use dataplane::join::JoinToken;
use dataplane::mem::RemoteRef;
use dataplane::stats::median;
use hmac::{Hmac, Mac};
use sha2::Sha256;

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

/// The grant's MAC input as `Grant` lays it out: backend, frontend (u32
/// each), task, input key, len (u32 each), offset; little-endian.
fn grant_bytes(g: &Grant) -> [u8; 32] {
    let words = [
        u64::from(g.backend) | u64::from(g.frontend) << 32,
        g.task,
        u64::from(g.input.key) | u64::from(g.input.len) << 32,
        g.input.offset,
    ];
    let mut b = [0u8; 32];
    for (chunk, word) in b.chunks_exact_mut(8).zip(words) {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    b
}

/// The capability MAC before SipHash: HMAC-SHA256 keyed once, cloned per
/// grant, truncated to 16 bytes, checked with `verify_truncated_left`.
struct HmacCapability {
    keyed: Hmac<Sha256>,
}

impl HmacCapability {
    fn new(token: &JoinToken) -> HmacCapability {
        let keyed = Hmac::<Sha256>::new_from_slice(&token.derive_key(CAPABILITY_LABEL)).expect("HMAC takes any key");
        HmacCapability { keyed }
    }

    fn mac(&self, g: &Grant) -> Hmac<Sha256> {
        let mut mac = self.keyed.clone();
        mac.update(&grant_bytes(g));
        mac
    }

    fn sign(&self, g: &Grant) -> Capability {
        let mut cap = [0u8; CAPABILITY_LEN];
        cap.copy_from_slice(&self.mac(g).finalize().into_bytes()[..CAPABILITY_LEN]);
        cap
    }

    fn verify(&self, g: &Grant, cap: &Capability) -> bool {
        self.mac(g).verify_truncated_left(cap).is_ok()
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
    let token = JoinToken::new(b"a bench's sixteen-byte token").expect("token");
    let key = CapabilityKey::from_token(&token);
    let sign = per_op(|g| black_box(key.sign(g))[0] != 0);
    let cap = key.sign(&grant(0));
    let verify = per_op(|g| key.verify(g, black_box(&cap)));
    let hmac = HmacCapability::new(&token);
    let hmac_sign = per_op(|g| black_box(hmac.sign(g))[0] != 0);
    let hmac_cap = hmac.sign(&grant(0));
    assert!(hmac.verify(&grant(0), &hmac_cap), "the HMAC reference verifies its own tag");
    let hmac_verify = per_op(|g| hmac.verify(g, black_box(&hmac_cap)));
    let runs = format!("thread CPU, median of {RUNS} x {OPS}");
    println!("capability sign (SipHash-2-4-128): {sign:.0} ns per task ({runs})");
    println!("capability verify (SipHash-2-4-128): {verify:.0} ns per completion ({runs})");
    println!("HMAC-SHA256/128 sign: {hmac_sign:.0} ns per task ({runs})");
    println!("HMAC-SHA256/128 verify: {hmac_verify:.0} ns per completion ({runs})");
}
