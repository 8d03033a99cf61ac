"""The extended algorithm suite (RLOO, REINFORCE++, GAE, dual-clip, GSPO, plain IS, the value loss,
truncated importance weights) against hand computations on small ragged, masked tensors.

Every expected number below is worked out by hand in the comment next to it (or, for GSPO, by the
paper's sequence-level formula written directly with autograd), not by calling the code under test.
"""

from __future__ import annotations

import math

import pytest
import torch

from horizonrl.algos import advantages, critic, losses

NAN = float("nan")


def _close(actual: torch.Tensor, expected: list, tol: float = 1e-5) -> None:
    want = torch.tensor(expected, dtype=torch.float64)
    assert tuple(actual.shape) == tuple(want.shape)
    assert actual.flatten().tolist() == pytest.approx(want.flatten().tolist(), abs=tol)


# ---------------------------------------------------------------------------------------------------
# RLOO
# ---------------------------------------------------------------------------------------------------


def test_rloo_leave_one_out_baseline_with_interleaved_ragged_groups():
    ids = ["a", "b", "a", "a", "b", "c", "d", "d"]
    rewards = torch.tensor([1.0, 3.0, 0.0, 0.0, 5.0, 7.0, 4.0, 4.0])
    # a = {1, 0, 0}: 1 - mean(0, 0) = 1; 0 - mean(1, 0) = -0.5 (twice)
    # b = {3, 5}: 3 - 5 = -2; 5 - 3 = 2.   c has one sample: 0.   d is all equal: 0.
    _close(advantages.rloo(rewards, ids), [1.0, -2.0, -0.5, -0.5, 2.0, 0.0, 0.0, 0.0])


def test_rloo_rejects_non_finite_rewards_with_their_index():
    with pytest.raises(ValueError, match=r"non-finite values at indices \[1\]"):
        advantages.rloo(torch.tensor([1.0, NAN]), [0, 0])


# ---------------------------------------------------------------------------------------------------
# discounted returns and REINFORCE++
# ---------------------------------------------------------------------------------------------------


def test_discounted_returns_per_token_skip_unmasked_positions_and_ignore_their_rewards():
    rewards = torch.tensor([[0.0, 1.0, 9.0, 2.0], [3.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0, 1], [1, 0, 0, 0]])
    # row 0, gamma 0.5: G3 = 2; G1 = 1 + 0.5 * 2 = 2; G0 = 0 + 0.5 * 2 = 1 (the 9 is masked out)
    _close(advantages.discounted_returns(rewards, mask, gamma=0.5), [[1.0, 2.0, 0.0, 2.0], [3.0, 0, 0, 0]])
    # gamma 1: plain reward-to-go
    _close(advantages.discounted_returns(rewards, mask), [[3.0, 3.0, 0.0, 2.0], [3.0, 0, 0, 0]])


def test_discounted_returns_across_turns_discounts_once_per_turn_not_per_token():
    rewards = torch.tensor([[0.0, 1.0, 9.0, 0.0, 2.0]])
    mask = torch.tensor([[1, 1, 0, 1, 1]])
    turns = torch.tensor([[0, 0, 0, 1, 1]])
    # turn 1 (t=3,4): reward-to-go inside the turn 2, 2; turn 0 sees turn 1's total (2) once
    # discounted: t=1: 1 + 0.5 * 2 = 2; t=0: 0 + 2 = 2
    _close(advantages.discounted_returns(rewards, mask, 0.5, turn_ids=turns), [[2.0, 2.0, 0.0, 2.0, 2.0]])
    # per token instead: t4 = 2, t3 = 0 + 0.5*2 = 1, t1 = 1 + 0.5*1 = 1.5, t0 = 0.5*1.5 = 0.75
    _close(advantages.discounted_returns(rewards, mask, 0.5), [[0.75, 1.5, 0.0, 1.0, 2.0]])
    # two turns apart (turn ids 0 and 2): t1 = 1 + 0.5^2 * 2 = 1.5; t0 = 0 + 1.5 (same turn)
    far = torch.tensor([[0, 0, 0, 2, 2]])
    _close(advantages.discounted_returns(rewards, mask, 0.5, turn_ids=far), [[1.5, 1.5, 0.0, 2.0, 2.0]])


