"""The Sandbox contract: typed requests and results shared by every backend and the sandbox server.

A sandbox is an isolated, stateful workspace: a directory (``/workspace`` inside the sandbox, a git
repository seeded from a template) plus the processes an agent starts there. Every backend —
bubblewrap on this machine (:mod:`horizonrl.sandbox.bwrap`), a sandbox server over HTTP
(:mod:`horizonrl.sandbox.remote`), Docker (:mod:`horizonrl.sandbox.docker`) — implements the same
async :class:`Sandbox` protocol and speaks these pydantic models, so an env switches backend by
config alone (:func:`horizonrl.sandbox.make_backend`).
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any, Literal, Protocol, runtime_checkable

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    WithJsonSchema,
    field_validator,
)

from horizonrl.errors import HorizonError

WORKSPACE = "/workspace"
"""Where the workspace is inside every sandbox (also the working directory of ``exec``)."""


# --- errors -------------------------------------------------------------------------------------


class SandboxError(HorizonError):
    """A sandbox could not do what was asked; the message says what and why."""

    code = "sandbox_error"
    status = 500


class SandboxUnavailableError(SandboxError):
    """The backend cannot run here (e.g. bubblewrap missing, no Docker engine answering)."""

    code = "unavailable"
    status = 503


class SandboxNotFoundError(SandboxError):
    """No live sandbox has this id (never created, closed, or reaped after its idle TTL)."""

    code = "sandbox_not_found"
    status = 404


class SandboxCapacityError(SandboxError):
    """The backend holds as many live sandboxes as it may; close some or raise the cap."""

    code = "capacity"
    status = 429


class SandboxPathError(SandboxError):
    """A read_file/write_file path is empty, malformed or resolves outside the workspace."""

    code = "bad_path"
    status = 400


class SandboxFileNotFoundError(SandboxError):
    """read_file of a path that does not exist (or is not a regular file)."""

    code = "file_not_found"
    status = 404


class SandboxAuthError(SandboxError):
    """The sandbox server refused the token."""

    code = "unauthorized"
    status = 401


class SandboxLimitError(SandboxError):
    """A sandbox asked for a limit above the sandbox server's ceiling for it."""

    code = "limit_above_ceiling"
    status = 422


class SandboxQuotaError(SandboxError):
    """A write would take a workspace (or all of a server's workspaces) over its disk quota."""

    code = "quota_exceeded"
    status = 409


ERRORS_BY_CODE: dict[str, type[SandboxError]] = {
    cls.code: cls
    for cls in (
        SandboxError,
        SandboxUnavailableError,
        SandboxNotFoundError,
        SandboxCapacityError,
        SandboxPathError,
        SandboxFileNotFoundError,
        SandboxAuthError,
        SandboxLimitError,
        SandboxQuotaError,
    )
}


# --- models -------------------------------------------------------------------------------------


def _from_base64(value: Any) -> Any:
    """JSON gives base64 text: decode it strictly (``"!!"`` is an error, not ``b""``). Python callers
    give the raw bytes, which are kept as they are."""
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"data must be base64 text (RFC 4648, with padding): {exc}") from None
    return value


