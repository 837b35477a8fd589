#!/usr/bin/env bash
# Does an object store as a third path shorten a step when the other two are capped? The strata
# preset of `strata-bench step` over an NVMe-like and a PFS-like directory (both capped with
# throttled, as bench/scenarios/paper_like.sh does), against the same two directories plus
# s3://<bucket>/step on SeaweedFS's `weed mini` (tools/s3-server.sh, started in a temporary
# directory, stopped on exit). Same parameters for both; --rounds rounds, each one run of each
# configuration (its own process: --warmup then --iters iterations) in an alternating order, so
# neither always runs first. Prints each run's median step time, the per-round ratio
# (two paths / three paths: > 1 when the third path helps) and the medians over the rounds.
#
#   bench/scripts/s3_third_path.sh [--bench build/default/bench/strata-bench] [--params 1e8]
#       [--subgroup 8M] [--nvme 1GB] [--pfs 500MB] [--s3-cap ""] [--rounds 3] [--iters 3]
#       [--warmup 1] [--probe 256MiB] [--work DIR] [--out FILE] [-- more strata-bench step options]
#
# --s3-cap READ[:WRITE] caps the store too (empty: uncapped; the bound then uses its probe).
# The directories go under --work (default: a temporary directory in /tmp); the disk under them
# must sustain NVME + PFS each way, else the caps are not what limits them.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=bench/scripts/s3_common.sh
source "$root/bench/scripts/s3_common.sh"
command_line="bench/scripts/$(basename "$0")$(printf ' %q' "$@")"
bench=$root/build/default/bench/strata-bench
params=1e8 subgroup=8M nvme=1GB pfs=500MB s3_cap="" rounds=3 iters=3 warmup=1 probe=256MiB work_arg="" out=""
extra=()
while (($#)); do
  case $1 in
    --bench) bench=$2; shift 2 ;;
    --params) params=$2; shift 2 ;;
    --subgroup) subgroup=$2; shift 2 ;;
    --nvme) nvme=$2; shift 2 ;;
    --pfs) pfs=$2; shift 2 ;;
    --s3-cap) s3_cap=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --probe) probe=$2; shift 2 ;;
    --work) work_arg=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "s3_third_path.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [[ -n $out ]]; then
  mkdir -p "$(dirname "$out")"
  exec > >(tee "$out") 2>&1
fi
[[ -x $bench ]] || { echo "no strata-bench at $bench (cmake --build --preset default --target strata_bench)" >&2; exit 1; }

tmp=$(mktemp -d /tmp/strata-s3-third-path.XXXXXX)
work=${work_arg:-$tmp}
mkdir -p "$work"
cleanup() {
  bash "$root/tools/s3-server.sh" stop "$tmp/server" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

s3_header s3_third_path.sh "$command_line" ""
s3_start_server "$tmp/server"

s3_path="s3://$bucket/step${s3_cap:+:$s3_cap}"
common=(step --preset strata --params "$params" --subgroup "$subgroup" --iters "$iters" --warmup "$warmup"
  --probe "$probe" --threads "$(nproc)" "${extra[@]}")
two=(--path "$work/nvme:$nvme" --path "$work/pfs:$pfs")
three=("${two[@]}" --path "$s3_path")
echo "# two paths:   strata-bench ${common[*]} ${two[*]}"
echo "# three paths: strata-bench ${common[*]} ${three[*]}"

# run NAME ARGS...: runs strata-bench, keeps its output in $tmp/NAME.out, prints "step_s bytes..."
# from its JSON: the strata preset's median step time and each path's median bytes per iteration.
run() {
  local name=$1
  shift
  "$bench" "$@" --json "$tmp/$name.json" >"$tmp/$name.out" 2>&1 || {
    echo "strata-bench failed:" >&2
    cat "$tmp/$name.out" >&2
    exit 1
  }
  python3 - "$tmp/$name.json" <<'EOF'
import json, statistics, sys
j = json.load(open(sys.argv[1]))
p = j["presets"][0]
its = p["iterations"]
cols = [f"{p['step_s']:.3f}"]
for k in range(len(its[0]["path_bytes_written"])):
    r = statistics.median(i["path_bytes_read"][k] for i in its) / 1e9
    w = statistics.median(i["path_bytes_written"][k] for i in its) / 1e9
    cols.append(f"{r:.2f}/{w:.2f}")
print(" ".join(cols))
EOF
}

declare -a t2 t3 ratios
for ((k = 0; k < rounds; k++)); do
  for ((j = 0; j < 2; j++)); do
    if (((k + j) % 2 == 0)); then
      read -r s bytes < <(run "two-$k" "${common[@]}" "${two[@]}")
      t2[k]=$s
      echo "round $((k + 1)): two paths   step $s s   GB r/w per iteration: nvme, pfs = $bytes"
    else
      read -r s bytes < <(run "three-$k" "${common[@]}" "${three[@]}")
      t3[k]=$s
      echo "round $((k + 1)): three paths step $s s   GB r/w per iteration: nvme, pfs, s3 = $bytes"
    fi
  done
  ratios[k]=$(awk -v a="${t2[k]}" -v b="${t3[k]}" 'BEGIN { printf "%.3f", a / b }')
  echo "round $((k + 1)): two / three = ${ratios[k]}"
done
if ((rounds > 0)); then
  echo
  echo "the last three-path run's paths and table:"
  grep -E '^  path |^    probe|^preset|^strata' "$tmp/three-$((rounds - 1)).out" | sed 's/^/  /'
fi

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo
echo "medians of $rounds rounds (each run: the median of its $iters iterations after $warmup warm-up):"
echo "  two paths (nvme $nvme, pfs $pfs):            $(median "${t2[@]}") s per step"
echo "  three paths (+ $s3_path):  $(median "${t3[@]}") s per step"
echo "  speedup of the third path (two / three, median of per-round ratios): $(median "${ratios[@]}")x"
