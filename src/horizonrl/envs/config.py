"""The recipe's ``env:`` block: which environment, its options, and where its tasks come from (the
tasks, envs and oracle it makes: :mod:`horizonrl.envs.factory`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from horizonrl.errors import read_user_text


class EnvConfig(BaseModel):
    """Which environment, its options, and where its tasks come from."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        "calc", description="A registered env name (see `horizon envs`) or module:Class of an Env subclass."
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="Env-specific options, validated by the env."
    )
    tasks_file: Path | None = Field(
        None,
        description="JSONL file of tasks (one Task per line; another framework's env takes its own "
        "dataset rows, JSONL or Parquet); default: the env generates tasks.",
    )

    @field_validator("tasks_file")
    @classmethod
    def _readable_tasks(cls, value: Path | None) -> Path | None:
        # a missing file is reported as it is read; a .parquet one (another framework's dataset) is binary
        if value is not None and value.exists() and value.suffix != ".parquet":
            read_user_text(value, "env.tasks_file")
        return value
