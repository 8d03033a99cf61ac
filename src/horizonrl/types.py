"""Core data types: messages, tools, tasks, env step results and the trajectory record.

Everything that crosses a module boundary is one of these pydantic models. The trajectory record
(schema version 1) is the contract between rollouts and trainers; see docs/trajectories.md.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_serializer, model_validator

from horizonrl.errors import DataError, iter_user_lines

SCHEMA_VERSION = 1

M = TypeVar("M", bound=BaseModel)

Role = Literal["system", "user", "assistant", "tool"]
FinishReason = Literal["finished", "turn_budget", "loop", "context_overflow", "malformed", "error", "timeout"]
FINISH_REASONS: tuple[str, ...] = FinishReason.__args__  # type: ignore[attr-defined]


class ToolCall(BaseModel):
    """One function call requested by the model.

    Serialized in OpenAI chat format: ``{"id", "type": "function", "function": {"name", "arguments"}}``
    where ``arguments`` is a JSON string. Both that shape and the flat ``{"id", "name", "arguments"}``
    shape are accepted on input.
    """

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _from_openai(cls, data: Any) -> Any:
        if isinstance(data, dict) and "function" in data:
            fn = data["function"]
            args = fn.get("arguments", {})
            if isinstance(args, str):
                args = json.loads(args) if args.strip() else {}
            return {"id": data.get("id", ""), "name": fn["name"], "arguments": args}
        return data

    @model_serializer
    def _to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)},
        }


class Message(BaseModel):
    """A chat message in OpenAI format.

    For assistant messages ``content`` is the model's raw text (tool-call markup included), so
    re-rendering the conversation reproduces what the model wrote; ``tool_calls`` holds the parsed calls.
    """

    model_config = ConfigDict(extra="forbid")

    role: Role
    content: str = ""
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The OpenAI-format dict, without null fields."""
        return self.model_dump(exclude_none=True)


class ToolSpec(BaseModel):
    """A function tool in OpenAI ``tools`` format: name, description and a JSON schema of its arguments."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})

    def to_openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


def with_system_note(messages: list[Message], note: str) -> list[Message]:
    """``messages`` with ``note`` appended to the system message (the first one, when it is a system
    message; otherwise, or with an empty note, the messages as they are)."""
    if not note or not messages or messages[0].role != "system":
        return list(messages)
    return [messages[0].model_copy(update={"content": messages[0].content + note}), *messages[1:]]


class Task(BaseModel):
    """One problem instance. ``data`` is env-specific (e.g. the question and the expected answer)."""

    model_config = ConfigDict(extra="forbid")

    id: str
    env: str
    split: str = "train"
    data: dict[str, Any] = Field(default_factory=dict)


class Action(BaseModel):
    """What the model did in one turn: its raw text and the tool calls parsed from it."""

    text: str
    tool_calls: list[ToolCall] = Field(default_factory=list)


class StepResult(BaseModel):
    """The environment's answer to an action."""

    observations: list[Message] = Field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = Field(default_factory=dict)
    #: For an env whose action is the model's whole reply (``Env.text_actions``): why the env's own
    #: parser could not read this turn's reply (None: it could). The agent loop counts such turns as
    #: malformed, and ``agent.max_malformed`` of them in a row end the episode ``malformed``.
    malformed: str | None = None


class Timings(BaseModel):
    init_s: float = 0.0
    run_s: float = 0.0
    eval_s: float = 0.0


class ConstrainedSpan(BaseModel):
    """Response tokens ``[start, end)`` sampled under a constraint (one model turn): ``constraint``
    indexes the record's ``constraints`` (the constraint's fields, as
    :class:`horizonrl.engine.constraints.Constraint` dumps them). The trainer replays it over these
    tokens to rebuild the masks they were sampled under."""

    model_config = ConfigDict(extra="forbid")

    start: int = Field(ge=0)
    end: int = Field(ge=0)
    constraint: int = Field(ge=0)


