"""Where a world's code runs: in this process (shipped worlds) or inside a bubblewrap sandbox (any
world, and always a generated one).

Both runners answer the same JSON commands (:func:`worldlib.run_command`) and round-trip every
answer through JSON, so a world behaves identically in either place. A sandboxed world's directory
holds only its Python files and ``worldlib.py``; the sandbox has no network, sees none of the
host's files but the read-only system and the Python interpreter, and each command is one process
with a timeout (a world that hangs is killed and reported, never waited on).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from horizonrl.errors import ConfigError, HorizonError
from horizonrl.worlds import worldlib
from horizonrl.worlds.package import WorldPackage

CALL_TIMEOUT_S = 20.0
"""Seconds one command to a sandboxed world may take."""


class WorldCodeError(HorizonError):
    """The world's own code failed (raised, returned something that is not JSON, or timed out)."""

    def __init__(self, message: str, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


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


_HOST = "import sys; sys.path.insert(0, '/workspace'); import worldlib; worldlib.main()"


def python_in_sandbox() -> tuple[str, list[str]]:
    """The interpreter a sandbox runs a world with, and the host paths it needs bound read-only."""
    exe = os.path.realpath(sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    binds = [] if prefix.startswith("/usr") else [prefix]
    return exe, binds


class SandboxRunner:
    """Runs a world's code inside one bubblewrap sandbox; each command is one process in it."""

    def __init__(self, package: WorldPackage, memory_mib: int = 256) -> None:
        self.package = package
        self.memory_mib = memory_mib
        self._box: Any = None
        self._backend: Any = None
        self._stage: Path | None = None
        self._lock = asyncio.Lock()

    async def _start(self) -> None:
        from horizonrl.sandbox.base import SandboxLimits, SandboxSpec
        from horizonrl.sandbox.bwrap.backend import BwrapBackend, BwrapOptions

        self._stage = Path(tempfile.mkdtemp(prefix=f"horizonrl-world-{self.package.name}-"))
        for path in self.package.code_files():
            shutil.copy2(path, self._stage / path.name)
        shutil.copy2(worldlib.__file__, self._stage / "worldlib.py")
        exe, binds = python_in_sandbox()
        self._python = exe
        self._backend = BwrapBackend(BwrapOptions(ro_binds=binds, cgroups=False))
        limits = SandboxLimits(
            cpu_s=60,
            memory_mib=self.memory_mib,
            processes=16,
            file_size_mib=16,
            tmp_mib=16,
            output_bytes=1 << 20,
        )
        self._box = await self._backend.create(SandboxSpec(template=str(self._stage), limits=limits))

    async def call(self, cmd: dict[str, Any], timeout: float = CALL_TIMEOUT_S) -> dict[str, Any]:
        async with self._lock:
            if self._box is None:
                await self._start()
            await self._box.write_file("cmd.json", json.dumps(cmd).encode())
            res = await self._box.exec(f'{self._python} -I -c "{_HOST}" < cmd.json', timeout=timeout)
        if res.timed_out:
            raise WorldCodeError(
                f"world {self.package.name!r}: {cmd['op']} timed out after {timeout:g} s", True
            )
        try:
            answer = json.loads(res.stdout)
        except ValueError:
            tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
            raise WorldCodeError(f"world {self.package.name!r}: {cmd['op']} failed: {tail[0]}") from None
        if "error" in answer:
            raise WorldCodeError(f"world {self.package.name!r}: {cmd['op']} failed: {answer['error']}")
        return answer["ok"]

    async def aclose(self) -> None:
        if self._box is not None:
            await self._box.close()
            self._box = None
        if self._backend is not None:
            await self._backend.aclose()
            self._backend = None
        if self._stage is not None:
            shutil.rmtree(self._stage, ignore_errors=True)
            self._stage = None


def make_runner(package: WorldPackage, sandbox: str = "auto") -> WorldRunner:
    """``sandbox``: ``auto`` (shipped worlds in process, every other world sandboxed), ``always`` or
    ``never`` (refused for a generated world: a ConfigError)."""
    if sandbox == "never" and package.generated:
        raise ConfigError(f"world {package.name!r} was generated: its code runs only sandboxed")
    if sandbox == "always" or package.generated or (sandbox == "auto" and not package.shipped):
        return SandboxRunner(package)
    return InProcessRunner(package)
