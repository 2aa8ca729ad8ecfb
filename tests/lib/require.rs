//! Strict CI for Rust tests (issue 47): a test that needs something this
//! host may lack asks [`capability`] first, and goes on only if it says so.
//!
//! - present: the test runs;
//! - absent, and `tests/capability-skips.txt` lists this test for this
//!   capability (a GPU, an RDMA device: what the CI machine kind cannot
//!   have): prints `CAPABILITY-SKIP <test>: <why>` and the test skips;
//! - absent otherwise, under `CI=true` (or `SYMPHONY_STRICT=1`): the test
//!   fails, naming what is missing;
//! - absent otherwise, outside CI: prints `SKIPPED <test>: ...` and skips.
//!
//! The list is compiled in, so it is the one place: a skip it does not name
//! cannot pass under CI. Each test crate that needs this includes it with
//! `#[path = "../../tests/lib/require.rs"] mod require;` (no crate depends
//! on another for it). The skip lines go straight to the process's stderr,
//! past libtest's capture, so that they show in CI's log for passing tests
//! too, and are appended to `$SYMPHONY_SKIP_LOG` when set (tests/run.sh
//! counts them there).

use std::io::Write;

/// `tests/capability-skips.txt`, compiled in (a change to it rebuilds the
/// tests that include this file). Every workspace crate sits one level
/// below the root.
const LIST: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/capability-skips.txt"
));

/// What a test does about one of its needs.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The need is met: run.
    Run,
    /// A listed capability skip: skip, printing `CAPABILITY-SKIP`.
    CapabilitySkip,
    /// Not listed, outside CI: skip, printing `SKIPPED`.
    Skip,
    /// Not listed, under CI: fail.
    Fail,
}

/// The verdict for `test` (`PATH::NAME`) needing `capability`, given the
/// list's text: pure, so that it is tested without the environment.
pub fn decide(list: &str, test: &str, capability: &str, present: bool, strict: bool) -> Verdict {
    if present {
        return Verdict::Run;
    }
    let declared =
        list_lines(list).any(|f| f.len() >= 3 && f[0] == "capability" && f[1] == capability);
    let file = test.split_once("::").map_or(test, |(file, _)| file);
    let listed = list_lines(list).any(|f| {
        f.len() == 3
            && f[0] == "skip"
            && f[2] == capability
            && (f[1] == test || f[1].strip_suffix("::*") == Some(file))
    });
    match (declared && listed, strict) {
        (true, _) => Verdict::CapabilitySkip,
        (false, false) => Verdict::Skip,
        (false, true) => Verdict::Fail,
    }
}

/// The list's non-comment lines, split into fields.
fn list_lines(list: &str) -> impl Iterator<Item = Vec<&str>> {
    list.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.split_whitespace().collect())
}

/// Whether missing dependencies fail: `CI=true` (what CI services set) or
/// `SYMPHONY_STRICT=1`.
pub fn strict() -> bool {
    let is = |name: &str, want: &[&str]| {
        std::env::var(name).is_ok_and(|v| want.contains(&v.to_ascii_lowercase().as_str()))
    };
    is("CI", &["true", "1"]) || is("SYMPHONY_STRICT", &["1", "true"])
}

/// Whether the calling test may go on: `present` says whether `capability`
/// is here, `why` what is missing and why the test needs it. Returns false
/// when the test is to skip (it returns at once); panics under CI when the
/// skip is not a listed capability skip. The test's name is the calling
/// file's path and libtest's name for the test (its thread's name).
#[track_caller]
pub fn capability(capability: &str, present: bool, why: &str) -> bool {
    let file = std::panic::Location::caller().file();
    let thread = std::thread::current();
    let test = format!("{file}::{}", thread.name().unwrap_or("?"));
    match decide(LIST, &test, capability, present, strict()) {
        Verdict::Run => true,
        Verdict::CapabilitySkip => {
            report(&format!("CAPABILITY-SKIP {test}: {why}"));
            false
        }
        Verdict::Skip => {
            report(&format!(
                "SKIPPED {test}: needs {capability}: {why} (under CI=true this fails: only tests/capability-skips.txt may skip)"
            ));
            false
        }
        Verdict::Fail => panic!(
            "{test} needs {capability}, which is missing: {why}. Under CI=true only the capability skips of \
             tests/capability-skips.txt may skip; install what is missing"
        ),
    }
}

/// One line to the process's stderr (not libtest's capture) and to
/// `$SYMPHONY_SKIP_LOG`. Best effort: a failed write changes no verdict.
fn report(line: &str) {
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
    if let Some(path) = std::env::var_os("SYMPHONY_SKIP_LOG") {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
        {
            // One write of one line (O_APPEND): concurrent tests do not interleave.
            let _ = f.write_all(format!("{line}\n").as_bytes());
        }
    }
}

#[cfg(test)]
mod require_tests {
    use super::{decide, Verdict};

    const LIST: &str = "# comment\ncapability gpu a GPU\ncapability rdma-device a device\n\
        skip a/tests/x.rs::needs_gpu gpu\nskip a/tests/r.rs::* rdma-device\nskip a/tests/y.rs::undeclared nic\n";

    #[test]
    fn require_runs_whatever_is_present_listed_or_not() {
        for strict in [false, true] {
            assert_eq!(
                decide(LIST, "a/tests/x.rs::needs_gpu", "gpu", true, strict),
                Verdict::Run
            );
            assert_eq!(
                decide(LIST, "a/tests/z.rs::other", "onnx-runtime", true, strict),
                Verdict::Run
            );
        }
    }

    #[test]
    fn require_capability_skips_only_the_listed_test_for_its_declared_capability() {
        for strict in [false, true] {
            assert_eq!(
                decide(LIST, "a/tests/x.rs::needs_gpu", "gpu", false, strict),
                Verdict::CapabilitySkip
            );
            assert_eq!(
                decide(
                    LIST,
                    "a/tests/r.rs::any::test",
                    "rdma-device",
                    false,
                    strict
                ),
                Verdict::CapabilitySkip
            );
        }
        // Another test, another capability, a prefix of the name, an undeclared capability:
        // not capability skips, so failures under CI and plain skips outside it.
        for (test, cap) in [
            ("a/tests/x.rs::needs_gpu_too", "gpu"),
            ("a/tests/x.rs::needs_gpu", "onnx-runtime"),
            ("a/tests/w.rs::needs_gpu", "gpu"),
            ("a/tests/r.rs::t", "gpu"),
            ("a/tests/y.rs::undeclared", "nic"),
        ] {
            assert_eq!(
                decide(LIST, test, cap, false, true),
                Verdict::Fail,
                "{test} {cap}"
            );
            assert_eq!(
                decide(LIST, test, cap, false, false),
                Verdict::Skip,
                "{test} {cap}"
            );
        }
    }

    #[test]
    fn require_reads_the_real_list_and_it_declares_the_gpu() {
        assert_eq!(
            decide(
                super::LIST,
                "backend/tests/cuda.rs::a_real_batch_matches_the_reference_output_when_a_gpu_exists",
                "gpu",
                false,
                true
            ),
            Verdict::CapabilitySkip
        );
        assert_eq!(
            decide(
                super::LIST,
                "backend/tests/onnx.rs::t",
                "onnx-runtime",
                false,
                true
            ),
            Verdict::Fail
        );
    }
}
