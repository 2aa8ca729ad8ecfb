//! Generates the etcd v3 gRPC client from proto/etcd_v3.proto with protox (a
//! protobuf compiler in Rust) and tonic-prost-build: no system `protoc`.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/etcd_v3.proto");
    let descriptors = protox::compile(["proto/etcd_v3.proto"], ["proto"])?;
    tonic_prost_build::configure().build_server(false).compile_fds(descriptors)?;
    Ok(())
}
