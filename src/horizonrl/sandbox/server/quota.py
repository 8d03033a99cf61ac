"""The sandbox server's workspace quota: the disk space what sandboxes write to /workspace may take,
per sandbox and for all of the server's sandboxes together, measured from the host (a walk of the
sandbox's writable layer, which costs time in proportion to the files in it: at most once per
:data:`POLL_S` per sandbox while it is used).

- ``write_file``: measured first; a write that would take the workspace over its quota (or all
  workspaces over the server's) is refused with 409 ``quota_exceeded`` before a byte is written.
- ``exec``: measured every :data:`POLL_S` while the command runs, and when it ends if the last
  measurement is :data:`POLL_S` old or more (or found it over); otherwise within :data:`POLL_S` in
  the background. Once over, every process of the sandbox is killed (the command and whatever it
  left running) and the exec's result says so: ``over_quota: true`` (``ok`` is false) and the reason
  first in stderr: on the exec that went over when it is measured while it runs or at its end,
  else (measured in the background within :data:`POLL_S`, its processes killed then) on the next
  exec. An exec is never refused for a full workspace (the agent can still ``rm``).
- between requests: every :data:`SWEEP_S`, sandboxes with processes left running (or that had some
  at the last look) are measured, and those processes killed when over.
- a new sandbox is refused (429) while all workspaces together hold the server's quota or more.

What this bounds, honestly: it is a check, not a filesystem limit, so a sandbox can pass its quota
by what its processes write in about :data:`POLL_S` (:data:`SWEEP_S` for background processes
between requests) before they are killed, and one file never grows past ``file_size_mib``. The
server's total counts each workspace as last measured. Only what sandboxes write to their
workspaces counts (their writable layer, in blocks actually allocated); ``/tmp`` is a tmpfs bounded
by ``tmp_mib``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Iterable
from typing import Any, Protocol, runtime_checkable

from horizonrl.sandbox.base import (
    ExecResult,
    SandboxCapacityError,
    SandboxQuotaError,
    SandboxUnavailableError,
)

log = logging.getLogger(__name__)

POLL_S = 0.25
"""The most often one sandbox's workspace is measured while it is used (and how often while a
command runs, and the background check of workspaces written to since their last measurement)."""
SWEEP_S = 1.0
"""How often sandboxes with processes left running between requests are measured."""
MIB = 1024 * 1024


@runtime_checkable
class Measured(Protocol):
    """What a backend's sandboxes offer for the quota (:class:`BwrapSandbox` does; blocking calls)."""

    id: str

    def workspace_bytes(self, stop_after: int | None = None) -> int: ...

    def background_processes(self) -> int: ...

    def kill_processes(self) -> int: ...


def _mib(n: int) -> str:
    return f"{n / MIB:.1f} MiB"


async def _kill(sandbox: Any) -> None:
    """Kill every process of ``sandbox`` but its holder (logged, not raised, if that fails: e.g. the
    sandbox was closed meanwhile)."""
    try:
        await asyncio.to_thread(sandbox.kill_processes)
    except Exception:
        log.exception("killing the processes of sandbox %s (over its workspace quota) failed", sandbox.id)


