#!/usr/bin/env bash
# Installs the system packages the build and the tests need (Debian/Ubuntu, as root).
# Idempotent: installs only what is missing. The Rust toolchain itself comes with the machine.
#   cmake, clang, libclang-dev: sideway's rdma-mummy-sys generates its verbs bindings with
#   bindgen (the `rdma` feature of dataplane).
# The Soft-RoCE harness (tests/softroce/run.sh) installs QEMU and its guest packages itself.
set -euo pipefail
need="cmake clang libclang-dev"
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
