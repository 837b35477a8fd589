#!/usr/bin/env python3
"""Trains a small character-level GPT with strata.torch.OffloadedAdamW, its optimizer state in two
directories (an "NVMe" and a "PFS" path), and checks the loss curve against torch.optim.AdamW
kept in memory, from the same seed and batches.

The text is the repository's own documentation (README.md, BENCHMARKS.md, docs/*.md), so nothing
is downloaded. Prints each logged step's loss for both runs, tokens/s, and strata's bytes per path.

    .venv/bin/python examples/python/train_gpt.py                 # 3.2M parameters, 30 steps
    .venv/bin/python examples/python/train_gpt.py --steps 200 --layers 6 --width 384
    .venv/bin/python examples/python/train_gpt.py --state-dtype bf16    # moments in bf16: final loss within 2%
    .venv/bin/python examples/python/train_gpt.py --state-dtype int8    # 8-bit moments: final loss within 2%
"""

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

import strata
from strata.torch import OffloadedAdamW

ROOT = Path(__file__).resolve().parents[2]


def corpus() -> str:
    files = [ROOT / "README.md", ROOT / "BENCHMARKS.md"] + sorted((ROOT / "docs").glob("*.md"))
    return "\n\n".join(f.read_text(encoding="utf-8") for f in files if f.exists())


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, context: int, width: int, layers: int, heads: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        mask = torch.triu(torch.full((context, context), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for b in self.blocks:
            x = b(x, self.mask[:t, :t])
        return self.head(self.ln(x))


def param_groups(model, weight_decay):
    """Decay matrices, not biases, norms or embeddings (the usual GPT recipe): two groups."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and "tok" not in name and "pos" not in name else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def run(args, data, vocab, make_opt, label):
    torch.manual_seed(args.seed)
    model = GPT(vocab, args.context, args.width, args.layers, args.heads).to(args.device)
    opt = make_opt(model)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / args.warmup) * 0.5 * (1 + math.cos(math.pi * min(s, args.steps) / args.steps)))
    gen = torch.Generator().manual_seed(args.seed + 1)
    losses = []
    tokens = 0
    t0 = time.perf_counter()
    for step in range(args.steps):
        starts = torch.randint(0, len(data) - args.context - 1, (args.batch,), generator=gen)
        x = torch.stack([data[s:s + args.context] for s in starts]).to(args.device)
        y = torch.stack([data[s + 1:s + 1 + args.context] for s in starts]).to(args.device)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        losses.append(loss.item())
        tokens += x.numel()
        if step % args.log_every == 0 or step == args.steps - 1:
            print(f"{label:>8} step {step:4d}  loss {losses[-1]:.4f}  {tokens / (time.perf_counter() - t0):9.0f} tokens/s",
                  flush=True)
    seconds = time.perf_counter() - t0
    return model, opt, losses, tokens / seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--subgroup-size", type=int, default=1 << 19, help="parameters per strata subgroup")
    ap.add_argument("--dir", default=None, help="where the two paths go (default: a temporary directory)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--log-every", type=int, default=5)
    ap.add_argument("--tolerance", type=float, default=1e-3,
                    help="largest relative difference of a loss against the in-memory run (fp32 states)")
    ap.add_argument("--state-dtype", choices=["fp32", "bf16", "int8"], default="fp32",
                    help="strata's moments: fp32 (torch's AdamW, checked along the curve), bf16 or int8 (fewer "
                         "bytes, checked on the final loss)")
    ap.add_argument("--final-tolerance", type=float, default=0.02,
                    help="with bf16 or int8 states: largest relative difference of the final loss against the in-memory run")
    args = ap.parse_args()
    torch.set_num_threads(len(os.sched_getaffinity(0)))  # (Debian's torch starts with one)

    text = corpus()
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([index[c] for c in text], dtype=torch.long)
    vocab = len(chars)

    tmp = None
    base = args.dir
    if base is None:
        tmp = tempfile.TemporaryDirectory(prefix="strata-gpt-")
        base = tmp.name
    paths = [os.path.join(base, "nvme"), os.path.join(base, "pfs")]
    betas = (0.9, 0.95)

    def strata_opt(model):
        return OffloadedAdamW(param_groups(model, 0.1), lr=args.lr, betas=betas, paths=paths,
                              subgroup_size=args.subgroup_size, state_dtype=args.state_dtype)

    def torch_opt(model):
        return torch.optim.AdamW(param_groups(model, 0.1), lr=args.lr, betas=betas, foreach=False)

    n_params = sum(p.numel() for p in GPT(vocab, args.context, args.width, args.layers, args.heads).parameters())
    print(f"strata {strata.__version__}, torch {torch.__version__}, {args.device}; text of {len(text)} characters, "
          f"vocabulary {vocab}; model of {n_params / 1e6:.2f}M parameters; {args.state_dtype} moments; state under "
          f"{base}")

    model, opt, s_losses, s_rate = run(args, data, vocab, strata_opt, "strata")
    totals = opt.path_totals()
    stats = opt.stats()
    opt.close()
    _, _, t_losses, t_rate = run(args, data, vocab, torch_opt, "torch")

    print(f"\ntokens/s: strata {s_rate:.0f}, torch.optim.AdamW in memory {t_rate:.0f} ({s_rate / t_rate:.2f}x)")
    for t in totals:
        print(f"path {t['name']}: read {t['bytes_read'] / 2**20:.1f} MiB, written {t['bytes_written'] / 2**20:.1f} MiB")
    print(f"strata: {stats['steps']} steps, host memory peak {stats['host_memory_peak'] / 2**20:.1f} MiB")
    worst = max(abs(a - b) / abs(b) for a, b in zip(s_losses, t_losses))
    final = abs(s_losses[-1] - t_losses[-1]) / abs(t_losses[-1])
    print(f"loss: first {s_losses[0]:.4f}, last {s_losses[-1]:.4f} (torch {t_losses[-1]:.4f}, final relative "
          f"difference {final:.2e}); largest relative difference over the curve {worst:.2e} (tolerance "
          f"{args.tolerance:g} with fp32 states, {args.final_tolerance:g} on the final loss with bf16 or int8)")
    if tmp is not None:
        tmp.cleanup()
    if not s_losses[-1] < s_losses[0]:
        print("FAILED: the loss did not fall", file=sys.stderr)
        return 1
    if args.state_dtype == "fp32" and worst > args.tolerance:
        print("FAILED: strata's loss curve left the in-memory AdamW's", file=sys.stderr)
        return 1
    if args.state_dtype != "fp32":
        if final > args.final_tolerance:
            print(f"FAILED: with {args.state_dtype} moments the final loss is {final:.2%} from the in-memory fp32 "
                  f"AdamW's", file=sys.stderr)
            return 1
        print(f"OK: with {args.state_dtype} moments the final loss is within {args.final_tolerance:.0%} of the in-memory "
              f"fp32 AdamW's")
        return 0
    print("OK: strata's loss curve matches the in-memory AdamW's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
