#!/bin/sh
# notebooks/kernel/make_spec.sh DIR ROOT LIBDIR — writes the attnlab kernel spec into DIR/kernels/attnlab/
# (kernel.json from the template next to this file, with the repository root and the library folder
# filled in). Put DIR on JUPYTER_PATH to use it without installing, or install it with
# `jupyter kernelspec install --user --replace --name attnlab DIR/kernels/attnlab` (make notebook-kernel).
# The kernel runs Debian's /usr/bin/python3 (where python3-ipykernel lives), whatever python3 is first
# on PATH.
set -eu
dir=$1; root=$2; libdir=$3
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$dir/kernels/attnlab"
sed -e "s|@ROOT@|$root|g" -e "s|@LIBDIR@|$libdir|g" "$here/kernel.json" > "$dir/kernels/attnlab/kernel.json"
echo "$dir/kernels/attnlab"
