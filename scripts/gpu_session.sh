#!/bin/sh
# One GPU-machine session: build, every C test and spec (each spec file in its own process, JOBS at a time),
# then the benchmarks given as arguments (each a command line for luajit, e.g. "bench/variants.lua --only 1");
# logs under $OUT (or /tmp/gpu-out). Usage from the repo root:
#   . .gpu-deps/env.sh && sh scripts/gpu_session.sh ["bench/x.lua --flag" ...]
# JOBS (default 4): suites run at once, so the whole suite fits one 10-minute device call (the GPU has the
# memory; each suite still gets the GPU to itself for its timing-free checks). SPECS: spec files to run
# (default all); WITH_NVRTC=1 adds test_nvrtc_kernels (minutes of NVRTC compiles, no GPU needed). SUITE_TIMEOUT
# (default 300 s) bounds each suite: raise it where every kernel compiles afresh (an ATTNLAB_KERNEL_DIR with an edited
# default: attention_flash_spec did not finish in 300 s so, session 24, nor alone in 390 s on a fresh machine, session
# 26). SHARDS=N (default 1) splits every spec file into N processes (ATTNLAB_SPEC_SHARD=I/N, tests/spec/helper.lua:
# each runs every N-th test), so that one file's compiles and CPU oracles use N cores; its suites are named
# FILE.I-of-N. E.g. SPECS=tests/spec/attention_flash_spec.lua SHARDS=8 JOBS=8 SUITE_TIMEOUT=560.
# KERNEL_DEFAULTS="NAME=V ..." runs everything (suites and benchmarks) with a copy of kernels/ whose switches' defaults
# are changed so (scripts/kernel_folder.sh, in /tmp/attnlab-kernels; exported as ATTNLAB_KERNEL_DIR), e.g.
# KERNEL_DEFAULTS=AL_SM90_BWD_PINGPONG=1: a candidate default checked before it is committed (mode 2 so, session 28).
OUT=${OUT:-/tmp/gpu-out}
JOBS=${JOBS:-4}
SHARDS=${SHARDS:-1}
case "$SHARDS" in ''|*[!0-9]*|0) echo "gpu_session.sh: SHARDS expects a positive integer, got '$SHARDS'"; exit 2 ;; esac
: "${BUSTED:?BUSTED is not set: source .gpu-deps/env.sh first (or set it to a busted command line)}"
mkdir -p "$OUT/suites"
rm -f "$OUT"/suites/*.log
if [ -n "${KERNEL_DEFAULTS:-}" ]; then
  # shellcheck disable=SC2086  # (one NAME=V per word)
  sh scripts/kernel_folder.sh /tmp/attnlab-kernels $KERNEL_DEFAULTS || exit 2
  export ATTNLAB_KERNEL_DIR=/tmp/attnlab-kernels
fi
make -j16 all > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
grep -E "attnlab:" "$OUT/build.log"
export ATTNLAB_LIBDIR="$PWD/lib" LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;${LUA_PATH:-;}"
make -j16 $(ls tests/c/test_*.c | sed 's|tests/c/\(.*\)\.c|build/tests/\1|') >> "$OUT/build.log" 2>&1
[ -n "$WITH_NVRTC" ] && make build/variant_snippets.txt >> "$OUT/build.log" 2>&1
# one line per suite: "NAME<TAB>COMMAND"; each runs with its own log, in parallel, and the logs are joined in
# this order afterwards (tally.sh counts a crash without a report as a failure of that suite)
list="$OUT/suites.txt"
: > "$list"
for t in build/tests/test_*; do
  case "$t" in *nvrtc*) [ -n "$WITH_NVRTC" ] || continue ;; esac
  printf '%s\t%s\n' "$(basename "$t")" "$t" >> "$list"
done
for f in ${SPECS:-tests/spec/*_spec.lua}; do
  for i in $(seq 1 "$SHARDS"); do   # (1/1: every test)
    name=$(basename "$f" .lua)
    [ "$SHARDS" -gt 1 ] && name="$name.$i-of-$SHARDS"
    printf '%s\tenv ATTNLAB_SPEC_SHARD=%s/%s %s -o tests/spec/summary.lua %s\n' "$name" "$i" "$SHARDS" "$BUSTED" "$f" >> "$list"
  done
done
export OUT
tr '\n' '\0' < "$list" | xargs -0 -P "$JOBS" -I{} sh -c '
  name=$(printf "%s" "$1" | cut -f1); cmd=$(printf "%s" "$1" | cut -f2-)
  { echo "== $name"; sh scripts/tally.sh run "$OUT/suites/$name.log.part" timeout "${SUITE_TIMEOUT:-300}" $cmd > /dev/null 2>&1; \
    cat "$OUT/suites/$name.log.part"; } > "$OUT/suites/$name.log" 2>&1
  rm -f "$OUT/suites/$name.log.part"' _ {}
log="$OUT/test.log"
: > "$log"
cut -f1 "$list" | while read -r name; do cat "$OUT/suites/$name.log" >> "$log" 2>/dev/null; done
awk '/^== /{f=$2} /passed, [0-9]+ failed/{ if ($0 !~ / 0 failed/) print f": "$0 }' "$log" | head -40
sh scripts/tally.sh "$log"
for b in "$@"; do echo "== $b"; timeout 300 luajit $b 2>&1 | tail -60; done
