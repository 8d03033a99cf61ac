"""The sandbox server and its client, end to end: a real uvicorn server on 127.0.0.1 (in a thread)
over real bubblewrap sandboxes, driven through :class:`RemoteBackend` and raw HTTP.

Every server fixture checks at teardown that the backend holds no sandbox and that no process of
any sandbox it created is left on the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import uvicorn

from horizonrl.sandbox.base import (
    ExecResult,
    SandboxAuthError,
    SandboxCapacityError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxLimitError,
    SandboxLimits,
    SandboxNotFoundError,
    SandboxPathError,
    SandboxQuotaError,
    SandboxSpec,
    SandboxUnavailableError,
)
from horizonrl.sandbox.bwrap import BwrapBackend, BwrapOptions, BwrapSandbox
from horizonrl.sandbox.remote import RemoteBackend, RemoteSandbox
from horizonrl.sandbox.server import DEFAULT_CEILINGS, UVICORN_OPTIONS, ServerLimits, create_app
from horizonrl.sandbox.server.limits import cap_output
from horizonrl.sandbox.server.quota import POLL_S

TOKEN = "test-" + secrets.token_hex(16)


# --- a real server in a thread ------------------------------------------------------------------


@dataclass
class Running:
    """One sandbox server started by the ``start_server`` fixture."""

    url: str
    backend: BwrapBackend
    state_dir: Path
    server: uvicorn.Server
    thread: threading.Thread
    created_ids: list[str] = field(default_factory=list)

    def remote(self, token: str = TOKEN) -> RemoteBackend:
        return RemoteBackend(self.url, token, timeout_s=30.0)

    def raw(self, token: str | None = TOKEN) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=30.0)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "the sandbox server did not stop within 30 s"


def _cgroup_names(ids: list[str]) -> set[str]:
    return {f"{os.getpid()}-{i}" for i in ids}


def sandbox_processes(running: Running, ids: list[str] | None = None) -> list[str]:
    """Host processes of this server's sandboxes (all, or those with ``ids``): in one of their
    cgroups, or with the server's state directory on their command line."""
    names = _cgroup_names(running.created_ids if ids is None else ids)
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            groups = {line.rsplit("/", 1)[-1] for line in (proc / "cgroup").read_text().splitlines()}
        except OSError:
            continue  # exited while we looked
        if names & groups or (ids is None and str(running.state_dir) in cmdline):
            found.append(f"{proc.name}: {cmdline}")
    return found


def leftover_cgroups(running: Running) -> list[str]:
    root = Path("/sys/fs/cgroup")
    names = _cgroup_names(running.created_ids)
    candidates = [root / "horizonrl", root / "pids" / "horizonrl", root / "memory" / "horizonrl"]
    return [str(d / n) for d in candidates for n in names if (d / n).exists()]


def _free_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP_NODELAY needs proto
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., Running]]:
    """Start sandbox servers (``create_app`` keyword arguments); each is stopped and checked for
    leftovers at the end of the test."""
    started: list[Running] = []

    def start(**app_kwargs: object) -> Running:
        state_dir = tmp_path / f"state{len(started)}"
        more = app_kwargs.pop("bwrap", {})  # more BwrapOptions
        options = BwrapOptions(state_dir=str(state_dir), cache_dir=str(tmp_path / "cache"), **more)  # type: ignore[arg-type]
        backend = BwrapBackend(options)
        running_ids: list[str] = []
        create = backend.create

        async def recording_create(spec: SandboxSpec | None = None) -> BwrapSandbox:
            sandbox = await create(spec)
            running_ids.append(sandbox.id)
            return sandbox

        backend.create = recording_create  # type: ignore[method-assign]
        app = create_app(backend, TOKEN, **app_kwargs)  # type: ignore[arg-type]
        sock = _free_socket()
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=10, **UVICORN_OPTIONS)
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        running = Running(url, backend, state_dir, server, thread, running_ids)
        started.append(running)
        deadline = time.monotonic() + 15
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    return running
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the sandbox server did not answer /health within 15 s"
            assert thread.is_alive(), "the sandbox server thread died while starting"
            time.sleep(0.02)

    yield start
    for running in started:
        running.stop()
    for running in started:
        assert running.backend.live == 0, "the server left sandboxes open after shutdown"
        assert sandbox_processes(running) == []
        assert leftover_cgroups(running) == []


@pytest.fixture
def server(start_server: Callable[..., Running]) -> Running:
    return start_server()


async def metric(running: Running, name: str) -> float:
    async with running.raw() as http:
        response = await http.get("/metrics")
    assert response.status_code == 200, response.text
    for line in response.text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name} in:\n{response.text}")


# --- the contract through RemoteBackend ---------------------------------------------------------


