"""Checkpoints the PyTorch way: state_dict() with no argument, a dict that survives torch.save and
a moved run folder, no write when nothing changed (accelerate asks when it wraps), the weights
written into the model since the last step saved as the truth, and keep_checkpoints removing
only strata's own older checkpoints."""

import os
import shutil

import pytest

torch = pytest.importorskip("torch")

import strata  # noqa: E402
from front_helpers import REL, flat_master, make_model, max_rel, same, strata_opt, train  # noqa: E402


def files_under(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def test_state_dict_needs_no_argument_and_survives_torch_save_and_a_moved_run_folder(tmp_path):
    whole = make_model()
    ow = strata_opt(whole, tmp_path / "whole")
    train(whole, ow, 6)

    run = tmp_path / "run"
    part = make_model()
    op = strata_opt(part, run)
    train(part, op, 3)
    sd = op.state_dict()
    name = sd["strata"]["checkpoint"]
    assert name.startswith("step-000000003-")
    assert (run / "nvme" / "strata-checkpoints" / name / "strata.0" / "manifest").exists()
    torch.save({"model": part.state_dict(), "opt": sd}, run / "run.pt")
    op.close()

    moved = tmp_path / "moved"
    shutil.move(str(run), str(moved))  # the whole run folder goes elsewhere
    loaded = torch.load(moved / "run.pt")
    resumed = make_model(seed=4)
    resumed.load_state_dict(loaded["model"])
    orr = strata_opt(resumed, moved)  # its default checkpoint_dir is under the moved first path
    orr.load_state_dict(loaded["opt"])
    train(resumed, orr, 3, first=3)
    assert same(whole, resumed)


def test_a_checkpoint_dir_given_at_load_finds_checkpoints_copied_elsewhere(tmp_path):
    model = make_model()
    opt = strata_opt(model, tmp_path / "a")
    train(model, opt, 2)
    sd = opt.state_dict()
    master = flat_master(opt)
    shutil.copytree(tmp_path / "a" / "nvme" / "strata-checkpoints", tmp_path / "elsewhere")
    shutil.rmtree(tmp_path / "a" / "nvme" / "strata-checkpoints")
    other = make_model(seed=5)
    o2 = strata_opt(other, tmp_path / "b", checkpoint_dir=tmp_path / "elsewhere")
    o2.load_state_dict(sd)
    assert torch.equal(flat_master(o2), master)
    gone = strata_opt(make_model(), tmp_path / "c")
    with pytest.raises(strata.ConfigError, match=sd["strata"]["checkpoint"] + " is not in"):
        gone.load_state_dict(sd)


def test_a_fresh_optimizer_writes_nothing_and_a_second_state_dict_without_a_step_writes_nothing_more(tmp_path):
    model = make_model()
    opt = strata_opt(model, tmp_path)
    sd = opt.state_dict()  # what accelerate does when it wraps the optimizer
    assert sd["strata"]["checkpoint"] is None
    assert not (tmp_path / "nvme" / "strata-checkpoints").exists()
    opt.load_state_dict(sd)  # a fresh state, from the model's weights
    train(model, opt, 2)
    opt.state_dict()
    ck = tmp_path / "nvme" / "strata-checkpoints"
    before = {f: os.stat(ck / f).st_mtime_ns for f in files_under(ck)}
    again = opt.state_dict()
    assert again["strata"]["checkpoint"].startswith("step-000000002-")
    assert {f: os.stat(ck / f).st_mtime_ns for f in files_under(ck)} == before


def test_weights_written_after_the_last_step_are_saved_as_the_truth(tmp_path):
    model = make_model()
    opt = strata_opt(model, tmp_path, cache=0)
    train(model, opt, 2)
    opt.state_dict()
    with torch.no_grad():
        model[0].weight.data.clamp_(-0.01, 0.01)  # through .data: no version counter sees it
    sd = opt.state_dict()  # the weights changed: written again
    twin = make_model(seed=8)
    ot = strata_opt(twin, tmp_path / "twin", checkpoint_dir=tmp_path / "nvme" / "strata-checkpoints")
    ot.load_state_dict(sd)
    assert torch.equal(twin[0].weight, model[0].weight)
    assert float(twin[0].weight.abs().max()) <= 0.01


def test_keep_checkpoints_removes_only_strata_s_older_checkpoints(tmp_path):
    model, other_model = make_model(), make_model(seed=3)
    ck = tmp_path / "ck"
    opt = strata_opt(model, tmp_path, checkpoint_dir=ck, keep_checkpoints=2)
    # Another optimizer saving into the same directory (its own prefix): its checkpoints stay.
    other = strata_opt(other_model, tmp_path, checkpoint_dir=ck, keep_checkpoints=0, object_prefix="other")
    ck.mkdir(exist_ok=True)
    (ck / "notes.txt").write_text("mine")
    (ck / "step-000000099-0000abcd").mkdir()  # a directory strata did not make, named like its own
    (ck / "step-000000099-0000abcd" / "manifest").write_text("a user's")
    dicts, names, others = [], [], []
    for t in range(5):
        train(model, opt, 1, first=t)
        train(other_model, other, 1, first=t)
        dicts.append(opt.state_dict())
        names.append(dicts[-1]["strata"]["checkpoint"])
        others.append(other.state_dict()["strata"]["checkpoint"])
        if t == 0:
            (ck / names[0] / "user.txt").write_text("mine too")  # a user's file in strata's directories
            (ck / names[0] / "strata.0" / "user.txt").write_text("and mine")
    assert all(n.startswith(f"step-00000000{t + 1}-") for t, n in enumerate(names))
    kept = sorted(os.listdir(ck))
    assert ".strata-checkpoints.strata" in kept and ".strata-checkpoints.other" in kept
    assert "notes.txt" in kept and "step-000000099-0000abcd" in kept
    assert names[3] in kept and names[4] in kept and names[0] in kept  # (the user's files keep it)
    assert not (ck / names[1]).exists() and not (ck / names[2]).exists()
    assert sorted(files_under(ck / names[0])) == sorted(["user.txt", os.path.join("strata.0", "user.txt")])
    assert all((ck / n / "other.0" / "manifest").exists() for n in others)  # the other optimizer's: all kept
    assert (ck / "step-000000099-0000abcd" / "manifest").read_text() == "a user's"
    with pytest.raises(strata.ConfigError, match="keep_checkpoints"):
        opt.load_state_dict(dicts[1])
    opt.load_state_dict(dicts[3])  # a kept one loads
    assert opt.native.step_count == 4


def test_a_bad_state_dict_is_refused_before_anything_changes(tmp_path):
    model, twin = make_model(), make_model()
    opt = strata_opt(model, tmp_path / "a", amsgrad=True)
    ot = strata_opt(twin, tmp_path / "b", amsgrad=True)
    train(model, opt, 2)
    train(twin, ot, 2)
    sd = opt.state_dict()
    torch_sd = opt.torch_state_dict()
    del torch_sd["state"][1]["max_exp_avg_sq"]  # amsgrad needs it
    with pytest.raises(strata.ConfigError, match="max_exp_avg_sq"):
        opt.load_state_dict(torch_sd)
    shutil.rmtree(tmp_path / "a" / "nvme" / "strata-checkpoints" / sd["strata"]["checkpoint"] / "strata.0")
    with pytest.raises(strata.ConfigError, match="missing"):
        opt.load_state_dict(sd)
    train(model, opt, 2, first=2)  # the running state was kept
    train(twin, ot, 2, first=2)
    assert same(model, twin)


def test_a_torch_state_dict_with_other_betas_brings_them(tmp_path):
    ref_model, model = make_model(), make_model()
    ref = torch.optim.AdamW(ref_model.parameters(), lr=1e-2, betas=(0.8, 0.95), foreach=False)
    train(ref_model, ref, 2)
    with torch.no_grad():
        for a, b in zip(model.parameters(), ref_model.parameters()):
            a.copy_(b)
    opt = strata_opt(model, tmp_path, params=list(model.parameters()), lr=1e-2)  # betas (0.9, 0.999) here
    opt.load_state_dict(ref.state_dict())
    assert opt.param_groups[0]["betas"] == (0.8, 0.95)
    train(ref_model, ref, 2, first=2)
    train(model, opt, 2, first=2)
    assert max_rel(ref_model, model) < REL
