"""The estimators of horizonrl.stats against brute force: pass@k, best@k and maj@k as expectations over
k-subsets of the n samples, the shared-draw bootstrap of many columns, and the majority vote."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from horizonrl.stats import (
    MAJ_SUBSETS,
    best_at_k,
    bootstrap,
    bootstrap_means,
    maj_at_k,
    majority_vote,
    mean_over_runs,
    pass_at_k,
    rate_over_tasks,
    wilson,
)


def _subset_mean(n: int, k: int, value) -> float:
    subsets = list(itertools.combinations(range(n), k))
    return sum(value(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n,c", [(1, 0), (1, 1), (4, 1), (8, 3), (8, 8), (10, 0)])
def test_pass_at_k_is_the_chance_that_a_k_subset_holds_a_pass(n, c):
    passed = [i < c for i in range(n)]
    for k in range(1, n + 1):
        expected = _subset_mean(n, k, lambda s: float(any(passed[i] for i in s)))
        assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_best_at_k_is_the_expected_best_reward_of_a_k_subset():
    rng = random.Random(1)
    for n in (1, 3, 8):
        rewards = [round(rng.uniform(-1, 2), 3) for _ in range(n)]
        for k in range(1, n + 1):
            expected = _subset_mean(n, k, lambda s, r=rewards: max(r[i] for i in s))
            assert best_at_k(rewards, k) == pytest.approx(expected)
    assert best_at_k([0.0, 1.0, 0.5], 1) == pytest.approx(0.5)  # best@1 is the mean reward
    assert best_at_k([0.0, 1.0, 0.5], 3) == 1.0  # best@n is the best reward
    with pytest.raises(ValueError, match="1 <= k <= n"):
        best_at_k([1.0, 2.0], 3)


def test_majority_vote_counts_stated_answers_and_breaks_ties_by_order():
    assert majority_vote(["7", None, "12", "7"]) == "7"
    assert majority_vote(["12", "7"]) == "12"  # a tie: the first stated
    assert majority_vote([None, None]) is None


def test_maj_at_k_votes_over_k_subsets_and_takes_the_voted_answers_verdict():
    answers = ["7", "7", "12", None, "7"]
    right = [True, True, False, False, True]
    assert maj_at_k(answers, right, 5) == 1.0  # 7 wins the vote of all
    assert maj_at_k(answers, right, 1) == pytest.approx(sum(right) / 5)  # maj@1 is pass@1

    def vote(s):
        voted = majority_vote([answers[i] for i in s])
        return float(voted is not None and right[next(i for i in s if answers[i] == voted)])

    for k in range(1, 6):
        assert maj_at_k(answers, right, k) == pytest.approx(_subset_mean(5, k, vote))
    # wrong answers that agree beat a right one that stands alone
    assert maj_at_k(["12", "12", "7"], [False, False, True], 3) == 0.0
    assert maj_at_k([None, None], [False, False], 2) == 0.0


def test_maj_at_k_draws_subsets_when_there_are_too_many_to_list():
    n = 24
    assert math.comb(n, 12) > MAJ_SUBSETS
    answers = ["7" if i % 3 else "12" for i in range(n)]  # 7 twice as often
    right = [a == "7" for a in answers]
    once = maj_at_k(answers, right, 12, seed=3)
    assert once == maj_at_k(answers, right, 12, seed=3)  # seeded: reproducible
    assert 0.9 < once <= 1.0


def test_bootstrap_means_matches_the_mean_and_uses_one_draw_for_every_column():
    rng = random.Random(0)
    a = [float(rng.random() < 0.4) for _ in range(60)]
    figures = bootstrap_means({"a": a, "same": list(a), "twice": [2 * x for x in a]}, seed=5)
    assert figures["a"].value == pytest.approx(sum(a) / 60) and figures["a"].method == "bootstrap"
    assert figures["a"].low < figures["a"].value < figures["a"].high
    assert (figures["same"].low, figures["same"].high) == (figures["a"].low, figures["a"].high)
    assert figures["twice"].high == pytest.approx(2 * figures["a"].high)
    single = bootstrap(a, seed=5)  # the same kind of interval as the one-column bootstrap
    assert abs(single.low - figures["a"].low) < 0.08 and abs(single.high - figures["a"].high) < 0.08
    with pytest.raises(ValueError, match="same tasks"):
        bootstrap_means({"a": [1.0], "b": [1.0, 0.0]})


def test_rate_over_tasks_is_wilson_for_one_sample_and_a_bootstrap_for_more() -> None:
    one = rate_over_tasks([[1.0]] * 30 + [[0.0]] * 70)
    assert one == wilson(30, 100) and one.method == "wilson"
    assert one.low < 0.3 < one.high and one.high - one.low > 0.15  # +-9 points at n = 100
    many = rate_over_tasks([[1.0, 0.0, 1.0, 1.0]] * 10 + [[0.0] * 4] * 10)
    assert many.method == "bootstrap" and many.value == pytest.approx(0.375)
    assert many.low < 0.375 < many.high
    with pytest.raises(ValueError):
        rate_over_tasks([[1.0], []])


def test_mean_over_runs_uses_the_t_quantile() -> None:
    est = mean_over_runs([0.30, 0.40, 0.35])
    assert est.method == "t" and est.value == pytest.approx(0.35)
    # sd 0.05, n 3: half-width 4.303 * 0.05 / sqrt(3)
    assert est.high - est.value == pytest.approx(4.303 * 0.05 / 3**0.5)
    with pytest.raises(ValueError):
        mean_over_runs([0.3])


@pytest.mark.parametrize("n", [1, 3, 100, 10_000])
def test_wilson_holds_the_rate_at_zero_and_one(n):
    none, every = wilson(0, n), wilson(n, n)
    assert none.low == 0.0 < none.high and every.low < every.high == 1.0
