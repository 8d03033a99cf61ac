"""ASGI pieces both HTTP servers use (the sandbox server and ``horizon serve``): a gate in front of
an app that refuses a request before its body is read, and running work that is cancelled when the
client leaves. Each server says how a refusal looks on its wire (``refuse``)."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

T = TypeVar("T")

#: How a server answers a refusal: ``(status, code, message) -> Response`` (401 and 413 here).
Refuse = Callable[[int, str, str], Response]

UNAUTHORIZED_HINT = "missing or wrong token: send the server's token as 'Authorization: Bearer <token>'"


def mib(n: int) -> str:
    return f"{n / 2**20:g} MiB ({n} bytes)"


def too_large_message(limit: int, declared: int | None, hint: str) -> str:
    size = f"of {declared} bytes " if declared is not None else ""
    return f"the request body {size}is over this server's limit of {mib(limit)}; {hint}"


def _header(scope: Scope, name: bytes) -> bytes | None:
    return next((value for key, value in scope["headers"] if key == name), None)


def _content_length(scope: Scope) -> int | None:
    value = _header(scope, b"content-length")
    return int(value) if value is not None and value.strip().isdigit() else None


def bearer_token(scope: Scope) -> bytes | None:
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
    refuse: Refuse
    too_large_hint: str
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
                text = too_large_message(self.limit, None, self.too_large_hint)
                await self.refuse(413, "request_too_large", text)(self.scope, self.receive_from, self.send_to)
                return {"type": "http.disconnect"}
        return message

    async def send(self, message: Message) -> None:
        if not self.refused:
            await self.send_to(message)


class RequestGate:
    """ASGI middleware in front of a whole app, so that both checks come before any body is read:
    a request for anything but ``public_paths`` without the token is 401 (no token configured: no
    check), and a body over ``max_request_bytes`` is 413 (by its Content-Length, or once that many
    bytes have streamed in). ``refuse`` renders the refusal in the server's own error shape."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str | None,
        max_request_bytes: int,
        public_paths: set[str],
        refuse: Refuse,
        too_large_hint: str,
    ) -> None:
        self.app = app
        self.token = token.encode() if token else None
        self.max_request_bytes = max_request_bytes
        self.public_paths = public_paths
        self.refuse = refuse
        self.too_large_hint = too_large_hint

    def refusal(self, scope: Scope) -> tuple[int, str, str] | None:
        """Why this request is refused before its body is read: ``(status, code, message)``, or None."""
        if self.token is not None and scope["path"] not in self.public_paths:
            token = bearer_token(scope)
            if not (token and secrets.compare_digest(token, self.token)):
                return 401, "unauthorized", UNAUTHORIZED_HINT
        declared = _content_length(scope)
        if declared is not None and declared > self.max_request_bytes:
            return (
                413,
                "request_too_large",
                too_large_message(self.max_request_bytes, declared, self.too_large_hint),
            )
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is not None:
            await self.refuse(*refusal)(scope, receive, send)
            return
        body = _LimitedBody(scope, receive, send, self.max_request_bytes, self.refuse, self.too_large_hint)
        await self.app(scope, body.receive, body.send)


async def client_left(request: Request) -> None:
    """Return once the client has disconnected (the request body is already read by then)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_client_leaves(request: Request, work: Coroutine[Any, Any, T]) -> T | None:
    """Run ``work``; if the client disconnects first, cancel it and return None."""
    job = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(client_left(request))
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
