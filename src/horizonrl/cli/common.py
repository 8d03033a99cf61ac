"""What every ``horizon`` command shares: the consoles, the CONFIG/overrides/--checkpoint arguments,
one-line user errors (:func:`user_errors`, :func:`report`), checks of output paths and ports made
before any model loads, and the progress bars."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from horizonrl.errors import ConfigError, HorizonError, file_error, storage_error

console = Console()
err_console = Console(stderr=True)

ConfigArg = Annotated[Path, typer.Argument(help="YAML recipe, e.g. configs/calc.yaml.")]
OverridesArg = Annotated[
    list[str] | None,
    typer.Argument(help="Overrides as key.sub=value, e.g. agent.max_turns=6.", show_default=False),
]

CheckpointOpt = Annotated[
    Path | None,
    typer.Option(
        help="The policy to load: a run directory (its policy/), a checkpoints/step_N directory, a "
        "policy or PEFT adapter directory, or a model directory.",
    ),
]

AllowedHostOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--allowed-host",
        help="Another Host name clients reach the server by (repeatable; '*.example.org' for its "
        "subdomains, '*' for any). localhost, 127.0.0.1, ::1 and --host are always allowed.",
        show_default=False,
    ),
]


def allowed_host_options(values: list[str] | None) -> tuple[str, ...]:
    """The ``--allowed-host`` values, checked: one line naming a value that is not a host name."""
    from horizonrl.asgi import check_allowed_host

    try:
        return tuple(check_allowed_host(value) for value in values or [])
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


#: Most characters of one error line; what a user's input makes longer is cut, with the length said.
MAX_LINE = 1000


def one_line(message: object, limit: int = MAX_LINE) -> str:
    """``message`` as one line of at most ``limit`` characters (line breaks become spaces; a longer
    text is cut and says how long it was)."""
    text = " ".join(str(message).splitlines())
    if len(text) <= limit:
        return text
    return f"{text[: limit - 40]}... (cut: {len(text)} characters)"


def report(label: str, style: str, message: object) -> None:
    """One line on stderr: a styled label, then ``message`` as plain text (user text such as a path
    or a YAML snippet is never read as rich markup, the line is not wrapped, and it is cut at
    :data:`MAX_LINE` characters)."""
    err_console.print(Text.assemble((label, style), " ", one_line(message)), soft_wrap=True, highlight=False)


def say(text: str) -> None:
    """A line on stdout that holds user text (paths, names): printed as is, never read as markup, and
    never broken into lines (a path stays one string to copy or grep, whatever the terminal width)."""
    console.print(text, markup=False, soft_wrap=True)


#: OS errors about a file the user named; outside a reader that names the file's role, the CLI still
#: turns them into one line
_FILE_ERRORS = (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)


def _user_error(exc: BaseException) -> HorizonError | None:
    if isinstance(exc, HorizonError):
        return exc
    if isinstance(exc, _FILE_ERRORS) and exc.filename:
        return file_error(exc.filename, "file", exc)
    if isinstance(exc, UnicodeDecodeError):
        return HorizonError(f"an input file is not UTF-8 text ({exc.reason}); save it as UTF-8")
    if isinstance(exc, OSError):  # a full disk, a read-only file system: the user's to fix
        return storage_error(exc)
    return None


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Print user errors (HorizonError, and a named file that cannot be read) as one line on stderr
    and exit 2; Ctrl-C exits 130 quietly."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (HorizonError, OSError, UnicodeDecodeError) as exc:
            error = _user_error(exc)
            if error is None:
                raise
            report("error:", "bold red", error)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            report("interrupted:", "yellow", "records written so far are complete")
            raise typer.Exit(130) from None

    return wrapper


def check_output_file(path: Path, option: str) -> None:
    """Refuse an output file that could not be written, before any model loads."""
    if path.is_dir():
        raise ConfigError(
            f"{option} {str(path)!r} is a directory; give a file path, e.g. {path / 'out.jsonl'}"
        )
    folder = next(p for p in (path.parent, *path.parent.parents) if p.exists())
    if not folder.is_dir():
        raise ConfigError(f"{option} {str(path)!r}: {str(folder)!r} is a file, not a directory")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ConfigError(f"{option} {str(path)!r} cannot be written (permission denied); give another path")


def check_port(port: int) -> None:
    if not 1 <= port <= 65535:
        raise ConfigError(f"--port {port} is out of range; valid ports: 1-65535")


def check_port_free(host: str, port: int) -> None:
    """Refuse, before anything loads, a ``--port`` another process listens on (or a ``--host`` this
    machine cannot listen on): one line naming host:port and how to choose another."""
    from horizonrl.asgi import listening_socket

    check_port(port)
    listening_socket(host, port).close()


#: Upper bounds of the numeric options that multiply work: far above what a real run uses, low
#: enough that a typo or a hostile value cannot start an unbounded job.
MAX_TASKS = 100_000
MAX_WORKERS = 1024
MAX_SAMPLES = 1024
MAX_ROUNDS = 10_000


def check_range(option: str, value: float, low: float, high: float | None = None) -> None:
    """Refuse a numeric option outside ``[low, high]`` (or not a number) before any work starts: one
    line naming the option, its value and the bound it breaks."""
    if value != value:  # NaN
        raise ConfigError(f"{option}={value} is not a number")
    if value < low:
        raise ConfigError(f"{option}={value} is below the minimum of {low}")
    if high is not None and value > high:
        raise ConfigError(f"{option}={value} is over the limit of {high}")


def validated(model: Any, options: dict[str, str], **values: Any) -> Any:
    """``model(**values)`` for values that came from command-line options: a value the model refuses
    is one line naming its option (``options``: field name -> option) and the bound it breaks."""
    from pydantic import ValidationError

    from horizonrl.errors import bound_problem, shown_value

    try:
        return model(**values)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else ""
        option = options.get(field, field)
        problem = bound_problem(option, err)
        if problem is None:
            msg = str(err["msg"]).removeprefix("Value error, ")
            problem = f"{option}={shown_value(err.get('input'))}: {msg}"
        raise ConfigError(problem) from None


def _flags_show_no_type() -> None:
    """typer (0.29) labels every flag in --help ``<bool>``, as if it took a value; show flags bare."""
    from typer.core import TyperOption

    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None or getattr(shown, "flag_aware", False):
        return

    def display_type_rich(self: Any, ctx: Any) -> str | None:
        return None if self.is_flag else shown(self, ctx)

    display_type_rich.flag_aware = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_flags_show_no_type()


def episode_progress() -> Progress:
    """A bar of episodes (or instances, or candidates): done / total, successes, elapsed, status."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("success {task.fields[success]}"),
        TimeElapsedColumn(),
        TextColumn("{task.fields[status]}"),
        console=console,
    )


def training_progress() -> Progress:
    """Bars of a training run: done / total, a free-form info field, elapsed."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=console,
    )
