//! NVRTC compiles the graph engine's kernels (kernels.cu) to PTX for the
//! H200 (sm_90) on a machine without a GPU: NVRTC 13 from the PyPI wheel
//! nvidia-cuda-nvrtc that scripts/setup.sh installs into .venv (the
//! compiler needs no driver). A broken source is rejected with the
//! compiler's message, so a compile error in kernels.cu fails this test.
//! NVRTC is installable everywhere, so its absence is no capability skip:
//! a failure under CI, a SKIPPED line elsewhere (tests/lib/require.rs).
#![cfg(feature = "cuda")]

use std::path::{Path, PathBuf};

use backend::exec::cuda_libs;
use backend::exec::graph::{nvrtc, Kernel, KERNELS_CU};

#[path = "../../tests/lib/require.rs"]
mod require;

/// The wheel's library folders in the project venv (CUDA 13's and 12's
/// layouts), then the process's usual search folders.
fn nvrtc_dirs() -> Vec<PathBuf> {
    let venv_lib = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/lib");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&venv_lib)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .flat_map(|py| {
            let nv = py.path().join("site-packages/nvidia");
            [nv.join("cu13/lib"), nv.join("cuda_nvrtc/lib")]
        })
        .collect();
    dirs.extend(cuda_libs::env_search_dirs());
    dirs
}

#[test]
fn kernels_cu_compiles_to_sm_90_ptx_and_a_broken_source_is_rejected() {
    let dirs = nvrtc_dirs();
    let lib = match cuda_libs::load_nvrtc_from(&dirs) {
        Ok(lib) => lib,
        Err(e) => {
            require::capability("nvrtc", false, &format!("NVRTC (scripts/setup.sh installs nvidia-cuda-nvrtc into .venv): {e}"));
            return;
        }
    };
    eprintln!("NVRTC {} from {}", lib.major, lib.path.display());
    let ptx = nvrtc::compile(KERNELS_CU, Some(nvrtc::ARCH_H200)).expect("kernels.cu compiles");
    let text = ptx.to_src();
    assert!(text.contains(".target sm_90"), "PTX for sm_90:\n{}", &text[..text.len().min(400)]);
    for k in Kernel::ALL {
        assert!(text.contains(&format!(".entry {}(", k.name())), "PTX lacks kernel {}", k.name());
    }
    let broken = format!("{KERNELS_CU}\nextern \"C\" __global__ void sym_broken(float* m) {{ m[0] = undeclared_name; }}\n");
    let err = nvrtc::compile(&broken, Some(nvrtc::ARCH_H200)).expect_err("a broken kernel is rejected");
    let msg = format!("{err} {:?}", err);
    assert!(msg.contains("undeclared_name") || msg.contains("CompileError"), "{msg}");
}
