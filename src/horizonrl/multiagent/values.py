"""MALT's credit assignment on a generator -> verifier -> refiner tree, as pure functions on tensors.

Per question the tree has ``n`` generations, ``n`` verifications of each and ``n`` refinements of
each verification: ``n**3`` leaves with a binary outcome reward. Values go up the tree by expectation
(value iteration with a uniform policy): a refinement's value is its reward, a verification's the
mean of its refinements, a generation's the mean of its verifications. A node is **positive** when its
value is above the threshold (0.5): a node whose subtree succeeds exactly half the time is negative,
since it is no demonstration to imitate. Preference pairs are built among siblings only (same parent,
so the same prompt): every positive sibling against every negative one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ROLES = ("generator", "verifier", "refiner")


def propagate_values(leaf_rewards: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``leaf_rewards[Q, n, n, n]`` -> ``(v_gen[Q, n], v_ver[Q, n, n], v_ref[Q, n, n, n])``."""
    if leaf_rewards.dim() != 4:
        raise ValueError(f"leaf_rewards must be [Q, n, n, n], got shape {tuple(leaf_rewards.shape)}")
    v_ref = leaf_rewards.to(torch.float32)
    v_ver = v_ref.mean(dim=-1)
    v_gen = v_ver.mean(dim=-1)
    return v_gen, v_ver, v_ref


def positive(values: torch.Tensor, threshold: float = 0.5) -> torch.Tensor:
    """Node labels: True where the value is above ``threshold`` (exactly at it: negative)."""
    return values > threshold


@dataclass(frozen=True)
class Pair:
    """A preference pair among siblings: the parent's index path, then the chosen and rejected child."""

    parent: tuple[int, ...]
    chosen: int
    rejected: int


@dataclass
class PairSet:
    """One role's pairs, and how many sibling groups gave none because every sibling had one label."""

    pairs: list[Pair]
    groups: int
    tied_groups: int


def sibling_pairs(values: torch.Tensor, threshold: float = 0.5) -> PairSet:
    """Pairs among the siblings of ``values[..., n]`` (the last dimension holds one parent's children)."""
    labels = positive(values, threshold)
    pairs: list[Pair] = []
    groups = tied = 0
    flat = labels.reshape(-1, labels.shape[-1])
    parents = list(torch.cartesian_prod(*[torch.arange(s) for s in labels.shape[:-1]]).reshape(len(flat), -1))
    for parent, row in zip(parents, flat.tolist(), strict=True):
        groups += 1
        good = [i for i, lab in enumerate(row) if lab]
        bad = [i for i, lab in enumerate(row) if not lab]
        if not good or not bad:
            tied += 1
            continue
        path = tuple(int(p) for p in parent)
        pairs.extend(Pair(path, g, b) for g in good for b in bad)
    return PairSet(pairs, groups, tied)


def preference_pairs(leaf_rewards: torch.Tensor, threshold: float = 0.5) -> dict[str, PairSet]:
    """Each role's sibling pairs from the tree's leaf rewards ``[Q, n, n, n]``: generations of one
    question (parent ``(q,)``), verifications of one generation (``(q, g)``), refinements of one
    verification (``(q, g, v)``)."""
    v_gen, v_ver, v_ref = propagate_values(leaf_rewards)
    return {
        "generator": sibling_pairs(v_gen, threshold),
        "verifier": sibling_pairs(v_ver, threshold),
        "refiner": sibling_pairs(v_ref, threshold),
    }


def sibling_advantages(values: torch.Tensor) -> torch.Tensor:
    """The online variant's credit: a node's value minus the mean of its siblings' (the last dim)."""
    return values - values.mean(dim=-1, keepdim=True)
