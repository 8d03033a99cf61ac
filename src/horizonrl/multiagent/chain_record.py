"""What a chat-chain episode leaves for failure analysis beside its per-role trajectories: the chain's
state as it ran (:class:`ChainFacts`, the ``chain`` field of an ``episodes.jsonl`` line).

Step indices count the episode's model turns in the order they were taken (one per assistant
message, every role together: the order :func:`horizonrl.analysis.trace.episode_trace` numbers a
trace's steps in). A phase run is one pass of a phase (a phase inside a test-and-fix loop runs once
per cycle); a check is the chain's own run of the visible tests (no model turn).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

PhaseEnd = Literal["consensus", "turn_cap", "answered", "context_full"]


class ChainPhaseRun(BaseModel):
    """One pass of a phase: who took part, which steps were its turns and why it ended."""

    model_config = ConfigDict(extra="forbid")

    name: str
    cycle: int = Field(0, ge=0, description="The loop cycle it ran in (0 outside a loop).")
    roles: list[str] = Field(description="Its roles: [instructor, assistant], or the one role.")
    first_step: int = Field(description="The step index of its first turn (-1: it took none).")
    last_step: int = Field(description="The step index of its last turn (-1: it took none).")
    ended: PhaseEnd = Field(
        description="consensus (a role wrote the phase's marker), turn_cap (its turns ran out), "
        "answered (a one-role phase's single turn) or context_full (a role's context had no room left)."
    )
    consensus_by: str | None = Field(None, description="The role that wrote the consensus marker.")


class ChainCheck(BaseModel):
    """The chain running the visible tests itself (a loop's break condition; the final check)."""

    model_config = ConfigDict(extra="forbid")

    after_step: int = Field(description="The last step taken before the check (-1: before any step).")
    phase: str = Field(description="The loop (or 'final') the check belongs to.")
    passed: bool
    output: str = ""


class ChainFacts(BaseModel):
    """A chat-chain episode's state as it ran (see the module doc)."""

    model_config = ConfigDict(extra="forbid")

    chain: str
    entry_point: str = Field("", description="The function the task asks for ('' when it names none).")
    permissions: dict[str, dict[str, list[str]]] = Field(
        default_factory=dict, description="phase -> role -> the tools the phase gives the role."
    )
    phases: list[ChainPhaseRun] = Field(default_factory=list)
    checks: list[ChainCheck] = Field(default_factory=list)
    final_code: str = Field("", description="The workspace's solution file when the chain ended.")

    def phase_of(self, step: int) -> ChainPhaseRun | None:
        """The phase run a step belongs to."""
        return next((p for p in self.phases if p.first_step <= step <= p.last_step), None)

    def allowed(self, phase: str, role: str) -> list[str]:
        """The tools ``phase`` gives ``role`` (none when it names neither)."""
        return self.permissions.get(phase, {}).get(role, [])
