#!/usr/bin/env bash
# The whole Python test suite (tests/python, `-m "not cuda"`, as ctest's strata_python_tests runs
# it) on the newest PyPI torch, transformers and accelerate. CI's own Python tests see Debian's
# torch 1.13 while users run torch 2.x; this covers the other end.
#
# It uses a virtualenv made from Debian's /usr/bin/python3 without --system-site-packages (so
# Debian's torch does not shadow PyPI's) and the strata module already built into
# <build>/python (built for one CPython ABI: the venv's Python must match it, 3.11 on Debian 12).
# Without a venv it prints a skip line and exits 0, so CI can run it without downloading.
#
#   tools/torch-matrix.sh [--venv DIR] [--build DIR] [--create] [-- PYTEST_ARGS...]
#     --venv DIR    the virtualenv (default <repo>/.venv-torch, git-ignored)
#     --build DIR   the build tree whose python/ holds the strata module (default <repo>/build/default)
#     --create      create the venv if missing and install/upgrade the newest torch, transformers,
#                   accelerate, pytest and numpy from PyPI into it (about 5 GB with CUDA wheels)
#     -- ARGS       passed on to pytest after the default arguments
# Output: first `torch-matrix: python V torch V transformers V accelerate V`, last
# `torch-matrix: N passed, M failed, K skipped (torch V)` (errors count as failed). When skipped, the
# last line is `torch-matrix: SKIPPED`. Exit status: pytest's (0 when skipped).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=$repo/.venv-torch
build=$repo/build/default
create=0
pytest_args=()

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }
die() { echo "torch-matrix: $*" >&2; exit 2; }

while (($#)); do
  case $1 in
    --venv) (($# >= 2)) || die "--venv needs a directory"; venv=$2; shift 2 ;;
    --build) (($# >= 2)) || die "--build needs a directory"; build=$2; shift 2 ;;
    --create) create=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; pytest_args=("$@"); break ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
venv=$(realpath -m "$venv")
build=$(realpath -m "$build")
py=$venv/bin/python

if [[ ! -x $py ]] && ((!create)); then
  echo "torch-matrix: skipped: no venv at $venv; run tools/torch-matrix.sh --create (downloads about 5 GB)"
  echo "torch-matrix: SKIPPED"
  exit 0
fi

# The strata module's ABI tag (e.g. 311 from _core.cpython-311-x86_64-linux-gnu.so) fixes the Python.
shopt -s nullglob
mods=("$build"/python/strata/_core.cpython-*.so)
shopt -u nullglob
((${#mods[@]})) || die "no strata module in $build/python/strata (build it: cmake --build --preset default)"
tag=$(basename "${mods[0]}" | sed -E 's/^_core\.cpython-([0-9]+).*/\1/')
want="${tag:0:1}.${tag:1}"

if [[ ! -x $py ]]; then
  have=$(/usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  [[ $have == "$want" ]] ||
    die "/usr/bin/python3 is $have but the strata module in $build/python is built for CPython $want"
  echo "torch-matrix: creating $venv from /usr/bin/python3 $have"
  /usr/bin/python3 -m venv "$venv" ||
    die "could not create $venv (Debian needs python3-venv: apt-get install python3-venv)"
fi
have=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])') || die "$py does not run"
[[ $have == "$want" ]] ||
  die "$py is Python $have but the strata module in $build/python is built for CPython $want; recreate the venv from a Python $want"
if ((create)); then
  echo "torch-matrix: installing the newest torch, transformers, accelerate, pytest, numpy into $venv"
  "$py" -m pip install --upgrade pip
  "$py" -m pip install --upgrade torch transformers accelerate pytest numpy
fi

export PYTHONPATH=$build/python PYTHONDONTWRITEBYTECODE=1
# torch must come from the venv (not Debian's dist-packages); the tests would skip without it.
versions=$("$py" - "$venv" <<'EOF'
import os, platform, sys
from importlib import metadata
import torch
if not os.path.realpath(torch.__file__).startswith(os.path.realpath(sys.argv[1]) + "/"):
    sys.exit(f"torch-matrix: torch {torch.__version__} comes from {torch.__file__}, not the venv")
def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "missing"
print(f"python {platform.python_version()} torch {torch.__version__} "
      f"transformers {version('transformers')} accelerate {version('accelerate')}")
EOF
) || die "cannot import torch from $venv (run tools/torch-matrix.sh --create, or --venv DIR)"
torch_version=$(sed -E 's/.* torch ([^ ]+) .*/\1/' <<<"$versions")
echo "torch-matrix: $versions"

log=$(mktemp /tmp/torch-matrix.XXXXXX)
trap 'rm -f "$log"' EXIT
cd "$repo"
set +e
"$py" -m pytest -q -p no:cacheprovider -m "not cuda" tests/python ${pytest_args[@]+"${pytest_args[@]}"} 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e

# pytest's last line, e.g. "60 passed, 2 failed, 1 skipped, 3 deselected, 1 warning in 9.81s".
last=$(grep -E '^=* *[0-9]+ [a-z]+.* in [0-9.]+s' "$log" | tail -1 || true)
count() { grep -oE "[0-9]+ $1" <<<"$last" | grep -oE '^[0-9]+' || echo 0; }
failed=$(($(count failed) + $(count 'errors?')))
echo "torch-matrix: $(count passed) passed, $failed failed, $(count skipped) skipped (torch $torch_version)"
exit "$rc"
