//! Fuzzes the wire decoder: no input may panic, and whatever decodes must
//! re-encode to the same bytes (checked inside `fuzz_decode`); checking a
//! decoded Join's or Welcome's MAC never panics (`join::fuzz_proofs`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    dataplane::wire::fuzz_decode(data);
    dataplane::join::fuzz_proofs(data);
});
