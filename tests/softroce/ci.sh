#!/usr/bin/env bash
# tests/softroce/ci.sh - the CI entry point for real-verbs tests of dataplane's `rdma` transport.
#
#   1. installs the build dependencies (cmake, clang/libclang for sideway's bindgen) via apt,
#   2. builds dataplane's rdma test binary and the symphony binary on the host (release, the
#      same build as tests/run.sh's test step: feature dataplane/rdma),
#   3. boots ONE Soft-RoCE guest: runs the shared transport conformance suite over rxe
#      (loopback path), >=1000 RC queue pairs, the whole cluster over verbs
#      (guest/cluster.sh: `symphony up --transport rdma`, KServe v2 HTTP requests, outputs and
#      READ count checked), then the RDMA READ latency test next to perftest's ib_read_lat,
#   4. boots TWO guests linked by a private UDP-backed L2 link: one serves a registered region,
#      the other connects, READs it and checks the bytes,
#   5. prints the latency comparison and exits non-zero if any guest step failed.
#
# Knobs: CARGO_TARGET_DIR (default <repo>/target/softroce), RELEASE_FEATURES (default
# "--features dataplane/rdma"), SOFTROCE_BUILD=workspace|min, SKIP_PAIR=1, SKIP_LATENCY=1,
# LAT_ITERS (default 2000), QP_PAIRS (default 500), CLUSTER_RATE / CLUSTER_SECS (20 rps, 3 s),
# plus run.sh's (SOFTROCE_WORK, TIMEOUT, ACCEL, ...).
set -euo pipefail
SCRIPT_DIR=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$SCRIPT_DIR/../.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$REPO/target/softroce}
# The features of tests/run.sh's one release build (it exports the same variable).
RELEASE_FEATURES=${RELEASE_FEATURES:---features dataplane/rdma}
LAT_ITERS=${LAT_ITERS:-2000}
T0=$(date +%s)
log() { echo "[ci] $*" >&2; }

missing=""
for p in cmake clang libclang-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing="$missing $p"
done
if [ -n "$missing" ]; then
  log "apt-get install$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

# The release build: by default the very command tests/run.sh's test step runs (same
# features, same profile), so under run.sh this is a no-op that reuses its artifacts;
# SOFTROCE_BUILD=min builds only what the guests run (dataplane's rdma test binary and the
# symphony binary; faster alone, but different feature unification than the workspace).
log "building the rdma test binary and symphony (release, ${SOFTROCE_BUILD:-workspace})"
STAGE=$(mktemp -d "${TMPDIR:-/tmp}/softroce-ci.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
case ${SOFTROCE_BUILD:-workspace} in
  workspace)
    # shellcheck disable=SC2086
    (cd "$REPO" && ${RELEASE_BUILD:-cargo test --workspace --release $RELEASE_FEATURES --no-run} --message-format=json) \
      > "$STAGE/build.json" ;;
  min)
    (cd "$REPO" && cargo test -p dataplane --features rdma --release --no-run --message-format=json \
      && cargo build -p tools --bin symphony --release $RELEASE_FEATURES --message-format=json) \
      > "$STAGE/build.json" ;;
  *) log "SOFTROCE_BUILD must be workspace or min"; exit 2 ;;
