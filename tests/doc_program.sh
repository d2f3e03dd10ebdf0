#!/usr/bin/env bash
# A program the docs give whole, compiled and run as a reader would: the fenced cpp
# block after the line "<!-- program: NAME -->" in DOC is written to NAME in WORK,
# compiled with the one g++ line the doc shows for it (CXX in place of g++, INCLUDE in
# place of the checkout's include folder), run with WORK as its argument (a scratch
# folder), and its last line must be EXPECT. The doc must still show that command.
# usage: doc_program.sh DOC NAME CXX INCLUDE WORK EXPECT
set -euo pipefail
(($# == 6)) || { echo "usage: doc_program.sh DOC NAME CXX INCLUDE WORK EXPECT" >&2; exit 2; }
doc=$1 name=$2 cxx=$3 include=$4 work=$5 expect=$6
program=${name%.cpp}
mkdir -p "$work"
awk -v marker="<!-- program: $name -->" '
  $0 == marker { found = 1; next }
  found == 1 && /^```cpp$/ { found = 2; next }
  found == 1 { exit }
  found == 2 && /^```$/ { exit }
  found == 2 { print }' "$doc" > "$work/$name"
[[ -s $work/$name ]] || { echo "doc_program: no cpp block right after '<!-- program: $name -->' in $doc"; exit 1; }
command="g++ -std=c++20 -Iinclude $name -o $program -pthread"
grep -qF -- "$command" "$doc" || { echo "doc_program: $doc no longer shows the command: $command"; exit 1; }
cd "$work"
echo "doc_program: $cxx -std=c++20 -I$include $name -o $program -pthread"
"$cxx" -std=c++20 -I"$include" "$name" -o "$program" -pthread
out=$("./$program" "$work")
echo "$out"
last=$(tail -n 1 <<<"$out")
[[ $last == "$expect" ]] || { echo "doc_program: the last line is '$last', not '$expect'"; exit 1; }
