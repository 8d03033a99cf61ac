"""The ``multiagent:`` block of a recipe: which role graph plays, each role's adapter, MALT's settings."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from horizonrl.multiagent.values import ROLES


class MaltConfig(BaseModel):
    """MALT: tree sampling over training questions, then role-wise SFT and DPO (`horizon malt`)."""

    model_config = ConfigDict(extra="forbid")

    n: int = Field(3, ge=2, le=8, description="Branches per stage (n**3 leaves per question).")
    temperature: float = Field(0.3, ge=0.0, description="Sampling temperature of the tree's nodes.")
    threshold: float = Field(
        0.5, ge=0.0, le=1.0, description="A node is positive when its value is above this (at it: negative)."
    )
    questions: int = Field(32, ge=1, le=100_000, description="Training questions to build trees for.")
    split: str = Field("train", description="Task split the questions come from.")
    seed: int = Field(
        0, ge=-(2**62), le=2**62, description="Seed of the question generator and of the tree's sampling."
    )
    concurrency: int = Field(4, ge=1, le=4_096, description="Questions whose trees are sampled at once.")
    dpo_roles: list[str] = Field(
        default_factory=lambda: ["verifier", "refiner"],
        description="Roles trained with DPO after SFT (MALT: verifier and refiner).",
    )

    @field_validator("dpo_roles")
    @classmethod
    def _roles(cls, value: list[str]) -> list[str]:
        unknown = [r for r in value if r not in ROLES]
        if unknown:
            raise ValueError(f"unknown role(s) {', '.join(unknown)}; roles: {', '.join(ROLES)}")
        return value


class MultiAgentConfig(BaseModel):
    """A role graph instead of a single agent (`horizon eval`, `horizon malt`)."""

    model_config = ConfigDict(extra="forbid")

    graph: Literal["gvr", "chat_chain"] | None = Field(
        None,
        description="The role graph: 'gvr' (generator -> verifier -> refiner) or 'chat_chain' "
        "(ChatDev-style phases of instructor/assistant pairs); None: a single agent.",
    )
    chain: str | None = Field(
        None,
        description="A chat chain instead of a graph: a shipped chain ('software_company': CEO, CTO, "
        "programmer, reviewer and tester writing, reviewing and testing code in the env's workspace) or "
        "a chain YAML file (docs/multiagent.md); it runs on envs with a workspace (humaneval).",
    )
    adapters: dict[str, Path] = Field(
        default_factory=dict,
        description="Role -> LoRA adapter directory on model.path (a policy or PEFT adapter); roles not "
        "listed sample from the base model. `horizon malt train` writes one per role.",
    )
    max_new_tokens: int = Field(256, ge=1, le=131_072, description="Most tokens of one role turn.")
    max_turns: int = Field(
        4, ge=1, le=1_000, description="chat_chain: turn cap of each phase's conversation."
    )
    structured: bool = Field(
        False,
        description="gvr: hold the verifier's replies to a JSON verdict object (critique, then 'correct' "
        "or 'incorrect') by constrained decoding, instead of free text ending 'Verdict: ...'.",
    )
    malt: MaltConfig = Field(default_factory=MaltConfig)

    @model_validator(mode="after")
    def _one_team(self) -> MultiAgentConfig:
        if self.graph is not None and self.chain is not None:
            raise ValueError(
                f"multiagent.graph ({self.graph}) and multiagent.chain ({self.chain}) are both set; a run "
                "plays one team: keep one of them"
            )
        return self
