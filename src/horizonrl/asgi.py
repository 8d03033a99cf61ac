"""ASGI pieces the HTTP servers use (the sandbox server, ``horizon serve``, the viewer): a gate in
front of an app that refuses a request before its body is read, a Host allow-list (against DNS
rebinding), JSON read with a bound on its nesting, and running work that is cancelled when the
client leaves. Each server says how a refusal looks on its wire (``refuse``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import secrets
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
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


# ------------------------------------------------------------------------------------ Host allow-list

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
"""The names a server answers to by default: a page on another site that rebinds its own name to
127.0.0.1 still sends its own name as ``Host``, and is refused."""

_ANY_ADDRESS = {"", "0.0.0.0", "::", "[::]"}


def allowed_hosts(bound: str, extra: Iterable[str] = ()) -> tuple[str, ...]:
    """The ``Host`` names a server bound to ``bound`` answers to: the loopback names, ``bound`` itself
    when it is one address or name (not 0.0.0.0 or ::), and ``extra`` (an entry ``*.example.org``
    allows the subdomains of example.org, ``*`` allows any Host)."""
    names = [*LOOPBACK_HOSTS]
    if bound.strip().lower() not in _ANY_ADDRESS:
        names.append(host_name(bound))
    names += [host_name(name) for name in extra]
    return tuple(dict.fromkeys(n for n in names if n))


def check_allowed_host(value: str, option: str = "--allowed-host") -> str:
    """``value`` as an allow-list entry (a name, an address, ``*.suffix`` or ``*``); ValueError, one
    line naming ``option``, when it is not one."""
    name = host_name(value)
    body = name.removeprefix("*.") if name != "*" else "x"
    if not body or any(c.isspace() or c in "/@?#[]" for c in body) or "*" in body:
        raise ValueError(
            f"{option} {value!r} is not a host name: give a name or address as clients write it in the URL "
            "(example.org, 10.0.0.5, ::1), '*.example.org' for its subdomains, or '*' for any"
        )
    return name


def host_name(header: str) -> str:
    """The name in a ``Host`` header (``Example.org:8000`` -> ``example.org``, ``[::1]:80`` -> ``::1``)."""
    value = header.strip().lower()
    if value.startswith("["):
        return value[1:].partition("]")[0]
    if value.count(":") == 1:
        value = value.partition(":")[0]
    return value.rstrip(".")


def _matches(name: str, allowed: Sequence[str]) -> bool:
    return any(
        pattern == "*" or name == pattern or (pattern.startswith("*.") and name.endswith(pattern[1:]))
        for pattern in allowed
    )


def detail_refusal(status: int, code: str, message: str) -> Response:
    """A refusal as FastAPI's own errors look (``{"detail", "code"}``; the sandbox server's ErrorBody)."""
    return JSONResponse({"detail": message, "code": code}, status_code=status)


class HostGate:
    """ASGI middleware that answers only requests whose ``Host`` header names one of
    ``allowed_hosts`` (see :func:`allowed_hosts`); any other is 400 ``host_not_allowed``, saying
    which names are allowed and how to add one, before anything else is looked at. This is what
    stops a web page in the user's browser from reaching a server on 127.0.0.1 through a name it
    rebinds there (DNS rebinding)."""

    def __init__(
        self, app: ASGIApp, *, allowed_hosts: Sequence[str], refuse: Refuse = detail_refusal
    ) -> None:
        self.app = app
        self.allowed = tuple(allowed_hosts)
        self.refuse = refuse

    def refusal(self, scope: Scope) -> str | None:
        raw = _header(scope, b"host")
        if raw is None:
            return f"the request has no Host header; this server answers to {', '.join(self.allowed)}"
        shown = raw.decode("latin-1")
        name = host_name(shown)
        if _matches(name, self.allowed):
            return None
        shown = shown if len(shown) <= 80 else shown[:80] + "..."
        return (
            f"Host {shown!r} is not a name this server answers to (allowed: {', '.join(self.allowed)}); "
            f"if clients reach it by that name, start it with --allowed-host {name[:80] or 'NAME'}"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            problem = self.refusal(scope)
            if problem is not None:
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008, "reason": problem[:120]})
                else:
                    await self.refuse(400, "host_not_allowed", problem)(scope, receive, send)
                return
        await self.app(scope, receive, send)


# ------------------------------------------------------------------------------------ bounded JSON

MAX_JSON_DEPTH = 100
"""How deep the JSON a server reads may nest (arrays and objects inside each other)."""


class JSONInputError(ValueError):
    """JSON a server cannot read: not JSON, or nested deeper than it reads; the message is one line."""


def nesting_depth(value: Any, stop_at: int = MAX_JSON_DEPTH) -> int:
    """How deep ``value`` (parsed JSON) nests its lists and dicts (a scalar: 0), counted without
    recursion; stops counting once it passes ``stop_at``."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if deepest > stop_at:
            return deepest
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def load_json(data: str | bytes, what: str = "the request body", max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``data`` parsed as JSON, refusing (:class:`JSONInputError`, one line naming ``what``) what is
    not JSON text: bytes that are not UTF-8, a ``\\uD800``-``\\uDFFF`` escape without its pair (no
    character: it would fail later, encoding), an integer of over 4300 digits, and JSON nested deeper
    than ``max_depth`` — however deep: Python's parser raises RecursionError past ~1000 levels,
    which is caught here."""
    too_deep = JSONInputError(
        f"{what} nests JSON arrays and objects more than {max_depth} levels deep; "
        f"this server reads at most {max_depth} levels"
    )
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        value = json.loads(text)
    except RecursionError:
        raise too_deep from None
    except UnicodeDecodeError as exc:
        raise JSONInputError(
            f"{what} is not valid JSON: it is not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None
    except ValueError as exc:  # JSONDecodeError, an integer of over 4300 digits
        raise JSONInputError(f"{what} is not valid JSON: {str(exc).splitlines()[0]}") from None
    if nesting_depth(value, max_depth) > max_depth:
        raise too_deep
    if _SURROGATE_ESCAPE.search(text):  # a pair is one character; a lone half is none
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise JSONInputError(
                f"{what} is not valid JSON text: it holds a \\uD800-\\uDFFF escape without its pair"
            ) from None
    return value


def listening_socket(host: str, port: int) -> Any:
    """A socket bound to ``host:port``, ready to listen (0: a free port), for a server to be handed,
    or closed at once to check that the port is free before anything loads. A port another process
    listens on, or a host this machine cannot listen on, is one ConfigError naming host:port and how
    to choose another."""
    import errno
    import socket

    from horizonrl.errors import ConfigError

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: TIME_WAIT does not block
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            other = port + 1 if port < 65535 else port - 1
            raise ConfigError(
                f"port {port} on {host} is in use: another process listens on {host}:{port}; "
                f"choose another with --port, e.g. --port {other}"
            ) from None
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; check --host") from None
    return sock