async def test_round_trip_through_remote_backend(server: Running) -> None:
    async with server.remote() as remote:
        assert (await remote.health()).backend == "bwrap"
        sandbox = await remote.create()
        assert isinstance(sandbox, RemoteSandbox)
        assert [s.id for s in await remote.list_sandboxes()] == [sandbox.id]

        result = await sandbox.exec("echo out; echo err >&2; exit 3")
        assert (result.exit_code, result.stdout, result.stderr, result.ok) == (3, "out\n", "err\n", False)
        assert (await sandbox.exec("pwd")).stdout == "/workspace\n"

        blob = bytes(range(256)) * 4  # not UTF-8: must survive base64 both ways
        await sandbox.write_file("sub/dir/blob.bin", blob)
        await sandbox.write_file("/workspace/notes.txt", b"hello\n")
        assert await sandbox.read_file("sub/dir/blob.bin") == blob
        assert await sandbox.read_file("notes.txt") == b"hello\n"
        assert (await sandbox.exec("cat notes.txt")).stdout == "hello\n"
        with pytest.raises(SandboxFileNotFoundError, match=r"missing\.txt"):
            await sandbox.read_file("missing.txt")

        diff = await sandbox.diff()
        assert "+++ b/notes.txt" in diff and "+hello" in diff
        assert "sub/dir/blob.bin" in diff and "GIT binary patch" in diff

        timed = await sandbox.exec("sleep 5", timeout=0.5)
        assert timed.timed_out and not timed.ok

        await sandbox.close()
        await sandbox.close()  # idempotent
        assert sandbox.closed and server.backend.live == 0
        with pytest.raises(SandboxError, match="closed"):
            await sandbox.exec("true")
        async with server.raw() as http:
            assert (await http.get(f"/sandboxes/{sandbox.id}")).status_code == 404

        async with await remote.create() as scoped:
            assert (await scoped.exec("echo scoped")).stdout == "scoped\n"
        assert server.backend.live == 0
        await remote.create()  # left open on purpose: aclose must delete it
    assert server.backend.live == 0


async def test_missing_or_wrong_token_is_401(server: Running) -> None:
    async with server.raw(token=None) as anonymous, server.raw(token="wrong") as wrong:
        assert (await anonymous.get("/health")).status_code == 200  # health needs no token
        for client in (anonymous, wrong):
            for method, path in [("GET", "/sandboxes"), ("POST", "/sandboxes"), ("GET", "/metrics")]:
                response = await client.request(method, path)
                assert response.status_code == 401, (method, path, response.text)
                assert response.headers["www-authenticate"] == "Bearer"
                assert response.json()["code"] == "unauthorized"
        response = await anonymous.get("/sandboxes", headers={"Authorization": f"Basic {TOKEN}"})
        assert response.status_code == 401
    async with server.remote(token="wrong") as remote:
        with pytest.raises(SandboxAuthError, match="token"):
            await remote.create()
    assert server.backend.live == 0


async def test_malformed_body_is_422(server: Running) -> None:
    async with server.remote() as remote, server.raw() as http:
        sandbox = await remote.create()
        exec_path = f"/sandboxes/{sandbox.id}/exec"
        for body in [{}, {"cmd": "true", "timeout": -1}, {"cmd": ""}, {"cmd": "true", "extra": 1}]:
            response = await http.post(exec_path, json=body)
            assert response.status_code == 422, (body, response.text)
        assert (await http.post("/sandboxes", json={"limits": {"memory_mib": 1}})).status_code == 422
        write = await http.post(f"/sandboxes/{sandbox.id}/files/write", json={"path": "a", "data": "a"})
        assert write.status_code == 422
        with pytest.raises(SandboxError, match="timeout"):
            await sandbox.exec("true", timeout=-1)
        assert (await sandbox.exec("echo still fine")).stdout == "still fine\n"


async def test_unknown_sandbox_is_404(server: Running) -> None:
    async with server.raw() as http:
        for method, path, body in [
            ("GET", "/sandboxes/nope", None),
            ("POST", "/sandboxes/nope/exec", {"cmd": "true"}),
            ("POST", "/sandboxes/nope/files/read", {"path": "a"}),
            ("GET", "/sandboxes/nope/diff", None),
            ("DELETE", "/sandboxes/nope", None),
        ]:
            response = await http.request(method, path, json=body)
            assert response.status_code == 404, (method, path, response.text)
            assert response.json()["code"] == "sandbox_not_found"
            assert "'nope'" in response.json()["detail"]
        async with server.remote() as remote:
            sandbox = await remote.create()
            assert (await http.delete(f"/sandboxes/{sandbox.id}")).status_code == 204
            with pytest.raises(SandboxNotFoundError, match=sandbox.id):
                await sandbox.exec("true")
            with pytest.raises(SandboxNotFoundError):
                await sandbox.read_file("a")
            await sandbox.close()  # already gone on the server: not an error
            assert sandbox.closed


