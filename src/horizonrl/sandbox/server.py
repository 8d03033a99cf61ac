"""The sandbox server: one sandbox backend (bubblewrap by default) behind a small HTTP API.

Trainers on other machines (or many rollout workers on this one) open sandboxes here with
:class:`horizonrl.sandbox.remote.RemoteBackend`, which speaks exactly this API. Every body is a
model from :mod:`horizonrl.sandbox.base`, so ``/openapi.json`` documents the whole contract::

    GET    /health                        no auth: backend, live sandboxes, capacity
    GET    /metrics                       Prometheus text
    POST   /sandboxes                     SandboxSpec -> 201 SandboxInfo (template: a name in templates_dir)
    GET    /sandboxes                     -> [SandboxInfo]
    GET    /sandboxes/{id}                -> SandboxInfo
    POST   /sandboxes/{id}/exec           ExecRequest -> ExecResult
    POST   /sandboxes/{id}/files/read     ReadFileRequest -> FileData
    POST   /sandboxes/{id}/files/write    WriteFileRequest -> 204
    GET    /sandboxes/{id}/diff           -> DiffResult
    DELETE /sandboxes/{id}                -> 204

Everything but ``/health`` and the API docs needs ``Authorization: Bearer <token>``, checked before
a body is read (a request without it is 401 whatever its body), and a body may be at most
``max_request_bytes`` (413 otherwise, also checked before it is read). Errors are
:class:`ErrorBody` ``{detail, code}`` with the status of the matching :class:`SandboxError`
(FastAPI's own 422 for a malformed body). A command longer than :data:`ARGV_COMMAND_BYTES` reaches
the sandbox through a file in its workspace instead of the command line, so the kernel's 128 KiB
limit on one argument does not apply. Sandboxes idle longer than ``idle_ttl_s`` are closed by a
background task, and every sandbox still open is closed when the server stops. An exec whose client
disconnects is cancelled (its command killed), so a caller that gives up does not leave work running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Body, Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.security import HTTPBearer
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from horizonrl.errors import ConfigError
from horizonrl.sandbox.base import (
    WORKSPACE,
    DiffResult,
    ErrorBody,
    ExecRequest,
    ExecResult,
    FileData,
    Health,
    ReadFileRequest,
    Sandbox,
    SandboxAuthError,
    SandboxBackend,
    SandboxCapacityError,
    SandboxError,
    SandboxInfo,
    SandboxLimits,
    SandboxNotFoundError,
    SandboxPathError,
    SandboxSpec,
    SandboxUnavailableError,
    WriteFileRequest,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

_BEARER = HTTPBearer(auto_error=False)
"""Declares the bearer scheme in ``/openapi.json``; :class:`RequestGate` enforces it."""

DEFAULT_MAX_REQUEST_BYTES = 16 * 1024 * 1024
"""The largest request body the server reads by default (``--max-request-mib``)."""

ARGV_COMMAND_BYTES = 64 * 1024
"""Commands up to this many bytes (UTF-8) run as ``/bin/sh -c CMD``; longer ones are written to a
file in the workspace first (Linux refuses any one argument over 128 KiB: ``E2BIG``)."""

UVICORN_OPTIONS: dict[str, Any] = {"loop": "asyncio", "timeout_keep_alive": 75}
"""How :func:`serve` runs uvicorn (tests use the same). asyncio's own loop: under uvloop a subprocess
inherits extra descriptors (among them its own stdout), so a command leaving a background process
running would hold its exec open until the timeout. A keep-alive longer than any client's (httpx
keeps idle connections 5 s): with equal times the server may close a connection just as a client
sends its next request on it, which the client sees as a dropped request."""

CLIENT_CLOSED_REQUEST = 499
"""Status logged for an exec whose client went away before the answer (never seen by a client)."""


class RequestTooLargeError(SandboxError):
    """A request body over the server's ``max_request_bytes``."""

    code = "request_too_large"
    status = 413


