"""Reading a JSONL file that may still be growing: the byte offsets of its complete lines, found
incrementally.

A writer appends whole lines (``write_trajectories`` flushes each), so a reader sees at most one line
being written: the text after the last newline. That text is not a line yet and is left for the next
look. Each look reads only the bytes appended since the last one; a file that shrank or whose last
indexed bytes changed (rewritten or replaced) is read again from the start.

Every file is opened through :func:`horizonrl.run_paths.open_inside` with its run directory: a file
that leads out of the run (a symlink, ``..``) reads as missing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from horizonrl.run_paths import open_inside

#: how many bytes before the indexed end are compared on each look to notice a rewritten file
_MARK_BYTES = 64


@dataclass
class NewLines:
    """What one look at a file found: the complete lines appended since the last look with the byte
    offset of each, and whether the file was read again from the start (drop what came before)."""

    lines: list[bytes]
    offsets: list[int]
    reset: bool


@dataclass
class CompleteLines:
    """Where one file's complete lines end; :meth:`update` reads what was appended since.
    ``root``: the run directory the file must lie inside."""

    path: Path
    root: Path
    #: bytes of the file covered by complete lines (just past the last newline)
    end: int = 0
    inode: int | None = None
    mark: bytes = b""
    #: the file's modification time at the last look
    mtime: float | None = None

    def update(self) -> NewLines:
        """Read the bytes appended since the last call and return the lines they complete."""
        try:
            f = open_inside(self.root, self.path)  # closed below
        except OSError:  # vanished, or leads out of the run: nothing to read
            return self._reset_to_nothing()
        with f:
            st = os.fstat(f.fileno())
            reset = self.inode is not None and (st.st_ino != self.inode or st.st_size < self.end)
            if not reset and self.end:
                f.seek(self.end - len(self.mark))
                reset = f.read(len(self.mark)) != self.mark
            if reset:
                self.end, self.mark = 0, b""
            self.inode, self.mtime = st.st_ino, st.st_mtime
            if st.st_size <= self.end:
                return NewLines([], [], reset)
            f.seek(self.end)
            data = f.read()
        cut = data.rfind(b"\n") + 1  # text after the last newline is a line still being written
        if cut == 0:
            return NewLines([], [], reset)
        lines = data.split(b"\n")[:-1]
        offsets, pos = [], self.end
        for line in lines:
            offsets.append(pos)
            pos += len(line) + 1
        self.mark = (self.mark + data[max(0, cut - _MARK_BYTES) : cut])[-_MARK_BYTES:]
        self.end += cut
        return NewLines(lines, offsets, reset)

    def _reset_to_nothing(self) -> NewLines:
        had = self.end > 0
        self.end, self.inode, self.mark, self.mtime = 0, None, b"", None
        return NewLines([], [], had)


def read_span(root: Path, path: Path, offset: int, length: int) -> bytes:
    """``length`` bytes of ``path`` (inside ``root``) from ``offset`` (one line, as an index recorded it)."""
    with open_inside(root, path) as f:
        f.seek(offset)
        return f.read(length)


def first_complete_line(root: Path, path: Path, limit: int = 1 << 22) -> bytes | None:
    """The first complete line of a file inside ``root`` (None while there is none, past ``limit``
    bytes, or when it cannot be read)."""
    try:
        with open_inside(root, path) as f:
            buf = b""
            while len(buf) < limit:
                chunk = f.read(1 << 16)
                if not chunk:
                    return None
                buf += chunk
                cut = buf.find(b"\n")
                if cut >= 0:
                    return buf[:cut]
    except OSError:
        return None
    return None
