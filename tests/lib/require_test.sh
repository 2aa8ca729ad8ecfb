#!/usr/bin/env bash
# Checks tests/capability-skips.txt and the shell helper tests/lib/require.sh (the Rust helper,
# tests/lib/require.rs, has its own unit tests in every crate that includes it). Seconds; run by
# tests/run.sh's first test step.
#   1. The list: every line a comment, `capability NAME DETECTION...` or `skip TEST CAPABILITY`;
#      every skip's capability declared; every skip's file present; every Rust test it names
#      defined in that file (`fn NAME`), so a renamed test cannot leave a stale entry.
#   2. The helper: present -> goes on; a listed capability skip -> CAPABILITY-SKIP and skips, in
#      CI too; anything else -> SKIPPED outside CI, and under CI=true (or SYMPHONY_STRICT=1) a
#      failure that names what is missing.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
list="$root/tests/capability-skips.txt"
fail=0
bad() { echo "[require_test] FAIL: $*" >&2; fail=1; }

# 1. The list.
declare -A declared=()
n=0
while read -r kind a b rest; do
  n=$((n + 1))
  case "$kind" in
    '' | '#'*) ;;
    capability) if [ -n "$a" ] && [ -n "$b" ]; then declared[$a]=1; else bad "line $n: capability NAME DETECTION"; fi ;;
    skip) if [ -z "$b" ] || [ -n "$rest" ]; then bad "line $n: skip TEST CAPABILITY"; fi ;;
    *) bad "line $n: unknown line kind '$kind'" ;;
  esac
done <"$list"
skips=0
while read -r kind test cap _; do
  [ "$kind" = skip ] || continue
  skips=$((skips + 1))
  [ -n "${declared[$cap]:-}" ] || bad "$test: capability '$cap' is not declared"
  file=${test%%::*}
  [ -f "$root/$file" ] || { bad "$test: no file $file"; continue; }
  if [ "$file" != "$test" ]; then
    name=${test#*::}
    name=${name##*::}
    [ "$name" = '*' ] || grep -Eq "fn $name\\b" "$root/$file" || bad "$test: no fn $name in $file"
  fi
done <"$list"
[ "$skips" -gt 0 ] || bad "no skip entries read from $list"

# 2. The helper, against the real list (its GPU entry) in subshells.
. "$root/tests/lib/require.sh"
gpu_test="backend/tests/cuda.rs::a_real_batch_matches_the_reference_output_when_a_gpu_exists"
out="$(mktemp)"
log="$(mktemp)"
trap 'rm -f "$out" "$log"' EXIT
# case_ NAME WANT-STATUS WANT-TEXT ENV... -- TEST CAPABILITY WHY PROBE...: a script that runs
# `require`, then says went-on (it returned 0) or skipping (it returned 1); a failure exits 1
# inside `require`, before either.
case_() {
  local name=$1 want=$2 text=$3 st=0
  shift 3
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  : >"$log"
  # shellcheck disable=SC2016 # the inner script expands its own arguments
  env -u CI -u SYMPHONY_STRICT "${envs[@]}" SYMPHONY_SKIP_LOG="$log" \
    bash -c '. "$0"; if require "$@"; then echo went-on; else echo skipping; fi' "$root/tests/lib/require.sh" "$@" >"$out" 2>&1 || st=$?
  if [ "$st" != "$want" ] || ! grep -q -- "$text" "$out"; then
    bad "$name: status $st (want $want), output: $(cat "$out") (want '$text')"
  fi
}
case_ "present runs" 0 went-on CI=true -- t/x.sh onnx-runtime "why" true
case_ "present runs outside CI" 0 went-on -- t/x.sh onnx-runtime "why" true
case_ "listed capability skip under CI" 0 "CAPABILITY-SKIP $gpu_test: no GPU" CI=true -- "$gpu_test" gpu "no GPU" false
grep -q "CAPABILITY-SKIP $gpu_test" "$log" || bad "the capability skip is not in SYMPHONY_SKIP_LOG"
case_ "listed test, other capability, under CI" 1 "FAIL $gpu_test: onnx-runtime is missing" CI=true -- "$gpu_test" onnx-runtime "no wheel" false
case_ "unlisted test under CI" 1 "FAIL t/x.sh: triton-reference is missing: no ref" CI=true -- t/x.sh triton-reference "no ref" false
[ ! -s "$log" ] || bad "a failure wrote a skip line: $(cat "$log")"
case_ "unlisted test, SYMPHONY_STRICT=1" 1 "FAIL t/x.sh" SYMPHONY_STRICT=1 -- t/x.sh triton-reference "no ref" false
case_ "unlisted test outside CI" 0 "SKIPPED t/x.sh: needs triton-reference: no ref" -- t/x.sh triton-reference "no ref" false
case_ "CI=false is not CI" 0 "SKIPPED t/x.sh" CI=false -- t/x.sh triton-reference "no ref" false
grep -q skipping "$out" || bad "outside CI the caller is told to skip"
# A failure ends the sourcing script: nothing after `require` runs.
case_ "a failure ends the script" 1 "FAIL" CI=TRUE -- t/x.sh etcd "no etcd" false
if grep -q 'went-on\|skipping' "$out"; then bad "the script went on after a failure"; fi

if [ "$fail" != 0 ]; then exit 1; fi
echo "[require_test] ok: $skips capability skip entries, ${#declared[@]} capabilities; helper behaves" >&2
