#!/usr/bin/env bash
# Paired comparison of `strata-bench io` with fio on the same directory, block size and queue
# depth (O_DIRECT), for io_uring and for psync/POSIX. Runs the pair ROUNDS times, alternating
# which goes first, and prints each figure, the medians and the ratios strata/fio.
#   bench/scripts/io_vs_fio.sh [DIR] [SIZE] [BLOCK] [DEPTH] [ROUNDS]
# Needs fio (apt-get install fio) and a built strata-bench (build/default/bench/strata-bench).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
dir=${1:-$here/build/io-vs-fio}
size=${2:-1GiB}
block=${3:-8MiB}
depth=${4:-32}
rounds=${5:-3}
bench=${STRATA_BENCH:-$here/build/default/bench/strata-bench}
command -v fio >/dev/null || { echo "io_vs_fio: fio is not installed (apt-get install fio)" >&2; exit 2; }
[[ -x $bench ]] || { echo "io_vs_fio: $bench not built" >&2; exit 2; }
mkdir -p "$dir"
fio_size=${size/iB/}   # fio reads 1G/8M as binary units
fio_block=${block/iB/}

fio_rate() {  # fio_rate <rw> <engine>: GB/s (1e9) of one fio job
  local rw=$1 engine=$2 jobs=1 qd=$depth
  if [[ $engine == psync ]]; then jobs=$depth; qd=1; fi   # psync: concurrency comes from jobs, as our pool
  fio --name=strata-cmp --directory="$dir" --rw="$rw" --bs="$fio_block" --direct=1 \
      --ioengine="$engine" --iodepth="$qd" --numjobs="$jobs" --size="$(( $(numfmt --from=iec "$fio_size") / jobs ))" \
      --group_reporting --output-format=json 2>/dev/null |
    python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]; print(j['$([[ $rw == write ]] && echo write || echo read)']['bw_bytes']/1e9)"
}

strata_rate() {  # strata_rate <backend>: "write read" GB/s
  "$bench" io --path "$dir/strata" --size "$size" --block "$block" --depth "$depth" --backend "$1" --direct on \
      --reps 1 --json | python3 -c "import json,sys; j=json.load(sys.stdin); print(j['write_GBps'], j['read_GBps'])"
}

for engine in io_uring psync; do
  backend=$([[ $engine == io_uring ]] && echo uring || echo posix)
  sw=(); sr=(); fw=(); fr=()
  for ((r = 0; r < rounds; ++r)); do
    if ((r % 2 == 0)); then read -r w rd < <(strata_rate "$backend"); fwr=$(fio_rate write "$engine"); frd=$(fio_rate read "$engine")
    else fwr=$(fio_rate write "$engine"); frd=$(fio_rate read "$engine"); read -r w rd < <(strata_rate "$backend"); fi
    sw+=("$w"); sr+=("$rd"); fw+=("$fwr"); fr+=("$frd")
    rm -f "$dir"/strata-cmp.*
    echo "round $r $engine: strata write $w read $rd | fio write $fwr read $frd (GB/s)"
  done
  python3 - "$engine" "${sw[*]}" "${sr[*]}" "${fw[*]}" "${fr[*]}" <<'PY'
import statistics as s, sys
e, sw, sr, fw, fr = sys.argv[1], *[[float(x) for x in a.split()] for a in sys.argv[2:]]
m = lambda v: s.median(v)
print(f"{e}: write strata {m(sw):.3f} / fio {m(fw):.3f} GB/s = {m(sw)/m(fw):.2f}x; "
      f"read strata {m(sr):.3f} / fio {m(fr):.3f} GB/s = {m(sr)/m(fr):.2f}x  (medians of {len(sw)})")
PY
done
rm -rf "$dir"
