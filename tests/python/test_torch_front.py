"""strata.torch.OffloadedAdamW against torch.optim.AdamW(foreach=False): its hand-over modes,
schedulers, checkpoints (strata's and torch's format) and its typed errors."""

import os

import pytest

torch = pytest.importorskip("torch")

import strata  # noqa: E402
from front_helpers import (REL, backward_with, flat_master, grads_for, groups, make_model, max_rel,  # noqa: E402
                           same, strata_opt, train, train_widened)


@pytest.mark.parametrize("handover", ["auto", "backward", "step"])
def test_matches_torch_adamw_with_two_groups_a_scheduler_and_subgroups_across_parameters(tmp_path, handover):
    ref_model, model = make_model(), make_model()
    ref = torch.optim.AdamW(groups(ref_model), foreach=False)
    opt = strata_opt(model, tmp_path, handover=handover)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref, step_size=3, gamma=0.5)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    train(ref_model, ref, 10, scheduler=ref_sched)
    train(model, opt, 10, scheduler=sched)
    assert opt.native.step_count == 10
    assert opt.param_groups[0]["lr"] == ref.param_groups[0]["lr"]
    assert max_rel(ref_model, model) < REL


def test_hook_and_step_handover_are_bit_identical_and_say_which_they_used(tmp_path):
    a, b, c = make_model(), make_model(), make_model()
    oa = strata_opt(a, tmp_path / "a", handover="backward")
    ob = strata_opt(b, tmp_path / "b", handover="step")
    oc = strata_opt(c, tmp_path / "c")  # auto: on the CPU a copy during backward would hide nothing
    train(a, oa, 5)
    train(b, ob, 5, set_grads=True)
    train(c, oc, 5)
    assert same(a, b) and same(a, c)
    assert oa.handover_used == "backward" and oa.last_step_stats["handover"] == {"backward": 4, "step": 0, "none": 0}
    assert ob.handover_used == "step" and oc.handover_used == "step"


@pytest.mark.parametrize("handover", ["backward", "step"])
def test_reads_of_the_next_step_and_writes_after_a_step_returns_train_bit_identically_and_are_counted(tmp_path,
                                                                                                      handover):
    ref_model, a, b, c = make_model(), make_model(), make_model(), make_model()
    ref = torch.optim.AdamW(groups(ref_model), foreach=False)
    oa = strata_opt(a, tmp_path / "a", handover=handover, cache=0)  # every subgroup read at every step
    ob = strata_opt(b, tmp_path / "b", handover=handover, cache=0, prefetch_next_step=False,
                    return_before_writes=False)
    # (reads only: with the writes left in flight too, they may hold every free slot as a step returns)
    oc = strata_opt(c, tmp_path / "c", handover=handover, cache=0, return_before_writes=False)
    prefetched, left = [], []
    for t in range(6):
        train(a, oa, 1, first=t)
        train(b, ob, 1, first=t)
        train(c, oc, 1, first=t)
        prefetched.append(oc.last_step_stats["prefetched"])
        left.append(oa.last_step_stats["writes_left"])
        assert oc.last_step_stats["bytes_read"] == ob.last_step_stats["bytes_read"]
        assert ob.last_step_stats["prefetched"] == 0
        assert ob.last_step_stats["writes_left"] == 0
        assert oa.last_step_stats["bytes_written"] == ob.last_step_stats["bytes_written"]
        # none read twice; a subgroup whose write the last step left in flight may not be read again
        assert oa.last_step_stats["bytes_read"] <= ob.last_step_stats["bytes_read"]
        if t == 2:  # reads of the state between steps wait for those in flight
            assert torch.equal(flat_master(oa), flat_master(ob))
    train(ref_model, ref, 6)
    assert prefetched[0] == 0 and all(n > 0 for n in prefetched[1:])
    assert all(n > 0 for n in left), (left, prefetched)  # (the last subgroup's write, at least, is issued as the step returns)
    assert same(a, b) and same(c, b)
    assert max_rel(ref_model, a) < REL


