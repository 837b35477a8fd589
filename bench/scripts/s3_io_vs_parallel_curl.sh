#!/usr/bin/env bash
# strata's object-store tier against a strong plain client, in one run against one server:
# `strata-bench io --path s3://...` (object_store_tier: multipart uploads with parts in flight
# together, part-aligned ranged GETs) and curl, N transfers in parallel, moving the same bytes in
# objects of the same size. The server is SeaweedFS's `weed mini` on 127.0.0.1
# (tools/s3-server.sh), started in a temporary directory and stopped on exit.
#
# The curl baseline is tuned first, and the best of every variant is kept: N in --curl-n (4 8 16),
# one curl process with --parallel --parallel-max N or N curl processes (xargs -P N); uploads are
# whole-object PUTs (`curl --aws-sigv4 ... -T file`: unsigned payload, no MD5, so less client CPU
# than strata, which signs the SHA-256 of every part over http), downloads whole
# GETs or ranged GETs of --part bytes, to /dev/null. Then --rounds rounds, in a rotating order so
# that neither side always runs first on a warm or cold server: strata (--depth connections,
# --part parts), strata with --part = --object (one PUT and one GET per object, the layout curl
# makes on the server) and curl's best write and best read. Medians of the rounds; the ratio is
# strata/curl (1 = as fast as curl).
#
#   bench/scripts/s3_io_vs_parallel_curl.sh [--bench build/default/bench/strata-bench] [--size 1GiB]
#       [--object 64MiB] [--part 8MiB] [--depth 16] [--rounds 3] [--curl-n "4 8 16"] [--out FILE]
#
# Needs curl >= 7.75 (--aws-sigv4), python3 and a weed binary (tools/install-deps.sh). Sizes take
# KiB, MiB or GiB. Never remove Expect: 100-continue from curl's uploads: curl 7.88 then signs a
# header it does not send, and the server answers 403.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=bench/scripts/s3_common.sh
source "$root/bench/scripts/s3_common.sh"
command_line="bench/scripts/$(basename "$0")$(printf ' %q' "$@")"
bench=$root/build/default/bench/strata-bench
size=1GiB object=64MiB part=8MiB depth=16 rounds=3 curl_ns="4 8 16" out=""
while (($#)); do
  case $1 in
    --bench) bench=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --object) object=$2; shift 2 ;;
    --part) part=$2; shift 2 ;;
    --depth) depth=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --curl-n) curl_ns=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "s3_io_vs_parallel_curl.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [[ -n $out ]]; then
  mkdir -p "$(dirname "$out")"
  exec > >(tee "$out") 2>&1
fi

bytes_of() {
  local v=$1
  case $v in
    *GiB) echo $((${v%GiB} << 30)) ;;
    *MiB) echo $((${v%MiB} << 20)) ;;
    *KiB) echo $((${v%KiB} << 10)) ;;
    *[0-9]) echo "$v" ;;
    *) echo "s3_io_vs_parallel_curl.sh: size '$v': use KiB, MiB or GiB" >&2; exit 2 ;;
  esac
}
size_b=$(bytes_of "$size") object_b=$(bytes_of "$object") part_b=$(bytes_of "$part")
count=$(((size_b + object_b - 1) / object_b))
((size_b == count * object_b)) || { echo "--size must be a multiple of --object" >&2; exit 2; }
[[ -x $bench ]] || { echo "no strata-bench at $bench (cmake --build --preset default --target strata_bench)" >&2; exit 1; }
command -v curl >/dev/null || { echo "curl is needed" >&2; exit 1; }

