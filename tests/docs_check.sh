#!/usr/bin/env bash
# Keeps docs/benchmarks.md a page of today's figures rather than a lab notebook
# (issue 47, item 6). The format it checks is described at the top of
# docs/benchmarks.md:
#   - the file is at most 800 lines;
#   - every `###` section is one figure and has a `Command:` line, a `Machine:`
#     line naming a key of the file's machine table, and a `Date:` line with an
#     ISO date (YYYY-MM-DD);
#   - no heading carries a date (a dated heading is a journal entry: it belongs
#     in docs/journal/), in docs/benchmarks.md and docs/decisions.md alike;
#   - relative links in both files point at files that exist.
# Before checking the real files it checks that each rule rejects a file that
# breaks it, so a checker that accepts everything fails here.
# Pure bash + python3; about two seconds, most of it starting python3 for the
# self-test's fixtures.
#
# Usage: bash tests/docs_check.sh [BENCHMARKS.md [DECISIONS.md]]
set -euo pipefail
cd "$(dirname "$0")/.."

check() {
    python3 - "$@" <<'PY'
import os
import re
import sys

MAX_LINES = 800
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
HEADING = re.compile(r"^(#{1,6})\s+(.*)$")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
FIELDS = ("Command:", "Machine:", "Date:")

errors = []


def fail(path, line, message):
    errors.append(f"{path}:{line}: {message}")


def read(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().split("\n")
    except OSError as e:
        fail(path, 0, f"cannot read: {e}")
        return None


def headings(lines):
    """(line number, level, title) of every heading outside fenced code."""
    fenced = False
    for i, line in enumerate(lines, 1):
        if line.startswith("```"):
            fenced = not fenced
            continue
        m = HEADING.match(line)
        if m and not fenced:
            yield i, len(m.group(1)), m.group(2)


def no_dated_headings(path, lines):
    for i, _, title in headings(lines):
        if DATE.search(title):
            fail(path, i, f"heading carries a date (journal entries go to docs/journal/): {title!r}")


def links_resolve(path, lines):
    base = os.path.dirname(path)
    for i, line in enumerate(lines, 1):
        for target in LINK.findall(line):
            if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
                continue
            if not os.path.exists(os.path.join(base, target)):
                fail(path, i, f"link to a missing file: {target}")


def machine_keys(lines):
    """Keys of the machine table: rows `| \`key\` | ... |` after a `**Machines**` line."""
    keys = set()
    in_table = False
    for line in lines:
        if line.startswith("**Machines**"):
            in_table = True
            continue
        if in_table:
            m = re.match(r"^\|\s*`([a-z0-9-]+)`\s*\|", line)
            if m:
                keys.add(m.group(1))
            elif keys and not line.startswith("|"):
                break
    return keys


def benchmarks(path):
    lines = read(path)
    if lines is None:
        return
    if lines and lines[-1] == "":
        lines = lines[:-1]
    if len(lines) > MAX_LINES:
        fail(path, len(lines), f"{len(lines)} lines, more than {MAX_LINES}: replace figures, move history to docs/journal/")
    keys = machine_keys(lines)
    if not keys:
        fail(path, 0, "no machine table (a `**Machines**` line followed by rows `| `key` | ... |`)")
    no_dated_headings(path, lines)
    links_resolve(path, lines)
    marks = list(headings(lines))
    figures = 0
    for n, (start, level, title) in enumerate(marks):
        if level != 3:
            continue
        figures += 1
        end = marks[n + 1][0] - 1 if n + 1 < len(marks) else len(lines)
        body = lines[start:end]
        for field in FIELDS:
            found = [l for l in body if l.startswith(field)]
            if not found:
                fail(path, start, f"figure {title!r} has no `{field}` line")
                continue
            value = found[0][len(field):]
            if field == "Date:" and not DATE.search(value):
                fail(path, start, f"figure {title!r}: `Date:` has no YYYY-MM-DD date")
            if field == "Machine:" and keys and not any(re.search(rf"\b{re.escape(k)}\b", value) for k in keys):
                fail(path, start, f"figure {title!r}: `Machine:` names none of {sorted(keys)}")
            if field == "Command:" and not value.strip():
                fail(path, start, f"figure {title!r}: empty `Command:`")
    if figures == 0:
        fail(path, 0, "no `###` figure sections")


def decisions(path):
    lines = read(path)
    if lines is None:
        return
    no_dated_headings(path, lines)
    links_resolve(path, lines)


benchmarks(sys.argv[1])
if len(sys.argv) > 2:
    decisions(sys.argv[2])
for e in errors:
    print(f"docs_check: {e}", file=sys.stderr)
sys.exit(1 if errors else 0)
PY
}

# Each rule must reject a file that breaks it.
self_test() {
    local dir good
    dir=$(mktemp -d)
    trap 'rm -rf "$dir"' RETURN
    # shellcheck disable=SC2016 # backquotes are Markdown here, not expansions
    good='# B

**Machines**

| key | what |
|---|---|
| `vm` | a machine |

## Area

### A figure

Command: `true`
Machine: vm, quiet
Date: 2026-01-01

Result.
'
    printf '%s' "$good" > "$dir/good.md"
    check "$dir/good.md" || { echo "docs_check: self-test: a well-formed file was rejected" >&2; return 1; }
    local name bad
    for name in no-command no-machine unknown-machine no-date bad-date dated-heading too-long broken-link; do
        case $name in
            no-command) bad=${good/Command: \`true\`/} ;;
            no-machine) bad=${good/Machine: vm, quiet/} ;;
            unknown-machine) bad=${good/Machine: vm, quiet/Machine: laptop} ;;
            no-date) bad=${good/Date: 2026-01-01/} ;;
            bad-date) bad=${good/Date: 2026-01-01/Date: yesterday} ;;
            dated-heading) bad="$good
### 2026-02-02 a new run

Command: \`true\`
Machine: vm
Date: 2026-02-02
" ;;
            too-long) bad="$good$(printf 'x\n%.0s' $(seq 1 800))" ;;
            broken-link) bad="$good
See [the journal](journal/missing.md).
" ;;
        esac
        printf '%s' "$bad" > "$dir/$name.md"
        if check "$dir/$name.md" 2>/dev/null; then
            echo "docs_check: self-test: a file with $name was accepted" >&2
            return 1
        fi
    done
}

self_test
check "${1:-docs/benchmarks.md}" "${2:-docs/decisions.md}"
echo "docs_check: ok ($(wc -l < "${1:-docs/benchmarks.md}") lines in ${1:-docs/benchmarks.md})"
