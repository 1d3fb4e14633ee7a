#!/bin/sh
# One GPU-machine session: build, every C test and spec (each spec file in its own process), the
# benchmarks given as arguments; logs under $OUT (or /tmp/gpu-out). Usage from the repo root:
#   . .gpu-deps/env.sh && sh scripts/gpu_session.sh [bench/x.lua ...]
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
make -j16 all > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
grep -E "attnlab:" "$OUT/build.log"
export ATTNLAB_LIBDIR="$PWD/lib" LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;${LUA_PATH:-;}"
log="$OUT/test.log"; : > "$log"
make -j16 $(ls tests/c/test_*.c | sed 's|tests/c/\(.*\)\.c|build/tests/\1|') >> "$OUT/build.log" 2>&1
for t in build/tests/test_*; do
  case "$t" in *nvrtc*) [ -n "$WITH_NVRTC" ] || continue ;; esac
  timeout 300 sh scripts/tally.sh run "$log" "$t" > /dev/null 2>&1
done
for f in ${SPECS:-tests/spec/*_spec.lua}; do
  echo "== $f" >> "$log"
  timeout 300 sh scripts/tally.sh run "$log" env $BUSTED -o tests/spec/summary.lua "$f" > /dev/null 2>&1
done
awk '/^== /{f=$2} /passed, [0-9]+ failed/{ if ($0 !~ / 0 failed/) print f": "$0 }' "$log" | head -40
sh scripts/tally.sh "$log"
for b in "$@"; do echo "== $b"; timeout 300 luajit "$b" 2>&1 | tail -40; done
