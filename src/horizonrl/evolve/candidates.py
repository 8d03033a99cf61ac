"""Candidate tasks from exploration traces: what a task's reference and checker are.

The calls the world accepted are replayed in a fresh world; every call that changes the world's
state closes a :class:`Candidate` whose **reference solution** is the calls so far that it needs
(:func:`minimal_reference`) and whose **checker** is derived from the change
(:func:`state_change_checker`). A candidate whose goal holds an item the session created and then
altered is marked a detour (:func:`revises_own_item`); :func:`passes_empty_value` spots a blank
probe. The query is written later (:mod:`.queries`), by :func:`~.synthesize.synthesize`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from horizonrl.evolve.explore import ExplorationTrace, exploration_task
from horizonrl.evolve.validate import call_once
from horizonrl.types import ToolCall


def state_change_checker(
    before: dict[str, Any],
    after: dict[str, Any],
    schema: dict[str, Any],
    assigned: dict[str, tuple[str, ...]] | None = None,
) -> dict[str, Any] | None:
    """A checker that holds when the change from ``before`` to ``after`` has happened, or None when
    nothing the schema names changed. A collection's first schema field is its key: a new item is
    checked by its own fields (not those in ``assigned[collection]``, which the world assigns), a
    changed item by its key and the changed fields; a changed top-level field (not in
    ``assigned[""]``) by its new value."""
    assigned = assigned or {}
    parts: list[dict[str, Any]] = []
    for name, kind in schema.items():
        if isinstance(kind, dict):
            key = next(iter(kind))
            old = {item.get(key): item for item in before.get(name, [])}
            skip = set(assigned.get(name, ()))
            for item in after.get(name, []):
                previous = old.get(item.get(key))
                if previous is None:
                    fields = {k: item[k] for k in kind if k in item and k not in skip}
                else:
                    changed = {k: item[k] for k in kind if k in item and previous.get(k) != item[k]}
                    if not changed:
                        continue
                    fields = {key: item[key], **changed}
                if fields:
                    parts.append(
                        {
                            "exists": name,
                            "where": {
                                "all": [{"field": k, "op": "eq", "value": v} for k, v in fields.items()]
                            },
                        }
                    )
        elif name not in assigned.get("", ()) and before.get(name) != after.get(name):
            parts.append({"field": name, "op": "eq", "value": after.get(name)})
    return {"all": parts} if parts else None


def revises_own_item(
    start: dict[str, Any], previous: dict[str, Any], now: dict[str, Any], schema: dict[str, Any]
) -> bool:
    """Whether the step from ``previous`` to ``now`` changed an item that was not there at ``start``:
    the exploration created something and then altered it (booked a ticket, then cancelled it). A
    task whose goal holds that item is a detour a user would not ask for; it teaches undoing."""
    for name, kind in schema.items():
        if not isinstance(kind, dict):
            continue
        key = next(iter(kind))
        original = {item.get(key) for item in start.get(name, [])}
        before = {item.get(key): item for item in previous.get(name, [])}
        for item in now.get(name, []):
            k = item.get(key)
            if k not in original and k in before and before[k] != item:
                return True
    return False


def passes_empty_value(reference: list[dict[str, Any]]) -> bool:
    """Whether a reference call passes an empty string: an explorer's blank probe (a world that
    accepts ``touch(file_name="")``), not something a user would ask for."""
    return any(v == "" for call in reference for v in (call.get("arguments") or {}).values())


def difficulty(reference: list[dict[str, Any]]) -> str:
    """easy (1–2 operations), medium (3–4) or hard (5 or more), by the reference's calls."""
    n = len(reference)
    return "easy" if n <= 2 else "medium" if n <= 4 else "hard"


@dataclass
class Candidate:
    trace_id: str
    reference: list[dict[str, Any]]
    checker: dict[str, Any]
    difficulty: str
    query: str = ""
    detour: bool = False  # its goal holds an item the exploration created and then altered
    world_seed: int = 0  # the world it was explored (and is replayed) in


def _mentions(observation: str, value: Any) -> bool:
    text = value if isinstance(value, str) else json.dumps(value)
    return bool(text) and text in observation


def _passes(call: dict[str, Any], value: Any) -> bool:
    return any(v == value for v in call.get("arguments", {}).values())


