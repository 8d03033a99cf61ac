"""Feedback on trajectories: a user's thumbs up/down, kept as one JSONL file in the run directory.

The viewer's HTTP API (``POST /api/runs/{run}/feedback``) appends to ``RUN_DIR/feedback.jsonl``; a
running stream reads the lines added since it last looked. The file is the contract between the two
processes: appends are single ``write`` calls of one whole line (``O_APPEND``), so readers only ever
see complete lines or none, and a reader only consumes text up to the last newline.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from horizonrl.io import read_appended_lines

FEEDBACK_FILE = "feedback.jsonl"

Label = Literal["up", "down"]


class Feedback(BaseModel):
    """One rating: ``label`` ("up" or "down") of the trajectory with id ``trajectory_id``."""

    model_config = ConfigDict(extra="forbid")

    trajectory_id: str = Field(min_length=1)
    label: Label
    time: float = Field(default_factory=time.time)
    source: str = "user"


def feedback_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / FEEDBACK_FILE


def append_feedback(run_dir: str | Path, feedback: Feedback) -> None:
    """Append one rating to ``run_dir/feedback.jsonl`` as one atomic, durable line."""
    line = (feedback.model_dump_json() + "\n").encode("utf-8")
    fd = os.open(feedback_path(run_dir), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


class FeedbackReader:
    """Reads the ratings appended to a run's feedback file since the last call.

    ``offset`` (bytes consumed) is part of a stream's checkpointed state, so a resumed stream does not
    count a rating twice. A line that does not parse is counted in ``bad_lines`` and skipped."""

    def __init__(self, run_dir: str | Path, offset: int = 0) -> None:
        self.path = feedback_path(run_dir)
        self.offset = offset
        self.bad_lines = 0

    def read_new(self) -> list[Feedback]:
        if not self.path.is_file():
            return []
        lines, self.offset = read_appended_lines(self.path, self.offset)
        out: list[Feedback] = []
        for raw in lines:
            if not raw.strip():
                continue
            try:
                out.append(Feedback.model_validate_json(raw))
            except ValidationError:
                self.bad_lines += 1
        return out
