#!/usr/bin/env bash
# flash_ab.sh — A/B of kernel -D switches on a GPU, in one command (docs/FLASH.md, "Reading the SASS"):
#
#   scripts/flash_ab.sh AL_SM90_NEW_THING AL_SM90_OTHER+AL_SM90_THIRD
#
# For each NAME, a copy of kernels/ whose `#define NAME 0` default reads 1, or `#define NAME 1` reads 0
# (build/ab/NAME; NAME A+B flips both in one folder; NAME=V sets the default to V). A new schedule goes in
# behind such a switch, off, until this has timed it (session 12 timed and then folded in five:
# docs/PERFORMANCE.md); then scripts/flash_ab.lua runs once per folder, in the order base, each NAME, base again (so drift of the
# GPU's clocks shows as a base-to-base difference), each with its own compile cache. Prints the "T" lines
# (forward and backward times) of every run and, per NAME, whether its "C" lines (bit-exact hashes of
# outputs and gradients) equal the base's; exits 1 if any differ or a run fails. AB_DIR=build/ab.
# Environment as for any GPU run: ATTNLAB_LIBDIR, the cuDNN / CUDA libraries (the device's .gpu-deps/env.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: scripts/flash_ab.sh NAME... (0/1 -D switches of kernels/*.cu)"; exit 2; }
dir=${AB_DIR:-build/ab}
rm -rf "$dir"
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
cp -r kernels "$dir/base"
for n in "$@"; do
    cp -r kernels "$dir/$n"
    for x in ${n//+/ }; do   # A+B: both flipped in one folder
        f=("$dir/$n"/*.cu "$dir/$n"/*.cuh)
        if [[ $x == *=* ]]; then   # NAME=V: the default set to V
            if grep -lq "^#define ${x%%=*} [0-9]*\$" "${f[@]}"; then
                sed -i "s/^#define ${x%%=*} [0-9]*\$/#define ${x%%=*} ${x#*=}/" "${f[@]}"
            else
                echo "flash_ab.sh: no '#define ${x%%=*} N' default in kernels/*.cu, *.cuh"
                exit 2
            fi
        elif grep -lq "^#define $x 0\$" "${f[@]}"; then
            sed -i "s/^#define $x 0\$/#define $x 1/" "${f[@]}"
        elif grep -lq "^#define $x 1\$" "${f[@]}"; then
            sed -i "s/^#define $x 1\$/#define $x 0/" "${f[@]}"
        else
            echo "flash_ab.sh: no '#define $x 0' or '#define $x 1' default in kernels/*.cu, *.cuh"
            exit 2
        fi
    done
done
status=0
run() {   # run FOLDER-NAME LOG
    local t0=$SECONDS
    ATTNLAB_KERNEL_DIR=$dir/$1 XDG_CACHE_HOME=$dir/cache-$1 luajit scripts/flash_ab.lua > "$2" 2>&1
    local rc=$?
    echo "== $1: exit $rc, $((SECONDS - t0)) s"
    grep '^T ' "$2"
    [ $rc -eq 0 ] || { tail -n 5 "$2"; status=1; }
}
run base "$dir/base.log"
for n in "$@"; do run "$n" "$dir/$n.log"; done
run base "$dir/base2.log"
for n in "$@" base2; do
    f=$dir/$n.log
    if diff -q <(grep '^C ' "$dir/base.log") <(grep '^C ' "$f") > /dev/null && grep -q '^C ' "$f"; then
        echo "== $n: outputs and gradients bit-identical to base ($(grep -c '^C ' "$f") cases)"
    else
        echo "== $n: DIFFERS from base:"
        diff <(grep '^C ' "$dir/base.log") <(grep '^C ' "$f") | head -n 8
        status=1
    fi
done
exit $status
