"""The names strata reserves in a path (its lock and journal files) are strata's only when strata
made the file there: an optimizer whose paths hold a user's file at such a name is refused, and
every path, the refused one and the others, is left as it was, with no directory strata made."""

import os

import pytest

torch = pytest.importorskip("torch")

import strata  # noqa: E402
from front_helpers import make_model, strata_opt  # noqa: E402


def snapshot(d):
    return {n: (d / n).read_bytes() for n in sorted(os.listdir(d))}


def test_a_users_lock_files_in_the_second_path_are_left_when_the_first_path_is_refused(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "strata.0.sg-0").write_text("another job's subgroup")  # refuses the first path
    for name in (".strata-lock", ".strata-lock.strata.0", ".strata-objects.strata.0"):
        (b / name).write_text(f"the user's {name}")
    before = {d: snapshot(d) for d in (a, b)}
    with pytest.raises(strata.ForeignFileError):
        strata_opt(make_model(), tmp_path, paths=[a, b])
    assert {d: snapshot(d) for d in (a, b)} == before


def test_a_refused_path_leaves_no_directory_strata_made_for_another_path(tmp_path):
    b = tmp_path / "b"
    b.mkdir()
    (b / ".strata-lock.strata.0").write_text("")  # empty: still not known to be strata's
    with pytest.raises(strata.ForeignFileError, match=r"\.strata-lock\.strata\.0"):
        strata_opt(make_model(), tmp_path, paths=[tmp_path / "new" / "deep", b])
    assert sorted(os.listdir(tmp_path)) == ["b"]
    assert os.listdir(b) == [".strata-lock.strata.0"]
