"""A recipe loaded: the YAML file read, the overrides applied, the result validated, and every
problem reported as one line that names the key and what would be valid."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from horizonrl.config.overrides import apply_overrides
from horizonrl.config.run import RunConfig
from horizonrl.errors import ConfigError, bound_problem, read_user_text, shown_value
from horizonrl.secret import is_secret_name
from horizonrl.yamlsafe import load_yaml

#: Largest recipe file read (a recipe is a few KiB; this stops /dev/zero or a data file named by mistake).
MAX_RECIPE_BYTES = 4 * 2**20
#: Most problems listed in one error line (the count of the rest is said).
MAX_PROBLEMS = 5


def _section_model(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model that owns the field at ``loc`` (for listing valid keys)."""
    model: type[BaseModel] = RunConfig
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        annotation = field.annotation if field else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    return model


def format_validation_error(exc: ValidationError, source: str) -> str:
    lines = []
    errors = exc.errors()
    listed: set[Any] = set()  # sections whose valid keys are already listed
    for err in errors[:MAX_PROBLEMS]:
        loc = tuple(err["loc"])
        key = ".".join(str(p) for p in loc)
        if err["type"] == "extra_forbidden":
            owner = _section_model(loc)
            valid = sorted(owner.model_fields) if owner else []
            close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
            hint = f" Did you mean {'.'.join([*map(str, loc[:-1]), close[0]])!r}?" if close else ""
            keys = "" if owner in listed else f" Valid keys here: {', '.join(valid)}"
            listed.add(owner)
            lines.append(f"unknown key {key!r}" + (f".{hint}{keys}" if hint or keys else ""))
        elif (bound := bound_problem(key, err)) is not None:
            lines.append(bound)
        else:
            got = err.get("input")
            secret = err["type"] == "secret" or is_secret_name(str(loc[-1]) if loc else "")
            shown = f" (got {shown_value(got)})" if got is not None and not isinstance(got, dict) else ""
            shown = "" if secret else shown  # a secret's value is never echoed
            msg = str(err["msg"]).removeprefix("Value error, ")
            lines.append(f"{key}: {msg}{shown}")
    if len(errors) > MAX_PROBLEMS:
        lines.insert(0, f"{len(errors)} problems, the first {MAX_PROBLEMS}:")
        lines.append(f"and {len(errors) - MAX_PROBLEMS} more")
    return f"{source}: " + "; ".join(lines).replace(":;", ":", 1)


def read_recipe(path: Path) -> dict[str, Any]:
    """The mapping of sections in a YAML recipe; a missing, unreadable, empty or malformed file is a
    one-line ConfigError naming it."""
    source = str(path)
    try:
        size = path.stat().st_size if path.is_file() else 0
    except OSError:  # a path that cannot be looked at: the read below names why
        size = 0
    if size > MAX_RECIPE_BYTES:
        raise ConfigError(
            f"config file {source!r} is {size} bytes, over the limit of {MAX_RECIPE_BYTES} for a recipe; "
            "is it the right file?"
        )
    text = read_user_text(path, "config file", ConfigError)
    try:
        loaded = load_yaml(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        context, started = getattr(exc, "context", None), getattr(exc, "context_mark", None)
        if context and started is not None:
            problem += f" ({context} at line {started.line + 1}, column {started.column + 1})"
        raise ConfigError(f"{source}: not valid YAML{at}: {problem}") from None
    except ConfigError as exc:  # aliases that expand past the bound
        raise ConfigError(f"{source}: {exc}") from None
    if loaded is None:
        raise ConfigError(
            f"{source}: the file is empty; a recipe is a mapping of sections (model:, env:, train:, ...), "
            "e.g. configs/calc.yaml"
        )
    if not isinstance(loaded, dict):
        kind = type(loaded).__name__
        raise ConfigError(f"{source}: the top level must be a mapping of sections, got {kind}")
    return loaded


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """Read a YAML recipe, apply ``key.sub=value`` overrides, validate; ConfigError on any problem."""
    data: dict[str, Any] = {}
    source = "config"
    if path is not None:
        source = str(path)
        data = read_recipe(Path(path))
    data = apply_overrides(data, list(overrides or []))
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source)) from None
