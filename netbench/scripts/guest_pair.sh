#!/bin/sh
# Guest side of netbench/scripts/softroce.sh, two guests (1 vCPU each) on a private link:
# the server guest (10.0.0.1) runs 8 servers of 8 x 150 KiB objects (server 0 spins, the others
# sleep when idle); the client guest waits until each answers, then runs the paper's incast
# across the link, a single-READ latency run against server 0, and a calibration against it.
# Each server exits after its expected number of clients (bounded by --duration-s anyway).
# PAIR_STEPS (default "paper lat cal") picks the client's steps; both guests see it, so the
# servers know how many clients to expect. PAIR_CONC = READs in flight per peer in the paper
# step (default all 8).
PORT0=18600
STEPS=${PAIR_STEPS:-paper lat cal}
has() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
CONC=""
[ -n "${PAIR_CONC:-}" ] && CONC="--concurrency $PAIR_CONC"
# rxe's counters (retries, duplicate requests) and the NIC's drops tell loss and timeouts apart.
counters() {
  d=/sys/class/infiniband/${SR_DEV:-rxe0}/ports/1/hw_counters
  [ -d "$d" ] || return 0
  printf 'RXE_COUNTERS %s' "$SR_ROLE"
  for f in "$d"/*; do v=$(cat "$f"); [ "$v" = 0 ] || printf ' %s=%s' "${f##*/}" "$v"; done
  s=/sys/class/net/eth0/statistics
  [ -d $s ] && printf ' eth0_rx_packets=%s eth0_rx_dropped=%s' "$(cat $s/rx_packets)" "$(cat $s/rx_dropped)"
  echo
}
case $SR_ROLE in
  server)
    pids=""
    for i in 0 1 2 3 4 5 6 7; do
      idle=block; n=1
      has paper && n=$((n + 1))
      if [ $i = 0 ]; then
        idle=spin
        has lat && n=$((n + 2))
        has cal && n=$((n + 1))
      fi
      ./netbench serve -t rdma --listen "0.0.0.0:$((PORT0 + i))" --objects 8 --size 150KiB --id $i \
        --server-idle $idle --exit-after-clients $n --duration-s 900 >/dev/null &
      pids="$pids $!"
    done
    rc=0
    for p in $pids; do wait $p || rc=1; done
    counters
    exit $rc ;;
  client)
    peers=""
    for i in 0 1 2 3 4 5 6 7; do
      a="$SR_PEER:$((PORT0 + i))"
      peers="$peers${peers:+,}$a"
      # Probe until this server answers (one counted client per server).
      t=0
      until ./netbench incast -t rdma --peers "$a" --objects 8 --size 150KiB --iters 1 --warmup 0 \
              --connect-timeout-ms 2000 --csv >/dev/null 2>&1; do
        t=$((t + 1)); [ $t -ge 120 ] && { echo "server $a never answered"; exit 1; }
        usleep 500000
      done
    done
    fail=0
    if has paper; then
      echo "== paper shape across two guests"
      # shellcheck disable=SC2086
      if ./netbench incast -t rdma --peers "$peers" --objects 8 --size 150KiB --iters "${PAPER_ITERS:-200}" $CONC \
           --label "rdma, two Soft-RoCE guests" --fabric "rdma, Soft-RoCE between two QEMU/TCG guests (1 vCPU each)" \
           --json >/tmp/pair.json; then
        echo "=== BEGIN rdma-pair-paper.json"; cat /tmp/pair.json; echo "=== END rdma-pair-paper.json"
      else fail=1; fi
    fi
    if has lat; then
      echo "== single READ latency to server 0 (150 KiB, one at a time)"
      ./netbench incast -t rdma --peers "$SR_PEER:$PORT0" --objects 8 --size 150KiB --concurrency 1 \
        --iters "${LAT_ITERS:-250}" --ping-every 0 || fail=1
      echo "== warm-up client for server 0's count"
      ./netbench incast -t rdma --peers "$SR_PEER:$PORT0" --objects 8 --size 150KiB --iters 1 --warmup 0 >/dev/null || fail=1
    fi
    has cal || { counters; exit $fail; }
    echo "== calibration against server 0 (spinning)"
    if ./netbench calibrate -t rdma --peers "$SR_PEER:$PORT0" --objects 8 --size 150KiB --iters "${CAL_ITERS:-300}" \
         --batches 1,2,4,8 --percentile 99.99 --out /tmp/pair.toml \
         --fabric "rdma, Soft-RoCE between two QEMU/TCG guests (1 vCPU each), 1 spinning server x 8 objects x 150 KiB"; then
      echo "=== BEGIN rdma-softroce-pair.toml"; cat /tmp/pair.toml; echo "=== END rdma-softroce-pair.toml"
    else fail=1; fi
    counters
    exit $fail ;;
  *) echo "guest_pair.sh: unexpected role $SR_ROLE"; exit 2 ;;
esac
