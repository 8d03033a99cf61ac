"""Validation of a task by replaying its reference solution in a fresh world.

A task (synthesized or hand-written) is kept only when its ``data.reference_solution`` — a list of
``{name, arguments}`` tool calls — runs without an error observation in a fresh env and leaves the
world in a state where the task's checker holds, while the checker does *not* already hold in the
initial state (a trivial task teaches nothing). Every rejection has a reason from
:data:`REASONS`, counted by the caller; nothing here raises on a bad task.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from horizonrl.errors import DataError
from horizonrl.types import Action, Task, ToolCall

#: Why a task is rejected (the keys of the counts a synthesis run reports).
REASONS = (
    "malformed",  # the task's data is not a query, a checker and a list of calls
    "bad_checker",  # the checker does not parse against the world's state schema
    "unknown_tool",  # the reference calls a tool the env does not have
    "call_failed",  # a reference call answered with an error observation
    "trivial",  # the checker already holds before any call
    "checker_fails",  # the reference ran, but the checker does not hold afterwards
)


@dataclass(frozen=True)
class CallOutcome:
    """What the world answered to one call, whether it accepted it, and whether the episode ended."""

    observation: str
    ok: bool
    done: bool


async def call_once(env: Any, call: ToolCall, text: str = "") -> CallOutcome:
    """``call`` as an action of its own; the world accepted it unless it answered with an error
    observation (how :class:`~horizonrl.envs.base.ToolEnv` and the API worlds report a refusal)."""
    result = await env.step(Action(text=text, tool_calls=[call]))
    observation = str(result.observations[0].content) if result.observations else ""
    return CallOutcome(observation, not observation.startswith("Error"), result.done)


@dataclass(frozen=True)
class Verdict:
    """The outcome of replaying one task: ``valid``, or the ``reason`` it is not (with ``detail``)."""

    valid: bool
    reason: str | None = None
    detail: str = ""


def _calls(task: Task) -> list[ToolCall] | None:
    calls = task.data.get("reference_solution")
    if not isinstance(calls, list) or not calls:
        return None
    out = []
    for i, call in enumerate(calls):
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return None
        arguments = call.get("arguments") or {}
        if not isinstance(arguments, dict):
            return None
        out.append(ToolCall(id=f"ref_{i}", name=call["name"], arguments=arguments))
    return out


async def replay(make_env: Callable[[], Any], task: Task) -> Verdict:
    """Replay ``task``'s reference solution in a fresh env from ``make_env`` and judge it."""
    calls = _calls(task)
    if calls is None or not isinstance(task.data.get("query"), str) or "checker" not in task.data:
        return Verdict(False, "malformed", "needs data.query, data.checker and a list of {name, arguments}")
    env = make_env()
    try:
        try:
            await env.reset(task)
        except DataError as exc:
            return Verdict(False, "bad_checker", str(exc))
        known = {spec.name for spec in env.tools}
        unknown = [c.name for c in calls if c.name not in known]
        if unknown:
            return Verdict(False, "unknown_tool", f"{unknown[0]!r} (tools: {', '.join(sorted(known))})")
        if await env.evaluate():
            return Verdict(False, "trivial", "the checker holds before any call")
        for i, call in enumerate(calls):
            outcome = await call_once(env, call)
            if not outcome.ok:
                return Verdict(False, "call_failed", f"call {i} ({call.name}): {outcome.observation}")
            if outcome.done:
                break
        if not await env.evaluate():
            return Verdict(False, "checker_fails", "the checker does not hold after the reference solution")
        return Verdict(True)
    finally:
        await env.close()
