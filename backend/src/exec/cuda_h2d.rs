//! Host-to-device copy bandwidth from the page-locked staging region
//! against pageable memory, beside the PCIe link's peak (issue 51 item 3c).
//!
//! The staging region is registered with the driver exactly as
//! [`super::cuda::CudaExecutor`] registers it (`cuMemHostRegister`,
//! portable); the pageable source is an ordinary heap buffer of the same
//! size, which the driver stages through its own pinned bounce buffers.
//! Each size is copied `reps` times on one non-blocking stream and timed on
//! the host around the copies and a stream synchronise (one clock, no CUDA
//! event API, whose timing call differs between CUDA 12 and 13 bindings).
//! The link's peak comes from the device's PCI function in sysfs.

use std::ffi::c_void;
use std::path::Path;

use cudarc::driver::result::{self, stream::StreamKind};
use cudarc::driver::{sys, CudaContext};
use dataplane::mem::Region;

use super::cuda::cuda_err;
use super::{cuda_libs, ExecError};

/// One measured copy size.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct H2dSample {
    /// Bytes per copy.
    pub bytes: usize,
    /// Copies timed.
    pub reps: u32,
    /// From the registered (page-locked) staging region, bytes/s.
    pub pinned_bytes_per_s: f64,
    /// From pageable heap memory, bytes/s.
    pub pageable_bytes_per_s: f64,
}

/// The PCIe link of a GPU, read from sysfs.
#[derive(Clone, Debug, PartialEq)]
pub struct Link {
    /// The device's PCI address (as `cuDeviceGetPCIBusId` gives it).
    pub pci_bus_id: String,
    /// `current_link_speed` and `current_link_width`, as sysfs writes them.
    pub current: (String, String),
    /// `max_link_speed` and `max_link_width`.
    pub max: (String, String),
    /// The peak payload rate of the current link, bytes/s (`None`: not
    /// readable, say inside a VM that hides it).
    pub peak_bytes_per_s: Option<f64>,
}

/// The peak data rate of a PCIe link from sysfs's speed (`"32.0 GT/s PCIe"`)
/// and width (`"16"`), bytes/s per direction: transfers per second per lane
/// times lanes times the line code's efficiency (8b/10b up to 5 GT/s,
/// 128b/130b from 8 GT/s; 64 GT/s Gen 6 flits counted as 242/256) over 8
/// bits. Packet headers are not counted: a measured copy stays below it.
pub fn pcie_peak_bytes_per_s(speed: &str, width: &str) -> Option<f64> {
    let gts: f64 = speed.split_whitespace().next()?.parse().ok()?;
    let lanes: f64 = width.trim().parse().ok()?;
    if !(gts > 0.0 && gts <= 256.0 && (1.0..=32.0).contains(&lanes)) {
        return None;
    }
    let code = if gts <= 5.0 {
        8.0 / 10.0
    } else if gts < 64.0 {
        128.0 / 130.0
    } else {
        242.0 / 256.0
    };
    Some(gts * 1e9 * lanes * code / 8.0)
}

