//! The CUDA executor (feature `cuda`). On a host without a driver (the
//! development machine) construction must fail cleanly with
//! `CudaLibraries`, naming what is missing; on a host with one, a real batch must produce the same
//! bytes as `backend::output`: without a GPU that test is a capability skip
//! (tests/capability-skips.txt).

#![cfg(feature = "cuda")]

#[path = "../../tests/lib/require.rs"]
mod require;

use backend::exec::cuda::{driver_present, gpu_present, nvrtc_present};
use backend::exec::{ExecError, ExecModel, Executor, Finished, InputRef, Job, OutputRef};
use backend::output::expected_output;
use backend::CudaExecutor;
use dataplane::mem::Region;
use dataplane::time::{Instant, MonotonicClock};
use scheduler::profile::LatencyProfile;

fn models() -> Vec<ExecModel> {
    vec![ExecModel {
        profile: LatencyProfile::linear(0.1, 1.0, 64).unwrap(),
        output_len: 40,
    }]
}

#[test]
fn without_a_driver_construction_reports_no_cuda_driver() {
    let staging = Region::anonymous(1 << 20).unwrap();
    match CudaExecutor::new(&[0], staging, 16, 256, 64, models()) {
        Err(ExecError::CudaLibraries(missing)) => {
            assert!(
                !nvrtc_present(),
                "CudaLibraries only when a library is missing"
            );
            assert_eq!(missing.driver_missing, !driver_present());
            let text = missing.to_string();
            assert!(text.contains("searched"), "{text}");
            eprintln!("no CUDA libraries on this host: clean error, as required: {text}");
        }
        Err(e @ ExecError::Cuda { .. }) => {
            assert!(
                nvrtc_present() && !gpu_present(),
                "a driver error with a GPU present: {e}"
            );
            eprintln!("CUDA libraries but no usable device: clean error: {e}");
        }
        Err(e) => panic!("unexpected error: {e}"),
        Ok(exec) => {
            assert!(driver_present());
            drop(exec);
        }
    }
}

#[test]
fn a_real_batch_matches_the_reference_output_when_a_gpu_exists() {
    if !require::capability(
        "gpu",
        gpu_present(),
        "no CUDA driver (libcuda), NVRTC (libnvrtc 12 or 13) or device on this host",
    ) {
        return;
    }
    let staging = Region::anonymous(1 << 20).unwrap();
    let mut exec = match CudaExecutor::new(&[0], staging.clone(), 16, 256, 64, models()) {
        Ok(e) => e,
        Err(e) => panic!("driver present but executor failed: {e}"),
    };
    let inputs: Vec<InputRef> = (0..5u64)
        .map(|i| {
            let bytes: Vec<u8> = (0..(10 + i * 30)).map(|j| (j * 7 + i) as u8).collect();
            staging.write_at(i * 256, &bytes).unwrap();
            InputRef {
                offset: i * 256,
                len: bytes.len() as u32,
            }
        })
        .collect();
    let clock = MonotonicClock::new();
    let job = Job {
        tag: 1,
        device: 0,
        model: 0,
        exec_at: Instant::ZERO,
        inputs: &inputs,
        output: OutputRef {
            offset: 1 << 19,
            stride: 64,
        },
    };
    exec.submit(clock.now(), &job).unwrap();
    assert!(matches!(
        exec.submit(clock.now(), &job),
        Err(ExecError::DeviceBusy { device: 0 })
    ));
    let mut out = [Finished::default(); 1];
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while exec.poll(clock.now(), &mut out) == 0 {
        assert!(std::time::Instant::now() < until, "batch did not finish");
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
    assert!(out[0].ok);
    for (i, input) in inputs.iter().enumerate() {
        let mut src = vec![0u8; input.len as usize];
        staging.read_at(input.offset, &mut src).unwrap();
        let mut want = [0u8; 40];
        expected_output(0, &src, &mut want);
        let mut got = [0u8; 40];
        staging
            .read_at((1 << 19) + i as u64 * 64, &mut got)
            .unwrap();
        assert_eq!(got, want, "output {i}");
    }
}
