#!/usr/bin/env bash
# The test command: installs what is missing, configures the `ci` preset (debug,
# warnings as errors, CUDA code compiled when nvcc is found), builds everything
# (host code, CUDA code, benchmarks), and runs every test with CTest: host tests, GPU
# tests (skipped without a GPU), compile-fail tests, the installed-package consumers,
# and the Conan test_package. Ends with CTest's summary.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/deps.sh
if [[ -x /usr/local/cuda/bin/nvcc ]] && ! command -v nvcc >/dev/null 2>&1; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

preset=${FERRY_TEST_PRESET:-ci}
cmake --preset "$preset"
cmake --build --preset "$preset"
ctest --preset "$preset" --no-label-summary
