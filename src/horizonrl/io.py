"""Writes that survive a crash: a file or directory is either the old one or the new one, never half.
And the reading side of an append-only file: only whole lines, from where the last read stopped.

Every writer puts the new content in a hidden sibling (``.NAME.tmp-PID``), makes it durable, and
renames it over the destination (atomic on one filesystem); a failure removes the sibling and leaves
the destination as it was.
"""

from __future__ import annotations

import contextlib
import os
import shutil
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


def temp_sibling(path: Path, tag: str = "tmp") -> Path:
    """The hidden sibling a new version of ``path`` is written to before it takes its place."""
    return path.with_name(f".{path.name}.{tag}-{os.getpid()}")


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """``with atomic_path(out) as tmp: write(tmp)``: on success ``tmp`` (flushed to disk) replaces
    ``out``; on an exception ``out`` is untouched and ``tmp`` is removed."""
    path = Path(path)
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
    place (the old one is renamed aside first and removed after)."""
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
