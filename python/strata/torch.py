"""strata.torch.OffloadedAdamW: torch.optim.AdamW whose state lives on strata's tiers (and
OffloadedSGD, OffloadedLion: torch.optim.SGD and Lion the same way).

The fp32 master weights and both moments (and the running maximum with amsgrad) of every
parameter live in files under ``paths`` (NVMe, a parallel file system, an S3 bucket) behind a
bounded host cache, and are streamed through strata's pipeline at each step; the model's own
tensors (fp32, bf16 or fp16, on the CPU or a GPU) receive the updated weights in place. The update
is AdamW's, the same arithmetic as torch.optim.AdamW(foreach=False) up to the order of
floating-point operations (see docs/pytorch.md for the measured agreement).

It trains as torch's AdamW does wherever that one is used:

- Gradients are read from ``p.grad`` at ``step()``, after whatever the loop did to them (HF
  Trainer's and accelerate's clipping, ``clip_grad_norm_``, ``GradScaler.unscale_``,
  DistributedDataParallel's all-reduce, gradient accumulation). A gradient copied earlier, while
  backward ran (``handover``: on a GPU by default, where that copy overlaps backward), is used only
  when it is provably unchanged; ``handover_used`` says what each step did.
- The model is the truth between steps: weights written into it (``load_state_dict``, ``copy_``,
  ``torch.nn.init``, a clamp) are what the next step starts from (fp32 exactly; a 16-bit model's
  master weight becomes the written value, unless it is the value the master already rounds to).
- A parameter without a gradient in a step is skipped as torch skips it (no moment, decay or
  step-count change; each parameter keeps its own step count); frozen parameters are kept in
  ``param_groups`` but hold no state until they get a gradient; parameters of several floating
  dtypes and devices, per-group betas, and ``add_param_group`` after construction are taken.
- ``state_dict()`` works with no argument and ``torch.save``s small: it names a strata checkpoint
  under ``checkpoint_dir`` (default: ``strata-checkpoints`` under the first path), relative to
  it, written only when the state changed since the last one; ``keep_checkpoints`` bounds how many
  stay.
- Under torch.distributed each rank holds and updates one shard of the state (ZeRO-1), and the
  updated weights are broadcast so that every rank's model matches.
"""

from __future__ import annotations

import contextlib
import numbers
import os
import threading
import warnings
import weakref
from pathlib import Path
from typing import Any, Iterable, List, Optional

try:
    import torch
except ImportError as e:  # the native strata.Optimizer works without torch
    raise ImportError("strata.torch needs PyTorch >= 1.13: pip install torch, or on Debian 12 apt-get install "
                      "python3-torch and use a venv made with --system-site-packages") from e

from . import _core, _handover, _retention
from ._core import ConfigError