REINFORCE_REWARDS = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 4.0]])
REINFORCE_MASK = torch.tensor([[1, 1], [1, 0], [1, 1]])


def test_reinforce_pp_whitens_the_returns_over_all_masked_tokens():
    # returns: [1, 1], [0, -], [4, 4]; masked values 1, 1, 0, 4, 4: mean 2, population var
    # (1 + 1 + 4 + 4 + 4) / 5 = 2.8, std 1.6733201
    s = math.sqrt(2.8)
    got = advantages.reinforce_pp(REINFORCE_REWARDS, REINFORCE_MASK)
    _close(got, [[-1 / s, -1 / s], [-2 / s, 0.0], [2 / s, 2 / s]])


def test_reinforce_pp_baseline_subtracts_the_group_mean_total_reward_then_whitens():
    # totals 1, 0, 4; groups a = {0, 1} (mean 0.5), b = {2} (mean 4)
    # returns - baseline: [0.5, 0.5], [-0.5, -], [0, 0]; mean 0.1, centred 0.4, 0.4, -0.6, -0.1, -0.1
    # var (0.16 + 0.16 + 0.36 + 0.01 + 0.01) / 5 = 0.14
    s = math.sqrt(0.14)
    got = advantages.reinforce_pp(REINFORCE_REWARDS, REINFORCE_MASK, group_ids=["a", "a", "b"])
    _close(got, [[0.4 / s, 0.4 / s], [-0.6 / s, 0.0], [-0.1 / s, -0.1 / s]])


# Two groups of two three-turn episodes, one model token per turn, per-turn rewards: group a solves
# both (0.25 + 0.25 + 1), group b has one first step right and nothing else.
TURN_REWARDS = torch.tensor([[0.25, 0.25, 1.0], [0.25, 0.25, 1.0], [0.25, 0.0, 0.0], [0.0, 0.0, 0.0]])
TURN_MASK = torch.ones(4, 3)
TURN_IDS = torch.tensor([[0, 1, 2]] * 4)


def test_turn_baseline_is_the_groups_mean_return_from_the_same_turn_on():
    returns = advantages.discounted_returns(TURN_REWARDS, TURN_MASK, 1.0, TURN_IDS)
    base = advantages.turn_baseline(returns, TURN_MASK, TURN_IDS, ["a", "a", "b", "b"])
    _close(base, [[1.5, 1.25, 1.0], [1.5, 1.25, 1.0], [0.125, 0.0, 0.0], [0.125, 0.0, 0.0]])
    # a sibling with no turn k (its episode is over) counts 0 there
    short = torch.tensor([[1, 1, 1], [1, 0, 0]])
    turns = torch.tensor([[0, 1, 2], [0, -1, -1]])
    rewards = torch.tensor([[0.25, 0.25, 1.0], [0.5, 0.0, 0.0]])
    returns = advantages.discounted_returns(rewards, short, 1.0, turns)
    _close(advantages.turn_baseline(returns, short, turns, [0, 0]), [[1.0, 0.625, 0.5], [1.0, 0.0, 0.0]])


def test_a_turn_baseline_leaves_a_group_with_no_signal_at_zero_where_the_episode_baseline_pushes_it():
    groups = ["a", "a", "b", "b"]
    per_turn = advantages.reinforce_pp(
        TURN_REWARDS, TURN_MASK, group_ids=groups, turn_ids=TURN_IDS, baseline="turn"
    )
    # only group b's first turn differs between siblings: +/- the same amount, scaled by the batch std
    assert per_turn[:2].abs().max() == 0 and per_turn[2:, 1:].abs().max() == 0
    assert per_turn[2, 0] > 0 and per_turn[3, 0] == pytest.approx(-float(per_turn[2, 0]))
    # the episode baseline pushes the solved group's later turns down by the credit already earned
    episode = advantages.reinforce_pp(TURN_REWARDS, TURN_MASK, group_ids=groups, turn_ids=TURN_IDS)
    assert episode[0, 2] < 0 and episode[3, 2] > 0
    with pytest.raises(ValueError, match="turn_ids"):
        advantages.reinforce_pp(TURN_REWARDS, TURN_MASK, group_ids=groups, baseline="turn")
    with pytest.raises(ValueError, match="'episode' or 'turn'"):
        advantages.reinforce_pp(TURN_REWARDS, TURN_MASK, group_ids=groups, baseline="state")


