"""The sandbox server's gate: ASGI middleware in front of the whole app that refuses a request
before its body is read — without the bearer token (401, anything but the public paths), or with a
body over the limit (413, by its Content-Length or once that many bytes have streamed in). Every
refusal is an :class:`ErrorBody`, as are the app's own errors (:func:`error_response`)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from horizonrl.sandbox.base import ErrorBody, SandboxAuthError, SandboxError

DEFAULT_MAX_REQUEST_BYTES = 16 * 1024 * 1024
"""The largest request body the server reads by default (``--max-request-mib``)."""


class RequestTooLargeError(SandboxError):
    """A request body over the server's ``max_request_bytes``."""

    code = "request_too_large"
    status = 413


def error_response(exc: SandboxError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    body = ErrorBody(detail=str(exc), code=exc.code)
    return JSONResponse(body.model_dump(), status_code=exc.status, headers=headers)


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
                await error_response(_too_large(self.limit, None))(
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
            await error_response(refusal)(scope, receive, send)
            return
        body = _LimitedBody(scope, receive, send, self.max_request_bytes)
        await self.app(scope, body.receive, body.send)
