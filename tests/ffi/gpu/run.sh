#!/usr/bin/env bash
# Compiles tests/ffi/gpu/cuda_smoke.c with the system gcc against the static library
# and runs it on a GPU (FLARE_BACKEND_CUDA). No CUDA toolkit needed: libcuda.so.1 is
# loaded at run time.
#
#   tests/ffi/gpu/run.sh [path/to/libflare_package.a] [device]
#
# The library defaults to target/release/libflare_package.a (build it with
# `cargo clib` on a machine with Rust; copy it along if the GPU
# machine has none).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
lib=${1:-$root/target/release/libflare_package.a}
device=${2:-0}
[ -f "$lib" ] || { echo "no static library at $lib" >&2; exit 2; }
out=${TMPDIR:-/tmp}/flare_cuda_smoke.$$
gcc -std=c11 -Wall -Wextra -Werror -pedantic -O2 -g -I"$root/include" "$here/cuda_smoke.c" \
  "$lib" -lpthread -ldl -lm -o "$out"
rc=0
"$out" "$device" || rc=$?
rm -f "$out"
exit "$rc"