def minimal_reference(
    calls: list[dict[str, Any]], observations: list[str], changed: list[bool], given: set[str]
) -> list[dict[str, Any]]:
    """The calls a task's reference needs: every call that changed the world, and (transitively)
    the latest earlier call whose answer shows an argument value a needed call passes — unless the
    request states it (``given``: the values of the checker). A call that was passed the value
    only echoes it (``get_order`` of O-1001 shows O-1001) and is no source: the source is the call
    that revealed it. The exploration's other look-ups drop."""
    needed = {i for i, c in enumerate(changed) if c} | {len(calls) - 1}
    for j in range(len(calls) - 1, -1, -1):
        if j not in needed:
            continue
        for value in calls[j].get("arguments", {}).values():
            if isinstance(value, (dict, list)) or str(value) in given:
                continue
            source = next(
                (
                    k
                    for k in range(j - 1, -1, -1)
                    if _mentions(observations[k], value) and not _passes(calls[k], value)
                ),
                None,
            )
            if source is not None:
                needed.add(source)
    return [calls[i] for i in sorted(needed)]


def _checker_values(checker: Any) -> set[str]:
    if isinstance(checker, dict):
        return {v for k, x in checker.items() for v in _checker_values(x)} | (
            {str(checker["value"])} if "value" in checker else set()
        )
    if isinstance(checker, list):
        return {v for x in checker for v in _checker_values(x)}
    return set()


async def _fresh_world(make_env: Callable[[], Any], task_id: str, world_seed: int) -> Any:
    """A new env from ``make_env``, reset for exploration (no request, no checker) into world
    ``world_seed``."""
    env = make_env()
    await env.reset(exploration_task(task_id, getattr(env, "name", ""), world_seed))
    return env


async def _replayed_change(
    make_env: Callable[[], Any], task_id: str, calls: list[dict[str, Any]], world_seed: int
) -> tuple[dict[str, Any] | None, bool]:
    """Replay ``calls`` in a fresh world ``world_seed``: (the checker of what they changed, or None
    when a call is refused or nothing changed; whether they altered an item they had created — a
    detour)."""
    env = await _fresh_world(make_env, task_id, world_seed)
    try:
        start = previous = env.world_state()
        detour = False
        for i, call in enumerate(calls):
            outcome = await call_once(
                env, ToolCall(id=f"f{i}", name=call["name"], arguments=call["arguments"])
            )
            if not outcome.ok:
                return None, False
            now = env.world_state()
            detour = detour or revises_own_item(start, previous, now, env.state_schema)
            previous = now
        return state_change_checker(
            start, previous, env.state_schema, getattr(env, "assigned_fields", {})
        ), detour
    finally:
        await env.close()


async def candidates_from_trace(
    make_env: Callable[[], Any], trace: ExplorationTrace, focused: bool = False
) -> list[Candidate]:
    """Replay the trace's accepted calls in a fresh world; one candidate per call that changed it.

    Cumulative (the default): the candidate's goal is everything the session changed so far, its
    reference every call that changed something and the look-ups those needed; it is a detour from
    the first call that altered an item the session itself had created. ``focused``: the goal is
    what this call changed, the reference this call and (transitively) the calls whose answers gave
    its arguments — the session's unrelated changes drop out — replayed on its own in a fresh world
    for its checker (a reference that does not replay on its own closes no candidate)."""
    calls = trace.ok_calls()
    if not calls:
        return []
    world = trace.world_seed

    def candidate(reference: list[dict[str, Any]], checker: dict[str, Any], detour: bool) -> Candidate:
        level = difficulty(reference)
        return Candidate(trace.id, reference, checker, level, detour=detour, world_seed=world)

    env = await _fresh_world(make_env, trace.id, world)
    out: list[Candidate] = []
    try:
        start = env.world_state()
        assigned = getattr(env, "assigned_fields", {})
        previous = start
        observations: list[str] = []
        changed: list[bool] = []
        detour = False
        for i, call in enumerate(calls):
            tool_call = ToolCall(id=f"r{i}", name=call["name"], arguments=call["arguments"])
            outcome = await call_once(env, tool_call)
            if not outcome.ok:  # the world answers differently on replay
                break
            now = env.world_state()
            observations.append(outcome.observation)
            changed.append(now != previous)
            if not focused:  # a focused candidate's detour is judged on its own replay
                detour = detour or revises_own_item(start, previous, now, env.state_schema)
            if now != previous and focused:
                own = state_change_checker(previous, now, env.state_schema, assigned)
                if own is not None:
                    only_this = [False] * i + [True]
                    reference = minimal_reference(
                        calls[: i + 1], observations, only_this, _checker_values(own)
                    )
                    checker, own_detour = await _replayed_change(make_env, trace.id, reference, world)
                    if checker is not None:
                        out.append(candidate(reference, checker, own_detour))
            elif now != previous:
                checker = state_change_checker(start, now, env.state_schema, assigned)
                if checker is not None:
                    reference = minimal_reference(
                        calls[: i + 1], observations, changed, _checker_values(checker)
                    )
                    out.append(candidate(reference, checker, detour))
            previous = now
    finally:
        await env.close()
    return out
