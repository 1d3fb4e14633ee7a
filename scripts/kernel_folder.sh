#!/bin/sh
# kernel_folder.sh — a copy of kernels/ with some build switches' defaults changed, for a GPU run under
# ATTNLAB_KERNEL_DIR (the library compiles the kernels from that folder at run time, so no rebuild is needed):
#
#   sh scripts/kernel_folder.sh DIR NAME=V [NAME=V ...]     e.g. /tmp/k AL_SM90_BWD_PINGPONG=1
#
# DIR is replaced by a fresh copy of kernels/; in it, the one line `#define NAME <integer>` (a switch's default,
# read under #ifndef NAME in kernels/*.cu, *.cuh) becomes `#define NAME V`. V must be an integer; a NAME with no
# such line, or with more than one, is an error (exit 2) naming it, and DIR is removed. Prints each changed line.
# scripts/gpu_session.sh's KERNEL_DEFAULTS uses it; scripts/flash_ab.sh builds its A/B folders the same way.
set -u
cd "$(dirname "$0")/.." || exit 2
[ $# -ge 2 ] || { echo "usage: sh scripts/kernel_folder.sh DIR NAME=V [NAME=V ...]" >&2; exit 2; }
dir=$1
shift
case "$dir" in ''|/|.|..) echo "kernel_folder.sh: DIR '$dir' is not a folder to replace" >&2; exit 2 ;; esac
rm -rf "$dir"
mkdir -p "$dir"
cp kernels/*.cu kernels/*.cuh kernels/*.h "$dir"/ 2>/dev/null
fail() { echo "kernel_folder.sh: $1" >&2; rm -rf "$dir"; exit 2; }
for item in "$@"; do
  name=${item%%=*}
  val=${item#*=}
  case "$item" in *=*) ;; *) fail "expected NAME=V, got '$item'" ;; esac
  case "$name" in ''|*[!A-Za-z0-9_]*) fail "NAME: expected a C identifier, got '$name'" ;; esac
  case "$val" in ''|-|*[!0-9-]*|?*-*) fail "$name: expected an integer value, got '$val'" ;; esac
  n=$(cat "$dir"/*.cu "$dir"/*.cuh "$dir"/*.h 2>/dev/null | grep -c "^#define $name -\{0,1\}[0-9][0-9]*\$")
  [ "$n" -eq 1 ] || fail "$name: expected one '#define $name <integer>' default in kernels/, found $n"
  for f in "$dir"/*.cu "$dir"/*.cuh "$dir"/*.h; do
    [ -f "$f" ] || continue
    if grep -q "^#define $name -\{0,1\}[0-9][0-9]*\$" "$f"; then
      sed -i "s/^#define $name -\{0,1\}[0-9][0-9]*\$/#define $name $val/" "$f"
      echo "kernel_folder.sh: $(basename "$f"): #define $name $val"
    fi
  done
done
