#!/usr/bin/env bash
# clang-format 19 over ferry's C++ and CUDA sources, with the repository's .clang-format.
#   scripts/format.sh [--check] [FILE...]
# Without FILEs: the files changed against origin/main (or HEAD when there is no such
# ref), then the ones not yet committed — format what you touch. --all: every tracked
# source. --check: change nothing, list the files that differ, exit 1 if any do.
#
# The version is pinned (the PyPI wheel `clang-format==19.1.7`, installed once into
# build/format-venv): clang-format before 16 breaks concepts (`{ e } noexcept -> C` came
# out as `noexcept->C` on a line of its own), and versions differ in alignment, so one
# version keeps the diffs of formatting alone out of reviews.
set -euo pipefail
cd "$(dirname "$0")/.."

version=19.1.7
venv=build/format-venv
check=0
all=0
files=()
for a in "$@"; do
  case $a in
    --check) check=1 ;;
    --all) all=1 ;;
    -h | --help) sed -n '2,11p' "$0"; exit 0 ;;
    -*) echo "format.sh: unknown option '$a' (see --help)" >&2; exit 2 ;;
    *) files+=("$a") ;;
  esac
done

cf=$venv/bin/clang-format
if [[ ! -x $cf ]] || [[ $("$cf" --version) != *"version $version"* ]]; then
  echo "format.sh: installing clang-format $version into $venv (PyPI)" >&2
  python3 -m venv "$venv" >/dev/null
  "$venv/bin/pip" install --quiet "clang-format==$version"
fi

is_source() { [[ $1 =~ \.(hpp|cpp|cuh|cu|h)$ ]]; }
if ((${#files[@]} == 0)); then
  if ((all)); then
    mapfile -t files < <(git ls-files '*.hpp' '*.cpp' '*.cuh' '*.cu' '*.h')
  else
    base=origin/main
    git rev-parse -q --verify "$base" >/dev/null || base=HEAD
    mapfile -t files < <({ git diff --name-only "$base" --; git diff --name-only --cached --; git ls-files --others --exclude-standard; } |
      sort -u | while read -r f; do [[ -f $f ]] && is_source "$f" && echo "$f"; done)
  fi
fi
((${#files[@]} > 0)) || { echo "format.sh: no C++ or CUDA file to format"; exit 0; }

if ((check)); then
  differ=0
  for f in "${files[@]}"; do
    if ! "$cf" --style=file --dry-run -Werror "$f" >/dev/null 2>&1; then
      echo "differs: $f"
      differ=1
    fi
  done
  exit $differ
fi
"$cf" --style=file -i "${files[@]}"
echo "format.sh: formatted ${#files[@]} file(s) with clang-format $version"