async def test_capacity_429_then_recovers(start_server: Callable[..., Running]) -> None:
    server = start_server(max_sandboxes=2)
    async with server.remote() as remote, server.raw() as http:
        first, _second = await remote.create(), await remote.create()
        with pytest.raises(SandboxCapacityError, match=r"2 sandboxes are open .* at most 2"):
            await remote.create()
        response = await http.post("/sandboxes", json={})
        assert response.status_code == 429 and response.json()["code"] == "capacity"
        health = (await http.get("/health")).json()
        assert (health["sandboxes"], health["capacity"]) == (2, 2)
        await first.close()
        third = await remote.create()
        assert (await third.exec("echo again")).stdout == "again\n"
        assert await metric(server, "horizonrl_sandboxes_rejected_total") == 2
        assert await metric(server, "horizonrl_sandboxes_created_total") == 3


async def test_capacity_holds_under_concurrent_creates(start_server: Callable[..., Running]) -> None:
    server = start_server(max_sandboxes=3)
    async with server.remote() as remote:
        results = await asyncio.gather(*(remote.create() for _ in range(8)), return_exceptions=True)
        opened = [r for r in results if isinstance(r, RemoteSandbox)]
        refused = [r for r in results if isinstance(r, SandboxCapacityError)]
        assert (len(opened), len(refused)) == (3, 5), results
        assert server.backend.live == 3


async def test_path_traversal_is_refused(server: Running) -> None:
    passwd = Path("/etc/passwd")
    before = hashlib.sha256(passwd.read_bytes()).hexdigest()
    async with server.remote() as remote, server.raw() as http:
        sandbox = await remote.create()
        assert (await sandbox.exec("ln -s /etc/passwd link && ln -s / root")).ok
        for path in [
            "../../etc/passwd",
            "/etc/passwd",
            "/workspace/../etc/passwd",
            "link",
            "root/etc/passwd",
        ]:
            with pytest.raises(SandboxPathError, match="outside"):
                await sandbox.read_file(path)
            with pytest.raises(SandboxPathError, match="outside"):
                await sandbox.write_file(path, b"pwned\n")
        response = await http.post(f"/sandboxes/{sandbox.id}/files/read", json={"path": "../../etc/passwd"})
        assert response.status_code == 400 and response.json()["code"] == "bad_path"
        with pytest.raises(SandboxPathError, match="non-empty"):
            await sandbox.read_file("")
        assert (await sandbox.exec("readlink link")).stdout == "/etc/passwd\n"  # the symlink is intact
    assert hashlib.sha256(passwd.read_bytes()).hexdigest() == before
    assert b"pwned" not in passwd.read_bytes()


async def test_idle_sandboxes_are_reaped(start_server: Callable[..., Running]) -> None:
    server = start_server(idle_ttl_s=0.4, reap_interval_s=0.05)
    async with server.remote() as remote:
        busy, idle = await remote.create(), await remote.create()
        # a command running longer than the TTL keeps its sandbox alive
        assert (await busy.exec("sleep 1; echo done")).stdout == "done\n"
        deadline = time.monotonic() + 10
        while server.backend.live:
            assert time.monotonic() < deadline, "idle sandboxes were not reaped within 10 s"
            await asyncio.sleep(0.05)
        for sandbox in (busy, idle):
            with pytest.raises(SandboxNotFoundError, match="idle"):
                await sandbox.exec("true")
            await sandbox.close()
        assert await metric(server, "horizonrl_sandboxes_reaped_total") == 2
        assert await metric(server, "horizonrl_sandboxes_live") == 0


async def test_client_disconnecting_mid_exec(server: Running) -> None:
    async with server.remote() as remote, server.raw() as http:
        sandbox = await remote.create()
        with pytest.raises(httpx.ReadTimeout):
            await http.post(f"/sandboxes/{sandbox.id}/exec", json={"cmd": "sleep 2"}, timeout=0.3)
        async with server.raw(token=None) as fresh:
            assert (await fresh.get("/health")).status_code == 200
        assert (await sandbox.exec("echo ok")).stdout == "ok\n"
        # the server noticed the disconnect and killed the command (well before its 2 s)
        deadline = time.monotonic() + 5
        while await metric(server, "horizonrl_exec_cancelled_total") < 1:
            assert time.monotonic() < deadline, "the abandoned exec was never cancelled"
            await asyncio.sleep(0.05)
        assert not [p for p in sandbox_processes(server, [sandbox.id]) if "sleep 2" in p]
        assert (await sandbox.exec("echo still ok")).stdout == "still ok\n"


