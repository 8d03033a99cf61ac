"""The ``explore:`` block of a recipe: how self-questioning explores a world and writes tasks."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from horizonrl.errors import ConfigError, read_user_text


class ExploreConfig(BaseModel):
    """Exploration by the explorer role (breadth, then depth) and synthesis by the synthesizer role."""

    model_config = ConfigDict(extra="forbid")

    explorer: Literal["role", "walk"] = Field(
        "role",
        description="Who explores: 'role' — the explorer role of the roles config (a model; the policy by "
        "default); 'walk' — a scripted random walk over the operations with arguments from the values the "
        "world has shown (for when no model at hand writes usable tool calls).",
    )
    synthesizer: Literal["role", "template"] = Field(
        "role",
        description="Who writes each task's request: 'role' — the synthesizer role of the roles config; "
        "'template' — templates that put the task's checker into words. The reference solution and the "
        "checker come from the world either way.",
    )
    breadth_probes: int = Field(
        2,
        ge=0,
        le=10_000,
        description="Breadth phase: short sessions per operation of the world (each probes that operation).",
    )
    breadth_steps: int = Field(2, ge=1, le=10_000, description="Turns of each breadth session.")
    depth_sessions: int = Field(
        8, ge=0, le=10_000, description="Depth phase: sessions that chain operations."
    )
    depth_steps: int = Field(6, ge=1, le=10_000, description="Turns of each depth session.")
    temperature: float = Field(
        1.0, ge=0, description="The explorer's sampling temperature (high: varied probes)."
    )
    max_tokens: int = Field(
        128, ge=8, le=131_072, description="Tokens per explorer turn and per synthesized query."
    )
    synth_temperature: float = Field(0.7, ge=0, description="The synthesizer's sampling temperature.")
    preferences: list[str] = Field(
        default_factory=lambda: ["easy", "medium", "hard"],
        description="Difficulties to ask for, in turn (keys of the profile's task_preferences).",
    )
    max_query_chars: int = Field(400, ge=20, description="Longer synthesized queries are dropped.")
    jaccard_duplicate: float = Field(
        0.8, gt=0, le=1, description="Queries whose word sets overlap this much (Jaccard) are duplicates."
    )
    guided: bool = Field(
        False,
        description="Choose each call's operation for the explorer (breadth: the probed one; depth: "
        "drawn by the seed) and ask it only for the arguments, as JSON: for explorers too weak to write "
        "tool calls in the agent's format (the embedded 135M model).",
    )
    focused: bool = Field(
        False,
        description="One goal per task: a state-changing call and the calls that gave its arguments, "
        "instead of everything the session changed so far (unrelated changes drop out).",
    )
    max_per_signature: int | None = Field(
        None,
        ge=1,
        description="Keep at most this many tasks whose references call the same operations in the same "
        "order (null: no cap), so that the easiest kind found most often does not crowd out the others.",
    )
    embedding_duplicate: float | None = Field(
        0.9,
        gt=0,
        le=1,
        description="Queries whose sentence embeddings (all-MiniLM-L6-v2) have at least this cosine "
        "similarity are duplicates; null turns the embedding check off.",
    )
    worlds: int = Field(
        1,
        ge=1,
        le=1_000,
        description="Worlds to explore: the k-th session of each phase explores world k % worlds "
        "(``world_seed`` in the task data, for envs whose worlds take a seed, such as flights); its tasks "
        "are replayed and checked in that world.",
    )
    concurrency: int = Field(16, ge=1, le=4_096, description="Sessions explored at once.")


class ExperienceConfig(BaseModel):
    """Self-navigating: an experience pool extracted from finished trajectories, retrieved into some
    of each task's samples as an ``<EXP>`` block, stripped before training."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(False, description="Use the experience pool during RL.")
    eta: float = Field(
        0.5, ge=0, le=1, description="Share of each task's samples that get its experiences: round(eta * n)."
    )
    top_k: int = Field(3, ge=1, description="Experiences retrieved per task (cosine over 'when to use').")
    max_size: int = Field(
        256, ge=1, le=1_000_000, description="Most experiences kept (the least retrieved go first)."
    )
    duplicate: float = Field(
        0.9, gt=0, le=1, description="'When to use' embeddings this similar (cosine) make a duplicate."
    )
    clip_high: float = Field(
        0.6,
        ge=0,
        description="Upper clip of experience-guided samples (on-policy ones keep train.clip_high); with "
        "train.dual_clip the wider bound only lifts positive-advantage tokens.",
    )
    extract_per_step: int = Field(
        4,
        ge=0,
        le=4_096,
        description="Tasks per RL step whose finished samples the extractor role learns from.",
    )
    max_tokens: int = Field(256, ge=16, le=131_072, description="Tokens of an extractor reply.")
    seed: Path | None = Field(
        None,
        description="JSONL of experiences put in the pool before the first step, one "
        '{"when_to_use": ..., "content": ...} object per line (written by hand, by a capable extractor, '
        "or taken from another run); each is validated like an extractor's. Extraction adds to them.",
    )

    @field_validator("seed")
    @classmethod
    def _readable_seed(cls, value: Path | None) -> Path | None:
        if value is not None:
            read_user_text(value, "experience.seed", ConfigError)  # missing or unreadable: one line
        return value


class AttributionConfig(BaseModel):
    """Self-attributing (ADCA-GRPO): the judge role labels each step GOOD or BAD and the advantages
    fuse those labels with the outcome (:func:`horizonrl.algos.advantages.adca`)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(False, description="Replace the group advantages with ADCA step advantages.")
    alpha: float = Field(
        0.1, ge=0, description="Weight of the z-scored step attribution against the outcome."
    )
    step_reward: float = Field(0.2, gt=0, description="Reward of a GOOD step (a BAD one gets its negative).")
    prm_steps: int | None = Field(
        None,
        ge=1,
        le=10_000,
        description="Attribute only the first this many steps of a trajectory (null: all).",
    )
    skip_no_signal: bool = Field(
        True,
        description="Do not ask the judge about groups whose outcomes are all equal (their outcome "
        "advantage is 0; attribution alone would then move them).",
    )
    max_tokens: int = Field(256, ge=16, le=131_072, description="Tokens of a judge reply.")
