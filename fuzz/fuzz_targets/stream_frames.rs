//! Arbitrary bytes from a tcp peer into the framed-stream engine (framing,
//! inbox, READ responder): no input may panic, and a link holding READs
//! (accepted, not registered: the first byte chooses) answers none.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    dataplane::transport::fuzz::fuzz_stream(data);
});
