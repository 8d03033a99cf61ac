"""The progress callbacks of a training run (the CLI draws them with rich; the default is silent)."""

from __future__ import annotations

from typing import Any


class Reporter:
    """Progress callbacks of a training run (the CLI draws them with rich; the default is silent)."""

    def stage(self, name: str, total: int | None = None) -> None: ...

    def advance(self, **fields: Any) -> None: ...

    def message(self, text: str) -> None: ...

    def status(self, text: str) -> None:
        """A live one-line status (episodes in flight per rollout stage)."""
