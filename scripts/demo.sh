#!/usr/bin/env bash
# The main job: installs what is missing, builds ferry-bench (release preset), shows
# this machine as ferry-bench sees it, and runs the quick suite for this machine.
#   scripts/demo.sh [OUTDIR]      results JSON goes to OUTDIR (default: build/demo)
set -euo pipefail
out=${1:-}
if [[ -n $out ]]; then
  mkdir -p "$out"
  out=$(cd "$out" && pwd)  # relative to where the command was given
fi
cd "$(dirname "$0")/.."
out=${out:-$PWD/build/demo}

bash scripts/deps.sh
if [[ -x /usr/local/cuda/bin/nvcc ]] && ! command -v nvcc >/dev/null 2>&1; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
cmake --preset release > /dev/null
cmake --build --preset release --target ferry-bench
mkdir -p "$out"
bench=build/release/bench/ferry-bench
"$bench" --version
"$bench" list
"$bench" --quick --json "$out/results.json"
echo "machine description and results: $out/results.json"
