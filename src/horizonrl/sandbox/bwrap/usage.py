"""How much disk a sandbox's writable layer takes: what the agent wrote to /workspace (the overlay's
upper directory; the template below it is not counted), measured from the host."""

from __future__ import annotations

import os
from pathlib import Path

ENTRY_BYTES = 1024
"""The least one entry counts for, whatever its blocks: an inode is not free (a million empty files,
or the whiteouts of deleted template files, add up)."""

DIR_BYTES = 4096
"""What one directory counts for (a block; its entries count on their own)."""


class UsageError(Exception):
    """The layer could not be measured (a directory the agent made unreadable); the message says
    where, as a path inside the sandbox."""


def layer_bytes(upper: Path, inside: str, stop_after: int | None = None) -> int:
    """The bytes the files under ``upper`` take on disk: allocated blocks (a sparse file counts what
    it holds, not its apparent size), each entry at least :data:`ENTRY_BYTES`, a file with several
    hard links once, a directory :data:`DIR_BYTES`. Symbolic links are not followed. Counting stops
    once the total passes ``stop_after``. ``inside`` is where ``upper`` shows in the sandbox (for
    :class:`UsageError`)."""
    total = 0
    seen: set[int] = set()
    todo = [str(upper)]
    while todo:
        directory = todo.pop()
        try:
            entries = os.scandir(directory)
        except FileNotFoundError:
            continue  # removed meanwhile (the sandbox is closing, or the agent deleted it)
        except OSError as exc:
            where = inside + directory[len(str(upper)) :]
            raise UsageError(f"cannot read {where}: {exc.strerror or exc}") from None
        with entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):  # from the directory listing: no stat
                    todo.append(entry.path)
                    total += DIR_BYTES
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if st.st_nlink > 1:
                    if st.st_ino in seen:
                        continue
                    seen.add(st.st_ino)
                total += max(st.st_blocks * 512, ENTRY_BYTES)
                if stop_after is not None and total > stop_after:
                    return total
    return total
