"""A Docker sandbox: one container, driven through the Docker Engine API (the backend and how it
differs from bwrap: :mod:`horizonrl.sandbox.docker`).

``exec`` is ``docker exec`` of ``timeout -s KILL T sh -c CMD`` in /workspace; ``read_file`` and
``write_file`` resolve the path inside the container and move the file as a tar through the engine;
``diff`` is ``git diff --binary`` against the sandbox's base commit.
"""

from __future__ import annotations

import asyncio
import io
import posixpath
import tarfile
import time
from collections.abc import Callable
from typing import Any

from horizonrl.sandbox.base import (
    WORKSPACE,
    ExecResult,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxInfo,
    SandboxLimits,
    SandboxPathError,
    check_path,
    truncate_output,
    workspace_diff_script,
)

MIB = 1024 * 1024
_KILLED = 137  # 128 + SIGKILL: how Docker reports a command that ``timeout -s KILL`` killed
_READ_PREP_SCRIPT = (
    'p=$(realpath -m -- "$1") || exit 1; printf "%s" "$p"; '
    f'case "$p" in {WORKSPACE}|{WORKSPACE}/*) [ -f "$p" ] || exit 4;; esac'
)
"""Resolve a read_file path; exit 4 when it is inside the workspace but not a regular file."""
_WRITE_PREP_SCRIPT = (
    'p=$(realpath -m -- "$1") || exit 1; printf "%s" "$p"; '
    f'case "$p" in {WORKSPACE}/*) ;; *) exit 0;; esac; '
    '[ -d "$p" ] && exit 3; mkdir -p -- "$(dirname -- "$p")" || exit 2; '
    'printf "\\0"; stat -c %a -- "$p" 2>/dev/null; exit 0'
)
"""Resolve a write_file path; when it is inside the workspace also create its parent and print
NUL + the current mode of the file if it exists (so overwriting keeps e.g. the executable bit)."""


def _is_not_found(exc: BaseException) -> bool:
    """Whether a Docker SDK error means "no such container/path" (``docker.errors.NotFound``, 404).
    Checked by name and status so this module needs no import of the SDK."""
    return type(exc).__name__ in {"NotFound", "ImageNotFound"} or getattr(exc, "status_code", None) == 404


def _inside_workspace(path: str) -> bool:
    return path == WORKSPACE or path.startswith(WORKSPACE + "/")


