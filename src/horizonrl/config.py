"""Run configuration: one YAML file per recipe, validated by pydantic, overridable as ``key.sub=value``.

Every field is typed, has a visible default and a description: ``horizon config show CONFIG`` prints a
recipe resolved with each key's value, source and description, and docs/config.md is generated from
these models (``horizon config docs --out docs/config.md``). Unknown keys and bad values are errors
that name the key and what would be valid.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import to_jsonable_python

from horizonrl.agent.config import AgentConfig, StageTimeouts
from horizonrl.engine.base import SamplingParams
from horizonrl.errors import ConfigError, read_user_text
from horizonrl.evolve.config import AttributionConfig, ExperienceConfig, ExploreConfig
from horizonrl.learn.config import LearnConfig
from horizonrl.models import ModelConfig
from horizonrl.multiagent.config import MultiAgentConfig
from horizonrl.roles.config import RolesConfig
from horizonrl.rollout.base import RolloutLimits, RolloutMode
from horizonrl.rollout.failures import FailurePolicy
from horizonrl.runtime.config import RuntimeConfig
from horizonrl.stream.config import StreamConfig


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _check_user_file(path: Path, key: str) -> None:
    """A data file the config names must, where it exists, be a readable UTF-8 file (its reader
    reports a missing one)."""
    if path.exists():
        read_user_text(path, key)


class EnvConfig(_Section):
    """Which environment, its options, and where its tasks come from."""

    name: str = Field(
        "calc", description="A registered env name (see `horizon envs`) or module:Class of an Env subclass."
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="Env-specific options, validated by the env."
    )
    tasks_file: Path | None = Field(
        None, description="JSONL file of tasks (one Task per line); default: the env generates tasks."
    )

    @field_validator("tasks_file")
    @classmethod
    def _readable_tasks(cls, value: Path | None) -> Path | None:
        if value is not None:
            _check_user_file(value, "env.tasks_file")
        return value


class EngineConfig(_Section):
    """The inference engine: in-process (``hf``), an OpenAI-compatible server that returns token ids
    (``openai``), or vLLM on a GPU (``vllm``)."""

    kind: Literal["hf", "openai", "vllm"] = Field(
        "hf",
        description="'hf': the in-process engine (CPU or GPU). 'openai': a server that answers token-id "
        "completions with logprobs (a vLLM server, horizon serve). 'vllm': vLLM's async engine on a GPU.",
    )
    base_url: str | None = Field(None, description="openai: the server, e.g. http://gpu-node:8000/v1.")
    served_model: str | None = Field(None, description="openai: the model id the server serves.")
    api_key_env: str = Field("OPENAI_API_KEY", description="openai: the variable holding the server's key.")
    weight_sync: Literal["horizon", "vllm_lora", "none"] = Field(
        "horizon",
        description="openai: how trained weights reach the server — 'horizon' (horizon serve's weights "
        "endpoint, the whole merged policy), 'vllm_lora' (vLLM's load_lora_adapter, a new adapter name "
        "per version), 'none' (evaluation only).",
    )
    sync_dir: Path | None = Field(
        None, description="openai/vllm: where synced weights are written (a directory the server can read)."
    )
    gpu_memory_utilization: float = Field(
        0.85, gt=0, le=1, description="vllm: share of GPU memory it may use."
    )
    max_batch_size: int = Field(32, ge=1, description="Most generation requests decoded together.")
    batch_wait_s: float = Field(
        0.005, ge=0.0, description="How long the engine waits for more requests after the first arrives."
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "bfloat16",
        description="Weights dtype of the sampling model in every command; 'auto' = model.dtype. During "
        "training the engine holds its own copy in this dtype, refreshed from the policy after every "
        "optimizer step; eval and rollout build theirs the same way, so a reloaded policy samples as the "
        "run did "
        "(bfloat16 decoding measured 3.4x faster than float32 on a 2-core AVX512-BF16 CPU).",
    )
    prefix_cache_tokens: int = Field(
        16384,
        ge=0,
        description="Tokens of KV cache kept from finished requests, so the next turn of a conversation "
        "prefills only its new tokens (0 turns it off; ~23 KB per token for SmolLM2-135M in bfloat16).",
    )
    mmap_threshold_mib: float = Field(
        0.0,
        ge=0.0,
        description="Allocations of at least this many MiB get their own mmap, returned to the OS when "
        "freed (glibc's mallopt M_MMAP_THRESHOLD, fixed). 0 keeps glibc's sliding threshold. 1 bounds a "
        "long run's memory: measured on a 100-episode eval, peak 3.54 -> 2.82 GiB for 15% more time.",
    )
    continuous_batching: bool = Field(
        True,
        description="Requests that arrive while a batch decodes join it at the next token, and each request "
        "is answered as soon as its row finishes (off: static batches; a request waits for the running "
        "batch to end).",
    )

    @model_validator(mode="after")
    def _kind_fields(self) -> EngineConfig:
        if self.kind == "openai" and not (self.base_url and self.served_model):
            raise ValueError("engine.kind openai needs engine.base_url and engine.served_model")
        if self.kind != "openai" and (self.base_url or self.served_model):
            raise ValueError("engine.base_url and engine.served_model are for engine.kind openai")
        return self


class RolloutConfig(_Section):
    """How rollouts are scheduled (every rollout: training steps, evals, `horizon rollout`) and what
    `horizon rollout` samples."""

    mode: RolloutMode = Field(
        "pipeline",
        description="'pipeline': init -> run -> eval stages over bounded queues, each trajectory on its "
        "own; 'lockstep': waves advanced turn by turn (the baseline of single-turn RL frameworks).",
    )
    split: str = Field("train", description="Task split `horizon rollout` samples from.")
    num_tasks: int = Field(16, ge=1, description="Number of tasks of `horizon rollout`.")
    samples_per_task: int = Field(1, ge=1, description="Trajectories per task (the group size for GRPO).")
    concurrency: int = Field(
        16,
        ge=1,
        description="Run slots of `horizon rollout`: episodes inside the multi-turn loop at once "
        "(train.concurrency and eval.concurrency set them for training and evals).",
    )
    seed: int = Field(0, description="Seed of the task generator for this split.")
    init_workers: int | None = Field(
        None, ge=1, description="Environments prepared at once (default: the run slots)."
    )
    eval_workers: int | None = Field(
        None, ge=1, description="Rewards computed at once (default: the run slots)."
    )
    queue_size: int | None = Field(
        None,
        ge=1,
        description="Bound of the init->run and run->eval queues (default: the run slots); memory is "
        "bounded by the queues, not by the number of tasks.",
    )
    init_timeout_s: float | None = Field(
        600.0,
        gt=0,
        description="Limit on making and resetting one env (null: none); exceeding it ends "
        "the trajectory as 'timeout'.",
    )
    run_timeout_s: float | None = Field(
        None, gt=0, description="Limit on one episode's multi-turn loop (null: none)."
    )
    eval_timeout_s: float | None = Field(
        600.0, gt=0, description="Limit on one episode's reward computation (null: none)."
    )
    on_failure: FailurePolicy = Field(
        "drop_trajectory",
        description="Trajectories that ended in 'error' or 'timeout' (an env, engine or reward failure): "
        "'drop_trajectory' leaves them out of the loss and their group's baseline, 'drop_group' leaves "
        "out their whole group, 'zero_reward' keeps them with reward 0.",
    )

    def limits(self, run_slots: int | None = None) -> RolloutLimits:
        """The scheduler's limits, with ``run_slots`` (default: ``concurrency``)."""
        slots = run_slots or self.concurrency
        return RolloutLimits(
            run_slots=slots,
            init_workers=self.init_workers or slots,
            eval_workers=self.eval_workers or slots,
            queue_size=self.queue_size or slots,
            timeouts=StageTimeouts(
                init_s=self.init_timeout_s, run_s=self.run_timeout_s, eval_s=self.eval_timeout_s
            ),
        )


