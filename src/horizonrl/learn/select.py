"""Selection: which candidate the next optimization starts from.

- ``best``: the highest training reward (ties: the cheaper, then the older);
- ``pareto``: a candidate drawn uniformly from the Pareto front over (training reward up, cost down),
  so cheap candidates that are almost as good get optimized too.

Pure functions over (reward, cost) points; the caller passes the seeded random generator.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from horizonrl.learn.candidate import Candidate


def dominates(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """(reward, cost) ``a`` dominates ``b``: no worse in both, strictly better in one."""
    return a[0] >= b[0] and a[1] <= b[1] and (a[0] > b[0] or a[1] < b[1])


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point dominates (duplicates of a front point all stay), in
    input order."""
    return [i for i, p in enumerate(points) if not any(dominates(q, p) for q in points)]


def _point(c: Candidate) -> tuple[float, float]:
    return (c.metrics.train_reward, c.metrics.cost_tokens)


def select_best(candidates: Sequence[Candidate]) -> Candidate:
    if not candidates:
        raise ValueError("no candidates to select from")
    return max(
        enumerate(candidates), key=lambda ic: (ic[1].metrics.train_reward, -ic[1].metrics.cost_tokens, -ic[0])
    )[1]


def select_pareto(candidates: Sequence[Candidate], rng: random.Random) -> Candidate:
    if not candidates:
        raise ValueError("no candidates to select from")
    front = pareto_front([_point(c) for c in candidates])
    return candidates[rng.choice(front)]


def select(rule: str, candidates: Sequence[Candidate], rng: random.Random) -> Candidate:
    if rule == "best":
        return select_best(candidates)
    if rule == "pareto":
        return select_pareto(candidates, rng)
    raise ValueError(f"unknown selection {rule!r}; valid: best, pareto")
