"""strata.torch.OffloadedAdamW: torch.optim.AdamW whose state lives on strata's tiers.

The fp32 master weights and both moments (and the running maximum with amsgrad) of every
parameter live in files under ``paths`` (NVMe, a parallel file system) behind a bounded host
cache, and are streamed through strata's pipeline at each step; the model's own tensors (fp32,
bf16 or fp16) receive the updated weights in place. The update is AdamW's, bit for bit the same
arithmetic as torch.optim.AdamW(foreach=False) up to the order of floating-point operations
(see the README's PyTorch section for the measured agreement).

Gradients reach strata while backward runs (``handover="backward"``, the default): a hook on
each parameter hands its gradient over as soon as it is accumulated, so the copy overlaps the
rest of backward. ``handover="step"`` takes ``p.grad`` at ``step()`` instead, for code that
changes the gradients between backward and step (torch's clip_grad_norm_, GradScaler.unscale_).

The master weights are strata's: change the model's weights after building the optimizer only
through ``load_state_dict`` (or build the optimizer after loading the model).
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from typing import Any, Iterable, Optional

try:
    import torch
except ImportError as e:  # the native strata.Optimizer works without torch
    raise ImportError("strata.torch needs PyTorch >= 1.13: pip install torch, or on Debian 12 apt-get install "
                      "python3-torch and use a venv made with --system-site-packages") from e

from . import _core
from ._core import ConfigError

__all__ = ["OffloadedAdamW"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Hyper-parameters strata fixes at construction; a group or scheduler changing them is an error.
_FIXED = ("betas", "eps", "amsgrad", "maximize")


def _has_post_accumulate_hook() -> bool:
    return hasattr(torch.Tensor, "register_post_accumulate_grad_hook")


class OffloadedAdamW(torch.optim.Optimizer):
    """AdamW with its state offloaded to ``paths`` (see the module's doc).

    Args:
        params: parameters or param groups, as for torch.optim.AdamW. Every parameter must
            require grad, appear once, and share one dtype (float32, bfloat16 or float16) and device.
        lr, betas, eps, weight_decay, amsgrad, maximize: as torch.optim.AdamW. Each group may set its
            own lr and weight_decay (schedulers included); betas, eps, amsgrad and maximize are
            fixed for the optimizer's life.
        paths: directories for the state (str, os.PathLike, None for host memory, or a dict with
            ``directory``, ``name``, ``read_cap``, ``write_cap``, ``read_bandwidth``,
            ``write_bandwidth``). The ``strata`` preset spreads each subgroup's state over them in
            proportion to their bandwidth.
        cache: bytes of host memory that keep subgroups between steps (0: none).
        subgroup_size: parameters per subgroup, the unit of transfer and caching.
        threads: CPU threads of the update (default: strata's, the usable cores).
        preset: "strata", "mlp_offload" (two paths: NVMe, PFS) or "zero_infinity" (one path).
        max_grad_norm: clip the gradients to this global L2 norm inside the update.
        loss_scaling: dynamic loss scaling (True, or a dict of init_scale, growth_factor,
            backoff_factor, growth_interval): multiply the loss by ``loss_scale`` before backward.
        integrity: verify every byte read back against a checksum (IntegrityError on damage).
        handover: "backward" (hooks) or "step" (see the module's doc).
        checkpoint_dir: where state_dict() writes strata checkpoints (one directory per step).
        object_prefix: prefix of the state files, so that several optimizers share directories.
        options: further strata options (host_memory_budget, prefetch_depth, write_behind_depth,
            gradients="tier" or "automatic" (host memory when an fp32 store of the gradients fits
            host_memory_budget, else the tier), stripe_paths, node_limiter_permits).
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
        paths: Iterable[Any],
        cache: int = 0,
        subgroup_size: int = 1 << 24,
        threads: Optional[int] = None,
        preset: str = "strata",
        max_grad_norm: Optional[float] = None,
        loss_scaling: Any = None,
        integrity: bool = True,
        handover: str = "backward",
        checkpoint_dir: Optional[os.PathLike] = None,
        object_prefix: str = "strata",
        **options: Any,
    ) -> None:
        if handover not in ("backward", "step"):
            raise ConfigError(f"strata.torch: handover={handover!r} (expected 'backward' or 'step')")
        if isinstance(paths, (str, os.PathLike)) or paths is None:
            raise ConfigError("strata.torch: paths must be a list of directories (one path: [dir])")
        self._paths = list(paths)
        if not self._paths:
            raise ConfigError("strata.torch: no paths given")
        self._betas = tuple(float(b) for b in betas)
        if len(self._betas) != 2:
            raise ConfigError(f"strata.torch: betas must be two numbers, got {betas!r}")
        self._handover = handover
        self._checkpoint_dir = checkpoint_dir
        self._prefix = object_prefix
        self._core: Optional[_core.Optimizer] = None
        self._hooks: list = []
        self._handed: list = []
        self._pending_events: list = []
        self._model_event = None
        self._accumulating = 0
        self._lock = threading.Lock()
        self.last_step_stats: Optional[dict] = None
        defaults = dict(lr=lr, betas=self._betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                        maximize=maximize)
        self._building = True
        super().__init__(params, defaults)
        self._building = False

        self._params = [p for g in self.param_groups for p in g["params"]]
        self._check_params()
        self._offsets = []
        n = 0
        for p in self._params:
            self._offsets.append(n)
            n += p.numel()
        self._numel = n
        self._group_ranges = []
        first = 0
        for g in self.param_groups:
            count = sum(p.numel() for p in g["params"])
            self._group_ranges.append((first, count))
            first += count

        self._options = dict(options)
        self._options.update(
            preset=preset, paths=self._paths, lr=float(lr), beta1=self._betas[0], beta2=self._betas[1],
            eps=float(eps), weight_decay=float(weight_decay), amsgrad=bool(amsgrad), maximize=bool(maximize),
            subgroup_size=int(subgroup_size), cache_bytes=int(cache), integrity=bool(integrity))
        if threads is not None:
            self._options["threads"] = int(threads)
        if max_grad_norm is not None:
            self._options["max_grad_norm"] = float(max_grad_norm)
        if loss_scaling:
            self._options["loss_scaling"] = True
            if isinstance(loss_scaling, dict):
                self._options.update(loss_scaling)

        self._setup_buffers()
        master = self._flat_master()
        self._core = _core.Optimizer.create(master, object_prefix=self._prefix, **self._options)
        self._handed = [False] * len(self._params)
        if handover == "backward":
            self._register_hooks()

    # --- construction -----------------------------------------------------------------------

    def add_param_group(self, param_group: dict) -> None:
        if not getattr(self, "_building", False):
            raise ConfigError("strata.torch: add_param_group after construction (strata sizes its state when it "
                              "is built: pass every group to the constructor)")
        params = param_group["params"]
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        gi = len(self.param_groups)
        for i, p in enumerate(params):
            if id(p) in seen:
                raise ConfigError(f"strata.torch: parameter {i} of group {gi} (shape {tuple(p.shape)}) appears twice")
            seen.add(id(p))
        for key in _FIXED:
            if key in param_group and param_group[key] != self.defaults[key] and not (
                    key == "betas" and tuple(param_group[key]) == self.defaults[key]):
                raise ConfigError(f"strata.torch: group {gi} sets {key}={param_group[key]!r}, but strata uses one "
                                  f"{key} for every parameter ({self.defaults[key]!r})")
        super().add_param_group(param_group)

    def _where(self, i: int) -> str:
        gi = 0
        k = i
        for g in self.param_groups:
            if k < len(g["params"]):
                break
            k -= len(g["params"])
            gi += 1
        return f"parameter {k} of group {gi} (shape {tuple(self._params[i].shape)})"

    def _check_params(self) -> None:
        if not self._params:
            raise ConfigError("strata.torch: no parameters")
        dtype = self._params[0].dtype
        device = self._params[0].device
        for i, p in enumerate(self._params):
            if not p.requires_grad:
                raise ConfigError(f"strata.torch: {self._where(i)} does not require grad (frozen); strata updates "
                                  f"every parameter it holds, so leave frozen ones out")
            if not p.is_leaf:
                raise ConfigError(f"strata.torch: {self._where(i)} is not a leaf tensor")
            if p.dtype not in _DTYPES:
                raise ConfigError(f"strata.torch: {self._where(i)} has dtype {p.dtype} (float32, bfloat16 or "
                                  f"float16 only)")
            if p.dtype != dtype or p.device != device:
                raise ConfigError(f"strata.torch: {self._where(i)} is {p.dtype} on {p.device}, parameter 0 is "
                                  f"{dtype} on {device}: one dtype and device per optimizer")
        if device.type not in ("cpu", "cuda"):
            raise ConfigError(f"strata.torch: parameters on {device} (cpu or cuda only)")
        self._dtype = dtype
        self._device = device

    def _setup_buffers(self) -> None:
        """The host tensors strata reads gradients from and writes the model into."""
        self._cuda = self._device.type == "cuda"
        if not self._cuda:
            # The model's parameters become views of one flat tensor, which the step writes in
            # place; a model that is one contiguous parameter is used as it is.
            if len(self._params) == 1 and self._params[0].is_contiguous():
                self._model_flat = self._params[0].data.view(-1)
            else:
                flat = torch.empty(self._numel, dtype=self._dtype)
                for p, o in zip(self._params, self._offsets):
                    view = flat[o:o + p.numel()]
                    view.copy_(p.data.reshape(-1))
                    p.data = view.view_as(p)
                self._model_flat = flat
            self._grad_host = None
        else:
            # CUDA tensors are staged through pinned host memory on torch's streams.
            self._model_flat = torch.empty(self._numel, dtype=self._dtype, pin_memory=True)
            self._grad_host = torch.empty(self._numel, dtype=self._dtype, pin_memory=True)

    def _flat_master(self) -> torch.Tensor:
        master = torch.empty(self._numel, dtype=torch.float32)
        for p, o in zip(self._params, self._offsets):
            master[o:o + p.numel()].copy_(p.detach().reshape(-1))
        return master

    # --- gradients ----------------------------------------------------------------------------

    def _register_hooks(self) -> None:
        me = weakref.ref(self)  # the parameters' hooks must not keep the optimizer alive

        def on_grad(i: int) -> None:
            o = me()
            if o is not None:
                o._on_grad(i)

        for i, p in enumerate(self._params):
            if _has_post_accumulate_hook():
                self._hooks.append(p.register_post_accumulate_grad_hook(lambda _p, i=i: on_grad(i)))
            else:
                # torch < 2.1: a hook on the parameter's AccumulateGrad node runs after it accumulated.
                with torch.enable_grad():
                    node = p.expand_as(p).grad_fn.next_functions[0][0]
                self._hooks.append(node.register_hook(lambda *_a, i=i: on_grad(i)))
                self._hooks.append(node)  # the node must live as long as the hook

    def _on_grad(self, i: int) -> None:
        if self._accumulating:
            return
        p = self._params[i]
        with self._lock:
            if self._handed[i]:
                raise ConfigError(f"strata.torch: {self._where(i)} received a second gradient before step(); "
                                  f"accumulate micro-batches inside `with optimizer.no_handover():` or call "
                                  f"zero_grad() before the next backward")
            self._hand_over(i, p.grad)
            self._handed[i] = True

    def _hand_over(self, i: int, g: Optional[torch.Tensor]) -> None:
        p = self._params[i]
        if g is None:
            raise ConfigError(f"strata.torch: {self._where(i)} has no gradient")
        if g.is_sparse or g.dtype != p.dtype or g.shape != p.shape:
            raise ConfigError(f"strata.torch: {self._where(i)}'s gradient is {g.dtype} {tuple(g.shape)}"
                              f"{' sparse' if g.is_sparse else ''}; expected dense {p.dtype} {tuple(p.shape)}")
        o = self._offsets[i]
        if self._cuda:
            # The copy runs on torch's current stream after the kernels that made the gradient;
            # step() waits for its event before strata reads the staging buffer.
            self._grad_host[o:o + p.numel()].copy_(g.detach().reshape(-1), non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(g.device))
            self._pending_events.append(ev)
            return
        self._core.accept_gradients(o, g.detach().reshape(-1).contiguous())

    @contextlib.contextmanager
    def no_handover(self):
        """Backward passes inside accumulate into ``p.grad`` without handing it to strata; the
        next backward outside hands over the sum (gradient accumulation over micro-batches, as
        DistributedDataParallel.no_sync). With handover="step" there is nothing to hold back."""
        self._accumulating += 1
        try:
            yield
        finally:
            self._accumulating -= 1

    def _drop_handed(self) -> None:
        self._wait_events()
        if self._core is not None and not self._cuda:
            self._core.discard_gradients()
        self._handed = [False] * len(self._params)

    def _wait_events(self) -> None:
        for ev in self._pending_events:
            ev.synchronize()
        self._pending_events = []

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As torch's; gradients already handed over for the next step are dropped too."""
        super().zero_grad(set_to_none=set_to_none)
        self._drop_handed()

    # --- the step -----------------------------------------------------------------------------

    def _rates(self):
        for gi, g in enumerate(self.param_groups):
            for key in _FIXED:
                v = g[key]
                if key == "betas":
                    v = tuple(float(b) for b in v)
                if v != self.defaults[key]:
                    raise ConfigError(
                        f"strata.torch: group {gi}'s {key} is now {g[key]!r}, but strata fixed it at "
                        f"{self.defaults[key]!r} when built (a scheduler cycling momentum, e.g. OneCycleLR or "
                        f"CyclicLR, needs cycle_momentum=False)")
        groups = self.param_groups
        if len(groups) == 1 and float(groups[0]["weight_decay"]) == self._options["weight_decay"]:
            return float(groups[0]["lr"])
        return [(first, count, float(g["lr"]), float(g["weight_decay"]))
                for (first, count), g in zip(self._group_ranges, groups) if count > 0]

    @torch.no_grad()
    def step(self, closure=None):
        """One AdamW step over every parameter; returns the closure's loss (as torch's)."""
        if self._core is None:
            raise ConfigError("strata.torch: step() on a closed optimizer")
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        rates = self._rates()
        if self._handover == "step":
            self._hand_over_all()
        else:
            missing = [i for i, h in enumerate(self._handed) if not h]
            if missing:
                self._drop_handed()
                raise ConfigError(f"strata.torch: {self._where(missing[0])} has no gradient for this step "
                                  f"({len(missing)} of {len(self._params)} parameters have none; every "
                                  f"parameter needs one: nothing was updated and the handed-over gradients "
                                  f"were dropped)")
        self._wait_events()
        if self._model_event is not None:  # the previous step's model copies have left the buffer
            self._model_event.synchronize()
            self._model_event = None
        try:
            grads = self._grad_host if self._cuda else None
            stats = self._core.step(rates, grads, self._model_flat)
        except BaseException:
            # The handed-over gradients stay for a retry (strata completes a failed step bit for
            # bit when called again); with handover="step" the retry hands them over again.
            if self._handover == "step":
                self._drop_handed()
            raise
        self._handed = [False] * len(self._params)
        if self._cuda:
            self._copy_model_to_device()
        self.last_step_stats = stats
        return loss

    def _hand_over_all(self) -> None:
        for i, p in enumerate(self._params):
            if p.grad is None:
                self._drop_handed()
                raise ConfigError(f"strata.torch: {self._where(i)} has no gradient for this step (every parameter "
                                  f"needs one; nothing was updated)")
        try:
            for i, p in enumerate(self._params):
                self._hand_over(i, p.grad)
        except BaseException:
            self._drop_handed()
            raise

    def _copy_model_to_device(self) -> None:
        stream = torch.cuda.current_stream(self._device)
        for p, o in zip(self._params, self._offsets):
            p.data.copy_(self._model_flat[o:o + p.numel()].view_as(p), non_blocking=True)
        self._model_event = torch.cuda.Event()
        self._model_event.record(stream)

    # --- what strata adds ---------------------------------------------------------------------

    @property
    def loss_scale(self) -> float:
        """What to multiply the loss by before backward (1 unless loss_scaling is on)."""
        return self._core.loss_scale

    @property
    def native(self) -> _core.Optimizer:
        """The native optimizer (flat parameters in group order)."""
        return self._core

    def path_totals(self) -> list:
        """Each path's name, declared bandwidths and the bytes moved so far."""
        return self._core.path_totals()

    def stats(self) -> dict:
        return self._core.stats()

    def close(self) -> None:
        """Removes the hooks and releases the paths; the state files stay (state_dict() first)."""
        for h in self._hooks:
            if hasattr(h, "remove"):
                h.remove()
        self._hooks = []
        if self._core is not None:
            self._core.close()
            self._core = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- checkpoints --------------------------------------------------------------------------

    def _groups_for_dict(self) -> list:
        out = []
        index = 0
        for g in self.param_groups:
            d = {k: v for k, v in g.items() if k != "params"}
            d["params"] = list(range(index, index + len(g["params"])))
            index += len(g["params"])
            out.append(d)
        return out

    def state_dict(self) -> dict:
        """Writes a crash-consistent strata checkpoint under ``checkpoint_dir`` (one directory
        per step) and returns a small dict that names it, with the param groups. The state
        itself stays in the checkpoint directory; torch_state_dict() gives torch's format."""
        if self._checkpoint_dir is None:
            raise ConfigError("strata.torch: state_dict() writes a strata checkpoint: pass checkpoint_dir= to the "
                              "optimizer (or use torch_state_dict() for torch.optim.AdamW's format)")
        step = self._core.step_count
        target = os.path.join(os.fspath(self._checkpoint_dir), f"step-{step:09d}")
        self._core.save(target)
        return {
            "state": {},
            "param_groups": self._groups_for_dict(),
            "strata": {"format": 1, "checkpoint": os.path.abspath(target), "step": step, "numel": self._numel,
                       "param_numels": [p.numel() for p in self._params], "dtype": str(self._dtype)},
        }

    def torch_state_dict(self) -> dict:
        """The state in torch.optim.AdamW's state_dict format (every moment in memory: for
        models that fit), to continue the run with torch's AdamW or any tool that reads it."""
        m = torch.empty(self._numel, dtype=torch.float32)
        v = torch.empty(self._numel, dtype=torch.float32)
        self._core.read_moments(m, v)
        vmax = None
        if self.defaults["amsgrad"]:
            vmax = torch.empty(self._numel, dtype=torch.float32)
            self._core.read_max_exp_avg_sq(vmax)
        step = float(self._core.step_count)
        state = {}
        for i, (p, o) in enumerate(zip(self._params, self._offsets)):
            k = p.numel()
            s = {"step": torch.tensor(step), "exp_avg": m[o:o + k].view_as(p).clone(),
                 "exp_avg_sq": v[o:o + k].view_as(p).clone()}
            if vmax is not None:
                s["max_exp_avg_sq"] = vmax[o:o + k].view_as(p).clone()
            state[i] = s
        return {"state": state, "param_groups": self._groups_for_dict()}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restores a dict from state_dict() (the strata checkpoint it names, exactly) or from
        torch.optim.AdamW.state_dict() / torch_state_dict() (the moments and step; the master
        weights are then the model's current weights). The optimizer in use stays untouched
        until the new state has been read in full, so a damaged checkpoint loses nothing."""
        groups = state_dict.get("param_groups")
        if groups is None or len(groups) != len(self.param_groups):
            raise ConfigError(f"strata.torch: the state dict has {0 if groups is None else len(groups)} param "
                              f"groups, this optimizer {len(self.param_groups)}")
        for gi, (g, mine) in enumerate(zip(groups, self.param_groups)):
            if len(g["params"]) != len(mine["params"]):
                raise ConfigError(f"strata.torch: group {gi} of the state dict has {len(g['params'])} parameters, "
                                  f"this optimizer's {len(mine['params'])}")
            for key in _FIXED:
                if key in g:
                    a = tuple(g[key]) if key == "betas" else g[key]
                    if a != self.defaults[key]:
                        raise ConfigError(f"strata.torch: group {gi} of the state dict has {key}={g[key]!r}, this "
                                          f"optimizer {self.defaults[key]!r}")
        if "strata" in state_dict:
            info = state_dict["strata"]
            if info.get("numel") != self._numel or info.get("param_numels") != [p.numel() for p in self._params]:
                raise ConfigError("strata.torch: the checkpoint's parameters do not match this optimizer's "
                                  f"({info.get('numel')} vs {self._numel} elements)")
            # The whole checkpoint is read against its checksums before the running state is given
            # up (the new optimizer needs the directories the old one holds).
            found = _core.verify_checkpoint(info["checkpoint"])
            if found != info.get("step"):
                raise ConfigError(f"strata.torch: checkpoint {info['checkpoint']} now holds step {found}, the state "
                                  f"dict names step {info.get('step')} (was it overwritten by a later save?)")
            self._release()
            self._core = _core.Optimizer.load(info["checkpoint"], object_prefix=self._prefix, **self._options)
            # The model follows the restored master weights, as in the run that saved them.
            master = torch.empty(self._numel, dtype=torch.float32)
            self._core.read_master(master)
            self._write_model(master)
        else:
            m, v, vmax, step = self._torch_state_arrays(state_dict)
            _core.validate_state(self._numel, self.defaults["amsgrad"], m, v, vmax)
            master = self._flat_master()
            self._release()
            self._core = _core.Optimizer.create(master, m, v, vmax, step, object_prefix=self._prefix,
                                                **self._options)
        self._handed = [False] * len(self._params)
        for g, loaded in zip(self.param_groups, groups):
            for k, v in loaded.items():
                if k != "params":
                    g[k] = tuple(v) if k == "betas" else v

    def _release(self) -> None:
        """Writes the running state out and lets go of the paths (for the optimizer replacing it)."""
        self._wait_events()
        self._core.flush()
        self._core.close()

    def _torch_state_arrays(self, sd: dict):
        """torch.optim.AdamW's per-parameter state as flat fp32 arrays and one step count."""
        state = sd.get("state", {})
        m = torch.zeros(self._numel, dtype=torch.float32)
        v = torch.zeros(self._numel, dtype=torch.float32)
        amsgrad = self.defaults["amsgrad"]
        vmax = torch.zeros(self._numel, dtype=torch.float32) if amsgrad else None
        steps = set()
        for i, (p, o) in enumerate(zip(self._params, self._offsets)):
            s = state.get(i)
            if s is None:
                steps.add(0)
                continue
            k = p.numel()
            names = (("exp_avg", m), ("exp_avg_sq", v)) + ((("max_exp_avg_sq", vmax),) if amsgrad else ())
            for name, dst in names:
                t = s.get(name)
                if t is None or t.numel() != k:
                    raise ConfigError(f"strata.torch: {self._where(i)}: state '{name}' is missing or has "
                                      f"{None if t is None else t.numel()} elements, expected {k}")
                dst[o:o + k].copy_(t.detach().reshape(-1))
            st = s.get("step", 0)
            steps.add(int(st.item() if isinstance(st, torch.Tensor) else st))
        if len(steps) > 1:
            raise ConfigError(f"strata.torch: the parameters' step counts differ ({sorted(steps)}); strata keeps one")
        return m, v, vmax, (steps.pop() if steps else 0)

    def _write_model(self, master: torch.Tensor) -> None:
        if self._model_event is not None:
            self._model_event.synchronize()
            self._model_event = None
        self._model_flat.copy_(master)
        if self._cuda:
            self._copy_model_to_device()