class WorkspaceQuota:
    """The quota of each workspace and of all together (bytes; None: none), and per sandbox the
    server holds: its last measured usage, when that was, and whether it was over."""

    def __init__(self, per_sandbox_mib: int | None, total_mib: int | None) -> None:
        self.per_sandbox = per_sandbox_mib * MIB if per_sandbox_mib else None
        self.total = total_mib * MIB if total_mib else None
        self.usage: dict[str, int] = {}
        self.measured_at: dict[str, float] = {}
        self.over: dict[str, str] = {}  # why the last measurement found it over quota ('' or absent: not)
        self.dirty: set[str] = set()  # written to (an exec ended) since the last measurement
        self.running: set[str] = set()  # had processes left running at the last measurement
        self.exceeded = 0  # measurements that found a workspace over quota (its processes killed)
        self.refused_writes = 0

    @property
    def enabled(self) -> bool:
        return self.per_sandbox is not None or self.total is not None

    @property
    def used(self) -> int:
        """All workspaces together, as last measured."""
        return sum(self.usage.values())

    # the lifecycle of a sandbox

    def check_room(self) -> None:
        """Refuse a new sandbox (429) while the workspaces together are at the server's quota."""
        if self.total is not None and self.used >= self.total:
            raise SandboxCapacityError(
                f"this server's workspaces hold {_mib(self.used)}, at its quota of {_mib(self.total)} for "
                "all of them (--total-workspace-mib); delete sandboxes (DELETE /sandboxes/{id}) or "
                "files in them first"
            )

    def admit(self, sandbox: Any, backend: str) -> None:
        """Start counting a new sandbox; one whose workspace cannot be measured is refused (503)
        where there is a quota, rather than run without it."""
        if self.enabled and not isinstance(sandbox, Measured):
            raise SandboxUnavailableError(
                f"the {backend} backend cannot measure its sandboxes' workspaces, so this server's "
                "workspace quota cannot be enforced; serve it without one"
            )
        self.usage[sandbox.id] = 0
        self.measured_at[sandbox.id] = 0.0  # never: its first exec is measured when it ends

    def forget(self, sandbox_id: str) -> None:
        for table in (self.usage, self.measured_at, self.over):
            table.pop(sandbox_id, None)
        self.dirty.discard(sandbox_id)
        self.running.discard(sandbox_id)

    # measuring

    async def _measure(self, sandbox_id: str, sandbox: Any) -> tuple[int, str]:
        """The workspace's bytes now and '' — or its last known size and why it cannot be measured
        (an unreadable directory counts as over quota: the quota is never silently skipped). Notes
        whether processes are left running in it (then :meth:`look` measures it until they are gone)."""
        stop = None if self.per_sandbox is None else self.per_sandbox + 1

        def measure() -> tuple[int, str, bool]:
            try:
                used, problem = sandbox.workspace_bytes(stop), ""
            except Exception as exc:  # the backend says why (UsageError: a directory it cannot read)
                used, problem = self.usage.get(sandbox_id, 0), f"the workspace cannot be measured ({exc})"
            return used, problem, bool(sandbox.background_processes())

        self.dirty.discard(sandbox_id)  # what is written from now on is for the next measurement
        used, problem, running = await asyncio.to_thread(measure)
        if sandbox_id in self.usage:  # not deleted meanwhile
            self.measured_at[sandbox_id] = time.monotonic()
            if running:
                self.running.add(sandbox_id)
        return used, problem

    def _over(self, sandbox_id: str, used: int, before: int, holds: str = "holds") -> str:
        """Why a workspace of ``used`` bytes (``before`` at the last measurement) is over quota, or
        '': over its own, or it grew while all together are over the server's."""
        if self.per_sandbox is not None and used > self.per_sandbox:
            return f"the workspace {holds} {_mib(used)}, over its quota of {_mib(self.per_sandbox)}"
        if self.total is not None and used > before:
            total = self.used - self.usage.get(sandbox_id, 0) + used
            if total > self.total:
                return (
                    f"this server's workspaces {holds} {_mib(total)}, over its quota of "
                    f"{_mib(self.total)} for all of them"
                )
        return ""

    async def check(self, sandbox_id: str, sandbox: Any, before: int | None = None) -> str:
        """Measure the workspace, record it and say why it is over quota ('' when it is not);
        growth is counted from ``before`` (default: the last measurement)."""
        if before is None:
            before = self.usage.get(sandbox_id, 0)
        used, problem = await self._measure(sandbox_id, sandbox)
        reason = problem or self._over(sandbox_id, used, before)
        if sandbox_id in self.usage:
            self.usage[sandbox_id] = used
            self.over[sandbox_id] = reason
        return reason

    def _due(self, sandbox_id: str) -> bool:
        """Whether an exec that just ended is measured now: the last measurement is POLL_S old or
        found the workspace over (so the exec that frees it is seen at once)."""
        last = self.measured_at.get(sandbox_id, 0.0)
        return bool(self.over.get(sandbox_id)) or time.monotonic() - last >= POLL_S

    # requests

    async def before_write(self, sandbox_id: str, sandbox: Any, size: int) -> None:
        """Refuse (409) a write_file of ``size`` bytes that would go over a quota."""
        if not self.enabled:
            return
        used, problem = await self._measure(sandbox_id, sandbox)
        if sandbox_id in self.usage:
            self.usage[sandbox_id] = used
        reason = problem or self._over(sandbox_id, used + size, used, holds="would hold")
        if reason:
            self.refused_writes += 1
            raise SandboxQuotaError(
                f"write_file of {size} bytes refused: {reason}; delete files in /workspace first"
            )

    def after_write(self, sandbox_id: str, size: int) -> None:
        """Count a written file at once (its size: the total stays conservative) and measure it at
        the next look."""
        if self.enabled and sandbox_id in self.usage:
            self.usage[sandbox_id] += size
            self.dirty.add(sandbox_id)

    async def run_exec(
        self, sandbox_id: str, sandbox: Any, work: Coroutine[Any, Any, ExecResult]
    ) -> ExecResult:
        """Run ``work`` (an exec of ``sandbox``) under the quota: measured every :data:`POLL_S`
        while it runs and when it ends (when due, else soon after: :meth:`_due`); once over, every
        process of the sandbox is killed and the result says so (``over_quota``, the reason first in
        stderr)."""
        if not self.enabled:
            return await work
        before = self.usage.get(sandbox_id, 0)
        job = asyncio.ensure_future(work)
        reason = ""
        try:
            while not reason:
                done, _ = await asyncio.wait({job}, timeout=POLL_S)
                if done:
                    break
                reason = await self.check(sandbox_id, sandbox, before)
            if reason:  # the command is still running: it dies with the rest
                await _kill(sandbox)
            result = await job
        except BaseException:
            job.cancel()  # the exec kills its command when cancelled
            raise
        if not reason:
            if self._due(sandbox_id):
                reason = await self.check(sandbox_id, sandbox, before)
                if reason:  # what the command left running may still be writing
                    await _kill(sandbox)
            elif sandbox_id in self.usage:
                self.dirty.add(sandbox_id)  # measured by the next look, within POLL_S
        if not reason:
            return result
        self.exceeded += 1
        note = (
            f"[sandbox: {reason}; every process in the sandbox was killed, and writes are refused "
            "until files in /workspace are deleted]\n"
        )
        return result.model_copy(update={"stderr": note + result.stderr, "over_quota": True})

    async def look(self, idle: Iterable[tuple[str, Any]], processes_too: bool) -> int:
        """Measure the ``idle`` sandboxes (id, sandbox; no request is using them) written to since
        their last measurement and — when ``processes_too`` — those with processes running now or
        at the last measurement (they may have written and exited since); kill the processes of
        those over quota. Returns how many were over."""
        if not self.enabled:
            return 0
        candidates = [(i, s) for i, s in idle if isinstance(s, Measured)]
        if not processes_too:
            due = [(i, s) for i, s in candidates if i in self.dirty]
        else:
            had = set(self.running)
            self.running.difference_update(i for i, _ in candidates)  # measuring says anew who has
            due = await asyncio.to_thread(
                lambda: [
                    (i, s) for i, s in candidates if i in self.dirty or i in had or s.background_processes()
                ]
            )
        over = 0
        for sandbox_id, sandbox in due:
            if await self.check(sandbox_id, sandbox):
                await _kill(sandbox)
                self.exceeded += 1
                over += 1
        return over
