"""Estimates as the field reports them, each with its uncertainty: the unbiased pass@k estimator
(Chen et al. 2021) and its like for the best reward (best@k) and the majority vote (maj@k), Wilson
intervals for rates, percentile bootstrap over tasks for any per-task statistic, and a two-sample test
of whether two arms differ by more than noise.

Everything here is pure Python and deterministic for a given ``seed``.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

#: two-sided 95% normal quantile
Z95 = 1.959963984540054


@dataclass(frozen=True)
class Estimate:
    """A point estimate with a 95% interval ``[low, high]`` and how it was computed (``method``:
    ``wilson``, ``bootstrap``, ``t`` (a Student t interval over runs) or ``exact`` when there is no
    sampling uncertainty to speak of)."""

    value: float
    low: float
    high: float
    n: int
    method: str

    def as_dict(self) -> dict[str, float | int | str]:
        return {"value": self.value, "low": self.low, "high": self.high, "n": self.n, "method": self.method}

    def __str__(self) -> str:
        return f"{100 * self.value:.1f}% [{100 * self.low:.1f}, {100 * self.high:.1f}]"


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from ``n`` samples of which ``c`` passed: 1 - C(n-c, k)/C(n, k),
    computed as a stable product. ``k`` must be in 1..n."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n, got c={c}, n={n}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def wilson(successes: float, n: int, z: float = Z95) -> Estimate:
    """The Wilson score interval of a rate (``successes`` may be fractional: a mean of 0/1 outcomes
    times ``n``)."""
    if n <= 0:
        raise ValueError("a rate needs at least one trial")
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # clamped to hold p: at p = 0 (or 1) the bound is p exactly, not p +- a rounding error
    return Estimate(p, max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half)), n, "wilson")


def bootstrap(
    per_task: Sequence[float],
    statistic: Callable[[Sequence[float]], float] | None = None,
    *,
    resamples: int = 2000,
    seed: int = 0,
) -> Estimate:
    """The percentile bootstrap 95% interval over tasks of ``statistic`` (default: the mean) of the
    per-task values."""
    values = list(per_task)
    if not values:
        raise ValueError("a bootstrap needs at least one task")
    stat = statistic or (lambda xs: sum(xs) / len(xs))
    point = stat(values)
    if len(values) == 1:
        return Estimate(point, point, point, 1, "bootstrap")
    rng = random.Random(seed)
    n = len(values)
    draws = sorted(stat([values[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples))
    low = draws[int(0.025 * (resamples - 1))]
    high = draws[math.ceil(0.975 * (resamples - 1))]
    return Estimate(point, min(low, point), max(high, point), n, "bootstrap")


def rate_over_tasks(outcomes: Sequence[Sequence[float]], *, seed: int = 0) -> Estimate:
    """A success rate over tasks from each task's 0/1 outcomes (one or more samples per task): the
    mean over tasks of each task's mean, with a Wilson interval over tasks when every task has one
    sample or every task fails (or passes) every time, and otherwise the percentile bootstrap over
    tasks (the samples of one task are not independent)."""
    per_task = [list(xs) for xs in outcomes]
    if not per_task or any(not xs for xs in per_task):
        raise ValueError("a rate over tasks needs at least one task and one outcome per task")
    means = [sum(xs) / len(xs) for xs in per_task]
    if all(len(xs) == 1 for xs in per_task) or (len(set(means)) == 1 and means[0] in (0.0, 1.0)):
        # one sample per task, or every task at 0 (or 1), where a bootstrap has no spread to show
        return wilson(sum(means), len(per_task))
    return bootstrap(means, seed=seed)


def mean_over_runs(values: Sequence[float]) -> Estimate:
    """The mean of independent per-run figures (e.g. one recipe's seeds) with a Student t 95%
    interval (``t``); at least two values."""
    xs = list(values)
    if len(xs) < 2:
        raise ValueError("a mean over runs needs at least two values")
    mean = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
    half = _t95(len(xs) - 1) * sd / math.sqrt(len(xs))
    return Estimate(mean, mean - half, mean + half, len(xs), "t")


def bootstrap_means(
    columns: Mapping[str, Sequence[float]], *, resamples: int = 2000, seed: int = 0
) -> dict[str, Estimate]:
    """The percentile bootstrap 95% interval of the mean of each column (one value per task, every
    column over the same tasks), all columns resampled with the same draws of tasks: many metrics of
    one eval at the cost of one bootstrap."""
    lengths = {len(values) for values in columns.values()}
    if len(lengths) > 1:
        raise ValueError(f"bootstrap columns must cover the same tasks, got lengths {sorted(lengths)}")
    n = lengths.pop() if lengths else 0
    if n == 0 and columns:
        raise ValueError("a bootstrap needs at least one task")
    rng = random.Random(seed)
    draws = [[rng.randrange(n) for _ in range(n)] for _ in range(resamples)] if n > 1 else []
    out = {}
    for name, values in columns.items():
        values = list(values)
        point = sum(values) / n
        if n == 1:
            out[name] = Estimate(point, point, point, 1, "bootstrap")
            continue
        means = sorted(sum(values[i] for i in draw) / n for draw in draws)
        low = means[int(0.025 * (resamples - 1))]
        high = means[math.ceil(0.975 * (resamples - 1))]
        out[name] = Estimate(point, min(low, point), max(high, point), n, "bootstrap")
    return out


def best_at_k(rewards: Sequence[float], k: int) -> float:
    """The expected best reward of ``k`` samples drawn without replacement from these ``n`` (the
    unbiased estimator of best@k, as pass@k is of solving: with the rewards sorted ascending,
    ``sum_i r_i * C(i-1, k-1) / C(n, k)``). ``k`` must be in 1..n."""
    n = len(rewards)
    if not 1 <= k <= n:
        raise ValueError(f"best@k needs 1 <= k <= n, got k={k}, n={n}")
    ordered = sorted(rewards)
    total = math.comb(n, k)
    return sum(r * math.comb(i, k - 1) for i, r in enumerate(ordered) if i >= k - 1) / total


def majority_vote(answers: Sequence[str | None]) -> str | None:
    """The most common answer among those stated (ties: the one stated first); None when none is."""
    stated = [a for a in answers if a is not None]
    if not stated:
        return None
    counts = Counter(stated)
    best = max(counts.values())
    return next(a for a in stated if counts[a] == best)


#: maj@k below n averages the vote over k-subsets of the samples: all of them up to this many, else
#: this many drawn at random (seeded)
MAJ_SUBSETS = 1000


def maj_at_k(answers: Sequence[str | None], successes: Sequence[bool], k: int, *, seed: int = 0) -> float:
    """The chance that the majority vote (:func:`majority_vote`) of ``k`` of these ``n`` samples is
    right: the vote's verdict is that of the first of the k samples that gave the voted answer (as
    verl's maj@N; maj@1 is then pass@1), and no stated answer is wrong. ``k = n``: the vote of all;
    below, the mean over k-subsets (sample order kept; every subset when there are at most
    :data:`MAJ_SUBSETS`, else that many drawn with ``seed``)."""
    n = len(answers)
    if len(successes) != n:
        raise ValueError(f"maj@k needs one verdict per answer, got {len(successes)} and {n}")
    if not 1 <= k <= n:
        raise ValueError(f"maj@k needs 1 <= k <= n, got k={k}, n={n}")
    if math.comb(n, k) <= MAJ_SUBSETS:
        subsets: Iterable[Sequence[int]] = itertools.combinations(range(n), k)
    else:
        rng = random.Random(seed)
        subsets = [sorted(rng.sample(range(n), k)) for _ in range(MAJ_SUBSETS)]
    right = total = 0
    for subset in subsets:
        voted = majority_vote([answers[i] for i in subset])
        total += 1
        right += voted is not None and bool(successes[next(i for i in subset if answers[i] == voted)])
    return right / total


@dataclass(frozen=True)
class Difference:
    """``b - a`` with its 95% interval; ``beyond_noise`` when the interval excludes 0."""

    delta: float
    low: float
    high: float
    method: str

    @property
    def beyond_noise(self) -> bool:
        return self.low > 0 or self.high < 0

    def verdict(self) -> str:
        if not self.beyond_noise:
            return "within noise"
        return "better" if self.delta > 0 else "worse"


def paired_difference(
    a: Sequence[float], b: Sequence[float], *, resamples: int = 2000, seed: int = 0
) -> Difference:
    """``mean(b) - mean(a)`` over the same tasks (paired: ``a[i]`` and ``b[i]`` are one task), with a
    bootstrap interval over tasks."""
    if len(a) != len(b) or not a:
        raise ValueError(f"a paired difference needs the same tasks on both sides, got {len(a)} and {len(b)}")
    diffs = [y - x for x, y in zip(a, b, strict=True)]
    est = bootstrap(diffs, resamples=resamples, seed=seed)
    return Difference(est.value, est.low, est.high, "paired bootstrap over tasks")


def unpaired_difference(a: Sequence[float], b: Sequence[float]) -> Difference:
    """``mean(b) - mean(a)`` of two independent samples (e.g. per-seed results), with a Welch normal
    interval (the t quantile for small samples)."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError("an unpaired difference needs at least two values per side")
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    va = sum((x - ma) ** 2 for x in a) / (len(a) - 1)
    vb = sum((x - mb) ** 2 for x in b) / (len(b) - 1)
    se = math.sqrt(va / len(a) + vb / len(b))
    dof = _welch_dof(va, len(a), vb, len(b))
    q = _t95(dof)
    return Difference(mb - ma, mb - ma - q * se, mb - ma + q * se, f"Welch t (dof {dof:.1f})")


def _welch_dof(va: float, na: int, vb: float, nb: int) -> float:
    num = (va / na + vb / nb) ** 2
    den = (va / na) ** 2 / (na - 1) + (vb / nb) ** 2 / (nb - 1)
    return num / den if den > 0 else float(na + nb - 2)


def _t95(dof: float) -> float:
    """The two-sided 95% Student t quantile (table for small dof, normal beyond)."""
    table = {
        1: 12.706,
        2: 4.303,
        3: 3.182,
        4: 2.776,
        5: 2.571,
        6: 2.447,
        7: 2.365,
        8: 2.306,
        9: 2.262,
        10: 2.228,
        12: 2.179,
        15: 2.131,
        20: 2.086,
        30: 2.042,
    }
    if dof >= 30:
        return Z95 if dof > 120 else 2.0
    key = max(k for k in table if k <= max(1, math.floor(dof)))
    return table[key]
