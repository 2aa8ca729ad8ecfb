#!/usr/bin/env bash
# The project's test command: the README's second line, and exactly what .ci/run runs.
# Strict under CI=true (.ci/run sets it) or SYMPHONY_STRICT=1: a missing dependency or a
# skipped test fails, naming what is missing, except the capability skips listed in
# tests/capability-skips.txt (a GPU, an RDMA device on the host), which print CAPABILITY-SKIP
# and are counted at the end (tests/lib/require.sh, tests/lib/require.rs).
#   1. system packages (scripts/setup.sh); the capability-skip list and its helpers checked
#      (tests/lib/require_test.sh)
#   2. clippy, warnings as errors, with and without the rdma and cuda features
#   3. every unit, property and integration test of the workspace (release build: the
#      simulator and runtime tests run real workloads), in one release build with the
#      rdma, cuda and mutations features: the deterministic cluster harness (`symphony
#      chaos`: 1000 seeds per fault class) and its mutation tests, the cuda executor's
#      no-driver path (its GPU path: a capability skip without a GPU); then issue 17's 3x
#      overload run (`#[ignore]`d in plain cargo test, ~25 s)
#   4. loom model checking of the shared-memory ring's protocol (transport/shm_ring.rs); the fuzz targets
#      (tests/fuzz.sh)
#   5. a client this project did not write: Triton's tritonclient (PyPI) runs health,
#      metadata and infer calls against the frontend's HTTP server, in process and then
#      against the real daemons (`symphony up --serve`: scheduler, two frontends and two
#      emulated-GPU backends as processes), which must then shut down cleanly on Ctrl-C
#   5b. Triton's perf_analyzer unchanged over HTTP and gRPC against `symphony up --serve`
#      (tests/perf_analyzer.sh: concurrency 4, ~10 s each, 0 errors, infer/s within 5% of /stats)
#   6. real models: ONNX Runtime (scripts/setup.sh) and scripts/fetch-models.sh (or the models
#      already in models/) for the ONNX executor's tests in step 3 (required then:
#      SYMPHONY_ONNX_REQUIRED=1; under CI their absence fails this step), and
#      tests/onnx_daemons.sh (real inference through the daemons, bad inputs, a broken model)
#   7. real RDMA verbs: the transport conformance suite, >=1000 queue pairs, the whole
#      cluster over verbs (symphony up --transport rdma, HTTP requests, READ count) and a
#      cross-guest READ inside Soft-RoCE QEMU guests (tests/softroce/ci.sh)
#   8. deploy/: the Kubernetes manifests against a pinned Kubernetes version, offline
#      (tests/deploy_validate.sh); the docs' length and format (tests/docs_check.sh); the
#      code's shape against a shrink-only baseline (tests/structure)
#   9. the attack suite (tests/security/run.sh) and the container images end to end
#      (tests/container_e2e.sh)
# At the end (pass or fail) a summary counts the capability skips (and, outside CI, the
# SKIPPED tests) that the steps printed.
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
. tests/lib/require.sh
# Every CAPABILITY-SKIP / SKIPPED line of the steps below (shell and Rust helpers) lands here too.
SYMPHONY_SKIP_LOG="$(mktemp "${TMPDIR:-/tmp}/symphony-skips.XXXXXX")"
export SYMPHONY_SKIP_LOG
summary() {
  local st=$? caps skipped
  caps=$(grep -c '^CAPABILITY-SKIP ' "$SYMPHONY_SKIP_LOG" || true)
  skipped=$(grep -c '^SKIPPED ' "$SYMPHONY_SKIP_LOG" || true)
  local mode="outside CI: a missing dependency skips"
  require_strict && mode="strict (CI): a missing dependency fails"
  echo "== summary ($mode): exit $st; $caps capability skip(s) (tests/capability-skips.txt), $skipped skipped" >&2
  sed 's/^/   /' "$SYMPHONY_SKIP_LOG" >&2
  rm -f "$SYMPHONY_SKIP_LOG"
}
trap summary EXIT
step setup
bash scripts/setup.sh
step capability-skips
bash tests/lib/require_test.sh
step clippy
cargo clippy --workspace --all-targets -- -D warnings
# The feature-gated code, in one pass (each feature's own pass rechecked the crates above it).
cargo clippy --workspace --all-targets --features dataplane/rdma,dataplane/loom,backend/cuda,tools/mutations -- -D warnings
step deploy-validate
bash tests/deploy_validate.sh
step docs-check
bash tests/docs_check.sh
step structure
# File and function lengths, import loops and repeated code (tests/structure, issue 48),
# against tests/structure/baseline.txt, which may only shrink.
cargo run --release -q -p structure-check
step onnx-models
# Installable anywhere, so never a capability skip: under CI a missing piece fails here, named.
if require tests/run.sh onnx-runtime \
    "the onnxruntime wheel in .venv (scripts/setup.sh installs onnxruntime==1.31.1; see its log above)" \
    .venv/bin/python -c "import onnxruntime" &&
  require tests/run.sh onnx-runtime \
    "ONNX Runtime's library: SYMPHONY_ORT_DYLIB=${SYMPHONY_ORT_DYLIB:-} is not a file" \
    test -z "${SYMPHONY_ORT_DYLIB:-}" -o -f "${SYMPHONY_ORT_DYLIB:-}" &&
  require tests/run.sh onnx-models "the ONNX models of scripts/fetch-models.sh (its log above)" \
    bash scripts/fetch-models.sh; then
  export SYMPHONY_ONNX_REQUIRED=1
