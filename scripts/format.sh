#!/usr/bin/env bash
# clang-format 19 over ferry's C++ and CUDA sources, with the repository's .clang-format.
#   scripts/format.sh [--check] [--all | FILE...]
# Without FILEs: the files changed since this branch left origin/main (their merge base;
# HEAD when there is no such ref), and those not yet committed — format what you touch.
# --all: every tracked source. --check: change nothing, list the files that differ.
# FILEs are taken relative to the current folder and must be C++ or CUDA sources
# (.hpp .cpp .cuh .cu .h) that exist; any file, in the checkout or not, gets the
# repository's .clang-format.
# Exit status: 0 done (with --check: nothing differs), 1 (--check) files differ,
# 2 bad use (unknown option, --all with FILEs, a missing or non-source FILE).
#
# The version is pinned (the PyPI wheel `clang-format==19.1.7`, installed once into
# build/format-venv): clang-format before 16 breaks concepts (`{ e } noexcept -> C` came
# out as `noexcept->C` on a line of its own), and versions differ in alignment, so one
# version keeps the diffs of formatting alone out of reviews.
set -euo pipefail
caller=$(pwd)
cd "$(dirname "$0")/.."
repo=$(pwd)

version=19.1.7
venv=build/format-venv
check=0
all=0
files=()
for a in "$@"; do
  case $a in
    --check) check=1 ;;
    --all) all=1 ;;
    -h | --help) sed -n '2,17p' "$0"; exit 0 ;;
    -*) echo "format.sh: unknown option '$a' (see --help)" >&2; exit 2 ;;
    *) files+=("$a") ;;
  esac
done

is_source() { [[ $1 =~ \.(hpp|cpp|cuh|cu|h)$ ]]; }
if ((${#files[@]} > 0)); then
  ((all == 0)) || { echo "format.sh: --all and FILEs together: give one or the other" >&2; exit 2; }
  for i in "${!files[@]}"; do
    f=${files[$i]}
    [[ $f == /* ]] || f=$caller/$f
    [[ -f $f ]] || { echo "format.sh: no such file: ${files[$i]}" >&2; exit 2; }
    is_source "$f" || { echo "format.sh: not a C++ or CUDA source (.hpp .cpp .cuh .cu .h): ${files[$i]}" >&2; exit 2; }
    files[$i]=$f
  done
elif ((all)); then
  mapfile -d '' -t files < <(git ls-files -z -- '*.hpp' '*.cpp' '*.cuh' '*.cu' '*.h')
else
  base=HEAD
  if git rev-parse -q --verify origin/main >/dev/null; then base=$(git merge-base HEAD origin/main); fi
  mapfile -d '' -t files < <({ git diff -z --name-only "$base" --; git diff -z --name-only --cached --;
    git ls-files -z --others --exclude-standard; } | sort -zu |
    while IFS= read -r -d '' f; do [[ -f $f ]] && is_source "$f" && printf '%s\0' "$f"; done)
fi
((${#files[@]} > 0)) || { echo "format.sh: no C++ or CUDA file to format"; exit 0; }

cf=$venv/bin/clang-format
if [[ ! -x $cf ]] || [[ $("$cf" --version) != *"version $version"* ]]; then
  echo "format.sh: installing clang-format $version into $venv (PyPI)" >&2
  python3 -m venv "$venv" >/dev/null
  "$venv/bin/pip" install --quiet "clang-format==$version"
fi

if ((check)); then
  differ=0
  for f in "${files[@]}"; do
    if ! "$cf" --style="file:$repo/.clang-format" --dry-run -Werror "$f" >/dev/null 2>&1; then
      echo "differs: $f"
      differ=1
    fi
  done
  exit $differ
fi
"$cf" --style="file:$repo/.clang-format" -i "${files[@]}"
echo "format.sh: formatted ${#files[@]} file(s) with clang-format $version"
