//! Generates the KServe v2 gRPC server and client from proto/grpc_service.proto
//! with protox (a protobuf compiler in Rust) and tonic-prost-build: no system `protoc`.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/grpc_service.proto");
    let descriptors = protox::compile(["proto/grpc_service.proto"], ["proto"])?;
    tonic_prost_build::configure().bytes(".inference.ModelInferRequest.raw_input_contents").compile_fds(descriptors)?;
    Ok(())
}
