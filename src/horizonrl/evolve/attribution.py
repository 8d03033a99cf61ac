"""Step attribution (AgentEvolver's self-attributing): a judge labels each step of a finished
trajectory GOOD or BAD, and :func:`horizonrl.algos.advantages.adca` turns the labels into per-step
advantages.

The judge is the ``judge`` role (the roles config; the policy itself by default). It reads the
task, the numbered steps — the agent's action and what came back, each cut to a bound — and the
outcome, and answers one label per step. For a failed outcome a step is GOOD only if it fixed or
mitigated an error.

The reply is structured (:meth:`RoleClient.structured`): a JSON object with one key per step, ``"1"``
to ``"N"``, each ``"GOOD"`` or ``"BAD"`` (:func:`labels_model`, built per step count, so a valid
reply labels every step exactly once). On the policy and local backends the engine holds the reply
to that schema, on openai it is sent as ``response_format``. A reply that is not a valid object (an
endpoint with ``structured: parse``, a reply cut off by ``max_tokens``) is read tolerantly by
:func:`parse_labels` (``Step 2: BAD``, ``2. GOOD``, a JSON list or object, a cut-off object); a step
it does not label — an empty reply, prose, fewer labels than steps — is GOOD by default and counted
(``defaulted``), never raised. Verdicts are cached by the content they were asked about, and the
cache is part of a checkpoint (:meth:`StepJudge.state_dict`).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from horizonrl.types import Message, Trajectory

ACTION_CHARS = 600
OBSERVATION_CHARS = 600

JUDGE_SYSTEM = (
    "You review an AI agent's work step by step. For every step, decide whether it was GOOD (it moved "
    "the task toward success) or BAD (it was wrong, useless or harmful). When the task failed, a step "
    "is GOOD only if it fixed or mitigated an error; otherwise it is BAD."
)


@dataclass(frozen=True)
class Step:
    """One step: the agent's action and the observation it got back."""

    action: str
    observation: str


def trajectory_steps(trajectory: Trajectory) -> list[Step]:
    """The steps of a trajectory: each assistant message, with the messages up to the next one."""
    steps: list[Step] = []
    action: str | None = None
    seen: list[str] = []
    for message in trajectory.messages:
        if message.role == "assistant":
            if action is not None:
                steps.append(Step(action, "\n".join(seen)))
            action, seen = message.content, []
        elif action is not None:
            seen.append(message.content)
    if action is not None:
        steps.append(Step(action, "\n".join(seen)))
    return steps


def first_request(trajectory: Trajectory) -> str:
    """The user's request that opened a trajectory (its first user message; empty when none)."""
    return next((m.content for m in trajectory.messages if m.role == "user"), "")


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 15] + " …[cut]… " + text[-6:]


def judge_prompt(task: str, steps: list[Step], success: bool) -> list[Message]:
    numbered = "\n\n".join(
        f"Step {i + 1}\nAction: {_cut(s.action, ACTION_CHARS)}\n"
        f"Result: {_cut(s.observation, OBSERVATION_CHARS)}"
        for i, s in enumerate(steps)
    )
    outcome = "SUCCESS" if success else "FAILURE"
    n = len(steps)
    keys = [str(i) for i in range(1, n + 1)] if n <= 3 else ["1", "2", "...", str(n)]
    shape = ", ".join(k if k == "..." else f'"{k}": "GOOD" or "BAD"' for k in keys)
    return [
        Message(role="system", content=JUDGE_SYSTEM),
        Message(
            role="user",
            content=f"Task: {task}\n\n{numbered}\n\nOutcome: {outcome}\n\nAnswer with a JSON object that "
            f"labels every step from 1 to {n}: {{{shape}}}",
        ),
    ]


Label = Literal["GOOD", "BAD"]


@lru_cache(maxsize=64)
def labels_model(num_steps: int) -> type[BaseModel]:
    """The judge's reply for ``num_steps`` steps: an object with exactly the keys ``"1"`` to
    ``"num_steps"``, each ``"GOOD"`` or ``"BAD"`` (read back by :func:`structured_labels`)."""
    fields: dict[str, Any] = {f"step_{i}": (Label, Field(alias=str(i))) for i in range(1, num_steps + 1)}
    return create_model(f"StepLabels{num_steps}", __config__=ConfigDict(extra="forbid"), **fields)


