#!/bin/sh
# host_path_instr.sh — host instructions per cached attention call, counted by callgrind (issue 5).
# Wall clocks on a shared, loaded machine scatter too much for a ~10 us call, so instructions are
# counted instead. For each path, one callgrind run of bench/host_path_loop.lua makes N calls and
# calls the C marker al_version after the first W and after the last (--mark W); callgrind's
# --dump-before=al_version writes calls W+1..N as a part of their own, so start-up, warm-up and trace
# recording stay out of the count and nothing is subtracted across two processes (two processes can
# form different traces). Each path is repeated RUNS times: a path whose figure changes between
# identical runs depends on which traces LuaJIT happened to form.
#
#   sh bench/host_path_instr.sh [RUNS] [PATHS...]     (defaults: 3; func module func_packed module_packed)
#   env: ATTNLAB_LIBDIR (default lib), N (12000), W (2000)
#
# Prints one line per run: path, instructions per call, and the trace aborts during the loop (all,
# and those not caused by a finaliser running during a recording: see bench/host_path_loop.lua).
set -e
cd "$(dirname "$0")/.."
RUNS=${1:-3}
[ $# -gt 0 ] && shift
PATHS=${*:-"func module func_packed module_packed"}
N=${N:-12000}
W=${W:-2000}
export ATTNLAB_LIBDIR=${ATTNLAB_LIBDIR:-lib}
export LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;;"
export OMP_NUM_THREADS=1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

echo "host_path_instr: instructions per call over calls $((W + 1))..$N (callgrind, OMP_NUM_THREADS=1)"
for p in $PATHS; do
  r=1
  while [ "$r" -le "$RUNS" ]; do
    rm -f "$TMP"/cg.out*
    valgrind --tool=callgrind --dump-before=al_version --callgrind-out-file="$TMP/cg.out" \
      luajit bench/host_path_loop.lua "$p" "$N" --mark "$W" >"$TMP/out" 2>"$TMP/err" || { cat "$TMP/err" >&2; exit 1; }
    # the last numbered part ends at the last marker and starts at the one before it
    last=$(ls "$TMP"/cg.out.* | sed 's/.*\.//' | sort -n | tail -1)
    ir=$(sed -n 's/^summary: *//p' "$TMP/cg.out.$last")
    ab=$(sed -n 's/.*calls, \([0-9]*\) trace aborts (\([0-9]*\) other.*/\1 aborts, \2 not from finalisers/p' "$TMP/out")
    awk -v p="$p" -v r="$r" -v ir="$ir" -v n=$((N - W)) -v ab="$ab" \
      'BEGIN { printf "  %-14s run %d  %8.0f instructions/call  (trace recording: %s)\n", p, r, ir / n, ab }'
    r=$((r + 1))
  done
done
