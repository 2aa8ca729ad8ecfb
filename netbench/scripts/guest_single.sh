#!/bin/sh
# Guest side of netbench/scripts/softroce.sh, one Soft-RoCE guest (2 vCPUs, rxe loopback path):
# 1. single-READ latency, netbench vs perftest ib_read_lat, interleaved per size, ROUNDS times;
# 2. the paper's incast shape (8 local servers x 8 objects x 150 KiB) on rdma;
# 3. a calibration of rdma in the same shape (servers sleep when idle: rdma servers cannot block
#    in the kernel, so ctrl_rtt includes their wake-up; a spinning server would starve rxe's
#    kernel work of the guest's 2 vCPUs instead).
# READ-latency runs use --ping-every 0 so the (sleeping) server is never woken mid-run.
# Files for the host are printed between "=== BEGIN name" and "=== END name" lines.
. ./perftest.sh
fail=0
ITERS=${LAT_ITERS:-2000}
for round in $(seq 1 "${ROUNDS:-3}"); do
  for size in ${SIZES:-64 4096 153600}; do
    if ./netbench local -t rdma --servers 1 --objects 1 --size "$size" --iters "$ITERS" --warmup 100 \
         --verify-every 10 --ping-every 0 --csv >/tmp/nb.csv 2>/tmp/nb.err; then
      echo "NB $size $(grep ',read,' /tmp/nb.csv)"
    else
      cat /tmp/nb.err; fail=1
    fi
    if perftest_pair ib_read_lat -d rxe0 -F -n "$ITERS" -s "$size" >/tmp/pt.out; then
      echo "PERFTEST $(grep -E "^ *$size +$ITERS " /tmp/pt.out)"
    else
      cat /tmp/pt.out; fail=1
    fi
  done
done
if [ "${SKIP_PAPER:-0}" != 1 ]; then
  echo "== paper shape: 8 servers x 8 objects x 150 KiB"
  if ./netbench local -t rdma --servers 8 --objects 8 --size 150KiB --iters "${PAPER_ITERS:-300}" \
       --label "rdma, Soft-RoCE guest (rxe loopback)" --json >/tmp/paper.json; then
    echo "=== BEGIN rdma-guest-paper.json"; cat /tmp/paper.json; echo "=== END rdma-guest-paper.json"
  else
    fail=1
  fi
fi
if [ "${SKIP_CAL:-0}" != 1 ]; then
  echo "== calibration"
  if ./netbench calibrate -t rdma --servers 8 --objects 8 --size 150KiB \
       --iters "${CAL_ITERS:-200}" --percentile 99.99 --extra-percentiles 99,50 --out /tmp/rdma.toml \
       --fabric "rdma, Soft-RoCE (rxe) loopback in one QEMU/TCG guest (2 vCPUs), 8 servers x 8 objects x 150 KiB"; then
    echo "=== BEGIN rdma-softroce-guest.toml"; cat /tmp/rdma.toml; echo "=== END rdma-softroce-guest.toml"
    for p in p99 p50; do
      echo "=== BEGIN rdma-softroce-guest.$p.toml"; cat /tmp/rdma.$p.toml; echo "=== END rdma-softroce-guest.$p.toml"
    done
  else
    fail=1
  fi
fi
exit $fail