esac
artifact() { # $1 = target name, $2 = 1 for a test harness, 0 for a plain binary
  python3 -c '
import json, sys
for line in open(sys.argv[1]):
    try: m = json.loads(line)
    except ValueError: continue
    if (m.get("reason") == "compiler-artifact" and m.get("target", {}).get("name") == sys.argv[2]
            and m.get("executable") and bool(m.get("profile", {}).get("test")) == (sys.argv[3] == "1")):
        print(m["executable"])' "$STAGE/build.json" "$1" "$2" | tail -1
}
BIN=$(artifact conformance_rdma 1)
[ -n "$BIN" ] || { log "conformance_rdma test binary not found in cargo output"; exit 2; }
SYMPHONY=$(artifact symphony 0)
[ -n "$SYMPHONY" ] || { log "symphony binary not found in cargo output"; exit 2; }
mkdir -p "$STAGE/guest"
cp "$BIN" "$STAGE/guest/conformance_rdma"
# Stripped copies: a smaller initramfs boots faster (the guest copies it into RAM).
strip -o "$STAGE/guest/symphony" "$SYMPHONY" 2>/dev/null || cp "$SYMPHONY" "$STAGE/guest/symphony"
strip "$STAGE/guest/conformance_rdma" 2>/dev/null || true
cp "$SCRIPT_DIR"/guest/*.sh "$STAGE/guest/"
log "built in $(( $(date +%s) - T0 ))s: $BIN"

fail=0
T1=$(date +%s)
log "single guest: conformance suite, $((${QP_PAIRS:-500} * 2)) queue pairs, cluster over verbs, READ latency"
"$SCRIPT_DIR/run.sh" --mode single --dir "$STAGE/guest" \
  "LAT_ITERS=$LAT_ITERS SKIP_LATENCY=${SKIP_LATENCY:-0} QP_PAIRS=${QP_PAIRS:-500} CLUSTER_RATE=${CLUSTER_RATE:-20} CLUSTER_SECS=${CLUSTER_SECS:-3} sh ./single.sh" | tee "$STAGE/single.log" || fail=1
log "single guest took $(( $(date +%s) - T1 ))s"

if [ "${SKIP_PAIR:-0}" != 1 ]; then
  T2=$(date +%s)
  log "two guests: cross-VM RDMA READ"
  "$SCRIPT_DIR/run.sh" --mode pair --dir "$STAGE/guest" "sh ./pair.sh" | tee "$STAGE/pair.log" || fail=1
  log "pair took $(( $(date +%s) - T2 ))s"
fi

grep -E '^(QPS|CLUSTER) ' "$STAGE/single.log" | sed 's/^/[ci] /' >&2 || true
if grep -q '^LAT ' "$STAGE/single.log"; then
  echo
  echo "RDMA READ latency in one Soft-RoCE guest (rxe loopback), microseconds:"
  python3 - "$STAGE/single.log" <<'EOF'
import sys, statistics as st
ours, pt = {}, {}
for line in open(sys.argv[1]):
    f = line.split()
    if f[:1] == ["LAT"] and len(f) >= 6:          # LAT <bytes> <iters> <p50_ns> <p99_ns> <p999_ns>
        ours.setdefault(int(f[1]), []).append([int(x) / 1000 for x in f[3:6]])
    elif f[:1] == ["PERFTEST"] and len(f) >= 10:  # PERFTEST + ib_read_lat's result row:
        try:                                      # bytes iters min max typical avg stdev p99 p99.9
            pt.setdefault(int(f[1]), []).append([float(f[5]), float(f[8]), float(f[9])])
        except ValueError:
            pass
med = lambda rows, i: st.median(r[i] for r in rows)
print("| size (B) | runs | rdma p50 | rdma p99 | rdma p99.9 | ib_read_lat typical | ib_read_lat p99 | ib_read_lat p99.9 | p50 / typical |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for size in sorted(ours):
    o = ours[size]; p = pt.get(size)
    row = f"| {size} | {len(o)} | {med(o,0):.1f} | {med(o,1):.1f} | {med(o,2):.1f} |"
    if p:
        row += f" {med(p,0):.1f} | {med(p,1):.1f} | {med(p,2):.1f} | {med(o,0)/med(p,0):.2f} |"
    else:
        row += " n/a | n/a | n/a | n/a |"
    print(row)
print("(microseconds; medians over runs; perftest's t_typical is its median)")
EOF
fi
log "total $(( $(date +%s) - T0 ))s"
if [ $fail = 0 ]; then log PASS; else log FAIL; fi
exit $fail
