"""ADCA-GRPO step advantages (self-attributing) against a hand computation, and the per-token clip
bound that selective clip amplification uses."""

from __future__ import annotations

import math

import pytest
import torch

from horizonrl.algos.advantages import adca, broadcast_steps
from horizonrl.algos.losses import ppo_clip

G, B = True, False


def test_adca_matches_a_hand_computation_on_two_groups_with_unequal_lengths():
    labels = [[G, B, G], [B], [G, G], [G, B, B, B]]
    outcome = [1.0, 0.0, 1.0, 1.0]
    groups = ["a", "a", "b", "b"]
    got = adca(labels, outcome, groups, alpha=0.1, step_reward=0.2)

    # group a: per-trajectory means of the step rewards, then their mean (each trajectory counts once)
    t0, t1 = [0.2, -0.2, 0.2], [-0.2]
    mu = (sum(t0) / 3 + sum(t1) / 1) / 2
    var = (sum((r - mu) ** 2 for r in t0) / 3 + sum((r - mu) ** 2 for r in t1) / 1) / 2
    sd = math.sqrt(var)
    z0 = [(r - mu) / (sd + 1e-6) for r in t0]
    z1 = [(r - mu) / (sd + 1e-6) for r in t1]
    out_mu, out_sd = 0.5, 0.5  # outcomes 1 and 0: population std 0.5
    zo0, zo1 = (1 - out_mu) / (out_sd + 1e-6), (0 - out_mu) / (out_sd + 1e-6)
    fused0 = [0.1 * z0[0], 0.1 * z0[1], 0.1 * z0[2] + zo0]
    want0 = [sum(fused0[0:]), sum(fused0[1:]), sum(fused0[2:])]
    want1 = [0.1 * z1[0] + zo1]
    # group b: equal outcomes give no outcome signal; attribution still does
    t2, t3 = [0.2, 0.2], [0.2, -0.2, -0.2, -0.2]
    mu_b = (0.2 + sum(t3) / 4) / 2
    var_b = (sum((r - mu_b) ** 2 for r in t2) / 2 + sum((r - mu_b) ** 2 for r in t3) / 4) / 2
    z2 = [(r - mu_b) / (math.sqrt(var_b) + 1e-6) for r in t2]
    z3 = [(r - mu_b) / (math.sqrt(var_b) + 1e-6) for r in t3]
    want2 = [0.1 * (z2[0] + z2[1]), 0.1 * z2[1]]
    want3 = [0.1 * sum(z3[k:]) for k in range(4)]
    for tensor, want in zip(got, [want0, want1, want2, want3], strict=True):
        assert tensor.tolist() == pytest.approx(want, abs=1e-5)
    # a good step in a failed trajectory still gets more than the bad step after it
    assert got[0][0] > got[0][1]


def test_adca_caps_attribution_and_ignores_unlabelled_steps():
    capped = adca([[G, B, B], [B, G, G]], [1.0, 0.0], [0, 0], prm_steps=1)
    unlabelled = adca([[G, None, None], [B, None, None]], [1.0, 0.0], [0, 0])
    for a, b in zip(capped, unlabelled, strict=True):
        assert a.tolist() == pytest.approx(b.tolist())
    # steps past the cap carry only the outcome, so their advantages equal the outcome's z-score
    assert capped[0][1].item() == pytest.approx(capped[0][2].item())
    with pytest.raises(ValueError, match="outcome: expected 2 values"):
        adca([[G], [B]], [1.0], [0, 0])


def test_broadcast_steps_gives_each_token_its_steps_advantage():
    steps = torch.tensor([0.5, -0.25])
    tokens = torch.tensor([-1, 0, 0, -1, 1, 1, 1])
    assert broadcast_steps(steps, tokens).tolist() == [0.0, 0.5, 0.5, 0.0, -0.25, -0.25, -0.25]
    with pytest.raises(ValueError, match="names step 2"):
        broadcast_steps(steps, torch.tensor([0, 2]))


def test_a_per_token_upper_clip_applies_only_where_it_is_given():
    logp = torch.log(torch.full((2, 3), 1.5)).requires_grad_()  # ratio 1.5 against old logp 0
    old = torch.zeros(2, 3)
    mask = torch.ones(2, 3)
    # row 0: an experience sample (upper clip 0.6), row 1 on-policy (0.28); positive advantages
    clip_high = torch.tensor([[0.6] * 3, [0.28] * 3])
    loss, stats = ppo_clip(
        logp, old, torch.ones(2), mask, clip_low=0.2, clip_high=clip_high, reduction="seq_mean_token_sum"
    )
    # row 0: ratio 1.5 < 1.6 stays unclipped (gradient flows); row 1: clipped at 1.28 (no gradient)
    assert loss.item() == pytest.approx(-(1.5 * 3 + 1.28 * 3) / 2, rel=1e-5)
    loss.backward()
    assert (logp.grad[0] != 0).all() and (logp.grad[1] == 0).all()
    assert stats["clip_frac"] == pytest.approx(0.5)
    # [N] bounds broadcast over the tokens; a negative bound is an error
    loss_n, _ = ppo_clip(
        logp.detach(),
        old,
        torch.ones(2),
        mask,
        clip_high=torch.tensor([0.6, 0.28]),
        reduction="seq_mean_token_sum",
    )
    assert loss_n.item() == pytest.approx(loss.item())
    with pytest.raises(ValueError, match="clip_high"):
        ppo_clip(logp.detach(), old, torch.ones(2), mask, clip_high=torch.tensor([0.6, -0.1]))


def test_with_dual_clip_a_wide_upper_bound_cannot_lift_negative_advantage_tokens():
    logp = torch.log(torch.full((1, 2), 5.0))  # ratio 5
    old = torch.zeros(1, 2)
    wide = torch.full((1, 2), 0.6)
    loss, stats = ppo_clip(
        logp,
        old,
        -torch.ones(1),
        torch.ones(1, 2),
        clip_high=wide,
        dual_clip=3.0,
        reduction="seq_mean_token_sum",
    )
    assert loss.item() == pytest.approx(2 * 3.0)  # bounded by -A*c = 3 per token
    assert stats["dual_clip_frac"] == pytest.approx(1.0)
