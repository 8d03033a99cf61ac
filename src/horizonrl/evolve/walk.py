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

The walk also reads the tool docs as a newcomer would: values a parameter's description lists
(``[Enum]: ["celsius", "fahrenheit"]``, ``Here are the options: read_write, read, write``,
``(Buy/Sell)``) are drawn like an enum, a stated range (``from 0 to 100``) bounds a number, and a
parameter no key matches takes values seen under the key whose words its own name and description
share (``add_contact(user_name)`` takes a name a ``user_list`` showed; ``cat(file_name)``, "the file
in the current directory", a name ``current_directory_content`` showed). A string parameter that
names something (a file, a user, a city) never takes a sentence the world said (``"Logged out
successfully"``); only free text (a message, a tweet's content, a description) may. A parameter for
something *new* (``mkdir``'s "name of the new directory") sometimes takes a variant of a name seen
(``report_2.txt``), as a user would make one.

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
        options = stated_options(schema)
        if options:
            return rng.choice(options)
        if kind == "array":  # one item of the item type (BFCL's APIs take a bare string for a list too)
            items = {"description": schema.get("description", ""), **schema.get("items", {"type": "string"})}
            item = self.draw(name, items, rng)
            return [] if item == "" else [item]
        key = (
            name
            if name in self.by_key
            else next((k for k in self.by_key if k.endswith(name) or name.endswith(k)), None)
        )
        key = key or related_key(name, schema, self.by_key) or name
        matches = self.by_key.get(key, [])
        matches = fitting(matches, kind, name, schema)
        if kind == "string" and matches and asks_for_new(schema) and rng.random() < NEW_VARIANT:
            return variant(rng.choice(matches), rng)
        if "date" in name and self.dates and rng.random() < 0.5:
            return self._date_between(rng)
        if matches and (kind != "string" or not self.loose or rng.random() < 0.7):
            newest = fitting(self.latest.get(key, []), kind, name, schema) or matches[-1:]
            return rng.choice(newest) if rng.random() < NEWEST else rng.choice(matches)
        if kind == "string":
            if "date" in name and self.dates:
                return self._date_between(rng)
            seen = self.loose + [v for vs in self.by_key.values() for v in vs if isinstance(v, str)]
            strings = fitting(seen, kind, name, schema)  # no name seen yet: a blank probe, never a sentence
            return rng.choice(strings) if strings else ""
        numbers = [v for vs in self.by_key.values() for v in vs if isinstance(v, (int, float))]
        bounds = stated_range(schema)
        if bounds is not None:
            numbers = [v for v in numbers if bounds[0] <= v <= bounds[1]]
        low, high = (int(bounds[0]), int(bounds[1])) if bounds else (1, 60)
        if kind == "integer":
            ints = [int(v) for v in numbers if float(v).is_integer()]
            return rng.choice(ints) if ints and rng.random() < 0.5 else rng.randint(low, high)
        if kind == "number":
            return rng.choice(numbers) if numbers else float(rng.randint(low, high if bounds else 100))
        if kind == "boolean":
            return rng.random() < 0.5
        return ""

    def _date_between(self, rng: random.Random) -> str:
        days = sorted(dt.date.fromisoformat(d) for d in self.dates)
        span = (days[-1] - days[0]).days
        return (days[0] + dt.timedelta(days=rng.randint(0, span))).isoformat()


# ---------------------------------------------------------------------------------------- reading the docs
_STATED_ENUM = re.compile(r"\[Enum\]:?\s*(\[[^\]]*\])", re.IGNORECASE)
_STATED_OPTIONS = re.compile(
    r"(?:options(?: are)?|one of|either)\s*:?\s*"
    r"((?:[\w-]+\s*,\s*(?:or\s+|and\s+)?)+[\w-]+|[\w-]+\s+or\s+[\w-]+)",
    re.IGNORECASE,
)
_STATED_SLASHES = re.compile(r"\(\s*([A-Za-z][\w-]*(?:\s*/\s*[A-Za-z][\w-]*)+)\s*\)")
_STATED_RANGE = re.compile(r"\bfrom (-?\d+(?:\.\d+)?) to (-?\d+(?:\.\d+)?)\b")
_WORDS = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")
_STOP = frozenset(
    [
        "a",
        "an",
        "the",
        "of",
        "to",
        "in",
        "at",
        "on",
        "for",
        "from",
        "by",
        "with",
        "and",
        "or",
        "is",
        "be",
        "it",
        "its",
        "this",
        "that",
        "as",
        "default",
        "defaults",
        "none",
        "e",
        "g",
        "eg",
        "if",
        "only",
        "can",
        "not",
        "you",
        "your",
        "which",
        "should",
    ]
)
FREE_TEXT = frozenset(
    [
        "content",
        "message",
        "text",
        "description",
        "title",
        "body",
        "comment",
        "query",
        "note",
        "reason",
        "summary",
    ]
)
GENERIC = frozenset(
    {"id", "ids", "name", "names", "type", "value", "number", "list"}
)  # shared by unrelated keys
NEW_VARIANT = 0.5  # chance that a parameter for something new takes a variant of a name seen


def stated_options(schema: dict[str, Any]) -> list[str]:
    """The values a string parameter's description lists as the allowed ones (``[Enum]: [...]``,
    ``options: a, b, c``, ``one of a or b``, ``(Buy/Sell)``); empty when it lists none."""
    if schema.get("type", "string") != "string":
        return []
    text = str(schema.get("description", ""))
    if found := _STATED_ENUM.search(text):
        try:
            listed = json.loads(found.group(1).replace("'", '"'))
            return [str(v) for v in listed if isinstance(v, (str, int, float))]
        except ValueError:
            pass
    if found := _STATED_OPTIONS.search(text):
        return [v for v in re.split(r"\s*,\s*(?:or\s+|and\s+)?|\s+or\s+", found.group(1)) if v]
    if found := _STATED_SLASHES.search(text):
        return [v.strip() for v in found.group(1).split("/")]
    return []


def stated_range(schema: dict[str, Any]) -> tuple[float, float] | None:
    """The bounds a numeric parameter's description states (``from 1 to 5``), else None."""
    found = _STATED_RANGE.search(str(schema.get("description", "")))
    if not found:
        return None
    low, high = float(found.group(1)), float(found.group(2))
    return (low, high) if low <= high else None


def words(text: str) -> set[str]:
    """The content words of a name or a sentence: snake_case and camelCase split, lower-cased."""
    return {w.lower() for w in _WORDS.findall(text)} - _STOP


def related_key(name: str, schema: dict[str, Any], keys: Any) -> str | None:
    """The key (of ``keys``, in order) that shares the most words with the parameter's name (each
    counting double) and description, generic words (``id``, ``name``) aside; None when none shares
    a word."""
    own = words(name) - GENERIC
    described = words(str(schema.get("description", ""))) - GENERIC - own
    best, best_score = None, 0
    for key in keys:
        key_words = words(key)
        score = 2 * len(own & key_words) + len(described & key_words)
        if score > best_score:
            best, best_score = key, score
    return best


def fitting(values: list[Any], kind: str, name: str, schema: dict[str, Any]) -> list[Any]:
    """The values a parameter of JSON type ``kind`` can take: whole numbers for an integer (as ints),
    numbers for a number, and for a string parameter strings, name-like unless it takes free text."""
    if kind == "integer":
        return [int(v) for v in values if isinstance(v, (int, float)) and float(v).is_integer()]
    if kind == "number":
        return [v for v in values if isinstance(v, (int, float))]
    if kind == "string":
        return [v for v in values if isinstance(v, str) and (free_text(name) or name_like(v))]
    return values


def free_text(name: str) -> bool:
    """Whether a string parameter takes free text (a message, a tweet's content) rather than a name."""
    return bool(words(name) & FREE_TEXT)


def name_like(value: str) -> bool:
    """A string that could name something (``report.txt``, ``Alice``, ``San Francisco``, ``USR002``,
    ``456 Oakwood Avenue, Rivermist``), not a sentence the world said (``Logged out successfully``)."""
    text = value.strip()
    if not text or len(text) > 60 or text[-1] in ".!?:" or text != value:
        return False
    parts = text.split()
    if len(parts) == 1:
        return True
    return len(parts) <= 6 and all(not p[:1].isalpha() or p[:1].isupper() for p in parts)


def asks_for_new(schema: dict[str, Any]) -> bool:
    """Whether a parameter names something the call creates (``The name of the new directory``)."""
    return "new" in words(str(schema.get("description", "")))


def variant(value: Any, rng: random.Random) -> Any:
    """A new name like one seen: ``report.txt`` → ``report_2.txt``, ``archive`` → ``archive_3``."""
    if not isinstance(value, str) or not value:
        return value
    stem, dot, extension = value.rpartition(".")
    if not dot or not stem:
        stem, extension = value, ""
    return f"{stem}_{rng.randint(2, 9)}" + (f".{extension}" if extension else "")


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
