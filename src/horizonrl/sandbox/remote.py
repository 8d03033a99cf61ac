"""The remote sandbox backend: sandboxes held by a sandbox server (:mod:`horizonrl.sandbox.server`),
used over HTTP through the same :class:`Sandbox` protocol as a local backend.

One :class:`RemoteBackend` keeps one ``httpx.AsyncClient`` (a keep-alive connection pool) shared by
every sandbox it creates. The server's :class:`ErrorBody` ``code`` is turned back into the matching
exception of :mod:`horizonrl.sandbox.base`, so ``except SandboxPathError`` works the same against a
local and a remote sandbox; a server that cannot be reached raises :class:`SandboxUnavailableError`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from typing import Any

import httpx

from horizonrl.sandbox.base import (
    ERRORS_BY_CODE,
    ExecResult,
    FileData,
    Health,
    SandboxAuthError,
    SandboxCapacityError,
    SandboxError,
    SandboxInfo,
    SandboxNotFoundError,
    SandboxPathError,
    SandboxQuotaError,
    SandboxSpec,
    SandboxUnavailableError,
    check_path,
)

EXEC_TIMEOUT_MARGIN_S = 30.0
"""An exec's HTTP timeout is its command timeout plus this (the server needs time to answer)."""

CONNECTION_LIMITS = httpx.Limits(max_connections=128, max_keepalive_connections=64, keepalive_expiry=2.0)
"""The shared client's pool. Idle connections are dropped after 2 s, well before a server's
keep-alive ends (uvicorn's default is 5 s): reusing one the server is closing at that very moment
loses the request (a ReadError), and an exec cannot be safely retried."""

_ERRORS_BY_STATUS: dict[int, type[SandboxError]] = {
    400: SandboxPathError,
    401: SandboxAuthError,
    404: SandboxNotFoundError,
    409: SandboxQuotaError,
    429: SandboxCapacityError,
    503: SandboxUnavailableError,
}
"""The exception for an error response without a known ``code`` (e.g. a proxy's own error page)."""


def _validation_detail(body: Any) -> str:
    """FastAPI's 422 body (a list of ``{loc, msg}``) as one readable line."""
    errors = body.get("detail") if isinstance(body, dict) else None
    if not isinstance(errors, list):
        return str(errors if errors is not None else body)
    parts = []
    for error in errors:
        loc = ".".join(str(p) for p in error.get("loc", ()) if p != "body") if isinstance(error, dict) else ""
        msg = error.get("msg", error) if isinstance(error, dict) else error
        parts.append(f"{loc}: {msg}" if loc else str(msg))
    return "; ".join(parts)


_HINTS: dict[int, str] = {
    401: "this client sends the token it was given (sandbox.token, default $HORIZON_SANDBOX_TOKEN): "
    "it must be the one the server was started with",
    413: "the server refuses request bodies over its limit (horizon sandbox serve --max-request-mib)",
}
"""What to do about a refused token or body, added to the message of a 401 (always) and of a 413
without the server's own detail (e.g. a proxy's error page)."""


