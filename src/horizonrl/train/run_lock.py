"""One writer per run directory: the run's lock, held for the whole life of a command that writes it.

Every command that writes a run directory (``horizon train``, ``stream``, ``evolve train``,
``learn``, ``malt``, ``sft``, ``dpo``) holds an advisory lock (``fcntl.flock``) on
``RUN_DIR/.writer.lock`` from its start, before any model loads, to its end. The lock file says who
holds it (pid, host, command, start time), so a second writer of the same run is refused with one
line naming the holder; ``--overwrite`` of a run another process holds is refused the same way, since
the lock is taken before anything is moved. The kernel drops the lock when its holder dies, however
it dies, so ``--resume`` after a crash or a SIGKILL takes it at once.

Taking the lock is also the check that the run directory can be written: it creates the directory
and writes and fsyncs the lock file, so a full disk or a read-only output_dir is said in one line
before the model loads. A write that fails later for the same reasons becomes the same one line.

The lock is re-entrant within a process (a command that holds it may run another that takes it
again), and the lock file is removed when the last holder lets go, with any directory taking it had
to create (a refused command leaves the output_dir as it was).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from horizonrl.errors import HorizonError, RunInUseError, storage_errno, storage_error
from horizonrl.io import HOST, fsync_dir

LOCK_FILE = ".writer.lock"
#: OS errors turned into one line wherever they come from; EACCES/EPERM only for a file of the run
_ALWAYS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class _Held:
    """The lock this process holds on one run directory."""

    run_dir: Path
    fd: int
    created: list[Path] = field(default_factory=list)  # directories made to take the lock, outermost first
    depth: int = 1


#: resolved run directory -> the lock this process holds on it
_HELD: dict[str, _Held] = {}


def _key(run_dir: Path) -> str:
    return os.path.realpath(run_dir)


def _command() -> str:
    """The command this process runs, as a user typed it (``horizon malt sample``)."""
    if not sys.argv or not sys.argv[0]:
        return "python"
    program = Path(sys.argv[0]).name
    names = {"__main__.py": "horizon", "horizon": "horizon", "-c": "python -c"}
    words = [names.get(program, program)]
    for arg in sys.argv[1:3]:
        if not arg.replace("-", "").replace("_", "").isalnum() or arg.startswith("-"):
            break
        words.append(arg)
    return " ".join(words)


def read_holder(run_dir: Path) -> dict[str, Any]:
    """What the lock file of ``run_dir`` says about its holder (empty when unreadable)."""
    try:
        data = json.loads((Path(run_dir) / LOCK_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _in_use(run_dir: Path) -> RunInUseError:
    holder: dict[str, Any] = {}
    for _ in range(20):  # the holder writes who it is right after taking the lock
        holder = read_holder(run_dir)
        if holder:
            break
        time.sleep(0.05)
    who = f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}"
    if holder.get("command"):
        who += f" ({holder['command']}"
        who += f", since {holder['started']})" if holder.get("started") else ")"
    return RunInUseError(
        f"run directory {str(run_dir)!r} is being written by another process, {who}: wait for it to "
        "end or stop it, or choose another name (name=...); --overwrite and --resume need it stopped too"
    )


def _make_dirs(run_dir: Path) -> list[Path]:
    """Create ``run_dir`` and its missing parents; return the ones created, outermost first."""
    missing = []
    for path in (run_dir, *run_dir.parents):
        if path.is_dir():
            break
        missing.append(path)
    created = []
    for path in reversed(missing):
        try:
            path.mkdir()
        except FileExistsError:
            if not path.is_dir():
                raise
            continue
        created.append(path)
    return created


def _open_locked(run_dir: Path) -> int:
    """Open ``run_dir``'s lock file and take its lock (never waiting): the fd, or RunInUseError. A
    lock file removed or replaced by its last holder while this one waited for it is opened again."""
    path = run_dir / LOCK_FILE
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _in_use(run_dir) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            now = os.stat(path)
        except FileNotFoundError:
            now = None
        mine = os.fstat(fd)
        if now is not None and (now.st_ino, now.st_dev) == (mine.st_ino, mine.st_dev):
            return fd
        os.close(fd)  # the lock was on a file its holder has removed since: take the new one


def _write_holder(fd: int, run_dir: Path) -> None:
    """Say who holds the lock, durably: this write is also the check that the run can be written."""
    holder = {
        "pid": os.getpid(),
        "host": HOST,
        "command": _command(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    data = (json.dumps(holder) + "\n").encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    os.fsync(fd)
    fsync_dir(run_dir)


def _acquire(run_dir: Path) -> _Held:
    created = _make_dirs(run_dir)
    try:
        fd = _open_locked(run_dir)
        try:
            _write_holder(fd, run_dir)
        except BaseException:
            _unlock(run_dir, fd)
            raise
    except BaseException:
        _remove_created(created)
        raise
    return _Held(run_dir, fd, created)


def _unlock(run_dir: Path, fd: int) -> None:
    """Remove the lock file (if it is still this lock's) and let go of the lock."""
    path = run_dir / LOCK_FILE
    with contextlib.suppress(OSError):
        now, mine = os.stat(path), os.fstat(fd)
        if (now.st_ino, now.st_dev) == (mine.st_ino, mine.st_dev):
            path.unlink()
    os.close(fd)


def _remove_created(created: list[Path]) -> None:
    for path in reversed(created):  # only if still empty: what was written stays
        with contextlib.suppress(OSError):
            path.rmdir()


def _writable_error(exc: BaseException, run_dir: Path) -> HorizonError | None:
    """One line for a write the disk or its permissions refused (see :func:`storage_error`); a
    denied permission only on a file of the run (elsewhere it may be a read, said by its reader)."""
    code = storage_errno(exc)
    if code is None:
        return None
    if code not in _ALWAYS:
        filename = getattr(exc, "filename", None)
        if filename is None or not Path(_key(Path(str(filename)))).is_relative_to(_key(run_dir)):
            return None
    return storage_error(exc, run_dir)


@contextlib.contextmanager
def hold_run_dir(run_dir: Path) -> Iterator[Path]:
    """Hold ``run_dir``'s lock for the block (creating the directory): a RunInUseError naming the
    holder if another process holds it, a StorageError if it cannot be written. Inside the block, a
    write that fails for a full disk, a read-only file system or a denied permission becomes a
    StorageError naming the file."""
    run_dir = Path(run_dir)
    key = _key(run_dir)
    held = _HELD.get(key)
    try:
        if held is None:
            held = _HELD[key] = _acquire(run_dir)
        else:
            held.depth += 1
    except HorizonError:
        raise
    except Exception as exc:
        error = storage_error(exc, run_dir)
        if error is None:
            raise
        raise error from None
    try:
        yield run_dir
    except HorizonError:
        raise
    except Exception as exc:
        error = _writable_error(exc, run_dir)
        if error is None:
            raise
        raise error from None
    finally:
        held.depth -= 1
        if held.depth == 0:
            del _HELD[key]
            _unlock(held.run_dir, held.fd)
            _remove_created(held.created)


def holds_run_dir(fn: F) -> F:
    """Decorate ``fn(config, ...)`` to run holding the lock of ``config.run_dir``."""

    @functools.wraps(fn)
    def wrapper(config: Any, *args: Any, **kwargs: Any) -> Any:
        with hold_run_dir(config.run_dir):
            return fn(config, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def relock_after_move(run_dir: Path, moved: Path) -> None:
    """``run_dir``, whose lock this process holds, was moved to ``moved`` (``--overwrite``): lock the
    fresh ``run_dir`` (created) and drop the moved run's lock file. Another process that took the
    fresh directory in the moment between is refused here (RunInUseError), the old run kept."""
    key = _key(run_dir)
    held = _HELD.get(key)
    run_dir.mkdir(parents=True, exist_ok=True)
    if held is None:
        return
    fd = _open_locked(run_dir)
    try:
        _write_holder(fd, run_dir)
    except BaseException:
        _unlock(run_dir, fd)
        raise
    _unlock(Path(moved), held.fd)
    held.fd, held.created = fd, []