def test_whiten_variants_and_masked_nan_does_not_leak():
    values = torch.tensor([[1.0, 3.0, NAN]])
    mask = torch.tensor([[1, 1, 0]])
    # mean 2, population std 1
    _close(advantages.whiten(values, mask, eps=0.0), [[-1.0, 1.0, 0.0]])
    _close(advantages.whiten(values, mask, shift_mean=False, eps=0.0), [[1.0, 3.0, 0.0]])
    _close(advantages.whiten(torch.tensor([[2.0, 2.0, NAN]]), mask), [[0.0, 0.0, 0.0]])


# ---------------------------------------------------------------------------------------------------
# GAE
# ---------------------------------------------------------------------------------------------------


def test_gae_skips_observation_tokens_and_bootstraps_from_the_next_model_token():
    rewards = torch.tensor([[0.0, 0.0, 9.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    values = torch.tensor([[0.5, 0.2, 7.0, 0.4], [0.25, 5.0, 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 0, 1], [1, 0, 0, 0]])
    adv, ret = critic.gae(rewards, values, mask, gamma=0.9, lam=0.8)
    # row 0 (t=2 is an observation, skipped), gamma*lam = 0.72:
    #   t3: delta = 1 + 0 - 0.4 = 0.6                     A = 0.6
    #   t1: delta = 0 + 0.9 * 0.4 - 0.2 = 0.16             A = 0.16 + 0.72 * 0.6 = 0.592
    #   t0: delta = 0 + 0.9 * 0.2 - 0.5 = -0.32            A = -0.32 + 0.72 * 0.592 = 0.10624
    # row 1: one token, terminal: A = 1 - 0.25 = 0.75
    _close(adv, [[0.10624, 0.592, 0.0, 0.6], [0.75, 0.0, 0.0, 0.0]])
    _close(ret, [[0.60624, 0.792, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    assert not adv.requires_grad and not ret.requires_grad


def test_gae_with_lambda_one_and_gamma_one_is_return_minus_value():
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.3, 0.6, 0.9]])
    adv, ret = critic.gae(rewards, values, torch.ones(1, 3))
    _close(adv, [[0.7, 0.4, 0.1]])
    _close(ret, [[1.0, 1.0, 1.0]])


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: critic.gae(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), gamma=1.5), "gamma"),
        (lambda: critic.gae(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), lam=-0.1), "lam"),
        (lambda: critic.gae(torch.zeros(1, 2), torch.zeros(1, 3), torch.ones(1, 2)), "values"),
        (lambda: advantages.discounted_returns(torch.zeros(2), torch.ones(2)), r"\[N, T\]"),
    ],
)
def test_estimator_input_errors_name_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ---------------------------------------------------------------------------------------------------
# policy losses
# ---------------------------------------------------------------------------------------------------


