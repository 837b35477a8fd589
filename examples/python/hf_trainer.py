#!/usr/bin/env python3
"""Hugging Face's Trainer with strata.torch.OffloadedAdamW as its optimizer, checked against the
same Trainer with torch.optim.AdamW: GPT-2 built from a config (nothing is downloaded), Trainer's
defaults kept (it clips to max_grad_norm=1.0 between backward and step), gradient accumulation,
a checkpoint every few steps. Prints both runs' losses and how far apart their weights end.

    .venv/bin/python examples/python/hf_trainer.py                       # 2 layers, 12 steps
    .venv/bin/python examples/python/hf_trainer.py --layers 6 --width 384 --steps 100

The only change to a Trainer script: `optimizers=(OffloadedAdamW(model.parameters(), lr=...,
paths=[...]), None)`.
"""

import argparse
import sys
import tempfile
from pathlib import Path

import torch
import transformers

from strata.torch import OffloadedAdamW


class Tokens(torch.utils.data.Dataset):
    """Random token rows (the example is about the optimizer, not the data)."""

    def __init__(self, vocab, rows, length):
        g = torch.Generator().manual_seed(11)
        self.rows = torch.randint(0, vocab, (rows, length), generator=g)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


def gpt2(args):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=args.vocab, n_positions=args.context, n_embd=args.width,
                                  n_layer=args.layers, n_head=args.heads, resid_pdrop=0.0, embd_pdrop=0.0,
                                  attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(cfg)


def run(args, out: Path, make_optimizer):
    model = gpt2(args)
    opt = make_optimizer(model)
    targs = transformers.TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=args.batch, gradient_accumulation_steps=args.accumulate,
        learning_rate=args.lr, max_steps=args.steps, logging_steps=args.log_every, save_steps=args.save_every,
        save_total_limit=2, report_to=[], seed=0, use_cpu=True, dataloader_num_workers=0, disable_tqdm=True,
        log_level="error")
    trainer = transformers.Trainer(model=model, args=targs, train_dataset=Tokens(args.vocab, 256, args.context),
                                   optimizers=(opt, None))
    trainer.train()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    return model, opt, losses


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--context", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--accumulate", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--log-every", type=int, default=4)
    ap.add_argument("--save-every", type=int, default=6)
    ap.add_argument("--dir", type=Path, default=None, help="where both runs write (default: a temporary directory)")
    ap.add_argument("--tolerance", type=float, default=1e-4,
                    help="largest |strata - torch| / max |torch| per tensor accepted (default 1e-4)")
    args = ap.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="strata-hf-"))

    ref_model, _, ref_losses = run(args, root / "torch",
                                   lambda m: torch.optim.AdamW(m.parameters(), lr=args.lr, foreach=False))
    model, opt, losses = run(args, root / "strata", lambda m: OffloadedAdamW(
        m.parameters(), lr=args.lr, paths=[root / "state" / "nvme", root / "state" / "pfs"]))

    print(f"{'log':>4} {'torch AdamW':>12} {'strata':>12}")
    for i, (a, b) in enumerate(zip(ref_losses, losses)):
        print(f"{(i + 1) * args.log_every:>4} {a:>12.6f} {b:>12.6f}")
    worst, where = 0.0, ""
    for (name, a), b in zip(ref_model.named_parameters(), model.parameters()):
        a, b = a.detach(), b.detach()
        if name.endswith("attn.c_attn.bias"):  # the key bias: its gradient is rounding noise (see tests/python/test_hf.py)
            e = a.numel() // 3
            a, b = torch.cat([a[:e], a[2 * e:]]), torch.cat([b[:e], b[2 * e:]])
        d = ((a - b).abs().max() / a.abs().max().clamp_min(1e-30)).item()
        if d > worst:
            worst, where = d, name
    totals = opt.path_totals()
    print(f"weights: largest difference {worst:.2e} of a tensor's largest weight ({where}); strata moved "
          + ", ".join(f"{t['name']}: {t['bytes_read'] / 1e6:.1f} MB read, {t['bytes_written'] / 1e6:.1f} MB written"
                      for t in totals))
    print(f"hand-over of the last step: {opt.handover_used}; checkpoints in {root / 'strata'} and "
          f"{root / 'state' / 'nvme' / 'strata-checkpoints'}")
    if worst > args.tolerance:
        print(f"hf_trainer: the runs differ by {worst:.2e} > {args.tolerance:.0e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
