//! Compiles the graph engine's kernels (src/exec/graph/kernels.cu) as C++
//! for the CPU runner (src/exec/graph/cpu.rs): the same source NVRTC
//! compiles for the GPU, over a shim for the CUDA built-ins. Always at -O2:
//! the runner checks real models in the tests, also in debug builds.
fn main() {
    println!("cargo:rerun-if-changed=src/exec/graph/kernels.cu");
    println!("cargo:rerun-if-changed=src/exec/graph/cpu_shim.cpp");
    cc::Build::new()
        .cpp(true)
        .file("src/exec/graph/cpu_shim.cpp")
        .opt_level(2)
        .warnings(true)
        .compile("symphony_graph_cpu");
}