class EvalConfig(_Section):
    """Held-out evaluation (`horizon eval`)."""

    split: str = Field("test", description="Held-out task split.")
    num_tasks: int = Field(100, ge=1, description="Number of held-out tasks.")
    seed: int = Field(0, description="Seed of the held-out task generator (fixed, so evals compare).")
    temperature: float = Field(0.0, ge=0.0, description="Sampling temperature for eval; 0 is greedy.")
    concurrency: int = Field(32, ge=1, description="Episodes in flight at once.")
    tasks: Literal["run", "env"] = Field(
        "run",
        description="Where held-out tasks come from: 'run' — where the run's tasks come from "
        "(env.tasks_file, else the env's generator); 'env' — the env's own split even when env.tasks_file "
        "is set (a held-out set the env ships, while training reads e.g. synthesized tasks).",
    )
    majority_vote: int = Field(
        1,
        ge=1,
        description="Role graphs (multiagent.graph): episodes per task whose final answers vote (MV@k; "
        "sampled at multiagent.malt.temperature when k > 1).",
    )


# The optimizer settings every trainer shares, declared once: each alias holds the type, the bounds and
# the description; a section that needs another default redeclares the field with the same alias.
LearningRate = Annotated[float, Field(gt=0, description="AdamW learning rate.")]
WeightDecay = Annotated[float, Field(ge=0, description="AdamW weight decay.")]
WarmupSteps = Annotated[int, Field(ge=0, description="Linear learning-rate warm-up steps.")]
MaxGradNorm = Annotated[float, Field(gt=0, description="Gradient clipping (global L2 norm).")]
MicroBatchTokens = Annotated[
    int,
    Field(
        ge=64,
        description="Most padded tokens per forward/backward (gradient accumulation); a prompt "
        "prefix all rows share counts once.",
    ),
]