async def test_template_by_name(start_server: Callable[..., Running], tmp_path: Path) -> None:
    templates = tmp_path / "templates"
    (templates / "proj" / "src").mkdir(parents=True)
    (templates / "proj" / "src" / "main.py").write_text("print('template')\n")
    (templates / "other").mkdir()
    server = start_server(templates_dir=str(templates))
    async with server.remote() as remote:
        sandbox = await remote.create(SandboxSpec(template="proj"))
        assert sandbox.created_info.template == "proj"
        assert (await sandbox.exec("cat src/main.py")).stdout == "print('template')\n"
        await sandbox.write_file("src/main.py", b"print('changed')\n")
        assert "+print('changed')" in await sandbox.diff()
        assert (templates / "proj" / "src" / "main.py").read_text() == "print('template')\n"
        for name in ["nope", "../proj", "/etc", str(templates / "proj"), ".."]:
            with pytest.raises(SandboxPathError, match="available templates: 'other', 'proj'"):
                await remote.create(SandboxSpec(template=name))
    plain = start_server()
    async with plain.remote() as remote:
        with pytest.raises(SandboxPathError, match="without a templates directory"):
            await remote.create(SandboxSpec(template="proj"))


async def test_openapi_lists_sandbox_paths(server: Running) -> None:
    async with server.raw(token=None) as http:
        spec = (await http.get("/openapi.json")).json()
    assert {
        "/health",
        "/metrics",
        "/sandboxes",
        "/sandboxes/{sandbox_id}",
        "/sandboxes/{sandbox_id}/exec",
        "/sandboxes/{sandbox_id}/files/read",
        "/sandboxes/{sandbox_id}/files/write",
        "/sandboxes/{sandbox_id}/diff",
    } <= set(spec["paths"])
    assert {"ExecRequest", "ExecResult", "SandboxSpec", "SandboxInfo", "ErrorBody", "FileData"} <= set(
        spec["components"]["schemas"]
    )
    exec_op = spec["paths"]["/sandboxes/{sandbox_id}/exec"]["post"]
    assert exec_op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/ExecResult"
    )


async def test_metrics_report_execs(server: Running) -> None:
    async with server.remote() as remote:
        sandbox = await remote.create()
        for i in range(3):
            await sandbox.exec(f"echo {i}")
        await sandbox.exec("sleep 5", timeout=0.2)
        assert await metric(server, "horizonrl_exec_total") == 4
        assert await metric(server, "horizonrl_exec_seconds_count") == 4
        assert await metric(server, "horizonrl_exec_seconds_sum") >= 0.2
        assert await metric(server, "horizonrl_exec_timeouts_total") == 1
        assert await metric(server, "horizonrl_sandboxes_live") == 1
        assert await metric(server, "horizonrl_sandboxes_created_total") == 1


async def test_unreachable_server_is_unavailable() -> None:
    sock = _free_socket()  # bound but not listening: connections are refused
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        async with RemoteBackend(url, TOKEN, timeout_s=5) as remote:
            with pytest.raises(SandboxUnavailableError, match=url):
                await remote.create()
    finally:
        sock.close()


def test_serve_runs_until_sigterm_and_closes_its_sandboxes(tmp_path: Path) -> None:
    """``serve`` (the production entry point) in its own process: answers, and on SIGTERM closes
    every sandbox it holds before exiting."""
    with _free_socket() as sock:
        port = sock.getsockname()[1]
    state_dir = tmp_path / "state"
    script = (
        "from horizonrl.sandbox.bwrap import BwrapBackend, BwrapOptions\n"
        "from horizonrl.sandbox.server import serve\n"
        f"options = BwrapOptions(state_dir={str(state_dir)!r}, cache_dir={str(tmp_path / 'cache')!r})\n"
        "backend = BwrapBackend(options)\n"
        f"serve('127.0.0.1', {port}, {TOKEN!r}, backend=backend)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, f"serve exited early: {proc.stderr.read() if proc.stderr else ''}"
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "serve did not answer /health within 30 s"
            time.sleep(0.05)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        created = httpx.post(f"{url}/sandboxes", json={}, headers=headers, timeout=30)
        assert created.status_code == 201, created.text
        sandbox_id = created.json()["id"]
        answer = httpx.post(f"{url}/sandboxes/{sandbox_id}/exec", json={"cmd": "echo hi"}, headers=headers)
        assert answer.json()["stdout"] == "hi\n"
        assert any(str(state_dir) in p for p in _command_lines())
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    # uvicorn shuts down gracefully, then re-raises the signal: exit status -SIGTERM
    assert proc.returncode in (0, -signal.SIGTERM), proc.stderr.read() if proc.stderr else ""
    assert [p for p in _command_lines() if str(state_dir) in p] == []
    assert list(state_dir.iterdir()) == []


def _command_lines() -> list[str]:
    lines = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit():
                lines.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
    return lines


# --- long commands, request size, auth before the body, bad options ---------------------------

MIB = 1024 * 1024


def _probe(padding: str) -> str:
    """A command carrying ``padding`` that reports what an exec's semantics are made of: its
    length, ``$0``, its stdin (empty), the workspace listing (no file of the server's) and its status."""
    return f"p='{padding}'\nprintf '%s\\n' \"$p\"; echo ${{#p}} $0; cat; ls -A; exit 7\n"


async def test_command_over_128_kib_runs_and_its_output_comes_back(server: Running) -> None:
    padding = "x" * (200 * 1024)
    async with server.remote() as remote:
        sandbox = await remote.create()
        short = await sandbox.exec(_probe("y"))
        long = await sandbox.exec(_probe(padding))
        assert len(_probe(padding).encode()) > 200 * 1024
        assert (long.exit_code, long.stderr, long.truncated) == (7, "", False)
        assert long.stdout == short.stdout.replace("y\n1 ", f"{padding}\n{len(padding)} ", 1)
        assert await sandbox.diff() == ""  # the command's file is gone


def _reset_peak_rss() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS


def _rss_kib(field: str) -> int:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field))
    return int(line.split()[1])


