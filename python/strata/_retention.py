"""The checkpoints strata.torch keeps: a journal of the step directories one optimizer (one
object prefix, one rank) created under a checkpoint directory, and the removal of its older parts
beyond ``keep_checkpoints``.

Only what strata made is ever removed: in a step directory the journal names, only this
optimizer's parts (``<prefix>.<k>``, ``<prefix>.r<rank>.<k>``), and in a part only the files of
the strata checkpoint that its own journal names (``_core.remove_checkpoint``); a directory that
still holds anything else after that stays, with that file. Other optimizers and ranks sharing
the directory keep journals of their own. The journal is one name per line, rewritten atomically
through a file of strata's own (never through a symlink, a FIFO or another name's hard link).
"""

from __future__ import annotations

import os
import stat
import warnings
from pathlib import Path
import re
from typing import Callable, List

from . import _core

_STEP_DIR = re.compile(r"^step-\d{9}-[0-9a-f]+$")


def _refuse_foreign(path: Path, st: os.stat_result) -> None:
    """ForeignFileError naming `path` unless its status is that of a file strata made."""
    if not stat.S_ISREG(st.st_mode):
        why = "a symlink" if stat.S_ISLNK(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode) else "a special file"
    elif st.st_uid != os.geteuid():
        why = f"a file of uid {st.st_uid}"
    elif st.st_nlink > 1:
        why = f"a file with {st.st_nlink} hard links"
    else:
        return
    raise _core.ForeignFileError(f"{path} is {why}, not a file strata made: strata neither follows, changes nor "
                                 f"removes it (move it away to let strata use this name)")


def read_journal(root: Path, journal: str) -> List[str]:
    path = root / journal
    try:
        _refuse_foreign(path, os.lstat(path))
    except FileNotFoundError:
        return []
    return [line for line in path.read_text().splitlines() if _STEP_DIR.match(line)]


def write_journal(root: Path, journal: str, names: List[str]) -> None:
    path = root / journal
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "w") as f:
            _refuse_foreign(tmp, os.fstat(f.fileno()))
            f.truncate(0)
            f.write("".join(n + "\n" for n in names))
            f.flush()
            os.fsync(f.fileno())
    except _core.ForeignFileError:
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def record(root: Path, journal: str, name: str) -> bool:
    """Names step directory `name` in the journal (before anything is written into it); returns
    whether it was not named yet."""
    names = read_journal(root, journal)
    if name in names:
        return False
    write_journal(root, journal, names + [name])
    return True


def unrecord(root: Path, journal: str, name: str) -> None:
    """Takes `name` out of the journal again (a save that failed); removes a journal left empty."""
    names = [n for n in read_journal(root, journal) if n != name]
    if names:
        write_journal(root, journal, names)
    else:
        (root / journal).unlink(missing_ok=True)


def make_dirs(path: Path) -> List[Path]:
    """Creates `path` and its missing parents; returns those it created, parents first."""
    missing = []
    p = Path(os.path.abspath(path))
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    made = []
    for d in reversed(missing):
        try:
            d.mkdir()
            made.append(d)
        except FileExistsError:  # (made meanwhile by another rank: not ours to remove)
            pass
    if not path.is_dir():
        raise _core.IOError(f"mkdir {path}: not a directory")
    return made


def remove_made_dirs(made: List[Path]) -> None:
    """Removes the directories of make_dirs() that are empty, deepest first; others stay."""
    for d in reversed(made):
        try:
            d.rmdir()
        except OSError:  # something is in it (a user's file, another rank's part): it stays
            pass


def remove_part(d: Path) -> None:
    """Removes the strata checkpoint in `d` (the files its journal names), then `d` if that left
    it empty."""
    if not d.is_dir() or d.is_symlink():
        return
    _core.remove_checkpoint(str(d))
    try:
        d.rmdir()
    except OSError:  # something else is in it: it stays
        pass


def prune(root: Path, journal: str, keep: int, own: Callable[[str], bool]) -> List[str]:
    """Removes this optimizer's parts (`own(name)`) of the journal's step directories beyond the
    newest `keep`, and each step directory that this leaves empty; returns the names dropped
    from the journal. A step directory that cannot be pruned now (a part in use) stays named."""
    names = read_journal(root, journal)
    if keep <= 0 or len(names) <= keep:
        return []
    old, kept = names[:-keep], names[-keep:]
    dropped, stay = [], []
    for name in old:
        step_dir = root / name
        try:
            if step_dir.is_dir() and not step_dir.is_symlink():
                for child in step_dir.iterdir():
                    if own(child.name):
                        remove_part(child)
                try:
                    step_dir.rmdir()
                except OSError:
                    pass
            dropped.append(name)
        except _core.Error as e:
            warnings.warn(f"strata.torch: keep_checkpoints could not remove {step_dir} now ({e}); it is tried again "
                          f"at the next save")
            stay.append(name)
    write_journal(root, journal, stay + kept)
    return dropped
