//! Finding the CUDA driver and NVRTC libraries of CUDA 12 or 13 (issue 51
//! item 2), and saying exactly what is missing when they are not there.
//!
//! cudarc (built with the `cuda-13000` bindings) opens its libraries by
//! bare name (`libcuda.so.1`, `libnvrtc.so.13`, `libnvrtc.so.12`, ...)
//! through the dynamic loader's search path. This module looks for the
//! files itself, in folders it can name in an error, and opens the ones it
//! chose by full path first: the loader then answers cudarc's bare-name
//! open with the library already resident (glibc matches a loaded
//! library's `DT_SONAME`), so a folder outside `LD_LIBRARY_PATH` (the
//! machine's PyTorch wheels keep NVRTC in `site-packages/nvidia/.../lib`)
//! works, and the NVRTC chosen is the one that suits the driver.
//!
//! Where it looks: the folders of `SYMPHONY_CUDA_LIB_DIRS` (colon
//! separated) and nothing else when that is set; otherwise
//! `LD_LIBRARY_PATH`'s folders and then [`STANDARD_DIRS`].
//!
//! Which NVRTC: the newest major version the driver can run the PTX of
//! (NVRTC 13 emits PTX that a CUDA 12 driver refuses; a CUDA 13 driver
//! runs NVRTC 12's PTX), so [`choose_nvrtc`] takes the highest major not
//! above the driver's. Discovery itself never loads anything: it is tested
//! with empty files in temporary folders.

use std::ffi::OsStr;
use std::fmt;
use std::path::{Path, PathBuf};

/// The variable that replaces the default search folders.
pub const LIB_DIRS_ENV: &str = "SYMPHONY_CUDA_LIB_DIRS";

/// Where distributions, the CUDA toolkit and WSL put the libraries.
pub const STANDARD_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/cuda/lib64",
    "/usr/local/cuda/targets/x86_64-linux/lib",
    "/usr/lib/wsl/lib",
];

/// The driver library's names, preferred first (`.so.1` is the runtime
/// name every driver installs; the bare `.so` only comes with dev files).
pub const DRIVER_NAMES: &[&str] = &["libcuda.so.1", "libcuda.so"];

/// The NVRTC versions this build can drive, newest first, with the file
/// name of each.
pub const NVRTC_VERSIONS: &[(u32, &str)] = &[(13, "libnvrtc.so.13"), (12, "libnvrtc.so.12")];

/// One NVRTC library found on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvrtcFile {
    /// Its CUDA major version (from the file name).
    pub major: u32,
    /// Where it is.
    pub path: PathBuf,
}

/// What a search found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Found {
    /// The first driver library in search order.
    pub driver: Option<PathBuf>,
    /// Every NVRTC library, in search order.
    pub nvrtc: Vec<NvrtcFile>,
    /// The folders searched, in order.
    pub searched: Vec<PathBuf>,
}

/// The libraries are missing (or unusable): what, and where it looked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingCudaLibs {
    /// Each missing or unusable piece, in words naming the files wanted.
    pub missing: Vec<String>,
    /// Whether the driver library is among them (NVRTC alone may be).
    pub driver_missing: bool,
    /// The folders searched, in order.
    pub searched: Vec<PathBuf>,
}

impl fmt::Display for MissingCudaLibs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}; searched ", self.missing.join("; "))?;
        if self.searched.is_empty() {
            write!(f, "no folder")?;
        }
        for (i, dir) in self.searched.iter().enumerate() {
            let sep = if i == 0 { "" } else { ":" };
            write!(f, "{sep}{}", dir.display())?;
        }
        write!(
            f,
            " (set {LIB_DIRS_ENV} to the folders holding them, or LD_LIBRARY_PATH)"
        )
    }
}

impl std::error::Error for MissingCudaLibs {}

/// The message for an absent driver (its wording is what the daemon tests
/// and operators look for).
pub fn no_driver_message() -> String {
    format!(
        "no CUDA driver library (libcuda: {})",
        DRIVER_NAMES.join(" or ")
    )
}

/// The message for an absent NVRTC.
pub fn no_nvrtc_message() -> String {
    let names: Vec<&str> = NVRTC_VERSIONS.iter().map(|(_, n)| *n).collect();
    format!("no NVRTC library (libnvrtc: {})", names.join(" or "))
}

