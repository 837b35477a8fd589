#!/usr/bin/env python3
"""Peak RSS of a training step: torch.optim.AdamW (in memory) vs strata.torch.OffloadedAdamW (defaults).

Each optimizer runs in a fresh subprocess, so that each peak is its own: the child builds a stack
of nn.Linear layers of about --params parameters in --dtype, takes the optimizer, runs one
warm-up step (torch's AdamW makes its state there), resets the peak resident set (writes "5" to
/proc/self/clear_refs: VmHWM restarts from the current RSS) and runs --steps steps (forward on a
tiny batch, backward, step, zero_grad(set_to_none=True)). The step peak (VmHWM) is split into
the process before the model (python + torch), the model's parameters, their gradients, the
optimizer's own memory (torch: its state tensors; strata: stats()["host_memory_peak"], with its
budget beside) and the rest. One more step afterwards, with a reset per phase, says how much of
the peak forward+backward and step() each reach.

strata takes no option but paths=[DIR/nvme] and threads: the defaults are what is measured
(--strata-options adds arguments, for experiments only).

Run-to-run noise: glibc serves tensors below its dynamic mmap threshold (up to 32 MiB: the gradients
of a 2048x2048 layer) from the heap, where the holes zero_grad leaves vary by a few gradient sizes
from run to run, in either process. MALLOC_MMAP_THRESHOLD_=131072 in the environment (both children
inherit it) maps them one by one and makes the peaks reproducible to about 1 MB.

    PYTHONPATH=build/default/python python3 bench/scripts/torch_memory.py --params 1e8 --dtype bfloat16 \\
        --threads 2 [--steps 3] [--dir /nvme/tmp] [--json out.json]

Runs with torch 1.13 (Debian's python3-torch) and torch 2.x.
"""
import argparse
import gc
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

GIB = float(1 << 30)
OPTIMIZERS = ("torch", "strata")


def count(text):
    units = {"K": 10**3, "M": 10**6, "G": 10**9}
    t = str(text).strip()
    return int(float(t[:-1]) * units[t[-1].upper()]) if t[-1].upper() in units else int(float(t))


# --- /proc -----------------------------------------------------------------------------------

