#!/usr/bin/env bash
# The GPU check, run on the device machine (H200): configure for sm_90, build, run the tests
# labelled `cuda` (and, for context, the rest), then the GPU benchmarks. Logs go to $OUT.
#   device run: bash tools/gpu-check.sh      (carry: .carry, made by tools/carry-deps.sh)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build/gpu-check}
mkdir -p "$out"
prefix=()
[[ -d .carry/usr ]] && prefix=(-DCMAKE_PREFIX_PATH="$PWD/.carry/usr" -DCMAKE_LIBRARY_PATH="$PWD/.carry/usr/lib/x86_64-linux-gnu")
if [[ -d .carry/usr ]]; then
  export LD_LIBRARY_PATH="$PWD/.carry/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
  # carry-deps.sh made the carried .pc files relative to their own location.
  export PKG_CONFIG_PATH="$PWD/.carry/usr/lib/x86_64-linux-gnu/pkgconfig:$PWD/.carry/usr/share/pkgconfig"
fi
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  nvcc --version | tail -1
  g++ --version | head -1
  cmake --version | head -1
} >"$out/machine.txt" 2>&1
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S . -B build/gpu "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DSTRATA_ENABLE_CUDA=ON "${prefix[@]}" >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
cmake --build build/gpu -j "$(nproc)" >"$out/build.log" 2>&1 || { grep -E "error|FAILED" "$out/build.log" | head -30; exit 1; }
ctest --test-dir build/gpu -L cuda --output-on-failure 2>&1 | tee "$out/ctest-cuda.log"
rc=${PIPESTATUS[0]}
ctest --test-dir build/gpu -LE "cuda|consumer" -j 8 2>&1 | tail -5 | tee "$out/ctest-rest.log"
for b in build/gpu/bench/*_cuda_bench build/gpu/bench/strata_core_bench; do
  [[ -x "$b" ]] || continue
  "$b" --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
    --benchmark_out="$out/$(basename "$b").json" --benchmark_out_format=json 2>&1 | tail -25
done
# AdamW on the GPU against the same-run device-to-device copy bound, then PyTorch's fused CUDA
# AdamW on the same problem when PyTorch is installed there (BENCHMARKS.md, "AdamW kernels").
for g in fp32 bf16 fp16; do
  build/gpu/bench/strata-bench adamw --device cuda --params 256M --grad "$g" --reps 10 --json 2>&1 |
    tee -a "$out/adamw-cuda.jsonl"
done
if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  for g in fp32 bf16; do
    python3 bench/pytorch_adamw_bench.py --device cuda --impl fused --params 256M --grad "$g" --json 2>&1 |
      tee -a "$out/adamw-pytorch-cuda.jsonl"
  done
fi
exit "$rc"
