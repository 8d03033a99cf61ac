"""Where a world's code runs: in this process (shipped worlds) or inside a bubblewrap sandbox (any
world, and always a generated one).

Both runners answer the same JSON commands (:func:`worldlib.run_command`) and round-trip every
answer through JSON, so a world behaves identically in either place. A sandboxed world's directory
holds only its Python files and ``worldlib.py``; the sandbox has no network, sees none of the
host's files but the read-only system and the Python interpreter, and each command is one process
with a timeout (a world that hangs is killed and reported, never waited on).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from horizonrl.errors import ConfigError, HorizonError
from horizonrl.sandbox.pyexec import PythonSandbox, SandboxCodeError
from horizonrl.worlds import worldlib
from horizonrl.worlds.package import WorldPackage

CALL_TIMEOUT_S = 20.0
"""Seconds one command to a sandboxed world may take."""


class WorldCodeError(SandboxCodeError):
    """The world's own code failed (raised, returned something that is not JSON, or timed out)."""


class WorldRunner(Protocol):
    async def call(self, cmd: dict[str, Any], timeout: float = CALL_TIMEOUT_S) -> dict[str, Any]: ...

    async def aclose(self) -> None: ...


_IMPORT_LOCK = threading.Lock()


def load_world_module(package: WorldPackage) -> ModuleType:
    """Import a world's ``world.py`` in this process (``worldlib`` resolves to ours)."""
    if package.generated:
        raise HorizonError(
            f"world {package.name!r} was generated: its code runs only sandboxed (sandbox: always)"
        )
    with _IMPORT_LOCK:
        sys.modules.setdefault("worldlib", worldlib)
        name = f"horizonrl_world_{package.name}_{abs(hash(str(package.root.resolve())))}"
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, package.root / "world.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            raise WorldCodeError(
                f"{package.root / 'world.py'}: does not import ({type(exc).__name__}: {exc})"
            ) from None
        if not (
            isinstance(getattr(module, "WORLD", None), type) and issubclass(module.WORLD, worldlib.World)
        ):
            raise WorldCodeError(f"{package.root / 'world.py'}: defines no WORLD (a worldlib.World subclass)")
        sys.modules[name] = module
        return module


class InProcessRunner:
    """Runs a trusted world's code in this process."""

    def __init__(self, package: WorldPackage) -> None:
        self.world_cls = load_world_module(package).WORLD

    async def call(self, cmd: dict[str, Any], timeout: float = CALL_TIMEOUT_S) -> dict[str, Any]:
        return self.call_sync(cmd)

    def call_sync(self, cmd: dict[str, Any]) -> dict[str, Any]:
        try:
            out = worldlib.run_command(self.world_cls, json.loads(json.dumps(cmd)))
            return json.loads(json.dumps(out))
        except (TypeError, ValueError) as exc:
            raise WorldCodeError(f"world code failed: {type(exc).__name__}: {exc}") from None

    async def aclose(self) -> None:
        return None


class SandboxRunner:
    """Runs a world's code inside one bubblewrap sandbox; each command is one process in it."""

    def __init__(self, package: WorldPackage, memory_mib: int = 256) -> None:
        self.package = package
        files: dict[str, Path | str] = {path.name: path for path in package.code_files()}
        files["worldlib.py"] = Path(worldlib.__file__)
        self._box = PythonSandbox(f"world {package.name!r}", files, memory_mib=memory_mib)

    async def call(self, cmd: dict[str, Any], timeout: float = CALL_TIMEOUT_S) -> dict[str, Any]:
        try:
            return await self._box.call("worldlib", cmd, timeout)
        except SandboxCodeError as exc:
            raise WorldCodeError(str(exc), exc.timed_out) from None

    async def aclose(self) -> None:
        await self._box.aclose()


def make_runner(package: WorldPackage, sandbox: str = "auto") -> WorldRunner:
    """``sandbox``: ``auto`` (shipped worlds in process, every other world sandboxed), ``always`` or
    ``never`` (refused for a generated world: a ConfigError)."""
    if sandbox == "never" and package.generated:
        raise ConfigError(f"world {package.name!r} was generated: its code runs only sandboxed")
    if sandbox == "always" or package.generated or (sandbox == "auto" and not package.shipped):
        return SandboxRunner(package)
    return InProcessRunner(package)
