"""The setups PyTorch users train in, each against torch.optim.AdamW: gradients changed between
backward and step (clip_grad_norm_, GradScaler.unscale_, writes torch's version counter does not
see), weights written into the model between steps, frozen and unfrozen parameters, parameters
without a gradient in a step, mixed dtypes in one group, groups added later, per-group betas."""

import pytest

torch = pytest.importorskip("torch")

import strata  # noqa: E402
from front_helpers import (REL, backward_with, flat_master, grads_for, groups, make_model, max_rel,  # noqa: E402
                           same, strata_opt, train, train_widened)

MODES = ["auto", "backward", "step"]


def both(ref_model, model, ref, opt, steps, first=0, between=None, grads=grads_for):
    """Runs the same loop on torch's AdamW and strata's; `between(model, opt)` runs between
    backward and step."""
    for t in range(first, first + steps):
        for m, o in ((ref_model, ref), (model, opt)):
            o.zero_grad()
            backward_with(m, grads(m, t))
            if between is not None:
                between(m, o)
            o.step()


# --- gradients changed between backward and step ---------------------------------------------


@pytest.mark.parametrize("handover", MODES)
def test_clip_grad_norm_between_backward_and_step_trains_as_torch_does(tmp_path, handover):
    ref_model, model = make_model(), make_model()
    ref = torch.optim.AdamW(groups(ref_model), foreach=False)
    opt = strata_opt(model, tmp_path, handover=handover)
    both(ref_model, model, ref, opt, 6, between=lambda m, o: torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5))
    assert max_rel(ref_model, model) < REL
    assert opt.handover_used == "step"  # every gradient changed after backward: none copied early was used


@pytest.mark.parametrize("write", ["data", "detach", "assign"])
def test_a_gradient_changed_after_an_early_copy_is_taken_again_however_it_was_written(tmp_path, write):
    def change(m, o):
        p = m[0].weight
        if write == "data":  # invisible to the version counter
            p.grad.data.mul_(0.25)
        elif write == "detach":
            p.grad.detach().mul_(0.25)
        else:
            p.grad = p.grad * 0.25

    ref_model, model = make_model(), make_model()
    ref = torch.optim.AdamW(groups(ref_model), foreach=False)
    opt = strata_opt(model, tmp_path, handover="backward")
    both(ref_model, model, ref, opt, 4, between=change)
    assert max_rel(ref_model, model) < REL
    assert opt.last_step_stats["handover"] == {"backward": 3, "step": 1, "none": 0}
    assert opt.handover_used == "backward+step"


def test_grad_scaler_unscale_before_step_trains_as_torch_does(tmp_path):
    if not hasattr(torch, "amp") or not hasattr(torch.amp, "GradScaler"):
        pytest.skip("this torch has no CPU GradScaler (torch.amp.GradScaler, torch >= 2.3)")
    ref_model, model = make_model(), make_model()
    ref = torch.optim.AdamW(groups(ref_model), foreach=False)
    opt = strata_opt(model, tmp_path, handover="backward")
    scalers = [torch.amp.GradScaler("cpu", init_scale=1024.0), torch.amp.GradScaler("cpu", init_scale=1024.0)]
    for t in range(5):
        for m, o, sc in ((ref_model, ref, scalers[0]), (model, opt, scalers[1])):
            o.zero_grad()
            loss = sum((p * g).sum() for p, g in zip(m.parameters(), grads_for(m, t)))
            sc.scale(loss).backward()
            sc.unscale_(o)  # in place, and torch's version counter does not move
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            sc.step(o)
            sc.update()
    assert max_rel(ref_model, model) < REL


# --- the model is the truth between steps -----------------------------------------------------


