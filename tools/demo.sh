#!/usr/bin/env bash
# strata's demo (README's first quick-start command ends here, through `--target demo`):
#  1. examples/train_mlp trains a small MLP whose fp32 optimizer state lives in a host cache and
#     on two file paths, and checks it ends bit-identical to an in-memory AdamW;
#  2. `strata-bench step --compare` runs zero_infinity, mlp_offload and strata interleaved on a
#     200M-parameter model (2.2 GiB of state) over two paths capped 2:1 (an NVMe and a PFS link,
#     emulated on the local disk) and prints where each iteration's time goes, the bytes per
#     path, the bound of docs/design.md section 2 and the speedup over zero_infinity.
# Everything lives under BUILD_DIR/demo; the state files are removed afterwards (step.json, the
# step's JSON for bench/plot.py, stays). Nothing needs root or a server.
#
#   tools/demo.sh [BUILD_DIR]      (environment: DEMO_PARAMS=200M, DEMO_ITERS=3)
set -euo pipefail
build=${1:-build/default}
work=$build/demo
for exe in "$build/examples/train_mlp" "$build/bench/strata-bench"; do
  [[ -x $exe ]] || { echo "demo.sh: $exe is not built (cmake --build --preset default --target demo)" >&2; exit 2; }
done
mkdir -p "$work"
echo "== 1. train_mlp: an MLP trained with its optimizer state offloaded ============================"
"$build/examples/train_mlp" --path "$work/mlp-nvme" --path "$work/mlp-pfs"
echo
echo "== 2. strata-bench step --compare: the presets side by side =================================="
"$build/bench/strata-bench" step --compare --params "${DEMO_PARAMS:-200M}" --subgroup 8M --cache 25% \
  --path "$work/nvme:1GB" --path "$work/pfs:500MB" --iters "${DEMO_ITERS:-3}" --warmup 1 --probe 256MiB \
  --json "$work/step.json"
echo
echo "Charts: bench/plot.py $work/step.json (needs matplotlib). Bigger runs: bench/scenarios/paper_like.sh"
