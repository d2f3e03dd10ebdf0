#!/usr/bin/env bash
# ferry's checks on a machine with a GPU (e.g. an H200 machine without Catch2 and friends installed: see docs/guide.md, "On a machine with a GPU").
#   scripts/gpu-check.sh OUTDIR
# Builds the `release` preset for sm_90, runs the GPU tests once under
# compute-sanitizer memcheck and once plain, the host tests, and every GPU scenario
# of ferry-bench in quick mode (the GPU suite into OUTDIR/suite: results, summary, plots,
# advice; overlap and device-nvme with --json); leaves logs and JSON in OUTDIR.
# Libraries the machine lacks come from .deps/*.deb (scripts/fetch-gpu-deps.sh),
# unpacked into a private prefix. Target: under 8 minutes on one H200.
set -uo pipefail
out=${1:?usage: scripts/gpu-check.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
exec > >(tee "$out/gpu-check.log") 2>&1
start=$(date +%s)
step() { echo "== [$(($(date +%s) - start))s] $*"; }
status=0

if compgen -G ".deps/*.deb" >/dev/null; then
  prefix=/tmp/ferry-prefix
  mkdir -p "$prefix"
  for f in .deps/*.deb; do dpkg -x "$f" "$prefix"; done
  export CMAKE_PREFIX_PATH="$prefix/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export PKG_CONFIG_PATH="$prefix/usr/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # Debian's pkg-config files name /usr as their prefix; point them at the private one.
  for pc in "$prefix"/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc; do
    [[ -f $pc ]] && sed -i "s|^prefix=/usr$|prefix=$prefix/usr|" "$pc"
  done
fi
if [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

step "machine"
nvidia-smi --query-gpu=name,pci.link.gen.current,pci.link.width.current,memory.total,driver_version --format=csv || true
nproc; free -g | head -2

step "configure and build (release, sm_90)"
cmake --preset release -DCMAKE_CUDA_ARCHITECTURES=90 -DFERRY_ENABLE_CUDA=ON > "$out/configure.log" 2>&1 ||
  { cat "$out/configure.log"; exit 1; }
cmake --build --preset release -j "$(nproc)" > "$out/build.log" 2>&1 || { tail -50 "$out/build.log"; exit 1; }

gpu_tests=build/release/tests/ferry-tests-gpu
step "GPU tests under compute-sanitizer memcheck"
if command -v compute-sanitizer >/dev/null 2>&1; then
  compute-sanitizer --tool memcheck --leak-check full --error-exitcode 99 "$gpu_tests" > "$out/gpu-tests-memcheck.log" 2>&1
  rc=$?; echo "memcheck exit $rc"; tail -5 "$out/gpu-tests-memcheck.log"; [[ $rc -eq 0 ]] || status=1
else
  echo "compute-sanitizer not found"; status=1
fi

step "GPU tests, plain"
"$gpu_tests" -r junit -o "$out/gpu-tests.xml" > "$out/gpu-tests.log" 2>&1
rc=$?; echo "plain exit $rc"; [[ $rc -eq 0 ]] || { status=1; tail -40 "$out/gpu-tests.log"; }
"$gpu_tests" -r compact >> "$out/gpu-tests.log" 2>&1 || true

for ex in stream_ordering activation_offload layer_streaming; do
  step "example: $ex"
  "build/release/examples/$ex/$ex" > "$out/example-$ex.log" 2>&1 || status=1
  tail -20 "$out/example-$ex.log"
done

step "host, bench and package tests (ctest, conan skipped if absent)"
ctest --test-dir build/release -LE "gpu" --no-label-summary -j "$(nproc)" > "$out/ctest.log" 2>&1 || status=1
tail -5 "$out/ctest.log"

step "ferry-bench: machine probe and GPU scenarios (quick)"
build/release/bench/ferry-bench probe --json "$out/machine.json" > /dev/null || status=1
# The GPU suite (link, codec, offload, stream) into an output folder: JSON, CSV, summary,
# plots and advice (--no-plots when the machine has no gnuplot); --json keeps bench.json.
plots=(); command -v gnuplot >/dev/null 2>&1 || plots=(--no-plots)
mkdir -p build/scratch
build/release/bench/ferry-bench --quick --scratch build/scratch --json "$out/bench.json" --out "$out/suite" \
  "${plots[@]}" 2>&1 | tee "$out/bench.log"
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
step "ferry-bench: overlap and device-nvme (not in the suite)"
build/release/bench/ferry-bench --quick --json "$out/bench-overlap.json" overlap 2>&1 | tee -a "$out/bench.log"
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
build/release/bench/ferry-bench --quick --scratch build/scratch --json "$out/bench-device-nvme.json" device-nvme 2>&1 |
  tee -a "$out/bench.log"
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1

step "micro-benchmarks"
build/release/bench/ferry-micro --benchmark_min_time=0.05 --benchmark_format=json \
  --benchmark_out="$out/micro.json" > "$out/micro.log" 2>&1 || status=1
# Host-side cost per scheduled move, with the real CUDA runtime (BM_gpu_*) and a no-op API.
build/release/bench/ferry-micro-schedule --benchmark_min_time=0.05 --benchmark_format=json \
  --benchmark_out="$out/micro-schedule.json" > "$out/micro-schedule.log" 2>&1 || status=1

step "done, status $status"
exit $status
