#!/usr/bin/env bash
# Where bench-cluster's CPU goes, per process and per accepted task: system calls by name,
# context switches and CPU time of the scheduler daemon, the bench frontends and the bench
# backends over a window in the middle of the load (perf stat, software events only: these VMs
# have no hardware counters), then the scheduler's own time by symbol (perf record -e cpu-clock).
#
# Usage: scripts/bench-cluster-profile.sh [bench-cluster flags...]
#   e.g. scripts/bench-cluster-profile.sh --transport shm --rate 1000000
# Env: SYMPHONY (default target/release/symphony), WINDOW_S (default 2), TOP (symbols, default 25),
#      NO_RECORD=1 (perf stat only). Needs perf (linux-perf / linux-tools) and root or
#      kernel.perf_event_paranoid <= 0 for the syscall tracepoints.
# The bench runs --duration-s 6 unless given; the window opens 2 s after the frontends start.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${SYMPHONY:-target/release/symphony}
WINDOW_S=${WINDOW_S:-2}
TOP=${TOP:-25}
command -v perf >/dev/null || { echo "perf not found (Debian: apt-get install linux-perf)" >&2; exit 2; }
[ -x "$BIN" ] || { echo "$BIN not built (cargo build --release -p tools)" >&2; exit 2; }
args=("$@")
case " $* " in *" --duration-s "*) ;; *) args+=(--duration-s 6) ;; esac
work=$(mktemp -d "${TMPDIR:-/tmp}/bench-profile.XXXXXX")
trap 'rm -rf "$work"' EXIT
calls="epoll_wait epoll_pwait ppoll read write recvfrom sendto recvmsg sendmsg io_uring_enter timerfd_settime sched_yield clock_nanosleep futex"
events="task-clock,context-switches,raw_syscalls:sys_enter"
for c in $calls; do events="$events,syscalls:sys_enter_$c"; done

"$BIN" bench-cluster "${args[@]}" --json > "$work/run.json" 2> "$work/run.err" &
bench=$!
front=""
for _ in $(seq 300); do
  front=$(pgrep -f "daemon bench-frontends" | head -1 || true)
  [ -n "$front" ] && break
  sleep 0.1
done
[ -n "$front" ] || { echo "the bench frontends never started; see below" >&2; cat "$work/run.err" >&2; exit 1; }
sleep 2
sched=$(pgrep -f "daemon scheduler " | head -1 || true)
back=$(pgrep -f "daemon bench-backends" | head -1 || true)
for p in "$sched" "$front" "$back"; do
  [ -n "$p" ] && perf stat -x, -e "$events" -p "$p" -- sleep "$WINDOW_S" 2> "$work/stat.$p" &
done
if [ -z "${NO_RECORD:-}" ] && [ -n "$sched" ]; then
  perf record -q -F 4999 -e cpu-clock -g -p "$sched" -o "$work/perf.data" -- sleep "$WINDOW_S" > /dev/null 2>&1 &
fi
wait "$bench" || { echo "bench-cluster failed:" >&2; cat "$work/run.err" >&2; exit 1; }
wait
python3 - "$work" "$WINDOW_S" "$sched" "$front" "$back" <<'PY'
import json, sys
work, window = sys.argv[1], float(sys.argv[2])
procs = dict(zip(("scheduler", "frontends", "backends"), sys.argv[3:6]))
run = json.load(open(f"{work}/run.json"))
rate = run["tasks_per_s"]
m = run.get("machine", {})
print(f"machine: {m.get('processor')}, {m.get('cores')} cores, kernel {m.get('kernel')}")
print(f"accepted {rate:,.0f} tasks/s, bad {run['bad_rate']:.2%}, scheduler {run['scheduler_cpu_ns_per_task']:.0f} ns/task "
      f"(whole run); window {window:g} s")
tasks = rate * window
print(f"{'process':<10} {'CPU cores':>9} {'ns/task':>8} {'ctx sw/task':>11} {'syscalls/task':>13}  system calls per task by name")
for name, pid in procs.items():
    if not pid:
        continue
    vals = {}
    for line in open(f"{work}/stat.{pid}"):
        f = line.strip().split(",")
        if len(f) > 2 and f[0].replace(".", "", 1).isdigit():
            vals[f[2].replace("syscalls:sys_enter_", "")] = float(f[0])
    cpu_ms = vals.get("task-clock", 0.0)
    per = lambda k: vals.get(k, 0.0) / tasks if tasks else 0.0
    named = sorted(((k, per(k)) for k in vals if k not in ("task-clock", "context-switches", "raw_syscalls:sys_enter")),
                   key=lambda kv: -kv[1])
    by_name = ", ".join(f"{k} {v:.3f}" for k, v in named if v >= 0.0005)
    print(f"{name:<10} {cpu_ms / 1e3 / window:>9.2f} {cpu_ms * 1e6 / tasks if tasks else 0:>8.0f} "
          f"{per('context-switches'):>11.4f} {per('raw_syscalls:sys_enter'):>13.4f}  {by_name}")
PY
if [ -z "${NO_RECORD:-}" ] && [ -s "$work/perf.data" ]; then
  echo "scheduler, self time by symbol (perf record -e cpu-clock):"
  perf report -i "$work/perf.data" --no-children --sort symbol --stdio -g none 2>/dev/null \
    | grep -E '^ +[0-9.]+%' | head -n "$TOP"
fi
