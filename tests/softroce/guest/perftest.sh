#!/bin/sh
# perftest helpers for guest commands (busybox sh). Source it, then call
#   perftest_pair ib_read_lat -d rxe0 -F -n 1000 -s 64
# which runs the server in the background and the client against $SR_IP on the same guest,
# retrying the client while the server is not listening yet (bounded: 60 tries), and prints
# the client's output. Under TCG, perftest's cycle-counter calibration sometimes fails and
# prints 'inf': the transfer itself worked, so such a run is repeated (at most 3 times).
# PT_SERVER_PREFIX / PT_CLIENT_PREFIX (e.g. "taskset -c 1" / "taskset -c 0") go before the
# server's and the client's command.
perftest_pair() {
  tries=1
  while :; do
    $PT_SERVER_PREFIX timeout 120 "$@" >/tmp/pt-server.out 2>&1 & spid=$!
    i=0; rc=1
    while [ $i -lt 60 ]; do
      $PT_CLIENT_PREFIX timeout 120 "$@" "$SR_IP" >/tmp/pt-client.out 2>&1 && { rc=0; break; }
      grep -q "Couldn't connect\|Unable to connect\|Connection refused\|Failed to open" /tmp/pt-client.out || break
      i=$((i + 1)); usleep 200000
    done
    wait $spid; src=$?
    if [ $rc -eq 0 ] && [ $src -eq 0 ] && [ $tries -lt 3 ] && grep -q ' inf ' /tmp/pt-client.out; then
      tries=$((tries + 1)); continue
    fi
    cat /tmp/pt-client.out
    [ $rc -eq 0 ] && [ $src -eq 0 ]; return
  done
}
