#!/usr/bin/env bash
# Per-rank step time of mpi_train as the ranks of one node grow from 1 to 4, with and without the
# node-wide gate on the shared path (MLP-Offload's concurrency control), over emulated node links:
# every rank's shared path goes through one throttled link of the node (--shared-cap), its local
# path through another (--local-cap); --switch-cost is what the shared link loses whenever it
# passes from one request to another (0: an ideal link). Prints a markdown table.
#
#   bench/scripts/mpi_scaling.sh [--mpirun MPIRUN] [--mpi-train BIN] [--dir DIR] [--ranks "1 2 3 4"] [--switch-costs "0 4000"]
#                        [--repeat N] [-- extra mpi_train options]
# Defaults: build/default/examples/mpi_train, /dev/shm/strata-mpi-scaling (removed after), each
# configuration run twice, the faster kept (the machine's other load only ever slows a run).
set -euo pipefail

mpirun=mpirun
bin=build/default/examples/mpi_train
dir=/dev/shm/strata-mpi-scaling
ranks_list="1 2 3 4"
costs="0 4000"
repeat=2
shared_cap=50MB
local_cap=200MB
chunk=1MiB
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --mpirun) mpirun=$2; shift 2 ;;
    --mpi-train) bin=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --ranks) ranks_list=$2; shift 2 ;;
    --switch-costs) costs=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --shared-cap) shared_cap=$2; shift 2 ;;
    --local-cap) local_cap=$2; shift 2 ;;
    --link-chunk) chunk=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "mpi_scaling.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ -x $bin ]] || { echo "mpi_scaling.sh: no mpi_train at $bin (build the examples with MPI found)" >&2; exit 2; }
if [[ -e $dir ]]; then echo "mpi_scaling.sh: $dir exists; give an unused --dir" >&2; exit 2; fi
trap 'rm -rf "$dir"' EXIT

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
# 8.5 M parameters, 12 samples a step in 12 micro-chunks (so 1 to 4 ranks split them evenly).
model=(--layers 4 --hidden 2048 --inputs 32 --outputs 8 --samples 96 --batch 12 --chunks 12 --epochs 1 --lr 1e-4)

# One run; prints "mean max" of the per-rank step times.
run_one() {
  local ranks=$1 limit=$2 cost=$3 out
  out=$("$mpirun" -np "$ranks" --oversubscribe --bind-to none "$bin" "${model[@]}" --path "$dir/local" --path "$dir/shared" \
          --shared-cap "$shared_cap" --local-cap "$local_cap" --link-chunk "$chunk" --switch-cost "$cost" \
          --io-limit "$limit" ${extra[@]+"${extra[@]}"} 2>&1) || { echo "$out" >&2; return 1; }
  sed -n 's/^step time per rank: mean \([0-9.]*\) s (min [0-9.]*, max \([0-9.]*\)).*/\1 \2/p' <<<"$out"
}

# The faster of `repeat` runs (by mean).
best_of() {
  local best="" r m
  for ((r = 0; r < repeat; r++)); do
    m=$(run_one "$@")
    if [[ -z $best ]] || awk -v a="${m% *}" -v b="${best% *}" 'BEGIN { exit !(a < b) }'; then best=$m; fi
  done
  echo "$best"
}

echo "mpi_train ${model[*]}; shared link $shared_cap/s, local link $local_cap/s per node, $chunk pieces; best of $repeat"
echo
echo "| switch cost | ranks on the node | step s, no gate (mean / slowest rank) | step s, gate of 1 (mean / slowest rank) | no gate / gate |"
echo "|---|---|---|---|---|"
for cost in $costs; do
  for ranks in $ranks_list; do
    read -r free_mean free_max <<<"$(best_of "$ranks" 0 "$cost")"
    read -r gate_mean gate_max <<<"$(best_of "$ranks" 1 "$cost")"
    ratio=$(awk -v a="$free_mean" -v b="$gate_mean" 'BEGIN { printf "%.2f", a / b }')
    echo "| ${cost} us | $ranks | $free_mean / $free_max | $gate_mean / $gate_max | ${ratio}x |"
  done
done
