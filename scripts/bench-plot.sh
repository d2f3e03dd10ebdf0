#!/usr/bin/env bash
# Redraws the plots of a ferry-bench output folder from its data and gnuplot scripts
# (plots/NAME.dat, plots/NAME.gp), e.g. after editing a script's style.
#   scripts/bench-plot.sh OUTDIR
set -euo pipefail
dir=${1:?usage: scripts/bench-plot.sh OUTDIR (a ferry-bench output folder)}
if [[ ! -f $dir/.ferry-bench ]]; then
  echo "bench-plot: $dir is not a ferry-bench output folder (no .ferry-bench file)" >&2
  exit 1
fi
if ! command -v gnuplot >/dev/null 2>&1; then
  echo "bench-plot: gnuplot is not on PATH (apt-get install gnuplot-nox, or scripts/deps.sh)" >&2
  exit 1
fi
shopt -s nullglob
scripts=("$dir"/plots/*.gp)
if ((${#scripts[@]} == 0)); then
  echo "bench-plot: $dir has no plots (run without --no-plots)" >&2
  exit 1
fi
for gp in "${scripts[@]}"; do
  (cd "$dir/plots" && gnuplot "$(basename "$gp")")
  echo "bench-plot: ${gp%.gp}.png"
done