class OptimizerSettings(_Section):
    """AdamW, its schedule and gradient accumulation: the keys sft, dpo and train share (flat in each
    section). A section whose defaults differ redeclares those fields with the same annotated type,
    so the bounds and descriptions stay the ones declared here."""

    lr: LearningRate = 1e-4
    weight_decay: WeightDecay = 0.0
    warmup_steps: WarmupSteps = 0
    max_grad_norm: MaxGradNorm = 1.0
    micro_batch_tokens: MicroBatchTokens = 4096


class SFTConfig(OptimizerSettings):
    """Supervised warm start from demonstrations (`horizon sft`, or inside `horizon train` when enabled)."""

    lr: LearningRate = 1e-3
    warmup_steps: WarmupSteps = 2

    enabled: bool = Field(False, description="Run SFT as the first stage of `horizon train`.")
    demos: str = Field(
        "oracle",
        description="'oracle' (episodes of the env's scripted oracle) or a JSONL file of trajectory records.",
    )
    num_demos: int = Field(128, ge=1, description="Oracle episodes to generate (or most records to read).")
    split: str = Field("train", description="Task split the oracle demonstrations are drawn from.")
    seed: int = Field(
        1000, description="Task seed of the demonstrations (kept apart from the RL task stream by default)."
    )
    only_successful: bool = Field(True, description="Train only on demonstrations with success (reward > 0).")
    epochs: int = Field(1, ge=1, description="Passes over the demonstrations.")
    batch_size: int = Field(8, ge=1, description="Trajectories per optimizer step.")

    @field_validator("demos")
    @classmethod
    def _readable_demos(cls, value: str) -> str:
        if value != "oracle":
            _check_user_file(Path(value), "sft.demos")
        return value


class DPOConfig(OptimizerSettings):
    """Direct preference optimization on chosen/rejected conversation pairs (`horizon dpo`). A pair's
    chosen and rejected sequences always share a micro-batch."""

    pairs: Path | None = Field(
        None,
        description="JSONL file of preference pairs, one {id?, prompt, chosen, rejected} object per line "
        "(OpenAI chat messages; see docs/dpo.md). Required by `horizon dpo`.",
    )
    max_pairs: int | None = Field(
        None, ge=1, description="Use only the first this many pairs of the file (null: all)."
    )
    beta: float = Field(
        0.1,
        gt=0,
        allow_inf_nan=False,
        description="Strength of the pull towards the reference (the starting policy): the implicit "
        "reward is beta * (policy logp - reference logp); larger keeps the policy closer.",
    )
    length_normalize: bool = Field(
        False,
        description="Score a response by the mean of its token logprobs instead of their sum "
        "(IPO/SimPO-style; removes the bias towards short responses).",
    )
    epochs: int = Field(1, ge=1, description="Passes over the pairs.")
    batch_size: int = Field(8, ge=1, description="Pairs per optimizer step.")

    @field_validator("pairs")
    @classmethod
    def _readable_pairs(cls, value: Path | None) -> Path | None:
        if value is not None:
            _check_user_file(value, "dpo.pairs")
        return value


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