fi
step tests
# The chaos harness (tools/tests/chaos.rs, 1000 seeds per fault class; CHAOS_SEEDS=N for a
# longer soak) and its mutation tests (tools/tests/mutations.rs: each deliberate bug caught
# within 100 seeds, its replay failing) run here with the rest.
# shellcheck disable=SC2086
cargo test --workspace --release $RELEASE_FEATURES
step overload
# Issue 17's 3x overload run (tools/tests/serving/overload.rs), #[ignore]d in plain cargo test.
# shellcheck disable=SC2086
cargo test --workspace --release $RELEASE_FEATURES --test serving -- --ignored overload::
step device-check
# scripts/device-check.sh without a GPU (issue 51): --dry-run lists every step, --prepare packs
# the bundle for the GPU machine from the test step's build, at most 64 MiB.
bash tests/device_check.sh
step loom
# The shared-memory ring's protocol (transport/shm_ring.rs, generic over its atomics) run
# over loom's atomics and cells: ordering, byte races, lost wake-ups (~2 s of checking).
# Only dataplane's own dependencies are built, a few of them with other features than the
# test step's (about half a minute of compiling).
# A filter that matched nothing would pass: the step insists the four models ran (the ring's
# two, and the shm doorbell's two: two producers on one doorbell, a ring subscribed mid-write).
cargo test --release -p dataplane --features loom --lib shm_ring::loom_model 2>&1 \
  | tee /dev/stderr | grep '^test result: ok\. 4 passed' >/dev/null
step fuzz
bash tests/fuzz.sh
step tritonclient
bash tools/tests/python/run.sh
bash tests/tritonclient_daemons.sh
step perf-analyzer
bash tests/perf_analyzer.sh
step onnx-daemons
bash tests/onnx_daemons.sh
step soft-roce
bash tests/softroce/ci.sh
# netbench lat/bw next to perftest in one more guest: READ and SEND at 2 B and 64 KiB, one
# round, with the workspace build's netbench (its dataplane has verbs; WRITE needs netbench's
# own rdma feature, so it is skipped here). NETBENCH_FULL=1: READ, WRITE and SEND at 2 B, 4 KiB,
# 64 KiB and 1 MiB, 3 alternating rounds, with a netbench built --features rdma.
if [ "${NETBENCH_FULL:-0}" = 1 ]; then
  OUT="$CARGO_TARGET_DIR/netbench-perftest" bash netbench/scripts/softroce.sh perftest
else
  NETBENCH_BIN="$CARGO_TARGET_DIR/release/netbench" VERBS="read send" SIZES="2 65536" ROUNDS=1 \
    LAT_ITERS=300 BW_ITERS=300 OUT="$CARGO_TARGET_DIR/netbench-perftest" \
    bash netbench/scripts/softroce.sh perftest
fi
step security
bash tests/security/run.sh
step container-e2e
bash tests/container_e2e.sh
step "done"
