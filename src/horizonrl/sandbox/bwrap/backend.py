"""The bubblewrap backend: its options, and creating sandboxes (a writable layer over the template,
a cgroup where there is one, the start-up chain of :mod:`.cmdline`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import uuid
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from horizonrl.sandbox.base import (
    SandboxCapacityError,
    SandboxError,
    SandboxLimits,
    SandboxSpec,
    SandboxUnavailableError,
)
from horizonrl.sandbox.bwrap.cgroup import SCOPE_HINT, Cgroup, CgroupError, delegated_cgroup
from horizonrl.sandbox.bwrap.cmdline import (
    SANDBOX_ENV,
    bwrap_argv,
    bwrap_base_args,
    overlay_options,
    start_argv,
)
from horizonrl.sandbox.bwrap.host import (
    check_tools,
    default_state_dir,
    ensure_private_dir,
    note,
    reap_stale,
    refuse_uvloop,
    rlimit_problem,
    rmtree,
    rootless_problem,
)
from horizonrl.sandbox.bwrap.sandbox import BwrapSandbox
from horizonrl.sandbox.bwrap.template import Template, prepare_template

START_TIMEOUT_S = 30.0
"""Seconds a sandbox may take to start before bwrap is killed and create fails."""


class BwrapOptions(BaseModel):
    """Host-side settings of the bubblewrap backend."""

    model_config = ConfigDict(extra="forbid")

    state_dir: str = Field(
        default_factory=lambda: default_state_dir(),
        description="Where each sandbox's writable layer lives (removed when the sandbox closes); "
        "a directory of this user's that nobody else can write (default: default_state_dir()).",
    )
    cache_dir: str = Field(
        default_factory=lambda: str(Path.home() / ".cache" / "horizonrl" / "templates"),
        description="Cached git layers of templates (one per template content).",
    )
    ro_binds: list[str] = Field(
        default_factory=list,
        description="Host paths bound read-only at the same path (e.g. a venv and its base interpreter).",
    )
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment of every command.")
    max_sandboxes: int = Field(512, ge=1, description="Live sandboxes this backend may hold at once.")
    cgroups: bool = Field(
        True, description="Limit memory and processes per sandbox with cgroups if possible."
    )


class BwrapBackend:
    """Creates bubblewrap sandboxes on this machine (see :mod:`horizonrl.sandbox.bwrap`)."""

    name = "bwrap"

    def __init__(self, options: BwrapOptions | None = None) -> None:
        self.options = options or BwrapOptions()
        self.rootless = os.geteuid() != 0
        self.mode: Literal["root", "rootless"] = "rootless" if self.rootless else "root"
        check_tools(self.rootless)
        if self.rootless and (problem := rootless_problem()):
            raise SandboxUnavailableError(problem)
        self.state_dir = ensure_private_dir(Path(self.options.state_dir))
        self.cache_dir = Path(self.options.cache_dir)
        self._delegated = self._rootless_cgroup() if self.rootless else None
        self._root_cgroups = not self.rootless and self._root_cgroup()
        self._templates: dict[str | None, Template] = {}
        self._template_locks: dict[str | None, asyncio.Lock] = {}
        self._live: dict[str, BwrapSandbox] = {}
        self._env = {**SANDBOX_ENV, **self.options.env}
        self._base_args = bwrap_base_args(self.options.ro_binds)
        cgroup_parents = (self._delegated,) if self._delegated else ()
        reap_stale(self.state_dir, None if not self.rootless else cgroup_parents)

    def _rootless_cgroup(self) -> Path | None:
        """The delegated cgroup rootless sandboxes go under, or None with a one-time note saying
        which limits apply instead."""
        parent, why = delegated_cgroup() if self.options.cgroups else (None, "cgroups are off")
        if parent is None:
            hint = "" if "systemd-run" in why or "no cgroup v2" in why else f"; {SCOPE_HINT}"
            note(
                f"rootless sandboxes (uid {os.geteuid()}) without a cgroup ({why}{hint}): memory is "
                "limited per process (RLIMIT_AS), processes per sandbox (RLIMIT_NPROC of its user "
                "namespace)"
            )
        return parent

    def _root_cgroup(self) -> bool:
        """Whether root's sandboxes get cgroups here (the hierarchy is prepared once); a one-time
        note says which limits apply instead where they do not."""
        why = Cgroup.root_hierarchy() if self.options.cgroups else "cgroups are off"
        if why:
            note(
                f"no cgroup for root's sandboxes ({why}): memory is limited per process (RLIMIT_AS) "
                "and the process limit is not enforced"
            )
        return not why

    @property
    def uses_cgroups(self) -> bool:
        """Whether every sandbox gets a cgroup (its creation refused when that fails)."""
        return self._delegated is not None if self.rootless else self._root_cgroups

    def unenforced_limits(self) -> list[str]:
        """The limits no mechanism enforces per sandbox here, each with why (root without cgroups:
        the process limit, as root is exempt from RLIMIT_NPROC); [] when every limit holds."""
        if self.rootless or self.uses_cgroups:
            return []
        return ["processes (root without cgroups: root is exempt from RLIMIT_NPROC)"]

    @property
    def live(self) -> int:
        return len(self._live)

    async def template(self, template: str | None) -> Template:
        """The prepared template (its git layer is built once, in a worker thread: the first
        sandbox over a large repository does not stall the event loop)."""
        key = None if template is None else str(Path(template).expanduser().resolve())
        if key not in self._templates:
            lock = self._template_locks.setdefault(key, asyncio.Lock())
            async with lock:
                if key not in self._templates:
                    self._templates[key] = await asyncio.to_thread(prepare_template, key, self.cache_dir)
        return self._templates[key]

    async def create(self, spec: SandboxSpec | None = None) -> BwrapSandbox:
        spec = spec or SandboxSpec()
        if len(self._live) >= self.options.max_sandboxes:
            raise SandboxCapacityError(
                f"{len(self._live)} sandboxes are open, the most this backend allows "
                f"(max_sandboxes={self.options.max_sandboxes}); close some or raise the cap"
            )
        refuse_uvloop()
        limits = spec.limits
        if problem := rlimit_problem(limits, self.rootless, self.uses_cgroups):
            raise SandboxUnavailableError(f"sandbox refused, its limits cannot be enforced: {problem}")
        template = await self.template(spec.template)
        sandbox_id = uuid.uuid4().hex[:16]
        directory = self.state_dir / f"{os.getpid()}-{sandbox_id}"
        upper, work, merged = directory / "upper", directory / "work", directory / "workspace"
        for d in (upper, work, merged):
            d.mkdir(parents=True)
        try:
            cgroup = self._cgroup(f"{os.getpid()}-{sandbox_id}", limits)
        except BaseException:
            rmtree(directory)
            raise
        info_r, info_w = os.pipe()
        overlay = overlay_options(template.lowers, upper, work, self.rootless)
        try:
            proc = await asyncio.create_subprocess_exec(
                *start_argv(limits, cgroup, overlay, merged, self.rootless),
                *bwrap_argv(self._base_args, limits, merged, info_w),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=(info_w,),
                env=self._env,
            )
        except BaseException:
            os.close(info_r)
            os.close(info_w)
            self._discard(directory, cgroup)
            raise
        os.close(info_w)
        try:
            info = await asyncio.wait_for(asyncio.to_thread(_read_json, info_r), START_TIMEOUT_S)
            holder = int(info["child-pid"])
            assert proc.stdout is not None
            if await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT_S) != b"ready\n":
                raise ValueError("the sandbox's holder process did not start")
        except (ValueError, KeyError, TimeoutError) as exc:
            stderr = b""
            with contextlib.suppress(ProcessLookupError):  # it may have exited already
                proc.kill()
            with contextlib.suppress(Exception):
                stderr = await asyncio.wait_for(proc.stderr.read(), 5) if proc.stderr else b""
                await proc.wait()
            self._discard(directory, cgroup)
            reason = " ".join(stderr.decode(errors="replace").split()) or str(exc)
            raise SandboxError(f"bubblewrap failed to start a sandbox ({self.mode} mode): {reason}") from None
        except BaseException:  # cancelled while starting: nothing of it is left behind
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            self._discard(directory, cgroup)
            raise
        _close_output_pipes(proc)
        sandbox = BwrapSandbox(
            sandbox_id,
            proc,
            holder,
            directory,
            template,
            limits,
            cgroup,
            self._env,
            self._forget,
            self.rootless,
        )
        self._live[sandbox_id] = sandbox
        return sandbox

    def _cgroup(self, name: str, limits: SandboxLimits) -> Cgroup | None:
        """The new sandbox's cgroup, or None where this backend uses none (rlimits apply, as the
        one-time note said). Where it does use cgroups and this one cannot be made or limited, the
        sandbox is refused (503): it never runs without the limits it asked for."""
        if not self.uses_cgroups:
            return None
        try:
            return Cgroup.create(name, limits, self._delegated)
        except CgroupError as exc:
            raise SandboxUnavailableError(
                f"sandbox refused, its limits cannot be enforced: {exc} "
                f"(limits: processes={limits.processes}, memory_mib={limits.memory_mib})"
            ) from None

    def _discard(self, directory: Path, cgroup: Cgroup | None) -> None:
        if cgroup is not None:
            cgroup.remove()
        rmtree(directory)

    def _forget(self, sandbox: BwrapSandbox) -> None:
        self._live.pop(sandbox.id, None)

    async def aclose(self) -> None:
        await asyncio.gather(*(s.close() for s in list(self._live.values())), return_exceptions=True)


def _read_json(fd: int) -> dict[str, Any]:
    """Read bwrap's ``--info-fd`` document: until it parses, or the pipe closes (bwrap failed)."""
    data = b""
    try:
        while chunk := os.read(fd, 65536):
            data += chunk
            with contextlib.suppress(ValueError):
                return json.loads(data)
    finally:
        os.close(fd)
    raise ValueError(f"no sandbox info from bwrap (got {data[:200]!r})")


def _close_output_pipes(proc: asyncio.subprocess.Process) -> None:
    """Close our ends of a started sandbox's stdout and stderr pipes: an idle sandbox then holds one
    file descriptor here (the holder's stdin), not three (an ordinary user's default soft limit of
    1024 open files would otherwise cap a process at ~330 sandboxes)."""
    transport = getattr(proc, "_transport", None)
    for fd in (1, 2):
        pipe = transport.get_pipe_transport(fd) if transport is not None else None
        if pipe is not None:
            pipe.close()
