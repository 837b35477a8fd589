"""strata.torch's other update rules against their references: OffloadedSGD against
torch.optim.SGD, OffloadedLion against Lion's definition (lion_pytorch's order, written out below),
OffloadedAdamW(state_dtype="bf16") against torch's AdamW with its moments rounded to bf16 after
each step, OffloadedAdamW(state_dtype="int8") against torch's AdamW with its moments block-quantized
after each step (the maps written out below); exact resume from state_dict() and torch's format for each; typed errors."""

import pytest

torch = pytest.importorskip("torch")

import strata  # noqa: E402
from front_helpers import REL, backward_with, grads_for, groups, make_model, max_rel, same, train  # noqa: E402
from strata.torch import OffloadedAdamW, OffloadedLion, OffloadedSGD  # noqa: E402

SUBGROUP = 300
ARGS = dict(subgroup_size=SUBGROUP, threads=2)


def _paths(tmp_path):
    return [tmp_path / "nvme", tmp_path / "pfs"]


class ReferenceLion(torch.optim.Optimizer):
    """Lion as lion_pytorch.Lion computes it (decoupled decay, then the sign of the interpolation,
    then the momentum update)."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for g in self.param_groups:
            b1, b2 = g["betas"]
            for p in g["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if "exp_avg" not in st:
                    st["exp_avg"] = torch.zeros_like(p)
                m = st["exp_avg"]
                p.mul_(1 - g["lr"] * g["weight_decay"])
                update = m.clone().mul_(b1).add_(p.grad, alpha=1 - b1).sign_()
                p.add_(update, alpha=-g["lr"])
                m.mul_(b2).add_(p.grad, alpha=1 - b2)


SGD_SETUPS = {
    "plain": dict(),
    "momentum": dict(momentum=0.9),
    "momentum_dampening": dict(momentum=0.9, dampening=0.3),
    "nesterov": dict(momentum=0.8, nesterov=True),
    "maximize": dict(momentum=0.5, maximize=True),
}


@pytest.mark.parametrize("setup", sorted(SGD_SETUPS))
def test_offloaded_sgd_matches_torch_sgd_with_two_groups_and_a_scheduler(tmp_path, setup):
    kw = SGD_SETUPS[setup]
    ref_model, model = make_model(), make_model()
    ref = torch.optim.SGD(groups(ref_model), lr=1e-2, foreach=False, **kw)
    opt = OffloadedSGD(groups(model), lr=1e-2, paths=_paths(tmp_path), **ARGS, **kw)
    rs = torch.optim.lr_scheduler.StepLR(ref, step_size=3, gamma=0.5)
    ss = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    train(ref_model, ref, 8, scheduler=rs)
    train(model, opt, 8, scheduler=ss)
    assert opt.native.rule == "sgd"
    assert max_rel(ref_model, model) < REL


def test_offloaded_sgd_skips_a_parameter_without_a_gradient_as_torch_does(tmp_path):
    ref_model, model = make_model(), make_model()
    ref = torch.optim.SGD(groups(ref_model), lr=1e-2, momentum=0.9, weight_decay=0.01, foreach=False)
    opt = OffloadedSGD(groups(model), lr=1e-2, momentum=0.9, weight_decay=0.01, paths=_paths(tmp_path), **ARGS)
    for m, o in ((ref_model, ref), (model, opt)):
        for t in range(6):
            o.zero_grad()
            backward_with(m, grads_for(m, t))
            if t % 2 == 1:
                m[2].bias.grad = None  # no gradient this step: no decay, no momentum change
            o.step()
    assert max_rel(ref_model, model) < REL


def test_offloaded_lion_matches_the_papers_update(tmp_path):
    ref_model, model = make_model(), make_model()
    ref = ReferenceLion(groups(ref_model, lr=1e-3), betas=(0.9, 0.99))
    opt = OffloadedLion(groups(model, lr=1e-3), betas=(0.9, 0.99), paths=_paths(tmp_path), **ARGS)
    train(ref_model, ref, 8)
    train(model, opt, 8)
    assert opt.native.rule == "lion"
    assert max_rel(ref_model, model) < REL


def test_adamw_bf16_moments_match_torch_adamw_with_moments_rounded_to_bf16_after_each_step(tmp_path):
    ref_model, model = make_model(), make_model()
    ref = torch.optim.AdamW(groups(ref_model), foreach=False)
    opt = OffloadedAdamW(groups(model), state_dtype="bf16", paths=_paths(tmp_path), **ARGS)
    assert [(n, e) for n, e in opt.native.state_format] == [("exp_avg", "bf16"), ("exp_avg_sq", "bf16")]
    for t in range(8):
        train(ref_model, ref, 1, first=t)
        for st in ref.state.values():  # what strata stores: the new moments rounded to nearest even
            st["exp_avg"].copy_(st["exp_avg"].to(torch.bfloat16).float())
            st["exp_avg_sq"].copy_(st["exp_avg_sq"].to(torch.bfloat16).float())
        train(model, opt, 1, first=t)
    # 1e-7 measured; unrounded moments are 1e-3 away: the bound tells them apart with room for a tie
    # rounded the other way (one bf16 ulp of a moment).
    assert max_rel(ref_model, model) < 1e-5
    sd = opt.torch_state_dict()
    for st in sd["state"].values():
        for name in ("exp_avg", "exp_avg_sq"):
            assert st[name].dtype == torch.float32
            assert torch.equal(st[name], st[name].to(torch.bfloat16).float())  # widened exactly


def _q8_map(signed):
    """strata's 8-bit map (optim/quant8.hpp), built the same way: per decade 10^-6..10^0 the
    midpoints of equal bins of [0.1, 1] (1, 2, ..., 64 bins signed, twice as many unsigned), both
    signs when signed (but the smallest negative), 0, 1 and, signed, -1. Returns the values and the
    midpoints between neighbours, in float32."""
    v = []
    for d in range(7):
        bins = (1 if signed else 2) << d
        unit = 1.0
        for _ in range(6 - d):
            unit /= 10
        for j in range(bins):
            x = unit * (0.1 + (j + 0.5) * (0.9 / bins))
            v.append(x)
            if signed and d > 0:
                v.append(-x)
    v += [0.0, 1.0] + ([-1.0] if signed else [])
    values = torch.tensor(sorted(v), dtype=torch.float32)
    wide = values.double()
    return values, ((wide[:-1] + wide[1:]) / 2).float()


def _quantized(x, table):
    """x after a store and a read as strata's 8-bit state: per block of 256 values of the flat
    tensor, scale = absmax, code = the nearest map value (ties to the lower), read = value * scale."""
    values, thresholds = table
    flat = x.reshape(-1)
    out = torch.empty_like(flat)
    for b in range(0, flat.numel(), 256):
        block = flat[b:b + 256]
        scale = block.abs().max()
        if scale == 0:
            out[b:b + 256] = 0
            continue
        codes = torch.searchsorted(thresholds, block / scale)  # thresholds below each value
        out[b:b + 256] = values[codes] * scale
    return out.view_as(x)


def test_adamw_int8_moments_match_torch_adamw_with_moments_block_quantized_after_each_step(tmp_path):
    signed, unsigned = _q8_map(True), _q8_map(False)
    ref_model, model = make_model(), make_model()
    ref = torch.optim.AdamW(groups(ref_model), foreach=False)
    opt = OffloadedAdamW(groups(model), state_dtype="int8", paths=_paths(tmp_path), subgroup_size=512, threads=2)
    assert [(n, e) for n, e in opt.native.state_format] == [("exp_avg", "q8"), ("exp_avg_sq", "uq8")]
    flips = total = 0
    for t in range(8):
        # Each step from the same weights and (dequantized) state: torch's and strata's fp32 moments
        # differ by an ulp now and then, which can move a value across a code's boundary; from a
        # common start every step is held to the reference, and such a move to one code.
        ref_model.load_state_dict(model.state_dict())
        ref.load_state_dict(opt.torch_state_dict())
        train(ref_model, ref, 1, first=t)
        train(model, opt, 1, first=t)
        assert max_rel(ref_model, model) < 1e-6  # the weights move with the new fp32 moments
        mine = opt.torch_state_dict()["state"]
        for i, st in enumerate(ref.state.values()):
            for name, table, code in (("exp_avg", signed, 0.0141), ("exp_avg_sq", unsigned, 0.0071)):
                want = _quantized(st[name], table)
                got = mine[i][name]
                assert got.dtype == torch.float32
                assert torch.equal(_quantized(got, table), got)  # dequantized values, exactly
                diff = (got - want).abs()
                assert diff.max() <= code * want.abs().max() * 1.001  # at most one code of the widest bins
                flips += int((diff > 1e-6 * want.abs().max()).sum())
                total += want.numel()
    assert flips <= total // 100


def test_adamw_int8_state_exported_to_torch_format_comes_back_exactly(tmp_path):
    a, b = make_model(), make_model()
    oa = OffloadedAdamW(groups(a), state_dtype="int8", paths=_paths(tmp_path / "a"), subgroup_size=512, threads=2)
    train(a, oa, 3)
    exported = oa.torch_state_dict()
    b.load_state_dict(a.state_dict())
    ob = OffloadedAdamW(groups(b), state_dtype="int8", paths=_paths(tmp_path / "b"), subgroup_size=512, threads=2)
    ob.load_state_dict(exported)
    train(a, oa, 3, first=3)
    train(b, ob, 3, first=3)
    assert same(a, b)


@pytest.mark.parametrize("kind", ["sgd", "lion", "adamw-bf16", "adamw-int8"])
def test_state_dict_resumes_each_rule_bit_for_bit(tmp_path, kind):
    def make(model, where):
        if kind == "sgd":
            return OffloadedSGD(groups(model), lr=1e-2, momentum=0.9, paths=_paths(where), **ARGS)
        if kind == "lion":
            return OffloadedLion(groups(model, lr=1e-3), paths=_paths(where), **ARGS)
        if kind == "adamw-int8":
            return OffloadedAdamW(groups(model), state_dtype="int8", paths=_paths(where), subgroup_size=512,
                                  threads=2)
        return OffloadedAdamW(groups(model), state_dtype="bf16", paths=_paths(where), **ARGS)

    a, b = make_model(), make_model()
    oa = make(a, tmp_path / "a")
    train(a, oa, 3)
    sd = oa.state_dict()
    b.load_state_dict(a.state_dict())
    ob = make(b, tmp_path / "b")
    ob.load_state_dict(sd)
    train(a, oa, 3, first=3)
    train(b, ob, 3, first=3)
    assert same(a, b)


def test_sgd_state_moves_to_torch_sgd_and_back(tmp_path):
    ref_model, model = make_model(), make_model()
    ref = torch.optim.SGD(groups(ref_model), lr=1e-2, momentum=0.9, dampening=0.1, foreach=False)
    opt = OffloadedSGD(groups(model), lr=1e-2, momentum=0.9, dampening=0.1, paths=_paths(tmp_path), **ARGS)
    train(ref_model, ref, 3)
    train(model, opt, 3)
    # strata -> torch: torch continues from strata's momentum buffers.
    cont = make_model()
    cont.load_state_dict(model.state_dict())
    twin = torch.optim.SGD(groups(cont), lr=1e-2, momentum=0.9, dampening=0.1, foreach=False)
    twin.load_state_dict(opt.torch_state_dict())
    # torch -> strata: strata continues from torch's.
    back = make_model()
    back.load_state_dict(ref_model.state_dict())
    ob = OffloadedSGD(groups(back), lr=1e-2, momentum=0.9, dampening=0.1, paths=_paths(tmp_path / "b"), **ARGS)
    ob.load_state_dict(ref.state_dict())
    train(ref_model, ref, 3, first=3)
    train(cont, twin, 3, first=3)
    train(back, ob, 3, first=3)
    assert max_rel(ref_model, cont) < REL
    assert max_rel(ref_model, back) < REL


def test_lion_state_moves_to_its_reference_and_back(tmp_path):
    ref_model, model = make_model(), make_model()
    ref = ReferenceLion(groups(ref_model, lr=1e-3))
    opt = OffloadedLion(groups(model, lr=1e-3), paths=_paths(tmp_path), **ARGS)
    train(ref_model, ref, 3)
    train(model, opt, 3)
    back = make_model()
    back.load_state_dict(ref_model.state_dict())
    ob = OffloadedLion(groups(back, lr=1e-3), paths=_paths(tmp_path / "b"), **ARGS)
    ob.load_state_dict(ref.state_dict())
    exported = opt.torch_state_dict()["state"]
    for i, st in ref.state_dict()["state"].items():
        assert torch.allclose(exported[i]["exp_avg"], st["exp_avg"], rtol=1e-6, atol=1e-7)
    train(ref_model, ref, 3, first=3)
    train(back, ob, 3, first=3)
    assert max_rel(ref_model, back) < REL


def test_rules_refuse_what_they_cannot_do_with_typed_errors(tmp_path):
    model = make_model()
    with pytest.raises(strata.ConfigError, match="state_dtype"):
        OffloadedAdamW(groups(model), state_dtype="int4", paths=_paths(tmp_path))
    with pytest.raises(strata.ConfigError, match="subgroup_elems 300 is not a multiple of the 256"):
        train(model, OffloadedAdamW(groups(model), state_dtype="int8", paths=_paths(tmp_path / "q"), **ARGS), 1)
    with pytest.raises(strata.ConfigError, match="nesterov"):
        OffloadedSGD(groups(model), nesterov=True, paths=_paths(tmp_path))
    with pytest.raises(strata.ConfigError, match="momentum"):
        OffloadedSGD(groups(model), momentum=-1.0, paths=_paths(tmp_path))
    with pytest.raises(strata.ConfigError, match="betas"):
        OffloadedLion(groups(model), betas=(0.9,), paths=_paths(tmp_path))
    # A scheduler cycling momentum would train differently: refused at the step.
    opt = OffloadedSGD(groups(model), lr=1e-2, momentum=0.9, paths=_paths(tmp_path / "m"), **ARGS)
    train(model, opt, 1)
    opt.param_groups[0]["momentum"] = 0.8
    with pytest.raises(strata.ConfigError, match="momentum"):
        train(model, opt, 1, first=1)
    opt.param_groups[0]["momentum"] = 0.9
    # Another rule's checkpoint is not loaded as this one's.
    lion = OffloadedLion(groups(make_model()), paths=_paths(tmp_path / "l"), **ARGS)
    sgd_state = opt.state_dict()
    with pytest.raises(strata.ConfigError, match="rule"):
        lion.load_state_dict(sgd_state)
    # An fp32-moment checkpoint is not loaded into bf16 moments (no silent conversion).
    m32 = make_model()
    o32 = OffloadedAdamW(groups(m32), paths=_paths(tmp_path / "f"), **ARGS)
    train(m32, o32, 1)
    o16 = OffloadedAdamW(groups(make_model()), state_dtype="bf16", paths=_paths(tmp_path / "h"), **ARGS)
    with pytest.raises(strata.ConfigError, match="adamw"):
        o16.load_state_dict(o32.state_dict())
    train(make_model(), o16, 0)
