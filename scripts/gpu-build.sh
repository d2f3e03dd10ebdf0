#!/usr/bin/env bash
# Builds, on this machine (no GPU needed), everything the GPU run needs, and packs it into
# one folder to carry to the GPU machine:
#   scripts/gpu-build.sh [CARRY_DIR]        (default: build/gpu-carry in the checkout)
# CARRY_DIR (relative to the working folder) is replaced only if it is an earlier carry
# folder or empty; anything else is refused. FERRY_CARRY_LIMIT_MIB (default 64, the
# device tool's limit) is the most the folder may hold.
# The `gpu` preset (CMakePresets.json): Release for sm_90 (H100/H200), the CUDA runtime,
# liburing, libstdc++ and libgcc linked statically (FERRY_STATIC_DEPENDENCIES), so the
# binaries need only what the GPU machine has: glibc >= 2.36, the CUDA driver, and cuBLAS
# 13 for ferry-bench and the examples. Catch2, CLI11 and nlohmann_json are header-only
# here; Google Benchmark has no static archive in Debian, so its .so travels in lib/.
# The carry folder holds bin/ (binaries without debug sections, but with their symbols,
# and kernels built with -lineinfo, so sanitizer reports name functions and lines), lib/, gpu-check.sh and MANIFEST
# (commit, build flags, sha256 of every file; gpu-check.sh verifies it first). Nothing in
# it needs building there. It must stay under the device tool's 64 MiB carry limit.
# Run it on the GPU machine:   build/gpu-carry/gpu-check.sh OUT   (or scripts/gpu-check.sh OUT)
# Here, without a GPU, the same command is the dry run (tests/gpu_check_dry_run.sh).
set -euo pipefail
[[ $# -le 1 ]] || { echo "usage: scripts/gpu-build.sh [CARRY_DIR]" >&2; exit 2; }
caller=$(pwd)
cd "$(dirname "$0")/.."
carry=${1:-build/gpu-carry}
case $carry in
  /*) ;;
  *) [[ $# -eq 1 ]] && carry=$caller/$carry ;;  # a given folder is relative to where the command ran
esac
limit_mib=${FERRY_CARRY_LIMIT_MIB:-64}
[[ $limit_mib =~ ^[1-9][0-9]*$ ]] || { echo "gpu-build: FERRY_CARRY_LIMIT_MIB '$limit_mib' is not a number of MiB" >&2; exit 2; }
# Refuse, before building anything, to replace a folder that is not an earlier carry folder.
if [[ -e $carry ]]; then
  if [[ ! -d $carry ]]; then
    echo "gpu-build: CARRY_DIR '$carry' exists and is not a folder" >&2; exit 2
  fi
  if [[ -n $(ls -A -- "$carry") ]] && ! head -n 1 -- "$carry/MANIFEST" 2>/dev/null | grep -q '^# ferry GPU carry folder'; then
    echo "gpu-build: CARRY_DIR '$carry' holds files and is not an earlier carry folder (no MANIFEST); choose another" >&2
    exit 2
  fi
fi

if [[ -x /usr/local/cuda/bin/nvcc ]] && ! command -v nvcc >/dev/null 2>&1; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
command -v nvcc >/dev/null 2>&1 || { echo "gpu-build: nvcc not found (the CUDA toolkit is needed to build)" >&2; exit 1; }

start=$(date +%s)
mkdir -p build
echo "gpu-build: configure (preset gpu: release, sm_90, static runtime)"
cmake --preset gpu >build/gpu-configure.log 2>&1 || { cat build/gpu-configure.log >&2; exit 1; }
echo "gpu-build: build (ferry-tests-gpu, ferry-bench, micro-benchmarks, examples)"
cmake --build --preset gpu

bin_dir=build/gpu
binaries=(
  "$bin_dir/tests/ferry-tests-gpu"
  "$bin_dir/bench/ferry-bench"
  "$bin_dir/bench/ferry-micro-schedule"
  "$bin_dir/bench/ferry-micro-memory"
  "$bin_dir/examples/stream_ordering/stream_ordering"
  "$bin_dir/examples/activation_offload/activation_offload"
  "$bin_dir/examples/layer_streaming/layer_streaming"
  "$bin_dir/examples/kv_offload/kv_offload"
)

# A fresh folder each time, written beside the old one and swapped in when complete.
mkdir -p "$(dirname "$carry")"
staging=$(mktemp -d "$(dirname "$carry")/.gpu-carry.XXXXXX")
trap 'rm -rf "$staging"' EXIT
chmod 755 "$staging"  # mktemp makes it 0700; the GPU machine may run it as another user
mkdir -p "$staging/bin" "$staging/lib"
for b in "${binaries[@]}"; do
  [[ -x $b ]] || { echo "gpu-build: $b was not built" >&2; exit 1; }
  cp "$b" "$staging/bin/"
  strip --strip-debug "$staging/bin/$(basename "$b")"
done

# Shared libraries the binaries need (their NEEDED entries) beyond glibc, the driver and
# cuBLAS: they travel in lib/ (gpu-check.sh puts it on LD_LIBRARY_PATH). The carried
# libraries may need libstdc++ and libgcc_s, which every Linux with a GPU driver has
# (Ubuntu 24.04's are newer than Debian 12's). Anything else is an error here, not a
# surprise there.
system='^(libc|libm|libdl|librt|libpthread|ld-linux-x86-64|libcuda|libcublas|libcublasLt)\.so'
needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
for b in "$staging"/bin/*; do
  for name in $(needed "$b"); do
    [[ $name =~ $system ]] && continue
    if [[ $name == libbenchmark.so* ]]; then
      path=$(ldd "$b" | awk -v n="$name" '$1 == n {print $3}')
      [[ -f $path ]] || { echo "gpu-build: $(basename "$b") needs $name, which was not found here" >&2; exit 1; }
      [[ -f $staging/lib/$name ]] || cp -L "$path" "$staging/lib/$name"
      continue
    fi
    echo "gpu-build: $(basename "$b") needs $name, which the GPU machine may lack; link it statically" >&2
    exit 1
  done
done
for l in "$staging"/lib/*; do
  [[ -f $l ]] || continue
  for name in $(needed "$l"); do
    [[ $name =~ $system || $name =~ ^(libstdc\+\+|libgcc_s)\.so ]] && continue
    echo "gpu-build: the carried $(basename "$l") needs $name, which the GPU machine may lack" >&2
    exit 1
  done
done

cp scripts/gpu-check.sh "$staging/gpu-check.sh"
chmod +x "$staging/gpu-check.sh"

# The PyTorch package's source (python/ and what its CMake build reads: the top-level
# CMakeLists.txt, cmake/, include/; README.md and docs/python.md, whose Python blocks its
# tests run; examples/torch_gpt, which python-tests runs on the GPU), as the working tree has it: gpu-check's python-build
# step builds ferry-torch there. A Python extension is built for one Python version, and
# the GPU machine's (3.12, beside its PyTorch) is not one this machine has (3.11; neither
# Debian 12 nor PyPI offers 3.12's headers), so the package cannot travel built. It builds
# there offline, with the machine's own nvcc, nanobind and scikit-build-core.
mkdir -p "$staging/src"
git ls-files -z -- CMakeLists.txt cmake include python examples/torch_gpt README.md docs/python.md ':!python/build' |
  tar --null -T - -cf - | tar -xf - -C "$staging/src"

commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
dirty=$(git status --porcelain 2>/dev/null | { grep -vc '^??' || true; })
{
  echo "# ferry GPU carry folder, made by scripts/gpu-build.sh"
  echo "commit $commit$([[ $dirty -gt 0 ]] && echo " (+$dirty uncommitted changes)")"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n), $(nvcc --version | tail -n 2 | head -n 1)"
  echo "flags $(grep -E '^CMAKE_CUDA_ARCHITECTURES:|^CMAKE_BUILD_TYPE:' "$bin_dir/CMakeCache.txt" | sed 's/:[A-Z]*=/=/' | tr '\n' ' ')"
  echo "glibc needed $(for b in "$staging"/bin/*; do objdump -T "$b" | grep -o 'GLIBC_[0-9.]*'; done | sort -uV | tail -n 1)"
  echo "# sha256 of every file (gpu-check.sh checks them before it runs anything)"
  (cd "$staging" && find bin lib src gpu-check.sh -type f | sort | xargs sha256sum)
} >"$staging/MANIFEST"

size_kib=$(du -sk "$staging" | cut -f1)
if ((size_kib > limit_mib * 1024)); then
  echo "gpu-build: the carry folder is $((size_kib / 1024)) MiB, over the ${limit_mib} MiB limit" >&2
  exit 1
fi
rm -rf "$carry"
mv "$staging" "$carry"
trap - EXIT
echo "gpu-build: $carry ($((size_kib / 1024)) MiB of ${limit_mib} MiB) in $(($(date +%s) - start)) s"
cat "$carry/MANIFEST" | sed -n '2,5p'
echo "gpu-build: on the GPU machine run: $carry/gpu-check.sh OUT"
