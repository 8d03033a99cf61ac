"""Files inside a run directory, and only inside it: the one way a server (the viewer, the feedback
API) or a stream reads or appends a file of a run directory.

A path is inside when its real path — every ``..`` and every symlink resolved — lies under the run
directory's real path. :func:`open_inside` checks that, opens the resolved path with ``O_NOFOLLOW``
(a symlink put in its place after the check is refused, not followed) and, where ``/proc`` shows
what was opened, checks the open file once more (a directory swapped for a link in between). A
symlink that stays inside is fine (``eval/last.jsonl -> step_000010.jsonl``); one that leads out is
:class:`OutsideRunDir`, an ``OSError`` (readers that skip an unreadable file skip it) and a user
error (one line on the CLI).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import BinaryIO

from horizonrl.errors import DataError


class OutsideRunDir(DataError, PermissionError):
    """A path of a run directory that leads outside it (``..``, an absolute path or a symlink)."""


def _real(path: str | Path) -> Path:
    return Path(os.path.realpath(path))


def _outside(root: str | Path, path: str | Path) -> OutsideRunDir:
    try:
        shown = str(Path(path).relative_to(root))
    except ValueError:
        shown = str(path)
    return OutsideRunDir(
        f"{shown!r} leads outside the run directory {str(root)!r} (a symlink or '..'); it is not followed"
    )


def resolve_inside(root: str | Path, path: str | Path) -> Path:
    """The real path of ``path`` (a path below ``root``, as ``root / "feedback.jsonl"``), every
    symlink followed; :class:`OutsideRunDir` when it is not under ``root``'s real path."""
    real_root = _real(root)
    target = _real(path)
    if target != real_root and not target.is_relative_to(real_root):
        raise _outside(root, path)
    return target


def is_inside(root: str | Path, path: str | Path) -> bool:
    """Whether ``path`` resolves to a place under ``root`` (see :func:`resolve_inside`)."""
    try:
        resolve_inside(root, path)
    except OutsideRunDir:
        return False
    return True


def _check_opened(fd: int, root: str | Path, path: str | Path) -> None:
    """Refuse the open file when what was opened lies outside ``root`` after all (Linux: ``/proc``)."""
    try:
        opened = os.readlink(f"/proc/self/fd/{fd}").removesuffix(" (deleted)")
    except OSError:  # no /proc here: the O_NOFOLLOW open stands alone
        return
    if not Path(opened).is_relative_to(_real(root)):
        raise _outside(root, path)


def open_inside(root: str | Path, path: str | Path, *, append: bool = False) -> BinaryIO:
    """``path`` opened for reading (``"rb"``), or for appending (unbuffered ``"ab"``, created with
    mode 0644 when missing: each ``write`` is one ``O_APPEND`` write), after checking that it lies
    inside ``root``. Raises :class:`OutsideRunDir`, or the ``OSError`` of the open."""
    target = resolve_inside(root, path)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT if append else os.O_RDONLY
    try:
        fd = os.open(target, flags | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a symlink appeared after the check
            raise _outside(root, path) from None
        raise
    try:
        _check_opened(fd, root, path)
        return os.fdopen(fd, "ab", buffering=0) if append else os.fdopen(fd, "rb")  # type: ignore[return-value]
    except BaseException:  # fdopen does not close an fd it refuses (a directory)
        os.close(fd)
        raise