def structured_labels(value: BaseModel) -> list[bool]:
    """The labels (True: GOOD) of a valid :func:`labels_model` reply, in step order."""
    return [getattr(value, f"step_{i}") == "GOOD" for i in range(1, len(type(value).model_fields) + 1)]


# a numbered label: "Step 2: BAD", "2. good", and the keys of a (possibly cut-off) JSON object
_LINE = re.compile(r"(?:step\s*)?#?\"?(\d+)\"?\s*[:.)\-]\s*\"?\**\s*(good|bad)\b", re.IGNORECASE)
_WORD = re.compile(r"\b(good|bad)\b", re.IGNORECASE)


def parse_labels(reply: str, num_steps: int) -> tuple[list[bool], int]:
    """``(labels, defaulted)``: one label per step (True: GOOD) read from ``reply``, and how many
    steps it did not label (those are GOOD). Numbered labels win; else a JSON list or object; else
    the bare GOOD/BAD words in order when there are exactly ``num_steps`` of them."""
    found: dict[int, bool] = {}
    for number, word in _LINE.findall(reply):
        index = int(number) - 1
        if 0 <= index < num_steps and index not in found:
            found[index] = word.lower() == "good"
    if not found:
        found = _json_labels(reply, num_steps)
    if not found:
        words = _WORD.findall(reply)
        if len(words) == num_steps:
            found = {i: w.lower() == "good" for i, w in enumerate(words)}
    labels = [found.get(i, True) for i in range(num_steps)]
    return labels, num_steps - len(found)


def _json_labels(reply: str, num_steps: int) -> dict[int, bool]:
    match = re.search(r"[\[{].*[\]}]", reply, re.DOTALL)
    if match is None:
        return {}
    try:
        data = json.loads(match.group(0))
    except ValueError:
        return {}
    items: list[tuple[int, Any]]
    if isinstance(data, list):
        items = list(enumerate(data))
    elif isinstance(data, dict):
        items = [(int(k) - 1, v) for k, v in data.items() if str(k).strip().isdigit()]
    else:
        return {}
    return {
        i: str(v).strip().lower() == "good"
        for i, v in items
        if 0 <= i < num_steps and str(v).strip().lower() in ("good", "bad")
    }


@dataclass
class JudgeStats:
    """Trajectories and steps asked about, steps left unlabelled (GOOD by default), verdicts served
    from the cache, and replies that were not a valid structured object (read by
    :func:`parse_labels` instead)."""

    trajectories: int = 0
    steps: int = 0
    defaulted: int = 0
    cached: int = 0
    unstructured: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


@dataclass
class StepJudge:
    """The judge role with a cache of its verdicts keyed by what it was shown."""

    role: Any
    cache: dict[str, list[bool]] = field(default_factory=dict)
    stats: JudgeStats = field(default_factory=JudgeStats)
    max_tokens: int = 256

    async def label(self, task: str, trajectory: Trajectory) -> list[bool]:
        """One GOOD (True) / BAD label per step of ``trajectory``."""
        steps = trajectory_steps(trajectory)
        if not steps:
            return []
        prompt = judge_prompt(task, steps, trajectory.success)
        key = hashlib.sha256(json.dumps([m.model_dump() for m in prompt]).encode()).hexdigest()
        self.stats.trajectories += 1
        self.stats.steps += len(steps)
        if key in self.cache:
            self.stats.cached += 1
            return list(self.cache[key])
        reply = await self.role.structured(
            prompt, labels_model(len(steps)), temperature=0.0, max_tokens=self.max_tokens
        )
        if reply.value is not None:
            labels, defaulted = structured_labels(reply.value), 0
        else:
            labels, defaulted = parse_labels(reply.text, len(steps))
            self.stats.unstructured += 1
        self.stats.defaulted += defaulted
        self.cache[key] = labels
        return labels

    def state_dict(self) -> dict[str, Any]:
        return {"cache": self.cache, "stats": self.stats.as_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cache = {str(k): [bool(x) for x in v] for k, v in state["cache"].items()}
        self.stats = JudgeStats(**state.get("stats", {}))
