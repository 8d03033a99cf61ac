"""User-facing errors.

Every mistake a user can make (a config typo, a wrong model path, an unknown env, a bad data line)
raises a subclass of :class:`HorizonError` whose message names the culprit and what would be valid.
The CLI prints these as one line, without a traceback. A user file that cannot be read (missing, a
directory, no permission, not UTF-8) becomes such an error through :func:`read_user_text` or
:func:`file_error`, which name the file, its role and what is wrong.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any


class HorizonError(Exception):
    """Base class for errors caused by user input; the message is meant for the user."""


class ConfigError(HorizonError):
    """A config file or override is invalid (unknown key, bad value)."""


class DataError(HorizonError):
    """A data file (tasks, trajectories) is missing or has a bad line."""


class ModelLoadError(HorizonError):
    """A model or tokenizer could not be found or loaded."""


class UnknownEnvError(HorizonError):
    """No env is registered under the requested name."""


class CheckpointError(HorizonError):
    """A checkpoint is missing, corrupt or does not match the run."""


class TrainingError(HorizonError):
    """Training cannot go on safely (e.g. a non-finite loss); the message names the trajectories."""


class RunInUseError(HorizonError):
    """Another process is writing the run directory (it holds the run's lock)."""


class StorageError(HorizonError):
    """An output cannot be written: the disk is full, the file system read-only, no permission."""


#: what the user can do about each OS error that means "this place cannot be written"
_STORAGE_HINTS = {
    errno.ENOSPC: "free some space",
    errno.EDQUOT: "free some space (the disk quota is used up)",
    errno.EROFS: "mount it writable",
    errno.EACCES: "make it writable",
    errno.EPERM: "make it writable",
}
#: how a Rust library (safetensors, tokenizers) reports an OS error in its message
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def storage_errno(exc: BaseException) -> int | None:
    """The errno of a full disk, a read-only file system or a denied write behind ``exc`` (an
    OSError, an error it caused, or a library's error whose message carries ``(os error N)``)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        code = exc.errno if isinstance(exc, OSError) else None
        if code is None:
            match = _RUST_OS_ERROR.search(str(exc))
            code = int(match.group(1)) if match else None
        if code in _STORAGE_HINTS:
            return code
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return None


def storage_error(exc: BaseException, where: str | Path | None = None) -> StorageError | None:
    """The one-line user error for a write that failed for lack of space or permission (None for
    any other error): it names the file (``exc``'s, else ``where``: the output directory being
    written), the OS's reason and a fix."""
    code = storage_errno(exc)
    if code is None:
        return None
    filename = getattr(exc, "filename", None)
    path = filename or where
    place = f"cannot write {str(path)!r}" if path is not None else "a write failed"
    fix = _STORAGE_HINTS[code]
    if where is not None and (filename is None or Path(str(filename)).is_relative_to(where)):
        fix += " or choose another output_dir"
    return StorageError(f"{place}: {os.strerror(code)} ({errno.errorcode[code]}); {fix}")


def file_error(
    path: str | Path, what: str, exc: OSError | UnicodeDecodeError, error: type[HorizonError] | None = None
) -> HorizonError:
    """The one-line user error for a user file that cannot be read: missing, a directory, not
    readable, or not UTF-8 text (``what`` names the file's role, e.g. ``"task file"``)."""
    where = f"{what} {str(path)!r}"
    if isinstance(exc, UnicodeDecodeError):
        data = exc.object if isinstance(exc.object, bytes) else b""
        line = data[: exc.start].count(b"\n") + 1
        byte = f"0x{data[exc.start]:02x}" if data else "?"
        text = f"{where}: line {line} is not UTF-8 text (byte {byte}); save the file as UTF-8"
    elif isinstance(exc, FileNotFoundError):
        text = f"{where} does not exist"
    elif isinstance(exc, IsADirectoryError):
        text = f"{where} is a directory; give a file"
    elif isinstance(exc, NotADirectoryError):
        text = f"{where}: a part of the path is a file, not a directory"
    elif isinstance(exc, PermissionError):
        text = f"{where} cannot be read: permission denied"
    else:
        text = f"{where} cannot be read: {exc.strerror or exc}"
    return (error or DataError)(text)


def _refuse_device(path: str | Path, what: str, fd: int, error: type[HorizonError] | None) -> None:
    """A device named where a file belongs (/dev/zero, /dev/urandom: endless bytes) is a user error,
    not a read that never ends; a pipe (``<(command)``) stays readable."""
    import stat

    mode = os.fstat(fd).st_mode
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        raise (error or DataError)(f"{what} {str(path)!r} is a device, not a file; give a file")


def read_user_text(path: str | Path, what: str, error: type[HorizonError] | None = None) -> str:
    """The text of a user file (UTF-8); any read or decode failure is a user error naming the file."""
    try:
        with Path(path).open("rb") as f:
            _refuse_device(path, what, f.fileno(), error)
            data = f.read()
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise file_error(path, what, exc, error) from None


def iter_user_lines(
    path: str | Path, what: str, error: type[HorizonError] | None = None
) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` for each line of a user file (UTF-8), streamed; a file that cannot be
    opened, or a line that is not UTF-8, is a user error naming the file (and the line)."""
    try:
        f = Path(path).open("rb")  # noqa: SIM115 - closed below; only the open is the user's error
    except OSError as exc:
        raise file_error(path, what, exc, error) from None
    with f:
        _refuse_device(path, what, f.fileno(), error)
        for lineno, raw in enumerate(f, start=1):
            try:
                yield lineno, raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise (error or DataError)(
                    f"{path}:{lineno}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); save the {what} as UTF-8"
                ) from None


def brief(exc: BaseException, limit: int = 300) -> str:
    """A one-line summary of an exception (its type and first two lines) for user-facing messages."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = " ".join(lines[:2])
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return f"{type(exc).__name__}: {text}"


#: Most characters of a bad value echoed back in an error (the rest is cut, with its length said).
MAX_SHOWN_VALUE = 120


def shown_value(value: object) -> str:
    """``repr(value)`` for an error line, cut to :data:`MAX_SHOWN_VALUE` characters."""
    text = repr(value)
    if len(text) <= MAX_SHOWN_VALUE:
        return text
    return f"{text[:MAX_SHOWN_VALUE]}... ({len(text)} characters)"


#: pydantic's numeric-bound error types: the bound's name in the error's ctx, and how it is said
_BOUND_PHRASES = {
    "less_than_equal": ("le", "is over the limit of"),
    "less_than": ("lt", "must be below"),
    "greater_than_equal": ("ge", "is below the minimum of"),
    "greater_than": ("gt", "must be above"),
}


def bound_problem(key: str, err: Mapping[str, Any]) -> str | None:
    """A numeric bound a value broke (one of pydantic's ``ValidationError.errors()``), said as the
    limit it is: ``train.group_size=1000000 is over the limit of 1024`` (``key``: the config key or
    the option); None for any other problem."""
    ctx, value = err.get("ctx") or {}, err.get("input")
    if isinstance(value, float) and value != value:  # NaN passes no bound
        return f"{key}=nan is not a number" if ctx else None
    bound, phrase = _BOUND_PHRASES.get(str(err.get("type")), (None, ""))
    if bound is None or bound not in ctx:
        return None
    return f"{key}={shown_value(value)} {phrase} {ctx[bound]}"
