//! H2D copy bandwidth on a real GPU (issue 51 item 3c): from the registered
//! staging region and from pageable memory, at the batch sizes the two real
//! models use (ppocr_cls: FP32 [3,48,192] per input, batches 1..16;
//! open_nsfw: FP32 [224,224,3], batches 1..8), beside the link's peak.
//! A capability skip without a GPU (tests/capability-skips.txt).
//!
//! With `SYMPHONY_DEVICE_OUT` set (scripts/device-check.sh) the figures go
//! to `$SYMPHONY_DEVICE_OUT/h2d.csv` and the link to `h2d-link.txt`.

#![cfg(feature = "cuda")]

#[path = "../../tests/lib/require.rs"]
mod require;

use std::fmt::Write as _;

use backend::exec::cuda::gpu_present;
use backend::exec::cuda_h2d::{measure, pci_bus_id, read_link};

/// (model, bytes per input, batch sizes) of the fetched models.
const MODELS: &[(&str, usize, &[usize])] = &[
    ("ppocr_cls", 3 * 48 * 192 * 4, &[1, 4, 8, 16]),
    ("open_nsfw", 224 * 224 * 3 * 4, &[1, 2, 4, 8]),
];
/// Copies per size: enough for a stable mean, few enough for seconds.
const REPS: u32 = 50;

#[test]
fn registered_staging_copies_faster_than_pageable_memory_on_a_gpu() {
    if !require::capability(
        "gpu",
        gpu_present(),
        "no GPU with its CUDA 12/13 driver and NVRTC here",
    ) {
        return;
    }
    let sizes: Vec<usize> = MODELS
        .iter()
        .flat_map(|(_, per, batches)| batches.iter().map(move |b| per * b))
        .collect();
    let samples = measure(0, &sizes, REPS).expect("measure H2D on GPU 0");
    assert_eq!(samples.len(), sizes.len());
    let link = read_link(
        std::path::Path::new("/sys/bus/pci/devices"),
        &pci_bus_id(0).unwrap(),
    );
    let mut csv = String::from("model,batch,bytes,reps,pinned_gb_s,pageable_gb_s,link_peak_gb_s\n");
    let peak = link
        .peak_bytes_per_s
        .map_or(String::from("unknown"), |p| format!("{:.2}", p / 1e9));
    let mut i = 0;
    for (model, per, batches) in MODELS {
        for b in batches.iter() {
            let s = samples[i];
            i += 1;
            assert_eq!(s.bytes, per * b);
            let _ = writeln!(
                csv,
                "{model},{b},{},{},{:.3},{:.3},{peak}",
                s.bytes,
                s.reps,
                s.pinned_bytes_per_s / 1e9,
                s.pageable_bytes_per_s / 1e9
            );
            assert!(s.pinned_bytes_per_s > 0.0 && s.pageable_bytes_per_s > 0.0);
            if let Some(p) = link.peak_bytes_per_s {
                // Above the link's peak is a timing bug, not a fast link.
                assert!(s.pinned_bytes_per_s < p * 1.05, "{s:?} over the peak {p}");
            }
        }
    }
    eprintln!("{csv}{link:?}");
    // Page-locked memory is DMA'd directly: at the largest size it must
    // beat the driver's bounce-buffered pageable path.
    let largest = samples.iter().max_by_key(|s| s.bytes).unwrap();
    assert!(
        largest.pinned_bytes_per_s > largest.pageable_bytes_per_s,
        "pinned not faster than pageable: {largest:?}"
    );
    if let Some(out) = std::env::var_os("SYMPHONY_DEVICE_OUT") {
        let out = std::path::PathBuf::from(out);
        std::fs::write(out.join("h2d.csv"), csv).unwrap();
        std::fs::write(out.join("h2d-link.txt"), format!("{link:#?}\n")).unwrap();
    }
}
