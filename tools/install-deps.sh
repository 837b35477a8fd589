#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages that strata's build, tests and benchmarks need, and only
# those that are missing (so it is quick and offline when everything is there).
# The CUDA toolkit is optional and not installed here: when nvcc is present, CUDA sources build.
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config
  libfmt-dev           # formatting (a dependency of the strata target)
  libxxhash-dev        # XXH3 checksums of stored blocks (a dependency of the strata target)
  liburing-dev         # io_uring file backend (optional; a POSIX backend always exists)
  doctest-dev          # tests
  nlohmann-json3-dev   # tests: parse the Chrome trace JSON that strata writes
  libbenchmark-dev     # benchmarks
  libopenmpi-dev openmpi-bin  # examples/mpi_train and its tests (optional: skipped without MPI)
  ccache               # compiler cache for strata's own builds (optional: STRATA_COMPILER_CACHE)
)

missing=()
for p in "${packages[@]}"; do
  if [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]]; then
    missing+=("$p")
  fi
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=()
if ((EUID != 0)); then
  if command -v sudo >/dev/null; then sudo=(sudo); else
    echo "install-deps: missing ${missing[*]}; run as root: apt-get install ${missing[*]}" >&2
    exit 1
  fi
fi
echo "install-deps: installing ${missing[*]}"
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
