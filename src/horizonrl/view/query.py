"""Filtering and paging the trajectory table: pure functions of line summaries."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from horizonrl.view.summary import LineSummary, step_label

#: the ``finish`` filter value that selects the lines that do not parse
UNPARSED = "unparsed"


@dataclass(frozen=True)
class TrajectoryQuery:
    """The table's filters; None (or "") is "any". ``q`` is a case-insensitive substring of the
    trajectory id, task id or episode id; ``step`` matches the step label as text (``12``,
    ``eval:base``)."""

    file: str | None = None
    finish: str | None = None
    env: str | None = None
    role: str | None = None
    step: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    success: bool | None = None
    q: str | None = None

    def matches(self, s: LineSummary) -> bool:
        if self.file and s.file != self.file:
            return False
        if self.finish:
            if (s.parse_error is not None) != (self.finish == UNPARSED):
                return False
            if self.finish != UNPARSED and s.finish != self.finish:
                return False
        if self.env and s.env != self.env:
            return False
        if self.role and s.role != self.role:
            return False
        if self.step and str(s.step) != self.step:
            return False
        if self.min_reward is not None and (s.reward is None or s.reward < self.min_reward):
            return False
        if self.max_reward is not None and (s.reward is None or s.reward > self.max_reward):
            return False
        if self.success is not None and bool(s.success) != self.success:
            return False
        if self.q:
            needle = self.q.lower()
            if not any(needle in (text or "").lower() for text in (s.id, s.task_id, s.episode_id)):
                return False
        return True


def select(summaries: Sequence[LineSummary], query: TrajectoryQuery) -> Sequence[LineSummary]:
    if query == TrajectoryQuery():
        return summaries
    return [s for s in summaries if query.matches(s)]


def page(rows: Sequence[LineSummary], offset: int, limit: int) -> Sequence[LineSummary]:
    return rows[offset : offset + limit]


def facets(summaries: Sequence[LineSummary]) -> dict[str, list[str]]:
    """The values each dropdown filter can take in this run (most common first)."""
    out: dict[str, list[str]] = {}
    for key in ("env", "role", "finish"):
        counts = Counter(getattr(s, key) for s in summaries if getattr(s, key))
        out[key] = [value for value, _ in counts.most_common()]
    if any(s.parse_error is not None for s in summaries):
        out["finish"].append(UNPARSED)
    return out


def file_rows(summaries: Sequence[LineSummary], files: Iterable[str]) -> list[dict[str, Any]]:
    """Per trajectory file: its step label, lines, and lines that do not parse."""
    lines: Counter[str] = Counter(s.file for s in summaries)
    bad: Counter[str] = Counter(s.file for s in summaries if s.parse_error is not None)
    return [
        {"file": rel, "step": step_label(rel), "lines": lines[rel], "parse_errors": bad[rel]} for rel in files
    ]
