"""Checkpoints the PyTorch way: state_dict() with no argument, a dict that survives torch.save and
a moved run folder, no write when nothing changed (accelerate asks when it wraps), the weights
written into the model since the last step saved as the truth, and keep_checkpoints removing
only strata's own older checkpoints."""

import os
import shutil

import pytest

torch = pytest.importorskip("torch")

import strata  # noqa: E402
from front_helpers import flat_master, make_model, same, strata_opt, train  # noqa: E402


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
    assert sd["strata"]["checkpoint"] == "step-000000003"
    assert (run / "nvme" / "strata-checkpoints" / "step-000000003" / "seg-0" / "manifest").exists()
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
    with pytest.raises(strata.ConfigError, match="step-000000002 is not in"):
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
    assert again["strata"]["checkpoint"] == "step-000000002"
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
    model = make_model()
    ck = tmp_path / "ck"
    opt = strata_opt(model, tmp_path, checkpoint_dir=ck, keep_checkpoints=2)
    ck.mkdir()
    (ck / "notes.txt").write_text("mine")
    (ck / "step-000000099").mkdir()  # a directory strata did not make, named like its own
    (ck / "step-000000099" / "manifest").write_text("a user's")
    dicts = []
    for t in range(5):
        train(model, opt, 1, first=t)
        if t == 1:
            (ck / "step-000000001" / "user.txt").write_text("mine too")  # a user's file in strata's directory
        dicts.append(opt.state_dict())
    names = sorted(os.listdir(ck))
    assert names == [".strata-checkpoints", "notes.txt", "step-000000001", "step-000000004", "step-000000005",
                     "step-000000099"]
    assert files_under(ck / "step-000000001") == ["user.txt"]  # strata's files went, the user's stayed
    assert (ck / "step-000000099" / "manifest").read_text() == "a user's"
    with pytest.raises(strata.ConfigError, match="keep_checkpoints"):
        opt.load_state_dict(dicts[1])
    opt.load_state_dict(dicts[3])  # a kept one loads
    assert opt.native.step_count == 4
