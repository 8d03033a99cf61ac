"""One trajectory line's summary: the few fields the viewer filters and lists by.

A trajectory line is ~10 KB, almost all of it token ids. :func:`summarize_line` parses only the
small head (the fields before ``"messages"``) and tail (the fields after ``"logprobs"``) of a line
written by :meth:`Trajectory.to_json`, and falls back to the full parse (:func:`summarize_full`) for
any line of another shape. A line that is not JSON, or whose fields fail the trajectory schema, is
summarized with its ``parse_error``: listed, never dropped. The body (messages, token arrays) is
checked in full when the line is shown (:func:`check_record`).
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from dataclasses import dataclass, fields
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from horizonrl.types import SCHEMA_VERSION, FinishReason, Trajectory

_HEAD_END = b', "messages": '
_TAIL_START = b'"logprobs": ['
_TAIL_FIRST = b'"reward": '
_STEP_FILE = re.compile(r"^step_(\d+)$")


@dataclass(slots=True)
class LineSummary:
    """What the trajectory table shows and filters by, for one line of one file."""

    file: str
    index: int
    offset: int
    length: int
    step: int | str | None
    id: str | None = None
    task_id: str | None = None
    env: str | None = None
    finish: str | None = None
    reward: float | None = None
    num_turns: int | None = None
    success: bool | None = None
    role: str | None = None
    episode_id: str | None = None
    parse_error: str | None = None
    #: whether the whole line was checked against the schema (done when it is first shown)
    checked: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The fields the API shows (not where the line lies in its file)."""
        return {name: getattr(self, name) for name in _SHOWN}


_SHOWN = tuple(f.name for f in fields(LineSummary) if f.name not in ("offset", "length", "checked"))


class _Fields(BaseModel):
    """The summary fields of a trajectory record, checked as :class:`Trajectory` checks them."""

    model_config = ConfigDict(extra="ignore")

    schema_version: int = SCHEMA_VERSION
    id: str
    task_id: str
    env: str
    reward: float = 0.0
    num_turns: int = 0
    finish: FinishReason
    metrics: dict[str, float] = Field(default_factory=dict)
    episode_id: str | None = None
    role: str | None = None

    @field_validator("schema_version")
    @classmethod
    def _version(cls, v: int) -> int:
        if v != SCHEMA_VERSION:
            raise ValueError(
                f"schema_version {v} is not supported (this HorizonRL reads version {SCHEMA_VERSION})"
            )
        return v

    @field_validator("reward")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError(f"reward is {v}, expected a finite number")
        return v


def step_label(rel_path: str) -> int | str | None:
    """The step a file holds: ``trajectories/step_000012.jsonl`` -> 12; an eval file -> its label
    (``eval/base.jsonl`` -> ``"eval:base"``); other files -> None."""
    parts = rel_path.split("/")
    stem = parts[-1].removesuffix(".jsonl")
    if "eval" in parts[:-1]:
        return f"eval:{stem}"
    match = _STEP_FILE.match(stem)
    return int(match.group(1)) if match else None


def success_of(finish: str, reward: float, metrics: dict[str, float]) -> bool:
    """:attr:`Trajectory.success` on the summary fields."""
    if finish != "finished":
        return False
    verdict = metrics.get("success")
    return verdict > 0 if verdict is not None else reward > 0


def schema_error(exc: ValidationError) -> str:
    first = exc.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "(line)"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"not a valid trajectory record: {loc}: {first['msg']}{more}"


def _fill(summary: LineSummary, fields: _Fields) -> LineSummary:
    summary.id, summary.task_id, summary.env = fields.id, fields.task_id, fields.env
    summary.finish, summary.reward, summary.num_turns = fields.finish, fields.reward, fields.num_turns
    summary.role, summary.episode_id = fields.role, fields.episode_id
    summary.success = success_of(fields.finish, fields.reward, fields.metrics)
    return summary


def _salvage(summary: LineSummary, data: Any) -> None:
    """Keep what can be read of a record that fails the schema (its id and task) for the table."""
    if isinstance(data, dict):
        for key in ("id", "task_id", "env", "finish", "role", "episode_id"):
            value = data.get(key)
            if isinstance(value, str):
                setattr(summary, key, value)


def summarize_full(raw: bytes, summary: LineSummary) -> LineSummary:
    """Fill ``summary`` from the whole line: JSON and the full trajectory schema."""
    summary.checked = True
    try:
        data = json.loads(raw)
    except ValueError as exc:
        summary.parse_error = f"not JSON: {exc}"
        return summary
    if not isinstance(data, dict):
        summary.parse_error = f"not a JSON object but {type(data).__name__}"
        return summary
    try:
        traj = Trajectory.model_validate(data)
    except ValidationError as exc:
        summary.parse_error = schema_error(exc)
        _salvage(summary, data)
        return summary
    summary.id, summary.task_id, summary.env = traj.id, traj.task_id, traj.env
    summary.finish, summary.reward, summary.num_turns = traj.finish, traj.reward, traj.num_turns
    summary.role, summary.episode_id, summary.success = traj.role, traj.episode_id, traj.success
    return summary


def summarize_line(raw: bytes, summary: LineSummary) -> LineSummary:
    """Fill ``summary`` from the head and tail of the line (the shape ``Trajectory.to_json``
    writes), or from the full parse when the line has another shape or does not parse that way."""
    head_end = raw.find(_HEAD_END)
    tail_at = raw.find(_TAIL_START, head_end) if head_end > 0 else -1
    tail_start = raw.find(b"]", tail_at) + 3 if tail_at > 0 else 0  # past '], '
    if tail_start < 3 or not raw.startswith(_TAIL_FIRST, tail_start):
        return summarize_full(raw, summary)
    try:
        return _fill(summary, _Fields.model_validate_json(raw[:head_end] + b", " + raw[tail_start:]))
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            return summarize_full(raw, summary)  # names where the line breaks
        summary.parse_error = schema_error(exc)
        with contextlib.suppress(ValueError):
            _salvage(summary, json.loads(raw[:head_end] + b"}"))
        return summary


def check_record(raw: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """The record of a line checked against the full trajectory schema: ``(record, None)``, or
    ``(record or None, error)`` for a line that is not JSON or fails the schema."""
    try:
        data = json.loads(raw)
    except ValueError as exc:
        return None, f"not JSON: {exc}"
    if not isinstance(data, dict):
        return None, f"not a JSON object but {type(data).__name__}"
    try:
        Trajectory.model_validate(data)
    except ValidationError as exc:
        return data, schema_error(exc)
    return data, None