def _schedulers():
    S = torch.optim.lr_scheduler
    out = {
        "LambdaLR": lambda o: S.LambdaLR(o, lambda e: 0.9 ** e),
        "MultiplicativeLR": lambda o: S.MultiplicativeLR(o, lambda e: 0.95),
        "StepLR": lambda o: S.StepLR(o, step_size=2, gamma=0.5),
        "MultiStepLR": lambda o: S.MultiStepLR(o, milestones=[1, 3], gamma=0.3),
        "ConstantLR": lambda o: S.ConstantLR(o, factor=0.5, total_iters=2),
        "LinearLR": lambda o: S.LinearLR(o, start_factor=0.2, total_iters=3),
        "ExponentialLR": lambda o: S.ExponentialLR(o, gamma=0.8),
        "CosineAnnealingLR": lambda o: S.CosineAnnealingLR(o, T_max=4),
        "CosineAnnealingWarmRestarts": lambda o: S.CosineAnnealingWarmRestarts(o, T_0=2),
        "CyclicLR": lambda o: S.CyclicLR(o, base_lr=1e-3, max_lr=1e-2, step_size_up=2, cycle_momentum=False),
        "OneCycleLR": lambda o: S.OneCycleLR(o, max_lr=[2e-2, 1e-2], total_steps=10, cycle_momentum=False),
        "SequentialLR": lambda o: S.SequentialLR(
            o, [S.ConstantLR(o, factor=0.5, total_iters=2), S.ExponentialLR(o, gamma=0.9)], milestones=[2]),
        "ChainedScheduler": lambda o: S.ChainedScheduler([S.ConstantLR(o, factor=0.5, total_iters=2),
                                                          S.ExponentialLR(o, gamma=0.9)]),
        "ReduceLROnPlateau": lambda o: S.ReduceLROnPlateau(o, patience=0, factor=0.5),
    }
    if hasattr(S, "PolynomialLR"):
        out["PolynomialLR"] = lambda o: S.PolynomialLR(o, total_iters=4, power=2.0)
    return out


@pytest.mark.parametrize("name", sorted(_schedulers()))
def test_every_lr_scheduler_sets_each_groups_rate(tmp_path, name):
    make = _schedulers()[name]
    ref_model, model = make_model(), make_model()
    ref = torch.optim.AdamW(groups(ref_model), foreach=False)
    opt = strata_opt(model, tmp_path)
    rs, ss = make(ref), make(opt)
    for t in range(6):
        for m, o, s in ((ref_model, ref, rs), (model, opt, ss)):
            o.zero_grad()
            backward_with(m, grads_for(m, t))
            o.step()
            if name == "ReduceLROnPlateau":
                s.step(1.0)  # a loss that never improves: the rate halves each step
            else:
                s.step()
        assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in ref.param_groups]
    assert max_rel(ref_model, model) < REL


def test_a_scheduler_that_cycles_betas_is_a_config_error_before_any_update(tmp_path):
    model = make_model()
    opt = strata_opt(model, tmp_path)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=10)  # cycle_momentum=True
    before = [p.detach().clone() for p in model.parameters()]
    backward_with(model, grads_for(model, 0))
    with pytest.raises(strata.ConfigError, match="betas"):
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert opt.native.step_count == 0
    del sched


@pytest.mark.parametrize("handover", ["auto", "backward", "step"])
def test_gradient_accumulation_over_micro_batches_is_the_sum_in_every_mode(tmp_path, handover):
    ref_model, model = make_model(), make_model()
    ref = torch.optim.AdamW(groups(ref_model), foreach=False)
    opt = strata_opt(model, tmp_path, handover=handover)
    for t in range(3):
        for m, o in ((ref_model, ref), (model, opt)):
            o.zero_grad()
            for k in range(3):  # three backwards, no optimizer call between them
                backward_with(m, grads_for(m, 10 * t + k))
            o.step()
        assert max_rel(ref_model, model) < REL
    assert opt.handover_used == ("backward" if handover == "backward" else "step")


def test_save_and_resume_is_exact(tmp_path):
    full = make_model(torch.bfloat16)
    of = strata_opt(full, tmp_path / "full")
    sf = torch.optim.lr_scheduler.ExponentialLR(of, gamma=0.9)
    train(full, of, 8, scheduler=sf)

    part = make_model(torch.bfloat16)
    op = strata_opt(part, tmp_path / "part")  # checkpoints under the first path by default
    sp = torch.optim.lr_scheduler.ExponentialLR(op, gamma=0.9)
    train(part, op, 4, scheduler=sp)
    saved = {"model": part.state_dict(), "opt": op.state_dict(), "sched": sp.state_dict()}
    torch.save(saved, tmp_path / "run.pt")
    op.close()
    del op, part

    loaded = torch.load(tmp_path / "run.pt")
    resumed = make_model(torch.bfloat16, seed=7)  # other weights: the checkpoint decides
    resumed.load_state_dict(loaded["model"])
    orr = strata_opt(resumed, tmp_path / "resumed", checkpoint_dir=tmp_path / "part" / "nvme" / "strata-checkpoints")
    sr = torch.optim.lr_scheduler.ExponentialLR(orr, gamma=0.9)
    orr.load_state_dict(loaded["opt"])
    sr.load_state_dict(loaded["sched"])
    assert orr.native.step_count == 4
    train(resumed, orr, 4, first=4, scheduler=sr)
    assert same(full, resumed)


