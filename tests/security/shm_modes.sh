#!/usr/bin/env bash
# Shared-memory files are private (issue 55 item 4), on the real daemons:
# `symphony up --serve` over the shm transport, started under umask 000 (the
# most open a user could leave it), then every /dev/shm entry the daemons
# own (named after their pids: staging regions, key-table registries) must be
# a file of mode 0600 in a directory of mode 0700 that belongs to this user,
# never /dev/shm itself (which every user can list). Bounded in time.
# Usage: shm_modes.sh SYMPHONY_BINARY
set -euo pipefail
# shellcheck disable=SC2034 # read by up_serve (tests/lib/up_serve.sh)
bin="$1"
root="$(cd "$(dirname "$0")/../.." && pwd)"
tmp="$(mktemp -d)"
# shellcheck source=tests/lib/up_serve.sh
. "$root/tests/lib/up_serve.sh"
umask 000
up_serve "$tmp" --serve --transport shm --models ResNet50 --frontends 1 --backends 1
umask 022
me="$(id -u)"
pids=""
# shellcheck disable=SC2154 # $up is set by up_serve
for t in /proc/"$up"/task/*/children; do pids="$pids $(cat "$t")"; done
[ -n "${pids// /}" ] || { echo "shm: no daemon under up"; exit 1; }
checked=0
bad=0
for pid in $pids; do
    # Entries named after the daemon's pid, wherever they are under /dev/shm.
    while IFS= read -r f; do
        [ -n "$f" ] || continue
        dir="$(dirname "$f")"
        fmode="$(stat -c %a "$f")"; dmode="$(stat -c %a "$dir")"; downer="$(stat -c %u "$dir")"
        checked=$((checked + 1))
        if [ "$fmode" != 600 ] || [ "$dmode" != 700 ] || [ "$downer" != "$me" ] || [ "$dir" = /dev/shm ]; then
            echo "shm: $f is mode $fmode in $dir (mode $dmode, owner $downer): want 0600 in a 0700 directory of user $me"
            bad=$((bad + 1))
        fi
    done < <(find /dev/shm -maxdepth 2 -type f \( -name "symphony-$pid-*" -o -name "symphony-reg-$pid-*" -o -name "symphony-ring-$pid-*" \) 2>/dev/null)
done
[ "$checked" -gt 0 ] || { echo "shm: the daemons ($pids) own no /dev/shm file: nothing was checked"; exit 1; }
[ "$bad" = 0 ] || exit 1
up_stop
echo "shm: $checked files of the daemons are 0600 in 0700 directories"