work=$(mktemp -d /tmp/strata-s3-vs-curl.XXXXXX)
scratch=$work
[[ -d /dev/shm && -w /dev/shm ]] && scratch=$(mktemp -d /dev/shm/strata-s3-vs-curl.XXXXXX)
cleanup() {
  bash "$root/tools/s3-server.sh" stop "$work/server" >/dev/null 2>&1 || true
  rm -rf "$work" "$scratch"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

s3_header s3_io_vs_parallel_curl.sh "$command_line" "$(curl --version | head -1 | cut -d' ' -f1-2)"
echo "# size $size in $count objects of $object; strata: $depth connections, parts of $part; rounds $rounds; curl N in: $curl_ns"
s3_start_server "$work/server"
endpoint=${AWS_ENDPOINT_URL%/}

# curl's credentials in a config file (mode 600), not on a command line.
umask 077
creds=$work/curl-creds
printf 'user = "%s:%s"\naws-sigv4 = "aws:amz:%s:s3"\nsilent\nshow-error\nfail\n' \
  "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY" "$AWS_REGION" >"$creds"
payload=$scratch/object
head -c "$object_b" /dev/urandom >"$payload"  # incompressible, as strata-bench's buffer

# The payload's parts (for curl's multipart uploads) and the completion's XML, ETags their MD5s.
parts=$(((object_b + part_b - 1) / part_b))
split -b "$part_b" -d -a 5 "$payload" "$scratch/part."
part_files=()
{
  echo "<CompleteMultipartUpload>"
  for ((p = 0; p < parts; p++)); do
    part_files+=("$(printf '%s/part.%05d' "$scratch" "$p")")
    echo "<Part><PartNumber>$((p + 1))</PartNumber><ETag>\"$(md5sum <"${part_files[p]}" | cut -d' ' -f1)\"</ETag></Part>"
  done
  echo "</CompleteMultipartUpload>"
} >"$work/complete.xml"

now_ns() { date +%s%N; }
gbps() { awk -v b="$1" -v ns="$2" 'BEGIN { printf "%.3f", b / ns }'; }

# A curl config of one transfer per URL ("next" between them; each repeats the credentials).
# curl_config FILE KIND: KIND put, get or ranged, for the objects of prefix $prefix.
curl_config() {
  local file=$1 kind=$2 i p first=1 pieces=1
  [[ $kind == ranged ]] && pieces=$(((object_b + part_b - 1) / part_b))
  : >"$file"
  for ((i = 0; i < count; i++)); do
    for ((p = 0; p < pieces; p++)); do
      ((first)) || echo next >>"$file"
      first=0
      cat "$creds" >>"$file"
      printf 'url = "%s/%s/%s/o%d"\n' "$endpoint" "$bucket" "$prefix" "$i" >>"$file"
      case $kind in
        put) printf 'upload-file = "%s"\noutput = "/dev/null"\n' "$payload" >>"$file" ;;
        get) printf 'output = "/dev/null"\n' >>"$file" ;;
        ranged)
          local a=$((p * part_b)) b=$(((p + 1) * part_b - 1))
          ((b >= object_b)) && b=$((object_b - 1))
          printf 'output = "/dev/null"\nrange = "%d-%d"\n' "$a" "$b" >>"$file" ;;
      esac
    done
  done
}

# curl_pass KIND LAUNCHER N: GB/s of one pass (put: upload the objects; get/ranged: read them).
curl_pass() {
  local kind=$1 launcher=$2 n=$3 t0 t1
  t0=$(now_ns)
  if [[ $launcher == parallel ]]; then
    curl_config "$work/pass.cfg" "$kind"
    t0=$(now_ns)  # the config is written before the clock starts
    curl --no-progress-meter --parallel --parallel-immediate --parallel-max "$n" -K "$work/pass.cfg"
  else
    local i
    for ((i = 0; i < count; i++)); do echo "$i"; done >"$work/ids"
    t0=$(now_ns)
    if [[ $kind == put ]]; then
      xargs -P "$n" -I{} curl -K "$creds" -T "$payload" -o /dev/null "$endpoint/$bucket/$prefix/o{}" <"$work/ids"
    else
      xargs -P "$n" -I{} curl -K "$creds" -o /dev/null "$endpoint/$bucket/$prefix/o{}" <"$work/ids"
    fi
  fi
  t1=$(now_ns)
  gbps "$size_b" $((t1 - t0))
}

