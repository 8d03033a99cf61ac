"""Where `horizon train --overwrite` puts the run it replaces: ``output_dir/.trash``.

The old run directory is renamed (atomically, on the same filesystem) to
``output_dir/.trash/<name>-<UTC time>``, never deleted in place, so a mistaken ``--overwrite`` can be
undone with one ``mv``. The trash keeps the :data:`KEEP` most recently moved runs; older entries are
removed when another run is moved in. Nothing outside ``output_dir/.trash`` is ever removed here.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from horizonrl.errors import ConfigError

TRASH_DIR = ".trash"
#: runs kept in output_dir/.trash (the most recently moved ones)
KEEP = 3


def trash_dir(output_dir: Path) -> Path:
    """``output_dir/.trash``, created if needed; a ConfigError if it is a link or not a directory."""
    trash = Path(output_dir) / TRASH_DIR
    if trash.is_symlink() or (trash.exists() and not trash.is_dir()):
        raise ConfigError(f"{str(trash)!r} must be a plain directory (it holds runs replaced by --overwrite)")
    trash.mkdir(parents=True, exist_ok=True)
    return trash


def move_to_trash(run_dir: Path, output_dir: Path, keep: int = KEEP) -> Path:
    """Rename ``run_dir`` into ``output_dir/.trash`` and prune the trash to ``keep`` runs; return the
    run's new path. A rename that fails (another filesystem, permissions) deletes nothing."""
    trash = trash_dir(output_dir)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    dest = trash / f"{run_dir.name}-{stamp}"
    n = 1
    while dest.exists() or dest.is_symlink():
        n += 1
        dest = trash / f"{run_dir.name}-{stamp}-{n}"
    try:
        os.rename(run_dir, dest)
    except OSError as exc:
        raise ConfigError(
            f"--overwrite: could not move {str(run_dir)!r} aside to {str(dest)!r} ({exc.strerror}); "
            "nothing was removed"
        ) from None
    os.utime(dest, follow_symlinks=False)  # its age in the trash counts from now
    prune_trash(trash, keep)
    return dest


def prune_trash(trash: Path, keep: int = KEEP) -> list[Path]:
    """Remove all but the ``keep`` most recently moved entries of ``trash``; return the removed ones."""
    entries = sorted(trash.iterdir(), key=lambda p: p.lstat().st_mtime, reverse=True)
    removed = entries[keep:]
    for entry in removed:
        if entry.is_symlink() or not entry.is_dir():
            entry.unlink()
        else:
            shutil.rmtree(entry)
    return removed
