"""A checkpoint directory may hold a user's files (or be a symlink to a user's folder):
state_dict() and keep_checkpoints never overwrite, rename over or remove one, a user's file where
strata's must go is a strata error that names it, and a save that fails leaves the checkpoint
directory as it was."""

import os
import resource
import signal

import pytest

torch = pytest.importorskip("torch")

import strata  # noqa: E402
from front_helpers import make_model, strata_opt, train  # noqa: E402

pytestmark = pytest.mark.reliability


def snapshot(root):
    """Every directory and file under `root` (not following symlinks), with the files' bytes."""
    out = {}
    for d, dirs, files in os.walk(root):
        for name in dirs:
            out[os.path.relpath(os.path.join(d, name), root) + "/"] = None
        for name in files:
            with open(os.path.join(d, name), "rb") as f:
                out[os.path.relpath(os.path.join(d, name), root)] = f.read()
    return out


def before_each_save(opt, plant):
    """Calls plant(name) just before state_dict() writes checkpoint `name` (a name that hashes
    the weights, so a test learns it only then)."""
    save = opt._save_checkpoint

    def planted(name):
        plant(name)
        return save(name)

    opt._save_checkpoint = planted


def test_a_user_s_manifest_where_a_part_goes_is_refused_by_name_and_left_as_it_was(tmp_path):
    model = make_model()
    ck = tmp_path / "ck"
    opt = strata_opt(model, tmp_path, checkpoint_dir=ck)
    train(model, opt, 1)
    planted = []

    def plant(name):
        part = ck / name / "strata.0"
        part.mkdir(parents=True)
        (part / "manifest").write_text("my notes, not a checkpoint")
        planted.append(part / "manifest")

    before_each_save(opt, plant)
    with pytest.raises(strata.ForeignFileError) as refused:
        opt.state_dict()
    assert str(planted[0]) in str(refused.value)
    assert planted[0].read_text() == "my notes, not a checkpoint"
    # Nothing of the refused save is left: no journal line, no file, no directory of strata's.
    assert snapshot(ck) == {os.path.relpath(planted[0].parent.parent, ck) + "/": None,
                            os.path.relpath(planted[0].parent, ck) + "/": None,
                            os.path.relpath(planted[0], ck): b"my notes, not a checkpoint"}
    del opt._save_checkpoint
    train(model, opt, 1, first=1)  # the optimizer goes on, and saves where nothing is in the way
    sd = opt.state_dict()
    assert (ck / sd["strata"]["checkpoint"] / "strata.0" / "manifest").exists()
    assert planted[0].read_text() == "my notes, not a checkpoint"


def test_a_failed_save_leaves_the_checkpoint_directory_as_it_was(tmp_path):
    model = make_model()
    ck = tmp_path / "ck"
    opt = strata_opt(model, tmp_path, checkpoint_dir=ck, keep_checkpoints=1)
    train(model, opt, 1)
    first = opt.state_dict()
    before = snapshot(ck)
    train(model, opt, 1, first=1)
    # A file size limit below the checkpoint's data: its write fails as on a full disk.
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
    try:
        with pytest.raises(strata.Error):
            opt.state_dict()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
    assert snapshot(ck) == before  # no step-* directory, part or journal line of the failed save
    sd = opt.state_dict()  # the next save goes through, and retention goes on
    assert sd["strata"]["checkpoint"].startswith("step-000000002-")
    assert sorted(n for n in os.listdir(ck) if n.startswith("step-")) == [sd["strata"]["checkpoint"]]
    assert first["strata"]["checkpoint"] != sd["strata"]["checkpoint"]


def test_a_checkpoint_dir_that_is_a_symlink_to_a_user_s_folder_keeps_the_user_s_files(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("notes")
    (mine / "manifest").write_text("my manifest")
    link = tmp_path / "ck"
    link.symlink_to(mine, target_is_directory=True)
    model = make_model()
    opt = strata_opt(model, tmp_path, checkpoint_dir=link, keep_checkpoints=1)
    planted = []

    def plant(name):  # a list of the user's that names a file of theirs, where the first part goes
        if planted:
            return
        part = link / name / "strata.0"
        part.mkdir(parents=True)
        (part / "manifest.pending").write_text("state-1-00000000deadbeef.bin\n")
        (part / "state-1-00000000deadbeef.bin").write_bytes(b"my data")
        planted.append(part)

    before_each_save(opt, plant)
    names = []
    for t in range(3):
        train(model, opt, 1, first=t)
        names.append(opt.state_dict()["strata"]["checkpoint"])
    assert link.is_symlink()
    assert (mine / "notes.txt").read_text() == "notes" and (mine / "manifest").read_text() == "my manifest"
    # The first checkpoint was pruned (keep_checkpoints=1): strata's files went, the user's stayed.
    part = mine / names[0] / "strata.0"
    assert sorted(os.listdir(part)) == ["manifest.pending", "state-1-00000000deadbeef.bin"]
    assert (part / "manifest.pending").read_text() == "state-1-00000000deadbeef.bin\n"
    assert (part / "state-1-00000000deadbeef.bin").read_bytes() == b"my data"
    assert not (mine / names[1]).exists() and (mine / names[2] / "strata.0" / "manifest").exists()
