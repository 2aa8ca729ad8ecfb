#!/bin/sh
# Guest side of ci.sh, single VM: conformance suite over rxe0 (loopback path), >=1000 RC queue
# pairs (QP_PAIRS pairs), the whole cluster over verbs (cluster.sh, when ./symphony is here),
# then RDMA READ latency of the `rdma` transport and of perftest's ib_read_lat, interleaved per
# size, ROUNDS times. Prints "QPS ...", "CLUSTER ...", "LAT ..." and "PERFTEST ..." lines that
# ci.sh reports.
. ./perftest.sh
fail=0
echo "== rdma conformance suite"
./conformance_rdma --test-threads=1 || fail=1
echo "== $((${QP_PAIRS:-500} * 2)) RC queue pairs"
QP_PAIRS=${QP_PAIRS:-500} ./conformance_rdma --ignored --exact rdma_many_queue_pairs --nocapture \
  >/tmp/qps.out 2>&1 || { cat /tmp/qps.out; fail=1; }
grep '^QPS ' /tmp/qps.out
if [ -x ./symphony ]; then
  echo "== cluster over verbs (symphony up --transport rdma)"
  sh ./cluster.sh || fail=1
fi
if [ "${SKIP_LATENCY:-0}" != 1 ]; then
  iters=${LAT_ITERS:-2000}
  for round in $(seq 1 "${ROUNDS:-3}"); do
    for size in 64 4096 153600; do
      echo "== round $round, READ $size B x $iters"
      LAT_SIZE=$size LAT_ITERS=$iters ./conformance_rdma --ignored --exact rdma_read_latency --nocapture \
        >/tmp/lat.out 2>&1 || { cat /tmp/lat.out; fail=1; }
      grep '^LAT ' /tmp/lat.out
      if perftest_pair ib_read_lat -d rxe0 -F -n "$iters" -s "$size" >/tmp/pt.out; then
        echo "PERFTEST $(grep -E "^ *$size +$iters " /tmp/pt.out)"
      else
        cat /tmp/pt.out; fail=1
      fi
    done
  done
fi
exit $fail
