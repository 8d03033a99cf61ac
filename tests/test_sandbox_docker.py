"""Tests of the Docker sandbox backend (:mod:`horizonrl.sandbox.docker`).

Two kinds:

* ``test_real_docker_round_trip`` uses the real Docker SDK and a real Docker Engine. This machine
  has the SDK but no engine, so it skips with the reason (see ``pytest -rs``); on a machine with
  Docker it runs create/exec/write/read/diff/close for real (image: ``$HORIZONRL_DOCKER_TEST_IMAGE``,
  default :data:`horizonrl.sandbox.docker.backend.DEFAULT_IMAGE`).
* Everything else runs :class:`DockerBackend` against :class:`FakeDockerClient`, an in-memory
  stand-in for the remote Docker Engine, which cannot exist on this machine. The fake implements
  only the SDK calls the backend makes (``ping``, ``containers.run``, ``exec_run``,
  ``put_archive``, ``get_archive``, ``remove``) and emulates them honestly: each container is a
  temporary directory whose ``workspace`` subdirectory stands in for ``/workspace``; ``exec_run``
  runs the command for real with :mod:`subprocess` (so ``git``, ``timeout``, ``realpath`` and
  ``sh`` really run), translating ``/workspace`` in its arguments and back in its output; the
  archive calls are real tar round trips. What it does *not* emulate: isolation (commands run on
  the host as this user; ``/tmp`` is the host's) and the limits — ``containers.run`` only records
  its arguments, which the tests check.
"""

from __future__ import annotations

import asyncio
import io
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from horizonrl.sandbox.base import (
    WORKSPACE,
    SandboxCapacityError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxLimits,
    SandboxPathError,
    SandboxSpec,
    SandboxUnavailableError,
)
from horizonrl.sandbox.docker.backend import DEFAULT_IMAGE, LABEL, DockerBackend
from horizonrl.sandbox.docker.sandbox import DockerSandbox, truncate_output

# --- the fake Docker Engine ---------------------------------------------------------------------


class FakeAPIError(Exception):
    """Stand-in for ``docker.errors.APIError``: carries the HTTP status the engine answered with."""

    status_code = 500

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        if status_code is not None:
            self.status_code = status_code


class NotFound(FakeAPIError):
    """Stand-in for ``docker.errors.NotFound`` (404): same class name and status as the SDK's."""

    status_code = 404


class FakeExecResult(NamedTuple):
    """Stand-in for ``docker.models.containers.ExecResult`` (exit_code, output)."""

    exit_code: int | None
    output: Any


_WORKSPACE_RE = re.compile(r"(?<![\w.-])/workspace(?=/|$|[^\w.-])")


