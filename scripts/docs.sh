#!/usr/bin/env bash
# Builds ferry's API reference with Doxygen (docs/Doxyfile) into build/docs/html and
# fails, printing them, when Doxygen warned (undocumented public entities, wrong
# @param names, broken references, ...). Run from anywhere; needs doxygen on PATH
# (scripts/deps.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v doxygen >/dev/null 2>&1; then
  echo "docs: doxygen not found (bash scripts/deps.sh installs it)" >&2
  exit 1
fi
log=build/docs/warnings.log
mkdir -p build/docs
rm -f "$log"
doxygen docs/Doxyfile
if [[ -s $log ]]; then
  echo "docs: doxygen warned ($(grep -c 'warning:' "$log" || true) warnings, $log):" >&2
  cat "$log" >&2
  exit 1
fi
echo "docs: build/docs/html/index.html (no warnings)"
