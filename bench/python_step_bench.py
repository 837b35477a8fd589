#!/usr/bin/env python3
"""What the Python front costs over the C++ step: one flat tensor of --params parameters with bf16
gradients, the strata preset on the same path, cache, subgroups and threads, measured in one run
with the sides interleaved round by round:

  cpp      `strata-bench step --preset strata --grad bf16` (fp32 initial weights; an iteration is the
           gradient hand-over, one subgroup at a time, then step(lr))
  native   strata.Optimizer from Python, the same calls (accept_gradients per subgroup, step)
  front    strata.torch.OffloadedAdamW.step() on a bf16 parameter whose .grad is set
           (handover="step": the hand-over is inside step()), which also writes the bf16 model
  torch    torch.optim.AdamW(foreach=False) in memory on fp32 weights and fp32 gradients, when
           16 bytes per parameter fit in the machine's available memory (--no-torch skips it)

Figures are medians over every measured iteration of every round; the ratios are front / cpp and
native / cpp on those medians.

    .venv/bin/python bench/python_step_bench.py --params 1e9 --subgroup 16M --path /tmp/pyb \\
        --strata-bench build/default/bench/strata-bench [--rounds 2 --iters 3 --warmup 1 --json out.json]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import strata
from strata.torch import OffloadedAdamW


def params_count(text):
    units = {"K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9}
    t = text.strip()
    return int(float(t[:-1]) * units[t[-1].upper()]) if t[-1].upper() in units else int(float(t))


def available_bytes():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def run_cpp(a, workdir):
    out = os.path.join(workdir, "cpp.json")
    cmd = [a.strata_bench, "step", "--preset", "strata", "--params", str(a.params), "--subgroup", str(a.subgroup),
           "--cache", a.cache, "--path", a.path, "--grad", "bf16", "--iters", str(a.iters), "--warmup",
           str(a.warmup), "--threads", str(a.threads), "--probe", "0", "--json", out]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        doc = json.load(f)
    runs = [r for r in doc["presets"] if r["preset"] == "strata"]
    return [it["step_s"] for it in runs[0]["iterations"]]


def cache_subgroups(a):
    subgroups = -(-a.params // a.subgroup)
    return int(subgroups * float(a.cache.rstrip("%")) / 100.0)


def pattern(n, modulus, scale, dtype):
    """((i mod modulus) - modulus/2) * scale, filled a chunk at a time (no n-sized temporaries)."""
    out = torch.empty(n, dtype=dtype)
    chunk = 1 << 24
    for s in range(0, n, chunk):
        k = min(chunk, n - s)
        v = torch.arange(s, s + k, dtype=torch.int64).remainder_(modulus).sub_(modulus // 2)
        out[s:s + k].copy_(v.to(torch.float32).mul_(scale))
    return out


def init_weights(n, dtype=torch.float32):
    # Deterministic and cheap, as strata-bench's (a normal generator would take longer than a step).
    return pattern(n, 1021, 1e-3, dtype)


def grads_of(n, dtype=torch.bfloat16):
    return pattern(n, 977, 1e-6, dtype)


def options(a):
    return dict(subgroup_size=a.subgroup, threads=a.threads, cache_subgroups=cache_subgroups(a))


def timed(a, before, step):
    """Seconds of each measured step() after the warm-up ones; before() runs untimed first."""
    times = []
    for i in range(a.warmup + a.iters):
        before()
        t0 = time.perf_counter()
        step()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    return times


def run_native(a, g):
    opt = strata.Optimizer.create(init_weights(a.params), preset="strata", paths=[a.path], **options(a))
    def step():
        for first in range(0, a.params, a.subgroup):
            opt.accept_gradients(first, g[first:first + a.subgroup])
        opt.step(1e-3)

    try:
        times = timed(a, lambda: None, step)
    finally:
        opt.remove_state()
        opt.close()
    return times


def run_front(a, g):
    p = torch.nn.Parameter(init_weights(a.params, torch.bfloat16))
    # The cpp side's budget has no limit: so has this one (the front's default is a quarter of
    # torch's state), with the same cache.
    opt = OffloadedAdamW([p], lr=1e-3, paths=[a.path], handover="step", subgroup_size=a.subgroup, threads=a.threads,
                         cache_subgroups=cache_subgroups(a), host_memory_budget=1 << 62)
    try:
        times = timed(a, lambda: setattr(p, "grad", g), opt.step)
    finally:
        opt.native.remove_state()
        opt.close()
    return times


def run_torch(a):
    p = torch.nn.Parameter(init_weights(a.params))
    opt = torch.optim.AdamW([p], lr=1e-3, foreach=False)
    g = grads_of(a.params, torch.float32)
    return timed(a, lambda: setattr(p, "grad", g), opt.step)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="100M")
    ap.add_argument("--subgroup", default="8M", help="parameters per subgroup (M = 1e6, as strata-bench)")
    ap.add_argument("--cache", default="25%", help="share of the subgroups kept in host memory")
    ap.add_argument("--path", required=True, help="directory of the state (one path, on the disk under test)")
    ap.add_argument("--strata-bench", required=True)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    a.params = params_count(a.params)
    a.subgroup = params_count(a.subgroup)
    torch.set_num_threads(a.threads)
    os.makedirs(a.path, exist_ok=True)
    g = grads_of(a.params)
    times = {"cpp": [], "native": [], "front": [], "torch": []}
    with tempfile.TemporaryDirectory() as work:
        for r in range(a.rounds):
            times["cpp"] += run_cpp(a, work)
            times["native"] += run_native(a, g)
            times["front"] += run_front(a, g)
            print(f"round {r + 1}: cpp {times['cpp'][-a.iters:]}, native {times['native'][-a.iters:]}, "
                  f"front {times['front'][-a.iters:]}", flush=True)
    fits = available_bytes() > 16 * a.params * 1.15
    if not a.no_torch and fits:
        del g
        times["torch"] = run_torch(a)
    med = {k: statistics.median(v) for k, v in times.items() if v}
    print(f"\n{a.params / 1e9:g}B parameters, subgroups of {a.subgroup}, cache {a.cache}, {a.threads} threads, "
          f"path {a.path}; {a.rounds} rounds x {a.iters} iterations; step s, median (min-max)")
    for k, v in times.items():
        if v:
            print(f"  {k:<7} {med[k]:8.3f} ({min(v):.3f}-{max(v):.3f})")
        else:
            print(f"  {k:<7} not run ({'skipped' if a.no_torch else 'does not fit in available memory'})")
    print(f"front / cpp = {med['front'] / med['cpp']:.3f}, native / cpp = {med['native'] / med['cpp']:.3f}"
          + (f", front / torch in memory = {med['front'] / med['torch']:.2f}" if "torch" in med else ""))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"params": a.params, "subgroup": a.subgroup, "cache": a.cache, "threads": a.threads,
                       "times": times, "median": med}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
