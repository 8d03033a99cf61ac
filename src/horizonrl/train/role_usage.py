"""What the LLM roles a training run asks (the extractor, the judge, the annotator) have spent: their
tokens, and for a role asked for structured replies the replies that gave no valid object."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class RoleUsage:
    """Counts the roles' usage into a run's totals (kept in its state across a resume)."""

    def __init__(self, roles: Mapping[str, Any]) -> None:
        """``roles``: name -> client (a client without ``usage`` is not counted)."""
        self.roles = dict(roles)
        self._counted: dict[str, dict[str, int]] = {}

    def count(self, totals: dict[str, dict[str, int]]) -> dict[str, float]:
        """Add what the roles spent since the last count to ``totals``; the totals as metrics
        (``roles/NAME_tokens``: prompt and completion tokens so far; for a role asked for structured
        replies, ``roles/NAME_unusable``: replies so far that gave no valid object)."""
        for name, client in self.roles.items():
            usage = client.usage.as_dict() if getattr(client, "usage", None) is not None else None
            if usage is None:  # a client that does not count
                continue
            counted = self._counted.get(name, {})
            total = totals.setdefault(name, {})
            for key, value in usage.items():
                total[key] = total.get(key, 0) + value - counted.get(key, 0)
            self._counted[name] = usage
        metrics = {
            f"roles/{name}_tokens": float(t.get("prompt_tokens", 0) + t.get("completion_tokens", 0))
            for name, t in totals.items()
        }
        for name, t in totals.items():
            if t.get("structured"):
                metrics[f"roles/{name}_unusable"] = float(t.get("unusable", 0))
        return metrics
