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

Limits are the server's (:class:`ServerLimits`): a limit a client asks for above its ceiling is 422
(``limit_above_ceiling``), one the backend cannot enforce (its cgroup cannot be made) is 503, exec
output is cut at the sandbox's ``output_bytes``, and what sandboxes write to their workspaces is
held to a disk quota per sandbox and for the whole server (:mod:`.quota`).

Where each job lives: :mod:`.gate` (token and size checks before a body is read), :mod:`.pool`
(the sandboxes held, the cap, the reaper, the metrics, long commands), :mod:`.limits` (ceilings,
output), :mod:`.quota` (the workspace quota), :mod:`.app` (the routes, :func:`serve`,
:func:`serve_in_subprocess`).
"""

from __future__ import annotations

from horizonrl.sandbox.server.app import (
    CLIENT_CLOSED_REQUEST,
    UVICORN_OPTIONS,
    create_app,
    serve,
    serve_in_subprocess,
)
from horizonrl.sandbox.server.gate import DEFAULT_MAX_REQUEST_BYTES, RequestGate, RequestTooLargeError
from horizonrl.sandbox.server.limits import DEFAULT_CEILINGS, ServerLimits
from horizonrl.sandbox.server.pool import ARGV_COMMAND_BYTES, SandboxPool, run_command

__all__ = [
    "ARGV_COMMAND_BYTES",
    "CLIENT_CLOSED_REQUEST",
    "DEFAULT_CEILINGS",
    "DEFAULT_MAX_REQUEST_BYTES",
    "UVICORN_OPTIONS",
    "RequestGate",
    "RequestTooLargeError",
    "SandboxPool",
    "ServerLimits",
    "create_app",
    "run_command",
    "serve",
    "serve_in_subprocess",
]