def as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """Tar filter: files copied in belong to root, so git in the container (root in most images)
    does not refuse the repository as owned by someone else ("dubious ownership")."""
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def _tar_file(name: str, data: bytes, mode: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = as_root(tarfile.TarInfo(name))
        info.size, info.mode, info.mtime = len(data), mode, int(time.time())
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class DockerSandbox:
    """One live container sandbox (created by :meth:`.backend.DockerBackend.create`, which passes
    ``on_close`` to forget it once it is closed)."""

    backend = "docker"

    def __init__(
        self,
        sandbox_id: str,
        container: Any,
        base: str,
        template: str | None,
        limits: SandboxLimits,
        on_close: Callable[[DockerSandbox], None] | None = None,
    ) -> None:
        self.id = sandbox_id
        self.container = container
        self.base = base
        self.template = template
        self.limits = limits
        self._on_close = on_close
        self._closed = False
        self.created_at = self.last_used_at = time.time()

    def info(self) -> SandboxInfo:
        return SandboxInfo(
            id=self.id,
            backend=self.backend,
            template=self.template,
            created_at=self.created_at,
            last_used_at=self.last_used_at,
            limits=self.limits,
        )

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_alive(self) -> None:
        if self._closed:
            raise SandboxError(f"sandbox {self.id} is closed")
        self.last_used_at = time.time()

    def _error(self, what: str, exc: Exception) -> SandboxError:
        if _is_not_found(exc) or getattr(exc, "status_code", None) == 409:
            return SandboxError(
                f"sandbox {self.id} has stopped (its container is gone or not running: {exc}); "
                "create a new sandbox"
            )
        return SandboxError(f"docker {what} in sandbox {self.id} failed: {exc}")

    def _run(self, argv: list[str]) -> tuple[int, bytes, bytes]:
        """``docker exec`` ``argv`` in /workspace (blocking; call it in a thread)."""
        try:
            result = self.container.exec_run(argv, demux=True, workdir=WORKSPACE)
        except Exception as exc:
            raise self._error("exec", exc) from exc
        out, err = result.output if result.output is not None else (None, None)
        return int(result.exit_code), out or b"", err or b""

    async def exec(self, cmd: str, timeout: float = 60.0) -> ExecResult:
        """Run ``cmd`` with ``sh -c`` in /workspace; kill it after ``timeout`` seconds."""
        if not isinstance(cmd, str) or not cmd or "\0" in cmd:
            raise SandboxError("cmd must be a non-empty string without NUL bytes")
        if not timeout > 0:
            raise SandboxError(f"timeout must be a positive number of seconds, not {timeout!r}")
        self._check_alive()
        argv = ["timeout", "-s", "KILL", f"{max(timeout, 0.001):.3f}", "sh", "-c", cmd]
        start = time.perf_counter()
        code, out, err = await asyncio.to_thread(self._run, argv)
        duration = time.perf_counter() - start
        stdout, cut_out = truncate_output(out, self.limits.output_bytes)
        stderr, cut_err = truncate_output(err, self.limits.output_bytes)
        return ExecResult(
            exit_code=code,
            stdout=stdout,
            stderr=stderr,
            truncated=cut_out or cut_err,
            timed_out=code == _KILLED and duration >= timeout,
            duration=duration,
        )

    def _resolve(self, path: str, script: str) -> tuple[str, int, bytes]:
        """Resolve ``path`` inside the container with ``script``; return the real path (refused
        unless inside /workspace), the script's exit code (3: a directory, 4: not a regular file)
        and whatever it printed after a NUL."""
        code, out, err = self._run(["sh", "-c", script, "sh", path])
        resolved, _, rest = out.partition(b"\0")
        real = resolved.decode("utf-8", errors="surrogateescape")
        if code not in (0, 3, 4) or not real.startswith("/"):
            reason = err.decode(errors="replace").strip() or f"exit {code}"
            raise SandboxError(f"could not resolve path {path!r} in sandbox {self.id}: {reason}")
        if not _inside_workspace(real):
            raise SandboxPathError(
                f"path {path!r} resolves to {real}, outside {WORKSPACE}; give a path relative to "
                f"{WORKSPACE} or absolute inside it (symlinks are followed)"
            )
        return real, code, rest

    async def read_file(self, path: str, max_bytes: int = 64 * MIB) -> bytes:
        """The bytes of a regular file inside /workspace (symlinks resolved inside the container)."""
        check_path(path)
        self._check_alive()
        return await asyncio.to_thread(self._read, path, max_bytes)

    def _read(self, path: str, max_bytes: int) -> bytes:
        real, code, _ = self._resolve(path, _READ_PREP_SCRIPT)
        missing = SandboxFileNotFoundError(f"no file {path!r} in the workspace of sandbox {self.id}")
        if code == 4:
            raise missing
        try:
            chunks, stat = self.container.get_archive(real)
        except Exception as exc:
            if _is_not_found(exc):
                raise missing from None
            raise self._error("get_archive", exc) from exc
        if int(stat.get("size", 0)) > max_bytes:
            raise SandboxError(f"{path} is larger than {max_bytes} bytes; read it in parts with exec")
        try:
            with tarfile.open(fileobj=io.BytesIO(b"".join(chunks)), mode="r:") as tar:
                member = tar.next()
                if member is None or not member.isreg():
                    raise missing
                handle = tar.extractfile(member)
                assert handle is not None
                return handle.read()
        except tarfile.TarError as exc:
            raise SandboxError(
                f"docker returned a bad archive for {path!r} in sandbox {self.id}: {exc}"
            ) from exc

    async def write_file(self, path: str, data: bytes) -> None:
        """Write ``data`` to a file inside /workspace (parent directories are created; an existing
        file keeps its mode)."""
        check_path(path)
        if not isinstance(data, bytes | bytearray):
            raise SandboxError(f"write_file data must be bytes, not {type(data).__name__}")
        limit = self.limits.file_size_mib * MIB
        if len(data) > limit:
            raise SandboxError(
                f"cannot write {len(data)} bytes to {path!r}: files in sandbox {self.id} may hold at most "
                f"{limit} bytes (limits.file_size_mib={self.limits.file_size_mib})"
            )
        self._check_alive()
        await asyncio.to_thread(self._write, path, bytes(data))

    def _write(self, path: str, data: bytes) -> None:
        real, code, rest = self._resolve(path, _WRITE_PREP_SCRIPT)
        if code == 3 or real == WORKSPACE:
            raise SandboxPathError(f"path {path!r} is a directory ({real}); give the path of a file")
        mode_text = rest.decode(errors="replace").strip()
        mode = int(mode_text, 8) if mode_text.isdigit() else 0o644
        parent, name = posixpath.split(real)
        try:
            self.container.put_archive(parent, _tar_file(name, data, mode))
        except Exception as exc:
            raise self._error("put_archive", exc) from exc

    async def diff(self) -> str:
        """``git diff --binary`` of the workspace (new files included) against its starting
        commit; the agent's own git index is left alone."""
        self._check_alive()
        script = workspace_diff_script(self.base)
        code, out, err = await asyncio.to_thread(
            self._run, ["timeout", "-s", "KILL", "300", "sh", "-c", script]
        )
        if code:
            raise SandboxError(
                f"diff of sandbox {self.id} failed (exit {code}): {err.decode(errors='replace').strip()}"
            )
        return out.decode("utf-8", errors="replace")

    async def close(self) -> None:
        """Remove the container and everything in it (idempotent; a container already gone is fine)."""
        if self._closed:
            return
        self._closed = True
        try:
            await asyncio.to_thread(self.container.remove, force=True)
        except Exception as exc:
            if not _is_not_found(exc):
                raise SandboxError(
                    f"could not remove the container of sandbox {self.id} ({exc}); remove it with "
                    f"docker rm -f {getattr(self.container, 'id', self.id)}"
                ) from exc
        finally:
            if self._on_close is not None:
                self._on_close(self)

    async def __aenter__(self) -> DockerSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
