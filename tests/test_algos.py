"""Tests of horizonrl.algos against hand computations (plain Python floats and math) on small tensors."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from horizonrl import algos
from horizonrl.algos import advantages, critic, kl, losses

NAN = float("nan")
INF = float("inf")


def _close(actual: torch.Tensor, expected: list, tol: float = 1e-6) -> None:
    """Elementwise ``actual == expected`` within ``tol``; ``expected`` is a (nested) list of floats."""
    want = torch.tensor(expected, dtype=torch.float64)
    assert actual.shape == want.shape
    assert actual.flatten().tolist() == pytest.approx(want.flatten().tolist(), abs=tol)


# --------------------------------------------------------------------------------------------------------
# advantages
# --------------------------------------------------------------------------------------------------------


def test_package_exports_submodules():
    assert algos.__all__ == ["advantages", "critic", "kl", "losses"]
    assert algos.advantages is advantages and algos.kl is kl and algos.losses is losses
    assert algos.critic is critic


def test_grpo_norm_by_std_with_string_ids_and_interleaved_groups():
    rewards = [1.0, 0.0, 2.0, 0.5, 1.0, 0.0]
    ids = ["a", "b", "a", "b", "a", "b"]
    got = advantages.grpo(torch.tensor(rewards, dtype=torch.float64), ids, eps=1e-6)
    # group a = [1, 2, 1]: mean 4/3, sample std sqrt(((-1/3)^2 + (2/3)^2 + (-1/3)^2) / 2) = sqrt(1/3)
    # group b = [0, 0.5, 0]: mean 1/6, sample std sqrt(((1/6)^2 + (1/3)^2 + (1/6)^2) / 2) = sqrt(1/12)
    sa, sb = math.sqrt(1 / 3), math.sqrt(1 / 12)
    assert statistics.stdev([1.0, 2.0, 1.0]) == pytest.approx(sa)
    expected = [
        (1 - 4 / 3) / (sa + 1e-6),
        (0 - 1 / 6) / (sb + 1e-6),
        (2 - 4 / 3) / (sa + 1e-6),
        (0.5 - 1 / 6) / (sb + 1e-6),
        (1 - 4 / 3) / (sa + 1e-6),
        (0 - 1 / 6) / (sb + 1e-6),
    ]
    _close(got, expected, tol=1e-9)
    assert got.dtype == torch.float64


def test_grpo_without_std_is_dr_grpo_mean_centering():
    got = advantages.grpo(torch.tensor([1.0, 0.0, 2.0, 0.5, 1.0, 0.0]), [0, 1, 0, 1, 0, 1], norm_by_std=False)
    _close(got, [1 - 4 / 3, -1 / 6, 2 - 4 / 3, 0.5 - 1 / 6, 1 - 4 / 3, -1 / 6])


def test_grpo_equal_rewards_group_is_exactly_zero_not_nan():
    # 0.1 * 3 / 3 != 0.1 in floating point: a naive (r - mean) / (std + eps) would give ~±1e-2.
    rewards = torch.tensor([0.1, 0.1, 0.1, 1.0, 3.0])
    got = advantages.grpo(rewards, ["p", "p", "p", "q", "q"])
    assert not torch.isnan(got).any()
    assert got[:3].tolist() == [0.0, 0.0, 0.0]
    # group q = [1, 3]: mean 2, sample std sqrt(2)
    _close(got[3:], [-1 / (math.sqrt(2) + 1e-6), 1 / (math.sqrt(2) + 1e-6)], tol=1e-5)
    assert advantages.grpo(rewards, ["p", "p", "p", "q", "q"], norm_by_std=False)[:3].tolist() == [0.0] * 3


def test_grpo_size_one_group_gets_zero():
    got = advantages.grpo(torch.tensor([5.0, 1.0, 2.0]), ["solo", "pair", "pair"])
    assert got[0].item() == 0.0
    _close(got[1:], [-0.5 / (math.sqrt(0.5) + 1e-6), 0.5 / (math.sqrt(0.5) + 1e-6)], tol=1e-5)
    assert advantages.grpo(torch.tensor([5.0]), ["x"]).tolist() == [0.0]


def test_grpo_integer_rewards_and_tensor_group_ids():
    got = advantages.grpo(torch.tensor([1, 0, 0, 1]), torch.tensor([7, 7, 9, 9]), norm_by_std=False)
    assert got.dtype == torch.float32
    assert got.tolist() == [0.5, -0.5, -0.5, 0.5]


def test_grpo_rejects_non_finite_rewards_with_indices():
    with pytest.raises(ValueError, match=r"rewards contain non-finite values at indices \[1, 3\]"):
        advantages.grpo(torch.tensor([0.0, NAN, 1.0, INF]), ["a", "a", "b", "b"])


def test_grpo_rejects_bad_shapes():
    with pytest.raises(ValueError, match=r"group_ids: expected length N=3.*got 2"):
        advantages.grpo(torch.tensor([0.0, 1.0, 2.0]), ["a", "b"])
    with pytest.raises(ValueError, match=r"rewards: expected shape \[N\].*got \(2, 2\)"):
        advantages.grpo(torch.zeros(2, 2), ["a", "b"])


def test_broadcast_to_tokens():
    mask = torch.tensor([[True, True, False], [False, False, False], [True, False, True]])
    got = advantages.broadcast_to_tokens(torch.tensor([2.0, -1.0, 0.5]), mask)
    assert got.dtype == torch.float32
    assert got.tolist() == [[2.0, 2.0, 0.0], [0.0, 0.0, 0.0], [0.5, 0.0, 0.5]]
    with pytest.raises(ValueError, match=r"mask: expected shape \[N=3, T\], got \(2, 3\)"):
        advantages.broadcast_to_tokens(torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"advantages: expected shape \[N\]"):
        advantages.broadcast_to_tokens(torch.zeros(3, 1), torch.ones(3, 1))


# --------------------------------------------------------------------------------------------------------
# losses: masked_mean and reduce_loss
# --------------------------------------------------------------------------------------------------------

# A ragged batch: row 0 has 3 masked tokens, row 1 has 1, row 2 none. Garbage sits at masked-out positions.
RAGGED_VALUES = [[1.0, 2.0, 3.0, 100.0], [5.0, NAN, INF, -INF], [7.0, 8.0, 9.0, 10.0]]
RAGGED_MASK = [[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]]


def test_masked_mean_whole_and_per_row():
    values, mask = torch.tensor(RAGGED_VALUES), torch.tensor(RAGGED_MASK)
    assert losses.masked_mean(values, mask).item() == pytest.approx((1 + 2 + 3 + 5) / 4)
    _close(losses.masked_mean(values, mask, dim=1), [2.0, 5.0, 0.0])
    assert losses.masked_mean(values, torch.zeros(3, 4)).item() == 0.0
    with pytest.raises(ValueError, match=r"mask: expected shape \(3, 4\).*got \(3, 3\)"):
        losses.masked_mean(values, torch.ones(3, 3))


@pytest.mark.parametrize(
    ("reduction", "expected", "grad"),
    [
        # (1+2+3+5) / 4 tokens
        ("token_mean", 11 / 4, [[1 / 4] * 3 + [0.0], [1 / 4, 0.0, 0.0, 0.0], [0.0] * 4]),
        # mean(2, 5) over the two non-empty rows
        ("seq_mean_token_mean", 7 / 2, [[1 / 6] * 3 + [0.0], [1 / 2, 0.0, 0.0, 0.0], [0.0] * 4]),
        # mean(6, 5)
        ("seq_mean_token_sum", 11 / 2, [[1 / 2] * 3 + [0.0], [1 / 2, 0.0, 0.0, 0.0], [0.0] * 4]),
    ],
)
def test_reduce_loss_reductions_on_ragged_batch(reduction, expected, grad):
    per_token = torch.tensor(RAGGED_VALUES, requires_grad=True)
    loss = losses.reduce_loss(per_token, torch.tensor(RAGGED_MASK, dtype=torch.bool), reduction)
    assert loss.item() == pytest.approx(expected)
    loss.backward()
    _close(per_token.grad, grad)


def test_reduce_loss_empty_mask_is_zero_and_differentiable():
    per_token = torch.tensor([[1.0, NAN], [INF, 4.0]], requires_grad=True)
    for reduction in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum"):
        loss = losses.reduce_loss(per_token, torch.zeros(2, 2), reduction)
        assert loss.item() == 0.0
        assert loss.grad_fn is not None
        (grad,) = torch.autograd.grad(loss, per_token)
        assert grad.tolist() == [[0.0, 0.0], [0.0, 0.0]]


def test_reduce_loss_errors():
    with pytest.raises(ValueError, match=r"token_mean, seq_mean_token_mean, seq_mean_token_sum; got 'sum'"):
        losses.reduce_loss(torch.zeros(2, 2), torch.ones(2, 2), "sum")
    with pytest.raises(ValueError, match=r"per_token: expected shape \[N, T\].*got \(4,\)"):
        losses.reduce_loss(torch.zeros(4), torch.ones(4), "token_mean")
    with pytest.raises(ValueError, match=r"mask: expected shape \(2, 2\).*got \(2, 3\)"):
        losses.reduce_loss(torch.zeros(2, 2), torch.ones(2, 3), "token_mean")


# --------------------------------------------------------------------------------------------------------
# losses: ppo_clip
# --------------------------------------------------------------------------------------------------------

# clip range [0.8, 1.3] (clip_low=0.2, clip_high=0.3). Row 0 has A = +1, row 1 has A = -2.
RATIOS = [[1.5, 1.25, 0.5], [0.7, 1.25, 1.5]]
ADV = [1.0, -2.0]


def _ppo_inputs(requires_grad: bool = True):
    old = [[math.log(0.5)] * 3, [math.log(0.4)] * 3]
    new = [
        [o + math.log(r) for o, r in zip(orow, rrow, strict=True)]
        for orow, rrow in zip(old, RATIOS, strict=True)
    ]
    logp = torch.tensor(new, dtype=torch.float64, requires_grad=requires_grad)
    return logp, torch.tensor(old, dtype=torch.float64)


def test_ppo_clip_asymmetric_clipping_loss_and_clip_frac():
    logp, old = _ppo_inputs()
    loss, stats = losses.ppo_clip(
        logp, old, torch.tensor(ADV, dtype=torch.float64), torch.ones(2, 3), 0.2, 0.3
    )
    # A=+1: r=1.5 > 1.3 -> clipped, -1.3; r=1.25 inside the upper range -> -1.25;
    #       r=0.5 below 0.8 but A>0 -> -0.5
    # A=-2: r=0.7 < 0.8 -> clipped, 2*0.8=1.6; r=1.25 -> 2.5; r=1.5 above 1.3 but A<0 -> unclipped 3.0
    per_token = [-1.3, -1.25, -0.5, 1.6, 2.5, 3.0]
    assert loss.item() == pytest.approx(sum(per_token) / 6)
    assert stats["clip_frac"] == pytest.approx(2 / 6)
    # gradient: 0 where clipped, d(-A * r)/dlogp = -A * r elsewhere, / 6 tokens
    loss.backward()
    _close(logp.grad, [[0.0, -1.25 / 6, -0.5 / 6], [0.0, 2 * 1.25 / 6, 2 * 1.5 / 6]], tol=1e-9)


def test_ppo_clip_symmetric_clip_also_clips_ratio_between_high_bounds():
    logp, old = _ppo_inputs(requires_grad=False)
    # with clip_high=0.2 the r=1.25 token with A=+1 is now clipped to 1.2 (the clip-higher difference)
    loss, stats = losses.ppo_clip(
        logp, old, torch.tensor(ADV, dtype=torch.float64), torch.ones(2, 3), 0.2, 0.2
    )
    per_token = [-1.2, -1.2, -0.5, 1.6, 2.5, 3.0]
    assert loss.item() == pytest.approx(sum(per_token) / 6)
    assert stats["clip_frac"] == pytest.approx(3 / 6)


def test_ppo_clip_sequence_advantages_equal_token_advantages():
    logp, old = _ppo_inputs(requires_grad=False)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    per_seq = losses.ppo_clip(logp, old, torch.tensor(ADV, dtype=torch.float64), mask, 0.2, 0.3)
    per_tok = losses.ppo_clip(
        logp, old, torch.tensor([[1.0] * 3, [-2.0] * 3], dtype=torch.float64), mask, 0.2, 0.3
    )
    assert per_seq[0].item() == pytest.approx(per_tok[0].item())
    assert per_seq[1] == pytest.approx(per_tok[1])
    assert per_seq[0].item() == pytest.approx((-1.3 - 1.25 + 1.6 + 2.5 + 3.0) / 5)


def test_ppo_clip_stats():
    logp, old = _ppo_inputs(requires_grad=False)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])  # tokens with ratios 1.5, 1.25, 0.5, 0.7
    _, stats = losses.ppo_clip(logp, old, torch.tensor(ADV, dtype=torch.float64), mask, 0.2, 0.3)
    ratios = [1.5, 1.25, 0.5, 0.7]
    assert set(stats) == {"clip_frac", "dual_clip_frac", "ratio_mean", "ratio_max", "approx_kl"}
    assert all(isinstance(v, float) for v in stats.values())
    assert stats["ratio_mean"] == pytest.approx(sum(ratios) / 4)
    assert stats["ratio_max"] == pytest.approx(1.5)
    assert stats["approx_kl"] == pytest.approx(sum(0.5 * math.log(r) ** 2 for r in ratios) / 4)
    assert stats["clip_frac"] == pytest.approx(2 / 4)  # 1.5 with A>0 and 0.7 with A<0


def test_ppo_clip_reductions_differ_on_ragged_batch():
    logp, old = _ppo_inputs(requires_grad=False)
    adv = torch.tensor(ADV, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])  # per-token losses [-1.3, -1.25, -0.5] and [1.6]
    got = {
        r: losses.ppo_clip(logp, old, adv, mask, 0.2, 0.3, reduction=r)[0].item()
        for r in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")
    }
    assert got["token_mean"] == pytest.approx((-3.05 + 1.6) / 4)
    assert got["seq_mean_token_mean"] == pytest.approx((-3.05 / 3 + 1.6) / 2)
    assert got["seq_mean_token_sum"] == pytest.approx((-3.05 + 1.6) / 2)
    assert len({round(v, 9) for v in got.values()}) == 3


def test_ppo_clip_garbage_in_padding_gives_finite_loss_and_zero_grad_there():
    logp = torch.tensor([[math.log(0.5), -INF, NAN], [math.log(0.25), 0.0, 50.0]], requires_grad=True)
    old = torch.tensor([[math.log(0.5), -INF, 3.0], [math.log(0.5), NAN, -50.0]])
    adv = torch.tensor([[1.0, NAN, INF], [-1.0, 2.0, 1.0]])
    mask = torch.tensor([[1, 0, 0], [1, 0, 0]])
    loss, stats = losses.ppo_clip(logp, old, adv, mask, 0.2, 0.2)
    # token 0: r=1, A=+1 -> -1; token 1: r=0.5, A=-1 -> max(0.5, 0.8) = 0.8 (clipped)
    assert loss.item() == pytest.approx((-1.0 + 0.8) / 2)
    assert all(math.isfinite(v) for v in stats.values())
    assert stats["ratio_max"] == pytest.approx(1.0)
    loss.backward()
    assert torch.isfinite(logp.grad).all()
    _close(logp.grad, [[-1.0 / 2, 0.0, 0.0], [0.0, 0.0, 0.0]])

    empty_loss, empty_stats = losses.ppo_clip(logp, old, adv, torch.zeros(2, 3))
    assert empty_loss.item() == 0.0
    assert empty_stats == {
        "clip_frac": 0.0,
        "dual_clip_frac": 0.0,
        "ratio_mean": 0.0,
        "ratio_max": 0.0,
        "approx_kl": 0.0,
    }


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"clip_low": 1.0}, r"clip_low must be in \[0, 1\); got 1.0"),
        ({"clip_low": -0.1}, r"clip_low must be in \[0, 1\)"),
        ({"clip_high": -0.5}, r"clip_high must be >= 0; got -0.5"),
        ({"old_logp": torch.zeros(2, 4)}, r"old_logp: expected shape \(2, 3\).*got \(2, 4\)"),
        ({"mask": torch.ones(3, 3)}, r"mask: expected shape \(2, 3\).*got \(3, 3\)"),
        ({"adv": torch.zeros(3)}, r"adv: expected shape \(2, 3\) or \(2,\).*got \(3,\)"),
        ({"logp": torch.zeros(6), "old_logp": torch.zeros(6)}, r"logp: expected shape \[N, T\].*got \(6,\)"),
        ({"reduction": "mean"}, r"reduction must be one of token_mean"),
    ],
)
def test_ppo_clip_errors(kwargs, match):
    args = {
        "logp": torch.zeros(2, 3),
        "old_logp": torch.zeros(2, 3),
        "adv": torch.zeros(2),
        "mask": torch.ones(2, 3),
    }
    with pytest.raises(ValueError, match=match):
        losses.ppo_clip(**(args | kwargs))


# --------------------------------------------------------------------------------------------------------
# losses: sft
# --------------------------------------------------------------------------------------------------------


def test_sft_negative_log_likelihood_and_grad():
    probs = [[0.5, 0.25, 0.9], [0.1, 0.3, 0.3]]
    logp = torch.tensor([[math.log(p) for p in row] for row in probs], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    nll = [-math.log(0.5), -math.log(0.25), -math.log(0.1)]
    assert losses.sft(logp, mask).item() == pytest.approx(sum(nll) / 3)
    assert losses.sft(logp, mask, "seq_mean_token_mean").item() == pytest.approx(
        (sum(nll[:2]) / 2 + nll[2]) / 2
    )
    assert losses.sft(logp, mask, "seq_mean_token_sum").item() == pytest.approx((sum(nll[:2]) + nll[2]) / 2)
    losses.sft(logp, mask).backward()
    _close(logp.grad, [[-1 / 3, -1 / 3, 0.0], [-1 / 3, 0.0, 0.0]])
    with pytest.raises(ValueError, match=r"mask: expected shape \(2, 3\).*got \(2, 2\)"):
        losses.sft(logp, torch.ones(2, 2))


# --------------------------------------------------------------------------------------------------------
# kl
# --------------------------------------------------------------------------------------------------------


def test_kl_estimators_hand_values():
    logp = torch.tensor([math.log(0.5), math.log(0.2), math.log(0.9)], dtype=torch.float64)
    ref = torch.tensor([math.log(0.25), math.log(0.4), math.log(0.9)], dtype=torch.float64)
    ln2 = math.log(2)
    # log ratios: ln 2, -ln 2, 0
    _close(kl.estimate(logp, ref, "k1"), [ln2, -ln2, 0.0], tol=1e-12)
    _close(kl.estimate(logp, ref, "k2"), [0.5 * ln2**2, 0.5 * ln2**2, 0.0], tol=1e-12)
    # k3 = ref/p - 1 - ln(ref/p): 0.5 - 1 + ln2, 2 - 1 - ln2, 0
    _close(kl.estimate(logp, ref, "k3"), [ln2 - 0.5, 1 - ln2, 0.0], tol=1e-12)
    _close(kl.estimate(logp, ref), [ln2 - 0.5, 1 - ln2, 0.0], tol=1e-12)  # k3 is the default


def test_kl_k1_and_k3_are_unbiased_under_the_policy():
    p, q = [0.5, 0.3, 0.2], [0.2, 0.5, 0.3]
    exact = sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True))
    logp = torch.tensor([math.log(x) for x in p], dtype=torch.float64)
    ref = torch.tensor([math.log(x) for x in q], dtype=torch.float64)
    weights = torch.tensor(p, dtype=torch.float64)
    for kind in ("k1", "k3"):
        assert (weights * kl.estimate(logp, ref, kind)).sum().item() == pytest.approx(exact)


def test_kl_k3_non_negative_finite_and_shape_preserving():
    gen = torch.Generator().manual_seed(0)
    logp = torch.randn(4, 64, generator=gen) * 3
    ref = torch.randn(4, 64, generator=gen) * 3
    tiny = torch.tensor([1e-8, -1e-8, 1e-30, -1e-30, 0.0, 60.0, -60.0]).expand(4, 7)
    for a, b in ((logp, ref), (tiny, torch.zeros(4, 7))):
        k3 = kl.estimate(a, b, "k3")
        assert k3.shape == a.shape
        assert torch.isfinite(k3).all()
        assert (k3 >= 0).all()
    # beyond the [-20, 20] clamp: -60 behaves like -20, i.e. exp(20) - 1 - 20
    big = kl.estimate(torch.tensor([-60.0]), torch.tensor([0.0]), "k3").item()
    assert big == pytest.approx(math.exp(20) - 21, rel=1e-6)


def test_kl_errors():
    with pytest.raises(ValueError, match=r"kind must be one of k1, k2, k3; got 'k4'"):
        kl.estimate(torch.zeros(2), torch.zeros(2), "k4")
    with pytest.raises(ValueError, match=r"ref_logp: expected shape \(2, 3\).*got \(2, 4\)"):
        kl.estimate(torch.zeros(2, 3), torch.zeros(2, 4))
