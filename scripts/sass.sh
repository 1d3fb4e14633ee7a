#!/usr/bin/env bash
# sass.sh — the SASS of the flash kernels on a machine without a GPU: what ptxas made of them.
#
#   scripts/sass.sh "fwd-sm90 d128 bf16 nomask"    specialisations whose name holds the text (as printed by
#                                                   build/tests/test_nvrtc_kernels; generated variants too)
#   SASS_DIR=build/sass                             where the cubins, .sass listings and .ops summaries go
#   ATTNLAB_KERNEL_DIR=/tmp/k                       another kernel folder (A/B of a kernel edit)
#
# NVRTC compiles each specialisation to a cubin (build/tests/test_nvrtc_kernels with ATTNLAB_NVRTC_DUMP;
# NVRTC needs no GPU), cuobjdump -sass disassembles it, and for each kernel this prints its register and
# spill report, its instruction count and the most frequent opcodes. The listings are for reading: where
# ptxas put a WARPGROUP.DEPBAR (wgmma.wait_group), whether HGMMAs are serialised, what interleaves with the
# MUFU.EX2s (docs/FLASH.md, "Reading the SASS"). cuobjdump and nvdisasm are not in Debian's CUDA-less
# world: the first run downloads NVIDIA's PyPI wheels (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm) into
# build/sass-tools, once.
set -euo pipefail
cd "$(dirname "$0")/.."
only=${1:?usage: scripts/sass.sh "NAME SUBSTRING" (e.g. "fwd-sm90 d128 bf16 nomask")}
out=${SASS_DIR:-build/sass}
tools=build/sass-tools
if [ ! -x "$tools/bin/cuobjdump" ] || [ ! -x "$tools/bin/nvdisasm" ]; then
    mkdir -p "$tools/wheels" "$tools/bin"
    python3 -m pip download --quiet --no-deps -d "$tools/wheels" nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
    for w in "$tools"/wheels/*.whl; do
        python3 -c 'import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
for n in z.namelist():
    if n.endswith("/bin/cuobjdump") or n.endswith("/bin/nvdisasm"):
        open(sys.argv[2] + "/" + n.rsplit("/", 1)[1], "wb").write(z.read(n))' "$w" "$tools/bin"
    done
    chmod +x "$tools/bin/cuobjdump" "$tools/bin/nvdisasm"
fi
[ -x build/tests/test_nvrtc_kernels ] || make tests >/dev/null
[ -f build/variant_snippets.txt ] || make build/variant_snippets.txt >/dev/null
rm -rf "$out"
mkdir -p "$out"
ATTNLAB_NVRTC_DUMP=$out ATTNLAB_NVRTC_TEST_ONLY=$only build/tests/test_nvrtc_kernels | grep -E '^  ' || true
export PATH=$PWD/$tools/bin:$PATH
for c in "$out"/*.cubin; do
    [ -e "$c" ] || { echo "sass.sh: no specialisation matches \"$only\""; exit 1; }
    s=${c%.cubin}
    cuobjdump -sass "$c" > "$s.sass"
    # one opcode per instruction (predicate and modifiers dropped), in program order
    grep -oE '^\s+/\*[0-9a-f]{4,6}\*/\s+[^;]*' "$s.sass" | sed -E 's#^\s+/\*[0-9a-f]+\*/\s+##; s/^@!?U?P[0-9T] //' |
        awk '{print $1}' | sed 's/\..*//' > "$s.ops"
    printf '%s: %d instructions; ' "$(basename "$s")" "$(wc -l < "$s.ops")"
    sort "$s.ops" | uniq -c | sort -rn | head -12 | awk '{printf "%s %s  ", $2, $1} END {print ""}'
done
echo "sass.sh: listings in $out/*.sass"
