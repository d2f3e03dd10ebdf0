#!/usr/bin/env bash
# The layout rules of include/ferry (docs/design.md, "Layout"), checked in CTest:
#  - no header over 600 lines;
#  - the layers read in the order data flows (core, cuda, memory, io, tier, policy, plan,
#    codec, transfer, pipeline, optim): a header of a layer (or of detail/<layer>/)
#    includes ferry headers of its own layer or of the layers before it, never after
#    (the facades at the top of include/ferry may include anything).
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
status=0
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
if (( status == 0 )); then echo "layout: every header within 600 lines, every include from its own layer or one below"; fi
exit $status
