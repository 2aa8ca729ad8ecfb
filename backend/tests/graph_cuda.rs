//! The graph engine on the CUDA executor (issue 51): a `KIND_GPU`
//! repository model (ppocr_cls) is lowered for batches 1..=4 and handed to
//! `exec::graph::device::executor`. Without a driver or device (CI, the
//! development machines) setup must fail cleanly with the libraries' or the
//! driver's error; with a GPU, a batch of 4 from the staging region must
//! equal the same plan run on the CPU (1e-4 absolute + 1e-3 relative),
//! which tests/graph.rs checks against onnxruntime. The models are
//! installable everywhere, so their absence is no capability skip.
#![cfg(feature = "cuda")]

use std::path::{Path, PathBuf};

use backend::exec::cuda::{gpu_present, CudaSlots};
use backend::exec::graph::{cpu, device};
use backend::exec::onnx::{gpu_engine_serves, OnnxModel, Provider};
use backend::exec::{ExecError, ExecModel, Executor, Finished, InputRef, Job, OutputRef};
use dataplane::mem::Region;
use dataplane::time::{Instant, MonotonicClock};
use scheduler::profile::LatencyProfile;

#[path = "../../tests/lib/require.rs"]
mod require;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// ppocr_cls from the fetched repository, as a `KIND_GPU` model.
fn gpu_model() -> Option<OnnxModel> {
    let repo = scheduler::repository::scan(&root().join("models")).ok();
    match repo.as_ref().and_then(|r| r.model("ppocr_cls")) {
        Some(m) => {
            let mut m = OnnxModel::from_repo(m).unwrap();
            m.provider = Provider::Cuda;
            Some(m)
        }
        None => {
            if std::env::var_os("SYMPHONY_ONNX_REQUIRED").is_some() {
                panic!("graph tests required (SYMPHONY_ONNX_REQUIRED) but models/ppocr_cls is missing");
            }
            require::capability("onnx-models", false, "the ONNX models (scripts/fetch-models.sh)");
            None
        }
    }
}

#[test]
fn a_kind_gpu_model_runs_on_the_graph_engine_or_setup_fails_cleanly() {
    let Some(m) = gpu_model() else { return };
    let mut cpu_model = m.clone();
    cpu_model.provider = Provider::Cpu;
    assert!(gpu_engine_serves(&[Ok(m.clone()), Err(("gone".into(), "not held".into()))]));
    assert!(!gpu_engine_serves(&[Ok(m.clone()), Ok(cpu_model.clone())]), "mixed sets stay on ONNX Runtime");
    let plans = device::repo_plans(&[Ok(m.clone()), Ok(cpu_model)], 4).unwrap();
    assert!(plans[1].is_none(), "a CPU model gets no plans");
    let per_batch = plans[0].as_ref().unwrap();
    assert_eq!(per_batch.len(), 4);
    let (sample, out_len) = (m.input_bytes(), m.output_bytes());
    let slots = CudaSlots { max_batch: 4, input_slot: sample, output_slot: out_len };
    let exec_models = vec![ExecModel { profile: LatencyProfile::linear(0.1, 1.0, 4).unwrap(), output_len: out_len }];
    let staging = Region::anonymous(8 << 20).unwrap();
    let mut exec = match device::executor(&[0], staging.clone(), slots, exec_models, &plans) {
        Ok(e) => e,
        Err(e @ (ExecError::CudaLibraries(_) | ExecError::Cuda { .. })) => {
            assert!(!gpu_present(), "setup failed with a GPU present: {e}");
            eprintln!("no usable GPU: the graph engine's setup fails cleanly: {e}");
            return;
        }
        Err(e) => panic!("unexpected error: {e}"),
    };
    // Four different inputs in [0, 1), in their landing slots.
    let x: Vec<f32> = (0..4 * sample as usize / 4).map(|i| ((i * 2654435761) % 1000) as f32 / 1000.0).collect();
    let bytes: Vec<u8> = x.iter().flat_map(|f| f.to_le_bytes()).collect();
    staging.write_at(0, &bytes).unwrap();
    let inputs: Vec<InputRef> = (0..4u64).map(|i| InputRef { offset: i * u64::from(sample), len: sample }).collect();
    let out_at = 4 * u64::from(sample);
    let clock = MonotonicClock::new();
    let job = Job { tag: 1, device: 0, model: 0, exec_at: Instant::ZERO, inputs: &inputs, output: OutputRef { offset: out_at, stride: out_len } };
    exec.submit(clock.now(), &job).unwrap();
    let mut done = [Finished::default(); 1];
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while exec.poll(clock.now(), &mut done) == 0 {
        assert!(std::time::Instant::now() < until, "batch did not finish");
        std::thread::yield_now();
    }
    assert!(done[0].ok, "batch failed");
    let mut got = vec![0u8; 4 * out_len as usize];
    staging.read_at(out_at, &mut got).unwrap();
    let got: Vec<f32> = got.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let plan = &per_batch[3];
    let want = cpu::run(plan, &mut cpu::arena(plan), &x).unwrap();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!((g - w).abs() <= 1e-4 + 1e-3 * w.abs(), "element {i}: GPU {g} vs CPU plan {w}");
    }
    eprintln!("ppocr_cls batch 4 on GPU 0 matches the CPU plan: {got:?}");
}
