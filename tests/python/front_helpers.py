"""What the PyTorch front's tests share: small models, gradients fixed by the step number, the
agreement measure with torch's AdamW, and a strata optimizer over two directories."""

import os

import torch

from strata.torch import OffloadedAdamW

# Agreement with torch's AdamW: the same update, with torch's own order of operations differing
# between releases (mul_/add_ in 1.13, lerp_ later), measured as max |a - b| / max |a| per tensor.
REL = 1e-6
SUBGROUP = 300  # parameters per subgroup: subgroups cross the parameters' boundaries


def make_model(dtype=torch.float32, device="cpu", seed=0):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.Tanh(), torch.nn.Linear(40, 8))
    return m.to(dtype=dtype, device=device)


def groups(model, lr=2e-2):
    weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
    biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
    return [{"params": weights, "lr": lr, "weight_decay": 0.1}, {"params": biases, "lr": lr / 2, "weight_decay": 0.0}]


def grads_for(model, step):
    """Gradients fixed by the step number, the same whatever the weights are."""
    g = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(p.shape, generator=g).to(dtype=p.dtype, device=p.device) for p in model.parameters()]


def backward_with(model, grads):
    """A backward whose gradient for each parameter is exactly `grads` (d/dp sum(p * g) = g)."""
    loss = sum((p * g).sum() for p, g in zip(model.parameters(), grads) if p.requires_grad)
    loss.backward()


def strata_opt(model, tmp_path, **kw):
    args = dict(paths=[tmp_path / "nvme", tmp_path / "pfs"], subgroup_size=SUBGROUP, threads=2)
    args.update(kw)
    params = args.pop("params", None) or groups(model)
    return OffloadedAdamW(params, **args)


def train(model, opt, steps, first=0, scheduler=None, set_grads=False):
    for t in range(first, first + steps):
        opt.zero_grad()
        g = grads_for(model, t)
        if set_grads:
            for p, gi in zip(model.parameters(), g):
                p.grad = gi.clone()
        else:
            backward_with(model, g)
        opt.step()
        if scheduler is not None:
            scheduler.step()


AGREEMENT: dict = {}  # test -> largest difference from torch's AdamW it measured (see conftest)


def record(value):
    """Keeps the largest difference from torch's AdamW the running test measured."""
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" (", 1)[0]
    AGREEMENT[test] = max(AGREEMENT.get(test, 0.0), float(value))
    return value


def max_rel(a_model, b_model):
    worst = 0.0
    for a, b in zip(a_model.parameters(), b_model.parameters()):
        a, b = a.detach().float().cpu(), b.detach().float().cpu()
        worst = max(worst, ((a - b).abs().max() / a.abs().max().clamp_min(1e-30)).item())
    return record(worst)


def same(a_model, b_model):
    return all(torch.equal(a, b) for a, b in zip(a_model.parameters(), b_model.parameters()))


def flat_master(opt):
    """Every segment's master weights, in the order of its parameters."""
    out = []
    for seg in opt._segments:
        m = torch.empty(seg.share_numel)
        seg.core.read_master(m)
        out.append(m)
    return torch.cat(out)


def train_widened(model, ref_model, opt, ref, steps):
    """Steps a 16-bit (or mixed) model with strata and an fp32 twin with torch, on the same
    gradients (widened for the twin)."""
    for t in range(steps):
        g = grads_for(model, t)
        opt.zero_grad()
        backward_with(model, g)
        opt.step()
        ref.zero_grad()
        backward_with(ref_model, [x.float() for x in g])
        ref.step()