def test_weights_written_into_the_model_between_steps_are_what_the_next_step_starts_from(tmp_path):
    writes = [
        lambda m: m.load_state_dict(make_model(seed=5).state_dict()),
        lambda m: m[0].weight.data.clamp_(-0.05, 0.05),  # WGAN's clip: through .data
        lambda m: torch.nn.init.zeros_(m[2].bias),
        lambda m: m[2].weight.copy_(m[2].weight * 0.5),
    ]
    ref_model, model = make_model(), make_model()
    ref = torch.optim.AdamW(groups(ref_model), foreach=False)
    opt = strata_opt(model, tmp_path)
    for t, write in enumerate(writes):
        both(ref_model, model, ref, opt, 1, first=t)
        with torch.no_grad():
            write(ref_model)
            write(model)
    both(ref_model, model, ref, opt, 2, first=len(writes))
    assert max_rel(ref_model, model) < REL
    assert torch.equal(flat_master(opt), torch.cat([p.detach().reshape(-1) for g in opt.param_groups
                                                    for p in g["params"]]))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_16_bit_model_written_between_steps_makes_its_master_the_written_value(tmp_path, dtype):
    model = make_model(dtype)
    opt = strata_opt(model, tmp_path, checkpoint_dir=tmp_path / "ck")
    train(model, opt, 2)
    before = flat_master(opt)
    w = model[0].weight  # flat [0, 960) of the segment: subgroups 0-2 and part of 3 (300 each)
    with torch.no_grad():
        w.view(-1)[950] = 0.375  # exact in 16 bits; in subgroup 3, which the next step updates
        w.view(-1)[0] = 0.625    # in subgroup 0, which it does not
    opt.zero_grad()
    for p in model.parameters():
        p.grad = None if p is w else torch.zeros_like(p)
    opt.step()  # w has no gradient: where its subgroup is updated, its master takes the written value
    after = flat_master(opt)
    assert after[950].item() == 0.375
    assert torch.equal(after[900:950], before[900:950])  # (weights the model still rounds to keep their bits)
    assert after[0].item() == before[0].item()  # not read this step: taken when next read, or saved
    sd = opt.state_dict()
    opt.load_state_dict(sd)
    assert flat_master(opt)[0].item() == 0.625


# --- parameters torch's AdamW takes -----------------------------------------------------------


def test_frozen_parameters_hold_no_state_until_unfrozen_and_then_train_as_torch_does(tmp_path):
    ref_model, model = make_model(), make_model()
    for m in (ref_model, model):
        m[0].requires_grad_(False)  # frozen from the start (a base model under LoRA, say)
    ref = torch.optim.AdamW(groups(ref_model), foreach=False)
    opt = strata_opt(model, tmp_path)
    assert sum(s["numel"] for s in opt.segments) == model[2].weight.numel() + model[2].bias.numel()
    frozen = [p.detach().clone() for p in model[0].parameters()]
    both(ref_model, model, ref, opt, 3)
    assert all(torch.equal(a, b) for a, b in zip(frozen, model[0].parameters()))
    for m in (ref_model, model):
        m[0].requires_grad_(True)  # unfrozen: their state starts at their first gradient
    both(ref_model, model, ref, opt, 3, first=3)
    assert len(opt.segments) == 2
    for m in (ref_model, model):
        m[2].requires_grad_(False)  # frozen later: their state stays, untouched
    both(ref_model, model, ref, opt, 2, first=6)
    assert max_rel(ref_model, model) < REL
    sd = opt.torch_state_dict()["state"]
    want = ref.state_dict()["state"]
    assert sorted(sd) == sorted(want)
    assert all(float(sd[i]["step"]) == float(want[i]["step"]) for i in want)


def test_a_parameter_without_a_gradient_in_a_step_is_skipped_as_torch_skips_it(tmp_path):
    def grads(m, t):  # the second layer's branch is unused in every third step
        g = grads_for(m, t)
        return g if t % 3 else [g[0], g[1], None, None]

    def backward(m, gs):
        loss = sum((p * g).sum() for p, g in zip(m.parameters(), gs) if g is not None)
        loss.backward()

    ref_model, model = make_model(), make_model()
    ref = torch.optim.AdamW(groups(ref_model), foreach=False)
    opt = strata_opt(model, tmp_path)
    for t in range(7):
        for m, o in ((ref_model, ref), (model, opt)):
            o.zero_grad(set_to_none=True)  # (torch 1.13's default zeroes them instead: then they have one)
            backward(m, grads(m, t))
            o.step()
    assert max_rel(ref_model, model) < REL
    mine, theirs = opt.torch_state_dict()["state"], ref.state_dict()["state"]
    assert [float(mine[i]["step"]) for i in sorted(mine)] == [float(theirs[i]["step"]) for i in sorted(theirs)]
    assert float(mine[1]["step"]) == 4.0  # (a bias of the second layer: 4 of 7 steps)


