#!/usr/bin/env python3
"""PyTorch's AdamW (CPU, or CUDA with --device cuda) on the same problem as `strata-bench adamw`, for the comparison in
BENCHMARKS.md: fp32 parameters updated in place from gradients of the given dtype (converted to
fp32 first, as AMP's master-weight setups do), plus the bf16 model copy, with the same thread
count. Reports the best of --reps steps.

    python3 bench/pytorch_adamw_bench.py --params 32M --threads 2 --grad bf16 [--impl foreach] [--json]
"""
import argparse
import json
import time

import torch


def count(text):
    units = {"K": 10**3, "M": 10**6, "G": 10**9}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(float(text))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="32M")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--grad", choices=["fp32", "bf16", "fp16"], default="bf16")
    ap.add_argument("--impl", choices=["foreach", "single", "fused"], default="foreach")
    ap.add_argument("--tensors", type=int, default=1, help="split the parameters into this many tensors")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-model-copy", action="store_true")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    n = count(a.params)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[a.grad]
    sizes = [n // a.tensors + (1 if i < n % a.tensors else 0) for i in range(a.tensors)]
    dev = torch.device(a.device)
    params = [torch.nn.Parameter(torch.rand(s, device=dev)) for s in sizes]
    grads16 = [(torch.rand(s, device=dev) * 1e-3).to(dtype) for s in sizes]
    models = [torch.empty(s, dtype=torch.bfloat16, device=dev) for s in sizes]
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    kwargs = {"foreach": a.impl == "foreach"} if a.impl != "fused" else {"fused": True}
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=1e-2, **kwargs)
    best = float("inf")
    for r in range(a.reps + 1):
        sync()
        t0 = time.perf_counter()
        for p, g in zip(params, grads16):
            p.grad = g.float() if dtype != torch.float32 else g  # the fp32 copy of the gradient
        opt.step()
        if not a.no_model_copy:
            for mdl, p in zip(models, params):
                mdl.copy_(p.detach())
        sync()
        s = time.perf_counter() - t0
        if r > 0:
            best = min(best, s)
    res = {"device": a.device, "impl": a.impl, "params": n, "threads": a.threads, "grad": a.grad, "seconds": best,
           "Gparams_per_s": n / best / 1e9, "torch": torch.__version__}
    print(json.dumps(res) if a.json else
          f"torch {torch.__version__} AdamW ({a.impl}) on {a.device}: {n} params, {a.grad} grads, {a.threads} threads: "
          f"{best * 1e3:.3f} ms per step, {n / best / 1e9:.3f} Gparams/s")


if __name__ == "__main__":
    main()
