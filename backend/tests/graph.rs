//! The graph engine (backend::exec::graph) on the real models of
//! `scripts/fetch-models.sh`: kernels.cu, compiled for the CPU by the host
//! C++ compiler, runs each model's plan for batches of 1 and 4, and every
//! output equals Python onnxruntime's (scripts/onnx_reference.py, CPU
//! provider) within 1e-4 absolute + 1e-3 relative. The GPU runs the same
//! plans and kernel text (exec/cuda.rs's GraphModel), so only the device's
//! arithmetic is left for the GPU check (scripts/device-check.sh).
//!
//! Hostile files (truncated, garbage, bounds) and unsupported ops fail with
//! errors, never panics. The models and onnxruntime are installable
//! everywhere, so their absence is no capability skip (as in tests/onnx.rs).

use std::path::{Path, PathBuf};
use std::process::Command;

use backend::exec::graph::proto::{self, ModelProto};
use backend::exec::graph::{cpu, GraphError, Model};
use prost::Message;

#[path = "../../tests/lib/require.rs"]
mod require;
#[path = "common/inputs.rs"]
mod inputs;
use inputs::inputs;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn model_path(name: &str) -> PathBuf {
    root().join("models").join(name).join("1/model.onnx")
}

/// Whether the models and Python onnxruntime are here; else skip (outside
/// CI) or fail (CI, SYMPHONY_ONNX_REQUIRED), naming what is missing.
fn ready() -> bool {
    let py = root().join(".venv/bin/python");
    let missing = if !model_path("ppocr_cls").exists() || !model_path("open_nsfw").exists() {
        Some(("onnx-models", "the ONNX models (scripts/fetch-models.sh)"))
    } else if !py.exists() {
        Some(("onnx-runtime", "the project venv with onnxruntime (scripts/setup.sh)"))
    } else {
        None
    };
    let Some((what, why)) = missing else { return true };
    if std::env::var_os("SYMPHONY_ONNX_REQUIRED").is_some() {
        panic!("graph tests required (SYMPHONY_ONNX_REQUIRED) but {what} is missing: {why}");
    }
    require::capability(what, false, why);
    false
}

/// Python onnxruntime's output for `x` of shape `dims`.
fn python_reference(name: &str, x: &[f32], dims: &[usize]) -> Vec<f32> {
    let dir = std::env::temp_dir().join(format!("symphony-graph-ref-{}-{name}-{}", std::process::id(), dims[0]));
    std::fs::create_dir_all(&dir).unwrap();
    let (inp, out) = (dir.join("in.bin"), dir.join("out.bin"));
    std::fs::write(&inp, x.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
    let shape: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
    let status = Command::new(root().join(".venv/bin/python"))
        .arg(root().join("scripts/onnx_reference.py"))
        .arg(model_path(name))
        .arg(&inp)
        .arg(shape.join(","))
        .arg("float32")
        .arg(&out)
        .status()
        .expect("run scripts/onnx_reference.py");
    assert!(status.success(), "onnx_reference.py failed");
    let bytes = std::fs::read(&out).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// Lowers `name` for batches of 1 and 4, runs both on the CPU and checks
/// every output against onnxruntime.
fn check(name: &str) {
    let bytes = std::fs::read(model_path(name)).unwrap();
    // The per-sample dims the model's config.pbtxt serves (ppocr_cls's
    // graph leaves the width symbolic).
    let repo = scheduler::repository::scan(&root().join("models")).unwrap();
    let config = backend::exec::onnx::OnnxModel::from_repo(repo.model(name).unwrap()).unwrap();
    let dims: Vec<usize> = config.input.dims.iter().map(|&d| d as usize).collect();
    let model = Model::load(&bytes).unwrap().with_sample_dims(&dims).unwrap();
    let one = model.plan(1).unwrap();
    for b in [1usize, 4] {
        let plan = model.plan(b).unwrap();
        // The weight image is the same for every batch size (the GPU model
        // uploads it once and runs any batch's plan over it).
        assert_eq!(plan.weights, one.weights, "{name}: weights differ between batch 1 and {b}");
        let x = inputs(plan.input_len() as usize, 0x5eed ^ b as u64);
        let mut arena = cpu::arena(&plan);
        let got = cpu::run(&plan, &mut arena, &x).unwrap();
        // Each sample alone (batch 1) gives the same outputs.
        let (per_in, per_out) = (one.input_len() as usize, one.output_len() as usize);
        for i in 0..b {
            let alone = cpu::run(&one, &mut cpu::arena(&one), &x[i * per_in..(i + 1) * per_in]).unwrap();
            for (j, (g, w)) in got[i * per_out..(i + 1) * per_out].iter().zip(&alone).enumerate() {
                assert!((g - w).abs() <= 1e-5, "{name}: sample {i} output {j}: batch {b} gives {g}, batch 1 {w}");
            }
        }
        let want = python_reference(name, &x, &plan.input.1);
        assert_eq!(got.len(), want.len(), "{name} batch {b}: output length");
        assert_eq!(plan.output.1, vec![b, 2], "{name}: output shape");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= 1e-4 + 1e-3 * w.abs(), "{name} batch {b} element {i}: {g} vs onnxruntime {w}");
        }
        eprintln!("{name} batch {b}: {} launches, arena {} floats, matches onnxruntime", plan.launches.len(), plan.arena_len);
    }
}