def status():
    """/proc/self/status's memory fields in bytes (VmRSS, VmHWM, RssAnon, RssFile, ...) and Threads."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            m = re.match(r"(Vm\w+|Rss\w+|Threads):\s+(\d+)(\s+kB)?", line)
            if m:
                out[m.group(1)] = int(m.group(2)) * (1024 if m.group(3) else 1)
    return out


def rss():
    return status()["VmRSS"]


def hwm():
    return status()["VmHWM"]


def reset_peak():
    """VmHWM restarts from the current RSS (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def smaps_rollup():
    out = {}
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                m = re.match(r"(\w+):\s+(\d+) kB", line)
                if m:
                    out[m.group(1)] = int(m.group(2)) * 1024
    except OSError:
        pass
    return out


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def mem_total():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


# --- the child: one optimizer ----------------------------------------------------------------

def width_for(n):
    """Layers of width 4096, or narrower for small models so that there are at least ~4 layers."""
    w = 4096
    while w > 256 and 4 * w * (w + 1) > n:
        w //= 2
    return w


def child(a):
    import torch

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[a.dtype]
    gc.collect()
    base_status = status()
    base = base_status["VmRSS"]  # python + torch, before the model (strata's import counts in its rest)

    n = count(a.params)
    width = a.width or width_for(n)
    layers = max(1, round(n / (width * (width + 1))))
    mods = []
    for i in range(layers):
        mods.append(torch.nn.Linear(width, width, dtype=dtype))
        if i + 1 < layers:
            mods.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*mods)
    params = list(model.parameters())
    numel = sum(p.numel() for p in params)
    model_bytes = sum(p.numel() * p.element_size() for p in params)
    gc.collect()
    after_model = rss()

    t0 = time.perf_counter()
    if a.child == "torch":
        opt = torch.optim.AdamW(params, lr=1e-4, foreach=False)
    else:
        import strata.torch as st

        path = os.path.join(a.dir, "nvme")
        os.makedirs(path, exist_ok=True)
        extra = json.loads(a.strata_options) if a.strata_options else {}
        opt = st.OffloadedAdamW(params, lr=1e-4, paths=[path], threads=a.threads, **extra)
    construct_s = time.perf_counter() - t0
    gc.collect()
    after_construct = rss()
    construct_peak = hwm()

    x = torch.randn(a.batch, width, dtype=dtype)
    grad_bytes = [0]

    def forward_backward():
        loss = model(x).float().pow(2).mean()
        loss.backward()
        grad_bytes[0] = sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)

    def one_step():
        forward_backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    t0 = time.perf_counter()
    one_step()
    warmup_s = time.perf_counter() - t0
    gc.collect()
    warmup_status = status()
    after_warmup = warmup_status["VmRSS"]
    warmup_peak = warmup_status["VmHWM"]

    reset_peak()
    start = rss()
    step_s = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        one_step()
        step_s.append(time.perf_counter() - t0)
    peak = hwm()
    after_steps = status()
    rollup = smaps_rollup()

    # One more step, with a reset per phase: which phase reaches the peak.
    reset_peak()
    forward_backward()
    fb_peak = hwm()
    before_step = rss()
    reset_peak()
    opt.step()
    step_peak = hwm()
    opt.zero_grad(set_to_none=True)

    res = dict(optimizer=a.child, torch=torch.__version__, dtype=a.dtype, params=numel, layers=layers, width=width,
               threads=a.threads, steps=a.steps, base_rss=base, after_model_rss=after_model,
               after_construct_rss=after_construct, construct_peak=construct_peak, after_warmup_rss=after_warmup,
               warmup_peak=warmup_peak, steps_start_rss=start, step_peak=peak, model_bytes=model_bytes,
               grad_bytes=grad_bytes[0], construct_s=construct_s, warmup_s=warmup_s, step_s=step_s,
               phase_fwd_bwd_peak=fb_peak, phase_step_start_rss=before_step, phase_step_peak=step_peak,
               base_status=base_status, after_warmup_status=warmup_status, after_steps_status=after_steps,
               after_steps_smaps=rollup)
    if a.child == "torch":
        state = 0
        for s in opt.state.values():
            for v in s.values():
                if torch.is_tensor(v):
                    state += v.numel() * v.element_size()
        res.update(opt_bytes=state, opt_budget=None)
    else:
        s = opt.stats()
        res.update(opt_bytes=s["host_memory_peak"], opt_budget=s["host_memory_budget"],
                   opt_used=s["host_memory_used"], segments=opt.segments,
                   strata_stats={k: v for k, v in s.items() if k != "segments"})
        opt.close()
    res["rest"] = peak - base - model_bytes - grad_bytes[0] - res["opt_bytes"]
    # Of the rest, file-backed pages (code and data of the libraries touched since `base`; stable after warm-up).
    res["rest_file"] = after_steps.get("RssFile", 0) - base_status.get("RssFile", 0)
    print("RESULT " + json.dumps(res), flush=True)


# --- the parent ------------------------------------------------------------------------------

def run_child(a, which, workdir):
    cmd = [sys.executable, os.path.abspath(__file__), "--_child", which, "--params", str(a.params), "--dtype", a.dtype,
           "--steps", str(a.steps), "--dir", workdir, "--threads", str(a.threads), "--batch", str(a.batch),
           "--width", str(a.width)] + (["--strata-options", a.strata_options] if a.strata_options else [])
    env = dict(os.environ)
    # Both children alike: no allocator tuning of ours.
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, env=env, universal_newlines=True)
    wall = time.perf_counter() - t0
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        sys.stdout.write(p.stdout)
        raise SystemExit(f"torch_memory: the {which} child failed (exit {p.returncode})")
    res = json.loads(lines[-1][len("RESULT "):])
    res["wall_s"] = wall
    return res


def gib(x):
    return "-" if x is None else f"{x / GIB:.3f}"


