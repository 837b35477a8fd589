#!/usr/bin/env bash
# The GPU checks, in one run on a machine with an NVIDIA GPU (the device tool's H200):
#   1. configure and build the CUDA tests, strata-bench and the CUDA examples for sm_90;
#   2. every `cuda`-labelled test (ctest -L cuda);
#   3. compute-sanitizer memcheck and racecheck on each CUDA test binary;
#   4. the GPU benchmarks: the AdamW kernel against a D2D copy, the step on the GPU against
#      CPU-only steps (with per-stream busy time and its bound), and torch's fused AdamW;
# $OUT (default ./gpu-check-out) gets summary.log, the benchmarks' JSON and logs.tar.gz with every
# log (the device tool returns at most 8 files). Budget: under 8 minutes on 16 cores.
# Dependencies missing on that machine come from .carry (tools/carry-deps.sh, run here; name
# .carry in the device tool's `carry`).
#   tools/gpu-check.sh [--quick]     --quick: smaller benchmarks
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
LOGS=$(mktemp -d /tmp/gpu-check.XXXXXX)
finish() {
  tar -C "$LOGS" -czf "$OUT/logs.tar.gz" . 2>/dev/null
  rm -rf "$LOGS"
}
trap finish EXIT
quick=0
[[ ${1:-} == --quick ]] && quick=1
start=$(date +%s)
log() { echo "[gpu-check $(($(date +%s) - start))s] $*" | tee -a "$OUT/summary.log"; }
status=0
step() {  # step NAME TIMEOUT_S CMD...: runs CMD, logs to $LOGS/NAME.log, records the result
  local name=$1 limit=$2
  shift 2
  log "start $name"
  timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1
  local rc=$?
  log "end $name: rc=$rc"
  [[ $rc -ne 0 ]] && status=1
  return $rc
}

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv
  nvcc --version | tail -2
  g++ --version | head -1
  cmake --version | head -1
  nproc
} >"$LOGS/machine.log" 2>&1
cp "$LOGS/machine.log" "$OUT/machine.log"

export PATH=$PATH:/usr/local/cuda/bin  # compute-sanitizer, nvcc
command -v compute-sanitizer >/dev/null || log "compute-sanitizer not found: the sanitizer steps will fail (rc 127)"
prefix=()
if [[ -d .carry/usr ]]; then
  prefix=(-DCMAKE_PREFIX_PATH="$PWD/.carry/usr" -DCMAKE_LIBRARY_PATH="$PWD/.carry/usr/lib/x86_64-linux-gnu")
  export LD_LIBRARY_PATH="$PWD/.carry/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # carry-deps.sh made the carried .pc files relative to their own location.
  export PKG_CONFIG_PATH="$PWD/.carry/usr/lib/x86_64-linux-gnu/pkgconfig:$PWD/.carry/usr/share/pkgconfig"
fi
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
build=build/gpu
step configure 120 cmake -S . -B $build "${gen[@]}" "${prefix[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DSTRATA_ENABLE_CUDA=ON -DSTRATA_ENABLE_URING=AUTO || { tail -40 "$LOGS/configure.log"; exit 1; }
targets=(strata_cuda_core_test strata_cuda_exec_test strata_optim_adamw_cuda_test strata_bench train_mlp_cuda)
step build 300 cmake --build $build -j "$(nproc)" --target "${targets[@]}" || { tail -60 "$LOGS/build.log"; exit 1; }

step ctest-cuda 150 ctest --test-dir $build -L cuda --output-on-failure --timeout 120
tail -15 "$LOGS/ctest-cuda.log"
# memcheck: out-of-bounds and misaligned device accesses, leaks; racecheck: shared-memory hazards.
# All at once (one GPU runs them side by side), each under its own limit.
pids=()
for bin in $(ls $build/tests/*/strata_*cuda*_test 2>/dev/null | sort -u); do
  name=$(basename "$bin")
  step "memcheck-$name" 200 compute-sanitizer --tool memcheck --leak-check full --error-exitcode 9 "$bin" &
  pids+=($!)
  step "racecheck-$name" 200 compute-sanitizer --tool racecheck --error-exitcode 9 "$bin" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || status=1; done
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$LOGS"/*check-*.log | sort | uniq -c | tee -a "$OUT/summary.log"

bench=$build/bench/strata-bench
params=2e9
[[ $quick == 1 ]] && params=500M
# The kernel against the same-run device-to-device copy bound, per gradient type.
for g in fp32 bf16 fp16; do
  step "bench-adamw-$g" 60 $bench adamw --device cuda --params 256M --grad "$g" --reps 10 --json
  cat "$LOGS/bench-adamw-$g.log" >>"$OUT/adamw-cuda.jsonl"
done
step bench-step 180 $bench step --device cuda --params "$params" --subgroup 64M --threads "$(nproc)" --iters 3 \
  --warmup 1 --compare-cpu --json "$OUT/step-cuda.json" --trace "$LOGS/step-cuda.trace.json"
tail -12 "$LOGS/bench-step.log" | tee -a "$OUT/summary.log"
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  for g in fp32 bf16; do
    step "bench-torch-$g" 90 python3 bench/pytorch_adamw_bench.py --device cuda --impl fused --params 256M --grad "$g" --json
    cat "$LOGS/bench-torch-$g.log" >>"$OUT/adamw-pytorch-cuda.jsonl"
  done
fi
# The PyTorch front's CUDA tests, where torch sees the GPU: the module is built with that Python
# (nanobind from .carry/python when it is not installed; Python headers must be there).
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  [[ -d .carry/python ]] && export PYTHONPATH="$PWD/.carry/python${PYTHONPATH:+:$PYTHONPATH}"
  if python3 -c 'import nanobind' 2>/dev/null; then
    step python-configure 120 cmake -S . -B build/gpu-python "${gen[@]}" "${prefix[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DSTRATA_ENABLE_CUDA=OFF -DSTRATA_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)" \
      -DSTRATA_BUILD_EXAMPLES=OFF -DSTRATA_BUILD_BENCH=OFF &&
      step python-build 200 cmake --build build/gpu-python -j "$(nproc)" --target strata_python &&
      step python-cuda-tests 150 ctest --test-dir build/gpu-python -L python --output-on-failure --timeout 120
    tail -8 "$LOGS/python-cuda-tests.log" 2>/dev/null | tee -a "$OUT/summary.log"
  else
    log "python: nanobind not importable (run tools/carry-deps.sh, carry .carry): the front's CUDA tests did not run"
  fi
fi
log "done: status $status in $(($(date +%s) - start)) s"
exit $status
