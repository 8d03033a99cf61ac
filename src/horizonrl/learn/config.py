"""The ``learn:`` block of a recipe: which environments, which methods, how much budget."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from horizonrl.learn.methods import parse_method


class LearnEnv(BaseModel):
    """One environment a method learns on: an env name with its options, and its two task splits."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="A registered env name (see `horizon envs`), e.g. calc or world.")
    options: dict[str, Any] = Field(
        default_factory=dict, description="The env's options, e.g. {world: maze}."
    )
    label: str | None = Field(
        None, description="The name tables use (default: the world's name, or the env's)."
    )
    train_split: str = Field("train", description="Split of the levels candidates are optimized on.")
    val_split: str | None = Field(
        None,
        description="Split candidates are scored on (default: the env's held-out split: val, else test).",
    )
    train_tasks: int | None = Field(
        None, ge=1, le=100_000, description="Training levels per candidate (default learn.train_tasks)."
    )
    val_tasks: int | None = Field(
        None, ge=1, le=100_000, description="Validation levels per candidate (default learn.val_tasks)."
    )

    overrides: list[str] = Field(
        default_factory=list,
        description="Recipe overrides for this env alone, as key.sub=value (e.g. agent.max_turns=4).",
    )

    def title(self) -> str:
        if self.label:
            return self.label
        world = self.options.get("world")
        return str(world) if world and self.name == "world" else self.name


class ModelOptimizerConfig(BaseModel):
    """How the ``sft`` and ``grpo`` optimizers train the model component (with `horizon train`'s trainer)."""

    model_config = ConfigDict(extra="forbid")

    sft_demos: Literal["oracle", "self"] = Field(
        "oracle",
        description="sft: 'oracle' (the env's scripted oracle on training levels) or 'self' (the parent "
        "candidate's own successful training episodes: rejection-sampling fine-tuning).",
    )
    sft_num_demos: int = Field(48, ge=1, le=100_000, description="sft: demonstrations per optimization.")
    sft_epochs: int = Field(1, ge=1, le=1_000, description="sft: passes over the demonstrations.")
    grpo_steps: int = Field(2, ge=1, le=1_000_000, description="grpo: optimizer steps per optimization.")
    grpo_tasks_per_step: int = Field(8, ge=1, le=4_096, description="grpo: training levels per step.")
    grpo_group_size: int = Field(4, ge=2, le=1_024, description="grpo: samples per level (the group).")


class LearnConfig(BaseModel):
    """Component-centric learning (`horizon learn`): methods = selection x optimization x target."""

    model_config = ConfigDict(extra="forbid")

    envs: list[LearnEnv] = Field(
        default_factory=list, description="Environments to learn on (empty: the recipe's env alone)."
    )
    methods: list[str] = Field(
        default_factory=lambda: ["best/dynamics/prompt"],
        description="Methods as selection/optimization/target: selections best, pareto; optimizations "
        "dynamics, instruction (targets prompt, agent_code) and sft, grpo (target model); or 'all'.",
    )
    iterations: int = Field(2, ge=1, le=10_000, description="Optimization iterations per method and env (K).")
    probe_iterations: int = Field(
        1,
        ge=1,
        le=10_000,
        description="Adaptive choice: iterations each method gets before the pick by validation reward.",
    )
    bandit: bool = Field(
        True,
        description="Also run a UCB1 bandit that spends len(methods) x iterations iterations per env on the "
        "most promising methods, reported beside the even split.",
    )
    bandit_c: float = Field(0.5, ge=0.0, description="UCB1 exploration weight.")
    train_tasks: int = Field(
        8, ge=1, le=100_000, description="Training levels a candidate plays per evaluation."
    )
    val_tasks: int = Field(10, ge=1, le=100_000, description="Validation levels a candidate is scored on.")
    recent_trajectories: int = Field(
        6, ge=1, description="Training episodes (failures first) the optimizer reads per optimization."
    )
    step_chars: int = Field(
        240, ge=40, description="Each action and observation is cut to this for the optimizer."
    )
    optimizer_temperature: float = Field(
        0.7, ge=0.0, description="Sampling temperature of the optimizer role."
    )
    optimizer_max_tokens: int = Field(
        512, ge=16, le=131_072, description="Most tokens of an optimizer reply."
    )
    max_prompt_tokens: int = Field(
        512, ge=1, description="A prompt component longer than this (tokens) is rejected with its length."
    )
    code_timeout_s: float = Field(
        5.0, gt=0, description="Seconds one call of an agent-code candidate may take."
    )
    code_max_asks: int = Field(
        3, ge=1, le=8, description="Model calls an agent-code candidate may make per turn."
    )
    model: ModelOptimizerConfig = Field(default_factory=ModelOptimizerConfig)

    @field_validator("methods")
    @classmethod
    def _known_methods(cls, value: list[str]) -> list[str]:
        from horizonrl.learn.methods import ALL_METHODS

        if value == ["all"]:
            return list(ALL_METHODS)
        for name in value:
            parse_method(name)  # raises ValueError naming the valid ones
        if len(set(value)) != len(value):
            raise ValueError(f"methods are listed twice: {value}")
        return value
