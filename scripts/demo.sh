#!/usr/bin/env bash
# The main job: installs what is missing, builds ferry-bench (release preset), shows this
# machine as ferry-bench sees it, and runs the quick suite for this machine (with a GPU:
# link, kv, codec, offload, stream; without: nvme, kv, adam-nvme), which ends with tuning advice.
#   scripts/demo.sh [OUTDIR] [ferry-bench options...]
# OUTDIR (default: build/ferry-bench-quick) receives results.json, results.csv,
# summary.md and plots/*.png; an earlier result there is replaced. The disk scenarios
# write their scratch files to build/scratch (the drive of this checkout); pass
# --scratch FOLDER to measure another drive.
set -euo pipefail
out=${1:-}
shift $(( $# > 0 ? 1 : 0 ))
if [[ -n $out ]]; then
  mkdir -p "$(dirname "$out")"
  out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")  # relative to where the command was given
fi
cd "$(dirname "$0")/.."
out=${out:-$PWD/build/ferry-bench-quick}

bash scripts/deps.sh
if [[ -x /usr/local/cuda/bin/nvcc ]] && ! command -v nvcc >/dev/null 2>&1; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
cmake --preset release > /dev/null
cmake --build --preset release --target ferry-bench
mkdir -p build/scratch
bench=build/release/bench/ferry-bench
"$bench" --version
"$bench" list
"$bench" --quick --scratch build/scratch --out "$out" "$@"
echo "summary: $out/summary.md"
