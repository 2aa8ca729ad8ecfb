#!/usr/bin/env bash
# The project's test command: the README's second line, and exactly what .ci/run runs.
#   1. system packages (scripts/setup.sh)
#   2. clippy, warnings as errors, with and without the rdma and cuda features
#   3. every unit, property and integration test of the workspace (release build: the
#      simulator and runtime tests run real workloads), in one release build with the
#      rdma, cuda and mutations features: the deterministic cluster harness (`symphony
#      chaos`: 1000 seeds per fault class) and its mutation tests, the cuda executor's
#      no-driver path
#   4. loom model checking of the SPSC ring's memory ordering
#   5. a client this project did not write: Triton's tritonclient (PyPI) runs health,
#      metadata and infer calls against the frontend's HTTP server, in process and then
#      against the real daemons (`symphony up --serve`: scheduler, two frontends and two
#      emulated-GPU backends as processes), which must then shut down cleanly on Ctrl-C
#   5b. Triton's perf_analyzer unchanged over HTTP and gRPC against `symphony up --serve`
#      (tests/perf_analyzer.sh: concurrency 4, ~10 s each, 0 errors, infer/s within 5% of /stats)
#   6. real models: scripts/fetch-models.sh (or the models already in models/) for the ONNX
#      executor's tests in step 3 (required then: SYMPHONY_ONNX_REQUIRED=1), and
#      tests/onnx_daemons.sh (real inference through the daemons, bad inputs, a broken model)
#   7. real RDMA verbs: the transport conformance suite, >=1000 queue pairs, the whole
#      cluster over verbs (symphony up --transport rdma, HTTP requests, READ count) and a
#      cross-guest READ inside Soft-RoCE QEMU guests (tests/softroce/ci.sh)
#   8. deploy/: the Kubernetes manifests against a pinned Kubernetes version, offline
#      (tests/deploy_validate.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
# Every build below shares one target directory (the caller's, if set).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
# Release builds here are for tests, not profiling: no line tables (the
# workspace's release profile keeps them for perf), which shortens every
# release compile and link of this script. A caller's setting wins.
export CARGO_PROFILE_RELEASE_DEBUG="${CARGO_PROFILE_RELEASE_DEBUG:-0}"
# The features of the one release build of the workspace (the test step), which every
# later `cargo build --release -p tools --bin symphony` and tests/softroce/ci.sh repeat so
# that they reuse its artifacts: symphony with the rdma transport (runs in the Soft-RoCE
# guests; elsewhere `--transport rdma` says no device), the cuda executor (compiled, and
# its no-driver path tested: no GPU here) and the harness's deliberate bugs (inert unless
# tools/tests/mutations.rs switches one on). One build for all three: each feature set
# of its own rebuilt dataplane or backend and everything above it (~1.5 min each).
export RELEASE_FEATURES="${RELEASE_FEATURES:---features dataplane/rdma,backend/cuda,tools/mutations}"
# ... and the command itself, for the steps after it that need release binaries (symphony,
# the tritonclient example server, the rdma test binary): `cargo build -p tools` alone
# would unify dependency features without the workspace's dev-dependencies (bitflags'
# `std`, ...) and so rebuild dataplane and everything above it once more.
export RELEASE_BUILD="${RELEASE_BUILD:-cargo test --workspace --release $RELEASE_FEATURES --no-run}"
step() { echo "== $* ($(date -u +%H:%M:%S))" >&2; }
step setup
bash scripts/setup.sh
step clippy
cargo clippy --workspace --all-targets -- -D warnings
# The feature-gated code, in one pass (each feature's own pass rechecked the crates above it).
cargo clippy --workspace --all-targets --features dataplane/rdma,dataplane/loom,backend/cuda,tools/mutations -- -D warnings
step deploy-validate
bash tests/deploy_validate.sh
step onnx-models
if .venv/bin/python -c "import onnxruntime" 2>/dev/null && bash scripts/fetch-models.sh; then
  export SYMPHONY_ONNX_REQUIRED=1
else
  echo "SKIPPED: the onnxruntime wheel or the models could not be installed; ONNX tests skip" >&2
fi
step tests
# The chaos harness (tools/tests/chaos.rs, 1000 seeds per fault class; CHAOS_SEEDS=N for a
# longer soak) and its mutation tests (tools/tests/mutations.rs: each deliberate bug caught
# within 100 seeds, its replay failing) run here with the rest.
# shellcheck disable=SC2086
cargo test --workspace --release $RELEASE_FEATURES
step loom
# Only dataplane is rebuilt (with loom's atomics); its dependencies are the test step's.
# shellcheck disable=SC2086
cargo test --workspace --release $RELEASE_FEATURES --features dataplane/loom --test loom_ring
step tritonclient
bash tools/tests/python/run.sh
bash tests/tritonclient_daemons.sh
step perf-analyzer
bash tests/perf_analyzer.sh
step onnx-daemons
bash tests/onnx_daemons.sh
step soft-roce
bash tests/softroce/ci.sh
step done
