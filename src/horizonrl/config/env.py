"""The ``env:`` section: which environment, its options, and where its tasks come from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from horizonrl.config.section import Section, check_user_file


class EnvConfig(Section):
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
            check_user_file(value, "env.tasks_file")
        return value
