# Shared by the S3 benchmark scripts (sourced, not run): the header every result file starts with,
# and the test server started in a directory of the caller's, its AWS_* variables exported.
#   s3_header SCRIPT COMMAND_LINE [EXTRA]   prints the "# ..." lines (date, command, machine, commit)
#   s3_start_server DIR                     starts tools/s3-server.sh in DIR; sets $bucket
# The caller stops the server (tools/s3-server.sh stop DIR) in its EXIT trap.

s3_header() {
  local root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  echo "# $1 $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "# command: $2"
  echo "# machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')), $(free -g | awk '/^Mem:/ {print $2}') GiB RAM, kernel $(uname -r)"
  echo "# commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$root" diff --quiet HEAD 2>/dev/null || echo ' (+ uncommitted changes)')${3:+; $3}; weed $("$root/.venv/bin/weed" version 2>/dev/null | awk '{print $3}' || true)"
}

s3_start_server() {
  local root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  STRATA_REQUIRE_S3=1 bash "$root/tools/s3-server.sh" start "$1" | sed 's/^/# /'
  eval "$(bash "$root/tools/s3-server.sh" env "$1")"
  bucket=$S3_TEST_BUCKET
}
