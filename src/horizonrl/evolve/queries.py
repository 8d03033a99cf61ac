"""The query of a synthesized task: the synthesizer's prompt, the request read from its reply,
and de-duplication of the kept requests (:class:`Deduplicator`)."""

from __future__ import annotations

import json
import re
from typing import Any

import torch

from horizonrl.evolve.candidates import Candidate
from horizonrl.evolve.profile import EnvProfile
from horizonrl.types import Message


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
