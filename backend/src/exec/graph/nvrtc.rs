//! kernels.cu through NVRTC: the PTX the GPU model loads, and the compile
//! check CI runs without a GPU (NVRTC needs no driver; the PyPI wheel
//! `nvidia-cuda-nvrtc`, installed by scripts/setup.sh, provides it).

use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};

use crate::exec::ExecError;

/// The H200's architecture (compute capability 9.0).
pub const ARCH_H200: &str = "sm_90";

/// Compiles `src` to PTX for `arch` (`None`: NVRTC's default). NVRTC must
/// already be resident ([`crate::exec::cuda_libs::load`] or
/// [`crate::exec::cuda_libs::load_nvrtc_from`]): cudarc opens it by name
/// and cannot report its absence otherwise. A compile error carries the
/// compiler's log.
pub fn compile(src: &str, arch: Option<&'static str>) -> Result<Ptx, ExecError> {
    let opts = CompileOptions { arch, name: Some("kernels.cu".into()), ..CompileOptions::default() };
    compile_ptx_with_opts(src, opts).map_err(|e| ExecError::Cuda { what: "nvrtc", source: Box::new(e) })
}