# curl_multipart_put N: GB/s of uploading the objects as strata does, as multipart uploads with
# parts of --part, all parts of all objects N at a time (one curl --parallel per phase: create,
# parts, complete). A part's ETag is the MD5 of its bytes, so the completions need no answers kept.
curl_multipart_put() {
  local n=$1 t0 t1 i p first=1 id
  t0=$(now_ns)
  : >"$work/create.cfg"
  for ((i = 0; i < count; i++)); do
    ((first)) || echo next >>"$work/create.cfg"
    first=0
    # "uploads=": curl 7.88 signs a bare "uploads" as the server does not (403).
    { cat "$creds"; printf 'url = "%s/%s/%s/o%d?uploads="
request = "POST"
output = "%s/upload-%d.xml"
'       "$endpoint" "$bucket" "$prefix" "$i" "$work" "$i"; } >>"$work/create.cfg"
  done
  curl --no-progress-meter --parallel --parallel-immediate --parallel-max "$n" -K "$work/create.cfg"
  : >"$work/parts.cfg"
  first=1
  for ((i = 0; i < count; i++)); do
    id=$(grep -o '<UploadId>[^<]*' "$work/upload-$i.xml" | cut -d'>' -f2)
    echo "$id" >"$work/upload-$i.id"
    for ((p = 0; p < parts; p++)); do
      ((first)) || echo next >>"$work/parts.cfg"
      first=0
      { cat "$creds"; printf 'url = "%s/%s/%s/o%d?partNumber=%d&uploadId=%s"
upload-file = "%s"
output = "/dev/null"
'         "$endpoint" "$bucket" "$prefix" "$i" $((p + 1)) "$id" "${part_files[p]}"; } >>"$work/parts.cfg"
    done
  done
  curl --no-progress-meter --parallel --parallel-immediate --parallel-max "$n" -K "$work/parts.cfg"
  : >"$work/complete.cfg"
  first=1
  for ((i = 0; i < count; i++)); do
    ((first)) || echo next >>"$work/complete.cfg"
    first=0
    { cat "$creds"; printf 'url = "%s/%s/%s/o%d?uploadId=%s"
request = "POST"
upload-file = "%s"
output = "/dev/null"
'       "$endpoint" "$bucket" "$prefix" "$i" "$(<"$work/upload-$i.id")" "$work/complete.xml"; } >>"$work/complete.cfg"
  done
  curl --no-progress-meter --parallel --parallel-immediate --parallel-max "$n" -K "$work/complete.cfg"
  t1=$(now_ns)
  gbps "$size_b" $((t1 - t0))
}

curl_remove() {
  local i
  for ((i = 0; i < count; i++)); do echo "$i"; done |
    xargs -P 8 -I{} curl -K "$creds" -X DELETE "$endpoint/$bucket/$prefix/o{}"
}

# strata_pass PART: "write read" GB/s of one strata-bench io round (it removes its objects).
strata_pass() {
  "$bench" io --path "s3://$bucket/strata-$RANDOM$RANDOM" --size "$size_b" --object "$object_b" --part "$1" \
    --depth "$depth" --reps 1 --json |
    python3 -c "import json, sys; j = json.load(sys.stdin); s = j['s3']
print('%.3f %.3f %d %d' % (j['write_GBps'], j['read_GBps'], s['patches'], s['retries']))"
}

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# --- tune curl: every launcher and N, one pass each, the best kept per layout and direction ------
# Two layouts on the server: whole-object PUTs (curl's plain upload) and multipart uploads with
# parts of --part (strata's layout); a server may serve one faster than the other.
better() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a > b) }'; }
echo
echo "curl tuning (one pass each, GB/s):"
plain_put=0 plain_put_how="" plain_get=0 plain_get_how="" mp_put=0 mp_put_n="" mp_get=0 mp_get_how=""
for n in $curl_ns; do
  for launcher in parallel xargs multipart; do
    prefix=curl-tune-$launcher-$n
    if [[ $launcher == multipart ]]; then
      w=$(curl_multipart_put "$n")
      g=$(curl_pass get parallel "$n")
    else
      w=$(curl_pass put "$launcher" "$n")
      g=$(curl_pass get "$launcher" "$n")
    fi
    r=-
    [[ $launcher != xargs ]] && r=$(curl_pass ranged parallel "$n")
    curl_remove
    printf '  %-9s N=%-3s put %s   whole GET %s   ranged GET of %s %s\n' "$launcher" "$n" "$w" "$g" "$part" "$r"
    get_how="get $([[ $launcher == xargs ]] && echo xargs || echo parallel) $n"
    if [[ $launcher == multipart ]]; then
      if better "$w" "$mp_put"; then mp_put=$w mp_put_n=$n; fi
      if better "$g" "$mp_get"; then mp_get=$g mp_get_how=$get_how; fi
      if better "$r" "$mp_get"; then mp_get=$r mp_get_how="ranged parallel $n"; fi
    else
      if better "$w" "$plain_put"; then plain_put=$w plain_put_how="put $launcher $n"; fi
      if better "$g" "$plain_get"; then plain_get=$g plain_get_how=$get_how; fi
      if [[ $r != - ]] && better "$r" "$plain_get"; then plain_get=$r plain_get_how="ranged parallel $n"; fi
    fi
  done
done
echo "  best whole-object PUTs: $plain_put_how ($plain_put), then $plain_get_how ($plain_get)"
echo "  best multipart uploads: N=$mp_put_n ($mp_put), then $mp_get_how ($mp_get)"

# --- the measured rounds, order rotating ------------------------------------------------------
sw="" sr="" pw="" pr="" cw="" cr="" mw="" mr="" patches=0 retries=0
echo
echo "rounds (GB/s):"
for ((k = 0; k < rounds; k++)); do
  for ((j = 0; j < 4; j++)); do
    case $(((k + j) % 4)) in
      0)
        read -r w r pa re < <(strata_pass "$part_b")
        sw+=" $w" sr+=" $r" patches=$((patches + pa)) retries=$((retries + re))
        echo "  round $((k + 1)): strata, parts of $part          write $w  read $r  (patches $pa, retries $re)" ;;
      1)
        read -r w r pa re < <(strata_pass "$object_b")
        pw+=" $w" pr+=" $r" patches=$((patches + pa)) retries=$((retries + re))
        echo "  round $((k + 1)): strata, one PUT per object      write $w  read $r  (patches $pa, retries $re)" ;;
      2)
        prefix=curl-round-$k
        read -r _ how n <<<"$plain_put_how"
        w=$(curl_pass put "$how" "$n")
        read -r kind how n <<<"$plain_get_how"
        r=$(curl_pass "$kind" "$how" "$n")
        curl_remove
        cw+=" $w" cr+=" $r"
        echo "  round $((k + 1)): curl, whole-object PUTs        write $w  read $r  ($plain_put_how, $plain_get_how)" ;;
      3)
        prefix=curl-mp-round-$k
        w=$(curl_multipart_put "$mp_put_n")
        read -r kind how n <<<"$mp_get_how"
        r=$(curl_pass "$kind" "$how" "$n")
        curl_remove
        mw+=" $w" mr+=" $r"
        echo "  round $((k + 1)): curl, multipart like strata    write $w  read $r  (N=$mp_put_n, $mp_get_how)" ;;
    esac
  done
