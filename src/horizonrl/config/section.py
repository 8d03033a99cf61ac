"""What every section of a recipe shares: unknown keys are errors, and a data file a key names is
checked as it is read."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from horizonrl.errors import read_user_text


class Section(BaseModel):
    """A section of a recipe: a key it does not declare is an error."""

    model_config = ConfigDict(extra="forbid")


def check_user_file(path: Path, key: str) -> None:
    """A data file the config names must, where it exists, be a readable UTF-8 file (its reader
    reports a missing one)."""
    if path.exists():
        read_user_text(path, key)