/// The link of the device with PCI address `pci_bus_id`, from `sysfs`
/// (normally `/sys/bus/pci/devices`).
pub fn read_link(sysfs: &Path, pci_bus_id: &str) -> Link {
    // sysfs names functions in lower case with a 4-digit domain; the driver
    // may give an 8-digit one ("00000000:1B:00.0").
    let id = pci_bus_id.trim().to_ascii_lowercase();
    let id = match id.split_once(':') {
        Some((dom, rest)) if dom.len() > 4 => format!("{}:{rest}", &dom[dom.len() - 4..]),
        _ => id,
    };
    let dir = sysfs.join(&id);
    let read = |name: &str| {
        std::fs::read_to_string(dir.join(name))
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    let current = (read("current_link_speed"), read("current_link_width"));
    let max = (read("max_link_speed"), read("max_link_width"));
    let peak_bytes_per_s = pcie_peak_bytes_per_s(&current.0, &current.1);
    Link {
        pci_bus_id: id,
        current,
        max,
        peak_bytes_per_s,
    }
}

/// The PCI address of GPU `ordinal`.
pub fn pci_bus_id(ordinal: usize) -> Result<String, ExecError> {
    cuda_libs::load().map_err(ExecError::CudaLibraries)?;
    result::init().map_err(cuda_err)?;
    let dev = result::device::get(ordinal as i32).map_err(cuda_err)?;
    let mut buf = [0 as std::ffi::c_char; 32];
    // SAFETY: the buffer holds 32 chars and its length is passed; the
    // driver writes a NUL-terminated string into it.
    unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, dev) }
        .result()
        .map_err(cuda_err)?;
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Measures each of `sizes` (bytes) `reps` times on GPU `ordinal` from a
/// registered region and from pageable memory (see the module docs).
pub fn measure(ordinal: usize, sizes: &[usize], reps: u32) -> Result<Vec<H2dSample>, ExecError> {
    cuda_libs::load().map_err(ExecError::CudaLibraries)?;
    let max = sizes.iter().copied().max().unwrap_or(0);
    if max == 0 || reps == 0 {
        return Err(ExecError::BadJob("no size or no repetition to measure"));
    }
    let ctx = CudaContext::new(ordinal).map_err(cuda_err)?;
    ctx.bind_to_thread().map_err(cuda_err)?;
    let staging =
        Region::anonymous(max).map_err(|e| ExecError::Cuda { what: "staging region", source: Box::new(e) })?;
    let pageable = vec![0x5au8; max];
    let stream = result::stream::create(StreamKind::NonBlocking).map_err(cuda_err)?;
    // SAFETY: a positive size in the bound context; freed below.
    let dst = match unsafe { result::malloc_sync(max) } {
        Ok(p) => p,
        Err(e) => {
            // SAFETY: created above in this context.
            let _ = unsafe { result::stream::destroy(stream) };
            return Err(cuda_err(e));
        }
    };
    // SAFETY: the region is a live mapping of `len()` bytes held until the
    // unregister below.
    let registered = unsafe {
        sys::cuMemHostRegister_v2(
            staging.as_ptr() as *mut c_void,
            staging.len(),
            sys::CU_MEMHOSTREGISTER_PORTABLE,
        )
    }
    .result();
    let timed = |src: *const u8, bytes: usize| -> Result<f64, ExecError> {
        // One untimed copy first: the first touch of a range costs more.
        for round in 0..2 {
            let n = if round == 0 { 1 } else { reps };
            let t0 = std::time::Instant::now();
            for _ in 0..n {
                // SAFETY: `src` points at `max >= bytes` readable bytes that
                // outlive the synchronise below; `dst` holds `max` bytes.
                unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, bytes, stream) }
                    .result()
                    .map_err(cuda_err)?;
            }
            // SAFETY: the stream belongs to the bound context.
            unsafe { sys::cuStreamSynchronize(stream) }
                .result()
                .map_err(cuda_err)?;
            if round == 1 {
                return Ok(bytes as f64 * f64::from(reps) / t0.elapsed().as_secs_f64());
            }
        }
        Ok(0.0)
    };
    let run = || -> Result<Vec<H2dSample>, ExecError> {
        registered.map_err(cuda_err)?;
        let mut out = Vec::with_capacity(sizes.len());
        for &bytes in sizes.iter().filter(|&&b| b > 0) {
            out.push(H2dSample {
                bytes,
                reps,
                pinned_bytes_per_s: timed(staging.as_ptr(), bytes)?,
                pageable_bytes_per_s: timed(pageable.as_ptr(), bytes)?,
            });
        }
        Ok(out)
    };
    let result = run();
    // SAFETY: everything below was created above in the bound context; the
    // stream is drained first so no copy still reads the sources.
    unsafe {
        let _ = sys::cuStreamSynchronize(stream);
        if registered.is_ok() {
            let _ = sys::cuMemHostUnregister(staging.as_ptr() as *mut c_void);
        }
        let _ = result::free_sync(dst);
        let _ = result::stream::destroy(stream);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pcie_peaks_follow_the_line_code_and_the_lanes() {
        let gb = |s, w| pcie_peak_bytes_per_s(s, w).map(|b| (b / 1e9 * 100.0).round() / 100.0);
        assert_eq!(gb("32.0 GT/s PCIe", "16"), Some(63.02)); // Gen 5 x16
        assert_eq!(gb("16.0 GT/s PCIe", "16"), Some(31.51)); // Gen 4 x16
        assert_eq!(gb("8.0 GT/s PCIe", "8"), Some(7.88)); // Gen 3 x8
        assert_eq!(gb("2.5 GT/s PCIe", "1"), Some(0.25)); // Gen 1 x1, 8b/10b
        for (s, w) in [
            ("Unknown", "16"),
            ("32.0 GT/s", "x"),
            ("", ""),
            ("0 GT/s", "16"),
            ("32 GT/s", "0"),
        ] {
            assert_eq!(pcie_peak_bytes_per_s(s, w), None, "{s:?} {w:?}");
        }
    }

    #[test]
    fn the_link_is_read_from_a_sysfs_folder() {
        let root = std::env::temp_dir().join(format!("symphony-sysfs-{}", std::process::id()));
        let dev = root.join("0000:1b:00.0");
        std::fs::create_dir_all(&dev).unwrap();
        for (f, v) in [
            ("current_link_speed", "32.0 GT/s PCIe\n"),
            ("current_link_width", "16\n"),
            ("max_link_speed", "32.0 GT/s PCIe\n"),
            ("max_link_width", "16\n"),
        ] {
            std::fs::write(dev.join(f), v).unwrap();
        }
        // The driver's 8-digit domain and upper case name the same function.
        let link = read_link(&root, "00000000:1B:00.0");
        assert_eq!(link.pci_bus_id, "0000:1b:00.0");
        assert_eq!(
            link.current,
            ("32.0 GT/s PCIe".to_string(), "16".to_string())
        );
        assert!(link
            .peak_bytes_per_s
            .is_some_and(|p| (p - 63.015e9).abs() < 1e7));
        // An unknown function: empty fields and no peak, no error.
        let none = read_link(&root, "0000:ff:00.0");
        assert_eq!(none.peak_bytes_per_s, None);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