# --- long commands ------------------------------------------------------------------------------

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
    ) -> None:
        if max_sandboxes < 1:
            raise ValueError(f"max_sandboxes must be at least 1, got {max_sandboxes}")
        if idle_ttl_s <= 0:
            raise ValueError(f"idle_ttl_s must be positive, got {idle_ttl_s}")
        self.backend = backend
        self.max_sandboxes = max_sandboxes
        self.idle_ttl_s = idle_ttl_s
        self.templates_dir = Path(templates_dir).expanduser().resolve() if templates_dir else None
        self.held: dict[str, _Held] = {}
        self._creating = 0  # creations in flight: they count against the cap
        self.created = self.reaped = self.rejected = 0
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
        """Open a sandbox from ``spec`` (template by name), unless the cap is reached."""
        directory = self.resolve_template(spec.template)
        open_now = len(self.held) + self._creating
        if open_now >= self.max_sandboxes:
            self.rejected += 1
            raise SandboxCapacityError(
                f"{open_now} sandboxes are open and this server allows at most {self.max_sandboxes} "
                "(max_sandboxes); delete some (DELETE /sandboxes/{id}) or start the server with a higher cap"
            )
        self._creating += 1
        try:
            sandbox = await self.backend.create(spec.model_copy(update={"template": directory}))
        except SandboxCapacityError:
            self.rejected += 1
            raise
        finally:
            self._creating -= 1
        now = time.time()
        self.held[sandbox.id] = _Held(sandbox, spec.template, spec.limits, now, now)
        self.created += 1
        return self.held[sandbox.id].info(self.backend.name)

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
        await held.sandbox.close()

    async def reap_idle(self) -> int:
        """Close the sandboxes unused for longer than ``idle_ttl_s``; returns how many."""
        deadline = time.time() - self.idle_ttl_s
        idle = [i for i, h in self.held.items() if h.busy == 0 and h.last_used_at < deadline]
        for sandbox_id in idle:
            held = self.held.pop(sandbox_id)
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

    async def close_all(self) -> None:
        """Close every sandbox held, then the backend (server shutdown)."""
        held, self.held = list(self.held.values()), {}
        results = await asyncio.gather(*(h.sandbox.close() for h in held), return_exceptions=True)
        for h, result in zip(held, results, strict=True):
            if isinstance(result, BaseException):
                log.error("closing sandbox %s at shutdown failed: %r", h.sandbox.id, result)
        await self.backend.aclose()

    # work

    async def exec(self, sandbox_id: str, request: ExecRequest) -> ExecResult:
        async with self.use(sandbox_id) as sandbox:
            start = time.perf_counter()
            try:
                result = await run_command(sandbox, request.cmd, request.timeout)
            except asyncio.CancelledError:
                self.exec_cancelled += 1
                raise
            finally:
                self.exec_total += 1
                self.exec_seconds += time.perf_counter() - start
        self.exec_timeouts += int(result.timed_out)
        return result

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


# --- the app ------------------------------------------------------------------------------------


def _error_response(exc: SandboxError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    body = ErrorBody(detail=str(exc), code=exc.code)
    return JSONResponse(body.model_dump(), status_code=exc.status, headers=headers)


async def _on_sandbox_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, SandboxError)
    return _error_response(exc)


async def _on_unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    """A bug or a backend failure outside the SandboxError family: still an ErrorBody."""
    return _error_response(SandboxError(f"internal error in the sandbox server: {type(exc).__name__}: {exc}"))


def _mib(n: int) -> str:
    return f"{n / 2**20:g} MiB ({n} bytes)"


def _too_large(limit: int, declared: int | None) -> RequestTooLargeError:
    size = f"of {declared} bytes " if declared is not None else ""
    return RequestTooLargeError(
        f"the request body {size}is over this server's limit of {_mib(limit)}; send less (write a "
        "large file in parts) or start the server with a higher --max-request-mib"
    )


def _header(scope: Scope, name: bytes) -> bytes | None:
    return next((value for key, value in scope["headers"] if key == name), None)


def _content_length(scope: Scope) -> int | None:
    value = _header(scope, b"content-length")
    return int(value) if value is not None and value.strip().isdigit() else None


