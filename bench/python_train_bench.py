#!/usr/bin/env python3
"""A training iteration of a small transformer (forward, backward, step) with its AdamW state on a
disk, in one run with the sides interleaved round by round:

  strata      strata.torch.OffloadedAdamW as it ships (preset "strata"): when step() returns, an
              optimizer thread reads the next step's first subgroups while forward and backward run
              (prefetch_next_step), and the step's last writes land meanwhile (return_before_writes)
  no-overlap  the same with both off: every byte of the step moves inside step()
  torch       torch.optim.AdamW in memory (the state in RAM: what strata trains like)

Each side builds the same model from the same seed and trains it on the same token batches; the
last loss of each is printed (strata's and torch's agree to the precision docs/pytorch.md gives).
Figures are medians over every measured iteration of every round, with the step alone (the time
inside optimizer.step()) beside the iteration.

    .venv/bin/python bench/python_train_bench.py --path /var/tmp/ptb --layers 8 --d-model 512 \\
        --batch 1 --seq 16 --cap 0.5 [--rounds 3 --iters 4 --warmup 1 --json out.json]
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import time

import torch

from strata.torch import OffloadedAdamW


class Model(torch.nn.Module):
    """A decoder-only transformer: token and position embeddings, causal self-attention layers,
    a tied-free output head."""

    def __init__(self, vocab, d_model, layers, heads, seq):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d_model)
        self.pos = torch.nn.Embedding(seq, d_model)
        layer = torch.nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.0, batch_first=True,
                                                 norm_first=True)
        self.blocks = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False) \
            if "enable_nested_tensor" in torch.nn.TransformerEncoder.__init__.__code__.co_varnames \
            else torch.nn.TransformerEncoder(layer, layers)
        self.norm = torch.nn.LayerNorm(d_model)
        self.head = torch.nn.Linear(d_model, vocab, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), diagonal=1))

    def forward(self, x):
        h = self.tok(x) + self.pos(torch.arange(x.shape[1]))
        h = self.blocks(h, mask=self.mask[:x.shape[1], :x.shape[1]])
        return self.head(self.norm(h))


def size_arg(text):
    t = text.strip()
    units = {"K": 10**3, "M": 10**6, "G": 10**9}
    return int(float(t[:-1]) * units[t[-1].upper()]) if t[-1].upper() in units else int(float(t))


def batches(a):
    g = torch.Generator().manual_seed(1234)
    return [torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g) for _ in range(a.warmup + a.iters)]


def build(a):
    torch.manual_seed(0)
    return Model(a.vocab, a.d_model, a.layers, a.heads, a.seq)


def make_optimizer(a, side, model, workdir):
    if side == "torch":
        return torch.optim.AdamW(model.parameters(), lr=a.lr)
    # The default host memory budget (a quarter of what torch's AdamW holds) and cache.
    extra = {} if side == "strata" else dict(prefetch_next_step=False, return_before_writes=False)
    path = {"directory": workdir, "read_cap": a.cap * 1e9, "write_cap": a.cap * 1e9} if a.cap else workdir
    return OffloadedAdamW(model.parameters(), lr=a.lr, paths=[path], subgroup_size=a.subgroup, **extra)


def train(a, side, data, root):
    """(iteration seconds, step seconds, last loss) of each measured iteration."""
    model = build(a)
    workdir = os.path.join(root, side)
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    opt = make_optimizer(a, side, model, workdir)
    loss_fn = torch.nn.CrossEntropyLoss()
    its, steps, loss = [], [], None
    try:
        for i, batch in enumerate(data):
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            logits = model(batch[:, :-1])
            loss = loss_fn(logits.reshape(-1, a.vocab), batch[:, 1:].reshape(-1))
            loss.backward()
            t1 = time.perf_counter()
            opt.step()
            t2 = time.perf_counter()
            if i >= a.warmup:
                its.append(t2 - t0)
                steps.append(t2 - t1)
    finally:
        if side != "torch":
            opt.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return its, steps, float(loss)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--path", required=True, help="directory for the state (on the disk under test)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--cap", type=float, default=0.0,
                    help="GB/s each way the path is held to (a disk's speed on a faster medium; 0: none)")
    ap.add_argument("--subgroup", default="1M", help="parameters per subgroup (M = 1e6)")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--sides", default="strata,no-overlap,torch")
    ap.add_argument("--json")
    a = ap.parse_args()
    a.subgroup = size_arg(a.subgroup)
    torch.set_num_threads(a.threads)
    os.makedirs(a.path, exist_ok=True)
    sides = [s for s in a.sides.split(",") if s]
    data = batches(a)
    params = sum(p.numel() for p in build(a).parameters())
    its = {s: [] for s in sides}
    steps = {s: [] for s in sides}
    losses = {}
    for r in range(a.rounds):
        for s in sides:
            i, st, losses[s] = train(a, s, data, a.path)
            its[s] += i
            steps[s] += st
        print(f"round {r + 1}: " + ", ".join(f"{s} {statistics.median(its[s][-a.iters:]):.3f} s" for s in sides),
              flush=True)
    med = {s: statistics.median(its[s]) for s in sides}
    med_step = {s: statistics.median(steps[s]) for s in sides}
    print(f"\n{params / 1e6:.1f}M parameters ({a.layers} layers, d_model {a.d_model}, vocab {a.vocab}), batch "
          f"{a.batch} x {a.seq} tokens, state {params * 12 / 2**20:.0f} MiB (default budget and cache, "
          f"subgroups of {a.subgroup}), {a.threads} threads, path {a.path}"
          + (f" capped at {a.cap:g} GB/s" if a.cap else "") + f"; {a.rounds} rounds x {a.iters} iterations; median s")
    print(f"  {'side':<11} {'iteration':>9} {'step':>7} {'fwd+bwd':>8}  last loss")
    for s in sides:
        print(f"  {s:<11} {med[s]:9.3f} {med_step[s]:7.3f} {med[s] - med_step[s]:8.3f}  {losses[s]:.6f}")
    if "strata" in med and "no-overlap" in med:
        print(f"no-overlap / strata = {med['no-overlap'] / med['strata']:.2f}")
    if "strata" in med and "torch" in med:
        print(f"strata / torch in memory = {med['strata'] / med['torch']:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"params": params, "args": vars(a), "iteration_s": its, "step_s": steps, "loss": losses,
                       "median_iteration_s": med, "median_step_s": med_step}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
