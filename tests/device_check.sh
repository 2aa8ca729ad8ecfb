#!/usr/bin/env bash
# scripts/device-check.sh in CI (issue 51 item 3; no GPU needed): --dry-run lists every step and
# every file; --prepare packs a bundle (from the release build of the test step, so no rebuild)
# that --check finds intact and within 64 MiB, and --check refuses it under a 1 MiB limit and
# after a file in it changed.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
. "$root/tests/lib/require.sh"
# The reference outputs come from onnxruntime in .venv, installable anywhere (scripts/setup.sh).
require tests/device_check.sh onnx-runtime \
    "the onnxruntime and numpy wheels in $root/.venv (scripts/setup.sh installs them)" \
    "$root/.venv/bin/python" -c "import onnxruntime, numpy" || exit 0
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export SYMPHONY_DEVICE_BUNDLE="$tmp/bundle"
fail() { echo "FAIL tests/device_check.sh: $*" >&2; exit 1; }

dry="$(bash "$root/scripts/device-check.sh" --dry-run)"
for step in env a b c d e; do
    grep -qE "^step $step +timeout +[0-9]+s " <<<"$dry" || fail "--dry-run lacks step $step: $dry"
done
grep -q 'bench-cluster .*--pin-cores' <<<"$dry" || fail "--dry-run's bench-cluster pins no cores"
for f in bin/symphony tests/cuda tests/cuda_h2d tests/graph_cuda models/open_nsfw/1/model.onnx reference/ppocr_cls MANIFEST; do
    grep -q "^file $f" <<<"$dry" || fail "--dry-run lists no $f"
done

bash "$root/scripts/device-check.sh" --prepare >"$tmp/prepare.out" || fail "--prepare failed"
read -r _ total <"$tmp/prepare.out"
[ "$total" -le $((64 * 1024 * 1024)) ] || fail "bundle of $total bytes over 64 MiB"
b="$SYMPHONY_DEVICE_BUNDLE"
for f in bin/symphony bin/symphony-backend tests/cuda tests/cuda_h2d tests/graph_cuda tests/daemon tests/lib; do
    [ -x "$b/$f" ] || fail "bundle lacks executable $f"
done
# The test binaries are the backend's with the cuda feature: they list the GPU tests.
grep -q '^registered_staging_copies_faster_than_pageable_memory_on_a_gpu: test' \
    <<<"$("$b/tests/cuda_h2d" --list 2>/dev/null)" || fail "tests/cuda_h2d is not the H2D test binary"
grep -q '^a_kind_gpu_model_runs_on_the_graph_engine_or_setup_fails_cleanly: test' \
    <<<"$("$b/tests/graph_cuda" --list 2>/dev/null)" || fail "tests/graph_cuda is not the graph engine's GPU test binary"
grep -q 'cuda_libs::tests::' <<<"$("$b/tests/lib" --list 2>/dev/null)" || fail "tests/lib lacks cuda_libs' tests"
grep -q '^cuda_executor_on_a_gpu_initialises_before_it_needs_the_scheduler: test' \
    <<<"$("$b/tests/daemon" --list 2>/dev/null)" || fail "tests/daemon is not the backend's daemon test binary"
for m in ppocr_cls open_nsfw; do
    for f in input.bin output.bin meta.txt; do [ -s "$b/reference/$m/$f" ] || fail "no reference/$m/$f"; done
    grep -q '^input .* float32 ' "$b/reference/$m/meta.txt" || fail "reference/$m/meta.txt names no input"
done
dry="$(bash "$root/scripts/device-check.sh" --dry-run)"
grep -qE '^file tests/cuda +[0-9]+ bytes' <<<"$dry" || fail "--dry-run of a prepared bundle lists no sizes"
bash "$root/scripts/device-check.sh" --check >/dev/null || fail "--check refused a fresh bundle"
if SYMPHONY_DEVICE_LIMIT_MIB=1 bash "$root/scripts/device-check.sh" --check 2>"$tmp/err" >/dev/null; then
    fail "--check passed a $total-byte bundle under a 1 MiB limit"
fi
grep -q 'over the 1 MiB' "$tmp/err" || fail "the size error does not say so: $(cat "$tmp/err")"
printf 'x' >>"$b/reference/ppocr_cls/meta.txt"
if bash "$root/scripts/device-check.sh" --check 2>"$tmp/err" >/dev/null; then
    fail "--check passed a changed bundle"
fi
grep -q 'reference/ppocr_cls/meta.txt is missing or differs' "$tmp/err" || fail "$(cat "$tmp/err")"
echo "device_check: --dry-run lists 6 steps, --prepare packed $total bytes (<= 64 MiB), --check verified and refused"
