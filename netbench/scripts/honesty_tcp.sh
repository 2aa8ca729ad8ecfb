#!/usr/bin/env bash
# netbench/scripts/honesty_tcp.sh [ROUNDS] - is netbench's TCP round trip honest?
#
# Side by side on loopback, interleaved ROUNDS times (default 3), the same 32-byte message:
#   netbench ctrl_rtt with both sides sleeping in the kernel as sockperf's and qperf's do
#   (--reader-idle block, --server-idle block) on tcp-blocking and tcp/io_uring; for reference
#   netbench tcp-blocking with a busy-polling reader (the data path's default) and with both
#   sides busy-polling; sockperf ping-pong --tcp (client and server block in recvfrom), and
#   qperf tcp_lat (it reports RTT/2: doubled here; it gives means only).
# Prints one line per round and a summary of medians (microseconds, round trip).
# Needs: apt-get install sockperf qperf. NETBENCH=path to the binary (default: release build).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
B=${NETBENCH:-$REPO/target/netbench/release/netbench}
ROUNDS=${1:-3}
SECS=${SECS:-5}
ITERS=${ITERS:-20000}
M=${MSG:-32}
SP_PORT=${SP_PORT:-17771}
QP_PORT=${QP_PORT:-19777}
for t in sockperf qperf; do command -v $t >/dev/null || { echo "missing $t (apt-get install $t)" >&2; exit 2; }; done
[ -x "$B" ] || { echo "no netbench binary at $B (cargo build -p netbench --release)" >&2; exit 2; }

sockperf server --tcp -i 127.0.0.1 -p "$SP_PORT" >/dev/null 2>&1 & SP_PID=$!
qperf --listen_port "$QP_PORT" >/dev/null 2>&1 & QP_PID=$!
trap 'kill $SP_PID $QP_PID 2>/dev/null || true' EXIT
sleep 1   # both servers bind within milliseconds; their clients also retry/fail loudly

nb() { "$B" local -t "$1" --server-idle "${2:-block}" --reader-idle "${3:-block}" --servers 1 --objects 1 --size 64 --iters "$ITERS" --verify-every 0 \
        --ping-size "$M" --csv | awk -F, '$2=="ctrl_rtt"{print $7}'; }
sp() { timeout 60 sockperf ping-pong --tcp -i 127.0.0.1 -p "$SP_PORT" -m "$M" -t "$SECS" --full-rtt "$@" 2>&1 \
        | awk '/percentile 50.000/{print $NF}'; }
qp() { timeout 60 qperf 127.0.0.1 --listen_port "$QP_PORT" -m "$M" -t "$SECS" tcp_lat \
        | awk '/latency/{v=$3; if ($4=="ms") v*=1000; if ($4=="ns") v/=1000; printf "%.3f\n", 2*v}'; }

OUT=$(mktemp)
for r in $(seq 1 "$ROUNDS"); do
  a=$(nb tcp-blocking); b=$(nb tcp); c=$(sp); d=$(nb tcp-blocking block spin); e=$(nb tcp-blocking spin spin); f=$(qp)
  echo "ROUND $r netbench-tcp-blocking=$a netbench-tcp=$b sockperf=$c netbench-tcp-blocking-spinning-reader=$d netbench-tcp-blocking-both-spinning=$e qperf-x2=$f" | tee -a "$OUT"
done
python3 - "$OUT" <<'PY'
import sys, statistics as st
rows = [dict(kv.split("=") for kv in l.split()[2:]) for l in open(sys.argv[1])]
med = {k: st.median(float(r[k]) for r in rows) for k in rows[0]}
print("median RTT (us) over %d rounds:" % len(rows))
for k, v in med.items():
    print("  %-40s %8.2f" % (k, v))
for nbk in ("netbench-tcp-blocking", "netbench-tcp", "netbench-tcp-blocking-spinning-reader"):
    for ref in ("sockperf", "qperf-x2"):
        print("  %s / %s = %.2f" % (nbk, ref, med[nbk] / med[ref]))
PY
rm -f "$OUT"