class FakeContainer:
    """Stand-in for a ``docker.models.containers.Container`` on the (absent) remote engine.

    The container's filesystem is a temporary directory: ``<root>/workspace`` plays /workspace.
    ``exec_run`` really runs the command on the host (in that directory, with ``/workspace``
    translated in the arguments and back in the output, and exit codes reported as Docker does:
    128 + signal for a killed process, 127 for a missing executable). ``missing`` names tools the
    "image" lacks: they are left off PATH.
    """

    def __init__(self, image: str, kwargs: dict[str, Any], missing: tuple[str, ...] = ()) -> None:
        self.id = os.urandom(32).hex()
        self.name = kwargs.get("name", self.id[:12])
        self.image, self.kwargs = image, kwargs
        self.labels = dict(kwargs.get("labels") or {})
        self.root = Path(tempfile.mkdtemp(prefix="fake-docker-")).resolve()
        self.workspace = self.root / "workspace"
        self.workspace.mkdir()  # Docker creates working_dir
        self.status = "running"
        self.exec_calls: list[list[str]] = []
        self.remove_calls = 0
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.root),
            "LANG": "C.UTF-8",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_CONFIG_NOSYSTEM": "1",
        }
        if missing:
            self.env["PATH"] = self._path_without(missing)

    def _path_without(self, missing: tuple[str, ...]) -> str:
        """A bin directory with links to the host's tools the fake image has (all but ``missing``)."""
        bindir = self.root / "bin"
        bindir.mkdir()
        for tool in ("sh", "timeout", "realpath", "stat", "git", "cat", "mkdir", "dirname", "cp", "rm"):
            found = shutil.which(tool)
            if tool not in missing and found:
                (bindir / tool).symlink_to(found)
        return str(bindir)

    def _to_host(self, text: str) -> str:
        return _WORKSPACE_RE.sub(lambda _: str(self.workspace), text)

    def _from_host(self, data: bytes) -> bytes:
        return data.replace(str(self.workspace).encode(), WORKSPACE.encode()).replace(
            str(self.root).encode(), b""
        )

    def _fs(self, path: str) -> Path:
        """Where an absolute container path lives in the stand-in filesystem: always under the
        container's root, so even a broken backend cannot make the archive calls touch host files."""
        return self.root / posixpath.normpath("/" + path).lstrip("/")

    def _check_running(self) -> None:
        if self.status == "removed":
            raise NotFound(f"No such container: {self.id}")

    def exec_run(self, cmd: list[str] | str, *, demux: bool = False, workdir: str | None = None, **_: Any):
        """Run ``cmd`` for real in the stand-in filesystem; ``demux`` splits stdout and stderr."""
        self._check_running()
        argv = shlex.split(cmd) if isinstance(cmd, str) else list(cmd)
        self.exec_calls.append(argv)
        cwd = self._to_host(workdir or self.kwargs.get("working_dir") or "/")
        try:
            done = subprocess.run(
                [self._to_host(a) for a in argv],
                cwd=cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                check=False,
                executable=shutil.which(argv[0], path=self.env["PATH"]) or argv[0],
            )
        except FileNotFoundError:
            message = f'OCI runtime exec failed: exec: "{argv[0]}": executable file not found in $PATH\n'
            code, out, err = 127, message.encode(), b""
        else:
            code = done.returncode if done.returncode >= 0 else 128 - done.returncode
            out, err = self._from_host(done.stdout), self._from_host(done.stderr)
        if demux:
            return FakeExecResult(code, (out or None, err or None))
        return FakeExecResult(code, out + err)

    def put_archive(self, path: str, data: bytes) -> bool:
        """Extract the tar ``data`` into ``path`` (which must exist), as the engine does."""
        self._check_running()
        target = self._fs(path)
        if not target.is_dir():
            raise NotFound(f"Could not find the file {path} in container {self.id}")
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            if hasattr(tarfile, "tar_filter"):  # Python 3.11.4+
                tar.extractall(target, filter="tar")
            else:  # the test's own archives, built by the backend under test
                tar.extractall(target)
        return True

    def get_archive(self, path: str, chunk_size: int = 65536) -> tuple[Iterator[bytes], dict[str, Any]]:
        """A tar of ``path`` (streamed in chunks) and its stat, as the engine returns them."""
        self._check_running()
        source = self._fs(path)
        if not os.path.lexists(source):
            raise NotFound(f"Could not find the file {path} in container {self.id}")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(source, arcname=source.name)
        data = buf.getvalue()
        st = source.lstat()
        stat = {"name": source.name, "size": st.st_size, "mode": st.st_mode, "mtime": "", "linkTarget": ""}
        return iter([data[i : i + chunk_size] for i in range(0, len(data), chunk_size)]), stat

    def remove(self, *, force: bool = False, **_: Any) -> None:
        """Delete the container (its directory); a second remove is a 404, as on the engine."""
        self.remove_calls += 1
        self._check_running()
        if not force:
            raise FakeAPIError(f"cannot remove running container {self.id}: stop it or use force", 409)
        shutil.rmtree(self.root, ignore_errors=True)
        self.status = "removed"


class FakeContainers:
    """Stand-in for ``client.containers``: ``run`` records its arguments and makes a FakeContainer
    (the ``command``, ``sleep infinity``, is not run: the fake container needs no holder)."""

    def __init__(self, missing: tuple[str, ...]) -> None:
        self.missing = missing
        self.runs: list[tuple[str, dict[str, Any]]] = []
        self.created: list[FakeContainer] = []

    def run(self, image: str, command: Any = None, **kwargs: Any) -> FakeContainer:
        kwargs["command"] = command
        self.runs.append((image, kwargs))
        if not kwargs.get("detach"):
            raise AssertionError("the backend must run sandbox containers detached")
        container = FakeContainer(image, kwargs, self.missing)
        self.created.append(container)
        return container


class FakeDockerClient:
    """Stand-in for ``docker.DockerClient`` talking to a remote Docker Engine (none can run on this
    machine). ``ping_error``: the engine does not answer; ``missing``: tools the image lacks."""

    def __init__(self, ping_error: Exception | None = None, missing: tuple[str, ...] = ()) -> None:
        self.ping_error = ping_error
        self.containers = FakeContainers(missing)

    def ping(self) -> bool:
        if self.ping_error is not None:
            raise self.ping_error
        return True

    def cleanup(self) -> None:
        for container in self.containers.created:
            shutil.rmtree(container.root, ignore_errors=True)


