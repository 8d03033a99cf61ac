"""Other frameworks' environments, taken as they are: ``env.name: <framework>:<env id>`` in a recipe
(e.g. ``skyrl_gym:text2sql``, ``verifiers:<env id>``, ``textarena:<game id>``, ``gymnasium:<id>``)
runs the foreign env through an adapter onto this project's :class:`~horizonrl.envs.base.Env`.

Each framework is an optional extra, imported only when one of its envs is named. An adapter module
``horizonrl.envs.foreign.<framework>`` provides:

- ``EXTRA``: the pip extra that installs the framework (``pip install 'horizonrl[<EXTRA>]'``);
- ``IMPORT``: the framework's top-level module name;
- ``env_class(env_id: str) -> type[Env]``: the adapter class bound to that foreign env (raises
  :class:`~horizonrl.errors.UnknownEnvError` naming the valid ids for an unknown one);
- ``env_ids() -> list[str]``: the env ids the installed framework offers (for ``horizon envs``).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import importlib
import importlib.util
import ipaddress
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from horizonrl.envs.base import Env
from horizonrl.errors import DataError, UnknownEnvError, iter_user_lines

#: framework prefix -> adapter module (under this package)
FRAMEWORKS: dict[str, str] = {
    "skyrl_gym": "horizonrl.envs.foreign.skyrl_gym",
    "verifiers": "horizonrl.envs.foreign.verifiers",
    "textarena": "horizonrl.envs.foreign.textarena",
    "gymnasium": "horizonrl.envs.foreign.gymnasium",
}


def is_foreign(spec: str) -> bool:
    """Whether ``spec`` names a foreign framework's env (``<framework>:<env id>``)."""
    prefix, sep, _ = spec.partition(":")
    return bool(sep) and prefix in FRAMEWORKS


def _adapter(framework: str) -> ModuleType:
    """The adapter module of ``framework``, once its framework imports; UnknownEnvError names the
    extra to install otherwise."""
    module = importlib.import_module(FRAMEWORKS[framework])
    if importlib.util.find_spec(module.IMPORT) is None:
        raise UnknownEnvError(
            f"{framework} envs need the {module.IMPORT!r} package, which is not installed: "
            f"pip install 'horizonrl[{module.EXTRA}]'"
        )
    return module


@functools.cache
def foreign_env_class(spec: str) -> type[Env]:
    """The adapter class for ``<framework>:<env id>`` (one class per spec, made once)."""
    framework, _, env_id = spec.partition(":")
    if framework not in FRAMEWORKS:
        raise UnknownEnvError(
            f"unknown framework {framework!r} in env {spec!r}; valid: {', '.join(FRAMEWORKS)}"
        )
    if not env_id.strip():
        raise UnknownEnvError(f"env {spec!r} names no env id; give {framework}:<env id>")
    return _adapter(framework).env_class(env_id)


def installed_frameworks() -> dict[str, list[str]]:
    """For ``horizon envs``: each installed framework's env ids (a framework that is not installed is
    left out; one whose listing fails shows the reason as its only entry)."""
    found: dict[str, list[str]] = {}
    for framework in FRAMEWORKS:
        try:
            module = _adapter(framework)
        except UnknownEnvError:
            continue
        except Exception as exc:  # a broken adapter must not hide the others
            found[framework] = [f"({type(exc).__name__}: {exc})"]
            continue
        try:
            found[framework] = [f"{framework}:{env_id}" for env_id in module.env_ids()]
        except Exception as exc:  # a broken framework must not hide the others
            found[framework] = [f"({type(exc).__name__}: {exc})"]
    return found


# ---------------------------------------------------------------- helpers the adapters share
def read_rows(path: Path, what: str, hint: str = "") -> list[tuple[str, Any]]:
    """``(file:row, row)`` for each row of a JSONL or Parquet dataset file (``what`` names the file
    in errors; ``hint``, when given, ends a bad line's error); DataError in one line for a file that
    is not readable."""
    if path.suffix == ".parquet":
        try:
            import pandas as pd

            frame = pd.read_parquet(path)
        except ImportError as exc:
            raise DataError(
                f"{path}: reading Parquet needs pyarrow ({exc}); pip install pyarrow, or give JSONL"
            ) from None
        except Exception as exc:
            raise DataError(f"{path}: not a readable Parquet file ({' '.join(str(exc).split())})") from None
        records = json.loads(frame.to_json(orient="records"))
        return [(f"{path}:{i}", row) for i, row in enumerate(records, start=1)]
    rows = []
    for lineno, line in iter_user_lines(path, what):
        if line.strip():
            try:
                rows.append((f"{path}:{lineno}", json.loads(line)))
            except json.JSONDecodeError as exc:
                suffix = f"; {hint}" if hint else ""
                raise DataError(f"{path}:{lineno}: not JSON ({exc.msg}){suffix}") from None
    return rows


def import_file(path: Path, module_name: str) -> ModuleType:
    """The Python file ``path`` imported as module ``module_name`` (once; a second call returns the
    same module). FileNotFoundError when ``path`` is not a Python file; what the file raises, raised."""
    path = Path(path).resolve()
    known = sys.modules.get(module_name)
    if known is not None and Path(getattr(known, "__file__", "") or "").resolve() == path:
        return known
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None or not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # its classes resolve their module by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


_OFFLINE = threading.local()
_HOOK_LOCK = threading.Lock()
_hooked = False


def _is_local(host: object) -> bool:
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    if not isinstance(host, str) or host in ("", "localhost"):
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not getattr(_OFFLINE, "on", False):
        return
    if event in ("socket.getaddrinfo", "socket.gethostbyname"):
        host = args[0]
    elif event == "socket.connect":
        host = args[1][0] if isinstance(args[1], tuple) else None
    else:
        return
    if not _is_local(host):
        _OFFLINE.reached = str(host)
        raise OSError(
            errno.ENETUNREACH, f"no network while a foreign env loads its data (it asked for {host})"
        )


@contextlib.contextmanager
def offline() -> Iterator[None]:
    """No connection beyond this machine from this thread while the block runs, so a foreign
    framework's loader cannot download a dataset at run time (a Python audit hook, installed once;
    other threads are untouched, subprocesses are not covered). :func:`reached` names the host a
    refused call asked for."""
    global _hooked
    with _HOOK_LOCK:
        if not _hooked:
            sys.addaudithook(_audit)
            _hooked = True
    _OFFLINE.on, _OFFLINE.reached = True, None
    try:
        yield
    finally:
        _OFFLINE.on = False


def reached() -> str | None:
    """The host the last :func:`offline` block of this thread refused a connection to, if any."""
    return getattr(_OFFLINE, "reached", None)
