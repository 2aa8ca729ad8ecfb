//! Fuzzes the wire decoder: no input may panic, and whatever decodes must
//! re-encode to the same bytes (checked inside `fuzz_decode`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    dataplane::wire::fuzz_decode(data);
});