def test_torch_adamw_state_moves_in_and_out(tmp_path):
    # strata -> torch: torch's AdamW continues the run strata began.
    a, b = make_model(), make_model()
    oa = strata_opt(a, tmp_path / "a", amsgrad=True)
    ob = strata_opt(b, tmp_path / "b", amsgrad=True)
    train(a, oa, 3)
    train(b, ob, 3)
    ref = torch.optim.AdamW(groups(b), amsgrad=True, foreach=False)
    ref.load_state_dict(ob.torch_state_dict())
    ob.close()  # its hooks leave the parameters
    train(a, oa, 3, first=3)
    train(b, ref, 3, first=3)
    assert max_rel(a, b) < REL
    # torch -> strata: strata continues the run torch's AdamW began.
    c, d = make_model(), make_model()
    rc = torch.optim.AdamW(groups(c), amsgrad=True, foreach=False)
    rd = torch.optim.AdamW(groups(d), amsgrad=True, foreach=False)
    train(c, rc, 3)
    train(d, rd, 3)
    od = strata_opt(d, tmp_path / "d", amsgrad=True)
    od.load_state_dict(rd.state_dict())
    assert od.native.step_count == 3
    train(c, rc, 3, first=3)
    train(d, od, 3, first=3)
    assert max_rel(c, d) < REL


def test_max_grad_norm_clips_as_clip_grad_norm_does(tmp_path):
    ref_model, model = make_model(), make_model()
    ref = torch.optim.AdamW(groups(ref_model), foreach=False)
    opt = strata_opt(model, tmp_path, max_grad_norm=0.5)
    for t in range(5):
        ref.zero_grad()
        backward_with(ref_model, grads_for(ref_model, t))
        torch.nn.utils.clip_grad_norm_(ref_model.parameters(), 0.5)
        ref.step()
        opt.zero_grad()
        backward_with(model, grads_for(model, t))
        opt.step()
        assert opt.last_step_stats["clip"] < 1
    assert max_rel(ref_model, model) < REL


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_models_hold_the_rounded_fp32_master(tmp_path, dtype):
    ref_model, model = make_model(), make_model(dtype)
    with torch.no_grad():
        for r, p in zip(ref_model.parameters(), model.parameters()):
            r.copy_(p.float())  # the same start: the 16-bit weights, widened
    ref = torch.optim.AdamW(groups(ref_model), foreach=False)
    opt = strata_opt(model, tmp_path)
    train_widened(model, ref_model, opt, ref, 5)
    master = flat_master(opt)
    flat = torch.cat([p.detach().reshape(-1) for g in opt.param_groups for p in g["params"]])
    assert torch.equal(flat, master.to(dtype))
    assert max_rel(ref_model, model) < (1e-2 if dtype == torch.bfloat16 else 1e-3)  # the model is rounded
    ref_flat = torch.cat([p.detach().reshape(-1) for g in ref.param_groups for p in g["params"]])
    assert ((ref_flat - master).abs().max() / ref_flat.abs().max()).item() < REL


def test_path_totals_name_each_path_and_count_its_bytes(tmp_path):
    model = make_model()
    opt = strata_opt(model, tmp_path)
    train(model, opt, 2)
    totals = opt.path_totals()
    assert [t["name"] for t in totals] == [str(tmp_path / "nvme"), str(tmp_path / "pfs")]
    assert all(t["bytes_read"] > 0 and t["bytes_written"] > 0 for t in totals)
    stats = opt.stats()
    # (the paths count reads when they land, the steps when they use them: the reads the last step
    # started for the next one may be in the paths' counts already)
    assert stats["steps"] == 2 and stats["bytes_read"] <= sum(t["bytes_read"] for t in totals)
    assert len(opt.last_step_stats["segments"]) == 1


# --- bad input: a typed error, and nothing lost ------------------------------------------------


def test_errors_are_typed_python_classes():
    assert issubclass(strata.ConfigError, strata.Error) and issubclass(strata.ConfigError, ValueError)
    assert issubclass(strata.IOError, strata.Error) and issubclass(strata.IOError, OSError)
    assert issubclass(strata.ForeignFileError, strata.BusyError)
    for cls in (strata.BusyError, strata.CapacityError, strata.IntegrityError, strata.StreamError):
        assert issubclass(cls, strata.Error)


