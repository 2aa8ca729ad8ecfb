//! Fuzzes the gRPC `ModelInferRequest` path before submission: protobuf
//! decoding, then the checks against the model it names (input name,
//! datatype, shape, raw or typed contents, parameters). No input may panic.
#![no_main]

use std::sync::OnceLock;

fn catalog() -> &'static frontend::models::ModelCatalog {
    static CATALOG: OnceLock<frontend::models::ModelCatalog> = OnceLock::new();
    CATALOG.get_or_init(|| {
        let m = scheduler_core::zoo::ModelSpec::linear("m", 1.0, 1.0, 20.0).expect("valid spec");
        frontend::models::ModelCatalog::with_default_tensors(&[m])
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    frontend::grpc::fuzz_decode(data, catalog());
});
