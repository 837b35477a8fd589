#!/usr/bin/env bash
# Cost against size: offload_demo over one directory for each parameter count and preset, with a
# fixed host budget, each run probing the directory on its own first (--probe). Prints one row per
# run: the second step's time, its full-duplex bound from the probe and the efficiency against it,
# the time per GB of state (flat when time is linear in state size), and the steps' peak RSS split
# into the demo's arrays, the optimizer's budgeted memory (flat at or under the budget) and the rest.
#
#   bench/scripts/scaling.sh [--demo build/default/examples/offload_demo] [--dir /tmp/strata-scaling]
#       [--params "1e8 3e8 1e9 3e9"] [--presets "zero_infinity strata"] [--subgroup 8M]
#       [--budget 1GiB] [--probe 1GiB]
#
# The directory needs 12 bytes of free space per parameter of the largest run (zero_infinity: 16).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
command_line="bench/scripts/$(basename "$0")$(printf ' %q' "$@")"
demo=$root/build/default/examples/offload_demo dir=/tmp/strata-scaling
sizes="1e8 3e8 1e9 3e9" presets="zero_infinity strata" subgroup=8M budget=1GiB probe=1GiB
while (($#)); do
  case $1 in
    --demo) demo=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --params) sizes=$2; shift 2 ;;
    --presets) presets=$2; shift 2 ;;
    --subgroup) subgroup=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --probe) probe=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "scaling.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -x $demo ]] || { echo "scaling.sh: no offload_demo at $demo (cmake --build --preset default)" >&2; exit 2; }
echo "# scaling.sh $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "# command: $command_line"
echo "# machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $(free -g | awk '/Mem:/ {print $2}') GiB RAM; $dir on $(df --output=source "$(dirname "$dir")" | tail -1)"
echo "# commit: $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD -- include examples || echo ' (+ uncommitted changes)')"
echo
printf '| %-7s | %-13s | %9s | %9s | %5s | %9s | %9s | %13s | %13s | %9s |\n' params preset "step 2 s" "bound s" eff "s per GB" "peak RSS" "demo's arrays" "optimizer" "the rest"
echo "|---|---|---|---|---|---|---|---|---|---|"
for n in $sizes; do
  for preset in $presets; do
    out=$("$demo" --params "$n" --subgroup "$subgroup" --preset "$preset" --budget "$budget" --path "$dir/$preset" \
      --steps 2 --probe "$probe" 2>&1) || { echo "$out" >&2; exit 1; }
    OUT=$out python3 - "$n" "$preset" <<'PY'
import os, re, sys
out = os.environ["OUT"]
n, preset = sys.argv[1], sys.argv[2]
steps = re.findall(r"^step \d+: \d+ subgroups, ([0-9.]+) s", out, re.M)
ind = re.findall(r"independent bound [^:]*: ([0-9.]+) s, efficiency ([0-9.]+)", out)
m = re.search(r"^steps: peak RSS ([0-9.]+ \w+) = the demo's bf16 gradients ([0-9.]+ \w+) \+ strata's pipeline, "
              r"cache and gradient store ([0-9.]+ \w+) \(budget [^)]*\) \+ the rest (-?[0-9.]+ GiB)", out, re.M)
state_gb = float(n) * 12 / 1e9
t = float(steps[-1])
print(f"| {n:<7} | {preset:<13} | {t:9.2f} | {float(ind[-1][0]):9.2f} | {float(ind[-1][1]):5.2f} | {t / state_gb:9.3f} | "
      f"{m.group(1):>9} | {m.group(2):>13} | {m.group(3):>13} | {m.group(4):>9} |")
PY
  done
done
