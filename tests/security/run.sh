#!/usr/bin/env bash
# The attack suite (issue 55) against the real daemons: malformed frames to
# every TCP port of a scheduler, a frontend and a backend (each must keep
# running, serve no READ to an unregistered peer and still serve an
# inference), and the shm transport's files private to their user (0600 in
# a 0700 directory); a member guessing region keys, unsigned Registers and
# idle links on the frontend's data port (data_path.py); a member backend
# forging Completions (forged_completion.py) and READing inputs not planned
# to it (read_capability.py); a process on the scheduler's address without
# the token welcoming the peers (forged_welcome.py); what a recorder on the
# loopback sees of a --link-tls cluster's links (link_tls.py). Bounded in time;
# leaves no process behind.
# Usage: bash tests/security/run.sh   (builds target/release/symphony if needed)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
# RELEASE_BUILD (tests/run.sh): its test step's build command, a no-op here.
# shellcheck disable=SC2086 # RELEASE_BUILD is a command line: split on purpose
(cd "$root" && timeout 1800 ${RELEASE_BUILD:-cargo build --release -p tools --bin symphony} -q)
bin="$CARGO_TARGET_DIR/release/symphony"
PY="${PYTHON:-python3}"
timeout 300 "$PY" "$root/tests/security/attack_ports.py" "$bin"
timeout 180 bash "$root/tests/security/shm_modes.sh" "$bin"
timeout 180 "$PY" "$root/tests/security/bounds.py" "$bin"
timeout 120 "$PY" "$root/tests/security/heartbeat_forgery.py" "$bin"
timeout 120 "$PY" "$root/tests/security/data_path.py" "$bin"
timeout 120 "$PY" "$root/tests/security/forged_completion.py" "$bin"
timeout 120 "$PY" "$root/tests/security/forged_welcome.py" "$bin"
timeout 120 "$PY" "$root/tests/security/read_capability.py" "$bin"
timeout 180 "$PY" "$root/tests/security/link_tls.py" "$bin"
echo "security suite: ok"
