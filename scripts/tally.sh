#!/bin/sh
# tally.sh — the closing line of `make test`: adds up the per-suite result lines of a test log.
#
#   sh scripts/tally.sh LOG
#       Sums every line of LOG that ends in "N passed, N failed" or "N passed, N failed, N skipped"
#       (an optional "label: " before it, e.g. "c-test views: 12 passed, 0 failed", and an optional
#       " (note)" after it are allowed; ANSI colours and CRs are ignored). Prints the grand total as
#       its very last line, "N passed, N failed" plus ", N skipped" when anything was skipped.
#       Exit status 1 if anything failed or if no suite reported at all.
#
#   sh scripts/tally.sh run LOG COMMAND [ARGS...]
#       Runs one suite, showing its output and appending it to LOG. If the command exits non-zero
#       (a crash, a signal, a missing binary) without reporting a failure itself, it appends
#       "<command>: 0 passed, 1 failed (exit status S, no failure reported)" so the tally counts it.
#       Returns the command's exit status.
#
# Makefile use:
#   @rm -f $(BUILD)/test.log
#   @for t in $(C_TESTS); do sh scripts/tally.sh run $(BUILD)/test.log $$t; done; true
#   @sh scripts/tally.sh run $(BUILD)/test.log env $(LUA_ENV) $(BUSTED) -o tests/spec/summary.lua tests/spec; true
#   @sh scripts/tally.sh $(BUILD)/test.log

# One awk program for both modes: prints "passed failed skipped suites" for the result lines of its input.
sum_lines() {
    awk '
      {
        line = $0
        gsub(/\033\[[0-9;]*[A-Za-z]/, "", line)
        gsub(/\r/, "", line)
        if (match(line, /(^|: )[0-9]+ passed, [0-9]+ failed(, [0-9]+ skipped)?( \(.*\))?$/)) {
          s = substr(line, RSTART)
          sub(/^: /, "", s)
          sub(/ \(.*\)$/, "", s)
          n = split(s, w, /[ ,]+/)
          p += w[1]; f += w[3]; if (n >= 6) k += w[5]; suites++
        }
      }
      END { printf "%d %d %d %d\n", p, f, k, suites }' "$@"
}

if [ "${1:-}" = run ]; then
    log=${2:?usage: tally.sh run LOG COMMAND [ARGS...]}
    shift 2
    [ $# -gt 0 ] || { echo "usage: tally.sh run LOG COMMAND [ARGS...]" >&2; exit 2; }
    name=$(basename "$1")
    [ "$name" = env ] && name=suite
    out=$(mktemp "${TMPDIR:-/tmp}/tally.XXXXXX") || exit 2
    st=$(mktemp "${TMPDIR:-/tmp}/tally.XXXXXX") || exit 2
    # The status goes through a file: a pipeline's status is the last command's (tee) in POSIX sh.
    { "$@" 2>&1; echo $? > "$st"; } | tee "$out"
    status=$(cat "$st")
    cat "$out" >> "$log"
    if [ "$status" != 0 ]; then
        set -- $(sum_lines "$out")
        if [ "$2" = 0 ]; then
            { echo "FAIL $*: exit status $status, no failure reported"
              echo "$name: 0 passed, 1 failed (exit status $status, no failure reported)"; } | tee -a "$log"
        fi
    fi
    rm -f "$out" "$st"
    exit "$status"
fi

log=${1:?usage: tally.sh LOG   or   tally.sh run LOG COMMAND [ARGS...]}
if [ ! -r "$log" ]; then
    echo "tally: cannot read $log"
    echo "0 passed, 1 failed"
    exit 1
fi
# Every "FAIL ..." line of the log (C tests and busted specs both write them) again, just above the total:
# a CI log is often read from its tail only.
fails=$(sed 's/\x1b\[[0-9;]*[A-Za-z]//g' "$log" | grep -E '^FAIL ' | head -50)
[ -n "$fails" ] && printf 'failures:\n%s\n' "$fails"
set -- $(sum_lines "$log")
passed=$1 failed=$2 skipped=$3 suites=$4
if [ "$suites" = 0 ]; then
    echo "tally: no suite reported a result in $log"
    failed=1
fi
if [ "$skipped" -gt 0 ]; then
    echo "$passed passed, $failed failed, $skipped skipped"
else
    echo "$passed passed, $failed failed"
fi
[ "$failed" = 0 ]
