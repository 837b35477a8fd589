"""The checkpoints strata.torch keeps: a journal of the step directories one optimizer (one
object prefix, one rank) created under a checkpoint directory, and the removal of its older parts
beyond ``keep_checkpoints``.

Only what strata made is ever removed: in a step directory the journal names, only this
optimizer's parts (``<prefix>.<k>``, ``<prefix>.r<rank>.<k>``), and in a part only files of a
strata checkpoint (``manifest``, ``manifest.pending`` and the data files they name); a directory
that still holds anything else after that stays, with that file. Other optimizers and ranks
sharing the directory keep journals of their own. The journal is one name per line, rewritten
atomically.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Callable, List

_STEP_DIR = re.compile(r"^step-\d{9}-[0-9a-f]+$")
_DATA = re.compile(r"^state-\d+-[0-9a-f]{16}\.bin$")


def read_journal(root: Path, journal: str) -> List[str]:
    try:
        text = (root / journal).read_text()
    except FileNotFoundError:
        return []
    return [line for line in text.splitlines() if _STEP_DIR.match(line)]


def write_journal(root: Path, journal: str, names: List[str]) -> None:
    path = root / journal
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write("".join(n + "\n" for n in names))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def record(root: Path, journal: str, name: str) -> None:
    """Names step directory `name` in the journal (before anything is written into it)."""
    names = read_journal(root, journal)
    if name not in names:
        names.append(name)
        write_journal(root, journal, names)


def _remove_part(d: Path) -> None:
    """Removes the files of one strata checkpoint in `d` (manifest, its journal, the data files
    they name), then `d` if that left it empty."""
    if not d.is_dir() or d.is_symlink():
        return
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


def prune(root: Path, journal: str, keep: int, own: Callable[[str], bool]) -> List[str]:
    """Removes this optimizer's parts (`own(name)`) of the journal's step directories beyond the
    newest `keep`, and each step directory that this leaves empty; returns the names dropped
    from the journal."""
    names = read_journal(root, journal)
    if keep <= 0 or len(names) <= keep:
        return []
    old, kept = names[:-keep], names[-keep:]
    for name in old:
        step_dir = root / name
        if step_dir.is_dir() and not step_dir.is_symlink():
            for child in step_dir.iterdir():
                if own(child.name):
                    _remove_part(child)
            try:
                step_dir.rmdir()
            except OSError:
                pass
    write_journal(root, journal, kept)
    return old
