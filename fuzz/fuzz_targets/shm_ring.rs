//! shm ring records from a peer, under a ring header the peer may garble
//! (indices, capacity) before or after this side maps it: refused without
//! a panic or a read outside the mapping.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    dataplane::transport::fuzz::fuzz_ring(data);
});
