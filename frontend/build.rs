//! Generates the KServe v2 gRPC server and client from proto/grpc_service.proto
//! (protoc: Debian's protobuf-compiler, installed by scripts/setup.sh; PROTOC overrides).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/grpc_service.proto");
    tonic_prost_build::configure()
        .bytes(".inference.ModelInferRequest.raw_input_contents")
        .compile_protos(&["proto/grpc_service.proto"], &["proto"])?;
    Ok(())
}