def test_dual_clip_bounds_negative_advantage_tokens_with_exploded_ratios():
    ratios = [5.0, 2.0, 5.0, 0.5]
    adv = torch.tensor([[-1.0, -1.0, 1.0, -1.0]])
    old = torch.zeros(1, 4)
    logp = torch.tensor([[math.log(r) for r in ratios]], requires_grad=True)
    loss, stats = losses.ppo_clip(logp, old, adv, torch.ones(1, 4), 0.2, 0.2, dual_clip=3.0)
    # t0: max(5, 1.2) = 5 > 3 -> 3 (dual clip)  t1: max(2, 1.2) = 2    t2: max(-5, -1.2) = -1.2
    # t3: max(0.5, 0.8) = 0.8.                  mean (3 + 2 - 1.2 + 0.8) / 4 = 1.15
    assert loss.item() == pytest.approx(1.15)
    assert stats["dual_clip_frac"] == pytest.approx(0.25)
    loss.backward()
    # only t1 is unclipped: d(-A * ratio)/dlogp = ratio = 2, divided by 4 tokens
    _close(logp.grad, [[0.0, 0.5, 0.0, 0.0]])
    # without the dual clip t0 would contribute 5
    plain, _ = losses.ppo_clip(logp.detach(), old, adv, torch.ones(1, 4), 0.2, 0.2)
    assert plain.item() == pytest.approx((5 + 2 - 1.2 + 0.8) / 4)


def test_dual_clip_must_exceed_one():
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        losses.ppo_clip(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1), dual_clip=0.9)


GSPO_LOGP = [[-1.0, -2.0], [-1.0, 0.0]]
GSPO_OLD = [[-1.5, -2.1], [-1.2, 50.0]]  # 50 sits at a masked-out position
GSPO_MASK = [[1, 1], [1, 0]]
GSPO_ADV = [1.0, -1.0]


def test_gspo_matches_the_sequence_level_formula_in_value_and_gradient():
    logp = torch.tensor(GSPO_LOGP, requires_grad=True)
    old, mask, adv = torch.tensor(GSPO_OLD), torch.tensor(GSPO_MASK), torch.tensor(GSPO_ADV)
    loss, stats = losses.gspo(logp, old, adv, mask, clip_low=0.5, clip_high=0.5)
    loss.backward()

    # the paper's objective, written directly: s_i = exp(mean_t (logp - old)) over each row's tokens
    ref_logp = torch.tensor(GSPO_LOGP, requires_grad=True)
    s0 = torch.exp(((ref_logp[0] - old[0]).sum()) / 2)  # exp(0.3) = 1.3498588
    s1 = torch.exp(ref_logp[1, 0] - old[1, 0])  # exp(0.2) = 1.2214028
    ref = (-(1.0) * s0 + 1.0 * s1) / 2  # no clipping inside [0.5, 1.5]
    ref.backward()

    assert loss.item() == pytest.approx((-math.exp(0.3) + math.exp(0.2)) / 2)
    assert loss.item() == pytest.approx(ref.item())
    _close(logp.grad, ref_logp.grad.tolist())
    # by hand: row 0 tokens -s0 / 2 tokens / 2 rows; row 1 token +s1 / 2 rows; padding 0
    _close(logp.grad, [[-math.exp(0.3) / 4, -math.exp(0.3) / 4], [math.exp(0.2) / 2, 0.0]])
    assert stats["ratio_mean"] == pytest.approx((math.exp(0.3) + math.exp(0.2)) / 2)
    assert stats["clip_frac"] == 0.0


def test_gspo_tight_clip_stops_the_gradient_of_sequences_outside_the_range():
    logp = torch.tensor(GSPO_LOGP, requires_grad=True)
    loss, stats = losses.gspo(logp, torch.tensor(GSPO_OLD), torch.tensor(GSPO_ADV), torch.tensor(GSPO_MASK))
    # default clip 3e-4 / 4e-4: s0 = 1.35 with A > 0 -> -1.0004; s1 = 1.22 with A < 0 -> unclipped 1.2214
    assert loss.item() == pytest.approx((-1.0004 + math.exp(0.2)) / 2)
    assert stats["clip_frac"] == 1.0  # both sequence ratios are outside [1 - 3e-4, 1 + 4e-4]
    loss.backward()
    _close(logp.grad, [[0.0, 0.0], [math.exp(0.2) / 2, 0.0]])


