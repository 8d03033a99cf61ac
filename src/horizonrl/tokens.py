"""Small pure functions over token id sequences, shared by the engine and the trainer."""

from __future__ import annotations

from collections.abc import Sequence


def common_prefix_len(seqs: Sequence[Sequence[int]], limit: int | None = None) -> int:
    """Length of the longest prefix all ``seqs`` share, at most ``limit`` (0 for no sequences)."""
    if not seqs:
        return 0
    first = seqs[0]
    n = min(len(s) for s in seqs)
    if limit is not None:
        n = min(n, limit)
    for i in range(max(n, 0)):
        token = first[i]
        if any(s[i] != token for s in seqs[1:]):
            return i
    return max(n, 0)
