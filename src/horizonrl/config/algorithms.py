"""The ``train.algorithm`` presets: the algorithms and the value each gives the preset fields of
``train:``, written as what each changes of one base."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Algorithm = Literal[
    "grpo",
    "dr_grpo",
    "dapo",
    "rloo",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "reinforce_pp_turn",
    "ppo",
    "gspo",
]
Advantage = Literal["grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae"]
PolicyLoss = Literal["ppo_clip", "gspo", "is"]
LossReduction = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"]
KLPlacement = Literal["loss", "reward"]
Critic = Literal["none", "value_head"]
RewardPlacement = Literal["final", "per_turn"]
GroupBaseline = Literal["episode", "turn"]
SEQUENCE_ADVANTAGES = ("grpo", "rloo")
GROUP_ADVANTAGES = ("grpo", "rloo", "reinforce_pp_baseline")


class AlgorithmPreset(BaseModel):
    """What one ``train.algorithm`` sets: a value for every preset field, none left out (the fields of
    TrainConfig marked "(preset)"; a key the config sets itself wins over its preset's value)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    about: str = Field(description="Where the algorithm comes from and what sets it apart (for the docs).")
    advantage: Advantage
    norm_by_std: bool
    policy_loss: PolicyLoss
    clip_low: float
    clip_high: float
    reduction: LossReduction
    kl_in: KLPlacement
    critic: Critic
    dynamic_sampling: bool
    overlong_filter: bool
    reward_placement: RewardPlacement
    group_baseline: GroupBaseline

    def values(self) -> dict[str, Any]:
        """The preset fields and their values (``about`` left out)."""
        return self.model_dump(exclude={"about"})


#: What every preset starts from: group-normalised advantages, the PPO clipped loss with a symmetric
#: clip of 0.2, a token-level loss, KL (when on) as a loss term, no critic, no DAPO filters, one
#: reward at the end of the episode.
BASE_PRESET: dict[str, Any] = {
    "advantage": "grpo",
    "norm_by_std": True,
    "policy_loss": "ppo_clip",
    "clip_low": 0.2,
    "clip_high": 0.2,
    "reduction": "token_mean",
    "kl_in": "loss",
    "critic": "none",
    "dynamic_sampling": False,
    "overlong_filter": False,
    "reward_placement": "final",
    "group_baseline": "episode",
}


def _preset(about: str, **changes: Any) -> AlgorithmPreset:
    """:data:`BASE_PRESET` with ``changes`` (a change that names no preset field fails validation)."""
    return AlgorithmPreset(about=about, **(BASE_PRESET | changes))


#: Every ``train.algorithm`` and the value it gives each preset field (no field is left to a fallback):
#: each is :data:`BASE_PRESET` with the changes it names.
ALGORITHM_PRESETS: dict[Algorithm, AlgorithmPreset] = {
    "grpo": _preset(
        "GRPO (Shao et al. 2024) with DAPO's clip-higher and token-level loss; the default.",
        clip_high=0.28,
    ),
    "dr_grpo": _preset(
        "Dr.GRPO (Liu et al. 2025): no std division, no length normalisation inside a sequence.",
        norm_by_std=False,
        reduction="seq_mean_token_sum",
    ),
    "dapo": _preset(
        "DAPO (Yu et al. 2025): clip-higher, token-level loss, dynamic sampling, overlong filtering.",
        clip_high=0.28,
        dynamic_sampling=True,
        overlong_filter=True,
    ),
    "rloo": _preset("RLOO (Ahmadian et al. 2024): leave-one-out baseline.", advantage="rloo"),
    "reinforce_pp": _preset(
        "REINFORCE++ (Hu et al. 2025): token returns, batch whitening, KL (when on) in the reward.",
        advantage="reinforce_pp",
        kl_in="reward",
    ),
    "reinforce_pp_baseline": _preset(
        "REINFORCE++ with the group mean reward as baseline.",
        advantage="reinforce_pp_baseline",
        kl_in="reward",
    ),
    "reinforce_pp_turn": _preset(
        "REINFORCE++ with turn-level credit: each turn's reward at its last token, and a turn's "
        "return compared with the group's mean return from the same turn on.",
        advantage="reinforce_pp_baseline",
        reduction="seq_mean_token_sum",
        kl_in="reward",
        reward_placement="per_turn",
        group_baseline="turn",
    ),
    "ppo": _preset(
        "PPO with GAE and a value head trained by the clipped value loss.",
        advantage="gae",
        critic="value_head",
    ),
    "gspo": _preset(
        "GSPO (Zheng et al. 2025): sequence-level importance ratio with tight clip ranges.",
        policy_loss="gspo",
        clip_low=3e-4,
        clip_high=4e-4,
        reduction="seq_mean_token_mean",
    ),
}
DEFAULT_ALGORITHM: Algorithm = "grpo"
#: The TrainConfig fields a preset sets.
PRESET_FIELDS: tuple[str, ...] = tuple(ALGORITHM_PRESETS[DEFAULT_ALGORITHM].values())