/// The folders to search: `lib_dirs` (the value of [`LIB_DIRS_ENV`]) alone
/// when given and not empty, else `ld_library_path`'s then
/// [`STANDARD_DIRS`]. Empty entries are dropped, duplicates kept once.
pub fn search_dirs(lib_dirs: Option<&OsStr>, ld_library_path: Option<&OsStr>) -> Vec<PathBuf> {
    let split = |v: &OsStr| -> Vec<PathBuf> {
        std::env::split_paths(v)
            .filter(|p| !p.as_os_str().is_empty())
            .collect()
    };
    let mut dirs = match lib_dirs.filter(|v| !v.is_empty()) {
        Some(v) => split(v),
        None => {
            let mut d = ld_library_path.map(split).unwrap_or_default();
            d.extend(STANDARD_DIRS.iter().map(PathBuf::from));
            d
        }
    };
    let mut seen = Vec::with_capacity(dirs.len());
    dirs.retain(|d| {
        if seen.contains(d) {
            false
        } else {
            seen.push(d.clone());
            true
        }
    });
    dirs
}

/// The folders this process searches (from its environment).
pub fn env_search_dirs() -> Vec<PathBuf> {
    search_dirs(
        std::env::var_os(LIB_DIRS_ENV).as_deref(),
        std::env::var_os("LD_LIBRARY_PATH").as_deref(),
    )
}

/// Looks for the libraries' files in `dirs` (no loading).
pub fn find(dirs: &[PathBuf]) -> Found {
    let file = |dir: &Path, name: &str| {
        let p = dir.join(name);
        p.is_file().then_some(p)
    };
    let driver = dirs
        .iter()
        .find_map(|d| DRIVER_NAMES.iter().find_map(|n| file(d, n)));
    let nvrtc = dirs
        .iter()
        .flat_map(|d| {
            NVRTC_VERSIONS
                .iter()
                .filter_map(move |&(major, n)| file(d, n).map(|path| NvrtcFile { major, path }))
        })
        .collect();
    Found {
        driver,
        nvrtc,
        searched: dirs.to_vec(),
    }
}

/// The NVRTC to use with a driver of CUDA major `driver_major` (`None`:
/// unknown, take the newest): the highest major not above the driver's,
/// the first found of that major.
pub fn choose_nvrtc(nvrtc: &[NvrtcFile], driver_major: Option<u32>) -> Option<&NvrtcFile> {
    let usable = |f: &&NvrtcFile| driver_major.is_none_or(|d| f.major <= d);
    let best = nvrtc.iter().filter(usable).map(|f| f.major).max()?;
    nvrtc.iter().find(|f| f.major == best)
}

/// The chosen pair, or the error naming every missing piece.
pub fn choose(
    found: &Found,
    driver_major: Option<u32>,
) -> Result<(PathBuf, NvrtcFile), MissingCudaLibs> {
    match (&found.driver, choose_nvrtc(&found.nvrtc, driver_major)) {
        (Some(d), Some(n)) => Ok((d.clone(), n.clone())),
        (_, nvrtc) => Err(missing(found, nvrtc.is_some(), driver_major)),
    }
}

/// The error for what `found` lacks (`nvrtc_usable`: an NVRTC was chosen).
fn missing(found: &Found, nvrtc_usable: bool, driver_major: Option<u32>) -> MissingCudaLibs {
    let mut missing = Vec::new();
    if found.driver.is_none() {
        missing.push(no_driver_message());
    }
    if !nvrtc_usable {
        if found.nvrtc.is_empty() {
            missing.push(no_nvrtc_message());
        } else {
            let have: Vec<String> = found
                .nvrtc
                .iter()
                .map(|f| f.path.display().to_string())
                .collect();
            missing.push(format!(
                "no NVRTC the CUDA {} driver can run the code of (found only {})",
                driver_major.unwrap_or(0),
                have.join(", ")
            ));
        }
    }
    MissingCudaLibs {
        missing,
        driver_missing: found.driver.is_none(),
        searched: found.searched.clone(),
    }
}

/// The CUDA major version of a `cuDriverGetVersion` value (13000 -> 13).
pub fn driver_major(version: i32) -> Option<u32> {
    u32::try_from(version)
        .ok()
        .filter(|&v| v > 0)
        .map(|v| v / 1000)
}

#[cfg(feature = "cuda")]
pub use loaded::{load, load_from, load_nvrtc_from, Loaded};

#[cfg(feature = "cuda")]
mod loaded {
    use std::path::{Path, PathBuf};
    use std::sync::OnceLock;

    use super::{choose, driver_major, env_search_dirs, find, missing, Found, MissingCudaLibs, NvrtcFile};

    /// The libraries this process uses, open for its whole life.
    #[derive(Debug)]
    pub struct Loaded {
        /// The driver library.
        pub driver: PathBuf,
        /// The NVRTC library and its major version.
        pub nvrtc: NvrtcFile,
        /// `cuDriverGetVersion` (e.g. 13000), 0 if the call failed.
        pub driver_version: i32,
    }

