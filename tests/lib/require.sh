# shellcheck shell=bash
# Strict CI for shell tests (issue 47); source it. The shell twin of tests/lib/require.rs,
# reading the same one list, tests/capability-skips.txt.
#
#   require TEST CAPABILITY WHY PROBE...
# runs PROBE (a command: status 0 means CAPABILITY is here) and then:
#   - present: returns 0 (go on);
#   - absent, and the list has `skip TEST CAPABILITY` for a declared capability: prints
#     `CAPABILITY-SKIP TEST: WHY` and returns 1 (the caller skips: `require ... || exit 0`);
#   - absent otherwise, under CI=true (or SYMPHONY_STRICT=1): prints `FAIL TEST: CAPABILITY is
#     missing: WHY` and exits 1, ending the sourcing script;
#   - absent otherwise, outside CI: prints `SKIPPED TEST: ...` and returns 1.
# Skip lines go to stderr and are appended to $SYMPHONY_SKIP_LOG when set (tests/run.sh counts
# them). PROBE's stdout is discarded; its stderr (say, an ImportError) stays in the log.

REQUIRE_LIST="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/capability-skips.txt"

# Whether missing dependencies fail: CI=true (what CI services set) or SYMPHONY_STRICT=1.
require_strict() {
  case "${CI:-}:${SYMPHONY_STRICT:-}" in
    [Tt][Rr][Uu][Ee]:* | 1:* | *:1 | *:[Tt][Rr][Uu][Ee]) return 0 ;;
    *) return 1 ;;
  esac
}

# Whether the list lets TEST skip for CAPABILITY (declared, and listed for TEST).
require_listed() {
  local test=$1 cap=$2
  awk -v t="$test" -v c="$cap" '
    /^[[:space:]]*#/ { next }
    $1 == "capability" && $2 == c && NF >= 3 { declared = 1 }
    $1 == "skip" && NF == 3 && $3 == c && $2 == t { listed = 1 }
    END { exit !(declared && listed) }' "$REQUIRE_LIST"
}

require_report() {
  echo "$1" >&2
  if [ -n "${SYMPHONY_SKIP_LOG:-}" ]; then echo "$1" >>"$SYMPHONY_SKIP_LOG" || true; fi
}

require() {
  local test=$1 cap=$2 why=$3
  shift 3
  if "$@" >/dev/null; then return 0; fi
  if require_listed "$test" "$cap"; then
    require_report "CAPABILITY-SKIP $test: $why"
    return 1
  fi
  if require_strict; then
    echo "FAIL $test: $cap is missing: $why (under CI=true only the capability skips of tests/capability-skips.txt may skip; install what is missing)" >&2
    exit 1
  fi
  require_report "SKIPPED $test: needs $cap: $why (under CI=true this fails: only tests/capability-skips.txt may skip)"
  return 1
}
