#!/usr/bin/env bash
# The test command: installs what is missing, configures the `ci` preset (debug,
# warnings as errors, CUDA code compiled when nvcc is found), builds everything
# (host code, CUDA code, benchmarks), and runs every test with CTest: host tests, GPU
# tests (skipped without a GPU), compile-fail tests, the installed-package consumers,
# the Conan test_package, and the dry run of the GPU check (scripts/gpu-build.sh first
# builds the GPU machine's binaries when nvcc is there), and the PyTorch package's pytest
# suite (python/, its environment made by scripts/python-env.sh); before that, the host
# tests under the asan and tsan presets (FERRY_SANITIZERS=0 skips them). Ends with CTest's
# summary.
set -euo pipefail
cd "$(dirname "$0")/.."

# show_failures LOG: each failed test's result line and its whole output (CTest writes it
# after the line, up to the next result, the next "Start" or the summary), at most 400
# lines a test; skipped tests are not failures. So that CI's output says why, not only which.
show_failures() {
  local found
  found=$(awk '/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: / { on = ($0 ~ /\*\*\*/ && $0 !~ /\*\*\*Skipped/); n = 0; if (on) print; next }
       /^ +Start +[0-9]+: |^[0-9]+% tests passed|^The following tests|^Total Test time|^\[[A-Z_]+\]/ { on = 0 }
       on && n < 400 { print; n++ }' "$1")
  if [[ -n $found ]]; then echo "$found"; else tail -n 60 "$1"; fi  # no failed test named: CTest's own end
}

# stage NAME: a line that says where the run is and how long it has taken, so that CI's
# output shows where its time goes.
stage() { echo "== $1 ($((SECONDS / 60)) min $((SECONDS % 60)) s in)"; }

stage "dependencies"
bash scripts/deps.sh
if [[ -x /usr/local/cuda/bin/nvcc ]] && ! command -v nvcc >/dev/null 2>&1; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

# ccache (FERRY_USE_CCACHE): paths relative to the checkout and no working folder in the
# hash, so a clean clone in another folder (as CI makes) hits the cache of the last run.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(pwd)} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}

# The GPU machine's binaries (release, sm_90), packed into build/gpu-carry: CTest's
# "gpu-check: dry run" runs scripts/gpu-check.sh from it, as the GPU machine would.
if command -v nvcc >/dev/null 2>&1; then
  stage "the GPU machine's binaries (scripts/gpu-build.sh)"
  bash scripts/gpu-build.sh
  export FERRY_REQUIRE_GPU_CARRY=1
fi

preset=${FERRY_TEST_PRESET:-ci}
# The PyTorch package (python/): its environment (torch from PyPI, made once per machine
# and kept) and ferry-torch built from this checkout into it; CTest then runs its pytest
# suite (label python). FERRY_PYTHON_TESTS=0 skips it.
python_args=()
if [[ "${FERRY_PYTHON_TESTS:-1}" != 0 && "$preset" == ci ]]; then
  stage "the PyTorch package's environment (scripts/python-env.sh)"
  python_env=$(bash scripts/python-env.sh | tail -n 2)
  python_args=("-DFERRY_PYTHON=$(sed -n 1p <<<"$python_env")" "-DFERRY_PYTHON_PATH=$(sed -n 2p <<<"$python_env")")
fi
stage "the $preset build"
cmake --preset "$preset" "${python_args[@]}"
cmake --build --preset "$preset"

# The host suite once more under each sanitizer preset (host code, no CUDA): ASan with
# UBSan, then ThreadSanitizer, and under TSan the concurrent suites (pipelines,
# scheduler, pinned pool, I/O engines) once more with more jobs than
# cores, so that they run under load. FERRY_SANITIZERS=0 skips this (a quicker local
# run); CI runs it. A sanitizer report fails the test (halt_on_error, abort_on_error).
# The tests whose code no sanitizer sees (compile-fail, docs, packages, the GPU check's
# dry run) and the timing-mode runs are the ci preset's alone (CMakePresets.json); the
# runs of ferry-bench and the micro-benchmarks (label bench_tools) are asan's and ci's:
# the tsan preset builds only the suites (host tests, the harness's tests, host examples).
if [[ "${FERRY_SANITIZERS:-1}" != 0 && "$preset" == ci ]]; then
  export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-12G}  # three builds' objects stay cached
  for sanitizer in asan tsan; do
    stage "host tests under the $sanitizer preset"
    cmake --preset "$sanitizer" >/dev/null
    cmake --build --preset "$sanitizer"
    ctest --preset "$sanitizer" --no-label-summary --quiet --output-log "build/$sanitizer/ctest.log" ||
      { show_failures "build/$sanitizer/ctest.log"; exit 1; }
    echo "   all passed (log: build/$sanitizer/ctest.log)"
  done
  stage "concurrent suites under ThreadSanitizer once more, 4 jobs on $(nproc) cores"
  ctest --preset tsan --no-label-summary --quiet --output-log build/tsan/ctest-repeat.log -j4 \
    -R "tensor_cache|layer_streamer|scheduler|cpu_executor|CPU model|CPU runtime|cpu_runtime|ordering|device_arena|pinned_pool: 8 threads|engine|concurren|threads" ||
    { show_failures build/tsan/ctest-repeat.log; exit 1; }
  echo "   all passed (log: build/tsan/ctest-repeat.log)"
fi

stage "every test (the $preset preset)"
ctest --preset "$preset" --no-label-summary