def test_importance_sampling_is_unclipped_and_reduces_to_reinforce_on_policy():
    logp = torch.tensor([[0.5, -0.5, 3.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0]])
    loss, stats = losses.importance_sampling(logp, torch.zeros(1, 3), torch.tensor([2.0]), mask)
    # -2 * (e^0.5 + e^-0.5) / 2 tokens
    assert loss.item() == pytest.approx(-(math.exp(0.5) + math.exp(-0.5)))
    assert stats["ratio_max"] == pytest.approx(math.exp(0.5))
    loss.backward()
    _close(logp.grad, [[-math.exp(0.5), -math.exp(-0.5), 0.0]])
    # on-policy (old = logp): gradient -A / n per token, REINFORCE
    on = torch.tensor([[0.5, -0.5, 3.0]], requires_grad=True)
    loss, _ = losses.importance_sampling(on, on.detach(), torch.tensor([2.0]), mask)
    loss.backward()
    _close(on.grad, [[-1.0, -1.0, 0.0]])


def test_importance_weights_multiply_the_per_token_loss():
    logp = torch.zeros(1, 2, requires_grad=True)
    weights = torch.tensor([[2.0, 0.5]])
    loss, _ = losses.ppo_clip(
        logp, torch.zeros(1, 2), torch.tensor([[1.0, 1.0]]), torch.ones(1, 2), is_weights=weights
    )
    # ratios 1: per-token -1, weighted -2 and -0.5, mean -1.25
    assert loss.item() == pytest.approx(-1.25)


# ---------------------------------------------------------------------------------------------------
# value loss, truncated importance sampling, entropy
# ---------------------------------------------------------------------------------------------------


def test_value_loss_clipped_and_unclipped_with_a_masked_position():
    values = torch.tensor([[1.4, 2.0, NAN]], requires_grad=True)
    old = torch.tensor([[1.0, 1.0, 0.0]])
    returns = torch.tensor([[1.5, 1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, stats = critic.value_loss(values, old, returns, mask, clip_range=0.2)
    # t0: plain (1.4 - 1.5)^2 = 0.01; clipped (1.0 + 0.2 - 1.5)^2 = 0.09 -> 0.09 (clip chosen)
    # t1: plain (2 - 1)^2 = 1; clipped (1.2 - 1)^2 = 0.04 -> 1.      0.5 * (0.09 + 1) / 2 = 0.2725
    assert loss.item() == pytest.approx(0.2725)
    assert stats["vf_clip_frac"] == pytest.approx(0.5)
    loss.backward()
    # t0: the clamp is saturated -> 0; t1: 0.5 * 2 * (2 - 1) / 2 = 0.5
    _close(values.grad, [[0.0, 0.5, 0.0]])

    free = values.detach().clone().requires_grad_(True)
    loss, _ = critic.value_loss(free, old, returns, mask, clip_range=None)
    assert loss.item() == pytest.approx(0.5 * (0.01 + 1.0) / 2)
    loss.backward()
    _close(free.grad, [[-0.05, 0.5, 0.0]])


def test_truncated_is_weights_cap_and_neutral_padding():
    old = torch.tensor([[-1.0, -1.0, -3.0]])
    sample = torch.tensor([[-2.0, -1.2, -1.0]])
    w = losses.truncated_is_weights(old, sample, torch.tensor([[1, 1, 0]]), cap=2.0)
    # exp(1) = 2.718 capped at 2; exp(0.2); padding 1
    _close(w, [[2.0, math.exp(0.2), 1.0]])
    with pytest.raises(ValueError, match="cap must be >= 1"):
        losses.truncated_is_weights(old, sample, torch.ones(1, 3), cap=0.5)


def test_entropy_bonus_reduces_like_the_loss():
    entropy = torch.tensor([[1.0, 3.0], [2.0, NAN]])
    mask = torch.tensor([[1, 1], [1, 0]])
    assert losses.entropy_bonus(entropy, mask).item() == pytest.approx(2.0)  # (1 + 3 + 2) / 3
    assert losses.entropy_bonus(entropy, mask, "seq_mean_token_mean").item() == pytest.approx(2.0)
    assert losses.entropy_bonus(entropy, mask, "seq_mean_token_sum").item() == pytest.approx(3.0)  # (4+2)/2
