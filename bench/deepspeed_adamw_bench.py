#!/usr/bin/env python3
"""DeepSpeed's CPU Adam (DeepSpeedCPUAdam, AdamW mode) on the problem of `strata-bench adamw
--no-model-copy`: n fp32 parameters updated in place from fp32 gradients (or bf16/fp16 ones,
widened to fp32 first, as DeepSpeed needs), with the given OpenMP thread count. Reports the best
of --reps steps, after one warm-up step that also JIT-builds DeepSpeed's op on first use.

    DS_ACCELERATOR=cpu python3 bench/deepspeed_adamw_bench.py --params 32M --threads 2 [--grad fp32] [--json]
"""
import argparse
import json
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="32M")
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--grad", choices=["fp32", "bf16", "fp16"], default="fp32")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    # DeepSpeed's kernel parallelizes with OpenMP; torch's own ops (the widening) use the same count.
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    import torch
    import deepspeed
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from pytorch_adamw_bench import count  # the same "32M" parsing as the PyTorch side

    torch.set_num_threads(a.threads)
    n = count(a.params)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[a.grad]
    p = torch.nn.Parameter(torch.rand(n))
    g = (torch.rand(n) * 1e-3).to(dtype)
    opt = DeepSpeedCPUAdam([p], lr=1e-3, weight_decay=1e-2, adamw_mode=True)
    best = float("inf")
    for r in range(a.reps + 1):
        t0 = time.perf_counter()
        p.grad = g if dtype == torch.float32 else g.float()
        opt.step()
        s = time.perf_counter() - t0
        if r > 0:
            best = min(best, s)
    res = {"impl": "DeepSpeedCPUAdam", "params": n, "threads": a.threads, "grad": a.grad, "seconds": best,
           "Gparams_per_s": n / best / 1e9, "torch": torch.__version__, "deepspeed": deepspeed.__version__}
    print(json.dumps(res) if a.json else
          f"DeepSpeed {deepspeed.__version__} CPU Adam: {n} params, {a.grad} grads, {a.threads} threads: "
          f"{best * 1e3:.3f} ms per step, {n / best / 1e9:.3f} Gparams/s")


if __name__ == "__main__":
    main()