class Trajectory(BaseModel):
    """The trajectory record (schema version 1), one JSONL line per trajectory.

    ``prompt_ids + response_ids`` is exactly the token sequence the model saw and produced;
    ``loss_mask`` is 1 exactly on model-generated tokens and ``logprobs`` holds their sampling
    log-probabilities (0.0 on environment tokens).
    """

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    id: str
    task_id: str
    group_id: str
    env: str
    messages: list[Message]
    prompt_ids: list[int]
    response_ids: list[int] = Field(default_factory=list)
    loss_mask: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    reward: float = 0.0
    turn_rewards: list[float] = Field(default_factory=list)
    num_turns: int = 0
    finish: FinishReason
    error: str | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    timings: Timings = Field(default_factory=Timings)
    #: multi-agent episodes: the episode this trajectory is one role's part of, and that role
    #: (both absent from single-agent records)
    episode_id: str | None = None
    role: str | None = None
    #: constrained decoding: the turns sampled under a constraint, and the distinct constraints
    #: (both absent from records without one)
    constrained: list[ConstrainedSpan] | None = None
    constraints: list[dict[str, Any]] | None = None

    @model_validator(mode="after")
    def _check_alignment(self) -> Trajectory:
        n = len(self.response_ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise ValueError(
                f"trajectory {self.id!r}: response_ids, loss_mask and logprobs must have equal lengths "
                f"(got {n}, {len(self.loss_mask)}, {len(self.logprobs)})"
            )
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError(f"trajectory {self.id!r}: loss_mask may only hold 0 and 1")
        if self.schema_version != SCHEMA_VERSION:
            raise ValueError(
                f"trajectory {self.id!r}: schema_version {self.schema_version} is not supported "
                f"(this HorizonRL reads version {SCHEMA_VERSION})"
            )
        if not math.isfinite(self.reward):
            raise ValueError(f"trajectory {self.id!r}: reward is {self.reward}, expected a finite number")
        for span in self.constrained or []:
            if not (span.start < span.end <= n) or span.constraint >= len(self.constraints or []):
                raise ValueError(
                    f"trajectory {self.id!r}: constrained span {span.start}..{span.end} (constraint "
                    f"{span.constraint}) lies outside the response or the record's constraints"
                )
            if not all(self.loss_mask[span.start : span.end]):
                raise ValueError(f"trajectory {self.id!r}: a constrained span covers environment tokens")
        return self

    @property
    def success(self) -> bool:
        """A trajectory succeeds when the agent finished and solved the task: the env's own verdict
        ``metrics["success"] > 0`` where it gives one (envs whose reward is shaped, so a positive
        reward need not mean solved), otherwise a positive reward."""
        if self.finish != "finished":
            return False
        verdict = self.metrics.get("success")
        return verdict > 0 if verdict is not None else self.reward > 0

    def to_json(self) -> str:
        record = self.model_dump(exclude_none=False)
        for key in _OPTIONAL_KEYS:  # a record keeps the schema's fields, no nulls for the optional ones
            if record[key] is None:
                del record[key]
        return json.dumps(record, ensure_ascii=False)


_OPTIONAL_KEYS = ("episode_id", "role", "constrained", "constraints")


def write_trajectories(path: str | Path, trajectories: Iterable[Trajectory], append: bool = False) -> int:
    """Write trajectories as JSONL, one per line, flushing each so a crash loses at most one line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("a" if append else "w", encoding="utf-8") as f:
        for traj in trajectories:
            f.write(traj.to_json() + "\n")
            f.flush()
            count += 1
    return count


def iter_jsonl_models(path: str | Path, model: type[M], what: str) -> Iterator[M]:
    """Yield one validated model per non-empty line; a bad line raises DataError naming file:line."""
    path = Path(path)
    for lineno, line in iter_user_lines(path, f"{what} file"):
        if not line.strip():
            continue
        try:
            yield model.model_validate_json(line)
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first["loc"]) or "(line)"
            raise DataError(f"{path}:{lineno}: not a valid {what} record: {loc}: {first['msg']}") from None


def read_trajectories(path: str | Path) -> list[Trajectory]:
    """Read a trajectory JSONL file; a bad line raises DataError naming file:line and the field."""
    return list(iter_jsonl_models(path, Trajectory, "trajectory"))


def read_tasks(path: str | Path) -> list[Task]:
    """Read a task JSONL file (one Task per line); a bad line raises DataError naming file:line."""
    return list(iter_jsonl_models(path, Task, "task"))
