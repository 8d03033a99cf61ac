"""The sandbox server's app: the routes over a :class:`.pool.SandboxPool` behind the
:class:`.gate.RequestGate`, and running it (:func:`serve`, :func:`serve_in_subprocess`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Body, Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.security import HTTPBearer

from horizonrl.asgi import LOOPBACK_HOSTS, HostGate, allowed_hosts, unless_client_leaves
from horizonrl.errors import ConfigError
from horizonrl.local_server import free_port, healthy_process
from horizonrl.sandbox.base import (
    DiffResult,
    ErrorBody,
    ExecRequest,
    ExecResult,
    FileData,
    Health,
    ReadFileRequest,
    SandboxBackend,
    SandboxError,
    SandboxInfo,
    SandboxSpec,
    SandboxUnavailableError,
    WriteFileRequest,
)
from horizonrl.sandbox.server.gate import DEFAULT_MAX_REQUEST_BYTES, RequestGate, error_response
from horizonrl.sandbox.server.limits import ServerLimits
from horizonrl.sandbox.server.pool import SandboxPool

T = TypeVar("T")

_BEARER = HTTPBearer(auto_error=False)
"""Declares the bearer scheme in ``/openapi.json``; :class:`RequestGate` enforces it."""

UVICORN_OPTIONS: dict[str, Any] = {"loop": "asyncio", "timeout_keep_alive": 75}
"""How :func:`serve` runs uvicorn (tests use the same). asyncio's own loop: under uvloop a subprocess
inherits extra descriptors (among them its own stdout), so a command leaving a background process
running would hold its exec open until the timeout. A keep-alive longer than any client's (httpx
keeps idle connections 5 s): with equal times the server may close a connection just as a client
sends its next request on it, which the client sees as a dropped request."""

CLIENT_CLOSED_REQUEST = 499
"""Status logged for an exec whose client went away before the answer (never seen by a client)."""


async def _on_sandbox_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, SandboxError)
    return error_response(exc)


async def _on_unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    """A bug or a backend failure outside the SandboxError family: still an ErrorBody."""
    return error_response(SandboxError(f"internal error in the sandbox server: {type(exc).__name__}: {exc}"))


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
    hosts: tuple[str, ...] = LOOPBACK_HOSTS,
    limits: ServerLimits | None = None,
) -> FastAPI:
    """The sandbox server's ASGI app over ``backend``; clients must send ``token`` as a bearer token.

    At most ``max_sandboxes`` are open at once (more: 429); sandboxes idle for ``idle_ttl_s`` are
    closed (checked every ``reap_interval_s``); ``templates_dir`` holds the templates clients
    name in ``SandboxSpec.template``; a request body over ``max_request_bytes`` is refused (413); a
    request whose ``Host`` is not one of ``hosts`` is refused first (400, against DNS rebinding).
    ``limits`` are the ceilings on what clients may ask for and the workspace quotas (default:
    :class:`ServerLimits`'s defaults; ``ServerLimits.off()`` for none). Stopping the app closes every
    sandbox and the backend.
    """
    if not token:
        raise ValueError("the sandbox server needs a non-empty token (clients send it as 'Bearer <token>')")
    if reap_interval_s <= 0:
        raise ValueError(f"reap_interval_s must be positive, got {reap_interval_s}")
    if max_request_bytes < 1:
        raise ValueError(f"max_request_bytes must be at least 1, got {max_request_bytes}")
    pool = SandboxPool(
        backend,
        max_sandboxes=max_sandboxes,
        idle_ttl_s=idle_ttl_s,
        templates_dir=templates_dir,
        limits=limits,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        reaper = asyncio.create_task(pool.reap_forever(reap_interval_s))
        watcher = asyncio.create_task(pool.watch_workspaces_forever())
        try:
            yield
        finally:
            for task in (reaper, watcher):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
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
    app.add_middleware(HostGate, allowed_hosts=hosts)  # outermost: a Host not in ``hosts`` is 400 first

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
            422: {"model": ErrorBody, "description": "A limit above this server's ceiling for it."},
            429: {"model": ErrorBody, "description": "As many sandboxes (or workspace bytes) as allowed."},
            503: {"model": ErrorBody, "description": "A limit this server cannot enforce (e.g. its cgroup)."},
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
        result = await unless_client_leaves(request, pool.exec(sandbox_id, body))
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
        responses={
            **_SANDBOX_ERRORS,
            400: {"model": ErrorBody, "description": "Path outside /workspace."},
            409: {"model": ErrorBody, "description": "The write would go over the workspace quota."},
        },
    )
    async def write_file(sandbox_id: str, body: WriteFileRequest) -> Response:
        await pool.write_file(sandbox_id, body.path, body.data)
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
    extra_hosts: tuple[str, ...] = (),
    limits: ServerLimits | None = None,
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
            hosts=allowed_hosts(host, extra_hosts),
            limits=limits,
        )
    except ValueError as exc:
        raise ConfigError(f"sandbox serve: {exc}") from None
    uvicorn.run(app, host=host, port=port, log_level=log_level, **UVICORN_OPTIONS)


@contextlib.contextmanager
def serve_in_subprocess(state_dir: str, *, start_timeout_s: float = 60.0) -> Iterator[tuple[str, str]]:
    """A real ``horizon sandbox serve`` process on a free loopback port with a fresh token (its
    sandboxes' writable layers under ``state_dir``), ready when this yields ``(url, token)``;
    terminated on exit. For benchmarks and tests that need the server as users run it."""
    token = secrets.token_hex(16)
    port = free_port()
    env = {**os.environ, "HORIZON_SANDBOX_TOKEN": token, "TMPDIR": state_dir}
    horizon = Path(sys.executable).with_name("horizon")
    command = [str(horizon), "sandbox", "serve", "--port", str(port), "--log-level", "warning"]
    url = f"http://127.0.0.1:{port}"
    with healthy_process(
        command, url, env=env, start_timeout_s=start_timeout_s, error=SandboxUnavailableError
    ):
        yield url, token
