"""Who may use the viewer, and what every answer of it says to the browser.

:class:`ViewerGuard` sits in front of the whole app. With a token, every request must carry it:

- ``Authorization: Bearer TOKEN`` (scripts, ``curl``), or
- the cookie a browser gets by opening any page once with ``?token=TOKEN``: the answer is a redirect
  to the same page without the token (it leaves the address bar and the history) that sets an
  ``HttpOnly``, ``SameSite=Strict`` cookie holding a digest of the token, never the token.

Anything else is 401 with the reason. Every answer, refusals included, carries a strict
Content-Security-Policy (the page's own scripts and styles only, no inline script, no framing),
``X-Content-Type-Options: nosniff``, ``X-Frame-Options: DENY`` and ``Referrer-Policy: no-referrer``.
:func:`check_exposure` refuses a viewer bound beyond this machine without a token.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import re
import secrets
from urllib.parse import parse_qsl, urlencode

from starlette.datastructures import MutableHeaders
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from horizonrl.asgi import bearer_token
from horizonrl.errors import ConfigError

TOKEN_ENV = "HORIZON_VIEW_TOKEN"
TOKEN_PARAM = "token"
MIN_TOKEN_CHARS = 8
_TOKEN_CHARS = re.compile(r"[\x21-\x7e]+")  # visible ASCII: it travels in a header and a URL

#: the policy of every answer; the OpenAPI page (``/api/docs``) sets its own
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
}


_INLINE_SCRIPT = re.compile(rb"<script>(.*?)</script>", re.S)


def docs_csp(page: bytes) -> str:
    """The policy of the OpenAPI page (FastAPI's Swagger UI): its scripts and styles from the CDN it
    names, and its one inline script by hash, nothing else inline."""
    hashes = " ".join(
        f"'sha256-{base64.b64encode(hashlib.sha256(body).digest()).decode()}'"
        for body in _INLINE_SCRIPT.findall(page)
    )
    cdn = "https://cdn.jsdelivr.net"
    return (
        f"default-src 'none'; script-src {cdn} {hashes}; style-src {cdn}; img-src 'self' data: "
        "https://fastapi.tiangolo.com; connect-src 'self'; base-uri 'none'; frame-ancestors 'none'"
    )


def check_token(token: str | None) -> str | None:
    """``token`` when it is usable (None: no token); a one-line :class:`ConfigError` otherwise."""
    if token is None:
        return None
    visible = bool(_TOKEN_CHARS.fullmatch(token))
    if len(token) < MIN_TOKEN_CHARS or not visible:
        got = f"{len(token)} characters" + ("" if visible else ", with a space, control or non-ASCII one")
        raise ConfigError(
            f"the viewer's token must be at least {MIN_TOKEN_CHARS} visible ASCII characters without "
            f"spaces (got {got}); e.g. python -c 'import secrets; print(secrets.token_urlsafe())'"
        )
    return token


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine only (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, token: str | None) -> None:
    """A viewer reachable from other machines must require a token (one line, exit 2 on the CLI)."""
    if token is None and not is_loopback(host):
        raise ConfigError(
            f"--host {host} serves the runs and the feedback API beyond this machine, so the viewer "
            f"needs a token: add --token TOKEN (or set {TOKEN_ENV}), or keep --host 127.0.0.1"
        )


def _cookie_value(token: str) -> str:
    return hashlib.sha256(b"horizonrl-view-cookie\0" + token.encode()).hexdigest()


def _cookies(scope: Scope) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in scope["headers"]:
        if key == b"cookie":
            for part in value.decode("latin-1").split(";"):
                name, _, val = part.strip().partition("=")
                out.setdefault(name, val)
    return out


class ViewerGuard:
    """ASGI middleware: the security headers on every answer, and the token check (module doc)."""

    def __init__(self, app: ASGIApp, *, token: str | None) -> None:
        self.app = app
        self.token = check_token(token)
        self.cookie = _cookie_value(self.token) if self.token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    if name not in headers:
                        headers[name] = value
            await send(message)

        refusal = self._check(scope)
        if refusal is not None:
            await refusal(scope, receive, send_with_headers)
            return
        await self.app(scope, receive, send_with_headers)

    def _cookie_name(self, scope: Scope) -> str:
        """One cookie per port: viewers on one host with different tokens do not overwrite each other."""
        server = scope.get("server") or ("", 0)
        return f"horizon_view_{server[1] or 'default'}"

    def _check(self, scope: Scope) -> Response | None:
        """None when the request may go on; else the answer (401, or the redirect setting the cookie)."""
        if self.token is None or self.cookie is None:
            return None
        params = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        given = [value for key, value in params if key == TOKEN_PARAM]
        if given and scope["method"] in ("GET", "HEAD"):
            if not secrets.compare_digest(given[-1].encode(), self.token.encode()):
                return _unauthorized(f"the ?{TOKEN_PARAM}= in the address is not this viewer's token")
            rest = urlencode([(k, v) for k, v in params if k != TOKEN_PARAM])
            answer = RedirectResponse(scope["path"] + (f"?{rest}" if rest else ""), status_code=303)
            answer.set_cookie(
                self._cookie_name(scope), self.cookie, httponly=True, samesite="strict", path="/"
            )
            return answer
        bearer = bearer_token(scope)
        if bearer is not None and secrets.compare_digest(bearer, self.token.encode()):
            return None
        cookie = _cookies(scope).get(self._cookie_name(scope))
        if cookie is not None and secrets.compare_digest(cookie.encode(), self.cookie.encode()):
            return None
        return _unauthorized("the Bearer token is wrong" if bearer is not None else "no token was sent")


def _unauthorized(why: str) -> Response:
    return JSONResponse(
        {
            "detail": f"unauthorized: {why}; this viewer needs its token: send 'Authorization: Bearer "
            f"TOKEN', or open the viewer's address once with ?{TOKEN_PARAM}=TOKEN in a browser"
        },
        status_code=401,
        headers={"WWW-Authenticate": "Bearer", "Cache-Control": "no-store"},
    )