@pytest.fixture
def fake() -> Iterator[FakeDockerClient]:
    client = FakeDockerClient()
    yield client
    client.cleanup()


@pytest.fixture
def template(tmp_path: Path) -> Path:
    root = tmp_path / "template"
    (root / "pkg").mkdir(parents=True)
    (root / "README.md").write_text("hello\n")
    (root / "pkg" / "mod.py").write_text("X = 1\n")
    run = root / "run.sh"
    run.write_text("#!/bin/sh\necho ran\n")
    run.chmod(0o755)
    return root


def _container(sandbox: DockerSandbox) -> FakeContainer:
    return sandbox.container


# --- the real engine ----------------------------------------------------------------------------


async def test_real_docker_round_trip(tmp_path: Path) -> None:
    """create/exec/write/read/diff/close against a real Docker Engine (skipped when none answers)."""
    docker = pytest.importorskip("docker", reason="the Docker SDK for Python is not installed")
    where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        docker.from_env().ping()
    except Exception as exc:
        pytest.skip(f"no Docker engine answers at {where}: {exc}")
    (tmp_path / "a.txt").write_text("one\n")
    backend = DockerBackend(os.environ.get("HORIZONRL_DOCKER_TEST_IMAGE", DEFAULT_IMAGE))
    try:
        async with await backend.create(SandboxSpec(template=str(tmp_path))) as sandbox:
            result = await sandbox.exec("cat a.txt && pwd")
            assert result.ok and result.stdout == f"one\n{WORKSPACE}\n"
            await sandbox.write_file("b/new.txt", b"two\n")
            assert await sandbox.read_file("/workspace/b/new.txt") == b"two\n"
            assert (await sandbox.exec("cat b/new.txt")).stdout == "two\n"
            timed = await sandbox.exec("sleep 5", timeout=1)
            assert timed.timed_out and timed.exit_code == 137
            connect = "import socket; socket.create_connection(('1.1.1.1', 80), 3)"
            no_net = await sandbox.exec(f'python3 -c "{connect}"')
            assert no_net.exit_code != 0 and "Error" in no_net.stderr  # network_disabled
            diff = await sandbox.diff()
            assert "b/new.txt" in diff and "new file mode" in diff
            with pytest.raises(SandboxPathError):
                await sandbox.read_file("../etc/passwd")
    finally:
        await backend.aclose()


# --- the fake engine ----------------------------------------------------------------------------


async def test_unavailable_when_ping_fails() -> None:
    client = FakeDockerClient(ping_error=ConnectionError("connection refused"))
    with pytest.raises(SandboxUnavailableError) as info:
        DockerBackend(client=client)
    message = str(info.value)
    assert "no Docker engine answered" in message and "connection refused" in message
    assert "bwrap" in message


