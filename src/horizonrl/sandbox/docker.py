"""The Docker sandbox backend: one container per sandbox, driven through the Docker Engine API.

What it is for: tasks whose workspace needs a full image — system packages, another distribution,
a language toolchain the host does not have — that the bubblewrap backend (:mod:`.bwrap`, which
shows the sandbox the host's own read-only ``/usr``) cannot provide. Each sandbox is a container
started from ``image`` with ``sleep infinity`` holding it open; ``exec`` is ``docker exec``.

What it needs: the Docker SDK for Python (``pip install 'docker>=7'``, imported only when a backend
is built) and a Docker Engine answering at ``DOCKER_HOST`` or the default socket. The image must
have ``sh``, GNU coreutils (``timeout``, ``realpath``, ``stat``) and **git**: ``python:3.11``
(the default) has them; ``python:3.11-slim`` has no git — build ``FROM python:3.11-slim`` plus
``apt-get install -y git`` for a small image.

How a sandbox is built (:meth:`DockerBackend.create`): ``containers.run`` with the limits —
``mem_limit``/``memswap_limit`` (``memory_mib``, no swap), ``pids_limit`` (``processes``), ulimits
``cpu`` (``cpu_s``) and ``fsize`` (``file_size_mib``), a tmpfs ``/tmp`` of ``tmp_mib``, no network
unless ``network=True``, ``init`` to reap orphans, label ``horizonrl.sandbox=1``; the template
directory is copied into ``/workspace`` with ``put_archive`` (files owned by root), and
``/workspace`` becomes a git repository whose first commit is the template (a template that is a git
repository already keeps its own history, as in bwrap). That commit is the base of :meth:`diff`.

Same contract as bwrap: ``exec`` runs ``sh -c CMD`` in /workspace (as ``timeout -s KILL T sh -c
CMD``), each stream is cut to ``output_bytes`` keeping the head and the tail around a ``[... N bytes
cut ...]`` marker, a timeout kills the command (exit 137, ``timed_out=True``); ``read_file`` and
``write_file`` resolve the path inside the container (``realpath -m``, after symlinks) and refuse
anything outside /workspace; ``diff`` is ``git diff --binary`` against the base, new files included.

How it differs from bwrap:

* Isolation is the container runtime's (namespaces, cgroups, seccomp, no-new-privileges), not
  bubblewrap's; the container runs as the image's user (root in most images) with Docker's
  default capabilities.
* Creating a sandbox costs a container start and a copy of the whole template (bwrap overlays it),
  so large templates are slower and the template is held in memory as a tar while it is copied.
* ``docker exec`` returns only when every holder of the command's stdout/stderr has closed it: a
  background process must redirect its output (``cmd >/tmp/log 2>&1 &``) or the exec waits for it
  until the timeout kills it. Background processes that do redirect keep running between calls.
* The whole output of a command crosses from the engine before it is cut (bwrap cuts it while it
  streams and kills a command that floods); the timeout bounds it.
* Cancelling an ``exec`` (e.g. an episode's timeout) stops waiting for it but does not kill the
  command: it runs on until its own timeout, or until :meth:`DockerSandbox.close` removes the
  container.
* ``write_file`` writes through the engine, so ``fsize`` does not apply to it: data larger than
  ``file_size_mib`` is refused up front instead.
* A crashed trainer leaves its containers behind; remove them with
  ``docker rm -f $(docker ps -aq --filter label=horizonrl.sandbox=1)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import posixpath
import tarfile
import time
import uuid
from pathlib import Path
from typing import Any

from horizonrl.sandbox.base import (
    WORKSPACE,
    ExecResult,
    SandboxCapacityError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxInfo,
    SandboxLimits,
    SandboxPathError,
    SandboxSpec,
    SandboxUnavailableError,
    check_path,
    workspace_diff_script,
)

DEFAULT_IMAGE = "python:3.11"
"""The default sandbox image: Debian with Python 3.11, git and coreutils (``-slim`` lacks git)."""
LABEL = "horizonrl.sandbox"
"""Label on every container this backend starts (value ``"1"``), to find leftovers."""
DEFAULT_SOCKET = "unix:///var/run/docker.sock"
_MIB = 1024 * 1024
_KILLED = 137  # 128 + SIGKILL: how Docker reports a command that ``timeout -s KILL`` killed
_MISSING_TOOL = 127
_GIT = "git -c user.name=horizonrl -c user.email=horizonrl@localhost -c commit.gpgsign=false"
_INIT_SCRIPT = (
    "for t in git timeout realpath stat; do "
    'command -v "$t" >/dev/null 2>&1 || { echo "$t"; exit 127; }; done; '
    "if [ ! -e .git ]; then "
    f"git init -q && git add -A && {_GIT} commit -q --allow-empty -m template || exit 1; fi; "
    "git rev-parse HEAD"
)
"""Run in /workspace once the template is in: check the tools, commit the starting state, print
the base commit. A template that is a git repository keeps its HEAD as the base (as in bwrap)."""
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


def truncate_output(data: bytes, limit: int) -> tuple[str, bool]:
    """``data`` as text, cut to ``limit`` bytes keeping the head and the tail (as bwrap does):
    returns the text and whether anything was cut."""
    if len(data) <= limit:
        return data.decode("utf-8", errors="replace"), False
    head, tail = limit // 2, limit - limit // 2
    cut = len(data) - head - tail
    kept = data[:head] + f"\n[... {cut} bytes cut ...]\n".encode() + data[-tail:]
    return kept.decode("utf-8", errors="replace"), True


def _is_not_found(exc: BaseException) -> bool:
    """Whether a Docker SDK error means "no such container/path" (``docker.errors.NotFound``, 404).
    Checked by name and status so this module needs no import of the SDK."""
    return type(exc).__name__ in {"NotFound", "ImageNotFound"} or getattr(exc, "status_code", None) == 404


def _inside_workspace(path: str) -> bool:
    return path == WORKSPACE or path.startswith(WORKSPACE + "/")


def _as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """Tar filter: files copied in belong to root, so git in the container (root in most images)
    does not refuse the repository as owned by someone else ("dubious ownership")."""
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def _tar_directory(root: Path) -> bytes | None:
    """A tar (in memory) of the contents of ``root``, symlinks kept as links; None if it is empty."""
    children = sorted(root.iterdir())
    if not children:
        return None
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for child in children:
            tar.add(child, arcname=child.name, filter=_as_root)
    return buf.getvalue()


def _tar_file(name: str, data: bytes, mode: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = _as_root(tarfile.TarInfo(name))
        info.size, info.mode, info.mtime = len(data), mode, int(time.time())
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _docker_host() -> str:
    host = os.environ.get("DOCKER_HOST")
    return f"DOCKER_HOST={host}" if host else f"the default socket {DEFAULT_SOCKET} (DOCKER_HOST is unset)"


class DockerSandbox:
    """One live container sandbox (created by :meth:`DockerBackend.create`)."""

    backend = "docker"

    def __init__(
        self,
        sandbox_id: str,
        container: Any,
        base: str,
        template: str | None,
        limits: SandboxLimits,
        owner: DockerBackend | None = None,
    ) -> None:
        self.id = sandbox_id
        self.container = container
        self.base = base
        self.template = template
        self.limits = limits
        self._owner = owner
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

    async def read_file(self, path: str, max_bytes: int = 64 * _MIB) -> bytes:
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
        limit = self.limits.file_size_mib * _MIB
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
            if self._owner is not None:
                self._owner._forget(self)

    async def __aenter__(self) -> DockerSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class DockerBackend:
    """Creates container sandboxes on a Docker Engine (see the module doc).

    ``client`` is a ``docker.DockerClient`` (default: ``docker.from_env()``, which honours
    ``DOCKER_HOST``); ``network`` gives sandboxes a network (off by default); ``max_sandboxes``
    caps the containers this backend keeps alive at once.
    """

    name = "docker"

    def __init__(
        self,
        image: str = DEFAULT_IMAGE,
        *,
        client: Any = None,
        network: bool = False,
        max_sandboxes: int = 64,
    ) -> None:
        if not isinstance(image, str) or not image.strip():
            raise SandboxError(f"docker image must be a non-empty image reference, not {image!r}")
        if max_sandboxes < 1:
            raise SandboxError(f"max_sandboxes must be at least 1, not {max_sandboxes}")
        self.image, self.network, self.max_sandboxes = image, network, max_sandboxes
        if client is None:
            try:
                import docker  # the SDK is optional: only this backend needs it
            except ImportError:
                raise SandboxUnavailableError(
                    "the docker sandbox backend needs the Docker SDK for Python: pip install 'docker>=7' "
                    "(or use the bwrap backend, sandbox.backend: bwrap)"
                ) from None
            try:
                client = docker.from_env()
            except Exception as exc:  # docker 7 asks the engine for its API version right away
                raise self._unavailable(exc) from None
        try:
            client.ping()
        except Exception as exc:
            raise self._unavailable(exc) from None
        self.client = client
        self._live: dict[str, DockerSandbox] = {}
        self._starting = 0

    @staticmethod
    def _unavailable(exc: Exception) -> SandboxUnavailableError:
        return SandboxUnavailableError(
            f"no Docker engine answered at {_docker_host()}: {exc}. Start Docker or point DOCKER_HOST "
            "at a running engine, or use the bwrap backend (sandbox.backend: bwrap), which needs only "
            "bubblewrap on this machine"
        )

    @property
    def live(self) -> int:
        return len(self._live)

    def run_kwargs(self, sandbox_id: str, limits: SandboxLimits) -> dict[str, Any]:
        """The ``containers.run`` arguments of a sandbox (besides the image): the limits as Docker
        options. Ulimits are plain dicts (the SDK turns them into ``docker.types.Ulimit``)."""
        memory = f"{limits.memory_mib}m"
        fsize = limits.file_size_mib * _MIB
        return {
            "command": ["sleep", "infinity"],
            "name": f"horizonrl-{sandbox_id}",
            "detach": True,
            "working_dir": WORKSPACE,
            "labels": {LABEL: "1"},
            "network_disabled": not self.network,
            "mem_limit": memory,
            "memswap_limit": memory,  # the same as mem_limit: no swap
            "pids_limit": limits.processes,
            "ulimits": [
                {"name": "cpu", "soft": limits.cpu_s, "hard": limits.cpu_s},
                {"name": "fsize", "soft": fsize, "hard": fsize},  # bytes (setrlimit), not blocks
                {"name": "core", "soft": 0, "hard": 0},
            ],
            # Docker mounts a tmpfs noexec unless told otherwise; bwrap's /tmp allows exec.
            "tmpfs": {"/tmp": f"rw,exec,nosuid,nodev,size={limits.tmp_mib}m,mode=1777"},
            "init": True,  # reap orphans: ``sleep`` as PID 1 would leave zombies counting as pids
            "security_opt": ["no-new-privileges"],
        }

    async def create(self, spec: SandboxSpec | None = None) -> DockerSandbox:
        """Start a container, copy the template into /workspace and commit it as the diff base."""
        spec = spec or SandboxSpec()
        if len(self._live) + self._starting >= self.max_sandboxes:
            raise SandboxCapacityError(
                f"{len(self._live) + self._starting} sandboxes are open, the most this backend allows "
                f"(max_sandboxes={self.max_sandboxes}); close some or raise the cap"
            )
        self._starting += 1
        try:
            archive, template = None, None
            if spec.template is not None:
                root = Path(spec.template).expanduser().resolve()
                if not root.is_dir():
                    raise SandboxError(
                        f"sandbox template {spec.template!r} is not a directory (the docker backend copies "
                        "a local directory into /workspace)"
                    )
                template = str(root)
                archive = await asyncio.to_thread(_tar_directory, root)
            sandbox_id = uuid.uuid4().hex[:16]
            kwargs = self.run_kwargs(sandbox_id, spec.limits)
            try:
                container = await asyncio.to_thread(self.client.containers.run, self.image, **kwargs)
            except Exception as exc:
                raise SandboxError(
                    f"docker could not start a container from image {self.image!r}: {exc}"
                ) from exc
            sandbox = DockerSandbox(sandbox_id, container, "", template, spec.limits, self)
            try:
                sandbox.base = await asyncio.to_thread(self._seed, sandbox, archive)
            except BaseException:
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(container.remove, force=True)
                raise
        finally:
            self._starting -= 1
        self._live[sandbox_id] = sandbox
        return sandbox

    def _seed(self, sandbox: DockerSandbox, archive: bytes | None) -> str:
        """Copy the template in, commit it; return the base commit."""
        if archive is not None:
            try:
                sandbox.container.put_archive(WORKSPACE, archive)
            except Exception as exc:
                raise sandbox._error("put_archive of the template", exc) from exc
        code, out, err = sandbox._run(["sh", "-c", _INIT_SCRIPT])
        text = out.decode(errors="replace").strip()
        if code == _MISSING_TOOL or code == 126:
            missing = text or "sh"
            raise SandboxError(
                f"image {self.image!r} has no {missing!r} on PATH: the docker sandbox backend needs sh, "
                f"git and GNU coreutils (timeout, realpath, stat) in the image, e.g. {DEFAULT_IMAGE!r} or "
                "an image built FROM python:3.11-slim with apt-get install -y git"
                + (f" ({err.decode(errors='replace').strip()})" if err.strip() else "")
            )
        if code or not text:
            raise SandboxError(
                f"committing the template in a new sandbox failed (exit {code}): "
                f"{err.decode(errors='replace').strip() or text}"
            )
        return text.splitlines()[-1]

    def _forget(self, sandbox: DockerSandbox) -> None:
        self._live.pop(sandbox.id, None)

    async def aclose(self) -> None:
        """Remove every container this backend still holds."""
        await asyncio.gather(*(s.close() for s in list(self._live.values())), return_exceptions=True)