async def _chunks(total: int) -> AsyncIterator[bytes]:
    chunk = b"x" * MIB
    for _ in range(total // MIB):
        yield chunk


async def _post_measuring_peak(
    server: Running, path: str, total: int, declare: bool
) -> tuple[httpx.Response, float]:
    """POST ``total`` bytes (streamed from one reused chunk; with a Content-Length when ``declare``,
    else chunked); the answer and how many MiB this process's (the server's) peak RSS rose meanwhile."""
    headers = {"content-type": "application/json", **({"content-length": str(total)} if declare else {})}
    async with server.raw() as http:
        await http.get("/health")  # the connection is open before measuring
        _reset_peak_rss()
        before = _rss_kib("VmRSS:")
        response = await http.post(path, content=_chunks(total), headers=headers)
        return response, (_rss_kib("VmHWM:") - before) / 1024


@pytest.mark.parametrize("declare", [True, False], ids=["content-length", "chunked"])
async def test_body_over_the_limit_is_413_and_memory_stays_flat(
    start_server: Callable[..., Running], declare: bool
) -> None:
    server = start_server(max_request_bytes=MIB)
    async with server.remote() as remote:
        sandbox = await remote.create()
        path = f"/sandboxes/{sandbox.id}/files/write"
        response, grew_mib = await _post_measuring_peak(server, path, 48 * MIB, declare)
        assert response.status_code == 413, response.text
        assert response.json()["code"] == "request_too_large"
        assert "limit of 1 MiB (1048576 bytes)" in response.json()["detail"]
        assert grew_mib < 16, f"the server's memory rose {grew_mib:.0f} MiB for a refused 48 MiB body"
        assert (await sandbox.exec("ls -A")).stdout == ".git\n"  # nothing written, server fine


async def test_remote_client_reports_413_and_401_in_one_line(start_server: Callable[..., Running]) -> None:
    server = start_server(max_request_bytes=MIB)
    async with server.remote() as remote:
        sandbox = await remote.create()
        with pytest.raises(SandboxError, match=r"answered 413: .*limit of 1 MiB") as too_large:
            await sandbox.write_file("big.bin", b"x" * MIB)
        await sandbox.write_file("small.bin", b"x" * 1024)
    async with server.remote(token="wrong") as remote:
        with pytest.raises(SandboxAuthError, match=r"answered 401: .*HORIZON_SANDBOX_TOKEN") as refused:
            await remote.create()
    for error in (too_large.value, refused.value):
        assert "\n" not in str(error) and server.url in str(error)


MALFORMED = {"content": b'{"cmd": "true"', "headers": {"content-type": "application/json"}}


async def test_malformed_json_without_token_is_401(server: Running) -> None:
    async with server.raw(token=None) as anonymous, server.raw(token="wrong") as wrong:
        for client in (anonymous, wrong):
            for path in ["/sandboxes", "/sandboxes/nope/exec", "/sandboxes/nope/files/write"]:
                response = await client.post(path, **MALFORMED)
                assert response.status_code == 401, (path, response.text)
                assert response.json()["code"] == "unauthorized"


async def test_malformed_json_with_token_is_422(server: Running) -> None:
    async with server.remote() as remote, server.raw() as http:
        sandbox = await remote.create()
        for path in ["/sandboxes", f"/sandboxes/{sandbox.id}/exec", f"/sandboxes/{sandbox.id}/files/write"]:
            response = await http.post(path, **MALFORMED)
            assert response.status_code == 422, (path, response.text)
            assert response.json()["detail"][0]["type"] == "json_invalid"


@pytest.mark.parametrize("port", ["99999", "0", "65536"])
def test_bad_port_is_a_one_line_error(port: str, tmp_path: Path) -> None:
    horizon = Path(sys.executable).with_name("horizon")
    env = {**os.environ, "HORIZON_SANDBOX_TOKEN": TOKEN, "TMPDIR": str(tmp_path)}
    command = [str(horizon), "sandbox", "serve", "--port", port]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert f"--port {port}" in proc.stderr and "1-65535" in proc.stderr


# --- the server's limits: ceilings, output, workspace quota, limits it cannot enforce -------------

ROOT_CGROUPS = os.geteuid() == 0 and (
    Path("/sys/fs/cgroup/cgroup.controllers").exists() or Path("/sys/fs/cgroup/pids").is_dir()
)


def own_cgroups() -> list[str]:
    """Cgroup directories of sandboxes created by this process (live or not)."""
    root = Path("/sys/fs/cgroup")
    parents = [root / "horizonrl", root / "pids" / "horizonrl", root / "memory" / "horizonrl"]
    parents.append(root / "freezer" / "horizonrl")
    return [str(d) for p in parents if p.is_dir() for d in p.glob(f"{os.getpid()}-*")]


def disk_bytes(path: Path) -> int:
    return sum(p.lstat().st_blocks * 512 for p in path.rglob("*") if not p.is_symlink())


async def test_a_limit_above_its_ceiling_is_422_naming_limit_ceiling_and_value(server: Running) -> None:
    asked = {"processes": 10_000_000, "memory_mib": 10_000_000, "tmp_mib": 10_000_000}
    async with server.raw() as http, server.remote() as remote:
        response = await http.post("/sandboxes", json={"limits": {**asked, "output_bytes": 10**12}})
        assert response.status_code == 422, response.text
        body = response.json()
        assert body["code"] == "limit_above_ceiling" and "\n" not in body["detail"]
        for name, value in [*asked.items(), ("output_bytes", 10**12)]:
            ceiling = getattr(DEFAULT_CEILINGS, name)
            assert f"limits.{name}={value} is above this server's ceiling of {ceiling}" in body["detail"]
        assert "--max-processes" in body["detail"] and "--max-output-bytes" in body["detail"]
        with pytest.raises(SandboxLimitError, match=r"limits\.processes=10000000 .* ceiling of 512"):
            await remote.create(SandboxSpec(limits=SandboxLimits(processes=10_000_000)))
        assert (await http.get("/sandboxes")).json() == []
        assert await metric(server, "horizonrl_sandboxes_refused_limits_total") == 2
        at_ceiling = SandboxLimits(**DEFAULT_CEILINGS.model_dump())
        box = await remote.create(SandboxSpec(limits=at_ceiling))
        assert (await box.info()).limits == DEFAULT_CEILINGS
    assert server.backend.live == 0


async def test_limits_left_out_get_their_defaults_within_lowered_ceilings(
    start_server: Callable[..., Running],
) -> None:
    ceilings = SandboxLimits(memory_mib=512, processes=128, output_bytes=4096)
    server = start_server(limits=ServerLimits(ceilings=ceilings))
    async with server.remote() as remote, server.raw() as http:
        box = await remote.create()  # no limits sent: the defaults, cut to the ceilings
        limits = (await box.info()).limits
        assert (limits.memory_mib, limits.processes, limits.output_bytes) == (512, 128, 4096)
        assert (limits.cpu_s, limits.tmp_mib) == (SandboxLimits().cpu_s, SandboxLimits().tmp_mib)
        asked = await http.post("/sandboxes", json={"limits": {"memory_mib": 1024}})
        assert asked.status_code == 422 and "limits.memory_mib=1024" in asked.json()["detail"]


async def test_exec_output_is_cut_at_the_servers_ceiling(start_server: Callable[..., Running]) -> None:
    server = start_server(limits=ServerLimits(ceilings=SandboxLimits(output_bytes=4096)))
    async with server.remote() as remote, server.raw() as http:
        box = await remote.create()
        result = await box.exec("echo first; head -c 30000000 /dev/zero | tr '\\0' x; echo", timeout=60)
        assert result.truncated and result.stdout.startswith("first\n") and "bytes cut" in result.stdout
        assert len(result.stdout) < 4096 + 100
        too_much = await http.post("/sandboxes", json={"limits": {"output_bytes": 10**12}})
        assert too_much.status_code == 422


def test_output_a_backend_let_through_is_cut_to_the_limit() -> None:
    flood = ExecResult(exit_code=0, stdout="a" * 100 + "x" * 100_000 + "z" * 100, stderr="e", duration=0.1)
    cut = cap_output(flood, 1024)
    assert cut.truncated and cut.stderr == "e"
    assert cut.stdout.startswith("a" * 100) and cut.stdout.endswith("z" * 100)
    assert "[... 99176 bytes cut ...]" in cut.stdout and len(cut.stdout.encode()) < 1024 + 64
    within = ExecResult(exit_code=0, stdout="é" * 1000, stderr="", duration=0.1)
    assert cap_output(within, 1024) is within  # 2000 bytes of UTF-8, 1000 characters: a backend's cut


QUOTA_MIB = 8


async def test_workspace_quota_kills_the_writer_refuses_writes_and_recovers(
    start_server: Callable[..., Running],
) -> None:
    server = start_server(limits=ServerLimits(workspace_mib=QUOTA_MIB))
    async with server.remote() as remote:
        box = await remote.create()
        slow = "for i in $(seq 100); do head -c 1000000 /dev/zero > f$i; sleep 0.05; done; echo finished"
        result = await box.exec(slow, timeout=60)
        assert result.over_quota and not result.ok and "finished" not in result.stdout
        assert (
            result.stderr.startswith("[sandbox: the workspace holds ") and "quota of 8.0 MiB" in result.stderr
        )
        assert disk_bytes(server.state_dir) < 20 * MIB  # stopped within a poll of the quota
        with pytest.raises(SandboxQuotaError, match=r"write_file of 1024 bytes refused: .*quota of 8\.0 MiB"):
            await box.write_file("more.txt", b"x" * 1024)
        fast = await box.exec("ls | wc -l")  # runs (to let the agent see and delete), still flagged
        assert fast.over_quota and int(fast.stdout) < 100
        freed = await box.exec("rm -f f*; echo freed")
        assert freed.ok and freed.stdout == "freed\n" and not freed.over_quota
        await box.write_file("more.txt", b"x" * 1024)
        # measured at most every POLL_S: an exec ending sooner after the last measurement is
        # measured in the background within POLL_S, and the next exec after that says so
        rapid = await box.exec(f"head -c {12 * MIB} /dev/zero > big; echo wrote")  # faster than a poll
        if not rapid.over_quota:
            await asyncio.sleep(3 * POLL_S)
        flagged = rapid if rapid.over_quota else await box.exec("echo next")
        assert flagged.over_quota and "over its quota" in flagged.stderr
        assert (await box.exec("rm big")).ok
        await asyncio.sleep(POLL_S)  # the last measurement is POLL_S old: measured when it ends
        burst = await box.exec(f"head -c {12 * MIB} /dev/zero > big; echo wrote")
        assert burst.stdout == "wrote\n"
        if not burst.over_quota:  # a loaded machine can delay the measurement past the exec's end
            await asyncio.sleep(3 * POLL_S)
        flagged = burst if burst.over_quota else await box.exec("echo next")
        assert flagged.over_quota and "over its quota" in flagged.stderr
        assert await metric(server, "horizonrl_workspace_writes_refused_total") == 1
        assert await metric(server, "horizonrl_workspace_over_quota_total") >= 3


async def test_a_background_writer_over_the_quota_is_killed_between_requests(
    start_server: Callable[..., Running],
) -> None:
    server = start_server(limits=ServerLimits(workspace_mib=QUOTA_MIB))
    async with server.remote() as remote:
        box = await remote.create()
        writer = "while true; do head -c 1000000 /dev/zero >> log; sleep 0.2; done"
        started = await box.exec(f"({writer}) > /dev/null 2>&1 & echo started")
        assert started.ok and not started.over_quota
        log = next(server.state_dir.glob(f"*-{box.id}")) / "upper" / "log"
        sizes, deadline = [0], time.monotonic() + 30
        while len(sizes) < 8 or sizes[-1] != sizes[-8]:  # no growth for 8 looks (~1.6 s): stopped
            assert time.monotonic() < deadline, f"the background writer was not stopped: {sizes[-1]} bytes"
            await asyncio.sleep(0.2)
            sizes.append(log.stat().st_size if log.exists() else 0)
        assert QUOTA_MIB * MIB < sizes[-1] < 20 * MIB  # it went over, and was stopped soon after
        after = await box.exec("echo hi")
        assert after.over_quota and "over its quota" in after.stderr


async def test_the_servers_total_quota_stops_new_sandboxes_and_growing_ones(
    start_server: Callable[..., Running],
) -> None:
    server = start_server(limits=ServerLimits(workspace_mib=QUOTA_MIB, total_workspace_mib=10))
    async with server.remote() as remote:
        first, second = await remote.create(), await remote.create()
        assert (await first.exec(f"head -c {6 * MIB} /dev/zero > a")).ok
        grown = await second.exec(f"head -c {6 * MIB} /dev/zero > b")
        assert grown.over_quota and "this server's workspaces hold" in grown.stderr
        assert (await first.exec("echo idle")).ok  # did not grow: not its fault
        with pytest.raises(SandboxCapacityError, match=r"at its quota of 10\.0 MiB for all of them"):
            await remote.create()
        await first.close()
        assert (await (await remote.create()).exec("echo room again")).stdout == "room again\n"


@pytest.mark.skipif(not ROOT_CGROUPS, reason="needs root with cgroups (the server's sandboxes get one)")
async def test_a_limit_the_cgroup_refuses_is_503_and_leaves_no_cgroup(
    start_server: Callable[..., Running],
) -> None:
    server = start_server(limits=ServerLimits.off())  # no ceiling: the kernel is the one that refuses
    before = own_cgroups()
    async with server.raw() as http:
        response = await http.post("/sandboxes", json={"limits": {"processes": 10_000_000}})
        assert response.status_code == 503, response.text
        assert response.json()["code"] == "unavailable"
        assert "cannot set pids.max=10000000" in response.json()["detail"]
        assert (await http.get("/sandboxes")).json() == []
    assert own_cgroups() == before and list(server.state_dir.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="root without cgroups is a root-only case")
async def test_root_without_cgroups_refuses_sandboxes_it_cannot_limit(
    start_server: Callable[..., Running],
) -> None:
    server = start_server(bwrap={"cgroups": False})
    async with server.raw() as http:
        response = await http.post("/sandboxes", json={})
        assert response.status_code == 503, response.text
        assert "cannot enforce processes (root without cgroups" in response.json()["detail"]
    assert server.backend.live == 0


def test_serve_ceiling_options_default_to_the_servers_and_are_checked(tmp_path: Path) -> None:
    import inspect

    from horizonrl.cli.sandbox import sandbox_serve
    from horizonrl.sandbox.server.limits import (
        CEILING_OPTIONS,
        DEFAULT_TOTAL_WORKSPACE_MIB,
        DEFAULT_WORKSPACE_MIB,
    )

    defaults = {name: p.default for name, p in inspect.signature(sandbox_serve).parameters.items()}
    for name, option in CEILING_OPTIONS.items():
        assert defaults[option[2:].replace("-", "_")] == getattr(DEFAULT_CEILINGS, name), option
    assert defaults["workspace_mib"] == DEFAULT_WORKSPACE_MIB
    assert defaults["total_workspace_mib"] == DEFAULT_TOTAL_WORKSPACE_MIB
    horizon = Path(sys.executable).with_name("horizon")
    env = {**os.environ, "HORIZON_SANDBOX_TOKEN": TOKEN, "TMPDIR": str(tmp_path)}
    command = [str(horizon), "sandbox", "serve", "--max-processes", "2"]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "--max-processes" in proc.stderr and "4" in proc.stderr, proc.stderr


# --- load -----------------------------------------------------------------------------------------

CLIENTS, EXECS = 50, 100


async def test_load_50_clients_x_100_execs(server: Running) -> None:
    async def client(n: int, remote: RemoteBackend) -> list[str]:
        sandbox = await remote.create()
        wrong = []
        for i in range(EXECS):
            result = await sandbox.exec(f"N={n}-{i}; echo $N")
            if result.stdout != f"{n}-{i}\n" or not result.ok:
                wrong.append(f"client {n} exec {i}: {result}")
        return wrong

    started = time.perf_counter()
    async with server.remote() as remote:
        wrong = await asyncio.gather(*(client(n, remote) for n in range(CLIENTS)))
        assert [w for w in wrong if w] == []
        assert server.backend.live == CLIENTS
        assert len(sandbox_processes(server)) >= CLIENTS  # the leftover check below does see them
        assert await metric(server, "horizonrl_exec_total") == CLIENTS * EXECS
    elapsed = time.perf_counter() - started
    print(f"\n{CLIENTS} clients x {EXECS} execs: {elapsed:.1f} s ({CLIENTS * EXECS / elapsed:.0f} execs/s)")
    assert server.backend.live == 0  # aclose deleted every sandbox
    async with server.raw() as http:
        assert (await http.get("/health")).json()["sandboxes"] == 0
    deadline = time.monotonic() + 5
    while sandbox_processes(server):
        assert time.monotonic() < deadline, f"sandbox processes left: {sandbox_processes(server)}"
        await asyncio.sleep(0.05)
    assert leftover_cgroups(server) == []
    assert len(server.created_ids) == CLIENTS