async def test_unavailable_with_the_real_sdk_and_no_engine(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """docker.from_env() itself contacts the engine (docker 7 asks for its API version)."""
    pytest.importorskip("docker", reason="the Docker SDK for Python is not installed")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-such.sock")
    with pytest.raises(SandboxUnavailableError) as info:
        DockerBackend()
    assert f"DOCKER_HOST=unix://{tmp_path}/no-such.sock" in str(info.value)
    assert "bwrap" in str(info.value)


async def test_run_arguments_carry_the_limits(fake: FakeDockerClient) -> None:
    limits = SandboxLimits(cpu_s=30, memory_mib=512, processes=64, file_size_mib=8, tmp_mib=32)
    backend = DockerBackend("example/img:1", client=fake)
    async with await backend.create(SandboxSpec(limits=limits)):
        pass
    ((image, kwargs),) = fake.containers.runs
    assert image == "example/img:1"
    assert kwargs["command"] == ["sleep", "infinity"] and kwargs["detach"] is True
    assert kwargs["working_dir"] == WORKSPACE
    assert kwargs["labels"] == {LABEL: "1"}
    assert kwargs["network_disabled"] is True
    assert kwargs["mem_limit"] == "512m" and kwargs["memswap_limit"] == "512m"
    assert kwargs["pids_limit"] == 64
    ulimits = {u["name"]: (u["soft"], u["hard"]) for u in kwargs["ulimits"]}
    assert ulimits["cpu"] == (30, 30)
    assert ulimits["fsize"] == (8 * 1024 * 1024, 8 * 1024 * 1024)
    assert set(kwargs["tmpfs"]) == {"/tmp"} and "size=32m" in kwargs["tmpfs"]["/tmp"]
    assert "exec" in kwargs["tmpfs"]["/tmp"].split(",")

    with_net = DockerBackend(client=fake, network=True)
    async with await with_net.create():
        pass
    assert fake.containers.runs[-1][1]["network_disabled"] is False
    assert fake.containers.runs[-1][0] == DEFAULT_IMAGE


async def test_exec_round_trip(fake: FakeDockerClient, template: Path) -> None:
    backend = DockerBackend(client=fake)
    async with await backend.create(SandboxSpec(template=str(template))) as sandbox:
        result = await sandbox.exec("cat README.md; pwd; echo oops >&2; exit 3")
        assert result.exit_code == 3 and not result.ok
        assert result.stdout == f"hello\n{WORKSPACE}\n" and result.stderr == "oops\n"
        assert not result.truncated and not result.timed_out and result.duration > 0
        assert (await sandbox.exec("./run.sh")).stdout == "ran\n"  # modes survive the copy
        # state persists between calls
        await sandbox.exec("echo 42 > state.txt")
        assert (await sandbox.exec("cat state.txt")).stdout == "42\n"
        argv = _container(sandbox).exec_calls[-1]
        assert argv[:3] == ["timeout", "-s", "KILL"] and argv[4:] == ["sh", "-c", "cat state.txt"]
        assert sandbox.info().backend == "docker" and sandbox.info().template == str(template.resolve())
        with pytest.raises(SandboxError, match="non-empty"):
            await sandbox.exec("")


async def test_exec_truncates_each_stream(fake: FakeDockerClient) -> None:
    backend = DockerBackend(client=fake)
    spec = SandboxSpec(limits=SandboxLimits(output_bytes=1024))
    async with await backend.create(spec) as sandbox:
        result = await sandbox.exec(
            "head -c 5000 /dev/zero | tr '\\0' a; printf 'b%.0s' $(seq 100); echo err >&2"
        )
        assert result.truncated and result.stderr == "err\n"
        assert result.stdout.startswith("a" * 512 + "\n[... 4076 bytes cut ...]\n")
        assert result.stdout.endswith("a" * 412 + "b" * 100)
    assert truncate_output(b"x" * 10, 10) == ("x" * 10, False)


async def test_exec_timeout_kills_the_command(fake: FakeDockerClient) -> None:
    backend = DockerBackend(client=fake)
    async with await backend.create() as sandbox:
        start = time.perf_counter()
        result = await sandbox.exec("echo started; sleep 10; echo never", timeout=0.5)
        assert time.perf_counter() - start < 5
        assert result.timed_out and result.exit_code == 137 and not result.ok
        assert "never" not in result.stdout
        quick = await sandbox.exec("exit 137", timeout=5)  # 137 before the timeout: not a timeout
        assert quick.exit_code == 137 and not quick.timed_out


async def test_read_write_diff(fake: FakeDockerClient, template: Path) -> None:
    backend = DockerBackend(client=fake)
    async with await backend.create(SandboxSpec(template=str(template))) as sandbox:
        assert await sandbox.diff() == ""
        assert await sandbox.read_file("README.md") == b"hello\n"
        assert await sandbox.read_file("/workspace/pkg/mod.py") == b"X = 1\n"
        await sandbox.write_file("pkg/mod.py", b"X = 2\n")
        await sandbox.write_file("/workspace/new/deep/file.txt", b"fresh\n")
        await sandbox.write_file("blob.bin", bytes(range(256)))
        await sandbox.write_file("run.sh", b"#!/bin/sh\necho changed\n")
        assert await sandbox.read_file("new/deep/file.txt") == b"fresh\n"
        assert await sandbox.read_file("blob.bin") == bytes(range(256))
        assert (await sandbox.exec("cat pkg/mod.py; ./run.sh")).stdout == "X = 2\nchanged\n"
        await sandbox.exec("ln -s pkg/mod.py link.py && rm README.md")
        assert await sandbox.read_file("link.py") == b"X = 2\n"  # a symlink inside the workspace is fine

        diff = await sandbox.diff()
        assert "-X = 1\n+X = 2" in diff
        assert "diff --git a/new/deep/file.txt b/new/deep/file.txt\nnew file mode 100644" in diff
        assert "GIT binary patch" in diff
        assert "deleted file mode" in diff and "README.md" in diff
        assert "run.sh" in diff and "old mode" not in diff  # overwriting kept the executable bit
        # the agent's own index is untouched by diff
        assert (await sandbox.exec("git status --porcelain")).stdout.count("??") >= 2

        with pytest.raises(SandboxFileNotFoundError):
            await sandbox.read_file("missing.txt")
        with pytest.raises(SandboxFileNotFoundError):
            await sandbox.read_file("pkg")  # a directory is not a file
        with pytest.raises(SandboxPathError, match="directory"):
            await sandbox.write_file("pkg", b"x")
        with pytest.raises(SandboxError, match="larger than 4 bytes"):
            await sandbox.read_file("blob.bin", max_bytes=4)
        with pytest.raises(SandboxError, match="file_size_mib"):
            await sandbox.write_file("big", b"x" * (sandbox.limits.file_size_mib * 1024 * 1024 + 1))


async def test_diff_sees_a_same_size_change_in_the_second_of_the_commit(
    fake: FakeDockerClient, tmp_path: Path
) -> None:
    """Git's "racy clean" case: a file changed without changing its size, in the same second as the
    template commit (mtimes count in whole seconds), must still show up in the diff."""
    root = tmp_path / "racy"
    root.mkdir()
    time.sleep(1 - time.time() % 1 + 0.01)  # start of a second: the steps below fit in it
    (root / "f.txt").write_text("X = 1\n")
    backend = DockerBackend(client=fake)
    async with await backend.create(SandboxSpec(template=str(root))) as sandbox:
        await sandbox.write_file("f.txt", b"X = 2\n")
        time.sleep(1 - time.time() % 1 + 0.01)  # the diff runs in a later second
        assert "-X = 1\n+X = 2" in await sandbox.diff()


async def test_paths_outside_the_workspace_are_refused(fake: FakeDockerClient, template: Path) -> None:
    backend = DockerBackend(client=fake)
    async with await backend.create(SandboxSpec(template=str(template))) as sandbox:
        await sandbox.exec("ln -s /etc etc_link")
        for bad in ("../../../etc/passwd", "/etc/passwd", "etc_link/hostname", "/workspace/../x"):
            with pytest.raises(SandboxPathError, match="outside /workspace"):
                await sandbox.read_file(bad)
            with pytest.raises(SandboxPathError, match="outside /workspace"):
                await sandbox.write_file(bad, b"pwned")
        with pytest.raises(SandboxPathError, match="directory"):
            await sandbox.write_file("/workspace", b"x")
        with pytest.raises(SandboxPathError, match="non-empty"):
            await sandbox.read_file("")
        root = _container(sandbox).root
        assert sorted(p.name for p in root.iterdir()) == ["workspace"]  # nothing written elsewhere


async def test_image_without_git_is_refused_and_removed(template: Path) -> None:
    client = FakeDockerClient(missing=("git",))
    try:
        backend = DockerBackend("tiny:latest", client=client)
        with pytest.raises(SandboxError, match=r"image 'tiny:latest' has no 'git'.*needs sh, git"):
            await backend.create(SandboxSpec(template=str(template)))
        (container,) = client.containers.created
        assert container.status == "removed" and backend.live == 0
    finally:
        client.cleanup()


async def test_template_must_be_a_directory(fake: FakeDockerClient, tmp_path: Path) -> None:
    backend = DockerBackend(client=fake)
    with pytest.raises(SandboxError, match="is not a directory"):
        await backend.create(SandboxSpec(template=str(tmp_path / "nope")))
    assert fake.containers.runs == []


async def test_close_is_idempotent_and_capacity_is_enforced(fake: FakeDockerClient) -> None:
    backend = DockerBackend(client=fake, max_sandboxes=2)
    first, second = await asyncio.gather(backend.create(), backend.create())
    with pytest.raises(SandboxCapacityError, match="max_sandboxes=2"):
        await backend.create()
    await first.close()
    await first.close()
    assert _container(first).remove_calls == 1 and _container(first).status == "removed"
    assert first.closed and backend.live == 1
    with pytest.raises(SandboxError, match="is closed"):
        await first.exec("true")

    _container(second).remove(force=True)  # the container vanished behind our back
    with pytest.raises(SandboxError, match="has stopped"):
        await second.exec("true")
    await second.close()  # already gone: still fine
    assert backend.live == 0

    third = await backend.create()
    await backend.aclose()
    assert third.closed and _container(third).status == "removed" and backend.live == 0
