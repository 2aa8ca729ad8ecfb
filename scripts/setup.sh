#!/usr/bin/env bash
# Installs the system packages the build and the tests need (Debian/Ubuntu, as root).
# Idempotent: installs only what is missing. The Rust toolchain itself comes with the machine.
#   cmake, clang, libclang-dev: sideway's rdma-mummy-sys generates its verbs bindings with
#   bindgen (the `rdma` feature of dataplane). python3-venv: the project venv below.
#   etcd-server: the local etcd that scheduler leader election (issue 18) runs against.
#   valgrind: tools/tests/sim_speed.rs counts the simulator's instructions per request (callgrind).
# No protoc: the build scripts compile their .proto files with protox (a Rust crate).
# The Soft-RoCE harness (tests/softroce/run.sh) installs QEMU and its guest packages itself.
set -euo pipefail
need="cmake clang libclang-dev python3-venv etcd-server valgrind"
missing=""
for p in $need; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "[setup] apt-get install$missing" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
# ONNX Runtime for the backend's ONNX executor (the `ort` crate loads libonnxruntime.so at run
# time, `load-dynamic`): the shared library comes from the PyPI wheel onnxruntime==1.31.1 (pinned:
# the crate's ONNX Runtime API version is 31; a newer wheel may not match), installed into the
# project-local, git-ignored venv .venv/ together with numpy (the reference outputs the tests
# compare against are computed by this same wheel: scripts/onnx_reference.py). The executor finds
# .venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so.* by itself
# (override: SYMPHONY_ORT_DYLIB). A failure here is reported; the ONNX tests then skip outside CI and fail under CI=true.
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/.venv"
ORT_PINS="onnxruntime==1.31.1 numpy==1.26.4"
if ! "$venv/bin/python" -c 'import onnxruntime, numpy, sys; sys.exit(onnxruntime.__version__ != "1.31.1")' 2>/dev/null; then
  echo "[setup] python venv $venv with $ORT_PINS" >&2
  if { [ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv" || python3 -m venv "$venv"; } &&
    timeout 600 "$venv/bin/python" -m pip install -q --disable-pip-version-check $ORT_PINS; then
    :
  else
    echo "[setup] WARNING: could not install $ORT_PINS into $venv: the ONNX executor's tests will skip (fail under CI=true)" >&2
  fi
fi
# NVRTC 13 for the graph engine's compile check without a GPU (backend/tests/nvrtc.rs compiles
# backend/src/exec/graph/kernels.cu to sm_90 PTX): the PyPI wheel nvidia-cuda-nvrtc==13.0.88 (CUDA
# 13.0, the GPU machine's driver 580; 218 MB installed in .venv/.../nvidia/cu13/lib), no driver needed.
if [ -x "$venv/bin/python" ] && ! compgen -G "$venv/lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so.13" >/dev/null; then
  echo "[setup] nvidia-cuda-nvrtc==13.0.88 into $venv" >&2
  timeout 600 "$venv/bin/python" -m pip install -q --disable-pip-version-check nvidia-cuda-nvrtc==13.0.88 ||
    echo "[setup] WARNING: could not install nvidia-cuda-nvrtc: the NVRTC compile check fails under CI=true" >&2
fi