def test_mixed_dtypes_in_one_group_train_each_on_its_fp32_master(tmp_path):
    def mixed(seed):
        m = make_model(seed=seed)
        m[0].to(torch.bfloat16)  # bf16 weights beside an fp32 layer, as mixed-precision models are
        return m

    model, ref_model = mixed(0), make_model()
    with torch.no_grad():
        for r, p in zip(ref_model.parameters(), model.parameters()):
            r.copy_(p.float())
    ref = torch.optim.AdamW(ref_model.parameters(), lr=1e-2, foreach=False)
    opt = strata_opt(model, tmp_path, params=list(model.parameters()), lr=1e-2)
    assert sorted(s["dtype"] for s in opt.segments) == ["torch.bfloat16", "torch.float32"]
    train_widened(model, ref_model, opt, ref, 4)
    master = flat_master(opt)  # segments in order: bf16 layer, then fp32 layer
    ref_flat = torch.cat([p.detach().reshape(-1) for p in ref_model.parameters()])
    assert ((ref_flat - master).abs().max() / ref_flat.abs().max()).item() < REL
    assert torch.equal(model[0].weight, master[:model[0].weight.numel()].view_as(model[0].weight).bfloat16())


def test_a_path_given_as_a_dict_holds_the_state_of_every_segment_and_is_left_as_it_was(tmp_path):
    model = make_model()
    model[0].to(torch.bfloat16)
    path = {"directory": str(tmp_path / "fast"), "name": "fast", "read_bandwidth": 2e9}
    given = dict(path)
    opt = strata_opt(model, tmp_path, params=list(model.parameters()), paths=[path])
    assert path == given
    assert len(opt.segments) == 2
    files = sorted(f for f in (tmp_path / "fast").iterdir() if ".sg-" in f.name)
    assert {f.name.split(".sg-")[0] for f in files} == {"strata.0", "strata.1"}
    assert [t["name"] for t in opt.path_totals()] == ["fast"]


def test_a_group_added_after_construction_trains_as_torch_does(tmp_path):
    ref_model, model = make_model(), make_model()
    ref = torch.optim.AdamW(ref_model[0].parameters(), lr=1e-2, foreach=False)
    opt = strata_opt(model, tmp_path, params=list(model[0].parameters()), lr=1e-2)
    both(ref_model, model, ref, opt, 2)
    ref.add_param_group({"params": list(ref_model[2].parameters()), "lr": 5e-3, "betas": (0.8, 0.99)})
    opt.add_param_group({"params": list(model[2].parameters()), "lr": 5e-3, "betas": (0.8, 0.99)})
    both(ref_model, model, ref, opt, 3, first=2)
    assert max_rel(ref_model, model) < REL
    assert len(opt.segments) == 2


def test_per_group_betas_eps_and_amsgrad_train_as_torch_does(tmp_path):
    def two(model):
        return [{"params": list(model[0].parameters()), "betas": (0.8, 0.95), "eps": 1e-6},
                {"params": list(model[2].parameters()), "amsgrad": True, "weight_decay": 0.0}]

    ref_model, model = make_model(), make_model()
    ref = torch.optim.AdamW(two(ref_model), lr=1e-2, foreach=False)
    opt = strata_opt(model, tmp_path, params=two(model), lr=1e-2)
    both(ref_model, model, ref, opt, 5)
    assert max_rel(ref_model, model) < REL
    assert len(opt.segments) == 2


def test_several_optimizers_of_one_model_share_directories_by_prefix(tmp_path):
    ref_model, model = make_model(), make_model()
    ref = torch.optim.AdamW(ref_model.parameters(), lr=1e-2, foreach=False)
    a = strata_opt(model, tmp_path, params=list(model[0].parameters()), lr=1e-2, object_prefix="enc")
    b = strata_opt(model, tmp_path, params=list(model[2].parameters()), lr=1e-2, object_prefix="dec")
    for t in range(3):
        ref.zero_grad()
        backward_with(ref_model, grads_for(ref_model, t))
        ref.step()
        a.zero_grad()
        b.zero_grad()
        backward_with(model, grads_for(model, t))
        a.step()
        b.step()
    assert same(ref_model, model) or max_rel(ref_model, model) < REL


