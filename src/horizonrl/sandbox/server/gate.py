"""The sandbox server's gate: :class:`horizonrl.asgi.RequestGate` in front of the whole app, refusing
a request before its body is read — without the bearer token (401, anything but the public paths),
or with a body over the limit (413). Every refusal is an :class:`ErrorBody`, as are the app's own
errors (:func:`error_response`)."""

from __future__ import annotations

from fastapi.responses import JSONResponse
from starlette.responses import Response
from starlette.types import ASGIApp

from horizonrl.asgi import RequestGate as _Gate
from horizonrl.sandbox.base import ErrorBody, SandboxAuthError, SandboxError

DEFAULT_MAX_REQUEST_BYTES = 16 * 1024 * 1024
"""The largest request body the server reads by default (``--max-request-mib``)."""

TOO_LARGE_HINT = "send less (write a large file in parts) or start the server with a higher --max-request-mib"


class RequestTooLargeError(SandboxError):
    """A request body over the server's ``max_request_bytes``."""

    code = "request_too_large"
    status = 413


def error_response(exc: SandboxError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    body = ErrorBody(detail=str(exc), code=exc.code)
    return JSONResponse(body.model_dump(), status_code=exc.status, headers=headers)


def _refuse(status: int, code: str, message: str) -> Response:
    kind = SandboxAuthError if status == 401 else RequestTooLargeError
    return error_response(kind(message))


class RequestGate(_Gate):
    """The gate with the sandbox server's error shape; ``token`` is required."""

    def __init__(self, app: ASGIApp, *, token: str, max_request_bytes: int, public_paths: set[str]) -> None:
        if not token:
            raise ValueError("the sandbox server needs a non-empty token")
        super().__init__(
            app,
            token=token,
            max_request_bytes=max_request_bytes,
            public_paths=public_paths,
            refuse=_refuse,
            too_large_hint=TOO_LARGE_HINT,
        )
