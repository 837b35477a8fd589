#!/usr/bin/env bash
# The strata preset on the real local disk, no caps: one path, probed in the same run (the same
# O_DIRECT write+read as `strata-bench io`), so the step is measured against the bound of
# docs/design.md section 2 from bandwidths of this run. zero_infinity runs interleaved as the baseline.
#
#   bench/scenarios/real_disk.sh [BUILD_DIR] [WORK_DIR] [extra strata-bench step options]
#
# Environment: PARAMS (1e9), SUBGROUP (16M), PROBE (2GiB), ITERS (3), WARMUP (1),
# JSON (WORK_DIR/real_disk.json).
set -euo pipefail
build=${1:-build/default}
work=${2:-$build/scenarios/real_disk}
shift $(( $# < 2 ? $# : 2 ))
bench="$build/bench/strata-bench"
[[ -x $bench ]] || { echo "real_disk.sh: $bench not built (cmake --build --preset default --target strata_bench)" >&2; exit 2; }
mkdir -p "$work"
exec "$bench" step --compare --preset strata --params "${PARAMS:-1e9}" --subgroup "${SUBGROUP:-16M}" --grad bf16 \
  --path "$work/disk" --probe "${PROBE:-2GiB}" --iters "${ITERS:-3}" --warmup "${WARMUP:-1}" \
  --json "${JSON:-$work/real_disk.json}" "$@"