@pytest.mark.parametrize("handover", MODES)
def test_the_staged_path_of_gpu_and_dtensor_parameters_gives_the_same_bits(tmp_path, handover):
    """Parameters on a GPU or in DTensor shards cross through host buffers of the shard (weights in
    and out, gradients copied during backward or at step); on the CPU the same path must give the
    bits of the direct one, with a gradient changed after backward and a parameter without one."""

    def loop(model, opt):
        for t in range(4):
            opt.zero_grad(set_to_none=True)
            g = grads_for(model, t)
            if t == 2:
                g[3] = None  # a parameter without a gradient in this step
            sum((p * x).sum() for p, x in zip(model.parameters(), g) if x is not None).backward()
            if t == 1:
                model[0].weight.grad.data.mul_(0.5)  # changed after an early copy
            opt.step()
            if t == 2:
                with torch.no_grad():
                    model[2].weight.data.clamp_(-0.1, 0.1)  # a write into the model between steps

    direct, staged = make_model(), make_model()
    od = strata_opt(direct, tmp_path / "direct", handover=handover)
    os_ = strata_opt(staged, tmp_path / "staged", handover=handover, _force_staging=True)
    loop(direct, od)
    loop(staged, os_)
    assert same(direct, staged)
    assert torch.equal(flat_master(od), flat_master(os_))


def test_non_contiguous_parameters_and_ones_made_so_later_are_updated_as_torch_updates_them(tmp_path):
    def model():
        m = make_model()
        m[0].weight = torch.nn.Parameter(m[0].weight.detach().t().contiguous().t())  # a leaf with swapped strides
        return m

    ref_model, m = model(), model()
    assert not m[0].weight.is_contiguous()
    ref = torch.optim.AdamW(groups(ref_model), foreach=False)
    opt = strata_opt(m, tmp_path)
    both(ref_model, m, ref, opt, 2)
    for mm in (ref_model, m):  # a later change of layout (as channels_last does)
        mm[2].weight.data = mm[2].weight.data.t().contiguous().t()
    both(ref_model, m, ref, opt, 2, first=2)
    assert max_rel(ref_model, m) < REL
    with torch.no_grad():
        m[2].weight.data = m[2].weight.data.double()
    with pytest.raises(strata.ConfigError, match="now torch.float64"):
        both(ref_model, m, ref, opt, 1, first=4)


def test_a_step_that_failed_part_way_finishes_on_its_retry_without_a_second_step_for_the_rest(tmp_path):
    def mixed():
        m = make_model()
        m[2].to(torch.bfloat16)  # two segments: fp32 and bf16
        return m

    ref_model, m = mixed(), mixed()
    ref_opt = strata_opt(ref_model, tmp_path / "ref", params=list(ref_model.parameters()), cache=0)
    # The state is hidden between steps below: reads of the next step started as a step returns,
    # or subgroups kept as their writes land, would already hold it.
    opt = strata_opt(m, tmp_path, params=list(m.parameters()), cache=0, prefetch_next_step=False,
                     return_before_writes=False)
    train(ref_model, ref_opt, 2)
    train(m, opt, 2)
    state = sorted((tmp_path / "nvme").glob("strata.1.sg-*")) + sorted((tmp_path / "pfs").glob("strata.1.sg-*"))
    hidden = [p.with_name(p.name + ".away") for p in state]
    for p, h in zip(state, hidden):
        p.rename(h)  # the second segment's state cannot be read
    opt.zero_grad()
    backward_with(m, grads_for(m, 2))
    with pytest.raises(strata.Error):
        opt.step()
    for p, h in zip(state, hidden):
        h.rename(p)
    opt.step()  # the retry: the fp32 segment is not stepped again
    train(ref_model, ref_opt, 1, first=2)
    assert same(ref_model, m)
    train(ref_model, ref_opt, 1, first=3)
    train(m, opt, 1, first=3)
    assert same(ref_model, m)


def test_several_segments_share_the_host_memory_budget_they_are_given(tmp_path):
    def three(model):
        return [{"params": [model[0].weight], "betas": (0.8, 0.9)}, {"params": [model[0].bias, model[2].bias]},
                {"params": [model[2].weight], "eps": 1e-6}]

    m = make_model()
    budget = 6 << 20
    opt = strata_opt(m, tmp_path, params=three(m), host_memory_budget=budget)
    assert len(opt.segments) == 3
    assert opt.stats()["host_memory_budget"] <= budget
    train(m, opt, 2)
    assert opt.stats()["host_memory_peak"] <= budget


def test_a_zero_size_parameter_is_carried_and_exported(tmp_path):
    m = make_model()
    empty = torch.nn.Parameter(torch.zeros(0))
    opt = strata_opt(m, tmp_path, params=list(m.parameters()) + [empty])
    train(m, opt, 2)
    state = opt.torch_state_dict()["state"]
    assert sorted(state) == [0, 1, 2, 3]
