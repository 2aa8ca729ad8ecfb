#!/usr/bin/env bash
# Builds the container image symphony:<workspace version> from the Debian archive alone (no
# Docker Hub, no other registry): debootstrap makes a minimal Debian 12 root filesystem, podman
# imports it as the base image, and podman builds deploy/Containerfile on it with the release
# binaries cargo built on this machine (a Rust toolchain of the required version is not in the
# Debian archive, so the binaries are built outside the image; see deploy/Containerfile).
#
# Usage: scripts/build-image.sh [--bin-dir DIR] [--onnxruntime FILE] [--tag NAME:TAG]
#   --bin-dir DIR      take symphony, symphony-scheduler, symphony-frontend and
#                      symphony-backend from DIR (e.g. target/release after the CI's build);
#                      default: `cargo build --release --locked` them with the shipped features
#                      ($SYMPHONY_IMAGE_FEATURES, default dataplane/rdma,backend/cuda: no
#                      mutation hooks).
#   --onnxruntime FILE libonnxruntime.so to ship for `--executor onnx` (not in Debian 12's
#                      archive; scripts/setup.sh fetches one from PyPI); default: none, and the
#                      backend's onnx executor then needs one mounted and SYMPHONY_ORT_DYLIB set.
#   --tag NAME:TAG     default symphony:<workspace version>.
# Environment: DEBIAN_MIRROR (default http://deb.debian.org/debian), SYMPHONY_IMAGE_STORAGE
# (podman storage driver; default: podman's own, or vfs where overlay cannot mount, as in
# unprivileged sandboxes).
#
# Runs as root. Idempotent: the root filesystem is cached as a tarball in target/image/ (keyed
# by suite, mirror and package list) and imported once; everything it writes is under target/
# or in podman's image store. Prints the image name on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

die() { echo "build-image: $*" >&2; exit 1; }
# Unmounts everything mounted at or below $1, deepest first.
unmount_under() {
  local m
  awk -v root="$(realpath -m "$1")" '$2 == root || index($2, root "/") == 1 {print $2}' /proc/mounts \
    | sort -r | while read -r m; do umount "$m" || umount -l "$m"; done
}

bin_dir="" ort_lib="" tag=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bin-dir) bin_dir=${2:?--bin-dir needs a directory}; shift 2 ;;
    --onnxruntime) ort_lib=${2:?--onnxruntime needs a file}; shift 2 ;;
    --tag) tag=${2:?--tag needs NAME:TAG}; shift 2 ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

[ "$(id -u)" = 0 ] || die "run as root (debootstrap and podman's root store need it)"
for tool in debootstrap podman; do
  command -v "$tool" >/dev/null || die "$tool is missing: apt-get install debootstrap podman (Debian packages)"
done

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml)
[ -n "$version" ] || die "no version in Cargo.toml's [workspace.package]"
tag=${tag:-symphony:$version}

# The runtime's shared libraries beyond minbase: libibverbs.so.1, which the RDMA transport loads
# at run time (dlopen, through rdma-mummy-sys), with the userspace NIC providers, and CA
# certificates for operators who point TLS at a public CA. Nothing else: the daemons are Rust
# binaries linked against glibc only.
suite=bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
packages=libibverbs1,ibverbs-providers,ca-certificates
cache=$repo/target/image
mkdir -p "$cache"

# podman in a container (this repository's CI) cannot mount overlay on overlay: use vfs there.
storage=${SYMPHONY_IMAGE_STORAGE:-}
if [ -z "$storage" ] && ! podman info >/dev/null 2>&1; then storage=vfs; fi
pod() { if [ -n "$storage" ]; then podman --storage-driver "$storage" "$@"; else podman "$@"; fi; }
pod info >/dev/null || die "podman cannot start (storage driver ${storage:-default}); see podman info"

key=$(printf '%s\n' "$suite" "$mirror" "$packages" | sha256sum | cut -c1-12)
base_tar=$cache/debian-$suite-$key.tar
base_image=localhost/symphony-base:$suite-$key

t0=$(date +%s)
if ! pod image exists "$base_image"; then
  if [ ! -s "$base_tar" ]; then
    rootfs=$cache/rootfs-$suite.tmp
    unmount_under "$rootfs"
    rm -rf --one-file-system "$rootfs"
    echo "build-image: debootstrap $suite from $mirror (minbase + $packages)" >&2
    debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$mirror" >"$cache/debootstrap.log" 2>&1 \
      || { unmount_under "$rootfs"; tail -20 "$cache/debootstrap.log" >&2; die "debootstrap failed (log: $cache/debootstrap.log)"; }
    # debootstrap mounts /proc in the target and, where it cannot unmount it (a sandbox), leaves
    # it mounted: the tarball must hold the files, not the host's processes.
    unmount_under "$rootfs"
    # What only the build needed: downloaded packages and indexes, logs with dates in them.
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/* "$rootfs"/tmp/*
    tar --numeric-owner --one-file-system -C "$rootfs" -cf "$base_tar.tmp" .
    mv "$base_tar.tmp" "$base_tar"
    rm -rf --one-file-system "$rootfs"
  fi
  pod import --quiet --message "debootstrap --variant=minbase --include=$packages $suite $mirror" "$base_tar" "$base_image" >/dev/null
fi
t1=$(date +%s)

if [ -z "$bin_dir" ]; then
  features=${SYMPHONY_IMAGE_FEATURES:-dataplane/rdma,backend/cuda}
  echo "build-image: cargo build --release --locked --bins --features $features" >&2
  CARGO_TARGET_DIR=$cache/cargo cargo build --release --locked --bins -p tools -p scheduler -p frontend -p backend --features "$features"
  bin_dir=$cache/cargo/release
fi

# The build context holds only what the image ships (not the repository and its target/).
context=$cache/context
rm -rf "$context"
mkdir -p "$context/bin" "$context/onnxruntime"
for b in symphony symphony-scheduler symphony-frontend symphony-backend; do
  [ -x "$bin_dir/$b" ] || die "$bin_dir/$b is missing: build the release binaries first"
  cp "$bin_dir/$b" "$context/bin/$b"
done
if [ -n "$ort_lib" ]; then
  [ -f "$ort_lib" ] || die "$ort_lib: no such file"
  cp "$ort_lib" "$context/onnxruntime/libonnxruntime.so"
fi

# The image this tag named before, removed once the tag moves (no dangling image per rebuild).
previous=$(pod image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
revision=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
# chroot isolation: a build step needs no namespaces or cgroups of its own, so the build also
# runs where podman cannot start a full container (a CI job that is itself a container).
# --layers=false: no intermediate images are kept (the stages take seconds).
pod build --isolation chroot --pull=never --layers=false \
  --build-arg "BASE_IMAGE=$base_image" --build-arg "VERSION=$version" --build-arg "REVISION=$revision" \
  -f deploy/Containerfile -t "$tag" "$context" >"$cache/build.log" 2>&1 \
  || { tail -30 "$cache/build.log" >&2; die "podman build failed (log: $cache/build.log)"; }
current=$(pod image inspect --format '{{.Id}}' "$tag")
if [ -n "$previous" ] && [ "$previous" != "$current" ]; then pod rmi "$previous" >/dev/null 2>&1 || true; fi
t2=$(date +%s)
echo "build-image: base $((t1 - t0)) s, image $((t2 - t1)) s (storage ${storage:-default})" >&2
echo "localhost/$tag"