    static LOADED: OnceLock<Result<Loaded, MissingCudaLibs>> = OnceLock::new();

    fn open(
        path: &Path,
        what: &str,
        is_driver: bool,
        searched: &[PathBuf],
    ) -> Result<libloading::Library, MissingCudaLibs> {
        // SAFETY: opening a CUDA library runs its initialisers, which have
        // no preconditions; the handle is kept (leaked) for the process's
        // life so that nothing it returned dangles.
        unsafe { libloading::Library::new(path) }.map_err(|e| MissingCudaLibs {
            missing: vec![format!(
                "{what} {} could not be loaded: {e}",
                path.display()
            )],
            driver_missing: is_driver,
            searched: searched.to_vec(),
        })
    }

    /// Finds the libraries in `dirs` and opens them (uncached: [`load`]
    /// is the process's one answer).
    pub fn load_from(dirs: &[PathBuf]) -> Result<Loaded, MissingCudaLibs> {
        let found = find(dirs);
        // The driver first: its version picks the NVRTC. Without one,
        // report everything missing at once.
        let Some(driver) = found.driver.clone() else {
            let usable = !found.nvrtc.is_empty();
            return Err(missing(&found, usable, None));
        };
        let lib = open(&driver, "the CUDA driver library", true, &found.searched)?;
        let mut version: i32 = 0;
        // SAFETY: cuDriverGetVersion(int*) may be called before cuInit and
        // only writes the int it is given.
        let got = unsafe {
            lib.get::<unsafe extern "C" fn(*mut i32) -> i32>(b"cuDriverGetVersion\0")
                .map(|f| f(&mut version))
        };
        if !matches!(got, Ok(0)) {
            version = 0;
        }
        let (_, nvrtc) = choose(&found, driver_major(version))?;
        let nv = open(&nvrtc.path, "the NVRTC library", false, &found.searched)?;
        std::mem::forget(lib);
        std::mem::forget(nv);
        Ok(Loaded {
            driver,
            nvrtc,
            driver_version: version,
        })
    }

