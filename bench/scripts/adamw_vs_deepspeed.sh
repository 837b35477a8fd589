#!/usr/bin/env bash
# strata's CPU AdamW against DeepSpeed's CPU Adam (DeepSpeedCPUAdam, AdamW mode) on the same
# problem: n fp32 parameters, fp32 moments, gradients of the given dtype (DeepSpeed widens 16-bit
# ones to fp32 first, as it must), no model copy, the same thread count. Paired rounds, each side
# a fresh process (`strata-bench adamw --no-model-copy --json` and bench/deepspeed_adamw_bench.py),
# the order alternating by round; per configuration the median and min-max of each side's
# Gparams/s over the rounds, each side's rate against strata's same-run streams bound (the fastest
# way found to move the update's bytes: a peer above 1 would show the bound is none), and the
# median of the per-round ratios strata / DeepSpeed. A benchmark, not a test: it installs torch and deepspeed.
#
#   bench/scripts/adamw_vs_deepspeed.sh [--venv DIR] [--params 32M] [--rounds 5]
#       [--threads "1 2"] [--grads "fp32 bf16 fp16"] [--deepspeed 0.19.8]
#
# --venv (default /tmp/strata-deepspeed-venv) is created when missing and gets torch, deepspeed
# and ninja from PyPI (PyPI's torch is the CUDA build, about 3 GB; DeepSpeed runs on its CPU
# accelerator, DS_ACCELERATOR=cpu, and JIT-builds its cpu_adam op on first use, which the setup
# does once before timing).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
command_line="bench/scripts/$(basename "$0")$(printf ' %q' "$@")"
venv=/tmp/strata-deepspeed-venv params=32M rounds=5 threads_list="1 2" grads="fp32 bf16 fp16" ds_version=0.19.8
while (($#)); do
  case $1 in
    --venv) venv=$2; shift 2 ;;
    --params) params=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads_list=$2; shift 2 ;;
    --grads) grads=$2; shift 2 ;;
    --deepspeed) ds_version=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "adamw_vs_deepspeed.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
bench=${STRATA_BENCH:-$root/build/default/bench/strata-bench}
[[ -x $bench ]] || { echo "adamw_vs_deepspeed.sh: no strata-bench at $bench (cmake --build --preset default)" >&2; exit 2; }
if [[ ! -x $venv/bin/python ]]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet torch "deepspeed==$ds_version" ninja numpy
fi
py=$venv/bin/python
export DS_ACCELERATOR=cpu
ds() { "$py" "$root/bench/deepspeed_adamw_bench.py" "$@" 2>/dev/null | tail -1; }
ds --params 1M --threads 1 --reps 1 --json >/dev/null  # builds DeepSpeed's op once, untimed

echo "# adamw_vs_deepspeed.sh $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "# command: $command_line"
echo "# machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $(free -g | awk '/Mem:/ {print $2}') GiB RAM"
echo "# commit: $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD -- include bench || echo ' (+ uncommitted changes)')"
echo "# $("$py" -c 'import torch, deepspeed; print(f"torch {torch.__version__}, deepspeed {deepspeed.__version__}")' 2>/dev/null)"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for threads in $threads_list; do
  for grad in $grads; do
    for ((r = 0; r < rounds; r++)); do
      if ((r % 2 == 0)); then
        s=$("$bench" adamw --params "$params" --threads "$threads" --grad "$grad" --no-model-copy --reps 5 --json)
        d=$(ds --params "$params" --threads "$threads" --grad "$grad" --json)
      else
        d=$(ds --params "$params" --threads "$threads" --grad "$grad" --json)
        s=$("$bench" adamw --params "$params" --threads "$threads" --grad "$grad" --no-model-copy --reps 5 --json)
      fi
      echo "$threads $grad $s $d" >>"$out"
    done
  done
done
python3 - "$out" "$params" "$rounds" <<'PY'
import json, statistics as st, sys
from collections import defaultdict
rows = defaultdict(list)
for line in open(sys.argv[1]):
    t, g, rest = line.split(" ", 2)
    s, d = rest.strip().split("} {")
    rows[(int(t), g)].append((json.loads(s + "}"), json.loads("{" + d)))
f = lambda v: f"{st.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"
f3 = lambda v: f"{st.median(v):.3f} ({min(v):.3f}-{max(v):.3f})"
print(f"\n{sys.argv[2]} parameters, no model copy, {sys.argv[3]} paired rounds; median (min-max):\n")
print("| threads | grads | strata Gparams/s | strata GB/s | streams bound GB/s (fastest way) | strata / bound "
      "| DeepSpeed Gparams/s | DeepSpeed / bound | strata / DeepSpeed |")
print("|---|---|---|---|---|---|---|---|---|")
for (t, g), rs in sorted(rows.items(), key=lambda kv: (kv[0][0], ["fp32", "bf16", "fp16"].index(kv[0][1]))):
    sg = [s["Gparams_per_s"] for s, _ in rs]
    dg = [d["Gparams_per_s"] for _, d in rs]
    # DeepSpeed moves the same bytes a parameter: its rate against the bound of the same round.
    dr = [d["Gparams_per_s"] * s["bytes_per_param"] / s["bound_GBps"] for s, d in rs]
    print(f"| {t} | {g} | {f(sg)} | {f([s['GBps'] for s, _ in rs])} | {f([s['bound_GBps'] for s, _ in rs])} | "
          f"{f3([s['ratio'] for s, _ in rs])} | {f(dg)} | {f3(dr)} | {f([a / b for a, b in zip(sg, dg)])}x |")
PY
