#!/usr/bin/env python3
"""Writes tests/data/adamw_golden.bin: AdamW/Adam trajectories computed by PyTorch's own
optimizer (single-tensor path, CPU, fp32 master weights), which strata's kernels must follow to a
relative error below 1e-6 (tests/optim/adamw_golden_test.cpp).

Run once wherever PyTorch is installed (pip install torch numpy), from the repository root:
    python3 tools/make_adamw_golden.py [--out tests/data/adamw_golden.bin]
The file is committed; regenerate it only when the cases change.

Format (little-endian):
  magic "STRATAGD", u32 version (1), u32 case count, then per case:
  u32 name length, name bytes;
  f64 beta1, beta2, eps, weight_decay, grad_scale;  u8 decoupled, amsgrad, maximize, grad dtype
  (0 fp32, 1 bf16, 2 fp16);  u32 n, u32 steps;  f32 p0[n];
  per step: f64 lr; grads[n] as raw fp32/bf16/fp16 bits (as produced, i.e. multiplied by the
  loss scale 1/grad_scale); then f32 param[n], exp_avg[n], exp_avg_sq[n] after the step, and
  f32 max_exp_avg_sq[n] when amsgrad.
"""
import argparse
import struct

import numpy as np
import torch

DTYPES = {"fp32": (0, torch.float32), "bf16": (1, torch.bfloat16), "fp16": (2, torch.float16)}

CASES = [
    # name, decoupled, amsgrad, maximize, weight_decay, betas, eps, grad dtype, grad_scale (1/loss scale)
    ("adamw_fp32", True, False, False, 1e-2, (0.9, 0.999), 1e-8, "fp32", 1.0),
    ("adam_l2_fp32", False, False, False, 1e-2, (0.9, 0.999), 1e-8, "fp32", 1.0),
    ("adam_nodecay_fp32", False, False, False, 0.0, (0.9, 0.999), 1e-8, "fp32", 1.0),
    ("adamw_bf16_scaled", True, False, False, 1e-2, (0.9, 0.999), 1e-8, "bf16", 1.0 / 1024),
    ("adamw_fp16_scaled", True, False, False, 5e-2, (0.9, 0.95), 1e-6, "fp16", 1.0 / 65536),
    ("adam_l2_fp16", False, False, False, 1e-3, (0.8, 0.99), 1e-8, "fp16", 1.0 / 8),
    ("adamw_amsgrad", True, True, False, 1e-2, (0.9, 0.999), 1e-8, "fp32", 1.0),
    ("adam_amsgrad_bf16", False, True, False, 1e-2, (0.9, 0.999), 1e-8, "bf16", 1.0),
    ("adamw_maximize", True, False, True, 1e-2, (0.9, 0.999), 1e-8, "fp32", 1.0),
    ("adamw_beta1_low", True, False, False, 1e-2, (0.3, 0.9), 1e-8, "bf16", 1.0 / 4),  # lerp weight >= 0.5
]
N = 257  # odd: exercises vector bodies and tails on both sides
STEPS = 5


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tests/data/adamw_golden.bin")
    args = ap.parse_args()
    torch.manual_seed(20240605)
    out = bytearray(b"STRATAGD" + struct.pack("<II", 1, len(CASES)))
    for name, decoupled, amsgrad, maximize, wd, (b1, b2), eps, gname, gscale in CASES:
        code, gdtype = DTYPES[gname]
        p0 = torch.randn(N, dtype=torch.float32)
        param = torch.nn.Parameter(p0.clone())
        cls = torch.optim.AdamW if decoupled else torch.optim.Adam
        opt = cls([param], lr=1e-3, betas=(b1, b2), eps=eps, weight_decay=wd, amsgrad=amsgrad,
                  maximize=maximize, foreach=False)
        nb = name.encode()
        out += struct.pack("<I", len(nb)) + nb
        out += struct.pack("<dddddBBBBII", b1, b2, eps, wd, gscale, decoupled, amsgrad, maximize, code, N, STEPS)
        out += p0.numpy().astype("<f4").tobytes()
        for step in range(STEPS):
            lr = 1e-3 * (1.0 + 0.5 * step) if step < 3 else 3e-4  # a scheduler: lr changes per step
            for g in opt.param_groups:
                g["lr"] = lr
            # Gradients as a model produces them: multiplied by the loss scale, in their dtype.
            scaled = (torch.randn(N) * (0.1 / gscale) * (10.0 ** torch.randint(-3, 1, (N,)))).to(gdtype)
            # GradScaler.unscale_: multiply by the fp32 inverse scale (one float rounding).
            param.grad = scaled.to(torch.float32) * torch.tensor(gscale, dtype=torch.float32)
            opt.step()
            st = opt.state[param]
            out += struct.pack("<d", lr)
            raw = scaled.view(torch.int16).numpy().astype("<i2") if code else scaled.numpy().astype("<f4")
            out += raw.tobytes()
            for t in (param.detach(), st["exp_avg"], st["exp_avg_sq"]) + ((st["max_exp_avg_sq"],) if amsgrad else ()):
                out += t.numpy().astype("<f4").tobytes()
    with open(args.out, "wb") as f:
        f.write(out)
    print(f"wrote {args.out}: {len(CASES)} cases, {len(out)} bytes (torch {torch.__version__})")


if __name__ == "__main__":
    main()
