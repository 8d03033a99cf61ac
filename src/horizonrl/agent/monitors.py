"""Detectors for the known failure modes of agent episodes.

Each detector is small and pure so the turn loop reads as a list of checks:

- ``loop``: the same action (same tool calls with the same arguments) ``window`` turns in a row;
- ``malformed``: ``limit`` turns in a row without a readable tool call;
- ``context_overflow``: the running sequence would exceed the token budget;
- ``turn_budget``: no ``finish`` within the turn budget (checked by the loop itself).
"""

from __future__ import annotations

import json
from collections import deque

from horizonrl.types import ToolCall


def action_signature(calls: list[ToolCall]) -> str:
    """A canonical string for a turn's tool calls: equal signatures mean the same action."""
    return json.dumps([[c.name, c.arguments] for c in calls], sort_keys=True, default=str)


class RepeatDetector:
    """Flags the ``window``-th identical action in a row."""

    def __init__(self, window: int = 3) -> None:
        if window < 2:
            raise ValueError(f"loop window must be at least 2, got {window}")
        self.window = window
        self._recent: deque[str] = deque(maxlen=window)

    def is_loop(self, signature: str) -> bool:
        """Record this turn's action; True when it completes ``window`` identical ones in a row."""
        self._recent.append(signature)
        return len(self._recent) == self.window and len(set(self._recent)) == 1


class StreakCounter:
    """Counts consecutive bad turns (e.g. malformed calls); a good turn resets it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.streak = 0
        self.total = 0

    def record(self, bad: bool) -> bool:
        """Record one turn; True when the streak of bad turns reaches the limit."""
        if bad:
            self.streak += 1
            self.total += 1
        else:
            self.streak = 0
        return bad and self.streak >= self.limit


def remaining_budget(used: int, budget: int) -> int:
    """Tokens left in the episode's budget (never negative)."""
    return max(0, budget - used)
