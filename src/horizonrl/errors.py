"""User-facing errors.

Every mistake a user can make (a config typo, a wrong model path, an unknown env, a bad data line)
raises a subclass of :class:`HorizonError` whose message names the culprit and what would be valid.
The CLI prints these as one line, without a traceback. A user file that cannot be read (missing, a
directory, no permission, not UTF-8) becomes such an error through :func:`read_user_text` or
:func:`file_error`, which name the file, its role and what is wrong.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path


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


def read_user_text(path: str | Path, what: str, error: type[HorizonError] | None = None) -> str:
    """The text of a user file (UTF-8); any read or decode failure is a user error naming the file."""
    try:
        data = Path(path).read_bytes()
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