def _one_line(text: str, limit: int = 500) -> str:
    """``text`` with its whitespace (newlines of an HTML error page) collapsed, cut to ``limit``."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def error_from_response(response: httpx.Response) -> SandboxError:
    """The :class:`SandboxError` (subclass) an error response of the sandbox server stands for, with
    a one-line message naming the request, the status and the reason."""
    where = f"{response.request.method} {response.request.url}"
    try:
        body: Any = response.json()
    except ValueError:
        body = None
    code = body.get("code") if isinstance(body, dict) else None
    detail = body.get("detail") if isinstance(body, dict) else None
    if response.status_code == 422 and not (isinstance(code, str) and code in ERRORS_BY_CODE):
        return SandboxError(f"the sandbox server rejected the request {where}: {_validation_detail(body)}")
    if response.status_code in (401, 413):
        return _explained(response, where, detail)
    if isinstance(code, str) and code in ERRORS_BY_CODE and isinstance(detail, str):
        return ERRORS_BY_CODE[code](detail)
    cls = _ERRORS_BY_STATUS.get(response.status_code, SandboxError)
    text = detail if detail is not None else response.text
    return cls(f"{where} answered {response.status_code}: {_one_line(str(text))}")


def _explained(response: httpx.Response, where: str, detail: Any) -> SandboxError:
    """A 401 or 413 as one line: the server's detail (or a proxy's page) and what to do about it."""
    status = response.status_code
    server_said = isinstance(detail, str)
    reason = _one_line(detail) if server_said else _one_line(response.text, 200) or response.reason_phrase
    if status == 401 or not server_said:  # a 413 from the server already names its limit and option
        reason += f"; {_HINTS[status]}"
    return _ERRORS_BY_STATUS.get(status, SandboxError)(f"{where} answered {status}: {reason}")


class RemoteSandbox:
    """One sandbox on a sandbox server (created by :meth:`RemoteBackend.create`)."""

    backend = "remote"

    def __init__(self, owner: RemoteBackend, info: SandboxInfo) -> None:
        self.id = info.id
        self.created_info = info
        self._owner = owner
        self._closed = False
        self._path = f"/sandboxes/{info.id}"

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(f"sandbox {self.id} is closed")

    async def info(self) -> SandboxInfo:
        """The server's current view of this sandbox (last-used time, template, limits)."""
        self._check_open()
        return SandboxInfo.model_validate((await self._owner.request("GET", self._path)).json())

    async def exec(self, cmd: str, timeout: float = 60.0) -> ExecResult:
        """Run ``cmd`` with ``/bin/sh -c`` in /workspace on the server."""
        self._check_open()
        response = await self._owner.request(
            "POST",
            f"{self._path}/exec",
            json={"cmd": cmd, "timeout": timeout},
            timeout=max(float(timeout), 0.0) + EXEC_TIMEOUT_MARGIN_S,
        )
        return ExecResult.model_validate(response.json())

    async def read_file(self, path: str) -> bytes:
        """The bytes of a file inside /workspace."""
        self._check_open()
        check_path(path)
        response = await self._owner.request("POST", f"{self._path}/files/read", json={"path": path})
        return FileData.model_validate(response.json()).data

    async def write_file(self, path: str, data: bytes) -> None:
        """Write ``data`` to a file inside /workspace (parent directories are created)."""
        self._check_open()
        check_path(path)
        if not isinstance(data, bytes | bytearray):
            raise SandboxError(f"write_file data must be bytes, not {type(data).__name__}")
        body = {"path": path, "data": base64.b64encode(data).decode("ascii")}
        await self._owner.request("POST", f"{self._path}/files/write", json=body)

    async def diff(self) -> str:
        """``git diff --binary`` of the workspace against its starting state."""
        self._check_open()
        return (await self._owner.request("GET", f"{self._path}/diff")).json()["diff"]

    async def close(self) -> None:
        """Delete the sandbox on the server (idempotent; one the server already reaped is fine)."""
        if self._closed:
            return
        self._closed = True
        self._owner._forget(self)
        with contextlib.suppress(SandboxNotFoundError):  # already reaped or deleted: fine
            await self._owner.request("DELETE", self._path)

    async def __aenter__(self) -> RemoteSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class RemoteBackend:
    """Creates sandboxes on the sandbox server at ``url``, authenticating with ``token``.

    ``timeout_s`` bounds every request but exec (whose bound is its command timeout plus
    :data:`EXEC_TIMEOUT_MARGIN_S`). Pass ``client`` to share a connection pool; a client passed in
    is left open by :meth:`aclose` (its owner closes it), one made here is closed.
    """

    name = "remote"

    def __init__(
        self, url: str, token: str, *, timeout_s: float = 600.0, client: httpx.AsyncClient | None = None
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise SandboxError(f"sandbox server url {url!r} must start with http:// or https://")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._headers = {"Authorization": f"Bearer {token}"}
        self._own_client = client is None
        self._client = client or httpx.AsyncClient(timeout=timeout_s, limits=CONNECTION_LIMITS)
        self._open: dict[str, RemoteSandbox] = {}
        self._closed = False

    @property
    def live(self) -> int:
        """Sandboxes this backend created that are not closed yet."""
        return len(self._open)

    async def request(
        self, method: str, path: str, *, json: Any = None, timeout: float | None = None
    ) -> httpx.Response:
        """One call to the server; an error answer raises the matching :class:`SandboxError`."""
        if self._closed:
            raise SandboxError(f"the remote sandbox backend for {self.url} is closed")
        url = f"{self.url}{path}"
        try:
            response = await self._client.request(
                method,
                url,
                json=json,
                headers=self._headers,
                timeout=self.timeout_s if timeout is None else timeout,
            )
        except httpx.TimeoutException as exc:
            raise SandboxUnavailableError(
                f"the sandbox server at {self.url} did not answer {method} {path} in time "
                f"({type(exc).__name__}); is it overloaded?"
            ) from exc
        except httpx.TransportError as exc:
            raise SandboxUnavailableError(
                f"cannot reach the sandbox server at {self.url} ({method} {path}): "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if response.status_code >= 400:
            raise error_from_response(response)
        return response

    async def health(self) -> Health:
        """The server's health (no token needed, but sent anyway)."""
        return Health.model_validate((await self.request("GET", "/health")).json())

    async def list_sandboxes(self) -> list[SandboxInfo]:
        """Every sandbox open on the server (all clients')."""
        return [SandboxInfo.model_validate(s) for s in (await self.request("GET", "/sandboxes")).json()]

    async def create(self, spec: SandboxSpec | None = None) -> RemoteSandbox:
        """Open a sandbox on the server; ``spec.template`` is a template *name* on the server. Only
        the limits set in ``spec`` are sent: the server gives the others their defaults, within its
        ceilings (a limit set above its ceiling is a :class:`SandboxLimitError`)."""
        spec = spec or SandboxSpec()
        body = spec.model_dump(mode="json", exclude_unset=True)
        response = await self.request("POST", "/sandboxes", json=body)
        sandbox = RemoteSandbox(self, SandboxInfo.model_validate(response.json()))
        self._open[sandbox.id] = sandbox
        return sandbox

    def _forget(self, sandbox: RemoteSandbox) -> None:
        self._open.pop(sandbox.id, None)

    async def aclose(self) -> None:
        """Close the sandboxes this backend created that are still open, then its HTTP client."""
        if self._closed:
            return
        # errors are dropped: the server is gone or refused, and there is nothing more to do from here
        await asyncio.gather(*(s.close() for s in list(self._open.values())), return_exceptions=True)
        self._closed = True
        if self._own_client:
            await self._client.aclose()

    async def __aenter__(self) -> RemoteBackend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
