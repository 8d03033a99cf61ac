"""Task synthesis from exploration: references from what the explorer did, checkers from what it
changed, queries from the synthesizer role, then validation by replay and de-duplication.

For each exploration trace the calls the world accepted are replayed in a fresh world; every call
that changes the world's state closes a candidate task whose **reference solution** is the calls so
far that it needs (:func:`~.candidates.minimal_reference`: the state changes and the look-ups that
supplied their arguments) and whose **checker** is derived from the change
(:func:`~.candidates.state_change_checker`: the new or changed items of each collection, minus the
fields the world assigns itself such as ids and prices). The world writes the checker, so it is
exact; the model writes only the **query**: the synthesizer role is shown the calls, the change and
a difficulty preference from the profile, and asked for the request a user would have made, as a
structured reply (``{"request": ...}``, :func:`~.replies.request_model`; a reply that is not one is
read as free text by :func:`~.queries.clean_query`); a request that names one of the world's
operations as code (:func:`~.queries.operation_pattern`) is a bad query (the prompt asks for the
user's words, not function names). A candidate whose goal holds an item the session created and then
altered (:func:`~.candidates.revises_own_item`: booked, then cancelled) is a detour and dropped
before its query is written, and so is one whose reference passes an empty string
(:func:`~.candidates.passes_empty_value`: a blank probe). Candidates then pass
:func:`~.validate.replay`, a query check, and de-duplication (same reference and checker, or queries
whose word sets overlap by ``jaccard_duplicate``). Every drop is counted by reason; nothing raises
on a bad candidate.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from horizonrl.evolve.candidates import Candidate, candidates_from_trace, passes_empty_value
from horizonrl.evolve.config import ExploreConfig
from horizonrl.evolve.explore import ExplorationTrace
from horizonrl.evolve.profile import EnvProfile
from horizonrl.evolve.queries import Deduplicator, clean_query, operation_pattern, query_prompt
from horizonrl.evolve.replies import request_model
from horizonrl.evolve.template import template_query
from horizonrl.evolve.validate import replay
from horizonrl.seeds import derive_seed
from horizonrl.types import Task

#: Why a candidate is dropped before or after replay (beside the replay reasons of .validate).
SYNTHESIS_REASONS = ("detour", "empty_argument", "bad_query", "duplicate", "kind_full")


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
