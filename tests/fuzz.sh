#!/usr/bin/env bash
# Every cargo-fuzz target in fuzz/ (issue 47 item 2, issue 55 item 1): built
# with cargo-fuzz on the stable toolchain (no sanitizer: `-s none`; libFuzzer's
# coverage instrumentation needs only stable `-C` flags), each run for
# FUZZ_SECONDS (default 30) from its seeds in fuzz/seeds/<target>/ (the
# growing corpus goes to fuzz/corpus/<target>/, git-ignored), two at a time.
# Fails on any crash, leak of a panic, timeout or out-of-memory report, and
# on a target without seeds. Installs cargo-fuzz into target/cargo-fuzz if
# it is not on PATH.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
secs="${FUZZ_SECONDS:-30}"
fuzz_bin="$root/target/cargo-fuzz/bin"
export PATH="$fuzz_bin:$PATH"
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz into $root/target/cargo-fuzz"
    timeout 1800 cargo install --locked cargo-fuzz --root "$root/target/cargo-fuzz" -q
fi
cd "$root/fuzz"
mapfile -t targets < <(cargo fuzz list)
[ "${#targets[@]}" -gt 0 ] || { echo "fuzz: no targets"; exit 1; }
for t in "${targets[@]}"; do
    [ -n "$(ls -A "seeds/$t" 2>/dev/null)" ] || { echo "fuzz: $t has no seeds in fuzz/seeds/$t"; exit 1; }
done
# One build of every target first (release, debug assertions on, as cargo
# fuzz builds them); the runs below then only link-check.
timeout 3600 cargo fuzz build -s none
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
run_one() {
    local t="$1"
    mkdir -p "corpus/$t"
    # -timeout: one input taking 10 s is a hang; -rss_limit_mb: a leak.
    if timeout $((secs + 300)) cargo fuzz run -s none "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        >"$logs/$t" 2>&1; then
        echo "fuzz: $t: $(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$logs/$t" | grep -o '[0-9]*$') runs in ${secs}s, no crash"
    else
        echo "fuzz: $t FAILED"
        tail -40 "$logs/$t"
        return 1
    fi
}
failed=0
for ((i = 0; i < ${#targets[@]}; i += 2)); do
    pids=()
    for t in "${targets[@]:i:2}"; do
        run_one "$t" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || failed=1; done
done
[ "$failed" = 0 ] || { echo "fuzz: a target failed (its crash input is in fuzz/artifacts/)"; exit 1; }
echo "fuzz: ${#targets[@]} targets, ${secs}s each: ok"
