#!/usr/bin/env bash
# Paired rounds of `strata-bench adamw` and PyTorch's CPU AdamW (bench/pytorch_adamw_bench.py) on
# the same problem and thread count: prints, per configuration, the median and min-max over the
# rounds of each one's Gparams/s, strata's ratio to its same-run streams bound (rule_streams.hpp), and the per-round
# ratio strata / PyTorch.
#   bench/scripts/adamw_vs_pytorch.sh PYTHON [PARAMS] [ROUNDS] [IMPL]
# PYTHON: an interpreter with torch (e.g. a venv: pip install torch --index-url .../whl/cpu).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
py=${1:?usage: adamw_vs_pytorch.sh PYTHON [PARAMS] [ROUNDS] [IMPL]}
params=${2:-32M}
rounds=${3:-5}
impl=${4:-foreach}
bench=${STRATA_BENCH:-$here/build/default/bench/strata-bench}
[[ -x $bench ]] || { echo "adamw_vs_pytorch: $bench not built" >&2; exit 2; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for threads in 1 2; do
  for grad in fp32 bf16 fp16; do
    for ((r = 0; r < rounds; r++)); do
      s=$("$bench" adamw --params "$params" --threads "$threads" --grad "$grad" --reps 5 --json)
      p=$("$py" "$here/bench/pytorch_adamw_bench.py" --params "$params" --threads "$threads" --grad "$grad" --impl "$impl" --json)
      echo "$threads $grad $s $p" >> "$out"
    done
  done
done
python3 - "$out" "$impl" <<'PY'
import json, statistics as st, sys
from collections import defaultdict
rows = defaultdict(list)
for line in open(sys.argv[1]):
    t, g, rest = line.split(" ", 2)
    s, p = rest.strip().split("} {")
    rows[(int(t), g)].append((json.loads(s + "}"), json.loads("{" + p)))
f = lambda v: f"{st.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"
print(f"| threads | grads | strata Gparams/s | strata GB/s | streams bound GB/s | strata / bound | PyTorch {sys.argv[2]} Gparams/s | strata / PyTorch |")
print("|---|---|---|---|---|---|---|---|")
for (t, g), rs in sorted(rows.items()):
    sg = [s["Gparams_per_s"] for s, _ in rs]
    pg = [p["Gparams_per_s"] for _, p in rs]
    print(f"| {t} | {g} | {f(sg)} | {f([s['GBps'] for s, _ in rs])} | {f([s['bound_GBps'] for s, _ in rs])} | "
          f"{f([s['ratio'] for s, _ in rs])} | {f(pg)} | {f([a / b for a, b in zip(sg, pg)])}x |")
PY