def test_automatic_gradients_wait_on_the_tier_when_the_budget_cannot_hold_them_and_train_the_same(tmp_path):
    def model():
        torch.manual_seed(1)
        return torch.nn.Linear(64, 160)  # 10400 parameters: an fp32 store of 41600 bytes

    ref_model, auto_model = model(), model()
    host = strata_opt(ref_model, tmp_path / "a", gradients="host")
    # The strata preset's 9 slots of 300 parameters: 9 pages with the gradients in host memory,
    # 18 with them on the tier (a fourth array a slot). 19 pages hold the tier's pipeline but not
    # the host one beside an fp32 store (11 pages).
    budget = 19 * 4096
    auto = strata_opt(auto_model, tmp_path / "b", gradients="automatic", host_memory_budget=budget)
    assert host.native.gradients == "host"
    assert auto.native.gradients == "tier"
    assert strata_opt(model(), tmp_path / "c", gradients="automatic").native.gradients == "host"
    train(ref_model, host, 4)
    train(auto_model, auto, 4)
    assert same(ref_model, auto_model)
    assert auto.native.stats()["host_memory_peak"] <= budget
    with pytest.raises(strata.ConfigError, match="expected 'host', 'tier', 'automatic' or 'caller'"):
        strata_opt(model(), tmp_path / "d", gradients="wherever")


def test_a_parameter_twice_is_a_config_error(tmp_path):
    model = make_model()
    w = model[0].weight
    with pytest.raises(strata.ConfigError, match="appears twice"):
        strata_opt(model, tmp_path, params=[{"params": [w]}, {"params": [w, model[0].bias]}])
    with pytest.raises(strata.ConfigError, match="appears twice"):
        strata_opt(model, tmp_path, params=[w, w])


def test_an_object_prefix_in_use_is_a_busy_error_and_another_prefix_shares_the_directories(tmp_path):
    a, b, c = make_model(), make_model(), make_model()
    first = strata_opt(a, tmp_path)
    with pytest.raises(strata.BusyError, match="strata.0"):
        strata_opt(b, tmp_path)
    other = strata_opt(c, tmp_path, object_prefix="second")  # the same directories, by prefix
    train(a, first, 2)
    train(c, other, 2)
    assert same(a, c)
    first.close()  # the prefix is free again
    strata_opt(b, tmp_path)


def test_a_damaged_state_file_is_an_integrity_error_and_the_checkpoint_still_resumes(tmp_path):
    model = make_model()
    # (the file is damaged between steps: reads of the next step started as a step returns could
    # have read it before)
    opt = strata_opt(model, tmp_path, paths=[tmp_path / "nvme"], checkpoint_dir=tmp_path / "ckpt", cache=0,
                     prefetch_next_step=False, return_before_writes=False)
    train(model, opt, 2)
    sd = opt.state_dict()
    master = flat_master(opt)
    train(model, opt, 1, first=2)
    state_files = sorted(f for f in os.listdir(tmp_path / "nvme") if ".sg-" in f)
    assert state_files
    path = tmp_path / "nvme" / state_files[1]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))
    opt.zero_grad()
    backward_with(model, grads_for(model, 3))
    with pytest.raises(strata.IntegrityError):
        opt.step()
    assert opt.native.step_count == 3
    opt.load_state_dict(sd)  # back to step 2, from the checkpoint: the model follows its masters
    assert opt.native.step_count == 2
    assert torch.equal(flat_master(opt), master)
    twin = make_model()
    ot = strata_opt(twin, tmp_path / "twin")
    train(twin, ot, 2)
    train(model, opt, 2, first=2)
    train(twin, ot, 2, first=2)
    assert same(model, twin)


