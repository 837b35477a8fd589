#!/usr/bin/env bash
# The CPU update of every update rule against its own streams bound: `strata-bench adamw --rule R
# --json`, interleaved in rounds (every thread count and rule once a round). Prints per
# configuration the median and min-max over the rounds of Gparams/s, the ratio to the rule's own
# bound (the fastest way found to move its bytes, same run), the rate of the same update computed
# from caches (its arithmetic alone) and, for each rule but adamw, the median of the per-round
# speedups over fp32 AdamW, as a Markdown table. --variants runs every configuration once per
# variant, an environment assignment (e.g. "STRATA_CPU_BF16=1 STRATA_CPU_BF16=0"), in each round:
# the table then has a row per variant, with its per-round speedup over the first variant.
#
#   bench/scripts/update_rules.sh [--params 32M] [--rounds 5] [--threads "1 2"] [--grad fp32]
#                                 [--rules "adamw adamw-bf16 adamw-8bit sgd lion"] [--variants "A=1 A=0"]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
params=32M rounds=5 threads_list="1 2" grad=fp32 rules="adamw adamw-bf16 adamw-8bit sgd lion" variants=""
while (($#)); do
  case $1 in
    --params) params=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads_list=$2; shift 2 ;;
    --grad) grad=$2; shift 2 ;;
    --rules) rules=$2; shift 2 ;;
    --variants) variants=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "update_rules.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
bench=${STRATA_BENCH:-$root/build/default/bench/strata-bench}
[[ -x $bench ]] || { echo "update_rules.sh: no strata-bench at $bench (cmake --build --preset default)" >&2; exit 2; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for ((r = 1; r <= rounds; r++)); do
  for t in $threads_list; do
    for rule in $rules; do
      for v in ${variants:-"-"}; do  # "-": no variant
        [[ $v == - || $v == *=* ]] || { echo "update_rules.sh: variant '$v' is not NAME=VALUE" >&2; exit 2; }
        assign=()
        [[ $v == - ]] || assign=("$v")
        line=$(env "${assign[@]}" "$bench" adamw --params "$params" --threads "$t" --grad "$grad" --rule "$rule" \
          --reps 5 --json)
        printf '%s\t%s\n' "$v" "$line" >>"$out"
      done
    done
  done
done
python3 - "$out" <<'PY'
import json, statistics as st, sys
rows = []
for l in open(sys.argv[1]):
    v, j = l.rstrip("\n").split("\t", 1)
    rows.append(dict(json.loads(j), variant=v))
variants = list(dict.fromkeys(r["variant"] for r in rows))
several = len(variants) > 1
def s(v, f="{:.3f}"):
    return f"{f.format(st.median(v))} ({f.format(min(v))}-{f.format(max(v))})"
extra = f" | vs {variants[0]}" if several else ""
print(f"| threads | rule |{' variant |' if several else ''} B/param | Gparams/s | / own bound | bound's way (most rounds) | "
      f"from caches, Gparams/s | vs adamw{extra} |")
print("|---|---|" + ("---|" if several else "") + "---|---|---|---|---|---|" + ("---|" if several else ""))
rules = list(dict.fromkeys(r["rule"] for r in rows))
for t in sorted({r["threads"] for r in rows}):
    for rule in rules:
        first = [r for r in rows if r["threads"] == t and r["rule"] == rule and r["variant"] == variants[0]]
        for v in variants:
            base = [r for r in rows if r["threads"] == t and r["rule"] == "adamw" and r["variant"] == v]
            rs = [r for r in rows if r["threads"] == t and r["rule"] == rule and r["variant"] == v]
            speed = ""
            if rule != "adamw" and base:
                speed = s([y["Gparams_per_s"] / x["Gparams_per_s"] for x, y in zip(base, rs)], "{:.2f}") + "x"
            ways = [r["bound"] for r in rs]
            way = max(set(ways), key=ways.count).removeprefix("streams:")
            cells = f"| {t} | {rule} | " + (f"{v} | " if several else "")
            cells += (f"{rs[0]['bytes_per_param']:.2f} | {s([r['Gparams_per_s'] for r in rs])} | "
                      f"{s([r['ratio'] for r in rs])} | {way} | {s([r['cache_Gparams_per_s'] for r in rs])} | {speed} |")
            if several:
                cells += " " + s([y["Gparams_per_s"] / x["Gparams_per_s"] for x, y in zip(first, rs)], "{:.2f}") + "x |"
            print(cells)
PY
