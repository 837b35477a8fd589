"""How gradients reach strata, and the proof that an early hand-over is still right at step().

A gradient copied while backward runs (a hook per parameter) saves a copy at step() only where
that copy overlaps work: a D2H copy from a GPU overlaps the rest of backward, a copy on the CPU
runs on backward's own thread and hides nothing. It is used at step() only if the gradient is
provably the one that was copied: the same tensor object at the same address, the same version
counter (which in-place ops through autograd bump) and the same fingerprint of its bits (which
catches writes the counter misses: ``.data``, GradScaler.unscale_, collectives, DLPack). Anything
else is taken again from ``p.grad``.
"""

from __future__ import annotations

import weakref
from typing import Optional

import torch

_CHUNK = 1 << 20
_weights: dict = {}


def _index_weights(device: torch.device) -> torch.Tensor:
    w = _weights.get(device)
    if w is None:
        w = torch.arange(1, _CHUNK + 1, dtype=torch.int64, device=device)
        _weights[device] = w
    return w


def fingerprint(t: torch.Tensor) -> torch.Tensor:
    """Two int64 sums of `t`'s bits, on its device (no host sync): the plain sum and the sum
    weighted by position. Any change to one element changes both; a permutation changes the
    second."""
    flat = t.detach().reshape(-1)
    size = flat.element_size()
    bits = flat.view(torch.int32 if size == 4 else torch.int16 if size == 2 else torch.uint8)
    w = _index_weights(flat.device)
    plain = torch.zeros((), dtype=torch.int64, device=flat.device)
    weighted = torch.zeros((), dtype=torch.int64, device=flat.device)
    for off in range(0, bits.numel(), _CHUNK):
        x = bits[off:off + _CHUNK].to(torch.int64)
        s = x.sum()
        plain += s
        weighted += (x * w[:x.numel()]).sum() + s * off
    return torch.stack([plain, weighted])


class Record:
    """What a hook copied: which tensor, at which address and version, with which bits."""

    __slots__ = ("grad", "ptr", "version", "print")

    def __init__(self, g: torch.Tensor):
        self.grad = weakref.ref(g)
        self.ptr = g.data_ptr()
        self.version = g._version
        self.print = fingerprint(g)

    def same_object(self, g: Optional[torch.Tensor]) -> bool:
        return g is not None and self.grad() is g and g.data_ptr() == self.ptr and g._version == self.version


def unchanged(records: list, grads: list) -> list:
    """For each (record, current grad) pair, whether the grad is provably what was copied: the
    cheap checks first, then every fingerprint compared with one device sync."""
    ok = [r is not None and r.same_object(g) for r, g in zip(records, grads)]
    idx = [i for i, good in enumerate(ok) if good]
    if not idx:
        return ok
    by_device: dict = {}
    for i in idx:
        by_device.setdefault(grads[i].device, []).append(i)
    for items in by_device.values():
        then = torch.stack([records[i].print for i in items])
        now = torch.stack([fingerprint(grads[i]) for i in items])
        same = (then == now).all(dim=1).tolist()
        for i, s in zip(items, same):
            ok[i] = bool(s)
    return ok
