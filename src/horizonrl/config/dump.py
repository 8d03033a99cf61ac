"""A config written out: one value as an override writes it, a whole config as YAML."""

from __future__ import annotations

from typing import Any

import yaml
from pydantic_core import to_jsonable_python

from horizonrl.config.run import RunConfig


def format_value(value: Any) -> str:
    """``value`` as one line of YAML, the way an override writes it (``null``, ``true``, ``0.0005``,
    ``[a, b]``; a string quoted only where YAML would read it as something else)."""
    text = yaml.safe_dump(to_jsonable_python(value), default_flow_style=True, width=1 << 20).strip()
    return text.removesuffix("\n...").strip()


def dump_config(config: RunConfig) -> str:
    """The resolved config as YAML (what runs/<name>/config.yaml holds)."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
