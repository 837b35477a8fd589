"""Hugging Face integration: what Trainer needs beyond swapping the optimizer in.

Under DistributedDataParallel, Trainer asks rank 0 alone for the optimizer's state_dict() when it
saves a checkpoint. strata's state is sharded over the ranks, and each rank writes its own shard,
so the other ranks must be asked too: ``SaveShards`` does that from Trainer's on_save, which
every rank runs. Without it a resume from such a checkpoint is refused, naming the missing shard.

    trainer = Trainer(..., optimizers=(OffloadedAdamW(...), None), callbacks=[strata.hf.SaveShards()])

Trainer's own checkpoint folders each name a strata checkpoint; strata keeps the newest
``keep_checkpoints`` (2 by default) of its own, so with a larger ``save_total_limit`` (or
``load_best_model_at_end`` pointing to an older folder) give ``keep_checkpoints`` at least as
large, or 0 to keep them all: a folder whose strata checkpoint was removed is refused on resume.
"""

from __future__ import annotations

try:
    from transformers import TrainerCallback
except ImportError as e:
    raise ImportError("strata.hf needs transformers: pip install transformers") from e

from .torch import _Offloaded

__all__ = ["SaveShards"]


def _unwrap(opt):
    """The strata optimizer (OffloadedAdamW, OffloadedSGD, OffloadedLion) inside accelerate's and
    Trainer's wrappers, or None."""
    seen = 0
    while opt is not None and not isinstance(opt, _Offloaded) and seen < 8:
        opt = getattr(opt, "optimizer", None)
        seen += 1
    return opt if isinstance(opt, _Offloaded) else None


class SaveShards(TrainerCallback):
    """Makes every rank write its shard of a sharded OffloadedAdamW when Trainer saves (rank 0's
    was written by the state_dict() Trainer asked it for; asking again costs nothing there)."""

    def on_save(self, args, state, control, **kwargs):
        opt = _unwrap(kwargs.get("optimizer"))
        if opt is not None and opt.sharded:
            opt.state_dict()
        return control
