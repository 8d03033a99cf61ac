"""One live bubblewrap sandbox: commands and file operations entered into its namespaces, its
process limit reclaimed when it fills up, and its teardown."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from horizonrl.sandbox.base import (
    WORKSPACE,
    ExecResult,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxInfo,
    SandboxLimits,
    SandboxPathError,
    check_path,
    workspace_diff_script,
)
from horizonrl.sandbox.bwrap.cgroup import Cgroup
from horizonrl.sandbox.bwrap.cmdline import enter_argv, exec_prologue
from horizonrl.sandbox.bwrap.command import Capture, run_command
from horizonrl.sandbox.bwrap.host import refuse_uvloop, rmtree
from horizonrl.sandbox.bwrap.pidns import children, descendants, end_pid_namespace, stop_and_kill
from horizonrl.sandbox.bwrap.template import Template
from horizonrl.sandbox.bwrap.usage import layer_bytes

_FILE_EXIT_OUTSIDE = 97
_FILE_EXIT_MISSING = 98


class BwrapSandbox:
    """One live bubblewrap sandbox (created by :meth:`BwrapBackend.create`)."""

    backend = "bwrap"

    def __init__(
        self,
        sandbox_id: str,
        proc: asyncio.subprocess.Process,
        holder_pid: int,
        directory: Path,
        template: Template,
        limits: SandboxLimits,
        cgroup: Cgroup | None,
        env: dict[str, str],
        on_close: Callable[[BwrapSandbox], None] | None = None,
        rootless: bool = False,
    ) -> None:
        """``on_close`` is called with the sandbox once it is closed (its backend stops counting it)."""
        self.id = sandbox_id
        self._proc, self._pid, self._dir = proc, holder_pid, directory
        self._template, self.limits, self._cgroup, self._env = template, limits, cgroup, env
        self._on_close = on_close
        self.rootless = rootless
        self._closed = False
        self.created_at = self.last_used_at = time.time()
        self._keep = frozenset({proc.pid, holder_pid, *children(holder_pid)})  # bwrap, PID 1, holder
        ns = os.stat(f"/proc/{holder_pid}/ns/pid")
        self._pid_ns = (ns.st_dev, ns.st_ino)
        own_user_ns = os.readlink(f"/proc/{holder_pid}/ns/user") != os.readlink("/proc/self/ns/user")
        self._enter = enter_argv(holder_pid, rootless, own_user_ns)

    def info(self) -> SandboxInfo:
        return SandboxInfo(
            id=self.id,
            backend=self.backend,
            template=self._template.name,
            created_at=self.created_at,
            last_used_at=self.last_used_at,
            limits=self.limits,
            mode="rootless" if self.rootless else "root",
            limits_by=self.limits_by,
        )

    @property
    def limits_by(self) -> Literal["cgroup", "rlimit"]:
        return "cgroup" if self._cgroup is not None else "rlimit"

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_alive(self) -> None:
        if self._closed:
            raise SandboxError(f"sandbox {self.id} is closed")
        if self._proc.returncode is not None or not os.path.exists(f"/proc/{self._pid}"):
            raise SandboxError(
                f"sandbox {self.id} has stopped (its holder process was killed, and every process in "
                "it with it); create a new sandbox"
            )

    # --- what a sandbox server's workspace quota needs (horizonrl.sandbox.server.quota) -----------

    def workspace_bytes(self, stop_after: int | None = None) -> int:
        """The disk space of what was written to /workspace (its writable layer; blocking: call it
        in a thread). Raises :class:`.usage.UsageError` when part of it cannot be read."""
        return layer_bytes(self._dir / "upper", WORKSPACE, stop_after)

    def background_processes(self) -> int:
        """How many processes run in the sandbox besides its holder (what commands left running,
        and any command running now): cheap, a cgroup or a few /proc files."""
        if self._closed:
            return 0
        pids = self._cgroup.pids() if self._cgroup is not None else descendants(self._pid)
        return len(set(pids) - self._keep)

    def kill_processes(self) -> int:
        """SIGKILL every process in the sandbox but its holder (a command running now and whatever
        commands left running); the sandbox stays usable. Returns how many were killed."""
        if self._closed:
            return 0
        if self._cgroup is not None:
            with self._cgroup.frozen():  # frozen, a fork bomb cannot outrun the kills
                return self._cgroup.kill_all(self._keep)
        return stop_and_kill(self._pid_ns, self._keep)  # its PID namespace, each stopped first

    def _reclaim_processes(self, force: bool = False) -> str:
        """When the sandbox's process limit is used up (e.g. a fork bomb still running in the
        background), kill every process in it but its holder so the next command can start; the
        returned note (prepended to stderr) tells the agent."""
        if self._cgroup is not None:
            if not (force or self._cgroup.processes_full()):
                return ""
        elif self.rootless:  # no cgroup: the processes of the sandbox's PID namespace
            if not (force or len(descendants(self._pid)) + 1 >= self.limits.processes - 2):
                return ""
        else:
            return ""
        killed = self.kill_processes()
        return (
            f"[sandbox: the process limit ({self.limits.processes}) was reached; "
            f"{killed} processes were killed to run this command]\n"
        )

    async def _run(
        self, argv: list[str], timeout: float, stdin: bytes | None = None, output_bytes: int | None = None
    ) -> tuple[int, Capture, Capture, bool, float]:
        """Run ``argv`` inside the sandbox; return (exit code, stdout, stderr, timed out, seconds)."""
        self._check_alive()
        refuse_uvloop()
        self.last_used_at = time.time()
        prologue = exec_prologue(self.limits, self._cgroup)
        return await run_command(
            ["/bin/sh", "-c", prologue + ' && exec "$@"', "sh", *self._enter, *argv],
            env=self._env,
            timeout=timeout,
            output_bytes=output_bytes or self.limits.output_bytes,
            stdin=stdin,
        )

    async def exec(self, cmd: str, timeout: float = 60.0) -> ExecResult:
        """Run ``cmd`` with ``/bin/sh -c`` in /workspace."""
        if not isinstance(cmd, str) or not cmd or "\0" in cmd:
            raise SandboxError("cmd must be a non-empty string without NUL bytes")
        note = self._reclaim_processes()
        code, out, err, timed_out, seconds = await self._run(["/bin/sh", "-c", cmd], timeout)
        limited = self._cgroup is not None or self.rootless
        if code and not note and "fork failed" in err.text()[:200] and limited:
            note = self._reclaim_processes(force=True)  # the limit filled up between check and start
            code, out, err, timed_out, seconds = await self._run(["/bin/sh", "-c", cmd], timeout)
        return ExecResult(
            exit_code=code,
            stdout=out.text(),
            stderr=note + err.text(),
            truncated=out.truncated or err.truncated,
            timed_out=timed_out,
            duration=seconds,
        )

    _RESOLVE = (
        f'p=$(realpath -m -- "$1") || exit {_FILE_EXIT_OUTSIDE}; '
        f'case "$p" in {WORKSPACE}|{WORKSPACE}/*) ;; '
        f'*) echo "$1 resolves to $p, outside {WORKSPACE}" >&2; exit {_FILE_EXIT_OUTSIDE};; esac; '
    )

    async def read_file(self, path: str, max_bytes: int = 64 * 1024 * 1024) -> bytes:
        """The bytes of a file inside /workspace (symlinks resolved inside the sandbox)."""
        check_path(path)
        script = self._RESOLVE + f'[ -f "$p" ] || exit {_FILE_EXIT_MISSING}; exec cat -- "$p"'
        code, out, err, timed_out, _ = await self._run(
            ["/bin/sh", "-c", script, "sh", path], 60.0, output_bytes=max_bytes
        )
        self._raise_file_error(path, code, err, timed_out)
        if out.truncated:
            raise SandboxError(f"{path} is larger than {max_bytes} bytes; read it in parts with exec")
        return out.data()

    async def write_file(self, path: str, data: bytes) -> None:
        """Write ``data`` to a file inside /workspace (parent directories are created)."""
        check_path(path)
        if not isinstance(data, bytes | bytearray):
            raise SandboxError(f"write_file data must be bytes, not {type(data).__name__}")
        script = self._RESOLVE + 'mkdir -p -- "$(dirname -- "$p")" && exec cat > "$p"'
        code, _, err, timed_out, _ = await self._run(
            ["/bin/sh", "-c", script, "sh", path], 60.0, stdin=bytes(data)
        )
        self._raise_file_error(path, code, err, timed_out)

    def _raise_file_error(self, path: str, code: int, err: Capture, timed_out: bool) -> None:
        if code == 0 and not timed_out:
            return
        if code == _FILE_EXIT_OUTSIDE:
            raise SandboxPathError(f"path {path!r} is outside the workspace: {err.text().strip()}")
        if code == _FILE_EXIT_MISSING:
            raise SandboxFileNotFoundError(f"no file {path!r} in the workspace of sandbox {self.id}")
        reason = "timed out" if timed_out else f"failed (exit {code}): {err.text().strip()}"
        raise SandboxError(f"file operation on {path!r} in sandbox {self.id} {reason}")

    async def diff(self) -> str:
        """``git diff --binary`` of the workspace (new files included) against its starting commit;
        the agent's own git index is left alone."""
        script = workspace_diff_script(self._template.base)
        code, out, err, timed_out, _ = await self._run(
            ["/bin/sh", "-c", script], 300.0, output_bytes=256 * 1024 * 1024
        )
        if code or timed_out:
            raise SandboxError(f"diff of sandbox {self.id} failed (exit {code}): {err.text().strip()}")
        return out.text()

    async def close(self) -> None:
        """Kill every process in the sandbox and delete its writable layer (idempotent)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(ProcessLookupError):
            self._proc.kill()
        with contextlib.suppress(ProcessLookupError):
            await self._proc.wait()
        await asyncio.to_thread(self._cleanup)
        if self._on_close is not None:
            self._on_close(self)

    def _cleanup(self) -> None:
        if self._cgroup is not None:
            with self._cgroup.frozen():
                self._cgroup.kill_all()
            self._cgroup.remove()
        else:
            end_pid_namespace(self._pid)
        rmtree(self._dir)

    async def __aenter__(self) -> BwrapSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
