"""Feedback on trajectories: a user's thumbs up/down, kept as one JSONL file in the run directory.

The viewer's HTTP API (``POST /api/runs/{run}/feedback``) appends to ``RUN_DIR/feedback.jsonl``; a
running stream reads the lines added since it last looked. The file is the contract between the two
processes: appends are single ``write`` calls of one whole line (``O_APPEND``), so readers only ever
see complete lines or none, and a reader only consumes text up to the last newline.

Both sides open the file through :func:`horizonrl.run_paths.open_inside`: a ``feedback.jsonl`` that
is a symlink leading out of the run directory is neither appended to nor read.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from horizonrl.run_paths import OutsideRunDir, open_inside

FEEDBACK_FILE = "feedback.jsonl"

Label = Literal["up", "down"]


class Feedback(BaseModel):
    """One rating: ``label`` ("up" or "down") of the trajectory with id ``trajectory_id``, when it
    was received (``time``, the receiver's clock) and who sent it (``source``; over HTTP also the
    client's address and whether it proved the viewer's token)."""

    model_config = ConfigDict(extra="forbid")

    trajectory_id: str = Field(min_length=1)
    label: Label
    time: float = Field(default_factory=time.time)
    source: str = "user"
    #: the sender's address (the feedback API); None for a rating written in the process
    client: str | None = None
    #: whether the sender carried the viewer's token (a viewer started with one)
    authenticated: bool = False


def feedback_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / FEEDBACK_FILE


def append_feedback(run_dir: str | Path, feedback: Feedback) -> None:
    """Append one rating to ``run_dir/feedback.jsonl`` as one atomic, durable line; a feedback file
    that leads out of ``run_dir`` is :class:`~horizonrl.run_paths.OutsideRunDir`."""
    line = (feedback.model_dump_json() + "\n").encode("utf-8")
    with open_inside(run_dir, feedback_path(run_dir), append=True) as f:
        f.write(line)
        os.fsync(f.fileno())


class FeedbackReader:
    """Reads the ratings appended to a run's feedback file since the last call.

    ``offset`` (bytes consumed) is part of a stream's checkpointed state, so a resumed stream does not
    count a rating twice. A line that does not parse is counted in ``bad_lines`` and skipped; a
    feedback file that leads out of the run directory is not read, and ``refused`` says why."""

    def __init__(self, run_dir: str | Path, offset: int = 0) -> None:
        self.run_dir = Path(run_dir)
        self.path = feedback_path(run_dir)
        self.offset = offset
        self.bad_lines = 0
        self.refused: str | None = None

    def _appended(self) -> bytes:
        """The complete lines written after ``offset`` (text after the last newline is a line still
        being written, left for the next read); nothing while the file is missing or refused."""
        try:
            with open_inside(self.run_dir, self.path) as f:
                f.seek(self.offset)
                data = f.read()
        except OutsideRunDir as exc:
            self.refused = str(exc)
            return b""
        except (FileNotFoundError, IsADirectoryError):
            return b""
        self.refused = None
        data = data[: data.rfind(b"\n") + 1]
        self.offset += len(data)
        return data

    def read_new(self) -> list[Feedback]:
        out: list[Feedback] = []
        for raw in self._appended().split(b"\n"):
            if not raw.strip():
                continue
            try:
                out.append(Feedback.model_validate_json(raw))
            except ValidationError:
                self.bad_lines += 1
        return out
