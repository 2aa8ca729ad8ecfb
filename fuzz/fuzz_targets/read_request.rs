//! READ request frames with arbitrary header fields (wire version, length,
//! reserved word) and bodies, on links that serve READs and on links that
//! hold them: no panic, no READ answered outside the registered region or
//! before the owner allowed it.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    dataplane::transport::fuzz::fuzz_read_request(data);
});
