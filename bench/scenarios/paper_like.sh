#!/usr/bin/env bash
# The MLP-Offload setting on one machine: a node-local NVMe path and a shared PFS link whose
# bandwidths are 2:1 (the ratio MLP-Offload's fixed round robin is built for), emulated as two
# capped directories on the local disk; a host cache of a quarter of the subgroups; 16-bit (bf16)
# gradients. Runs every preset interleaved in one process, with zero_infinity also striped over
# both paths with the same cache (zero_infinity-raid0) and mlp_offload also without its PFS lock
# (mlp_offload-no-lock), and prints the phase table and backward/update apart.
#
#   bench/scenarios/paper_like.sh [BUILD_DIR] [WORK_DIR] [extra strata-bench step options]
#
# Environment: PARAMS (1e9), SUBGROUP (16M), NVME_BW (1GB), PFS_BW (500MB), ITERS (3), WARMUP (1),
# MLP_LOCK (separate,none),
# PROBE (1GiB), JSON (WORK_DIR/paper_like.json). The disk under WORK_DIR must sustain NVME_BW + PFS_BW each way
# (check with `strata-bench io`), else the caps are not what limits the paths.
set -euo pipefail
build=${1:-build/default}
work=${2:-$build/scenarios/paper_like}
shift $(( $# < 2 ? $# : 2 ))
params=${PARAMS:-1e9}
subgroup=${SUBGROUP:-16M}
nvme_bw=${NVME_BW:-1GB}
pfs_bw=${PFS_BW:-500MB}
json=${JSON:-$work/paper_like.json}
bench="$build/bench/strata-bench"
[[ -x $bench ]] || { echo "paper_like.sh: $bench not built (cmake --build --preset default --target strata_bench)" >&2; exit 2; }
mkdir -p "$work"
exec "$bench" step --compare --compare-equal --mlp-lock "${MLP_LOCK:-separate,none}" --params "$params" --subgroup "$subgroup" --cache 25% --grad bf16 \
  --path "$work/nvme:$nvme_bw" --path "$work/pfs:$pfs_bw" \
  --iters "${ITERS:-3}" --warmup "${WARMUP:-1}" --probe "${PROBE:-1GiB}" --json "$json" "$@"
