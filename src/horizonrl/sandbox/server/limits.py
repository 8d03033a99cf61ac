"""The sandbox server's own limits: a ceiling on each limit a client may ask for, the disk quota of
the workspaces (per sandbox and for the whole server), and exec output cut at the ceiling.

A client chooses its sandbox's :class:`SandboxLimits`; the server decides how far it may go. A limit
asked for above its ceiling is refused (422, naming the limit, the value and the ceiling); a limit
the client left out is its default, or the ceiling where that is lower."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from horizonrl.sandbox.base import ExecResult, SandboxLimitError, SandboxLimits, truncate_output

MIB = 1024 * 1024

DEFAULT_CEILINGS = SandboxLimits(
    cpu_s=1200, memory_mib=2048, processes=512, file_size_mib=512, tmp_mib=512, output_bytes=MIB
)
"""The ceilings of a server started without options: twice :class:`SandboxLimits`'s defaults (four
times for output), so a client with default limits always passes and none can take a shared host."""

CEILING_OPTIONS = {name: f"--max-{name.replace('_', '-')}" for name in SandboxLimits.model_fields}
"""The ``horizon sandbox serve`` option that sets each ceiling (``--max-memory-mib``, ...)."""

DEFAULT_WORKSPACE_MIB = 512
"""The disk quota of one sandbox's workspace by default (``--workspace-mib``)."""
DEFAULT_TOTAL_WORKSPACE_MIB = 8 * 1024
"""The disk quota of all the server's workspaces together by default (``--total-workspace-mib``)."""


class ServerLimits(BaseModel):
    """What a sandbox server allows: ``ceilings`` on the limits a client asks for (None: none), and
    the disk quota of what sandboxes write to their workspaces, per sandbox and for all of them
    together (None: no quota; see :mod:`.quota`)."""

    model_config = ConfigDict(extra="forbid")

    ceilings: SandboxLimits | None = Field(
        default_factory=lambda: DEFAULT_CEILINGS.model_copy(),
        description="The most a client may ask for, limit by limit.",
    )
    workspace_mib: int | None = Field(
        DEFAULT_WORKSPACE_MIB, ge=1, description="Disk quota of one sandbox's workspace (what it writes)."
    )
    total_workspace_mib: int | None = Field(
        DEFAULT_TOTAL_WORKSPACE_MIB, ge=1, description="Disk quota of all the server's workspaces together."
    )

    @classmethod
    def off(cls) -> ServerLimits:
        """No ceilings and no quotas: clients' limits as asked (for comparison; not for a shared host)."""
        return cls(ceilings=None, workspace_mib=None, total_workspace_mib=None)

    def limits_for(self, asked: SandboxLimits) -> SandboxLimits:
        """The limits a new sandbox gets: ``asked`` where within the ceilings, the ceiling for a
        default above it; a value the client set above its ceiling raises :class:`SandboxLimitError`
        (422) naming every such limit, the value and the ceiling."""
        if self.ceilings is None:
            return asked
        values, over = {}, []
        ceilings = self.ceilings
        for name in SandboxLimits.model_fields:
            value, ceiling = getattr(asked, name), getattr(ceilings, name)
            if value <= ceiling:
                values[name] = value
            elif name in asked.model_fields_set:
                over.append(name)
            else:
                values[name] = ceiling
        if over:
            said = [
                f"limits.{n}={getattr(asked, n)} is above this server's ceiling of {getattr(ceilings, n)}"
                for n in over
            ]
            raise SandboxLimitError(
                "; ".join(said) + "; ask for at most the ceiling (the server's operator sets it: "
                f"horizon sandbox serve {', '.join(CEILING_OPTIONS[n] for n in over)})"
            )
        return SandboxLimits(**values)


MARKER_SLACK = 64
"""Characters a backend's own cut adds to ``output_bytes`` (its ``[... N bytes cut ...]`` marker)."""


def cap_output(result: ExecResult, limit: int) -> ExecResult:
    """``result`` with stdout and stderr each cut to ``limit`` bytes (head and tail around the
    ``[... N bytes cut ...]`` marker) where a backend let more through; output within the limit (and
    a backend's own cut, within a marker's worth of it) is returned as it is, without re-encoding."""
    if len(result.stdout) <= limit + MARKER_SLACK and len(result.stderr) <= limit + MARKER_SLACK:
        return result
    out, cut_out = _cut(result.stdout, limit)
    err, cut_err = _cut(result.stderr, limit)
    return result.model_copy(
        update={"stdout": out, "stderr": err, "truncated": result.truncated or cut_out or cut_err}
    )


def _cut(text: str, limit: int) -> tuple[str, bool]:
    if len(text) <= limit + MARKER_SLACK:
        return text, False
    return truncate_output(text.encode("utf-8", errors="surrogateescape"), limit)