__all__ = ["OffloadedAdamW", "OffloadedSGD", "OffloadedLion"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_PIPELINE_SLOTS = 10  # room for the deepest preset's pipeline (strata: prefetch 4, write-behind 4, 1 updating)
_MAX_SUBGROUP = 1 << 24
_MIN_SUBGROUP = 1 << 12
_DEFAULT_BUDGET_CAP = 4 << 30


def _has_post_accumulate_hook() -> bool:
    return hasattr(torch.Tensor, "register_post_accumulate_grad_hook")


def _is_dtensor(p: torch.Tensor) -> bool:
    return type(p).__name__ == "DTensor" or hasattr(p, "_local_tensor")


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (FSDP2), or the tensor itself."""
    if _is_dtensor(t):
        return t.to_local() if hasattr(t, "to_local") else t._local_tensor
    return t


def _dist():
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


class _Group:
    """The process group a sharded optimizer works in (world 1 when not distributed).

    An optimizer is often built before the process group exists (HF Trainer and accelerate
    initialise it after the user built the optimizer they pass in): then the ranks come from
    torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK) and the group is taken at the first
    collective, which must find it initialised with the same ranks."""

    def __init__(self, process_group: Any, shard: Optional[bool], dtensors: bool):
        dist = _dist()
        self.group = None
        self.world, self.rank, self.local_rank = 1, 0, 0
        self.pending = False
        # The tensors of the last collectives, kept until the next ones. gloo's worker thread
        # drops its reference to a finished collective's tensors a moment after wait() returns;
        # were that the last one, the tensor would be freed on that thread, which takes the GIL
        # to do it, and torch 1.13 destroys a process group (at exit, from DDP's reducer) with
        # the GIL held while it joins that thread: the process hangs at exit (seen in our tests
        # with a collective of the test's own). Kept here, they are freed on the Python thread.
        self.last_tensors: List[torch.Tensor] = []
        if dist is not None:
            self.group = process_group if process_group is not None else dist.group.WORLD
            self.world = dist.get_world_size(self.group)
            self.rank = dist.get_rank(self.group)
            self.local_rank = int(os.environ.get("LOCAL_RANK", self.rank))
        elif process_group is not None:
            raise ConfigError("strata.torch: process_group given, but torch.distributed is not initialized")
        elif int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ:
            self.world, self.rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
            self.local_rank = int(os.environ.get("LOCAL_RANK", self.rank))
            self.pending = True
        if shard and self.world == 1:
            shard = False
        if shard and dtensors:
            raise ConfigError("strata.torch: shard=True with DTensor parameters: FSDP shards them already, and strata "
                              "offloads each rank's local shard as it is (leave shard unset)")
        self.shard = self.world > 1 and not dtensors if shard is None else bool(shard)

    @property
    def dist(self):
        if self.pending:
            dist = _dist()
            if dist is None:
                raise ConfigError(f"strata.torch: WORLD_SIZE={self.world} and RANK={self.rank} in the environment, but "
                                  f"torch.distributed is not initialized: initialize it before the first step (or "
                                  f"build the optimizer with shard=False outside torch.distributed)")
            if dist.get_world_size() != self.world or dist.get_rank() != self.rank:
                raise ConfigError(f"strata.torch: the optimizer was built for rank {self.rank} of {self.world} (from "
                                  f"the environment), but torch.distributed says rank {dist.get_rank()} of "
                                  f"{dist.get_world_size()}")
            self.group = dist.group.WORLD
            self.pending = False
        return _dist()

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def comm_device(self) -> torch.device:
        if self.dist.get_backend(self.group) == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def all_sum(self, values: List[float]) -> List[float]:
        if self.world == 1:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self.comm_device())
        self.dist.all_reduce(t, group=self.group)
        self.last_tensors = [t]
        return t.cpu().tolist()

    def global_rank(self, r: int) -> int:
        dist = self.dist
        if self.group is None or dist is None:
            return r
        if hasattr(dist, "get_global_rank"):
            return dist.get_global_rank(self.group, r)
        return dist.distributed_c10d._get_global_rank(self.group, r)


class _Where:
    """A checkpoint location: a local directory, or a prefix of an object store (s3://)."""

    def __init__(self, text: Any):
        text = text.text if isinstance(text, _Where) else os.fspath(text)
        self.s3 = text.startswith("s3://")
        self.text = text.rstrip("/") if self.s3 else text

    def __truediv__(self, name: str) -> "_Where":
        return _Where(f"{self.text}/{name}" if self.s3 else os.path.join(self.text, name))

    def __str__(self) -> str:
        return self.text

    def absolute(self) -> str:
        return self.text if self.s3 else os.path.abspath(self.text)

    def exists(self) -> bool:
        """Whether it may hold a checkpoint (an object store's is known when it is read)."""
        return self.s3 or os.path.isdir(self.text)

    def has_checkpoint(self) -> bool:
        return self.s3 or os.path.exists(os.path.join(self.text, "manifest"))

    def path(self) -> Path:
        assert not self.s3
        return Path(self.text)


def _shares(numel: int, subgroup: int, world: int) -> List[tuple]:
    """Each rank's contiguous share [lo, hi) of `numel` parameters, whole subgroups, balanced."""
    groups = -(-numel // subgroup)
    out = []
    for r in range(world):
        a, b = r * groups // world, (r + 1) * groups // world
        out.append((min(numel, a * subgroup), min(numel, b * subgroup)))
    return out


class _Segment:
    """The parameters of one dtype, device and set of fixed hyper-parameters that joined the
    optimizer together, laid out one after the other, and the native optimizer over this rank's
    share of them. Weights and gradients cross to strata as the tensors they are (CPU), or
    through pinned host buffers of the share (GPU, DTensor shards)."""

    def __init__(self, index: int, params: List[torch.nn.Parameter], group_of: List[int], hyper: dict, owner):
        self.index = index
        self.params = params
        self.group_of = group_of
        self.hyper = hyper
        first = _local(params[0])
        self.dtype = first.dtype
        self.device = first.device
        self.offsets = []
        n = 0
        block = owner._rule.block(hyper)
        for p in params:
            n = -(-n // block) * block  # (a quantized state's blocks hold one tensor each)
            self.offsets.append(n)
            n += _local(p).numel()
        self.numel = n
        self.core: Optional[_core.Optimizer] = None
        self.owner = weakref.ref(owner)
        # GPU tensors and DTensor shards always cross through host buffers of the share.
        self.staged = self.device.type == "cuda" or any(_is_dtensor(p) for p in params) or owner._force_staging
        self.direct = [False] * len(params)
        self.subgroup = 0
        self.budget = 0  # host bytes its native optimizer may use
        self.share = (0, n)
        self.prefix = ""
        self.weights_host: Optional[torch.Tensor] = None  # staged: this share's weights in host memory
        self.grads_host: Optional[torch.Tensor] = None    # staged or early: this share's gradients
        self.records: List[Optional[_handover.Record]] = [None] * len(params)
        self.copy_event = None

    # --- layout ---

    def pieces(self):
        """(i, at, a, k) for each parameter's part within this rank's share: parameter i's
        elements [a, a + k) are the share's [at, at + k)."""
        lo, hi = self.share
        for i, (p, off) in enumerate(zip(self.params, self.offsets)):
            k = _local(p).numel()
            a, b = max(lo, off), min(hi, off + k)
            if a < b:
                yield i, a - lo, a - off, b - a

    @property
    def share_numel(self) -> int:
        return self.share[1] - self.share[0]

    # --- host buffers ---

    def _pinned(self) -> bool:
        return self.device.type == "cuda"

    def weights_buffer(self) -> torch.Tensor:
        if self.weights_host is None:
            self.weights_host = torch.empty(self.share_numel, dtype=self.dtype, pin_memory=self._pinned())
        return self.weights_host

    def grads_buffer(self) -> torch.Tensor:
        if self.grads_host is None:
            self.grads_host = torch.empty(self.share_numel, dtype=self.dtype, pin_memory=self._pinned())
        return self.grads_host

    def wait_copies(self) -> None:
        if self.copy_event is not None:
            self.copy_event.synchronize()
            self.copy_event = None

    def refresh(self) -> None:
        """Which parameters cross as they are (direct: contiguous host tensors of a segment that
        is not staged) and which through the host buffer; a parameter whose dtype or device
        changed since it got state is an error, named."""
        owner = self.owner()
        for p in self.params:
            local = _local(p)
            if local.dtype != self.dtype or local.device != self.device:
                where = owner._where(p) if owner is not None else f"a parameter of shape {tuple(p.shape)}"
                raise ConfigError(f"strata.torch: {where} is now {local.dtype} on {local.device}, but its state was "
                                  f"made for {self.dtype} on {self.device}: build the optimizer after converting the "
                                  f"model")
        self.direct = [not self.staged and _local(p).is_contiguous() for p in self.params]
        if not all(self.direct):
            self.weights_buffer()

    def any_staged(self) -> bool:
        return not all(self.direct)

    def prepare(self) -> None:
        """Before the native optimizer reads the weights: refresh(), and the staged parameters'
        current weights into the host buffer."""
        self.refresh()
        if self.any_staged():
            self.stage_weights_in()

    def stage_weights_in(self) -> None:
        """The current weights of the staged parameters into host memory (the truth)."""
        self.wait_copies()
        buf = self.weights_buffer()
        for i, at, a, k in self.pieces():
            if not self.direct[i]:
                buf[at:at + k].copy_(_local(self.params[i]).detach().reshape(-1)[a:a + k], non_blocking=True)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def stage_weights_out(self, updated: List[bool]) -> None:
        """The updated weights of the staged parameters back into the model (those with a
        gradient this step)."""
        buf = self.weights_buffer()
        for i, at, a, k in self.pieces():
            if updated[i] and not self.direct[i]:
                _write(_local(self.params[i]), a, k, buf[at:at + k], non_blocking=True)
        if self.device.type == "cuda":
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(self.device))
            self.copy_event = ev

    def tensors(self, grads: Optional[List[Optional[torch.Tensor]]]) -> list:
        """The native step's tensors: (first, count, gradients or None, weights) per piece of the
        share. `grads` holds, per parameter, its flat gradient over the share's pieces (or None)."""
        out = []
        for i, at, a, k in self.pieces():
            if self.direct[i]:
                w = _local(self.params[i]).detach().view(-1)[a:a + k]
            else:
                w = self.weights_host[at:at + k]
            g = None if grads is None or grads[i] is None else grads[i][a:a + k]
            out.append((at, k, g, w))
        return out

    def weights_for_core(self) -> list:
        """The weights the native optimizer starts from: every tensor's, and zeros for the padding
        between tensors that a quantized state's blocks leave (no tensor covers it later: it stays
        as it is, zero)."""
        out, end = [], 0
        for at, k, _, w in self.tensors(None):
            if at > end:
                out.append((end, at - end, None, torch.zeros(at - end, dtype=self.dtype)))
            out.append((at, k, None, w))
            end = at + k
        return out


def _write(local: torch.Tensor, a: int, k: int, src: torch.Tensor, non_blocking: bool = False) -> None:
    """Elements [a, a + k) of `local` (flat index) := src, whatever its strides."""
    dst = local.detach()
    if dst.is_contiguous():
        dst.view(-1)[a:a + k].copy_(src, non_blocking=non_blocking)
    elif a == 0 and k == dst.numel():
        dst.copy_(src.view(dst.shape), non_blocking=non_blocking)
    else:
        raise ConfigError(f"strata.torch: a parameter of shape {tuple(dst.shape)} is not contiguous and holds part of "
                          f"this rank's share: a sharded state needs contiguous parameters")


class _ShareView:
    """Slices of a parameter's gradient that live in its segment's host buffer (copied by a hook
    or staged): param-relative [a:b] maps to the buffer's share-relative range."""

    def __init__(self, seg: _Segment, i: int):
        self.seg, self.i = seg, i

    def __getitem__(self, sl: slice) -> torch.Tensor:
        for j, at, a, k in self.seg.pieces():
            if j == self.i:
                lo = at + (sl.start - a)
                return self.seg.grads_host[lo:lo + (sl.stop - sl.start)]
        raise IndexError(sl)



def _hyper_number(value: Any, name: str, whose: str, low: float, high: Optional[float] = None) -> float:
    """A hyper-parameter as a float, or a ConfigError naming it (torch's own checks: low <= value,
    and value < high where given; NaN fails both)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.requires_grad:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"strata.torch: {whose}{name} is {value!r}, not a number")
    v = float(value)
    if not low <= v or (high is not None and not v < high):
        bounds = f"in [{low}, {high})" if high is not None else f">= {low}"
        raise ConfigError(f"strata.torch: {whose}{name} is {value!r}; it must be {bounds}")
    return v


def _check_hyper(group: dict, gi: int) -> None:
    """A param group's AdamW hyper-parameters are numbers in torch's ranges (ConfigError otherwise)."""
    whose = f"group {gi}'s "
    _hyper_number(group["lr"], "lr", whose, 0.0)
    _hyper_number(group["eps"], "eps", whose, 0.0)
    _hyper_number(group["weight_decay"], "weight_decay", whose, 0.0)
    betas = group["betas"]
    if isinstance(betas, (str, bytes)) or not isinstance(betas, Iterable) or len(tuple(betas)) != 2:
        raise ConfigError(f"strata.torch: {whose}betas must be two numbers, got {betas!r}")
    for k, b in enumerate(betas):
        _hyper_number(b, f"betas[{k}]", whose, 0.0, 1.0)

class _Rule:
    """What the front needs of an update rule: the group keys fixed per segment at its creation (a
    scheduler changing one is an error), the native rule and options, and its state arrays in
    torch's format. Subclasses: one per optimizer class."""

    fixed: tuple = ()
    torch_name = ""

    def hyper_of(self, group: dict, owner: Any) -> dict:
        return {k: (tuple(float(b) for b in group[k]) if k == "betas" else group[k]) for k in self.fixed}

    def tag(self, hyper: dict) -> str:
        raise NotImplementedError

    def options(self, hyper: dict) -> dict:
        raise NotImplementedError

    def arrays(self, hyper: dict) -> list:
        """[(name, bytes per element, non-negative)] of the state besides the fp32 master."""
        raise NotImplementedError

    def state_bytes(self, hyper: dict) -> int:
        return 4 + sum(b for _, b, _ in self.arrays(hyper))

    def block(self, hyper: dict) -> int:
        """Parameters per quantization block of the state (1: none). Each tensor then starts at a
        multiple of it in the flat layout, so that no block holds two tensors (their padding stays
        zero), as the native rule requires."""
        return 1

    def slot_bytes(self, hyper: dict, n: int) -> int:
        """Bytes of the state of n parameters (a quantized array adds an fp32 scale per block)."""
        blocks = -(-n // self.block(hyper)) if self.block(hyper) > 1 else 0
        quantized = sum(1 for _, b, _ in self.arrays(hyper) if b == 1)
        return n * self.state_bytes(hyper) + 4 * blocks * quantized

    def torch_entry(self, arrays: dict, taken: float, hyper: dict) -> dict:
        """A stepped parameter's state in the torch optimizer's format."""
        return dict(arrays)

    def from_torch(self, s: dict, name: str) -> Optional[torch.Tensor]:
        """An array of a torch-format entry (None: none kept yet, zeros)."""
        return s.get(name)

    def taken(self, s: dict) -> int:
        """Steps a torch-format entry has taken."""
        st = s.get("step", 0)
        return int(st.item() if isinstance(st, torch.Tensor) else st)


class _AdamWRule(_Rule):
    fixed = ("betas", "eps", "amsgrad", "maximize", "state_dtype")
    torch_name = "torch.optim.AdamW"

    def hyper_of(self, group: dict, owner: Any) -> dict:
        h = super().hyper_of(dict(group, state_dtype=owner._state_dtype), owner)
        h["eps"] = float(h["eps"])
        h["amsgrad"] = bool(h["amsgrad"])
        h["maximize"] = bool(h["maximize"])
        return h

    _tags = {"fp32": "adamw", "bf16": "adamw-bf16", "int8": "adamw-8bit"}
    _bytes = {"fp32": 4, "bf16": 2, "int8": 1}

    def tag(self, hyper: dict) -> str:
        return self._tags[hyper.get("state_dtype", "fp32")]

    def block(self, hyper: dict) -> int:
        return 256 if hyper.get("state_dtype", "fp32") == "int8" else 1

    def options(self, hyper: dict) -> dict:
        return dict(beta1=hyper["betas"][0], beta2=hyper["betas"][1], eps=hyper["eps"], amsgrad=hyper["amsgrad"],
                    maximize=hyper["maximize"])

    def arrays(self, hyper: dict) -> list:
        b = self._bytes[hyper.get("state_dtype", "fp32")]
        return [("exp_avg", b, False), ("exp_avg_sq", b, True)] + \
            ([("max_exp_avg_sq", b, True)] if hyper["amsgrad"] else [])

    def torch_entry(self, arrays: dict, taken: float, hyper: dict) -> dict:
        return dict({"step": torch.tensor(taken)}, **arrays)


class _SGDRule(_Rule):
    fixed = ("momentum", "dampening", "nesterov", "maximize")
    torch_name = "torch.optim.SGD"

    def hyper_of(self, group: dict, owner: Any) -> dict:
        h = super().hyper_of(group, owner)
        return dict(momentum=float(h["momentum"]), dampening=float(h["dampening"]), nesterov=bool(h["nesterov"]),
                    maximize=bool(h["maximize"]))

    def tag(self, hyper: dict) -> str:
        return "sgd"

    def options(self, hyper: dict) -> dict:
        return dict(hyper)

    def arrays(self, hyper: dict) -> list:
        return [("momentum_buffer", 4, False)] if hyper["momentum"] != 0 else []

    def torch_entry(self, arrays: dict, taken: float, hyper: dict) -> dict:
        return {"momentum_buffer": arrays.get("momentum_buffer")}

    def taken(self, s: dict) -> int:
        # torch's SGD counts no steps: a parameter with a momentum buffer has taken at least one,
        # which is all the rule asks (its first step sets the buffer to the gradient).
        return 1 if s.get("momentum_buffer") is not None else 0


class _LionRule(_Rule):
    fixed = ("betas", "maximize")
    torch_name = "lion_pytorch.Lion"

    def hyper_of(self, group: dict, owner: Any) -> dict:
        h = super().hyper_of(group, owner)
        h["maximize"] = bool(h["maximize"])
        return h

    def tag(self, hyper: dict) -> str:
        return "lion"

    def options(self, hyper: dict) -> dict:
        return dict(beta1=hyper["betas"][0], beta2=hyper["betas"][1], maximize=hyper["maximize"])

    def arrays(self, hyper: dict) -> list:
        return [("exp_avg", 4, False)]

    def taken(self, s: dict) -> int:
        st = s.get("step")
        if st is None:  # lion-pytorch keeps no step count
            return 1 if s.get("exp_avg") is not None else 0
        return int(st.item() if isinstance(st, torch.Tensor) else st)


class _Offloaded(torch.optim.Optimizer):
    """The offloaded optimizer of any rule: OffloadedAdamW, OffloadedSGD and OffloadedLion are it
    with their rule and torch's arguments."""

    _rule: _Rule = _Rule()
    _state_dtype = "fp32"

    def _setup(
        self,
        params: Iterable[Any],
        defaults: dict,
        *,
        paths: Iterable[Any],
        host_memory_budget: Optional[int],
        cache: Optional[int],
        subgroup_size: Optional[int],
        threads: Optional[int],
        preset: str,
        max_grad_norm: Optional[float],
        loss_scaling: Any,
        integrity: bool,
        handover: str,
        checkpoint_dir: Optional[os.PathLike],
        keep_checkpoints: int,
        object_prefix: str,
        process_group: Any,
        shard: Optional[bool],
        _force_staging: bool,
        **options: Any,
    ) -> None:
        if handover not in ("auto", "backward", "step"):
            raise ConfigError(f"strata.torch: handover={handover!r} (expected 'auto', 'step' or 'backward')")
        if isinstance(paths, (str, os.PathLike)) or paths is None:
            raise ConfigError("strata.torch: paths must be a list of directories (one path: [dir])")
        if int(keep_checkpoints) < 0:
            raise ConfigError(f"strata.torch: keep_checkpoints={keep_checkpoints} (0 keeps all)")
        self._handover = handover
        self._force_staging = bool(_force_staging)
        self._keep = int(keep_checkpoints)
        self._prefix = object_prefix
        self._segments: List[_Segment] = []
        self._lock = threading.Lock()
        self._hooks: list = []
        self._accumulating = 0
        self._closed = ""  # why it takes no more calls ("closed optimizer", or a failed load)
        self.last_step_stats: Optional[dict] = None
        self.handover_used: Optional[str] = None
        self._steps_taken = 0       # step() calls that completed (skipped ones included)
        self._saved: Optional[tuple] = None  # (steps_taken, membership) of the last state_dict
        self._store_saves: list = []  # (name, locations) of this run's saves into an object store
        self._saved_dict: Optional[dict] = None
        self._budget_total = host_memory_budget
        self._cache_total = cache
        self._subgroup = subgroup_size
        self._check_group(defaults, 0)
        self._building = True
        super().__init__(params, defaults)
        self._building = False
        all_params = [p for g in self.param_groups for p in g["params"]]
        self._dtensors = any(_is_dtensor(p) for p in all_params)
        self._group = _Group(process_group, shard, self._dtensors)
        self._finished: set = set()  # segments a failed step() finished (its retry skips them)

        self._paths = [self._rank_path(p) for p in paths]
        if not self._paths:
            raise ConfigError("strata.torch: no paths given")
        self._checkpoint_dir = self._resolve_checkpoint_dir(checkpoint_dir)
        self._options = dict(options)
        # step() gives the gradients as the tensors they are: the native optimizer keeps none.
        self._options.setdefault("gradients", "caller")
        self._options.update(preset=preset, paths=self._paths, integrity=bool(integrity), scope_paths=True)
        if threads is not None:
            self._options["threads"] = int(threads)
        if max_grad_norm is not None:
            self._options["max_grad_norm"] = float(max_grad_norm)
        if loss_scaling:
            self._options["loss_scaling"] = True
            if isinstance(loss_scaling, dict):
                self._options.update(loss_scaling)
        if self._group.distributed:
            # Ranks of one node share the node-wide I/O limiter by default (MLP-Offload's concurrency
            # control): each directory path is node-limited, one request per direction at a time.
            self._options.setdefault("node_limiter_permits", 1)
            self._options.setdefault("node_limiter_name", "strata-torch")
            self._options["paths"] = [self._node_limited(p) for p in self._paths]
        self._max_grad_norm = self._options.get("max_grad_norm")
        self._scaling = bool(self._options.get("loss_scaling"))
        self._scale_state = (float(self._options.get("init_scale", 65536.0)), 0)

        for i, p in enumerate(all_params):
            self._check_param(p, i)
            if self._group.shard and not _local(p).is_contiguous():
                raise ConfigError(f"strata.torch: {self._where(p)} is not contiguous; a sharded state needs contiguous "
                                  f"parameters (shard=False keeps every rank's state whole)")
        members = [p for p in all_params if p.requires_grad]
        if not members and not all_params:
            raise ConfigError("strata.torch: no parameters")
        self._join(members)
        if self._hooks_wanted():
            self._register_hooks(all_params)

    def _check_group(self, group: dict, gi: int) -> None:
        """A param group's hyper-parameters are numbers in torch's ranges (ConfigError otherwise)."""
        whose = f"group {gi}'s "
        _hyper_number(group["lr"], "lr", whose, 0.0)
        _hyper_number(group["weight_decay"], "weight_decay", whose, 0.0)


    # --- construction -------------------------------------------------------------------------

    def _rank_path(self, p: Any) -> Any:
        g = self._group
        fmt = dict(rank=g.rank, local_rank=g.local_rank)
        if isinstance(p, dict):
            p = dict(p)
            for key in ("directory", "url", "name"):
                if isinstance(p.get(key), (str, os.PathLike)):
                    p[key] = os.fspath(p[key]).format(**fmt)
            return p
        if isinstance(p, (str, os.PathLike)):
            return os.fspath(p).format(**fmt)
        return p

    @staticmethod
    def _node_limited(p: Any) -> Any:
        if p is None:
            return p
        d = dict(p) if isinstance(p, dict) else ({"url": p} if str(p).startswith("s3://") else {"directory": p})
        d.setdefault("node_limited", True)
        return d

    def _first_directory(self) -> Optional[str]:
        p = self._paths[0]
        if isinstance(p, dict):
            return p.get("url") or p.get("directory")
        return p

    def _resolve_checkpoint_dir(self, checkpoint_dir: Optional[os.PathLike]) -> Optional[_Where]:
        if checkpoint_dir is not None:
            return _Where(os.fspath(checkpoint_dir).format(rank=self._group.rank, local_rank=self._group.local_rank))
        first = self._first_directory()
        return None if first is None else _Where(first) / "strata-checkpoints"

    def add_param_group(self, param_group: dict) -> None:
        """As torch's; the group's parameters get their state when they first have a gradient."""
        params = param_group["params"]
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        # The list goes back into the group, as torch does: a generator (`m.parameters()`) handed to
        # torch's add_param_group after list() drained it would leave the group empty, and those
        # parameters would never be trained.
        param_group["params"] = params
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        gi = len(self.param_groups)
        for i, p in enumerate(params):
            if id(p) in seen:
                raise ConfigError(f"strata.torch: parameter {i} of group {gi} (shape {tuple(p.shape)}) appears twice")
            seen.add(id(p))
        super().add_param_group(param_group)
        try:
            self._check_group(self.param_groups[-1], gi)
        except ConfigError:
            self.param_groups.pop()
            raise
        if getattr(self, "_building", True):
            return
        for i, p in enumerate(params):
            self._check_param(p, i)
        if self._hooks_wanted():
            self._register_hooks(params)

    def _where(self, p: torch.Tensor) -> str:
        for gi, g in enumerate(self.param_groups):
            for k, q in enumerate(g["params"]):
                if q is p:
                    return f"parameter {k} of group {gi} (shape {tuple(p.shape)})"
        return f"a parameter of shape {tuple(p.shape)}"

    def _check_param(self, p: torch.Tensor, i: int) -> None:
        if not isinstance(p, torch.Tensor):
            raise ConfigError(f"strata.torch: parameter {i} is a {type(p).__name__}, not a tensor")
        if not p.is_leaf:
            raise ConfigError(f"strata.torch: {self._where(p)} is not a leaf tensor")
        local = _local(p)
        if local.dtype not in _DTYPES:
            kind = "complex" if local.is_complex() else str(local.dtype)
            raise ConfigError(f"strata.torch: {self._where(p)} is {kind}; strata keeps fp32 master weights for float32, "
                              f"bfloat16 and float16 parameters (use torch.optim.AdamW for this one)")
        if local.device.type not in ("cpu", "cuda"):
            raise ConfigError(f"strata.torch: {self._where(p)} lives on {local.device} (cpu or cuda only)")

    def _group_index(self, p: torch.Tensor) -> int:
        for gi, g in enumerate(self.param_groups):
            if any(q is p for q in g["params"]):
                return gi
        raise ConfigError(f"strata.torch: {self._where(p)} is in no param group")

    def _hyper_of(self, gi: int) -> dict:
        return self._rule.hyper_of(self.param_groups[gi], self)

    def _member_ids(self) -> set:
        return {id(p) for s in self._segments for p in s.params}

    def _join(self, params: List[torch.Tensor], states: Optional[dict] = None) -> None:
        """Gives `params` state: one new segment per (dtype, device, fixed hyper-parameters)."""
        if not params:
            return
        buckets: dict = {}
        for p in params:
            gi = self._group_index(p)
            hyper = self._hyper_of(gi)
            local = _local(p)
            key = (local.dtype, str(local.device), tuple(sorted(hyper.items())))
            buckets.setdefault(key, ([], [], hyper))
            buckets[key][0].append(p)
            buckets[key][1].append(gi)
        new = []
        for ps, gis, hyper in buckets.values():
            seg = _Segment(self._next_segment_index() + len(new), ps, gis, hyper, self)
            self._configure(seg)
            new.append(seg)
        self._budget_batch(new)
        for seg in new:
            self._create_core(seg, states)
            self._segments.append(seg)

    def _next_segment_index(self) -> int:
        return max((s.index for s in self._segments), default=-1) + 1

    def _budget_batch(self, new: List[_Segment]) -> None:
        """Gives segments about to get state their host budgets: the total (the user's
        host_memory_budget, or by default a quarter of what torch's AdamW would hold in memory for
        every parameter with state, at most 4 GiB) less what the running segments hold, split by
        their shares; by default each gets at least what its pipeline needs. Never more than
        the user's total: what does not fit is a ConfigError."""
        segs = self._segments + new
        if self._budget_total is None:
            one_array = sum(_local(p).numel() * _local(p).element_size() for s in segs for p in s.params)
            total = min(_DEFAULT_BUDGET_CAP, one_array // 2)
        else:
            total = int(self._budget_total)
        left = max(0, total - sum(s.budget for s in self._segments))
        sizes = sum(max(1, s.share_numel) for s in new) or 1
        for seg in new:
            share = left * max(1, seg.share_numel) // sizes
            seg.budget = share if self._budget_total is not None else max(self._pipeline_bytes(seg), share)
            if self._budget_total is not None and seg.share_numel > 0 and seg.budget < self._pipeline_bytes(seg) and \
                    self._segments:
                raise ConfigError(f"strata.torch: host_memory_budget {total} is held by the parameters that have state "
                                  f"({total - left} bytes); {len(seg.params)} parameters joining now need at least "
                                  f"{self._pipeline_bytes(seg)} more: give a larger budget")

    @staticmethod
    def _pipeline_bytes(seg: _Segment) -> int:
        n = max(1, seg.share_numel)
        slot = -(-seg.owner()._rule.slot_bytes(seg.hyper, min(seg.subgroup, n)) // 4096) * 4096
        return _PIPELINE_SLOTS * slot + (1 << 16)

    def _configure(self, seg: _Segment, subgroup: Optional[int] = None) -> None:
        """Chooses the segment's subgroup size and this rank's share (the same on every rank: it
        depends on the parameters and the world size only, or on the user's subgroup_size)."""
        g = self._group
        if subgroup is None:
            subgroup = self._subgroup
        if subgroup is None:
            # A 256th of the rank's share: the pipeline's slots (9 with the strata preset) then take
            # under half a byte a parameter, inside the default budget with room for a cache.
            per_rank = -(-seg.numel // (g.world if g.shard else 1))
            subgroup = 1 << max(0, (max(1, per_rank // 256)).bit_length() - 1)
            subgroup = max(_MIN_SUBGROUP, min(_MAX_SUBGROUP, subgroup))
        seg.subgroup = int(subgroup)
        seg.share = _shares(seg.numel, seg.subgroup, g.world)[g.rank] if g.shard else (0, seg.numel)
        seg.prefix = (f"{self._prefix}.r{g.rank}.{seg.index}" if g.world > 1 else f"{self._prefix}.{seg.index}")

    def _segment_options(self, seg: _Segment) -> dict:
        o = dict(self._options)
        h = seg.hyper
        o.update(self._rule.options(h), rule=self._rule.tag(h), lr=float(self.defaults["lr"]),
                 weight_decay=float(self.defaults["weight_decay"]), subgroup_size=seg.subgroup, object_prefix=seg.prefix)
        # The strata preset gives its cache what the pipeline leaves of the segment's budget.
        o["host_memory_budget"] = int(seg.budget)
        if self._cache_total is not None:  # whole subgroups of the user's cache, which the preset keeps
            n = max(1, seg.share_numel)
            sizes = sum(max(1, x.share_numel) for x in self._segments) + (0 if seg in self._segments else n)
            slot = -(-self._rule.slot_bytes(h, min(seg.subgroup, n)) // 4096) * 4096
            o["cache_subgroups"] = int(self._cache_total) * n // sizes // slot
        return o

    def _create_core(self, seg: _Segment, states: Optional[dict]) -> None:
        if seg.share_numel == 0:
            return
        seg.prepare()
        weights = seg.weights_for_core()
        opts = self._segment_options(seg)
        if states is None:
            seg.core = _core.Optimizer.create(weights, **opts)
        else:
            arrays, step, runs = self._segment_state(seg, states)
            seg.core = _core.Optimizer.create(weights, step=step, step_runs=runs, state=arrays, **opts)
        if self._scaling and states is None:  # (a checkpoint brings its own)
            seg.core.restore_loss_scale(*self._scale_state)

    # --- gradients ----------------------------------------------------------------------------

    def _hooks_wanted(self) -> bool:
        if self._handover == "step" or self._group.distributed:
            return False
        if self._handover == "backward":
            return True
        # auto: only where the early copy overlaps backward (a GPU's D2H copy)
        return any(_local(p).device.type == "cuda" for g in self.param_groups for p in g["params"])

    def _register_hooks(self, params: List[torch.Tensor]) -> None:
        me = weakref.ref(self)

        def on_grad(p: torch.Tensor) -> None:
            o = me()
            if o is not None and not o._accumulating:
                o._early_copy(p)

        for p in params:
            if not p.requires_grad:
                continue  # (a frozen parameter takes no hook; unfrozen later, it is read at step())
            if _has_post_accumulate_hook():
                self._hooks.append(p.register_post_accumulate_grad_hook(lambda q: on_grad(q)))
            else:
                # torch < 2.1: a hook on the parameter's AccumulateGrad node runs after it accumulated.
                with torch.enable_grad():
                    node = p.expand_as(p).grad_fn.next_functions[0][0]
                ref = weakref.ref(p)
                self._hooks.append(node.register_hook(lambda *_a, ref=ref: on_grad(ref())))
                self._hooks.append(node)  # the node must live as long as the hook

    def _locate(self, p: torch.Tensor):
        for seg in self._segments:
            for i, q in enumerate(seg.params):
                if q is p:
                    return seg, i
        return None, None

    def _early_copy(self, p: torch.Tensor) -> None:
        """A hook: copies p's gradient into its segment's host buffer now, with the proof record."""
        if p is None or p.grad is None:
            return
        seg, i = self._locate(p)
        if seg is None or seg.core is None:
            return
        g = _local(p.grad)
        if g.is_sparse or g.dtype != seg.dtype:
            return  # step() reports it
        with self._lock:
            seg.wait_copies()
            buf = seg.grads_buffer()
            flat = g.detach().reshape(-1)
            for j, at, a, k in seg.pieces():
                if j == i:
                    buf[at:at + k].copy_(flat[a:a + k], non_blocking=True)
            seg.records[i] = _handover.Record(g)

    @contextlib.contextmanager
    def no_handover(self):
        """Backward passes inside do not copy gradients early (they are read at step() anyway:
        gradient accumulation needs nothing special)."""
        self._accumulating += 1
        try:
            yield
        finally:
            self._accumulating -= 1

    def zero_grad(self, *args, **kwargs) -> None:
        """As torch's (its default for set_to_none too); gradients copied early are forgotten."""
        super().zero_grad(*args, **kwargs)
        for seg in self._segments:
            seg.records = [None] * len(seg.params)

    def _gradients(self, seg: _Segment, counts: dict) -> tuple:
        """Per parameter of the segment, its flat gradient (over the parameter, or over the share's
        host buffer when copied) or None, and which parameters have one."""
        grads: List[Optional[torch.Tensor]] = [None] * len(seg.params)
        have = [False] * len(seg.params)
        current = []
        for i, p in enumerate(seg.params):
            g = p.grad
            if g is None:
                current.append(None)
                continue
            g = _local(g)
            if g.is_sparse:
                raise ConfigError(f"strata.torch: {self._where(p)} has a sparse gradient (AdamW takes dense ones)")
            if g.dtype != seg.dtype or g.shape != _local(p).shape:
                raise ConfigError(f"strata.torch: {self._where(p)}'s gradient is {g.dtype} {tuple(g.shape)}; expected "
                                  f"{seg.dtype} {tuple(_local(p).shape)}")
            current.append(g)
            have[i] = True
        verified = _handover.unchanged(seg.records, current) if any(r is not None for r in seg.records) else \
            [False] * len(seg.params)
        if seg.staged or any(verified):
            buf = seg.grads_buffer()
            for j, at, a, k in seg.pieces():
                if not have[j] or verified[j]:
                    continue
                buf[at:at + k].copy_(current[j].detach().reshape(-1)[a:a + k], non_blocking=True)
            if seg.device.type == "cuda":
                torch.cuda.current_stream(seg.device).synchronize()
        for i in range(len(seg.params)):
            if not have[i]:
                counts["none"] += 1
                continue
            counts["backward" if verified[i] else "step"] += 1
            if seg.staged or verified[i]:
                grads[i] = _ShareView(seg, i)
            else:
                grads[i] = current[i].detach().reshape(-1)
                if not grads[i].is_contiguous():
                    grads[i] = grads[i].contiguous()
        seg.records = [None] * len(seg.params)
        return grads, have

    # --- the step -----------------------------------------------------------------------------

    def _check_fixed(self) -> None:
        """A group's fixed hyper-parameters (AdamW's betas, eps, amsgrad and maximize; SGD's momentum,
        dampening, nesterov and maximize; Lion's betas) must stay what its parameters' state has."""
        for seg in self._segments:
            for p, gi in zip(seg.params, seg.group_of):
                now = self._hyper_of(gi)
                if now != seg.hyper:
                    key = next(k for k in self._rule.fixed if now[k] != seg.hyper[k])
                    raise ConfigError(
                        f"strata.torch: group {gi}'s {key} is now {self.param_groups[gi].get(key)!r}, but its parameters' "
                        f"state was made with {seg.hyper[key]!r} (a scheduler cycling momentum, e.g. OneCycleLR or "
                        f"CyclicLR, needs cycle_momentum=False)")

    def _rates(self, seg: _Segment) -> list:
        """(first, count, lr, weight_decay) over the segment's share, one per run of its groups; the
        padding after a tensor (quantized states) goes with the range before it, so the ranges
        cover the share."""
        out: list = []
        for i, at, _, k in seg.pieces():
            g = self.param_groups[seg.group_of[i]]
            lr = _hyper_number(g["lr"], "lr", f"group {seg.group_of[i]}'s ", 0.0)
            wd = _hyper_number(g["weight_decay"], "weight_decay", f"group {seg.group_of[i]}'s ", 0.0)
            if out and out[-1][2] == lr and out[-1][3] == wd:
                out[-1] = (out[-1][0], at + k - out[-1][0], lr, wd)
            else:
                if out:
                    out[-1] = (out[-1][0], at - out[-1][0], out[-1][2], out[-1][3])
                out.append((at, k, lr, wd))
        if out:
            out[-1] = (out[-1][0], seg.share_numel - out[-1][0], out[-1][2], out[-1][3])
        return out

    def _join_new(self) -> None:
        """Parameters that have a gradient and no state yet (unfrozen, or added later) get it."""
        members = self._member_ids()
        candidates, seen = [], set()
        for g in self.param_groups:
            for p in g["params"]:
                if id(p) not in members and id(p) not in seen:
                    candidates.append(p)
                    seen.add(id(p))
        has = [1.0 if p.grad is not None else 0.0 for p in candidates]
        if self._group.shard and candidates:  # every rank joins the same ones (a gradient on any rank)
            has = self._group.all_sum(has)
        new = [p for p, h in zip(candidates, has) if h > 0]
        self._join(new)
        if new:
            self._saved = None

    @torch.no_grad()
    def step(self, closure=None):
        """One AdamW step over every parameter that has a gradient; returns the closure's loss.

        A step that raised (an I/O error, a full disk) may have finished some segments: call
        step() again with the same gradients and it finishes the others, bit for bit as a step
        that never failed."""
        if self._closed:
            raise ConfigError(f"strata.torch: step() on a {self._closed}")
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._check_fixed()
        self._join_new()
        counts = {"backward": 0, "step": 0, "none": 0}
        work = []
        for seg in self._segments:
            if seg.core is None:
                continue
            seg.prepare()
            grads, have = self._gradients(seg, counts)
            work.append((seg, seg.tensors(grads), have))
        decision = None
        # Clipping and loss scaling decide over the whole model: every segment's gradients, and
        # every rank's where ranks hold different ones (shards of the state or of the model).
        across = self._group.distributed and (self._group.shard or self._dtensors)
        if (self._max_grad_norm or self._scaling) and (len(self._segments) > 1 or across):
            local = sum(seg.core.gradient_stats(t)[0] for seg, t, _ in work)
            decision = _core.decide_step(self._group.all_sum([local])[0] if across else local, self._max_grad_norm)
        stats = []
        for seg, tensors, have in work:
            if seg.index in self._finished:  # (finished by a step() that then failed: this is its retry)
                continue
            try:
                stats.append(seg.core.step_tensors(self._rates(seg), tensors, True, decision))
            finally:
                # Subgroups whose update committed have their new weights in the host buffer:
                # they reach the model even when a later subgroup failed.
                if seg.any_staged():
                    seg.stage_weights_out(have)
            self._finished.add(seg.index)
        self._finished = set()
        if self._group.shard:
            self._exchange_weights()
        self._sync_loss_scale()
        self._steps_taken += 1
        used = [k for k in ("backward", "step") if counts[k]]
        self.handover_used = "+".join(used) if used else "none"
        self.last_step_stats = self._merge_stats(stats, counts)
        return loss

    def _sync_loss_scale(self) -> None:
        """The loss scale every rank uses (a rank may hold no share of any segment)."""
        if not self._scaling:
            return
        cores = self._cores()
        mine = [cores[0].loss_scale, float(cores[0].loss_growth_tracker), 1.0] if cores else [0.0, 0.0, 0.0]
        if self._group.shard:
            mine = self._group.all_sum(mine)
        if mine[2] > 0:
            self._scale_state = (mine[0] / mine[2], int(round(mine[1] / mine[2])))

    def _exchange_weights(self) -> None:
        """Sharded: every rank's updated share to every other rank, in place in each model."""
        g = self._group
        handles, views = [], []
        for seg in self._segments:
            shares = _shares(seg.numel, seg.subgroup, g.world)
            for r, (lo, hi) in enumerate(shares):
                for p, off in zip(seg.params, seg.offsets):
                    local = _local(p)
                    a, b = max(lo, off), min(hi, off + local.numel())
                    if a >= b:
                        continue
                    view = local.detach().view(-1)[a - off:b - off]
                    views.append(view)
                    handles.append(g.dist.broadcast(view, src=g.global_rank(r), group=g.group, async_op=True))
        for h in handles:
            h.wait()
        g.last_tensors = views

    @staticmethod
    def _merge_stats(stats: list, counts: dict) -> dict:
        out = {"segments": stats, "handover": dict(counts)}
        for key in ("subgroups", "bytes_read", "bytes_written", "cache_hits", "cache_misses", "prefetched",
                    "prefetched_bytes", "writes_left", "writes_left_bytes"):
            out[key] = sum(s[key] for s in stats)
        for key in ("read_wait_s", "compute_s", "kernel_s", "write_wait_s", "total_s"):
            out[key] = sum(s[key] for s in stats)
        out["skipped"] = any(s["skipped"] for s in stats)
        out["step"] = max((s["step"] for s in stats), default=0)
        norms = [s["grad_norm"] for s in stats if s["grad_norm"] is not None]
        out["grad_norm"] = norms[0] if norms else None
        out["clip"] = min((s["clip"] for s in stats), default=1.0)
        out["loss_scale"] = stats[0]["loss_scale"] if stats else 1.0
        paths: dict = {}
        for s in stats:
            for pth in s["paths"]:
                agg = paths.setdefault(pth["name"], dict(pth, bytes_read=0, bytes_written=0))
                agg["bytes_read"] += pth["bytes_read"]
                agg["bytes_written"] += pth["bytes_written"]
        out["paths"] = list(paths.values())
        return out

    # --- what strata adds ---------------------------------------------------------------------

    def _cores(self) -> list:
        return [s.core for s in self._segments if s.core is not None]

    @property
    def loss_scale(self) -> float:
        """What to multiply the loss by before backward (1 unless loss_scaling is on); the same on
        every rank."""
        return self._scale_state[0] if self._scaling else 1.0

    @property
    def native(self) -> _core.Optimizer:
        """The native optimizer of the first segment (parameters of one dtype and device)."""
        cores = self._cores()
        if not cores:
            raise ConfigError("strata.torch: no parameter has state on this rank yet")
        return cores[0]

    @property
    def segments(self) -> list:
        """Per segment (parameters that share dtype, device and fixed hyper-parameters): its
        dtype, device, parameter count, this rank's share, subgroup size and object prefix."""
        return [dict(dtype=str(s.dtype), device=str(s.device), params=len(s.params), numel=s.numel,
                     share=s.share, subgroup_size=s.subgroup, prefix=s.prefix) for s in self._segments]

    @property
    def sharded(self) -> bool:
        """Whether each rank holds one shard of the state (torch.distributed, ZeRO-1)."""
        return self._group.shard

    @property
    def gradients(self) -> str:
        cores = self._cores()
        return cores[0].gradients if cores else self._options["gradients"]

    def path_totals(self) -> list:
        """Each path's name, declared bandwidths and the bytes moved so far (all segments)."""
        paths: dict = {}
        for c in self._cores():
            for pth in c.path_totals():
                agg = paths.setdefault(pth["name"], dict(pth, bytes_read=0, bytes_written=0))
                agg["bytes_read"] += pth["bytes_read"]
                agg["bytes_written"] += pth["bytes_written"]
        return list(paths.values())

    def stats(self) -> dict:
        """Totals of every segment's native optimizer, and each one's (``segments``)."""
        per = [c.stats() for c in self._cores()]
        out = {"segments": per}
        for key in ("cache_hits", "cache_misses", "bytes_read", "bytes_written", "gradient_bytes_written",
                    "host_memory_used", "host_memory_peak", "host_memory_budget"):
            out[key] = sum(s[key] for s in per)
        out["steps"] = self._steps_taken
        return out

    def close(self) -> None:
        """Removes the hooks and releases the paths; the state files stay (state_dict() first)."""
        for h in self._hooks:
            if hasattr(h, "remove"):
                h.remove()
        self._hooks = []
        for seg in self._segments:
            seg.wait_copies()
            if seg.core is not None:
                seg.core.close()
                seg.core = None
        self._closed = "closed optimizer"

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- checkpoints --------------------------------------------------------------------------

    def _param_index(self) -> dict:
        out, index = {}, 0
        for g in self.param_groups:
            for p in g["params"]:
                out[id(p)] = index
                index += 1
        return out

    def _params_by_index(self) -> list:
        return [p for g in self.param_groups for p in g["params"]]

    def _groups_for_dict(self) -> list:
        out = []
        index = 0
        for g in self.param_groups:
            d = {k: v for k, v in g.items() if k != "params"}
            d["params"] = list(range(index, index + len(g["params"])))
            index += len(g["params"])
            out.append(d)
        return out

    def _weights_print(self) -> list:
        """A fingerprint of every member's weights (what a save with nothing changed must match)."""
        prints = [_handover.fingerprint(_local(p)) for s in self._segments for p in s.params]
        return torch.stack(prints).cpu().tolist() if prints else []

    def _segment_prefix(self, object_prefix: str, index: int) -> str:
        g = self._group
        return f"{object_prefix}.r{g.rank}.{index}" if g.world > 1 else f"{object_prefix}.{index}"

    def state_dict(self) -> dict:
        """A small dict that torch.save keeps: the param groups and the name of a strata
        checkpoint under ``checkpoint_dir`` (relative to it), written now unless nothing changed
        since the last one. A fresh optimizer (no state yet) writes nothing. Under torch.distributed
        each rank writes its own part (call it on every rank); torch_state_dict() gives torch's
        format."""
        if self._closed:
            raise ConfigError(f"strata.torch: state_dict() on a {self._closed}")
        index = self._param_index()
        # No collective here: HF Trainer asks rank 0 alone (every rank's steps_taken is the same).
        fresh = self._steps_taken == 0 and all(c.step_count == 0 for c in self._cores())
        segments = [dict(index=s.index, params=[index[id(p)] for p in s.params], numel=s.numel, dtype=str(s.dtype),
                         subgroup_size=s.subgroup, rule=self._rule.tag(s.hyper),
                         hyper={k: list(v) if isinstance(v, tuple) else v for k, v in s.hyper.items()},
                         step_count=None if s.core is None else s.core.step_count)
                    for s in self._segments]
        info = {"format": 2, "steps_taken": self._steps_taken, "checkpoint": None, "object_prefix": self._prefix,
                "checkpoint_dir": None if self._checkpoint_dir is None else self._checkpoint_dir.absolute(),
                "world_size": self._group.world, "sharded": self._group.shard, "segments": segments,
                "param_numels": [_local(p).numel() for p in self._params_by_index()]}
        if not fresh:
            key = (self._steps_taken, tuple(tuple(x["params"]) for x in segments), tuple(map(tuple, self._weights_print())))
            if self._saved == key and self._saved_dict is not None:
                info["checkpoint"] = self._saved_dict["strata"]["checkpoint"]
            else:
                # One process names a save by what it holds: the same step with other weights is
                # another directory. Ranks must agree on the name without talking: the step.
                token = hash(key) if self._group.world == 1 else self._steps_taken
                info["checkpoint"] = self._save_checkpoint(f"step-{self._steps_taken:09d}-{token & 0xffffffff:08x}")
                self._saved = key
        out = {"state": {}, "param_groups": self._groups_for_dict(), "strata": info}
        self._saved_dict = out
        return out

    def _save_checkpoint(self, name: str) -> str:
        """Writes each segment's part of this rank into checkpoint_dir/<name>/<prefix>, a part no
        other optimizer or rank writes. A save that fails leaves the checkpoint directory as it
        was: the parts it wrote, the directories it created and its journal line go again."""
        if self._checkpoint_dir is None:
            raise ConfigError("strata.torch: state_dict() writes a strata checkpoint, and the first path is not a "
                              "directory: pass checkpoint_dir=")
        root = self._checkpoint_dir
        journal = self._journal_name()
        made: List[Path] = []  # directories this save created, parents first
        recorded = False
        new_name = name not in [x[0] for x in self._store_saves]
        targets = []
        try:
            if not root.s3:
                made += _retention.make_dirs(root.path())
                recorded = _retention.record(root.path(), journal, name)
            for seg in self._segments:
                if seg.core is None:
                    continue
                seg.prepare()
                target = root / name / seg.prefix
                if not target.s3:
                    made += _retention.make_dirs(target.path().parent)
                seg.core.save(str(target), seg.weights_for_core())
                targets.append(target)
        except BaseException:
            self._undo_save(root, journal, name, targets, made, recorded, new_name)
            raise
        if self._keep and not root.s3:
            _retention.prune(root.path(), journal, self._keep, self._own_part)
        elif self._keep:
            # An object store has no journal of ours: the saves of this run are what it prunes.
            self._store_saves = [x for x in self._store_saves if x[0] != name] + [(name, targets)]
            for _, old in self._store_saves[:-self._keep]:
                for t in old:
                    _core.remove_store_checkpoint(str(t))
            self._store_saves = self._store_saves[-self._keep:]
        return name

    def _undo_save(self, root: "_Where", journal: str, name: str, targets: list, made: List[Path], recorded: bool,
                   new_name: bool) -> None:
        """Takes back what a failed save of checkpoint `name` wrote (best effort: the save's own
        error is the one raised). Parts are removed only from a checkpoint this save began; a
        part it replaced in an older one of that name is that checkpoint's now."""
        try:
            if root.s3:
                if new_name:
                    for t in targets:
                        _core.remove_store_checkpoint(str(t))
                return
            if recorded:
                for t in targets:
                    _retention.remove_part(t.path())
                _retention.unrecord(root.path(), journal, name)
            _retention.remove_made_dirs(made)
        except Exception as e:  # noqa: BLE001
            warnings.warn(f"strata.torch: a failed save of {root / name} could not take back all it wrote: {e}")

    def _journal_name(self) -> str:
        g = self._group
        return f".strata-checkpoints.{self._prefix}" + (f".r{g.rank}" if g.world > 1 else "")

    def _own_part(self, name: str) -> bool:
        """Whether `name`, in a step directory, is one of this optimizer's (and this rank's) parts."""
        head = f"{self._prefix}.r{self._group.rank}." if self._group.world > 1 else f"{self._prefix}."
        return name.startswith(head) and name[len(head):].isdigit()

    def torch_state_dict(self) -> dict:
        """The state in the torch optimizer's state_dict format (torch.optim.AdamW's, SGD's, or
        lion_pytorch.Lion's; every array in memory, in fp32: bf16 moments widened exactly), to
        continue the run with torch's optimizer or any tool that reads it. Under torch.distributed
        with a sharded state, call it on every rank."""
        index = self._param_index()
        state = {}
        g = self._group
        for seg in self._segments:
            names = [name for name, _, _ in self._rule.arrays(seg.hyper)]
            arrays = {name: torch.zeros(seg.numel, dtype=torch.float32) for name in names}
            steps = torch.zeros(seg.numel, dtype=torch.float64)
            lo, hi = seg.share
            if seg.core is not None:
                for name, t in arrays.items():
                    seg.core.read_state(name, t[lo:hi])
                runs = seg.core.param_steps + [(hi - lo, None)]
                for (a, st), (b, _) in zip(runs, runs[1:]):
                    steps[lo + a:lo + b] = st
            if g.shard:
                dev = g.comm_device()
                for r, (a, b) in enumerate(_shares(seg.numel, seg.subgroup, g.world)):
                    for t in [steps] + list(arrays.values()):
                        if a < b:
                            part = t[a:b].to(dev)
                            g.dist.broadcast(part, src=g.global_rank(r), group=g.group)
                            t[a:b].copy_(part.cpu())
                            g.last_tensors = [part]
            for p, off in zip(seg.params, seg.offsets):
                k = _local(p).numel()
                if k == 0:
                    continue
                shape = _local(p).shape
                taken = float(steps[off].item())
                if taken > 0:  # (torch has no state for a parameter before its first update)
                    mine = {name: t[off:off + k].view(shape).clone() for name, t in arrays.items()}
                    state[index[id(p)]] = self._rule.torch_entry(mine, taken, seg.hyper)
        return {"state": state, "param_groups": self._groups_for_dict()}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restores a dict from state_dict() (the strata checkpoint it names, exactly; found under
        this optimizer's ``checkpoint_dir`` first, so a moved run folder works) or from
        torch.optim.AdamW.state_dict() / torch_state_dict() (the moments and steps; the master
        weights are then the model's current weights). Everything is checked (and a checkpoint
        read back in full against its checksums, on every rank) before the running state is
        given up, so a bad or damaged one is a typed error that changes nothing."""
        if self._closed == "closed optimizer":
            raise ConfigError("strata.torch: load_state_dict() on a closed optimizer")
        groups = state_dict.get("param_groups")
        if groups is None or len(groups) != len(self.param_groups):
            raise ConfigError(f"strata.torch: the state dict has {0 if groups is None else len(groups)} param "
                              f"groups, this optimizer {len(self.param_groups)}")
        for gi, (g, mine) in enumerate(zip(groups, self.param_groups)):
            if len(g["params"]) != len(mine["params"]):
                raise ConfigError(f"strata.torch: group {gi} of the state dict has {len(g['params'])} parameters, "
                                  f"this optimizer's {len(mine['params'])}")
        info = state_dict.get("strata")
        params = self._params_by_index()
        # The loaded groups' hyper-parameters are the ones the new state has (put back on failure).
        before = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
        for g, loaded in zip(self.param_groups, groups):
            for k, v in loaded.items():
                if k != "params":
                    g[k] = tuple(v) if k == "betas" else v
        try:
            plan = self._plan_strata(info, params) if info is not None else self._plan_torch(
                state_dict.get("state", {}), params)
        except BaseException:
            for g, old in zip(self.param_groups, before):
                g.update(old)
            raise
        try:
            plan()
        except BaseException as e:
            # The running state was given up: refuse to train on whatever is left.
            self._closed = f"optimizer whose load_state_dict() failed part-way ({type(e).__name__}: {e}); load again"
            raise
        self._closed = ""
        self._saved = None
        self._finished = set()

    def _release_all(self) -> None:
        for seg in self._segments:
            seg.wait_copies()
            if seg.core is not None:
                seg.core.close()
                seg.core = None
        self._segments = []

    def _agree(self, ok: bool, what: str) -> None:
        """Sharded ranks go on only if every rank can (else each raises, none hangs)."""
        if not self._group.shard:
            return
        if self._group.all_sum([0.0 if ok else 1.0])[0] > 0 and ok:
            raise ConfigError(f"strata.torch: {what} failed on another rank (see its error); nothing was changed here")

    def _plan_strata(self, info: dict, params: list):
        """Checks a strata state dict and its checkpoint; returns what loads it."""
        if info.get("format") != 2:
            raise ConfigError(f"strata.torch: this state dict's strata checkpoint has format {info.get('format')!r}, "
                              f"which this version does not read (format 2)")
        g = self._group
        ok = False
        try:
            numels = [_local(p).numel() for p in params]
            if info.get("param_numels") != numels:
                raise ConfigError("strata.torch: the state dict's parameters do not match this optimizer's (their "
                                  "sizes differ)")
            if info.get("world_size", 1) != g.world and (info.get("sharded") or g.world > 1 or info.get("world_size", 1) > 1):
                raise ConfigError(f"strata.torch: the checkpoint was saved by {info.get('world_size')} ranks, this run "
                                  f"has {g.world}: resume on {info.get('world_size')} ranks (re-sharding is not "
                                  f"supported; torch_state_dict() moves a run to another world size)")
            if bool(info.get("sharded")) != g.shard:
                raise ConfigError(f"strata.torch: the checkpoint was saved with shard={bool(info.get('sharded'))}, this "
                                  f"optimizer has shard={g.shard}")
            name = info.get("checkpoint")
            root = None
            if name is not None:
                candidates = [_Where(c) for c in (self._checkpoint_dir, info.get("checkpoint_dir")) if c is not None]
                root = next((c / name for c in candidates if (c / name).exists()), None)
                if root is None:
                    where = " or ".join(str(c / name) for c in candidates) or name
                    raise ConfigError(f"strata.torch: checkpoint {name} is not in {where} (removed by "
                                      f"keep_checkpoints, or moved: pass the directory holding it as checkpoint_dir=)")
            object_prefix = info.get("object_prefix", self._prefix)
            plan = []
            for s in info.get("segments", []):
                ps = [params[i] for i in s["params"]]
                hyper = {k: tuple(v) if isinstance(v, list) else v for k, v in s["hyper"].items()}
                if "state_dtype" in self._rule.fixed:  # (checkpoints from before bf16 moments)
                    hyper.setdefault("state_dtype", "fp32")
                saved_rule = s.get("rule", "adamw")  # (checkpoints from before other rules: AdamW's)
                mine = self._rule.tag(dict(hyper, state_dtype=self._state_dtype))
                if saved_rule != mine:
                    raise ConfigError(f"strata.torch: segment {s['index']} of the checkpoint holds the state of update "
                                      f"rule '{saved_rule}', this optimizer's is '{mine}' (no conversion on load: "
                                      f"torch_state_dict() moves a run between them)")
                seg = _Segment(s["index"], ps, [self._group_index(p) for p in ps], hyper, self)
                if seg.numel != s["numel"]:  # (laid out as the run that saved it laid them out)
                    raise ConfigError(f"strata.torch: segment {s['index']} of the checkpoint does not match the "
                                      f"parameters")
                self._configure(seg, s["subgroup_size"])
                d = None
                if root is not None and seg.share_numel > 0:
                    d = root / self._segment_prefix(object_prefix, s["index"])
                    if not d.has_checkpoint():
                        raise ConfigError(f"strata.torch: {d} is missing: its rank did not save its part (under DDP, HF "
                                          f"Trainer asks rank 0 alone: add strata.hf.SaveShards to its callbacks)")
                    # Read back in full against its checksums before the running state is given up.
                    found = _core.verify_checkpoint(str(d))
                    if s.get("step_count") is not None and found != s["step_count"]:
                        raise ConfigError(f"strata.torch: checkpoint {d} now holds step {found}, the state dict names "
                                          f"step {s['step_count']}")
                plan.append((seg, d))
            ok = True
        finally:
            self._agree(ok, "loading the checkpoint")

        def load() -> None:
            self._release_all()
            self._budget_batch([seg for seg, _ in plan])
            for seg, d in plan:
                if seg.share_numel > 0:
                    if d is None:
                        self._create_core(seg, None)
                    else:
                        opts = self._segment_options(seg)
                        opts.pop("subgroup_size", None)
                        seg.core = _core.Optimizer.load(str(d), **opts)
                        # The model follows the restored master weights, as in the run that saved them.
                        master = torch.empty(seg.share_numel, dtype=torch.float32)
                        seg.core.read_master(master)
                        for i, at, a, k in seg.pieces():
                            _write(_local(seg.params[i]), a, k, master[at:at + k].to(seg.dtype))
                self._segments.append(seg)
            if g.shard:
                self._exchange_weights()
            self._sync_loss_scale()
            self._steps_taken = int(info.get("steps_taken", 0))
            # Parameters that need state and were not in the checkpoint start fresh.
            members = self._member_ids()
            self._join([p for p in params if p.requires_grad and id(p) not in members])

        return load

    def _plan_torch(self, state: dict, params: list):
        """Checks the torch optimizer's per-parameter state; returns what loads it."""
        by_param = {}
        for i, p in enumerate(params):
            s = state.get(i)
            if s is None:
                continue
            k = _local(p).numel()
            taken = self._rule.taken(s)
            if taken == 0:
                continue  # (SGD's entry without a momentum buffer: no state yet)
            hyper = self._hyper_of(self._group_index(p))
            for name, _, non_negative in self._rule.arrays(hyper):
                t = self._rule.from_torch(s, name)
                if t is None or t.numel() != k:
                    raise ConfigError(f"strata.torch: {self._where(p)}: state '{name}' is missing or has "
                                      f"{None if t is None else t.numel()} elements, expected {k}")
                if not bool(torch.isfinite(t).all()) or (non_negative and bool((t < 0).any())):
                    raise ConfigError(f"strata.torch: {self._where(p)}: state '{name}' holds values "
                                      f"{self._rule.torch_name} cannot have (non-finite, or a negative second moment)")
            by_param[id(p)] = dict(s, step=taken)
        members = [p for p in params if p.requires_grad or id(p) in by_param]

        def load() -> None:
            self._release_all()
            self._join(members, by_param)
            self._steps_taken = max((s["step"] for s in by_param.values()), default=0)
            self._sync_loss_scale()

        return load

    def _segment_state(self, seg: _Segment, states: dict):
        """This rank's share of torch-format state: {name: fp32 array}, the largest step and step runs."""
        n = seg.share_numel
        arrays = {name: torch.zeros(n, dtype=torch.float32) for name, _, _ in self._rule.arrays(seg.hyper)}
        runs: list = []
        for i, at, a, k in seg.pieces():
            s = states.get(id(seg.params[i]))
            step = 0
            if s is not None:
                for name, t in arrays.items():
                    t[at:at + k].copy_(self._rule.from_torch(s, name).detach().reshape(-1)[a:a + k])
                step = s["step"]
            if runs and runs[-1][1] == step:
                continue
            runs.append((at, step))
        top = max((r[1] for r in runs), default=0)
        return arrays, top, runs


class OffloadedAdamW(_Offloaded):
    """AdamW with its state offloaded to ``paths`` (see the module's doc).

    Args:
        params: parameters or param groups, as for torch.optim.AdamW: any floating dtype of
            float32, bfloat16 and float16, on the CPU or CUDA, frozen or not, DTensor shards.
        lr, betas, eps, weight_decay, amsgrad, maximize: as torch.optim.AdamW, per group.
            Schedulers may change each group's lr and weight_decay; betas, eps, amsgrad and
            maximize are fixed for a parameter once it has state.
        state_dtype: "fp32" (torch's AdamW exactly), "bf16": both moments (and their running
            maximum) stored in bfloat16, the update computed in fp32 and each moment rounded to
            nearest even when stored (8 bytes a parameter instead of 12), or "int8": the moments
            block-quantized to 8 bits (blocks of 256 parameters, each with an fp32 scale, the
            dynamic maps of 8-bit Adam; about 6 bytes a parameter). Fewer bytes moved, not
            torch's bits; torch_state_dict() gives the moments as fp32 (widened or dequantized).
            With "int8" each parameter's state starts at a multiple of 256 in strata's layout and
            subgroup_size must be a multiple of 256.
        paths: directories for the state (str, os.PathLike, ``s3://bucket/prefix``, None for host
            memory, or a dict with ``directory`` or ``url``, ``name``, ``read_cap``, ``write_cap``,
            ``read_bandwidth``, ``write_bandwidth``). ``{rank}`` and ``{local_rank}`` in a path
            are replaced under torch.distributed. The ``strata`` preset spreads each subgroup's
            state over them in proportion to their bandwidth.
        host_memory_budget: host memory strata may use for its pipeline and cache, in bytes
            (default: from the model: a quarter of what torch's AdamW would hold in memory, at
            most 4 GiB, at least what the pipeline needs).
        cache: bytes of that budget that keep subgroups between steps (default: what the
            pipeline leaves).
        subgroup_size: parameters per subgroup, the unit of transfer and caching (default: from
            the model and the budget).
        threads: CPU threads of the update (default: strata's, the usable cores).
        preset: "strata", "mlp_offload" (two paths: NVMe, PFS) or "zero_infinity" (one path).
        max_grad_norm: clip the gradients to this global L2 norm inside the update.
        loss_scaling: dynamic loss scaling (True, or a dict of init_scale, growth_factor,
            backoff_factor, growth_interval): multiply the loss by ``loss_scale`` before backward.
        integrity: verify every byte read back against a checksum (IntegrityError on damage).
        handover: "auto" (gradients copied during backward where that overlaps work, on a GPU
            outside torch.distributed, and used only when provably unchanged), "step" (read at
            step()) or "backward" (copied during backward on any device, checked as in auto).
        checkpoint_dir: where state_dict() writes strata checkpoints (default
            ``<first path>/strata-checkpoints``; one directory per step).
        keep_checkpoints: how many of its checkpoints state_dict() keeps (older ones it made are
            removed; 0 keeps all).
        object_prefix: prefix of the state files, so that several optimizers share directories.
        process_group, shard: under torch.distributed, the group whose ranks shard the state
            (default: the world), and whether to shard it (default: yes, unless the parameters
            are DTensors, which FSDP shards already).
        options: further strata options (prefetch_depth, write_behind_depth, prefetch_next_step,
            return_before_writes, gradients="tier" or "automatic", stripe_paths,
            node_limiter_permits, node_limiter_name).
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        state_dtype: str = "fp32",
        paths: Iterable[Any],
        host_memory_budget: Optional[int] = None,
        cache: Optional[int] = None,
        subgroup_size: Optional[int] = None,
        threads: Optional[int] = None,
        preset: str = "strata",
        max_grad_norm: Optional[float] = None,
        loss_scaling: Any = None,
        integrity: bool = True,
        handover: str = "auto",
        checkpoint_dir: Optional[os.PathLike] = None,
        keep_checkpoints: int = 2,
        object_prefix: str = "strata",
        process_group: Any = None,
        shard: Optional[bool] = None,
        _force_staging: bool = False,
        **options: Any,
    ) -> None:
        if state_dtype not in ("fp32", "bf16", "int8"):
            raise ConfigError(f"strata.torch: state_dtype={state_dtype!r} (expected 'fp32', 'bf16' or 'int8')")
        if isinstance(betas, (str, bytes)) or not isinstance(betas, Iterable) or len(tuple(betas)) != 2:
            raise ConfigError(f"strata.torch: betas must be two numbers, got {betas!r}")
        betas = tuple(_hyper_number(b, f"betas[{k}]", "", 0.0, 1.0) for k, b in enumerate(betas))
        self._state_dtype = state_dtype
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize)
        self._setup(params, defaults, paths=paths, host_memory_budget=host_memory_budget, cache=cache,
                    subgroup_size=subgroup_size, threads=threads, preset=preset, max_grad_norm=max_grad_norm,
                    loss_scaling=loss_scaling, integrity=integrity, handover=handover, checkpoint_dir=checkpoint_dir,
                    keep_checkpoints=keep_checkpoints, object_prefix=object_prefix, process_group=process_group,
                    shard=shard, _force_staging=_force_staging, **options)

    _rule = _AdamWRule()

    def _check_group(self, group: dict, gi: int) -> None:
        _check_hyper(group, gi)


class OffloadedSGD(_Offloaded):
    """torch.optim.SGD (momentum, dampening, Nesterov, weight decay, maximize) with its state (the
    fp32 master weights and, with momentum, the momentum buffer) offloaded to ``paths``. Every
    other argument, guarantee and method is OffloadedAdamW's (see there and the module's doc).
    The update is torch's arithmetic: the Python tests hold it to torch.optim.SGD's result.
    momentum, dampening, nesterov and maximize are fixed for a parameter once it has state (a
    scheduler cycling momentum, e.g. OneCycleLR, needs cycle_momentum=False)."""

    _rule = _SGDRule()

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        *,
        maximize: bool = False,
        paths: Iterable[Any],
        **kwargs: Any,
    ) -> None:
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov,
                        maximize=maximize)
        self._setup(params, defaults, paths=paths, **_front_defaults(kwargs))

    def _check_group(self, group: dict, gi: int) -> None:
        super()._check_group(group, gi)
        whose = f"group {gi}'s "
        momentum = _hyper_number(group["momentum"], "momentum", whose, 0.0)
        dampening = _hyper_number(group["dampening"], "dampening", whose, float("-inf"))
        if group["nesterov"] and (momentum <= 0 or dampening != 0):
            raise ConfigError(f"strata.torch: {whose}nesterov momentum requires a momentum and zero dampening")


class OffloadedLion(_Offloaded):
    """Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"; lion_pytorch.Lion's
    order of operations) with its state (fp32 master weights and one fp32 moment, 8 bytes a
    parameter) offloaded to ``paths``. Every other argument, guarantee and method is
    OffloadedAdamW's (see there and the module's doc). betas and maximize are fixed for a
    parameter once it has state. torch_state_dict() gives lion_pytorch.Lion's format
    ({"exp_avg": ...} per parameter)."""

    _rule = _LionRule()

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-4,
        betas: tuple = (0.9, 0.99),
        weight_decay: float = 0.0,
        *,
        maximize: bool = False,
        paths: Iterable[Any],
        **kwargs: Any,
    ) -> None:
        if isinstance(betas, (str, bytes)) or not isinstance(betas, Iterable) or len(tuple(betas)) != 2:
            raise ConfigError(f"strata.torch: betas must be two numbers, got {betas!r}")
        betas = tuple(_hyper_number(b, f"betas[{k}]", "", 0.0, 1.0) for k, b in enumerate(betas))
        defaults = dict(lr=lr, betas=betas, weight_decay=weight_decay, maximize=maximize)
        self._setup(params, defaults, paths=paths, **_front_defaults(kwargs))

    def _check_group(self, group: dict, gi: int) -> None:
        super()._check_group(group, gi)
        betas = group["betas"]
        if isinstance(betas, (str, bytes)) or not isinstance(betas, Iterable) or len(tuple(betas)) != 2:
            raise ConfigError(f"strata.torch: group {gi}'s betas must be two numbers, got {betas!r}")
        for k, b in enumerate(betas):
            _hyper_number(b, f"betas[{k}]", f"group {gi}'s ", 0.0, 1.0 + 1e-12)


_FRONT_DEFAULTS = dict(host_memory_budget=None, cache=None, subgroup_size=None, threads=None, preset="strata",
                       max_grad_norm=None, loss_scaling=None, integrity=True, handover="auto", checkpoint_dir=None,
                       keep_checkpoints=2, object_prefix="strata", process_group=None, shard=None,
                       _force_staging=False)


def _front_defaults(kwargs: dict) -> dict:
    """The front's keyword arguments (see OffloadedAdamW) with their defaults filled in."""
    return dict(_FRONT_DEFAULTS, **kwargs)
