"""The sandbox server's state, apart from HTTP: the sandboxes it holds (id -> sandbox), the cap,
named templates, the idle reaper, the counters ``/metrics`` reports, and commands of any length; the
server's limits (:mod:`.limits`: ceilings, output) and workspace quota (:mod:`.quota`) applied."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from horizonrl.sandbox.base import (
    WORKSPACE,
    ExecRequest,
    ExecResult,
    Sandbox,
    SandboxBackend,
    SandboxCapacityError,
    SandboxInfo,
    SandboxLimitError,
    SandboxLimits,
    SandboxNotFoundError,
    SandboxPathError,
    SandboxSpec,
    SandboxUnavailableError,
)
from horizonrl.sandbox.server.limits import ServerLimits, cap_output
from horizonrl.sandbox.server.quota import POLL_S, SWEEP_S, WorkspaceQuota

log = logging.getLogger(__name__)

# --- long commands ------------------------------------------------------------------------------

ARGV_COMMAND_BYTES = 64 * 1024
"""Commands up to this many bytes (UTF-8) run as ``/bin/sh -c CMD``; longer ones are written to a
file in the workspace first (Linux refuses any one argument over 128 KiB: ``E2BIG``)."""

_EVAL_FILE = (
    "__horizonrl_cmd=$(cat {path} && echo .) && rm -f {path} && "
    'eval "unset __horizonrl_cmd; ${{__horizonrl_cmd%.}}"'
)
"""Runs the command in file ``{path}`` as ``sh -c`` would (same shell, ``$0``, stdin, exit status),
removing the file before the command starts. ``echo .`` keeps trailing newlines from ``$(...)``."""


async def run_command(sandbox: Sandbox, cmd: str, timeout: float) -> ExecResult:
    """``sandbox.exec(cmd, timeout)``, for a command of any length: one over
    :data:`ARGV_COMMAND_BYTES` goes through a file in the workspace (removed before it runs)."""
    script = cmd.encode("utf-8", "surrogateescape")  # as the command line would carry it
    if len(script) <= ARGV_COMMAND_BYTES:
        return await sandbox.exec(cmd, timeout)
    path = f"{WORKSPACE}/.horizonrl-command-{secrets.token_hex(8)}"
    await sandbox.write_file(path, script)
    try:
        return await sandbox.exec(_EVAL_FILE.format(path=path), timeout)
    finally:  # the command removes it first thing, unless it never started (killed, timed out)
        with contextlib.suppress(Exception):
            await sandbox.exec(f"rm -f {path}", 30.0)


# --- state --------------------------------------------------------------------------------------


@dataclass
class _Held:
    """One sandbox the server holds, with what the server knows about it."""

    sandbox: Sandbox
    template: str | None
    limits: SandboxLimits
    created_at: float
    last_used_at: float
    busy: int = 0  # requests using it right now: never reaped while > 0

    def touch(self) -> None:
        self.last_used_at = time.time()

    def info(self, backend: str) -> SandboxInfo:
        return SandboxInfo(
            id=self.sandbox.id,
            backend=backend,
            template=self.template,
            created_at=self.created_at,
            last_used_at=self.last_used_at,
            limits=self.limits,
        )


class SandboxPool:
    """The server's state: the sandboxes it holds (id -> sandbox), the cap, the idle reaper's
    policy and the counters ``/metrics`` reports. Handlers only call into this class."""

    def __init__(
        self,
        backend: SandboxBackend,
        *,
        max_sandboxes: int = 256,
        idle_ttl_s: float = 900.0,
        templates_dir: str | None = None,
        limits: ServerLimits | None = None,
    ) -> None:
        """``limits``: the ceilings and workspace quotas (default :class:`ServerLimits`'s defaults)."""
        if max_sandboxes < 1:
            raise ValueError(f"max_sandboxes must be at least 1, got {max_sandboxes}")
        if idle_ttl_s <= 0:
            raise ValueError(f"idle_ttl_s must be positive, got {idle_ttl_s}")
        self.backend = backend
        self.max_sandboxes = max_sandboxes
        self.idle_ttl_s = idle_ttl_s
        self.templates_dir = Path(templates_dir).expanduser().resolve() if templates_dir else None
        self.limits = limits or ServerLimits()
        self.quota = WorkspaceQuota(self.limits.workspace_mib, self.limits.total_workspace_mib)
        self.held: dict[str, _Held] = {}
        self._creating = 0  # creations in flight: they count against the cap
        self.created = self.reaped = self.rejected = self.refused_limits = 0
        self.exec_total = self.exec_timeouts = self.exec_cancelled = 0
        self.exec_seconds = 0.0

    @property
    def live(self) -> int:
        return len(self.held)

    # templates

    def template_names(self) -> list[str]:
        """The templates clients may name: the directories directly under ``templates_dir``."""
        if self.templates_dir is None or not self.templates_dir.is_dir():
            return []
        return sorted(
            p.name for p in self.templates_dir.iterdir() if p.is_dir() and not p.name.startswith(".")
        )

    def resolve_template(self, name: str | None) -> str | None:
        """The directory of template ``name`` (None: an empty workspace); a name that is a path
        (absolute, with ``/`` or ``..``) or that names no template is refused with the valid names."""
        if name is None:
            return None
        if self.templates_dir is None:
            raise SandboxPathError(
                f"sandbox template {name!r} cannot be used: this server was started without a "
                "templates directory; omit template (null) for an empty workspace"
            )
        available = self.template_names()
        listing = ", ".join(repr(n) for n in available) or "none"
        if name in ("", ".", "..") or any(c in name for c in "/\\\0"):
            raise SandboxPathError(
                f"sandbox template {name!r} must be the plain name of a template, not a path; "
                f"available templates: {listing}"
            )
        if name not in available:
            raise SandboxPathError(f"unknown sandbox template {name!r}; available templates: {listing}")
        return str(self.templates_dir / name)

    # lifecycle

    async def create(self, spec: SandboxSpec) -> SandboxInfo:
        """Open a sandbox from ``spec`` (template by name), unless the cap is reached, a limit is
        above its ceiling (422), the workspaces are at the server's quota (429) or a limit cannot be
        enforced here (503)."""
        directory = self.resolve_template(spec.template)
        try:
            limits = self.limits.limits_for(spec.limits)
        except SandboxLimitError:
            self.refused_limits += 1
            raise
        self._check_enforced()
        try:
            self.quota.check_room()
        except SandboxCapacityError:
            self.rejected += 1
            raise
        open_now = len(self.held) + self._creating
        if open_now >= self.max_sandboxes:
            self.rejected += 1
            raise SandboxCapacityError(
                f"{open_now} sandboxes are open and this server allows at most {self.max_sandboxes} "
                "(max_sandboxes); delete some (DELETE /sandboxes/{id}) or start the server with a higher cap"
            )
        self._creating += 1
        try:
            sandbox = await self.backend.create(
                spec.model_copy(update={"template": directory, "limits": limits})
            )
            try:
                self.quota.admit(sandbox, self.backend.name)
            except BaseException:
                await sandbox.close()
                raise
        except SandboxCapacityError:
            self.rejected += 1
            raise
        except SandboxUnavailableError:
            self.refused_limits += 1
            raise
        finally:
            self._creating -= 1
        now = time.time()
        self.held[sandbox.id] = _Held(sandbox, spec.template, limits, now, now)
        self.created += 1
        return self.held[sandbox.id].info(self.backend.name)

    def _check_enforced(self) -> None:
        """Refuse (503) where the backend says a limit is enforced by nothing here (bwrap as root
        without cgroups: the process limit), rather than run sandboxes without it."""
        unenforced = getattr(self.backend, "unenforced_limits", list)()
        if unenforced:
            self.refused_limits += 1
            raise SandboxUnavailableError(
                f"sandbox refused: this server cannot enforce {'; '.join(unenforced)}; run it with cgroups "
                "(as root with /sys/fs/cgroup writable, e.g. a privileged container) or as an ordinary user"
            )

    def get(self, sandbox_id: str) -> _Held:
        """The sandbox with this id (its last-used time updated), or SandboxNotFoundError."""
        held = self.held.get(sandbox_id)
        if held is None:
            raise SandboxNotFoundError(
                f"no open sandbox has id {sandbox_id!r} (never created, deleted, or closed after "
                f"{self.idle_ttl_s:g} s idle); GET /sandboxes lists the open ones"
            )
        held.touch()
        return held

    @contextlib.asynccontextmanager
    async def use(self, sandbox_id: str) -> AsyncIterator[Sandbox]:
        """The sandbox for one request: marked busy (so the reaper leaves it alone) and touched
        before and after, so a long exec does not count as idle time."""
        held = self.get(sandbox_id)
        held.busy += 1
        try:
            yield held.sandbox
        finally:
            held.busy -= 1
            held.touch()

    async def delete(self, sandbox_id: str) -> None:
        held = self.get(sandbox_id)
        del self.held[sandbox_id]
        self.quota.forget(sandbox_id)
        await held.sandbox.close()

    async def reap_idle(self) -> int:
        """Close the sandboxes unused for longer than ``idle_ttl_s``; returns how many."""
        deadline = time.time() - self.idle_ttl_s
        idle = [i for i, h in self.held.items() if h.busy == 0 and h.last_used_at < deadline]
        for sandbox_id in idle:
            held = self.held.pop(sandbox_id)
            self.quota.forget(sandbox_id)
            try:
                await held.sandbox.close()
            except Exception:
                log.exception("closing idle sandbox %s failed", sandbox_id)
            self.reaped += 1
        return len(idle)

    async def reap_forever(self, interval_s: float) -> None:
        """The background reaper: :meth:`reap_idle` every ``interval_s`` until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.reap_idle()
            except Exception:
                log.exception("the idle sandbox reaper failed; it will try again in %s s", interval_s)

    async def watch_workspaces_forever(self) -> None:
        """The quota's look (:meth:`WorkspaceQuota.look`) at the sandboxes no request is using:
        those written to since their last measurement every :data:`POLL_S`, those with processes
        left running every :data:`SWEEP_S`, until cancelled."""
        ticks, every = 0, max(1, round(SWEEP_S / POLL_S))
        while True:
            await asyncio.sleep(POLL_S)
            ticks += 1
            try:
                idle = [(i, h.sandbox) for i, h in self.held.items() if h.busy == 0]
                await self.quota.look(idle, processes_too=ticks % every == 0)
            except Exception:
                log.exception("the workspace quota check failed; it will try again in %s s", POLL_S)

    async def close_all(self) -> None:
        """Close every sandbox held, then the backend (server shutdown)."""
        held, self.held = list(self.held.values()), {}
        self.quota.usage.clear()
        results = await asyncio.gather(*(h.sandbox.close() for h in held), return_exceptions=True)
        for h, result in zip(held, results, strict=True):
            if isinstance(result, BaseException):
                log.error("closing sandbox %s at shutdown failed: %r", h.sandbox.id, result)
        await self.backend.aclose()

    # work

    async def exec(self, sandbox_id: str, request: ExecRequest) -> ExecResult:
        """Run a command: output cut at the sandbox's ``output_bytes`` (within the server's ceiling)
        whatever the backend let through, the workspace quota watched while it runs."""
        limit = self.get(sandbox_id).limits.output_bytes
        async with self.use(sandbox_id) as sandbox:
            start = time.perf_counter()
            try:
                work = run_command(sandbox, request.cmd, request.timeout)
                result = cap_output(await self.quota.run_exec(sandbox_id, sandbox, work), limit)
            except asyncio.CancelledError:
                self.exec_cancelled += 1
                raise
            finally:
                self.exec_total += 1
                self.exec_seconds += time.perf_counter() - start
        self.exec_timeouts += int(result.timed_out)
        return result

    async def write_file(self, sandbox_id: str, path: str, data: bytes) -> None:
        """Write a file, unless it would take the workspace over its quota (409, nothing written)."""
        async with self.use(sandbox_id) as sandbox:
            await self.quota.before_write(sandbox_id, sandbox, len(data))
            await sandbox.write_file(path, data)
            self.quota.after_write(sandbox_id, len(data))

    # metrics

    def metrics_text(self) -> str:
        """The counters in Prometheus' text exposition format."""
        rows = [
            ("horizonrl_sandboxes_live", "gauge", "Sandboxes open now.", self.live),
            ("horizonrl_sandboxes_capacity", "gauge", "Most sandboxes open at once.", self.max_sandboxes),
            ("horizonrl_sandboxes_created_total", "counter", "Sandboxes created.", self.created),
            ("horizonrl_sandboxes_reaped_total", "counter", "Sandboxes closed idle.", self.reaped),
            ("horizonrl_sandboxes_rejected_total", "counter", "Creations refused (429).", self.rejected),
            ("horizonrl_exec_total", "counter", "Commands run.", self.exec_total),
            ("horizonrl_exec_timeouts_total", "counter", "Commands timed out.", self.exec_timeouts),
            ("horizonrl_exec_cancelled_total", "counter", "Commands whose client left.", self.exec_cancelled),
            (
                "horizonrl_sandboxes_refused_limits_total",
                "counter",
                "Creations refused: a limit above its ceiling (422) or not enforceable (503).",
                self.refused_limits,
            ),
            (
                "horizonrl_workspace_bytes",
                "gauge",
                "Disk used by all workspaces, as last measured.",
                self.quota.used,
            ),
            (
                "horizonrl_workspace_over_quota_total",
                "counter",
                "Measurements that found a workspace over quota (its processes killed).",
                self.quota.exceeded,
            ),
            (
                "horizonrl_workspace_writes_refused_total",
                "counter",
                "write_file refused by the quota (409).",
                self.quota.refused_writes,
            ),
        ]
        lines: list[str] = []
        for name, kind, help_text, value in rows:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {value}"]
        lines += [
            "# HELP horizonrl_exec_seconds Wall seconds of commands run.",
            "# TYPE horizonrl_exec_seconds summary",
            f"horizonrl_exec_seconds_sum {self.exec_seconds:.6f}",
            f"horizonrl_exec_seconds_count {self.exec_total}",
        ]
        return "\n".join(lines) + "\n"