def test_a_damaged_checkpoint_is_refused_and_the_running_optimizer_loses_nothing(tmp_path):
    model, twin = make_model(), make_model()
    opt = strata_opt(model, tmp_path / "a", checkpoint_dir=tmp_path / "ckpt")
    ot = strata_opt(twin, tmp_path / "b")
    train(model, opt, 2)
    train(twin, ot, 2)
    sd = opt.state_dict()
    ck = os.path.join(sd["strata"]["checkpoint_dir"], sd["strata"]["checkpoint"], "strata.0")
    data_file = next(f for f in os.listdir(ck) if f.endswith(".bin"))
    p = os.path.join(ck, data_file)
    with open(p, "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(strata.IntegrityError):
        opt.load_state_dict(sd)
    train(model, opt, 2, first=2)
    train(twin, ot, 2, first=2)
    assert same(model, twin)


# --- CUDA tensors ------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("handover", ["auto", "backward", "step"])
def test_cuda_models_match_torch_adamw_on_the_device(tmp_path, handover):
    ref_model, model = make_model(device="cuda"), make_model(device="cuda")
    ref = torch.optim.AdamW(groups(ref_model), foreach=False)
    opt = strata_opt(model, tmp_path, handover=handover)
    train(ref_model, ref, 6)
    train(model, opt, 6)
    assert all(p.is_cuda for p in model.parameters())
    assert max_rel(ref_model, model) < REL


@pytest.mark.cuda
def test_cuda_bf16_model_is_the_rounded_master_after_step(tmp_path):
    model = make_model(torch.bfloat16, device="cuda")
    opt = strata_opt(model, tmp_path)
    train(model, opt, 3)
    master = flat_master(opt)
    flat = torch.cat([p.detach().reshape(-1) for g in opt.param_groups for p in g["params"]]).cpu()
    assert torch.equal(flat, master.to(torch.bfloat16))


# --- what strata adds ------------------------------------------------------------------------


def test_dynamic_loss_scaling_unscales_exactly_and_skips_a_step_with_inf(tmp_path):
    a, b = make_model(), make_model()
    oa = strata_opt(a, tmp_path / "a", loss_scaling={"init_scale": 1024.0})
    ob = strata_opt(b, tmp_path / "b")
    assert oa.loss_scale == 1024.0
    for t in range(3):
        oa.zero_grad()
        backward_with(a, [g * oa.loss_scale for g in grads_for(a, t)])  # a power of two: exact
        oa.step()
        train(b, ob, 1, first=t)
    assert same(a, b)
    before = [p.detach().clone() for p in a.parameters()]
    oa.zero_grad()
    g = grads_for(a, 9)
    g[1][0] = float("inf")
    backward_with(a, g)
    oa.step()
    assert oa.last_step_stats["skipped"] and oa.loss_scale == 512.0
    assert oa.native.step_count == 3
    assert all(torch.equal(x, y) for x, y in zip(before, a.parameters()))


def test_step_runs_the_closure_and_returns_its_loss(tmp_path):
    a, b = make_model(), make_model()
    oa, ob = strata_opt(a, tmp_path / "a"), strata_opt(b, tmp_path / "b")

    def closure():
        oa.zero_grad()
        backward_with(a, grads_for(a, 0))
        return torch.tensor(3.5)

    assert oa.step(closure).item() == 3.5
    train(b, ob, 1)
    assert same(a, b)


def test_a_state_dict_whose_checkpoint_was_overwritten_is_refused(tmp_path):
    model = make_model()
    opt = strata_opt(model, tmp_path, checkpoint_dir=tmp_path / "ckpt")
    train(model, opt, 1)
    sd = opt.state_dict()
    train(model, opt, 1, first=1)
    later = opt.state_dict()
    stale = dict(sd, strata=dict(sd["strata"], checkpoint=later["strata"]["checkpoint"]))
    with pytest.raises(strata.ConfigError, match="holds step 2"):
        opt.load_state_dict(stale)
    assert opt.native.step_count == 2


def test_a_closed_optimizer_refuses_to_step_and_its_hooks_are_gone(tmp_path):
    model = make_model()
    opt = strata_opt(model, tmp_path)
    opt.close()
    backward_with(model, grads_for(model, 0))  # no hook hands anything over
    with pytest.raises(strata.ConfigError, match="closed"):
        opt.step()
    reopened = strata_opt(model, tmp_path)  # the directories are free
    reopened.zero_grad()
    train(model, reopened, 1)
    assert reopened.native.step_count == 1


def test_groups_given_as_generators_keep_every_parameter_and_train_as_torch(tmp_path):
    ref_model, model = make_model(), make_model()

    def generator_groups(m):  # the way people write it: {"params": layer.parameters()}
        return [{"params": m[0].parameters(), "weight_decay": 0.1}, {"params": (p for p in m[2].parameters())}]

    ref = torch.optim.AdamW(generator_groups(ref_model), lr=2e-2, foreach=False)
    opt = strata_opt(model, tmp_path, params=generator_groups(model), lr=2e-2)
    assert [len(g["params"]) for g in opt.param_groups] == [len(g["params"]) for g in ref.param_groups] == [2, 2]
    for t in range(3):
        for m, o in ((ref_model, ref), (model, opt)):
            o.zero_grad()
            backward_with(m, grads_for(m, t))
            o.step()
    assert max_rel(ref_model, model) < REL
    added_ref, added = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)
    added.load_state_dict(added_ref.state_dict())
    ref.add_param_group({"params": added_ref.parameters()})
    opt.add_param_group({"params": added.parameters()})
    assert len(opt.param_groups[-1]["params"]) == len(ref.param_groups[-1]["params"]) == 2
    opt.close()
