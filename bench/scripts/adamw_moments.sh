#!/usr/bin/env bash
# strata's CPU AdamW with fp32 moments against AdamW with bf16 moments (adamw_bf16_rule), each
# against its own streams bound: `strata-bench adamw --moments fp32|bf16 --json`, interleaved in
# rounds (every thread count and moment type once a round). Prints per configuration the median
# and min-max over the rounds of Gparams/s, GB/s and the ratio to the bound, and for bf16 the
# median of the per-round speedups over fp32, as a Markdown table.
#
#   bench/scripts/adamw_moments.sh [--params 32M] [--rounds 5] [--threads "1 2"] [--grad bf16]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
params=32M rounds=5 threads_list="1 2" grad=bf16
while (($#)); do
  case $1 in
    --params) params=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads_list=$2; shift 2 ;;
    --grad) grad=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "adamw_moments.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
bench=${STRATA_BENCH:-$root/build/default/bench/strata-bench}
[[ -x $bench ]] || { echo "adamw_moments.sh: no strata-bench at $bench (cmake --build --preset default)" >&2; exit 2; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for ((r = 1; r <= rounds; r++)); do
  for t in $threads_list; do
    for m in fp32 bf16; do
      "$bench" adamw --params "$params" --threads "$t" --grad "$grad" --moments "$m" --reps 5 --json >>"$out"
    done
  done
done
python3 - "$out" <<'PY'
import json, statistics as st, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def s(v, f="{:.3f}"):
    return f"{f.format(st.median(v))} ({f.format(min(v))}-{f.format(max(v))})"
print("| threads | moments | B/param | Gparams/s | GB/s | / own bound | bf16 / fp32 |")
print("|---|---|---|---|---|---|---|")
for t in sorted({r["threads"] for r in rows}):
    f = [r for r in rows if r["threads"] == t and r["moments"] == "fp32"]
    b = [r for r in rows if r["threads"] == t and r["moments"] == "bf16"]
    for name, rs in (("fp32", f), ("bf16", b)):
        speed = ""
        if name == "bf16":
            speed = s([y["Gparams_per_s"] / x["Gparams_per_s"] for x, y in zip(f, b)], "{:.2f}") + "x"
        print(f"| {t} | {name} | {rs[0]['bytes_per_param']} | {s([r['Gparams_per_s'] for r in rs])} | "
              f"{s([r['GBps'] for r in rs], '{:.2f}')} | {s([r['ratio'] for r in rs])} | {speed} |")
PY
