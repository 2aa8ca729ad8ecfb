# Sourced by the scripts that test the real daemons through `symphony up --serve`.
#   up_serve TMPDIR ARGS...  starts `$bin up ARGS...` (ARGS include --serve or imply it), waits
#                            (bounded) for its "frontend 1: http://HOST:PORT" line, and sets
#                            $up (its pid), $url (HOST:PORT) and $grpc_url (frontend 1's
#                            gRPC HOST:PORT); on failure prints its stderr
#                            and exits 1. An EXIT trap stops it and removes TMPDIR.
#   up_stop                  Ctrl-C (SIGINT) to up, and a check that it exits 0.
# Needs $bin (the symphony binary).
up_serve() {
    up_tmp="$1"
    shift
    # The files exist before the poll below reads them: the background job
    # opens its redirections only once it runs, and a `sed` on a missing
    # file ends this script under `set -e` (a loaded CI machine did).
    : >"$up_tmp/out"
    : >"$up_tmp/err"
    "$bin" up "$@" >>"$up_tmp/out" 2>>"$up_tmp/err" &
    up=$!
    trap up_cleanup EXIT
    url=""
    for _ in $(seq 600); do
        url="$(sed -n 's|^frontend 1: http://\([0-9.:]*\)$|\1|p' "$up_tmp/out")"
        grpc_url="$(sed -n 's|^frontend 1 grpc: \([0-9.:]*\)$|\1|p' "$up_tmp/out")"
        [ -n "$url" ] && [ -n "$grpc_url" ] && return 0
        kill -0 "$up" 2>/dev/null || { cat "$up_tmp/err"; exit 1; }
        sleep 0.1
    done
    echo "symphony up did not print frontend 1's address"
    cat "$up_tmp/err"
    exit 1
}

up_cleanup() {
    kill -INT "$up" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$up" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$up" 2>/dev/null || true
    rm -rf "$up_tmp"
}

up_stop() {
    kill -INT "$up"
    local status=0
    wait "$up" || status=$?
    [ "$status" = 0 ] || { echo "symphony up exited with $status after Ctrl-C"; cat "$up_tmp/err"; exit 1; }
}