    /// Opens the newest NVRTC in `dirs` by path, without a driver (to
    /// compile kernels on a machine with no GPU: the NVRTC compile check),
    /// and its builtins library from the same folder first, which NVRTC
    /// opens by bare name (the PyPI wheels set no run path).
    pub fn load_nvrtc_from(dirs: &[PathBuf]) -> Result<NvrtcFile, MissingCudaLibs> {
        let found = find(dirs);
        let nvrtc = super::choose_nvrtc(&found.nvrtc, None)
            .cloned()
            .ok_or_else(|| missing(&Found { driver: Some(PathBuf::new()), ..found.clone() }, false, None))?;
        if let Some(dir) = nvrtc.path.parent() {
            let prefix = format!("libnvrtc-builtins.so.{}", nvrtc.major);
            let builtins = std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .filter_map(Result::ok)
                .map(|e| e.path())
                .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&prefix)));
            if let Some(b) = builtins {
                std::mem::forget(open(&b, "the NVRTC builtins library", false, &found.searched)?);
            }
        }
        std::mem::forget(open(&nvrtc.path, "the NVRTC library", false, &found.searched)?);
        Ok(nvrtc)
    }

    /// Finds and opens the driver and NVRTC once per process (see the
    /// module docs); later calls return the first answer.
    pub fn load() -> Result<&'static Loaded, MissingCudaLibs> {
        LOADED
            .get_or_init(|| load_from(&env_search_dirs()))
            .as_ref()
            .map_err(Clone::clone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh folder per test holding empty files of the given names.
    fn fake_dir(tag: &str, names: &[&str]) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("symphony-cudalibs-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for n in names {
            std::fs::write(dir.join(n), b"").unwrap();
        }
        dir
    }

    #[test]
    fn cuda_12_and_13_libraries_are_found_in_fake_folders() {
        let c12 = fake_dir("c12", &["libcuda.so.1", "libnvrtc.so.12"]);
        let c13 = fake_dir("c13", &["libcuda.so.1", "libnvrtc.so.13"]);
        let f12 = find(std::slice::from_ref(&c12));
        assert_eq!(f12.driver, Some(c12.join("libcuda.so.1")));
        let (_, n12) = choose(&f12, Some(12)).unwrap();
        assert_eq!(
            (n12.major, n12.path.clone()),
            (12, c12.join("libnvrtc.so.12"))
        );
        let f13 = find(std::slice::from_ref(&c13));
        let (_, n13) = choose(&f13, Some(13)).unwrap();
        assert_eq!(
            (n13.major, n13.path.clone()),
            (13, c13.join("libnvrtc.so.13"))
        );
        // Unknown driver version: the newest NVRTC.
        assert_eq!(choose(&f13, None).unwrap().1.major, 13);
        for d in [c12, c13] {
            std::fs::remove_dir_all(d).unwrap();
        }
    }

    #[test]
    fn the_nvrtc_chosen_is_the_newest_the_driver_can_run() {
        // NVRTC 13 in the first folder, 12 in the second, driver in a third.
        let a = fake_dir("a", &["libnvrtc.so.13"]);
        let b = fake_dir("b", &["libnvrtc.so.12"]);
        let c = fake_dir("c", &["libcuda.so"]);
        let found = find(&[a.clone(), b.clone(), c.clone()]);
        assert_eq!(found.driver, Some(c.join("libcuda.so")));
        assert_eq!(found.nvrtc.len(), 2);
        assert_eq!(
            choose(&found, Some(13)).unwrap().1.path,
            a.join("libnvrtc.so.13")
        );
        // A CUDA 12 driver cannot run NVRTC 13's PTX: the 12 one.
        assert_eq!(
            choose(&found, Some(12)).unwrap().1.path,
            b.join("libnvrtc.so.12")
        );
        // A CUDA 11 driver: neither, and the error says which were found.
        let err = choose(&found, Some(11)).unwrap_err();
        assert_eq!(err.missing.len(), 1);
        assert!(err.missing[0].contains("CUDA 11 driver"), "{err}");
        assert!(err.missing[0].contains("libnvrtc.so.13"), "{err}");
        for d in [a, b, c] {
            std::fs::remove_dir_all(d).unwrap();
        }
    }

    #[test]
    fn a_missing_library_is_named_with_the_folders_searched() {
        let only_driver = fake_dir("drv", &["libcuda.so.1", "libnvrtc.so.11"]);
        let empty = fake_dir("empty", &[]);
        let err = choose(&find(&[only_driver.clone(), empty.clone()]), Some(13)).unwrap_err();
        let text = err.to_string();
        assert_eq!(err.missing, vec![no_nvrtc_message()]);
        assert!(text.contains("libnvrtc.so.13 or libnvrtc.so.12"), "{text}");
        assert!(!text.contains("libcuda"), "the driver is there: {text}");
        let both = format!("{}:{}", only_driver.display(), empty.display());
        assert!(text.contains(&both), "{text}");
        assert!(text.contains(LIB_DIRS_ENV), "{text}");
        let err = choose(&find(std::slice::from_ref(&empty)), None).unwrap_err();
        assert_eq!(err.missing, vec![no_driver_message(), no_nvrtc_message()]);
        assert!(err
            .to_string()
            .starts_with("no CUDA driver library (libcuda: libcuda.so.1 or libcuda.so); no NVRTC"));
        // A folder that does not exist is searched and named, not an error.
        let gone = empty.join("gone");
        let err = choose(&find(std::slice::from_ref(&gone)), None).unwrap_err();
        assert!(err.to_string().contains(&gone.display().to_string()));
        for d in [only_driver, empty] {
            std::fs::remove_dir_all(d).unwrap();
        }
    }

    #[test]
    fn the_configured_folders_replace_the_default_search() {
        let dirs = search_dirs(Some(OsStr::new("/x::/y:/x")), Some(OsStr::new("/ld")));
        assert_eq!(dirs, vec![PathBuf::from("/x"), PathBuf::from("/y")]);
        let dirs = search_dirs(Some(OsStr::new("")), Some(OsStr::new("/ld:/usr/lib64")));
        assert_eq!(dirs[0], PathBuf::from("/ld"));
        assert_eq!(dirs.len(), 1 + STANDARD_DIRS.len(), "{dirs:?}");
        assert_eq!(search_dirs(None, None).len(), STANDARD_DIRS.len());
    }

    /// Files that are found but are not libraries: the error says which
    /// one could not be loaded and why, with no panic.
    #[cfg(feature = "cuda")]
    #[test]
    fn found_files_that_do_not_load_are_a_clear_error() {
        let dir = fake_dir("bad", &["libcuda.so.1", "libnvrtc.so.13"]);
        let err = load_from(std::slice::from_ref(&dir)).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("the CUDA driver library"), "{text}");
        assert!(
            text.contains(&dir.join("libcuda.so.1").display().to_string()),
            "{text}"
        );
        assert!(text.contains("could not be loaded"), "{text}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn driver_versions_map_to_their_major() {
        assert_eq!(driver_major(13000), Some(13));
        assert_eq!(driver_major(12040), Some(12));
        assert_eq!(driver_major(0), None);
        assert_eq!(driver_major(-1), None);
    }
}
