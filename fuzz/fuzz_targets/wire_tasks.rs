//! Batched task submissions (`Kind::Tasks`): arbitrary bytes as a batch
//! body under a valid header and as a whole message must decode or be
//! refused without a panic, and re-encode to the same bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    dataplane::wire::fuzz_decode_tasks(data);
});