def table(results):
    t = results["torch"]["step_peak"]
    head = ["optimizer", "step peak", "base", "model", "grads", "opt mem", "opt budget", "rest", "ratio/torch"]
    rows = []
    for r in results.values():
        rows.append([r["optimizer"], gib(r["step_peak"]), gib(r["base_rss"]), gib(r["model_bytes"]),
                     gib(r["grad_bytes"]), gib(r["opt_bytes"]), gib(r["opt_budget"]), gib(r["rest"]),
                     f"{r['step_peak'] / t:.3f}"])
    out = [fmt(head, rows, "GiB; step peak = VmHWM over the steps = base + model + grads + opt mem + rest")]
    head2 = ["optimizer", "after construct", "construct peak", "warm-up peak", "fwd+bwd peak", "step() peak",
             "step s (median)", "rest: file pages", "threads"]
    rows2 = []
    for r in results.values():
        ss = sorted(r["step_s"])
        rows2.append([r["optimizer"], gib(r["after_construct_rss"]), gib(r["construct_peak"]), gib(r["warmup_peak"]),
                      gib(r["phase_fwd_bwd_peak"]), gib(r["phase_step_peak"]), f"{ss[len(ss) // 2]:.2f}",
                      gib(r["rest_file"]), str(r["after_steps_status"].get("Threads"))])
    out.append(fmt(head2, rows2, "GiB; construct peak = VmHWM after the constructor; the phase peaks are of one "
                                 "extra step, reset per phase; rest: file pages = RssFile after the steps - RssFile at base"))
    return "\n\n".join(out)


def fmt(head, rows, note):
    w = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    line = lambda cells: "  ".join(str(c).rjust(k) if i else str(c).ljust(k) for i, (c, k) in enumerate(zip(cells, w)))
    return "\n".join([line(head), line(["-" * k for k in w])] + [line(r) for r in rows] + [f"({note})"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="1e8", help="about this many parameters (1e8, 20M)")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where strata's paths go (default: a temporary directory in /tmp)")
    ap.add_argument("--threads", type=int, default=None, help="threads of torch and strata (default: the usable cores)")
    ap.add_argument("--json", default=None, help="write the numbers here")
    ap.add_argument("--batch", type=int, default=4, help="rows of the input batch")
    ap.add_argument("--width", type=int, default=0, help="layer width (default: 4096, narrower for small models)")
    ap.add_argument("--strata-options", default=None,
                    help="JSON of further OffloadedAdamW arguments, for experiments (default: none: the defaults "
                         "are what is measured)")
    ap.add_argument("--only", choices=OPTIMIZERS, action="append", help="run only this optimizer (repeatable)")
    ap.add_argument("--_child", choices=OPTIMIZERS, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.threads is None:
        a.threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if a._child:
        a.child = a._child
        return child(a)

    print("command: " + " ".join(shlex.quote(x) for x in [sys.executable] + sys.argv))
    print(f"cpu: {cpu_model()} ({os.cpu_count()} cores, {mem_total() / GIB:.1f} GiB); python {platform.python_version()}")
    made = a.dir is None
    workdir = tempfile.mkdtemp(prefix="strata-torch-memory-", dir="/tmp") if made else a.dir
    os.makedirs(workdir, exist_ok=True)
    results = {}
    try:
        for which in a.only or OPTIMIZERS:
            results[which] = run_child(a, which, workdir)
            shutil.rmtree(os.path.join(workdir, "nvme"), ignore_errors=True)
    finally:
        if made:
            shutil.rmtree(workdir, ignore_errors=True)
    r0 = next(iter(results.values()))
    print(f"torch {r0['torch']}, {a.dtype}, {r0['params']:,} parameters ({r0['layers']} x Linear({r0['width']}, "
          f"{r0['width']})), batch {a.batch}, {a.threads} threads, {a.steps} steps after one warm-up step")
    if a.strata_options:
        print(f"NOTE: strata with options {a.strata_options} (not the defaults)")
    if "torch" in results:
        print(table(results))
    else:
        for r in results.values():
            print(json.dumps(r, indent=1))
    for r in results.values():
        if r["optimizer"] == "strata":
            seg = r.get("segments") or [{}]
            print(f"strata: budget {gib(r['opt_budget'])} GiB, host memory peak {gib(r['opt_bytes'])} GiB, in use after "
                  f"the steps {gib(r['opt_used'])} GiB, subgroup {seg[0].get('subgroup_size')} parameters, "
                  f"{len(seg)} segment(s)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(command=[sys.executable] + sys.argv, cpu=cpu_model(), cores=os.cpu_count(),
                           mem_total=mem_total(), results=results), f, indent=1)


if __name__ == "__main__":
    main()
