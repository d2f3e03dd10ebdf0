#!/usr/bin/env bash
# The layout rules of include/ferry (docs/design.md, "Layout"), checked in CTest:
#  - no header over 600 lines;
#  - the layers read in the order data flows (core, cuda, memory, io, tier, policy, plan,
#    codec, transfer, pipeline, optim): a header of a layer (or of detail/<layer>/)
#    includes ferry headers of its own layer or of the layers before it, never after
#    (the facades at the top of include/ferry may include anything);
#  - no include cycle through detail/: a header under detail/ never includes a header
#    that includes it back, directly or through other headers. The body of a class
#    (detail/<layer>/X.hpp) includes the class's declarations (<layer>/X_decl.hpp), and
#    the public <layer>/X.hpp includes both; the body never includes <layer>/X.hpp.
#    (A rule on names alone, "no <layer>/X.hpp from detail/<layer>/X.hpp", would miss
#    detail/optim/checkpoint_files.hpp including optim/state_checkpoint.hpp, which
#    includes it through detail/optim/state_checkpoint.hpp; this rule follows the includes.)
# usage: layout_check.sh INCLUDE_DIR
set -euo pipefail
root=$1/ferry
layers=(core cuda memory io tier policy plan codec transfer pipeline optim)
rank() {  # the rank of the layer of a path below include/ferry, or -1 for a facade
  local rel=${1#detail/}
  local top=${rel%%/*}
  [[ $top == "$rel" ]] && { echo -1; return; }
  for i in "${!layers[@]}"; do [[ ${layers[$i]} == "$top" ]] && { echo "$i"; return; }; done
  echo "unknown"
}
declare -A includes  # header (path below include/ferry) -> the ferry headers it includes, space-separated
headers=()
while IFS= read -r f; do
  rel=${f#"$root"/}
  headers+=("$rel")
  includes[$rel]=$(sed -n 's|^#include "ferry/\([^"]*\)".*|\1|p' "$f" | tr '\n' ' ')
done < <(find "$root" -type f \( -name '*.hpp' -o -name '*.cuh' \) | sort)
includers_of() {  # every header that includes $1, directly or through others
  local -A seen=()
  local pending=("$1") cur h inc
  while ((${#pending[@]})); do
    cur=${pending[-1]}
    unset 'pending[-1]'
    for h in "${headers[@]}"; do
      [[ -n ${seen[$h]:-} ]] && continue
      for inc in ${includes[$h]}; do
        if [[ $inc == "$cur" ]]; then
          seen[$h]=1
          pending+=("$h")
          break
        fi
      done
    done
  done
  echo "${!seen[@]}"
}
status=0
for d in "${headers[@]}"; do
  [[ $d == detail/* ]] || continue
  back=" $(includers_of "$d") "
  for inc in ${includes[$d]}; do
    if [[ $back == *" $inc "* ]]; then
      echo "layout: $d includes ferry/$inc, which includes it back (a cycle: include the declarations, not the facade)"
      status=1
    fi
  done
done
while IFS= read -r f; do
  rel=${f#"$root"/}
  n=$(wc -l < "$f")
  if (( n > 600 )); then
    echo "layout: $rel has $n lines (at most 600)"
    status=1
  fi
  r=$(rank "$rel")
  if [[ $r == unknown ]]; then
    echo "layout: $rel is in no layer folder (${layers[*]})"
    status=1
    continue
  fi
  (( r < 0 )) && continue
  while IFS= read -r inc; do
    ir=$(rank "$inc")
    if [[ $ir == unknown ]] || (( ir > r )); then
      echo "layout: $rel (${layers[$r]}) includes ferry/$inc, a layer above it"
      status=1
    fi
  done < <(sed -n 's|^#include "ferry/\([^"]*\)".*|\1|p' "$f")
done < <(find "$root" -type f \( -name '*.hpp' -o -name '*.cuh' \) | sort)
if (( status == 0 )); then echo "layout: every header within 600 lines, every include from its own layer or one below, no detail header included back"; fi
exit $status