def _bearer_token(scope: Scope) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` header (None when absent or not Bearer)."""
    scheme, _, token = (_header(scope, b"authorization") or b"").partition(b" ")
    return token.strip() if scheme.lower() == b"bearer" else None


@dataclass
class _LimitedBody:
    """One request's ``receive``/``send``, counting the body as it streams in: past ``limit`` bytes
    it answers 413 itself, tells the app the client left, and drops what the app sends after."""

    scope: Scope
    receive_from: Receive
    send_to: Send
    limit: int
    received: int = 0
    refused: bool = False

    async def receive(self) -> Message:
        if self.refused:
            return {"type": "http.disconnect"}
        message = await self.receive_from()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self.limit:
                self.refused = True
                await _error_response(_too_large(self.limit, None))(
                    self.scope, self.receive_from, self.send_to
                )
                return {"type": "http.disconnect"}
        return message

    async def send(self, message: Message) -> None:
        if not self.refused:
            await self.send_to(message)


class RequestGate:
    """ASGI middleware in front of the whole app, so that both checks come before any body is read:
    a request for anything but ``public_paths`` without the token is 401, and a body over
    ``max_request_bytes`` is 413 (by its Content-Length, or once that many bytes have streamed in)."""

    def __init__(self, app: ASGIApp, *, token: str, max_request_bytes: int, public_paths: set[str]) -> None:
        self.app = app
        self.token = token.encode()
        self.max_request_bytes = max_request_bytes
        self.public_paths = public_paths

    def refusal(self, scope: Scope) -> SandboxError | None:
        """Why this request is refused before its body is read (None: let it in)."""
        token = _bearer_token(scope)
        if scope["path"] not in self.public_paths and not (
            token and secrets.compare_digest(token, self.token)
        ):
            return SandboxAuthError(
                "missing or wrong token: send the server's token as 'Authorization: Bearer <token>'"
            )
        declared = _content_length(scope)
        if declared is not None and declared > self.max_request_bytes:
            return _too_large(self.max_request_bytes, declared)
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is not None:
            await _error_response(refusal)(scope, receive, send)
            return
        body = _LimitedBody(scope, receive, send, self.max_request_bytes)
        await self.app(scope, body.receive, body.send)


async def _client_left(request: Request) -> None:
    """Return once the client has disconnected (the request body is already read by then)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_client_leaves(request: Request, work: Coroutine[Any, Any, T]) -> T | None:
    """Run ``work``; if the client disconnects first, cancel it (a sandbox's exec then kills its
    command) and return None."""
    job = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_client_left(request))
    try:
        done, _ = await asyncio.wait({job, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        job.cancel()
        raise
    finally:
        watcher.cancel()
    if job in done:
        return job.result()
    job.cancel()
    with contextlib.suppress(BaseException):
        await job
    return None


_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "Missing or wrong bearer token."},
}
_SANDBOX_ERRORS: dict[int | str, dict[str, Any]] = {
    **_ERRORS,
    404: {"model": ErrorBody, "description": "No open sandbox (or file) with this id (or path)."},
}


def create_app(
    backend: SandboxBackend,
    token: str,
    *,
    max_sandboxes: int = 256,
    idle_ttl_s: float = 900.0,
    templates_dir: str | None = None,
    reap_interval_s: float = 5.0,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
) -> FastAPI:
    """The sandbox server's ASGI app over ``backend``; clients must send ``token`` as a bearer token.

    At most ``max_sandboxes`` are open at once (more: 429); sandboxes idle for ``idle_ttl_s`` are
    closed (checked every ``reap_interval_s``); ``templates_dir`` holds the templates clients
    name in ``SandboxSpec.template``; a request body over ``max_request_bytes`` is refused (413).
    Stopping the app closes every sandbox and the backend.
    """
    if not token:
        raise ValueError("the sandbox server needs a non-empty token (clients send it as 'Bearer <token>')")
    if reap_interval_s <= 0:
        raise ValueError(f"reap_interval_s must be positive, got {reap_interval_s}")
    if max_request_bytes < 1:
        raise ValueError(f"max_request_bytes must be at least 1, got {max_request_bytes}")
    pool = SandboxPool(
        backend, max_sandboxes=max_sandboxes, idle_ttl_s=idle_ttl_s, templates_dir=templates_dir
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        reaper = asyncio.create_task(pool.reap_forever(reap_interval_s))
        try:
            yield
        finally:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
            await pool.close_all()

    app = FastAPI(
        title="horizonrl sandbox server",
        summary="Isolated, stateful workspaces for agents (see horizonrl.sandbox.base).",
        version="1",
        lifespan=lifespan,
    )
    app.state.pool = pool
    app.add_exception_handler(SandboxError, _on_sandbox_error)
    app.add_exception_handler(Exception, _on_unexpected_error)
    docs = (app.openapi_url, app.docs_url, app.swagger_ui_oauth2_redirect_url, app.redoc_url)
    public = {"/health", *(path for path in docs if path)}
    app.add_middleware(RequestGate, token=token, max_request_bytes=max_request_bytes, public_paths=public)

    @app.get("/health", response_model=Health)
    async def health() -> Health:
        return Health(backend=backend.name, sandboxes=pool.live, capacity=pool.max_sandboxes)

    api = APIRouter(dependencies=[Depends(_BEARER)], responses=_ERRORS)

    @api.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(pool.metrics_text(), media_type="text/plain; version=0.0.4")

    @api.post(
        "/sandboxes",
        response_model=SandboxInfo,
        status_code=201,
        responses={
            400: {"model": ErrorBody, "description": "Unknown or malformed template name."},
            429: {"model": ErrorBody, "description": "As many sandboxes are open as the server allows."},
        },
    )
    async def create_sandbox(spec: Annotated[SandboxSpec | None, Body()] = None) -> SandboxInfo:
        return await pool.create(spec or SandboxSpec())

    @api.get("/sandboxes", response_model=list[SandboxInfo])
    async def list_sandboxes() -> list[SandboxInfo]:
        return [h.info(backend.name) for h in pool.held.values()]

    @api.get("/sandboxes/{sandbox_id}", response_model=SandboxInfo, responses=_SANDBOX_ERRORS)
    async def get_sandbox(sandbox_id: str) -> SandboxInfo:
        return pool.get(sandbox_id).info(backend.name)

    @api.post("/sandboxes/{sandbox_id}/exec", response_model=ExecResult, responses=_SANDBOX_ERRORS)
    async def exec_command(sandbox_id: str, body: ExecRequest, request: Request) -> ExecResult | Response:
        result = await _unless_client_leaves(request, pool.exec(sandbox_id, body))
        return Response(status_code=CLIENT_CLOSED_REQUEST) if result is None else result

    @api.post(
        "/sandboxes/{sandbox_id}/files/read",
        response_model=FileData,
        responses={**_SANDBOX_ERRORS, 400: {"model": ErrorBody, "description": "Path outside /workspace."}},
    )
    async def read_file(sandbox_id: str, body: ReadFileRequest) -> FileData:
        async with pool.use(sandbox_id) as sandbox:
            data = await sandbox.read_file(body.path)
        return FileData(path=body.path, data=data)

    @api.post(
        "/sandboxes/{sandbox_id}/files/write",
        status_code=204,
        response_class=Response,
        responses={**_SANDBOX_ERRORS, 400: {"model": ErrorBody, "description": "Path outside /workspace."}},
    )
    async def write_file(sandbox_id: str, body: WriteFileRequest) -> Response:
        async with pool.use(sandbox_id) as sandbox:
            await sandbox.write_file(body.path, body.data)
        return Response(status_code=204)

    @api.get("/sandboxes/{sandbox_id}/diff", response_model=DiffResult, responses=_SANDBOX_ERRORS)
    async def diff(sandbox_id: str) -> DiffResult:
        async with pool.use(sandbox_id) as sandbox:
            return DiffResult(diff=await sandbox.diff())

    @api.delete(
        "/sandboxes/{sandbox_id}", status_code=204, response_class=Response, responses=_SANDBOX_ERRORS
    )
    async def delete_sandbox(sandbox_id: str) -> Response:
        await pool.delete(sandbox_id)
        return Response(status_code=204)

    app.include_router(api)
    return app


def serve(
    host: str,
    port: int,
    token: str,
    *,
    backend: SandboxBackend | None = None,
    max_sandboxes: int = 256,
    idle_ttl_s: float = 900.0,
    templates_dir: str | None = None,
    log_level: str = "warning",
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
) -> None:
    """Run the sandbox server until interrupted (a :class:`BwrapBackend` unless ``backend`` is given),
    with uvicorn configured as :data:`UVICORN_OPTIONS` says. A bad option is a :class:`ConfigError`
    (one line from the CLI); port and request limit are checked before the backend starts."""
    import uvicorn

    if not 1 <= port <= 65535:
        raise ConfigError(f"--port {port} is out of range; valid ports: 1-65535")
    if max_request_bytes < 1:
        raise ConfigError(f"--max-request-mib must be positive, got a limit of {max_request_bytes} bytes")
    if backend is None:
        from horizonrl.sandbox.bwrap import BwrapBackend, BwrapOptions

        backend = BwrapBackend(BwrapOptions(max_sandboxes=max(max_sandboxes, 1)))
    try:
        app = create_app(
            backend,
            token,
            max_sandboxes=max_sandboxes,
            idle_ttl_s=idle_ttl_s,
            templates_dir=templates_dir,
            max_request_bytes=max_request_bytes,
        )
    except ValueError as exc:
        raise ConfigError(f"sandbox serve: {exc}") from None
    uvicorn.run(app, host=host, port=port, log_level=log_level, **UVICORN_OPTIONS)


@contextlib.contextmanager
def serve_in_subprocess(state_dir: str, *, start_timeout_s: float = 60.0) -> Iterator[tuple[str, str]]:
    """A real ``horizon sandbox serve`` process on a free loopback port with a fresh token (its
    sandboxes' writable layers under ``state_dir``), ready when this yields ``(url, token)``;
    terminated on exit. For benchmarks and tests that need the server as users run it."""
    import httpx

    token = secrets.token_hex(16)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "HORIZON_SANDBOX_TOKEN": token, "TMPDIR": state_dir}
    horizon = Path(sys.executable).with_name("horizon")
    command = [str(horizon), "sandbox", "serve", "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(command, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SandboxUnavailableError(
                    f"`{' '.join(command)}` did not answer on {url}/health within {start_timeout_s:.0f} s "
                    f"(exit code {proc.poll()})"
                )
            time.sleep(0.1)
        yield url, token
    finally:
        proc.terminate()
        proc.wait(timeout=30)
