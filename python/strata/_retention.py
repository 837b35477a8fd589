"""The checkpoints strata.torch keeps: a journal of the step directories it created under a
checkpoint directory, and the removal of the older ones beyond ``keep_checkpoints``.

Only what strata made is ever removed: a step directory is removed only if the journal names it,
and inside it only files of a strata checkpoint (``manifest``, ``manifest.pending`` and the data
file the manifest names, in the nested segment and rank directories strata made); a directory
that still holds anything else after that stays, with that file. The journal is one name per
line, rewritten atomically.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import List

_STEP_DIR = re.compile(r"^step-\d{9}$")
_NESTED = re.compile(r"^(seg-\d+|rank-\d+-of-\d+)$")
_DATA = re.compile(r"^state-\d+-[0-9a-f]{16}\.bin$")


def journal_path(root: Path, rank: int) -> Path:
    return root / (".strata-checkpoints" if rank == 0 else f".strata-checkpoints.r{rank}")


def read_journal(root: Path, rank: int) -> List[str]:
    try:
        text = journal_path(root, rank).read_text()
    except FileNotFoundError:
        return []
    return [line for line in text.splitlines() if _STEP_DIR.match(line)]


def write_journal(root: Path, rank: int, names: List[str]) -> None:
    path = journal_path(root, rank)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write("".join(n + "\n" for n in names))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def record(root: Path, rank: int, name: str) -> None:
    """Names step directory `name` in the journal (before anything is written into it)."""
    names = read_journal(root, rank)
    if name not in names:
        names.append(name)
        write_journal(root, rank, names)


def _remove_checkpoint_files(d: Path) -> None:
    """Removes the files of one strata checkpoint in `d` (manifest, journal, the data files the
    manifest and journal name), then `d` if that left it empty."""
    names = set()
    for meta in ("manifest", "manifest.pending"):
        try:
            for line in (d / meta).read_text(errors="replace").splitlines():
                word = line.split(" ")[-1] if line.startswith("data ") else line
                if _DATA.match(word):
                    names.add(word)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            pass
    for name in sorted(names) + ["manifest", "manifest.pending"]:
        p = d / name
        if p.is_file() and not p.is_symlink():
            p.unlink()
    try:
        d.rmdir()
    except OSError:  # something else is in it: it stays
        pass


def _remove_tree(d: Path) -> None:
    if not d.is_dir() or d.is_symlink():
        return
    for child in d.iterdir():
        if _NESTED.match(child.name) and child.is_dir() and not child.is_symlink():
            _remove_tree(child)
    _remove_checkpoint_files(d)


def prune(root: Path, rank: int, keep: int, rank_dirs: bool, world: int) -> List[str]:
    """Removes this rank's part of the journal's step directories beyond the newest `keep`;
    returns the names removed from the journal."""
    names = read_journal(root, rank)
    if keep <= 0 or len(names) <= keep:
        return []
    old, kept = names[:-keep], names[-keep:]
    for name in old:
        step_dir = root / name
        if rank_dirs:
            for seg in sorted(step_dir.glob("seg-*")):
                _remove_tree(seg / f"rank-{rank}-of-{world}")
                try:
                    seg.rmdir()
                except OSError:
                    pass
            try:
                step_dir.rmdir()
            except OSError:
                pass
        else:
            _remove_tree(step_dir)
    write_journal(root, rank, kept)
    return old
