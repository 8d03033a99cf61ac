"""Task synthesis from exploration: references from what the explorer did, checkers from what it
changed, queries from the synthesizer role, then validation by replay and de-duplication.

For each exploration trace the calls the world accepted are replayed in a fresh world; every call
that changes the world's state closes a candidate task whose **reference solution** is the calls so
far that it needs (:func:`minimal_reference`: the state changes and the look-ups that supplied
their arguments) and whose **checker** is derived from the change (:func:`state_change_checker`: the new or
changed items of each collection, minus the fields the world assigns itself such as ids and
prices). The world writes the checker, so it is exact; the model writes only the **query**: the
synthesizer role is shown the calls, the change and a difficulty preference from the profile, and
asked for the request a user would have made, as a structured reply (``{"request": ...}``,
:func:`~.replies.request_model`; a reply that is not one is read as free text by
:func:`clean_query`); a request that names one of the world's operations as code
(:func:`operation_pattern`) is a bad query (the prompt asks for the user's words, not function
names). A candidate whose goal holds an item the session created and then altered
(:func:`revises_own_item`: booked, then cancelled) is a detour and dropped before its query is
written, and so is one whose reference passes an empty string (:func:`passes_empty_value`: a blank
probe). Candidates then pass :func:`~.validate.replay`, a
query check, and de-duplication (same reference and checker, or queries whose word sets overlap
by ``jaccard_duplicate``). Every drop is counted by reason; nothing raises on a bad candidate.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from horizonrl.evolve.config import ExploreConfig
from horizonrl.evolve.explore import ExplorationTrace, exploration_task
from horizonrl.evolve.profile import EnvProfile
from horizonrl.evolve.replies import request_model
from horizonrl.evolve.template import template_query
from horizonrl.evolve.validate import call_once, replay
from horizonrl.seeds import derive_seed
from horizonrl.types import Message, Task, ToolCall

#: Why a candidate is dropped before or after replay (beside the replay reasons of .validate).
SYNTHESIS_REASONS = ("detour", "empty_argument", "bad_query", "duplicate", "kind_full")


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


def describe_checker(checker: dict[str, Any]) -> str:
    """The change a derived checker asks for, in words (for the synthesizer's prompt)."""
    lines = []
    for part in checker.get("all", []):
        if "exists" in part:
            fields = ", ".join(f"{c['field']}={c['value']}" for c in part["where"]["all"])
            lines.append(f"- {part['exists']}: an item with {fields}")
        else:
            lines.append(f"- {part['field']} = {part['value']}")
    return "\n".join(lines)


def _call_text(call: dict[str, Any]) -> str:
    args = ", ".join(f"{k}={json.dumps(v)}" for k, v in call.get("arguments", {}).items())
    return f"{call['name']}({args})"


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


@dataclass
class SynthesisReport:
    """What a synthesis run produced and dropped (by reason), and how varied the kept tasks are."""

    sessions: int = 0
    steps: int = 0
    accepted_steps: int = 0
    candidates: int = 0
    kept: int = 0
    dropped: Counter = field(default_factory=Counter)
    operations_explored: int = 0
    operations_in_tasks: int = 0
    by_difficulty: Counter = field(default_factory=Counter)
    mean_embedding_distance: float | None = None
    free_text_queries: int = 0  # synthesizer replies read as free text (no valid structured reply)

    def as_dict(self) -> dict[str, Any]:
        return {
            "sessions": self.sessions,
            "steps": self.steps,
            "accepted_steps": self.accepted_steps,
            "candidates": self.candidates,
            "kept": self.kept,
            "dropped": dict(self.dropped),
            "valid_share": self.kept / self.candidates if self.candidates else 0.0,
            "operations_explored": self.operations_explored,
            "operations_in_tasks": self.operations_in_tasks,
            "by_difficulty": dict(self.by_difficulty),
            "mean_embedding_distance": self.mean_embedding_distance,
            "free_text_queries": self.free_text_queries,
        }


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


def query_prompt(profile: EnvProfile, candidate: Candidate) -> list[Message]:
    steps = "\n".join(f"{i + 1}. {_call_text(c)}" for i, c in enumerate(candidate.reference))
    preference = profile.task_preferences.get(candidate.difficulty, candidate.difficulty)
    return [
        Message(
            role="system",
            content="You write requests that users make to an assistant. The assistant works here: "
            + profile.background,
        ),
        Message(
            role="user",
            content=(
                f"The assistant made these API calls for a user:\n{steps}\n\nAfterwards the world had:\n"
                f"{describe_checker(candidate.checker)}\n\nWrite the user's request that these calls "
                "carried out, in one or two sentences in the user's own words. Name the facts the assistant "
                "needs (cities, dates, names, cabin); no function names. It is a "
                f"{candidate.difficulty} task ({preference}). Reply with one JSON object, "
                '{"request": "<the request>"}.'
            ),
        ),
    ]


_WORD = re.compile(r"[a-z0-9]+")


def clean_query(text: str, max_chars: int) -> str | None:
    """The request in a synthesizer reply, or None when there is none usable."""
    text = text.strip().split("\n\n")[0].strip().strip('"').strip()
    text = re.sub(r"^(request|user|query)\s*:\s*", "", text, flags=re.IGNORECASE).strip().strip('"')
    if len(_WORD.findall(text.lower())) < 3 or len(text) > max_chars:
        return None
    if "<tool_call>" in text or "{" in text:
        return None
    return text


def operation_pattern(operations: list[str]) -> re.Pattern[str]:
    """Matches a request that names one of ``operations`` as code: a name called (``sort(``), or a
    name with an underscore as a word (``add_passenger``); a plain word such as "sort" or "cat" in
    a request is the user's."""
    names = sorted(operations, key=len, reverse=True)
    called = [rf"\b{re.escape(op)}\s*\(" for op in names]
    snake = [rf"\b{re.escape(op)}\b" for op in names if "_" in op]
    return re.compile("|".join(called + snake) or r"(?!)")


def jaccard(a: str, b: str) -> float:
    wa, wb = set(_WORD.findall(a.lower())), set(_WORD.findall(b.lower()))
    return len(wa & wb) / len(wa | wb) if wa | wb else 1.0


class Deduplicator:
    """Remembers the kept tasks and says whether a new one duplicates one of them: the same
    reference and checker, a query whose word set overlaps a kept one's by ``jaccard_threshold``,
    or (with an ``embedder``) a query whose sentence embedding is within ``embedding_threshold``
    cosine similarity of a kept one's."""

    def __init__(
        self, jaccard_threshold: float, embedder: Any = None, embedding_threshold: float | None = None
    ):
        self.jaccard_threshold = jaccard_threshold
        self.embedder = embedder if embedding_threshold is not None else None
        self.embedding_threshold = embedding_threshold
        self.identities: set[str] = set()
        self.queries: list[str] = []
        self.vectors: list[Any] = []

    def duplicates(self, query: str, identity: str) -> tuple[bool, Any]:
        """(is it a duplicate, its embedding or None) — pass the embedding on to :meth:`keep`."""
        if identity in self.identities:
            return True, None
        if any(jaccard(query, kept) >= self.jaccard_threshold for kept in self.queries):
            return True, None
        vector = None
        if self.embedder is not None:
            vector = self.embedder.embed([query])[0]
            if self.vectors:
                similarity = torch.stack(self.vectors) @ vector
                if float(similarity.max()) >= float(self.embedding_threshold or 1.0):
                    return True, vector
        return False, vector

    def keep(self, query: str, identity: str, vector: Any) -> None:
        self.identities.add(identity)
        self.queries.append(query)
        if vector is not None:
            self.vectors.append(vector)

    def mean_embedding_distance(self) -> float | None:
        if len(self.vectors) < 2:
            return None
        from horizonrl.evolve.embed import mean_pairwise_distance

        return mean_pairwise_distance(torch.stack(self.vectors))


async def synthesize(
    synthesizer: Any,
    make_env: Callable[[], Any],
    profile: EnvProfile,
    traces: list[ExplorationTrace],
    config: ExploreConfig,
    seed: int = 0,
    limit: int | None = None,
    embedder: Any = None,
) -> tuple[list[Task], SynthesisReport]:
    """Tasks from ``traces`` (at most ``limit``), validated and de-duplicated, with the report;
    ``embedder`` (:class:`~.embed.QueryEmbedder`) adds the embedding check
    (``config.embedding_duplicate``)."""
    report = SynthesisReport(sessions=len(traces))
    report.steps = sum(len(t.steps) for t in traces)
    report.accepted_steps = sum(len(t.ok_calls()) for t in traces)
    report.operations_explored = len({s.name for t in traces for s in t.steps if s.ok})
    candidates = [c for t in traces for c in await candidates_from_trace(make_env, t, config.focused)]
    candidates = [c for c in candidates if c.difficulty in config.preferences]
    report.candidates = len(candidates)
    detours = sum(c.detour for c in candidates)
    if detours:  # dropped before a query is written for them
        report.dropped["detour"] = detours
    candidates = [c for c in candidates if not c.detour]
    blank = sum(passes_empty_value(c.reference) for c in candidates)
    if blank:
        report.dropped["empty_argument"] = blank
    candidates = [c for c in candidates if not passes_empty_value(c.reference)]
    slots = asyncio.Semaphore(config.concurrency)

    probe = make_env()
    keys = {name: next(iter(kind)) for name, kind in probe.state_schema.items() if isinstance(kind, dict)}

    # at most two characters per token of the reply's budget, so that a reply held to the schema
    # ends within max_tokens (a request full of dates and numbers takes about one token a character)
    reply_model = request_model(min(config.max_query_chars, 2 * config.max_tokens))
    names_an_operation = operation_pattern(profile.operations())

    def role_query(text: str) -> str | None:
        query = clean_query(text, config.max_query_chars)
        if query is None or names_an_operation.search(query):  # the prompt asks for no names
            return None
        return query

    async def write(i: int, candidate: Candidate) -> str | None:
        """The candidate's request, or None when the reply holds none usable."""
        if config.synthesizer == "template":
            action = candidate.reference[-1]["name"] if config.focused else None
            rng = random.Random(derive_seed(seed, "template", i))
            return clean_query(template_query(candidate.checker, rng, keys, action), config.max_query_chars)
        async with slots:
            reply = await synthesizer.structured(
                query_prompt(profile, candidate),
                reply_model,
                temperature=config.synth_temperature,
                max_tokens=config.max_tokens,
                seed=derive_seed(seed, "synthesize", i) % 2**31,
            )
        if reply.value is not None:
            return role_query(reply.value.request)
        report.free_text_queries += 1
        return role_query(reply.text)

    queries = await asyncio.gather(*(write(i, c) for i, c in enumerate(candidates)))
    kept: list[Task] = []
    dedup = Deduplicator(config.jaccard_duplicate, embedder, config.embedding_duplicate)
    kinds: Counter = Counter()  # kept tasks per operation sequence (explore.max_per_signature)
    for i, (candidate, query) in enumerate(zip(candidates, queries, strict=True)):
        if limit is not None and len(kept) >= limit:
            break
        if query is None:
            report.dropped["bad_query"] += 1
            continue
        signature = tuple(c["name"] for c in candidate.reference)
        if config.max_per_signature is not None and kinds[signature] >= config.max_per_signature:
            report.dropped["kind_full"] += 1
            continue
        identity = json.dumps([candidate.reference, candidate.checker, candidate.world_seed], sort_keys=True)
        duplicate, vector = dedup.duplicates(query, identity)
        if duplicate:
            report.dropped["duplicate"] += 1
            continue
        task = Task(
            id=f"{profile.name}-synth-{seed}-{i:05d}",
            env=profile.name,
            split="train",
            data={
                "query": query,
                "reference_solution": candidate.reference,
                "checker": candidate.checker,
                "world_seed": candidate.world_seed,
                "difficulty": candidate.difficulty,
                "source": candidate.trace_id,
            },
        )
        verdict = await replay(make_env, task)
        if not verdict.valid:
            report.dropped[verdict.reason or "invalid"] += 1
            continue
        dedup.keep(query, identity, vector)
        kinds[signature] += 1
        kept.append(task)
        report.by_difficulty[candidate.difficulty] += 1
    report.kept = len(kept)
    report.mean_embedding_distance = dedup.mean_embedding_distance()
    report.operations_in_tasks = len({c["name"] for t in kept for c in t.data["reference_solution"]})
    return kept, report
