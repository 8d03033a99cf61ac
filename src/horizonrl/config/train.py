"""The ``train:`` section: RL training, its ``train.algorithm`` preset applied to the fields the
config leaves out."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from horizonrl.config.algorithms import (
    ALGORITHM_PRESETS,
    DEFAULT_ALGORITHM,
    GROUP_ADVANTAGES,
    PRESET_FIELDS,
    SEQUENCE_ADVANTAGES,
    Advantage,
    Algorithm,
    Critic,
    GroupBaseline,
    KLPlacement,
    LossReduction,
    PolicyLoss,
    RewardPlacement,
)
from horizonrl.config.optimizer import OptimizerSettings
from horizonrl.hardware import bfloat16_trains_faster

#: The preset fields' defaults (what the schema and the docs show): the default algorithm's values.
_DEFAULT_PRESET = ALGORITHM_PRESETS[DEFAULT_ALGORITHM]


class TrainConfig(OptimizerSettings):
    """RL training (`horizon train`). ``algorithm`` picks a preset (ALGORITHM_PRESETS) that gives every
    field marked "(preset)" its value; a key the config sets itself wins over the preset (null: the
    preset's value). The defaults shown for those fields are the default algorithm's (grpo)."""

    algorithm: Algorithm = Field(
        DEFAULT_ALGORITHM,
        description="Preset: grpo, dr_grpo, dapo, rloo, reinforce_pp, reinforce_pp_baseline, "
        "reinforce_pp_turn, ppo, gspo "
        "(the presets table of docs/config.md lists what each sets; docs/algorithms.md explains them).",
    )
    steps: int = Field(20, ge=0, le=1_000_000, description="Optimizer steps (one rollout batch each).")
    tasks_per_step: int = Field(4, ge=1, le=4_096, description="Tasks (groups) per step.")
    group_size: int = Field(
        8, ge=1, le=1_024, description="Rollouts per task (G); advantages are normalised per group."
    )
    advantage: Advantage = Field(
        _DEFAULT_PRESET.advantage,
        description="(preset) Advantage estimator: grpo (group-normalised; Dr.GRPO with norm_by_std "
        "false), rloo (leave-one-out), reinforce_pp, reinforce_pp_baseline (group mean baseline), "
        "gae (needs critic: value_head).",
    )
    norm_by_std: bool = Field(
        _DEFAULT_PRESET.norm_by_std,
        description="(preset) Divide group-centred rewards by the group's std (GRPO; off: Dr.GRPO).",
    )
    policy_loss: PolicyLoss = Field(
        _DEFAULT_PRESET.policy_loss,
        description="(preset) ppo_clip (token ratio, clip_low/clip_high, optional dual_clip), gspo "
        "(sequence-level ratio) or is (plain importance sampling, no clipping).",
    )
    clip_low: float = Field(
        _DEFAULT_PRESET.clip_low, ge=0, lt=1, description="(preset) Ratio clip below 1 (1 - clip_low)."
    )
    clip_high: float = Field(
        _DEFAULT_PRESET.clip_high,
        ge=0,
        description="(preset) Ratio clip above 1 (1 + clip_high; > clip_low is DAPO's clip-higher).",
    )
    dual_clip: float | None = Field(
        None, gt=1, description="Dual-clip PPO bound for negative advantages (e.g. 3.0; null: off)."
    )
    failure_penalties: dict[str, float] = Field(
        default_factory=dict,
        description="Failures as signals: MAST mode id -> penalty subtracted from the reward of a sample "
        "showing it (detectors: 1.1, 1.3, 1.5, 2.1, 3.1, 3.2, and on chat-chain traces all but 2.2; "
        "any of the 14 with failure_judge); the outcome reward is logged apart.",
    )
    failure_judge: bool = Field(
        False,
        description="Also ask the annotator role (roles.annotator) about every sample's penalised modes.",
    )
    reduction: LossReduction = Field(
        _DEFAULT_PRESET.reduction,
        description="(preset) Loss reduction: token_mean, seq_mean_token_mean, seq_mean_token_sum (Dr.GRPO).",
    )
    entropy_coef: float = Field(0.0, ge=0, description="Entropy bonus weight (0 = off).")
    kl_coef: float = Field(
        0.0, ge=0, description="Weight of the KL penalty to the starting policy (0 = off)."
    )
    kl_kind: Literal["k1", "k2", "k3", "forward_topk"] = Field(
        "k3",
        description="KL estimator: k1, k2, k3 estimate KL(policy || start) from the sampled tokens; "
        "forward_topk is KL(start || policy) at each position over the start's kl_topk most likely "
        "tokens and the rest as one (it pulls back a token the policy stopped sampling; kl_in: loss).",
    )
    kl_topk: int = Field(
        32, ge=1, le=4096, description="Tokens per position of the forward_topk KL (the start's most likely)."
    )
    demo_coef: float = Field(
        0.0,
        ge=0,
        description="Weight of a supervised term in every optimizer step: the mean NLL of demo_batch "
        "demonstrations (sft.demos, the SFT stage's), InstructGPT's PPO-ptx (0 = off).",
    )
    demo_batch: int = Field(
        8, ge=1, le=4_096, description="Demonstrations per optimizer step of the demo_coef term."
    )
    negative_weight: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Scale of the negative advantages: 1 trains on both signs; 0 reinforces only what "
        "did better than its baseline (positive-sample reinforcement, no push-down of sampled tokens); "
        "between, a weaker push-down.",
    )
    kl_in: KLPlacement = Field(
        _DEFAULT_PRESET.kl_in,
        description="(preset) Where the KL penalty goes: a loss term, or per-token in the reward.",
    )
    critic: Critic = Field(
        _DEFAULT_PRESET.critic,
        description="(preset) 'value_head': a linear value head on the policy's last hidden state, "
        "trained with the clipped value loss (needed by advantage gae).",
    )
    vf_coef: float = Field(0.5, ge=0, description="Weight of the value loss (critic value_head).")
    vf_clip: float | None = Field(
        0.2, gt=0, description="Clip range of the value loss around the old values (null: unclipped)."
    )
    gamma: float = Field(
        1.0, ge=0, le=1, description="Discount across turns (token-level estimators reinforce_pp, gae)."
    )
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda.")
    reward_placement: RewardPlacement = Field(
        _DEFAULT_PRESET.reward_placement,
        description="(preset) 'final': the episode reward at the last model token; 'per_turn': each turn's "
        "turn_rewards at that turn's last model token and the rest of the episode reward at the last one, so "
        "they add up to it (reinforce_pp, gae).",
    )
    group_baseline: GroupBaseline = Field(
        _DEFAULT_PRESET.group_baseline,
        description="(preset) The group baseline of reinforce_pp_baseline: 'episode' subtracts the "
        "group's mean episode reward from every token's return; 'turn' subtracts from a turn-k "
        "token's return the group's mean return from turn k on, so each turn is compared with the "
        "same turn of its siblings (for reward_placement 'per_turn': a later turn is not pushed down "
        "by the reward its episode already earned).",
    )
    dynamic_sampling: bool = Field(
        _DEFAULT_PRESET.dynamic_sampling,
        description="(preset) DAPO dynamic sampling: drop groups whose rewards are all equal and roll "
        "out further tasks until tasks_per_step groups have signal (or max_sampling_rounds).",
    )
    max_sampling_rounds: int = Field(
        3, ge=1, le=100, description="Most rollout rounds per step with dynamic sampling."
    )
    overlong_filter: bool = Field(
        _DEFAULT_PRESET.overlong_filter,
        description="(preset) Mask trajectories cut by the token budget (finish context_overflow) out "
        "of the loss; they still count in their group's baseline.",
    )
    tis_cap: float | None = Field(
        None,
        ge=1,
        description="Truncated importance sampling: weight each token by min(pi_old / pi_sampler, "
        "tis_cap) to correct for the sampler's (stale or lower-precision) policy (null: off).",
    )
    max_staleness: int = Field(
        0,
        ge=0,
        description="Most weight versions a sample may lag behind the trained policy (0: on-policy only). "
        "A sample whose turns come from different versions is never trained on.",
    )
    stale_samples: Literal["drop", "importance_weight"] = Field(
        "drop",
        description="What happens to samples older than max_staleness: dropped, or kept with truncated "
        "importance weights (needs tis_cap).",
    )
    ppo_epochs: int = Field(1, ge=1, le=100, description="Passes over each rollout batch.")
    mini_batches: int = Field(
        1, ge=1, le=4_096, description="Optimizer steps per pass (the rollout batch split into mini-batches)."
    )
    autocast: Literal["auto", "bfloat16", "none"] = Field(
        "auto",
        description="Mixed precision for forward/backward (float32 master weights); 'auto': bfloat16 "
        "where this machine trains faster in it (a GPU, or a CPU with AMX), else none.",
    )

    @property
    def autocast_dtype(self) -> Any:
        """The torch dtype autocast runs in, or None (``autocast`` resolved on this machine)."""
        import torch

        on = self.autocast == "bfloat16" or (self.autocast == "auto" and bfloat16_trains_faster())
        return torch.bfloat16 if on else None

    concurrency: int = Field(32, ge=1, le=4_096, description="Episodes in flight during a step's rollouts.")
    eval_every: int = Field(5, ge=0, description="Held-out eval every N steps (0: only before and after).")
    save_every: int = Field(5, ge=0, description="Checkpoint every N steps (0: only at the end).")
    keep_checkpoints: int = Field(2, ge=1, description="Most recent checkpoints kept.")

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        """Give each preset field the input leaves out (or sets to null) its value in the preset of
        ``algorithm``; an unknown algorithm is left to field validation, which names the valid ones."""
        if not isinstance(data, dict):
            return data
        algorithm = data.get("algorithm", DEFAULT_ALGORITHM)
        preset = ALGORITHM_PRESETS.get(algorithm) if isinstance(algorithm, str) else None
        if preset is None:
            return data
        given = {k: v for k, v in data.items() if not (k in PRESET_FIELDS and v is None)}
        return preset.values() | given

    @model_validator(mode="after")
    def _check_combination(self) -> TrainConfig:
        """Refuse combinations that cannot train (each message names the key and what would be valid)."""
        for error in self._incompatibilities():
            raise ValueError(error)
        return self

    def _incompatibilities(self) -> list[str]:
        errors = []
        if self.advantage == "gae" and self.critic != "value_head":
            errors.append(
                "train.advantage='gae' needs a critic: set train.critic=value_head (valid critics: "
                "none, value_head), or choose an estimator without one: grpo, rloo, reinforce_pp, "
                "reinforce_pp_baseline"
            )
        if self.critic == "value_head" and self.advantage != "gae":
            errors.append(
                f"train.critic='value_head' is only used by train.advantage='gae' (got "
                f"{self.advantage!r}); set train.critic=none or train.advantage=gae"
            )
        if self.advantage in GROUP_ADVANTAGES and self.group_size < 2:
            errors.append(
                f"train.advantage={self.advantage!r} compares samples of a task with each other and "
                f"needs train.group_size >= 2 (got {self.group_size}); with one sample per task use "
                "reinforce_pp or gae"
            )
        if self.dynamic_sampling and self.group_size < 2:
            errors.append("train.dynamic_sampling needs train.group_size >= 2 (every group of 1 is flat)")
        if self.stale_samples == "importance_weight" and self.tis_cap is None:
            errors.append(
                "train.stale_samples='importance_weight' weights stale samples by truncated importance "
                "sampling: set train.tis_cap (e.g. 2.0), or train.stale_samples=drop"
            )
        if self.reward_placement == "per_turn" and self.advantage in SEQUENCE_ADVANTAGES:
            errors.append(
                f"train.reward_placement='per_turn' needs a token-level estimator (reinforce_pp, "
                f"reinforce_pp_baseline or gae); train.advantage={self.advantage!r} uses one scalar "
                "reward per trajectory (train.algorithm=reinforce_pp_turn sets a per-turn recipe)"
            )
        if self.group_baseline == "turn" and self.advantage != "reinforce_pp_baseline":
            errors.append(
                f"train.group_baseline='turn' is the baseline of train.advantage='reinforce_pp_baseline' "
                f"(got {self.advantage!r}); set train.group_baseline=episode, or "
                "train.algorithm=reinforce_pp_turn (that baseline with per-turn rewards)"
            )
        if self.dual_clip is not None and self.policy_loss != "ppo_clip":
            errors.append(
                f"train.dual_clip applies to policy_loss 'ppo_clip' only (got {self.policy_loss!r}); "
                "set train.dual_clip=null"
            )
        if self.kl_kind == "forward_topk" and self.kl_in == "reward" and self.kl_coef > 0:
            errors.append(
                "train.kl_kind='forward_topk' compares whole next-token distributions, a loss term "
                "with no per-token reward form; set train.kl_in=loss (or train.kl_kind=k1, k2 or k3)"
            )
        elif self.kl_in == "reward" and self.advantage in SEQUENCE_ADVANTAGES and self.kl_coef > 0:
            errors.append(
                f"train.kl_in='reward' puts a per-token penalty in the reward, which the sequence-level "
                f"estimator {self.advantage!r} cannot use; set train.kl_in=loss (or a token-level "
                "estimator: reinforce_pp, reinforce_pp_baseline, gae)"
            )
        return errors

    @property
    def updates_per_step(self) -> int:
        """Optimizer steps per rollout batch (``ppo_epochs`` x ``mini_batches``)."""
        return self.ppo_epochs * self.mini_batches
