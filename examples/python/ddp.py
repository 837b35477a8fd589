#!/usr/bin/env python3
"""DistributedDataParallel with strata.torch.OffloadedAdamW: each rank keeps one shard of the
optimizer state on its paths (ZeRO-1) and the updated weights are broadcast, so every rank's model
stays equal to DDP + torch.optim.AdamW's. Starts its own ranks on this machine (gloo, a file://
rendezvous), prints each rank's share of the state, the bytes it wrote, and the agreement.

    .venv/bin/python examples/python/ddp.py                      # 2 ranks
    .venv/bin/python examples/python/ddp.py --ranks 3 --width 512 --steps 20

In a script started by torchrun the only change is the optimizer:
`OffloadedAdamW(ddp_model.parameters(), lr=..., paths=["/nvme/strata-{local_rank}"])`.
"""

import argparse
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from strata.torch import OffloadedAdamW


def make_model(width):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width))


def rank_main(rank, args, results):
    dist.init_process_group("gloo", init_method=f"file://{args.dir}/rendezvous", rank=rank, world_size=args.ranks)
    torch.set_num_threads(1)
    ref_model, model = make_model(args.width), make_model(args.width)
    ref_ddp = torch.nn.parallel.DistributedDataParallel(ref_model)
    ref = torch.optim.AdamW(ref_ddp.parameters(), lr=1e-3, foreach=False)
    # doc-snippet: ddp_optimizer
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = OffloadedAdamW(ddp.parameters(), lr=1e-3, paths=[os.path.join(args.dir, "nvme-{rank}")], threads=1)
    # doc-snippet-end
    for step in range(args.steps):
        g = torch.Generator().manual_seed(1000 * step + rank)  # each rank its own batch
        x, y = torch.randn(16, args.width, generator=g), torch.randn(16, args.width, generator=g)
        for net, o in ((ref_ddp, ref), (ddp, opt)):
            o.zero_grad()
            torch.nn.functional.mse_loss(net(x), y).backward()  # DDP all-reduces the gradients
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            o.step()
    worst = max(((a - b).abs().max() / a.abs().max()).item() for a, b in zip(ref_model.parameters(),
                                                                               model.parameters()))
    seg = opt.segments[0]
    results[rank] = dict(share=seg["share"], numel=seg["numel"], written=opt.stats()["bytes_written"], worst=worst)
    dist.barrier()
    opt.close()
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--dir", default=None, help="for the state and the rendezvous (default: a temporary directory)")
    args = ap.parse_args()
    args.dir = args.dir or tempfile.mkdtemp(prefix="strata-ddp-")
    os.makedirs(args.dir, exist_ok=True)
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(rank_main, args=(args, results), nprocs=args.ranks)
        results = dict(results)
    worst = 0.0
    for r in range(args.ranks):
        o = results[r]
        lo, hi = o["share"]
        print(f"rank {r}: parameters [{lo}, {hi}) of {o['numel']} ({(hi - lo) / o['numel']:.1%} of the state), "
              f"{o['written'] / 1e6:.2f} MB written, largest difference from DDP + torch AdamW {o['worst']:.1e}")
        worst = max(worst, o["worst"])
    if worst > 1e-6:
        print(f"ddp: strata's ranks differ from DDP + torch AdamW by {worst:.1e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
