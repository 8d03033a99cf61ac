"""The Docker sandbox backend: a container per sandbox on a Docker Engine, the template copied into
its /workspace and committed as the diff base (see :mod:`horizonrl.sandbox.docker`)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import tarfile
import uuid
from pathlib import Path
from typing import Any

from horizonrl.sandbox.base import (
    WORKSPACE,
    SandboxCapacityError,
    SandboxError,
    SandboxLimits,
    SandboxSpec,
    SandboxUnavailableError,
)
from horizonrl.sandbox.docker.sandbox import MIB, DockerSandbox, as_root

DEFAULT_IMAGE = "python:3.11"
"""The default sandbox image: Debian with Python 3.11, git and coreutils (``-slim`` lacks git)."""
LABEL = "horizonrl.sandbox"
"""Label on every container this backend starts (value ``"1"``), to find leftovers."""
DEFAULT_SOCKET = "unix:///var/run/docker.sock"
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


def _tar_directory(root: Path) -> bytes | None:
    """A tar (in memory) of the contents of ``root``, symlinks kept as links; None if it is empty."""
    children = sorted(root.iterdir())
    if not children:
        return None
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for child in children:
            tar.add(child, arcname=child.name, filter=as_root)
    return buf.getvalue()


def _docker_host() -> str:
    host = os.environ.get("DOCKER_HOST")
    return f"DOCKER_HOST={host}" if host else f"the default socket {DEFAULT_SOCKET} (DOCKER_HOST is unset)"


class DockerBackend:
    """Creates container sandboxes on a Docker Engine (see :mod:`horizonrl.sandbox.docker`).

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
        fsize = limits.file_size_mib * MIB
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
            sandbox = DockerSandbox(sandbox_id, container, "", template, spec.limits, self._forget)
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