#: Every ``train.algorithm`` and the value it gives each preset field (no field is left to a fallback).
ALGORITHM_PRESETS: dict[Algorithm, AlgorithmPreset] = {
    "grpo": AlgorithmPreset(
        about="GRPO (Shao et al. 2024) with DAPO's clip-higher and token-level loss; the default.",
        advantage="grpo",
        norm_by_std=True,
        policy_loss="ppo_clip",
        clip_low=0.2,
        clip_high=0.28,
        reduction="token_mean",
        kl_in="loss",
        critic="none",
        dynamic_sampling=False,
        overlong_filter=False,
        reward_placement="final",
        group_baseline="episode",
    ),
    "dr_grpo": AlgorithmPreset(
        about="Dr.GRPO (Liu et al. 2025): no std division, no length normalisation inside a sequence.",
        advantage="grpo",
        norm_by_std=False,
        policy_loss="ppo_clip",
        clip_low=0.2,
        clip_high=0.2,
        reduction="seq_mean_token_sum",
        kl_in="loss",
        critic="none",
        dynamic_sampling=False,
        overlong_filter=False,
        reward_placement="final",
        group_baseline="episode",
    ),
    "dapo": AlgorithmPreset(
        about="DAPO (Yu et al. 2025): clip-higher, token-level loss, dynamic sampling, overlong filtering.",
        advantage="grpo",
        norm_by_std=True,
        policy_loss="ppo_clip",
        clip_low=0.2,
        clip_high=0.28,
        reduction="token_mean",
        kl_in="loss",
        critic="none",
        dynamic_sampling=True,
        overlong_filter=True,
        reward_placement="final",
        group_baseline="episode",
    ),
    "rloo": AlgorithmPreset(
        about="RLOO (Ahmadian et al. 2024): leave-one-out baseline.",
        advantage="rloo",
        norm_by_std=True,
        policy_loss="ppo_clip",
        clip_low=0.2,
        clip_high=0.2,
        reduction="token_mean",
        kl_in="loss",
        critic="none",
        dynamic_sampling=False,
        overlong_filter=False,
        reward_placement="final",
        group_baseline="episode",
    ),
    "reinforce_pp": AlgorithmPreset(
        about="REINFORCE++ (Hu et al. 2025): token returns, batch whitening, KL (when on) in the reward.",
        advantage="reinforce_pp",
        norm_by_std=True,
        policy_loss="ppo_clip",
        clip_low=0.2,
        clip_high=0.2,
        reduction="token_mean",
        kl_in="reward",
        critic="none",
        dynamic_sampling=False,
        overlong_filter=False,
        reward_placement="final",
        group_baseline="episode",
    ),
    "reinforce_pp_baseline": AlgorithmPreset(
        about="REINFORCE++ with the group mean reward as baseline.",
        advantage="reinforce_pp_baseline",
        norm_by_std=True,
        policy_loss="ppo_clip",
        clip_low=0.2,
        clip_high=0.2,
        reduction="token_mean",
        kl_in="reward",
        critic="none",
        dynamic_sampling=False,
        overlong_filter=False,
        reward_placement="final",
        group_baseline="episode",
    ),
    "reinforce_pp_turn": AlgorithmPreset(
        about="REINFORCE++ with turn-level credit: each turn's reward at its last token, and a turn's "
        "return compared with the group's mean return from the same turn on.",
        advantage="reinforce_pp_baseline",
        norm_by_std=True,
        policy_loss="ppo_clip",
        clip_low=0.2,
        clip_high=0.2,
        reduction="seq_mean_token_sum",
        kl_in="reward",
        critic="none",
        dynamic_sampling=False,
        overlong_filter=False,
        reward_placement="per_turn",
        group_baseline="turn",
    ),
    "ppo": AlgorithmPreset(
        about="PPO with GAE and a value head trained by the clipped value loss.",
        advantage="gae",
        norm_by_std=True,
        policy_loss="ppo_clip",
        clip_low=0.2,
        clip_high=0.2,
        reduction="token_mean",
        kl_in="loss",
        critic="value_head",
        dynamic_sampling=False,
        overlong_filter=False,
        reward_placement="final",
        group_baseline="episode",
    ),
    "gspo": AlgorithmPreset(
        about="GSPO (Zheng et al. 2025): sequence-level importance ratio with tight clip ranges.",
        advantage="grpo",
        norm_by_std=True,
        policy_loss="gspo",
        clip_low=3e-4,
        clip_high=4e-4,
        reduction="seq_mean_token_mean",
        kl_in="loss",
        critic="none",
        dynamic_sampling=False,
        overlong_filter=False,
        reward_placement="final",
        group_baseline="episode",
    ),
}
DEFAULT_ALGORITHM: Algorithm = "grpo"
#: The TrainConfig fields a preset sets.
PRESET_FIELDS: tuple[str, ...] = tuple(ALGORITHM_PRESETS[DEFAULT_ALGORITHM].values())
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
    steps: int = Field(20, ge=0, description="Optimizer steps (one rollout batch each).")
    tasks_per_step: int = Field(4, ge=1, description="Tasks (groups) per step.")
    group_size: int = Field(
        8, ge=1, description="Rollouts per task (G); advantages are normalised per group."
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
        "showing it (detectors: 1.1, 1.3, 1.5, 2.1, 3.1; any of the 14 with failure_judge); the outcome "
        "reward is logged apart.",
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
    demo_batch: int = Field(8, ge=1, description="Demonstrations per optimizer step of the demo_coef term.")
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
        3, ge=1, description="Most rollout rounds per step with dynamic sampling."
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
    ppo_epochs: int = Field(1, ge=1, description="Passes over each rollout batch.")
    mini_batches: int = Field(
        1, ge=1, description="Optimizer steps per pass (the rollout batch split into mini-batches)."
    )
    autocast: Literal["auto", "bfloat16", "none"] = Field(
        "auto",
        description="Mixed precision for forward/backward (float32 master weights); 'auto': bfloat16 "
        "where this machine computes it natively (a GPU, or a CPU with AVX512-BF16 or AMX), else none.",
    )

    @property
    def autocast_dtype(self) -> Any:
        """The torch dtype autocast runs in, or None (``autocast`` resolved on this machine)."""
        import torch

        from horizonrl.hardware import native_bfloat16

        on = self.autocast == "bfloat16" or (self.autocast == "auto" and native_bfloat16())
        return torch.bfloat16 if on else None

    concurrency: int = Field(32, ge=1, description="Episodes in flight during a step's rollouts.")
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


class RunConfig(_Section):
    """A whole recipe."""

    name: str = Field(
        "run",
        description="Run name: outputs go to output_dir/name. One plain directory name: no '/' or '\\', "
        "not empty and not starting with '.' (so never '.', '..' or output_dir/.trash).",
    )
    output_dir: Path = Field(Path("runs"), description="Parent directory of run directories.")
    seed: int = Field(0, description="Global seed (model init for random models, sampling).")
    model: ModelConfig = Field(default_factory=ModelConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    dpo: DPOConfig = Field(default_factory=DPOConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    runtime: RuntimeConfig = Field(
        default_factory=RuntimeConfig,
        description="Where the workers live: local (in this process) or ray (env workers and engine "
        "replicas as actors on a local or existing Ray cluster).",
    )
    explore: ExploreConfig = Field(
        default_factory=ExploreConfig,
        description="Self-questioning: how the explorer role probes a world (breadth, then depth) and "
        "how the synthesizer role turns what it did into tasks.",
    )
    experience: ExperienceConfig = Field(
        default_factory=ExperienceConfig,
        description="Self-navigating: an experience pool the extractor role fills from finished "
        "trajectories; some samples of each task see its retrieved experiences, stripped before training.",
    )
    attribution: AttributionConfig = Field(
        default_factory=AttributionConfig,
        description="Self-attributing (ADCA-GRPO): the judge role labels every step GOOD or BAD; step "
        "advantages fuse the labels with the outcome.",
    )
    multiagent: MultiAgentConfig = Field(
        default_factory=MultiAgentConfig,
        description="Multi-agent systems: a role graph (gvr, chat_chain) with a policy (LoRA adapter) per "
        "role, and MALT's tree sampling and role-wise training.",
    )
    learn: LearnConfig = Field(
        default_factory=LearnConfig,
        description="Component-centric learning (`horizon learn`): methods (selection x optimization x "
        "target) over prompts, agent code and model weights, on one or more envs.",
    )
    stream: StreamConfig = Field(
        default_factory=StreamConfig,
        description="Experience streams (`horizon stream`): a task source, the reward as weighted grounded "
        "signals, and the feedback loop that moves the weights.",
    )
    roles: RolesConfig = Field(
        default_factory=RolesConfig,
        description="Which backend (policy, local, openai) serves each LLM role: judges, explorers, "
        "synthesizers, extractors, coders, optimizers, annotators, verifiers.",
    )

    @field_validator("name")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        if not value or value.startswith(".") or any(c in value for c in "/\\\0"):
            raise ValueError(
                "must be one plain directory name under output_dir (not empty, no '/' or '\\', "
                "not starting with '.'), e.g. name=calc-lr3e-4"
            )
        return value

    @model_validator(mode="after")
    def _check_failure_penalties(self) -> RunConfig:
        from horizonrl.analysis.detectors import DETECTORS
        from horizonrl.analysis.mast import MODE_IDS

        tc = self.train
        valid = MODE_IDS if tc.failure_judge else tuple(DETECTORS)
        unknown = sorted(set(tc.failure_penalties) - set(valid))
        if unknown:
            raise ConfigError(
                f"train.failure_penalties names mode(s) {', '.join(unknown)} "
                + ("that are not MAST modes" if tc.failure_judge else "that no detector finds")
                + f"; valid: {', '.join(valid)}"
                + ("" if tc.failure_judge else " (train.failure_judge=true allows all 14)")
            )
        return self

    @model_validator(mode="after")
    def _check_demo_term(self) -> RunConfig:
        if self.train.demo_coef > 0 and self.runtime.trainer_ranks > 0:
            raise ConfigError(
                "train.demo_coef trains in the driver only, not in runtime.trainer_ranks "
                f"({self.runtime.trainer_ranks}); set runtime.trainer_ranks=0 or train.demo_coef=0"
            )
        return self

    @model_validator(mode="after")
    def _check_attribution(self) -> RunConfig:
        if self.attribution.enabled and self.train.advantage not in SEQUENCE_ADVANTAGES:
            raise ConfigError(
                f"attribution.enabled replaces the group advantages, so train.advantage must be one of "
                f"{', '.join(SEQUENCE_ADVANTAGES)}, not {self.train.advantage!r}"
            )
        return self

    @model_validator(mode="after")
    def _check_env(self) -> RunConfig:
        from horizonrl.envs.registry import get_env_class, parse_env_options

        cls = get_env_class(self.env.name)
        parse_env_options(self.env.name, self.env.options)
        splits = [] if self.env.tasks_file is not None else [("rollout.split", self.rollout.split)]
        if self.env.tasks_file is None or self.eval.tasks == "env":
            splits.append(("eval.split", self.eval.split))
        if self.env.tasks_file is None and self.sft.enabled:  # a disabled SFT stage reads no tasks
            splits.append(("sft.split", self.sft.split))
        for key, split in splits:
            if split not in cls.splits():
                valid = ", ".join(cls.splits())
                raise ConfigError(f"{key}: env {self.env.name!r} has no split {split!r}; valid: {valid}")
        return self

    @property
    def run_dir(self) -> Path:
        """``output_dir/name``; a ConfigError when it resolves (through symlinks) to a place that is
        not strictly inside output_dir, so nothing a run writes or removes lands outside it."""
        run_dir = self.output_dir / self.name
        root, resolved = self.output_dir.resolve(), run_dir.resolve()
        if resolved == root or not resolved.is_relative_to(root):
            raise ConfigError(
                f"run directory {str(run_dir)!r} resolves to {str(resolved)!r}, outside output_dir "
                f"{str(self.output_dir)!r}; remove the link or choose another name (name=...)"
            )
        return run_dir


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``a.b.c=value`` into (["a", "b", "c"], value), the value read as YAML (so 3 is an int,
    true a bool, [1, 2] a list and anything else a string)."""
    if "=" not in text:
        hint = " (flags such as --resume take no value)" if text.lower() in ("true", "false") else ""
        raise ConfigError(f"override {text!r} is not of the form key.sub=value{hint}")
    key, raw = text.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"override {text!r} has an empty key part")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return parts, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set each ``key.sub=value`` in a nested dict (creating sections as needed)."""
    for text in overrides:
        parts, value = parse_override(text)
        node = data
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {'.'.join(parts[: i + 1])} is a value, not a section")
            node = child
        node[parts[-1]] = value
    return data


def _section_model(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model that owns the field at ``loc`` (for listing valid keys)."""
    model: type[BaseModel] = RunConfig
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        annotation = field.annotation if field else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    return model


def format_validation_error(exc: ValidationError, source: str) -> str:
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        key = ".".join(str(p) for p in loc)
        if err["type"] == "extra_forbidden":
            owner = _section_model(loc)
            valid = sorted(owner.model_fields) if owner else []
            close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
            hint = f" Did you mean {'.'.join([*map(str, loc[:-1]), close[0]])!r}?" if close else ""
            lines.append(f"unknown key {key!r}.{hint} Valid keys here: {', '.join(valid)}")
        else:
            got = err.get("input")
            shown = f" (got {got!r})" if got is not None and not isinstance(got, dict) else ""
            msg = str(err["msg"]).removeprefix("Value error, ")
            lines.append(f"{key}: {msg}{shown}")
    return f"{source}: " + "; ".join(lines)


def read_recipe(path: Path) -> dict[str, Any]:
    """The mapping of sections in a YAML recipe; a missing, unreadable, empty or malformed file is a
    one-line ConfigError naming it."""
    source = str(path)
    text = read_user_text(path, "config file", ConfigError)
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        context, started = getattr(exc, "context", None), getattr(exc, "context_mark", None)
        if context and started is not None:
            problem += f" ({context} at line {started.line + 1}, column {started.column + 1})"
        raise ConfigError(f"{source}: not valid YAML{at}: {problem}") from None
    if loaded is None:
        raise ConfigError(
            f"{source}: the file is empty; a recipe is a mapping of sections (model:, env:, train:, ...), "
            "e.g. configs/calc.yaml"
        )
    if not isinstance(loaded, dict):
        kind = type(loaded).__name__
        raise ConfigError(f"{source}: the top level must be a mapping of sections, got {kind}")
    return loaded


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """Read a YAML recipe, apply ``key.sub=value`` overrides, validate; ConfigError on any problem."""
    data: dict[str, Any] = {}
    source = "config"
    if path is not None:
        source = str(path)
        data = read_recipe(Path(path))
    data = apply_overrides(data, list(overrides or []))
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source)) from None


ConfigSource = Literal["override", "file", "preset", "default"]


@dataclass(frozen=True)
class ConfigEntry:
    """One key of a resolved config: its dotted name, value, where the value came from and what it
    means."""

    key: str
    value: Any
    source: ConfigSource
    description: str


def _given(tree: dict[str, Any], key: tuple[str, ...]) -> tuple[bool, Any]:
    """Whether the nested mapping ``tree`` sets ``key`` (a path of section names), and its value."""
    node: Any = tree
    for part in key:
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def explain_config(path: str | Path | None, overrides: list[str] | None = None) -> list[ConfigEntry]:
    """Every key of the recipe resolved as :func:`load_config` resolves it (env options included, as
    the env reads them), each with its value, its description and where the value came from: a
    command-line ``override``, the recipe ``file``, the ``preset`` of ``train.algorithm``, or the
    ``default``. ConfigError on any problem, as load_config."""
    from horizonrl.envs.registry import parse_env_options

    config = load_config(path, overrides)
    recipe = read_recipe(Path(path)) if path is not None else {}
    given = apply_overrides({}, list(overrides or []))
    entries: list[ConfigEntry] = []

    def source(key: tuple[str, ...]) -> ConfigSource:
        preset_field = key[:-1] == ("train",) and key[-1] in PRESET_FIELDS
        for tree, name in ((given, "override"), (recipe, "file")):
            found, value = _given(tree, key)
            if found and not (preset_field and value is None):  # null: the preset's value
                return name  # type: ignore[return-value]
        return "preset" if preset_field else "default"

    def walk(model: BaseModel, prefix: tuple[str, ...]) -> None:
        for name, field in type(model).model_fields.items():
            key, value = (*prefix, name), getattr(model, name)
            if key == ("env", "options"):
                value = parse_env_options(config.env.name, value)
            if isinstance(value, BaseModel):
                walk(value, key)
                continue
            entries.append(
                ConfigEntry(".".join(key), to_jsonable_python(value), source(key), field.description or "")
            )

    walk(config, ())
    return entries


def format_value(value: Any) -> str:
    """``value`` as one line of YAML, the way an override writes it (``null``, ``true``, ``0.0005``,
    ``[a, b]``; a string quoted only where YAML would read it as something else)."""
    text = yaml.safe_dump(to_jsonable_python(value), default_flow_style=True, width=1 << 20).strip()
    return text.removesuffix("\n...").strip()


def dump_config(config: RunConfig) -> str:
    """The resolved config as YAML (what runs/<name>/config.yaml holds)."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
