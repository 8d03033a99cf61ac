"""The outer loop of a stream: reward weights fitted to feedback, as pure functions.

Ratings become preference pairs (every thumbs-up against every thumbs-down in the window; a held-out
preference set gives pairs directly). With signals ``s`` and weights ``w``, a pair ``a ≻ b`` has
likelihood ``σ(w · (s_a − s_b))`` (Bradley–Terry). One update is a projected gradient step on the
mean log-likelihood with a pull back to the starting weights ``w0``:

    w ← Π( w + η · [ mean_pairs (1 − σ(w·d)) d  −  λ (w − w0) ] ),   d = s_a − s_b

and ``Π`` keeps the anchor signal's weight (success by default) at or above its floor and every
other weight within ``[−max_abs, max_abs]``. The anchor's floor is what keeps feedback from
collapsing the grounded objective: it can add preferences beside the task, never remove the task.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Vector = list[float]
Pair = tuple[Vector, Vector]  # (preferred, rejected) signal vectors


def sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def rating_pairs(ratings: Sequence[tuple[Vector, str]]) -> list[Pair]:
    """Every "up"-rated vector against every "down"-rated one."""
    ups = [v for v, label in ratings if label == "up"]
    downs = [v for v, label in ratings if label == "down"]
    return [(u, d) for u in ups for d in downs]


def pair_gradient(weights: Vector, pairs: Sequence[Pair]) -> Vector:
    """The gradient of the pairs' mean Bradley–Terry log-likelihood at ``weights``."""
    grad = [0.0] * len(weights)
    if not pairs:
        return grad
    for preferred, rejected in pairs:
        d = [a - b for a, b in zip(preferred, rejected, strict=True)]
        scale = 1.0 - sigmoid(sum(w * x for w, x in zip(weights, d, strict=True)))
        for i, x in enumerate(d):
            grad[i] += scale * x
    return [g / len(pairs) for g in grad]


def project(weights: Vector, anchor: int, anchor_min: float, max_abs: float) -> Vector:
    """Clamp the anchor's weight to ``[anchor_min, max(anchor_min, max_abs)]`` and the others to
    ``[-max_abs, max_abs]``."""
    out = []
    for i, w in enumerate(weights):
        low, high = (anchor_min, max(anchor_min, max_abs)) if i == anchor else (-max_abs, max_abs)
        out.append(min(max(w, low), high))
    return out


def update_weights(
    weights: Vector,
    initial: Vector,
    pairs: Sequence[Pair],
    *,
    learning_rate: float,
    prior: float,
    anchor: int,
    anchor_min: float,
    max_abs: float,
) -> Vector:
    """One outer step (module doc). The stream takes one whenever new feedback has arrived."""
    grad = pair_gradient(weights, pairs)
    stepped = [
        w + learning_rate * (g - prior * (w - w0)) for w, g, w0 in zip(weights, grad, initial, strict=True)
    ]
    return project(stepped, anchor, anchor_min, max_abs)


def pair_agreement(weights: Vector, pairs: Sequence[Pair]) -> float | None:
    """The share of pairs whose preferred side scores higher under ``weights`` (None without pairs)."""
    if not pairs:
        return None
    right = sum(sum(w * (a - b) for w, a, b in zip(weights, p, r, strict=True)) > 0 for p, r in pairs)
    return right / len(pairs)
