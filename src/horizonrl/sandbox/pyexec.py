"""Untrusted Python in a bubblewrap sandbox, one JSON request per interpreter process.

A :class:`PythonSandbox` holds a few Python files in its ``/workspace`` (copied from the host, so
the code never sees anything else); :meth:`PythonSandbox.call` runs ``MODULE.main()`` in a fresh
interpreter with the request as JSON on stdin and reads ``{"ok": ...}`` or ``{"error": ...}`` from
stdout. No network, only the read-only system and the interpreter, bounded memory and processes,
and a timeout per call: code that raises, hangs or prints garbage is a :class:`SandboxCodeError`,
never a hang or a crash of the caller. Calls may run concurrently (each has its own request file).

Generated worlds (:mod:`horizonrl.worlds.runner`) and agent-code candidates
(:mod:`horizonrl.learn.agent_code`) run this way.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from horizonrl.errors import HorizonError


class SandboxCodeError(HorizonError):
    """The sandboxed code failed: it raised, answered something that is not JSON, or timed out."""

    def __init__(self, message: str, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


def python_in_sandbox() -> tuple[str, list[str]]:
    """The interpreter a sandbox runs code with, and the host paths it needs bound read-only."""
    exe = os.path.realpath(sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    binds = [] if prefix.startswith("/usr") else [prefix]
    return exe, binds


class PythonSandbox:
    """``files`` (name -> host path or text) staged into one sandbox; each call is one process."""

    def __init__(
        self, label: str, files: dict[str, Path | str], memory_mib: int = 256, processes: int = 16
    ) -> None:
        self.label = label
        self.files = dict(files)
        self.memory_mib = memory_mib
        self.processes = processes
        self._box: Any = None
        self._backend: Any = None
        self._stage: Path | None = None
        self._start_lock = asyncio.Lock()
        self._counter = itertools.count()

    async def _start(self) -> None:
        from horizonrl.sandbox.base import SandboxLimits, SandboxSpec
        from horizonrl.sandbox.bwrap.backend import BwrapBackend, BwrapOptions

        stage = Path(tempfile.mkdtemp(prefix=f"horizonrl-{self.label}-"))
        for name, source in self.files.items():
            if isinstance(source, Path):
                shutil.copy2(source, stage / name)
            else:
                (stage / name).write_text(source, encoding="utf-8")
        self._stage = stage
        exe, binds = python_in_sandbox()
        self._python = exe
        self._backend = BwrapBackend(BwrapOptions(ro_binds=binds, cgroups=False))
        limits = SandboxLimits(
            cpu_s=60,
            memory_mib=self.memory_mib,
            processes=self.processes,
            file_size_mib=16,
            tmp_mib=16,
            output_bytes=1 << 20,
        )
        self._box = await self._backend.create(SandboxSpec(template=str(stage), limits=limits))

    async def call(self, module: str, request: dict[str, Any], timeout: float) -> Any:
        """``module.main()`` on ``request``; its ``ok`` answer, or a SandboxCodeError."""
        async with self._start_lock:
            if self._box is None:
                await self._start()
        name = f".request-{next(self._counter)}.json"
        what = str(request.get("op", module))
        await self._box.write_file(name, json.dumps(request).encode())
        host = f"import sys; sys.path.insert(0, '/workspace'); import {module}; {module}.main()"
        try:
            res = await self._box.exec(f'{self._python} -I -c "{host}" < {name}', timeout=timeout)
        finally:
            if self._box is not None:
                await self._box.exec(f"rm -f {name}", timeout=10)
        if res.timed_out:
            raise SandboxCodeError(f"{self.label}: {what} timed out after {timeout:g} s", True)
        try:
            answer = json.loads(res.stdout)
        except ValueError:
            tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
            raise SandboxCodeError(f"{self.label}: {what} failed: {tail[0]}") from None
        if not isinstance(answer, dict) or ("ok" not in answer and "error" not in answer):
            raise SandboxCodeError(f"{self.label}: {what} answered {str(answer)[:80]!r}, not ok/error")
        if "error" in answer:
            raise SandboxCodeError(f"{self.label}: {what} failed: {answer['error']}")
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
