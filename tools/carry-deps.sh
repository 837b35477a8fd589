#!/usr/bin/env bash
# Unpacks the Debian -dev packages that the GPU machine may lack (headers and CMake packages of
# fmt, doctest, nlohmann-json, Google Benchmark, liburing, xxHash) and nanobind into .carry/, an ignored
# folder that the device tool carries. tools/gpu-check.sh puts .carry/usr on CMAKE_PREFIX_PATH and
# .carry/python on PYTHONPATH.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .carry && mkdir -p .carry/debs
(cd .carry/debs && apt-get download libfmt-dev libfmt9 doctest-dev nlohmann-json3-dev \
  libbenchmark-dev libbenchmark1debian liburing-dev liburing2 libxxhash-dev libxxhash0)
for d in .carry/debs/*.deb; do dpkg-deb -x "$d" .carry; done
rm -rf .carry/debs .carry/usr/share/doc .carry/usr/share/man
# The .pc files say prefix=/usr; make them relative to where they lie, wherever .carry lands.
sed -i 's|^prefix=/usr$|prefix=${pcfiledir}/../../..|' .carry/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc
sed -i 's|^prefix=/usr$|prefix=${pcfiledir}/../..|' .carry/usr/share/pkgconfig/*.pc
sed -i 's|=/usr/|=${prefix}/|' .carry/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc .carry/usr/share/pkgconfig/*.pc
# nanobind (pure Python and sources) for the Python front's CUDA tests, from PyPI.
python3 -m pip download -q --no-deps --only-binary=:all: -d .carry/wheels nanobind
python3 -m zipfile -e .carry/wheels/nanobind-*.whl .carry/python
rm -rf .carry/wheels
du -sh .carry
