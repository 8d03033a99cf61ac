"""An eval suite: one policy evaluated on several recipes (``horizon eval SUITE.yaml``).

A suite file is told from a recipe by its top-level ``suite:`` key, a list of entries::

    name: demo                    # default: the file's stem; results go to output_dir/name
    output_dir: runs
    overrides: [eval.num_tasks=50]  # applied to every entry, before the entry's own
    suite:
      - recipe: configs/calc.yaml
      - recipe: configs/flights.yaml
        overrides: [agent.constrain=tool_calls]
      - recipe: configs/flights.yaml
        name: flights_free        # two entries of one recipe need names of their own

A relative ``recipe`` is looked up beside the suite file first, then from the current directory.
Every entry's recipe is loaded (with its overrides) when the suite is read, so a missing recipe or
a bad override is one line before any model loads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from horizonrl.config.load import load_config, read_recipe
from horizonrl.config.run import RunConfig
from horizonrl.config.section import Section
from horizonrl.errors import ConfigError, shown_value

SUITE_KEY = "suite"
#: Most entries one suite holds (each loads the policy and evaluates a recipe).
MAX_ENTRIES = 64


class SuiteEntry(Section):
    """One recipe of a suite."""

    recipe: Path = Field(description="The recipe (YAML) to evaluate, e.g. configs/calc.yaml.")
    name: str | None = Field(
        None, description="The entry's name in the table and its folder (default: the recipe's file stem)."
    )
    overrides: list[str] = Field(default_factory=list, description="key.sub=value overrides of this entry.")


class SuiteFile(Section):
    """A suite file."""

    name: str | None = Field(None, description="The suite's name (default: the file's stem).")
    output_dir: Path = Field(Path("runs"), description="Results go to output_dir/name/.")
    overrides: list[str] = Field(default_factory=list, description="Overrides applied to every entry.")
    suite: list[SuiteEntry] = Field(min_length=1, max_length=MAX_ENTRIES, description="The entries.")


@dataclass(frozen=True)
class Entry:
    """An entry resolved: its name, recipe file, the overrides it is evaluated with (the suite's,
    its own, the command line's, then its output folder) and the config they give."""

    name: str
    recipe: Path
    overrides: list[str]
    config: RunConfig


@dataclass(frozen=True)
class Suite:
    name: str
    path: Path
    out_dir: Path
    entries: list[Entry]


def is_suite(path: Path) -> bool:
    """Whether ``path`` is a readable YAML mapping with a top-level ``suite:`` key."""
    try:
        return Path(path).is_file() and SUITE_KEY in read_recipe(Path(path))
    except ConfigError:
        return False


def _plain_name(name: str, what: str) -> str:
    if not name or name.startswith(".") or any(c in name for c in "/\\\0"):
        raise ConfigError(
            f"{what}: name {name!r} must be one plain directory name (no '/' or '\\', not starting with '.')"
        )
    return name


def _problem(exc: ValidationError, source: str) -> ConfigError:
    err = exc.errors()[0]
    key = ".".join(str(p) for p in err["loc"]) or "(top level)"
    if err["type"] == "extra_forbidden":
        owner = SuiteEntry if len(err["loc"]) > 1 else SuiteFile
        return ConfigError(f"{source}: unknown key {key!r}; valid keys here: {', '.join(owner.model_fields)}")
    got = err.get("input")
    shown = f" (got {shown_value(got)})" if got is not None and not isinstance(got, dict) else ""
    msg = str(err["msg"]).removeprefix("Value error, ")
    return ConfigError(
        f"{source}: {key}: {msg}{shown}; a suite lists entries like '- recipe: configs/calc.yaml'"
    )


def _find_recipe(recipe: Path, suite_path: Path, what: str) -> Path:
    candidates = [recipe] if recipe.is_absolute() else [suite_path.parent / recipe, recipe]
    found = next((p for p in candidates if p.is_file()), None)
    if found is None:
        where = " or ".join(repr(str(p)) for p in dict.fromkeys(candidates))
        raise ConfigError(
            f"{what}: recipe {str(recipe)!r} not found (looked for {where}); name an existing "
            "recipe file, e.g. configs/calc.yaml"
        )
    if is_suite(found):
        raise ConfigError(f"{what}: {str(found)!r} is a suite itself; a suite's entries are recipes")
    return found


def read_suite(path: Path, overrides: list[str] | None = None) -> Suite:
    """Read and check a suite file and load every entry's config (``overrides``, the command
    line's, apply to every entry); any problem is one ConfigError naming the entry."""
    path = Path(path)
    data: dict[str, Any] = read_recipe(path)
    try:
        spec = SuiteFile.model_validate(data)
    except ValidationError as exc:
        raise _problem(exc, str(path)) from None
    name = _plain_name(spec.name or path.stem, f"{path}: suite")
    out_dir = spec.output_dir / name
    entries: list[Entry] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(spec.suite, 1):
        entry_name = _plain_name(item.name or item.recipe.stem, f"{path}: suite entry {i}")
        what = f"{path}: suite entry {i} ({entry_name})"
        if entry_name in seen:
            raise ConfigError(
                f"{what}: entry {seen[entry_name]} has the same name; give one of them a name: of its own"
            )
        seen[entry_name] = i
        recipe = _find_recipe(item.recipe, path, what)
        entry_overrides = [
            *spec.overrides,
            *item.overrides,
            *(overrides or []),
            f"output_dir={json.dumps(str(out_dir))}",  # quoted: read as a YAML string whatever it holds
            f"name={json.dumps(entry_name)}",
        ]
        try:
            config = load_config(recipe, entry_overrides)
        except ConfigError as exc:
            raise ConfigError(f"{what}: {exc}") from None
        entries.append(Entry(entry_name, recipe, entry_overrides, config))
    return Suite(name, path, out_dir, entries)