#[test]
fn ppocr_cls_plan_on_the_cpu_matches_onnxruntime_at_batch_1_and_4() {
    if ready() {
        check("ppocr_cls");
    }
}

#[test]
fn open_nsfw_plan_on_the_cpu_matches_onnxruntime_at_batch_1_and_4() {
    if ready() {
        check("open_nsfw");
    }
}

/// A small valid model built here: x [N, 2] -> Relu -> y.
fn tiny(op: &str) -> ModelProto {
    let vi = |name: &str, dims: &[Option<i64>]| proto::ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(proto::TypeProto {
            tensor_type: Some(proto::TypeTensor {
                elem_type: Some(proto::DT_FLOAT),
                shape: Some(proto::TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|d| proto::Dimension { dim_value: *d, dim_param: d.is_none().then(|| "N".into()) })
                        .collect(),
                }),
            }),
        }),
    };
    ModelProto {
        ir_version: Some(7),
        opset_import: vec![proto::OperatorSetIdProto { domain: Some(String::new()), version: Some(11) }],
        graph: Some(proto::GraphProto {
            node: vec![proto::NodeProto {
                input: vec!["x".into()],
                output: vec!["y".into()],
                op_type: Some(op.into()),
                ..Default::default()
            }],
            initializer: vec![],
            input: vec![vi("x", &[None, Some(2)])],
            output: vec![vi("y", &[None, Some(2)])],
        }),
    }
}

#[test]
fn a_tiny_encoded_model_runs_and_an_unknown_op_is_named() {
    let m = Model::load(&tiny("Relu").encode_to_vec()).unwrap();
    let plan = m.plan(3).unwrap();
    let x = [-1.0f32, 2.0, 3.5, -0.5, 0.0, -7.0];
    let got = cpu::run(&plan, &mut cpu::arena(&plan), &x).unwrap();
    assert_eq!(got, vec![0.0, 2.0, 3.5, 0.0, 0.0, 0.0]);
    let err = Model::load(&tiny("Gather").encode_to_vec()).unwrap().plan(1).unwrap_err();
    assert!(matches!(&err, GraphError::Unsupported(m) if m.contains("op Gather")), "{err}");
    assert!(m.plan(0).is_err() && m.plan(1 << 20).is_err(), "batch bounds");
}

#[test]
fn hostile_model_bytes_fail_cleanly() {
    // Garbage, every truncation of a valid file, and a tensor whose dims
    // promise more data than it holds: errors, no panic, no huge allocation.
    assert!(Model::load(&[0xff; 64]).is_err());
    let good = tiny("Relu").encode_to_vec();
    for cut in 0..good.len() {
        let _ = Model::load(&good[..cut]).and_then(|m| m.plan(2));
    }
    let mut m = tiny("Relu");
    let g = m.graph.as_mut().unwrap();
    g.initializer.push(proto::TensorProto {
        name: Some("w".into()),
        dims: vec![1 << 40, 1 << 40],
        data_type: Some(proto::DT_FLOAT),
        raw_data: Some(vec![0; 16]),
        ..Default::default()
    });
    g.node[0].input.push("w".into());
    let err = Model::load(&m.encode_to_vec()).unwrap().plan(1).unwrap_err();
    assert!(matches!(err, GraphError::Model(_)), "{err}");
    let mut wrong_len = tiny("Relu");
    let g = wrong_len.graph.as_mut().unwrap();
    g.initializer.push(proto::TensorProto {
        name: Some("w".into()),
        dims: vec![4],
        data_type: Some(proto::DT_FLOAT),
        raw_data: Some(vec![0; 15]),
        ..Default::default()
    });
    assert!(Model::load(&wrong_len.encode_to_vec()).unwrap().plan(1).is_err());
    assert!(proto::decode_model(&vec![0u8; proto::MAX_MODEL_BYTES + 1]).is_err());
}
