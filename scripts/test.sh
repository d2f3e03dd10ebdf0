#!/usr/bin/env bash
# The test command: installs what is missing, configures the `ci` preset (debug,
# warnings as errors, CUDA code compiled when nvcc is found), builds everything
# (host code, CUDA code, benchmarks), and runs every test with CTest: host tests, GPU
# tests (skipped without a GPU), compile-fail tests, the installed-package consumers,
# the Conan test_package, and the dry run of the GPU check (scripts/gpu-build.sh first
# builds the GPU machine's binaries when nvcc is there). Ends with CTest's summary.
set -euo pipefail
cd "$(dirname "$0")/.."

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
  bash scripts/gpu-build.sh
  export FERRY_REQUIRE_GPU_CARRY=1
fi

preset=${FERRY_TEST_PRESET:-ci}
cmake --preset "$preset"
cmake --build --preset "$preset"
ctest --preset "$preset" --no-label-summary
