#!/usr/bin/env bash
# Two translation units of one program that both include <ferry/ferry.cuh> (as the 8
# .cu files of ferry-tests-gpu do) must link. Needs nvcc, no GPU. Exit 0: linked;
# 1: the link failed (e.g. "multiple definition of
# ferry::detail::copy_blocks_kernel(ferry::detail::copy_kernel_params)": a non-template,
# non-inline __global__ defined in a header); 77: no nvcc.
# Usage: tests/cuda_link/block_kernel_two_tus.sh [include-dir] (default: include/)
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
inc="${1:-$root/include}"
nvcc="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
[ -x "$nvcc" ] || { echo "no nvcc: skipped"; exit 77; }
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
printf '#include <ferry/ferry.cuh>\nint a() { return ferry::cuda_runtime{}.copy_kernel_available() ? 0 : 0; }\n' >"$dir/a.cu"
printf '#include <ferry/ferry.cuh>\nint a();\nint main() { return a(); }\n' >"$dir/b.cu"
for f in a b; do
  "$nvcc" -std=c++20 -arch=sm_90 -DFERRY_HAS_CUDA=1 -I"$inc" -c "$dir/$f.cu" -o "$dir/$f.o" || { echo "compile of $f.cu failed"; exit 2; }
done
if "$nvcc" -arch=sm_90 "$dir/a.o" "$dir/b.o" -o "$dir/ab" 2>"$dir/link.log"; then
  echo "two translation units including ferry/ferry.cuh: linked"
  exit 0
fi
grep -m3 "multiple definition" "$dir/link.log" || cat "$dir/link.log"
echo "FAILED: two translation units including ferry/ferry.cuh do not link"
exit 1
