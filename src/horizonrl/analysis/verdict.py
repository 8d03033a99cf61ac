"""A finding about one MAST mode on one trace, from a detector or the judge."""

from __future__ import annotations

from pydantic import BaseModel, Field

from horizonrl.analysis.mast import TAXONOMY_VERSION


class Verdict(BaseModel):
    """One mode's finding on one trace."""

    mode: str
    present: bool
    steps: list[int] = Field(default_factory=list)
    role: str | None = None
    reason: str = ""
    source: str = Field("detector", description="'detector' or 'judge'")
    version: str = TAXONOMY_VERSION
