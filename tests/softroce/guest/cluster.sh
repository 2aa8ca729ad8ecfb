#!/bin/sh
# Guest side of ci.sh: the whole cluster over verbs. `symphony up --transport rdma` starts a
# scheduler, one frontend and one emulated-GPU backend as processes on rxe0 and drives an
# open-loop KServe v2 HTTP workload at the frontend (hyper client, JSON infer requests, the
# loadgen in frontend/src/loadgen.rs). Every response's OUTPUT0 is checked against the
# reference output of the bytes the client sent (dataplane::reference: the executor hashes
# exactly the bytes that landed in its pinned staging buffer, so a changed, torn or missing
# input byte changes the answer). Passes only if every request was answered correctly (in
# time or late: the objective is loose, but an emulated guest can still stall), none went to
# the wrong client, and the backend's RDMA READ counter equals the number of inputs.
# Prints "CLUSTER <sent> <correct> <wrong_output> <reads_posted> <read_failures> <seconds>".
set -u
RATE=${CLUSTER_RATE:-20}
SECS=${CLUSTER_SECS:-3}
t0=$(cut -d' ' -f1 /proc/uptime)
# Loose timing: the point is the bytes and the READs, not latency under emulation, where
# one READ takes 0.1-5 ms and the guest's 2 vCPUs run four processes: a 10 s objective, a
# 20 ms control delay, and missing inputs waited for up to 2 s after a batch's planned start
# (the backend's --fetch-grace-us, through its environment variable; 5 ms by default).
# --local-idle park: every daemon spins, yields, then sleeps on its connections' wait fds (for
# rdma: the completion channels) instead of polling.
export SYMPHONY_FETCH_GRACE_US=${CLUSTER_FETCH_GRACE_US:-2000000}
./symphony up --transport rdma --frontends 1 --backends 1 --models none \
  --model echo=2,1,10000 --local-control-delay-us 20000 --local-idle park \
  --rate "$RATE" --duration-s "$SECS" --plot /tmp/up-plots --json \
  >/tmp/up.json 2>/tmp/up.log
rc=$?
t1=$(cut -d' ' -f1 /proc/uptime)
field() { sed -n "s/^ *\"$1\": *\([0-9.]*\).*/\1/p" /tmp/up.json | head -1; }
sent=$(field sent); wrong=$(field wrong_output); wrong_client=$(field wrong_client)
okf=$(field ok); late=$(field late); ok=$(( ${okf:-0} + ${late:-0} ))
reads=$(field backend_reads_posted); rfail=$(field backend_read_failures)
echo "CLUSTER ${sent:-?} ${ok:-?} ${wrong:-?} ${reads:-?} ${rfail:-?} $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}')"
fail=0
[ $rc -eq 0 ] || { echo "cluster: symphony up exited $rc"; fail=1; }
[ -n "$sent" ] && [ "${sent%.*}" -gt 0 ] || { echo "cluster: no request sent"; fail=1; }
[ "${ok:-x}" = "${sent:-y}" ] || { echo "cluster: $ok of $sent requests answered correctly"; fail=1; }
[ "${wrong:-x}" = 0 ] || { echo "cluster: $wrong outputs differ from the reference of the sent bytes"; fail=1; }
[ "${wrong_client:-x}" = 0 ] || { echo "cluster: $wrong_client answers went to the wrong request"; fail=1; }
# One input per request: READs posted == inputs sent, none failed.
[ "${reads%.*}" = "${sent:-y}" ] || { echo "cluster: $reads READs for $sent inputs"; fail=1; }
[ "${rfail%.*}" = 0 ] || { echo "cluster: $rfail READs failed"; fail=1; }
if [ $fail != 0 ]; then
  echo "---- up.log"; tail -40 /tmp/up.log; echo "---- up.json"; head -60 /tmp/up.json
  for l in /tmp/symphony-up-*/*.log; do [ -f "$l" ] && { echo "---- $l"; tail -20 "$l"; }; done
fi
exit $fail
