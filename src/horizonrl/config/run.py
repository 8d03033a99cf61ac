"""The whole recipe: :class:`RunConfig` composes every section and checks what spans sections."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator, model_validator

from horizonrl.agent.config import AgentConfig
from horizonrl.config.algorithms import SEQUENCE_ADVANTAGES
from horizonrl.config.dpo import DPOConfig
from horizonrl.config.eval import EvalConfig
from horizonrl.config.rollout import RolloutConfig
from horizonrl.config.section import Section
from horizonrl.config.sft import SFTConfig
from horizonrl.config.tracking import (
    DEFAULT_TRACKING,
    MlflowConfig,
    TrackingBackend,
    WandbConfig,
    check_tracking_list,
)
from horizonrl.config.train import TrainConfig
from horizonrl.engine.base import SamplingParams
from horizonrl.engine.config import EngineConfig
from horizonrl.envs.config import EnvConfig
from horizonrl.errors import ConfigError
from horizonrl.evolve.config import AttributionConfig, ExperienceConfig, ExploreConfig
from horizonrl.learn.config import LearnConfig
from horizonrl.model_config import ModelConfig
from horizonrl.multiagent.config import MultiAgentConfig
from horizonrl.roles.config import RolesConfig
from horizonrl.runtime.config import RuntimeConfig
from horizonrl.stream.config import StreamConfig


class RunConfig(Section):
    """A whole recipe."""

    name: str = Field(
        "run",
        description="Run name: outputs go to output_dir/name. One plain directory name: no '/' or '\\', "
        "not empty and not starting with '.' (so never '.', '..' or output_dir/.trash).",
    )
    output_dir: Path = Field(Path("runs"), description="Parent directory of run directories.")
    seed: int = Field(
        0, ge=-(2**62), le=2**62, description="Global seed (model init for random models, sampling)."
    )
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

    tracking: list[TrackingBackend] = Field(
        default_factory=lambda: list(DEFAULT_TRACKING),
        description="Where a training run's metrics go, any of jsonl, tensorboard, mlflow, wandb; jsonl "
        "(metrics.jsonl) always. mlflow and wandb are extras (pip install 'horizonrl[mlflow]', "
        "'horizonrl[wandb]'), set up by the mlflow: and wandb: blocks.",
    )
    mlflow: MlflowConfig = Field(
        default_factory=MlflowConfig,
        description="MLflow tracking (tracking lists mlflow): the store, experiment and artifacts.",
    )
    wandb: WandbConfig = Field(
        default_factory=WandbConfig,
        description="Weights & Biases tracking (tracking lists wandb): offline or online, project, entity.",
    )

    @field_validator("tracking")
    @classmethod
    def _tracking_list(cls, value: list[str]) -> list[str]:
        return check_tracking_list(value)

    @model_validator(mode="after")
    def _check_tracking_blocks(self) -> RunConfig:
        for name in ("mlflow", "wandb"):  # a setting away from its default for a backend not chosen
            block = getattr(self, name)
            default = type(block)()
            given = [key for key in type(block).model_fields if getattr(block, key) != getattr(default, key)]
            if given and name not in self.tracking:
                raise ConfigError(
                    f"{name}.{given[0]} is set but tracking does not list {name}; add it: "
                    f"tracking=[{', '.join([*self.tracking, name])}]"
                )
        return self

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
    def _check_lora_sync(self) -> RunConfig:
        lora_sync = self.engine.kind == "vllm" or (
            self.engine.kind == "openai" and self.engine.weight_sync == "vllm_lora"
        )
        if lora_sync and self.model.finetune != "lora":
            what = "engine.kind vllm" if self.engine.kind == "vllm" else "engine.weight_sync vllm_lora"
            raise ConfigError(
                f"{what} syncs LoRA adapters, and model.finetune is {self.model.finetune!r}: use "
                "model.finetune lora, or engine.kind openai with engine.weight_sync horizon (the whole "
                "policy) against horizon serve"
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
