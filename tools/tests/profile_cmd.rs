//! `symphony profile` on the real models (scripts/fetch-models.sh): a
//! `KIND_CPU` model is timed on ONNX Runtime and its profile file loads; a
//! `KIND_GPU` model goes to the graph engine on GPU 0, so on a machine
//! without a GPU the command fails cleanly, naming what is missing (never a
//! panic), and on one with a GPU it profiles the model.
//!
//! ONNX Runtime and the models are installable everywhere, so their absence
//! is no capability skip: a failure under CI, `SKIPPED` elsewhere (as in
//! backend/tests/onnx.rs).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use backend::exec::onnx::find_dylib;
use scheduler::repository;
use scheduler::repository::profile::ProfileFile;

#[path = "../../tests/lib/require.rs"]
mod require;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Whether ONNX Runtime and ppocr_cls are in place (else skipped, or a
/// failure under CI).
fn models_present() -> bool {
    let why = match (find_dylib(), repository::scan(&root().join("models"))) {
        (Ok(_), Ok(r)) if r.model("ppocr_cls").is_some() => return true,
        (Err(e), _) => format!("ONNX Runtime's library (scripts/setup.sh): {e}"),
        (_, Err(e)) => format!("the ONNX models (scripts/fetch-models.sh): {e}"),
        (_, Ok(r)) => format!("models/ lacks ppocr_cls ({:?}); run scripts/fetch-models.sh", r.refused),
    };
    if std::env::var_os("SYMPHONY_ONNX_REQUIRED").is_some() {
        panic!("ONNX tests required (SYMPHONY_ONNX_REQUIRED) but missing: {why}");
    }
    require::capability("onnx-models", false, &why);
    false
}

/// A repository in a fresh temporary folder holding ppocr_cls with its
/// instance kind set to `kind`.
fn repo_with(kind: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("symphony-profile-test-{}-{kind}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let model = dir.join("ppocr_cls/1");
    std::fs::create_dir_all(&model).unwrap();
    std::fs::copy(root().join("models/ppocr_cls/1/model.onnx"), model.join("model.onnx")).unwrap();
    let config = std::fs::read_to_string(root().join("models/ppocr_cls/config.pbtxt")).unwrap();
    assert!(config.contains("KIND_CPU"), "the fetched config names its instance kind: {config}");
    std::fs::write(dir.join("ppocr_cls/config.pbtxt"), config.replace("KIND_CPU", kind)).unwrap();
    dir
}

fn profile(repo: &Path) -> (Output, PathBuf) {
    let out = repo.join("profile.json");
    let o = Command::new(env!("CARGO_BIN_EXE_symphony"))
        .args(["profile", "--model-repository"])
        .arg(repo)
        .args(["--runs", "2", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    (o, out)
}

/// The profile file `symphony up` would load: ppocr_cls with a line fit
/// and a latency point for every profiled batch size.
fn check_profile(path: &Path) {
    let file: ProfileFile = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let p = file.models.iter().find(|m| m.name == "ppocr_cls").expect("ppocr_cls profiled");
    let sizes: Vec<u32> = p.latency_ms.iter().map(|l| l.batch).collect();
    assert_eq!(sizes, vec![1, 2, 4, 8, 16], "batch sizes 1, 2, 4, ... and the largest");
    assert!(p.latency_ms.iter().all(|l| l.p50 > 0.0 && l.p99 >= l.p50), "{:?}", p.latency_ms);
    assert!(p.alpha_ms.is_finite() && p.beta_ms.is_finite() && p.alpha_ms >= 0.0, "{} {}", p.alpha_ms, p.beta_ms);
}

#[test]
fn a_cpu_model_is_profiled_on_onnx_runtime() {
    if !models_present() {
        return;
    }
    let repo = repo_with("KIND_CPU");
    let (o, out) = profile(&repo);
    assert!(o.status.success(), "profile failed: {}", String::from_utf8_lossy(&o.stderr));
    check_profile(&out);
    let _ = std::fs::remove_dir_all(&repo);
}

#[test]
fn a_gpu_model_goes_to_the_graph_engine_and_without_a_gpu_fails_cleanly() {
    if !models_present() {
        return;
    }
    let repo = repo_with("KIND_GPU");
    let (o, out) = profile(&repo);
    let stderr = String::from_utf8_lossy(&o.stderr);
    if o.status.success() {
        // A machine with a GPU (and the driver and NVRTC): the graph engine
        // timed the model there.
        eprintln!("profiled on the GPU: {}", std::fs::read_to_string(&out).unwrap_or_default());
        check_profile(&out);
    } else {
        assert!(!stderr.contains("panicked"), "a clean error, not a panic: {stderr}");
        assert!(stderr.contains("ppocr_cls"), "the error names the model: {stderr}");
        assert!(
            stderr.contains("CUDA") || stderr.contains("NVRTC") || stderr.contains("GPU") || stderr.contains("cuda"),
            "the error names the missing GPU part: {stderr}"
        );
        assert!(!out.exists(), "no profile written for a model that did not run");
    }
    let _ = std::fs::remove_dir_all(&repo);
}
