"""Scripted exploration: a random walk over a world's operations, grounded in what the world says.

An explorer for when no model at hand writes usable tool calls (the embedded 135M model writes
almost none). It knows nothing about a particular world: each turn it picks an operation (the
probed one in a breadth session, one drawn by the seed in a depth session) and fills the
arguments from a **value pool** — the values the session has seen so far, by key: ISO dates in the
profile's background, the fields of every JSON answer (``"offer_id": "OF1"`` fills an ``offer_id``
parameter), and the names an error lists (``unknown city 'X': the airline flies between Berlin,
Paris, …`` makes those names candidates for string parameters). A parameter with a matching key
usually takes one of the values the **newest answer** showed under it, drawn evenly (a booking
picks any offer of the search just made, so every cabin and flight of it is tried, not only the
last one listed), otherwise any value seen. A parameter no key matches gets a value of its type
from the pool; a date-like parameter draws a date between the earliest and latest date seen.

Every call and answer is recorded like a model explorer's (:class:`~.explore.ExplorationTrace`),
so synthesis and validation are the same for both.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import re
from collections.abc import Callable
from typing import Any

from horizonrl.evolve.config import ExploreConfig
from horizonrl.evolve.explore import ExplorationTrace, ExploreStep, Session, session_tasks
from horizonrl.evolve.profile import CONTROL_TOOLS, EnvProfile
from horizonrl.evolve.validate import call_once
from horizonrl.seeds import derive_seed
from horizonrl.types import ToolCall, ToolSpec

_ISO_DATE = re.compile(r"\b(\d{4}-\d{2}-\d{2})\b")
_LISTED = re.compile(
    r"(?::|between|one of|valid(?: values)?:?)\s+([A-Z][\w-]*(?:,\s*(?:and\s+)?[A-Z][\w-]*){2,})"
)
NEWEST = 0.7  # chance that a parameter with a matching key takes a value of the newest answer showing it


class ValuePool:
    """The values a session has seen, by key (newest last), the values the newest answer showing a key
    had under it, and loose strings an error listed."""

    def __init__(self) -> None:
        self.by_key: dict[str, list[Any]] = {}
        self.latest: dict[str, list[Any]] = {}
        self.loose: list[str] = []
        self.dates: set[str] = set()

    def add(self, key: str, value: Any) -> bool:
        """Remember ``value`` under ``key`` as the newest; False for a value no parameter takes."""
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            return False
        values = self.by_key.setdefault(key, [])
        if value in values:
            values.remove(value)
        values.append(value)
        if isinstance(value, str):
            self.dates.update(_ISO_DATE.findall(value))
        return True

    def add_text(self, text: str) -> None:
        """What an answer says: its JSON fields by key, else listed names and dates."""
        self.dates.update(_ISO_DATE.findall(text))
        try:
            answer: dict[str, list[Any]] = {}
            self._add_json(json.loads(text), answer=answer)
            self.latest.update(answer)
            return
        except ValueError:
            pass
        for listed in _LISTED.findall(text):
            for name in re.split(r",\s*(?:and\s+)?", listed):
                if name and name not in self.loose:
                    self.loose.append(name)

    def _add_json(self, value: Any, key: str = "", answer: dict[str, list[Any]] | None = None) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                self._add_json(v, str(k), answer)
        elif isinstance(value, list):
            for item in value:
                self._add_json(item, key, answer)
        elif key and self.add(key, value) and answer is not None:
            answer.setdefault(key, []).append(value)

    def draw(self, name: str, schema: dict[str, Any], rng: random.Random) -> Any:
        """A value for parameter ``name`` (JSON schema ``schema``)."""
        kind = schema.get("type", "string")
        if "enum" in schema:
            return rng.choice(schema["enum"])
        key = (
            name
            if name in self.by_key
            else next((k for k in self.by_key if k.endswith(name) or name.endswith(k)), name)
        )
        matches = self.by_key.get(key, [])
        if "date" in name and self.dates and rng.random() < 0.5:
            return self._date_between(rng)
        if matches and (kind != "string" or not self.loose or rng.random() < 0.7):
            newest = self.latest.get(key) or matches[-1:]
            return rng.choice(newest) if rng.random() < NEWEST else rng.choice(matches)
        if kind == "string":
            if "date" in name and self.dates:
                return self._date_between(rng)
            strings = self.loose + [v for vs in self.by_key.values() for v in vs if isinstance(v, str)]
            return rng.choice(strings) if strings else ""
        numbers = [v for vs in self.by_key.values() for v in vs if isinstance(v, (int, float))]
        if kind == "integer":
            ints = [int(v) for v in numbers if float(v).is_integer()]
            return rng.choice(ints) if ints and rng.random() < 0.5 else rng.randint(1, 60)
        if kind == "number":
            return rng.choice(numbers) if numbers else float(rng.randint(1, 100))
        if kind == "boolean":
            return rng.random() < 0.5
        return ""

    def _date_between(self, rng: random.Random) -> str:
        days = sorted(dt.date.fromisoformat(d) for d in self.dates)
        span = (days[-1] - days[0]).days
        return (days[0] + dt.timedelta(days=rng.randint(0, span))).isoformat()


GROUNDED_WEIGHT = 4.0  # how much likelier an operation is when the pool has a value for each of its ids


def grounded(spec: ToolSpec, pool: ValuePool) -> bool:
    """Whether every required ``*_id`` parameter of ``spec`` has a value seen under its own key (the
    world has shown what to pass: a booking after a search)."""
    required = spec.parameters.get("required", [])
    ids = [name for name in required if name.endswith("id")]
    return bool(ids) and all(pool.by_key.get(name) for name in ids)


def choose_operation(by_name: dict[str, ToolSpec], pool: ValuePool, rng: random.Random) -> str:
    """An operation drawn at random, an operation the pool can ground more often (so chains form)."""
    names = sorted(by_name)
    weights = [GROUNDED_WEIGHT if grounded(by_name[n], pool) else 1.0 for n in names]
    return rng.choices(names, weights=weights)[0]


def walk_arguments(spec: ToolSpec, pool: ValuePool, rng: random.Random) -> dict[str, Any]:
    """Arguments for ``spec`` from the pool: every required parameter, an optional one half the time."""
    props = spec.parameters.get("properties", {})
    required = set(spec.parameters.get("required", []))
    return {
        name: pool.draw(name, schema, rng)
        for name, schema in props.items()
        if name in required or rng.random() < 0.5
    }


async def walk_session(
    make_env: Callable[[], Any],
    profile: EnvProfile,
    session: Session,
    seed: int,
) -> ExplorationTrace:
    """One session of the random walk in a fresh world; every call and answer recorded."""
    session_id, focus, turns = session.id, session.focus, session.turns
    rng = random.Random(derive_seed(seed, "walk", session_id))
    env = make_env()
    trace = ExplorationTrace(id=session_id, phase=session.phase, focus=focus, world_seed=session.world_seed)
    pool = ValuePool()
    pool.add_text(profile.background)
    try:
        await env.reset(session.task(profile.name))
        by_name = {t.name: t for t in env.tools if t.name not in CONTROL_TOOLS}
        for turn in range(turns):
            trace.turns += 1
            name = focus if focus and turn == turns - 1 else choose_operation(by_name, pool, rng)
            arguments = walk_arguments(by_name[name], pool, rng)
            outcome = await call_once(
                env, ToolCall(id=f"{session_id}_{turn}", name=name, arguments=arguments)
            )
            trace.steps.append(
                ExploreStep(name=name, arguments=arguments, observation=outcome.observation, ok=outcome.ok)
            )
            trace.replies.append(json.dumps({"name": name, "arguments": arguments}))
            pool.add_text(outcome.observation)
    finally:
        await env.close()
    return trace


async def walk(
    make_env: Callable[[], Any], profile: EnvProfile, config: ExploreConfig, seed: int = 0
) -> list[ExplorationTrace]:
    """Every session of both phases, walked one after another (the world is in-process and fast)."""
    return [await walk_session(make_env, profile, s, seed) for s in session_tasks(profile, config)]
