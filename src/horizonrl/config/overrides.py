"""``key.sub=value`` overrides: parsed, and set in a recipe's nested mapping."""

from __future__ import annotations

from typing import Any

import yaml

from horizonrl.errors import ConfigError
from horizonrl.yamlsafe import YAMLBombError, load_yaml


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
        value = load_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    except YAMLBombError as exc:
        raise ConfigError(f"override {key.strip()!r}: {exc}") from None
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
