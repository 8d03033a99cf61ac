"""Writes that survive a crash: a file or directory is either the old one or the new one, never half.
And the reading side of an append-only file: only whole lines, from where the last read stopped.

Every writer puts the new content in a hidden sibling (``.NAME.tmp-PID@HOST``), makes it durable,
and renames it over the destination (atomic on one filesystem); a failure removes the sibling and
leaves the destination as it was. A sibling left by a writer that was killed (SIGKILL, a lost machine)
is removed by the next writer of the same destination, and only when its owner, the process and host
in its name, is dead: a live writer's temporary file is never touched.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any


def fsync_file(path: Path) -> None:
    """Flush ``path``'s content to disk."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    """Make the renames inside ``path`` durable (POSIX only; a no-op elsewhere)."""
    if os.name != "posix":  # pragma: no cover - directories cannot be fsynced elsewhere
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: this machine's name as temporary files and run locks record it (no '/' or '@')
HOST = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "localhost"
#: ``.NAME.TAG-PID@HOST``, and the names without ``@HOST`` (or with ``-del``) earlier versions wrote
_TEMP = re.compile(
    r"\.(?P<name>.+)\.(?P<tag>tmp|old|del)-(?P<pid>\d+)(?:-del)?(?:@(?P<host>[A-Za-z0-9._-]+))?"
)


def temp_sibling(path: Path, tag: str = "tmp") -> Path:
    """The hidden sibling a new version of ``path`` is written to before it takes its place; its
    name holds the writer's pid and host (``.NAME.TAG-PID@HOST``) so that a leftover can be told
    from a live writer's file."""
    return path.with_name(f".{path.name}.{tag}-{os.getpid()}@{HOST}")


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this machine is running (a zombie, dead but not yet reaped, is not)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def owner_alive(pid: int, host: str | None) -> bool:
    """Whether the writer ``pid`` on ``host`` (None: this machine) may still be running; a process
    of another machine cannot be checked from here and counts as alive."""
    if host is not None and host != HOST:
        return True
    return pid_alive(pid)


def temp_owner(path: Path) -> tuple[int, str | None] | None:
    """The writer (pid, host or None) named by a temporary file's name, or None if it is not one."""
    match = _TEMP.fullmatch(Path(path).name)
    return (int(match["pid"]), match["host"]) if match else None


def remove_stale_temps(folder: Path, name: str | None = None) -> list[Path]:
    """Remove the temporary files and folders in ``folder`` (only those of the destination ``name``,
    if given) whose writer is dead; return what was removed. A live writer's are kept."""
    try:
        entries = list(Path(folder).iterdir())
    except OSError:  # no folder yet: nothing left over
        return []
    removed: list[Path] = []
    for entry in entries:
        match = _TEMP.fullmatch(entry.name)
        if match is None or (name is not None and match["name"] != name):
            continue
        if owner_alive(int(match["pid"]), match["host"]):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """``with atomic_path(out) as tmp: write(tmp)``: on success ``tmp`` (flushed to disk) replaces
    ``out``; on an exception ``out`` is untouched and ``tmp`` is removed."""
    path = Path(path)
    remove_stale_temps(path.parent, path.name)
    tmp = temp_sibling(path)
    try:
        yield tmp
        fsync_file(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def write_text_atomic(path: Path, text: str) -> None:
    """Replace ``path``'s content with ``text`` (UTF-8) atomically and durably."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_jsonl_atomic(path: Path, records: Iterable[Any]) -> None:
    """Write pydantic ``records`` one JSON object per line (tasks, traces) to ``path`` atomically,
    creating its directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, "".join(record.model_dump_json() + "\n" for record in records))


def replace_dir_atomic(dest: Path, write: Callable[[Path], object]) -> None:
    """``write(tmp)`` fills a hidden sibling directory of ``dest``, which then takes ``dest``'s
    place (the old one is renamed aside first and removed after). Leftovers of a killed writer of
    ``dest`` (``.NAME.tmp-*``, ``.NAME.old-*`` whose owner is dead) are removed first."""
    remove_stale_temps(dest.parent, dest.name)
    tmp = temp_sibling(dest)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write(tmp)
        old = temp_sibling(dest, "old")
        if dest.exists():
            os.replace(dest, old)
        os.replace(tmp, dest)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(dest.parent)


def read_appended_lines(path: Path, offset: int) -> tuple[list[bytes], int]:
    """The complete lines appended to ``path`` after byte ``offset``, and the offset after them.

    Writers append whole lines, so text after the last newline is a line still being written: it is
    left for the next read. A missing file has no lines yet."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    return data[:end].split(b"\n")[:-1], offset + end
