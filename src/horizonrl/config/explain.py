"""``horizon config show``: every key of a resolved recipe with its value, its description and where
the value came from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from horizonrl.config.algorithms import PRESET_FIELDS
from horizonrl.config.load import load_config, read_recipe
from horizonrl.config.overrides import apply_overrides
from horizonrl.secret import Secret

ConfigSource = Literal["override", "file", "preset", "default"]


@dataclass(frozen=True)
class ConfigEntry:
    """One key of a resolved config: its dotted name, value, where the value came from and what it
    means."""

    key: str
    value: Any
    source: ConfigSource
    description: str


def _given(tree: dict[str, Any], key: tuple[str, ...]) -> tuple[bool, Any]:
    """Whether the nested mapping ``tree`` sets ``key`` (a path of section names), and its value."""
    node: Any = tree
    for part in key:
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def explain_config(path: str | Path | None, overrides: list[str] | None = None) -> list[ConfigEntry]:
    """Every key of the recipe resolved as :func:`load_config` resolves it (env options included, as
    the env reads them), each with its value, its description and where the value came from: a
    command-line ``override``, the recipe ``file``, the ``preset`` of ``train.algorithm``, or the
    ``default``. A secret's value is shown as ``***``. ConfigError on any problem, as load_config."""
    from horizonrl.envs.registry import parse_env_options

    config = load_config(path, overrides)
    recipe = read_recipe(Path(path)) if path is not None else {}
    given = apply_overrides({}, list(overrides or []))
    entries: list[ConfigEntry] = []

    def source(key: tuple[str, ...]) -> ConfigSource:
        preset_field = key[:-1] == ("train",) and key[-1] in PRESET_FIELDS
        for tree, name in ((given, "override"), (recipe, "file")):
            found, value = _given(tree, key)
            if found and not (preset_field and value is None):  # null: the preset's value
                return name  # type: ignore[return-value]
        return "preset" if preset_field else "default"

    def walk(model: BaseModel, prefix: tuple[str, ...]) -> None:
        for name, field in type(model).model_fields.items():
            key, value = (*prefix, name), getattr(model, name)
            if key == ("env", "options"):
                value = parse_env_options(config.env.name, value)
            if isinstance(value, BaseModel):
                walk(value, key)
                continue
            if isinstance(value, Secret):  # *** (a reference, ${env:NAME}, as itself): never the value
                value = str(value)
            entries.append(
                ConfigEntry(".".join(key), to_jsonable_python(value), source(key), field.description or "")
            )

    walk(config, ())
    return entries
