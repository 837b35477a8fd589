#!/usr/bin/env bash
# Checks that strata's header folders form a DAG, lowest first:
#
#   core -> (sync, optim) -> exec -> tier -> policy -> pipeline -> offload
#
# A header may include headers of its own folder (and its detail/) and of folders below it; sync
# and optim are side by side and include neither each other. strata/version.hpp is below
# everything and strata/strata.hpp (the umbrella) above everything. Any include that points up
# the order, sideways, or into an unknown folder is printed as file:line and the check fails.
#
# Usage: tools/check-layers.sh [INCLUDE_DIR]   (default: include/ beside this script)
set -euo pipefail
root=${1:-"$(cd "$(dirname "$0")/.." && pwd)/include"}
[[ -d "$root/strata" ]] || { echo "check-layers: no strata/ under '$root'" >&2; exit 2; }

rank_of() {  # rank_of <folder>: its layer, or nothing when the folder is unknown
  case $1 in
    core) echo 0 ;;
    sync | optim) echo 1 ;;
    exec) echo 2 ;;
    tier) echo 3 ;;
    policy) echo 4 ;;
    pipeline) echo 5 ;;
    offload) echo 6 ;;
  esac
}

bad=0
checked=0
while IFS= read -r -d '' file; do
  rel=${file#"$root"/strata/}
  if [[ $rel != */* ]]; then  # strata.hpp may include anything, version.hpp nothing of strata's
    [[ $rel == version.hpp ]] && grep -n '#include "strata/' "$file" | sed "s|^|$file:|; s|\$|: version.hpp includes nothing of strata|" && bad=1
    continue
  fi
  folder=${rel%%/*}
  mine=$(rank_of "$folder")
  if [[ -z $mine ]]; then
    echo "$file: folder '$folder' has no place in the layer order (add it to tools/check-layers.sh)"
    bad=1
    continue
  fi
  checked=$((checked + 1))
  while IFS=: read -r line target; do
    [[ $target == version.hpp ]] && continue
    if [[ $target != */* ]]; then
      echo "$file:$line: includes strata/$target, which includes every layer"
      bad=1
      continue
    fi
    theirs=${target%%/*}
    r=$(rank_of "$theirs")
    if [[ -z $r ]]; then
      echo "$file:$line: includes strata/$target, from folder '$theirs' that has no place in the layer order"
      bad=1
    elif [[ $theirs != "$folder" ]] && ((r >= mine)); then
      echo "$file:$line: $folder (layer $mine) includes strata/$target ($theirs, layer $r): it points up or sideways"
      bad=1
    fi
  done < <(awk 'match($0, /^[ \t]*#[ \t]*include[ \t]*"strata\/[^"]*"/) {
                  s = substr($0, RSTART, RLENGTH); sub(/^[^"]*"strata\//, "", s); sub(/"$/, "", s); print NR ":" s
                }' "$file")
done < <(find "$root/strata" -type f \( -name '*.hpp' -o -name '*.cuh' -o -name '*.h' \) -print0 | sort -z)

if ((bad)); then
  echo "check-layers: FAILED (order: core -> (sync, optim) -> exec -> tier -> policy -> pipeline -> offload)"
  exit 1
fi
echo "check-layers: $checked headers, every include points down the order"