done

msw=$(median <<<"$sw") msr=$(median <<<"$sr") mpw=$(median <<<"$pw") mpr=$(median <<<"$pr")
mcw=$(median <<<"$cw") mcr=$(median <<<"$cr") mmw=$(median <<<"$mw") mmr=$(median <<<"$mr")
bw=$mcw bwhat="whole-object PUTs"
better "$mmw" "$bw" && bw=$mmw bwhat="multipart"
br=$mcr brwhat="whole-object PUTs"
better "$mmr" "$br" && br=$mmr brwhat="multipart"
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
echo
echo "medians of $rounds rounds, GB/s (1e9 bytes/s), $size in $count objects of $object:"
printf '  %-42s %7s %7s %11s %11s %14s %14s\n' "" write read "write/best" "read/best" "write/same" "read/same"
printf '  %-42s %7s %7s %11s %11s %14s %14s\n' "strata io ($depth connections, parts of $part)" "$msw" "$msr" \
  "$(ratio "$msw" "$bw")" "$(ratio "$msr" "$br")" "$(ratio "$msw" "$mmw")" "$(ratio "$msr" "$mmr")"
printf '  %-42s %7s %7s %11s %11s %14s %14s\n' "strata io (one PUT and one GET per object)" "$mpw" "$mpr" \
  "$(ratio "$mpw" "$bw")" "$(ratio "$mpr" "$br")" "$(ratio "$mpw" "$mcw")" "$(ratio "$mpr" "$mcr")"
printf '  %-42s %7s %7s\n' "curl, whole-object PUTs ($plain_put_how)" "$mcw" "$mcr"
printf '  %-42s %7s %7s\n' "curl, multipart with parts of $part (N=$mp_put_n)" "$mmw" "$mmr"
echo "  best: the faster curl per direction (write: $bwhat, read: $brwhat); same: curl with strata's layout"
echo "  on the server (multipart uploads for strata's parts, whole-object PUTs for one PUT per object)"
echo "  strata's tier counters over all its rounds: $patches patches, $retries retries"