FileBytes = Annotated[
    bytes,
    BeforeValidator(_from_base64),
    PlainSerializer(lambda data: base64.b64encode(data).decode("ascii"), return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "format": "base64", "description": "The bytes, base64-encoded."}),
]
"""File contents: raw bytes in Python, strict base64 text in JSON."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SandboxLimits(_Model):
    """Resource limits of one sandbox (memory and processes per sandbox through a cgroup where root
    or a delegated cgroup allows one, else through rlimits; see docs/sandboxes.md)."""

    cpu_s: int = Field(600, ge=1, description="CPU seconds any one process may use (RLIMIT_CPU).")
    memory_mib: int = Field(1024, ge=16, description="Memory of the whole sandbox (all its processes).")
    processes: int = Field(256, ge=4, description="Processes and threads alive at once in the sandbox.")
    file_size_mib: int = Field(256, ge=1, description="Largest file a process may write (RLIMIT_FSIZE).")
    tmp_mib: int = Field(256, ge=1, description="Size of the sandbox's private /tmp (a tmpfs).")
    output_bytes: int = Field(
        256 * 1024, ge=1024, description="stdout and stderr kept per exec, each; the rest is cut."
    )


class SandboxSpec(_Model):
    """What to create: the workspace's template and the limits.

    ``template`` is a directory whose contents seed the workspace (a path for a local backend; for
    the sandbox server, a name under its ``--templates`` directory). None starts an empty workspace.
    """

    template: str | None = Field(None, description="Template directory (local) or template name (server).")
    limits: SandboxLimits = Field(default_factory=SandboxLimits)


class SandboxInfo(_Model):
    id: str
    backend: str
    template: str | None = None
    created_at: float = Field(description="Unix time of creation.")
    last_used_at: float = Field(description="Unix time of the last request.")
    limits: SandboxLimits
    mode: Literal["root", "rootless"] | None = Field(
        None, description="bwrap: built by root, or by an ordinary user in its own user namespaces."
    )
    limits_by: Literal["cgroup", "rlimit"] | None = Field(
        None,
        description="bwrap: how memory and processes are limited: per sandbox by a cgroup, or by "
        "rlimits (memory per process; processes per sandbox through its user namespace).",
    )


class ExecRequest(_Model):
    cmd: str = Field(min_length=1, description="A shell command, run by /bin/sh -c in /workspace.")
    timeout: float = Field(60.0, gt=0, le=24 * 3600, description="Seconds before the command is killed.")

    @field_validator("cmd")
    @classmethod
    def _no_nul(cls, cmd: str) -> str:
        if "\0" in cmd:
            raise ValueError("cmd must not contain a NUL byte")
        return cmd


class ExecResult(_Model):
    exit_code: int = Field(description="The command's exit status; negative: killed by that signal.")
    stdout: str
    stderr: str
    truncated: bool = Field(False, description="Output went past the limit: the rest was cut.")
    timed_out: bool = Field(False, description="The command ran past its timeout and was killed.")
    over_quota: bool = Field(
        False,
        description="The workspace went over its disk quota (sandbox server): the sandbox's processes "
        "were killed and stderr starts with the reason.",
    )
    duration: float = Field(description="Wall seconds from start to exit.")

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.over_quota


def truncate_output(data: bytes, limit: int) -> tuple[str, bool]:
    """``data`` as text, cut to ``limit`` bytes keeping the head and the tail around a
    ``[... N bytes cut ...]`` marker (as every backend cuts output): the text and whether anything
    was cut."""
    if len(data) <= limit:
        return data.decode("utf-8", errors="replace"), False
    head, tail = limit // 2, limit - limit // 2
    cut = len(data) - head - tail
    kept = data[:head] + f"\n[... {cut} bytes cut ...]\n".encode() + data[-tail:]
    return kept.decode("utf-8", errors="replace"), True


class ReadFileRequest(_Model):
    path: str = Field(description="Relative to /workspace, or absolute inside it.")


class WriteFileRequest(_Model):
    path: str = Field(description="Relative to /workspace, or absolute inside it; parents are created.")
    data: FileBytes = Field(description="The file's new contents, base64 in JSON.")


class FileData(_Model):
    path: str
    data: FileBytes


class DiffResult(_Model):
    diff: str = Field(description="git diff (binary-safe) of the workspace against its starting state.")


class ErrorBody(_Model):
    """The body of every error the sandbox server returns (besides FastAPI's 422)."""

    detail: str
    code: str


class Health(_Model):
    status: Literal["ok"] = "ok"
    backend: str
    sandboxes: int
    capacity: int


# --- the protocol -------------------------------------------------------------------------------


def workspace_diff_script(base: str) -> str:
    """The shell line every backend runs in /workspace for ``diff``: stage everything into a
    throwaway index (the agent's own index is left alone) and diff it against ``base``, so new and
    deleted files show up too. The copy keeps the index's mtime (``cp -p``): git trusts an entry whose
    size and mtime (whole seconds) match the file only when the entry is older than the index file,
    and a fresh mtime on the copy would hide a same-size change made in the second of the commit."""
    return (
        "i=/tmp/.horizonrl-index-$$ && trap 'rm -f \"$i\"' EXIT && "
        '{ cp -p .git/index "$i" 2>/dev/null || :; } && export GIT_INDEX_FILE="$i" && '
        "git -c core.fileMode=true add -A . >/dev/null && "
        f"git diff --cached --binary --no-color --no-ext-diff {base}"
    )


def check_path(path: str) -> str:
    """Validate a read_file/write_file path (before any backend resolves it): a non-empty string
    without NUL bytes. Where it points is checked inside the sandbox, after symlinks."""
    if not isinstance(path, str) or not path.strip():
        raise SandboxPathError(
            "path must be a non-empty string (relative to /workspace or absolute inside it)"
        )
    if "\0" in path:
        raise SandboxPathError(f"path {path!r} contains a NUL byte")
    return path


@runtime_checkable
class Sandbox(Protocol):
    """An isolated, stateful workspace (DESIGN.md's contract); use ``async with`` to close it."""

    id: str

    async def exec(self, cmd: str, timeout: float = 60.0) -> ExecResult: ...

    async def read_file(self, path: str) -> bytes: ...

    async def write_file(self, path: str, data: bytes) -> None: ...

    async def diff(self) -> str: ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> Sandbox: ...

    async def __aexit__(self, *exc: object) -> None: ...


class SandboxBackend(Protocol):
    """Creates sandboxes of one kind (bwrap, remote, docker)."""

    name: str

    async def create(self, spec: SandboxSpec | None = None) -> Sandbox: ...

    async def aclose(self) -> None:
        """Close every sandbox this backend still holds and release its resources."""
        ...
