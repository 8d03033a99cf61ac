"""The world DSL: ``world.yaml``, validated by pydantic (unknown keys and bad values are errors that
name the key).

A world file has these sections (AutoEnv's DSL, with our names where theirs were loose)::

    name: maze                      # lower-case identifier, the world's directory name
    description: ...                # one paragraph: what the world is
    axes: {skill: navigation, reward: binary, observation: full}
    state_template: {agent: "[row, col]", ...}   # the state's keys and what they hold (documentation)
    observation: {default: full, radius: 2, opaque: "#", mask_p: 0.3}
    reward: {kind: binary}          # binary: 1 on success; cumulative: a sum, max computed per level
    transition:
      actions:                      # the world's actions, which become the env's tools
        move:
          description: Move one cell.
          params: {direction: {type: string, enum: [north, south, east, west]}}
    skin:
      default: aligned
      variants:                     # each: a glyph and a name per cell code and term
        aligned: {glyphs: {"#": "#"}, names: {"#": wall, goal: exit}}
        inverse: {...}              # the same codes and terms, other names
    termination: {max_steps: 30}
    generator: {seed: 7, train_levels: 10, val_levels: 5, params: {size: 7}}
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from horizonrl.errors import ConfigError

SKILLS = ("navigation", "memory", "resource", "pattern", "planning")
OBSERVATION_KINDS = ("full", "radius", "line_of_sight", "mask")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Axes(_Strict):
    skill: Literal["navigation", "memory", "resource", "pattern", "planning"]
    reward: Literal["binary", "cumulative"]
    observation: Literal["full", "partial"]


class Observation(_Strict):
    default: Literal["full", "radius", "line_of_sight", "mask"] = "full"
    radius: int = Field(2, ge=0, description="Chebyshev radius of the `radius` policy.")
    opaque: str = Field("#", description="Cell codes that block sight for `line_of_sight`.")
    mask_p: float = Field(0.3, ge=0.0, le=1.0, description="Share hidden per step by `mask`.")

    def policy(self, kind: str | None = None) -> dict[str, Any]:
        """The observation policy ``kind`` (default: this world's) as :func:`worldlib.observe` takes it."""
        kind = kind or self.default
        if kind not in OBSERVATION_KINDS:
            raise ConfigError(f"unknown observation policy {kind!r}; valid: {', '.join(OBSERVATION_KINDS)}")
        return {"kind": kind, "radius": self.radius, "opaque": self.opaque, "p": self.mask_p}


class Reward(_Strict):
    kind: Literal["binary", "cumulative"]


class Param(_Strict):
    type: Literal["string", "integer"]
    description: str = ""
    enum: list[str] | None = None
    minimum: int | None = None
    maximum: int | None = None

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type}
        if self.description:
            out["description"] = self.description
        if self.enum is not None:
            out["enum"] = list(self.enum)
        if self.minimum is not None:
            out["minimum"] = self.minimum
        if self.maximum is not None:
            out["maximum"] = self.maximum
        return out


class ActionSpec(_Strict):
    description: str
    params: dict[str, Param] = Field(default_factory=dict)


class Transition(_Strict):
    actions: dict[str, ActionSpec] = Field(min_length=1)

    @field_validator("actions")
    @classmethod
    def _names(cls, actions: dict[str, ActionSpec]) -> dict[str, ActionSpec]:
        for name in actions:
            if not re.fullmatch(r"[a-z][a-z0-9_]{0,39}", name):
                raise ValueError(f"action name {name!r} must be a lower-case identifier")
        return actions


class SkinVariant(_Strict):
    glyphs: dict[str, str] = Field(default_factory=dict)
    names: dict[str, str] = Field(default_factory=dict)


class Skin(_Strict):
    default: str = "aligned"
    variants: dict[str, SkinVariant] = Field(min_length=1)

    @model_validator(mode="after")
    def _default_exists(self) -> Skin:
        if self.default not in self.variants:
            raise ValueError(
                f"default skin {self.default!r} is not among variants ({', '.join(self.variants)})"
            )
        keys = {name: (set(v.glyphs), set(v.names)) for name, v in self.variants.items()}
        first, (g0, n0) = next(iter(keys.items()))
        for name, (g, n) in keys.items():
            if (g, n) != (g0, n0):
                raise ValueError(
                    f"skin {name!r} names other codes or terms than skin {first!r}: a skin may change "
                    "only what things are called, so every variant covers the same ones"
                )
        return self


class Termination(_Strict):
    max_steps: int = Field(ge=1, le=1000)


class Generator(_Strict):
    seed: int = 0
    train_levels: int = Field(10, ge=1, le=1000)
    val_levels: int = Field(5, ge=1, le=1000)
    params: dict[str, Any] = Field(default_factory=dict)


class WorldSpec(_Strict):
    """A parsed ``world.yaml``."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,39}$")
    description: str
    axes: Axes
    state_template: dict[str, str] = Field(default_factory=dict)
    observation: Observation = Field(default_factory=Observation)
    reward: Reward
    transition: Transition
    skin: Skin
    termination: Termination
    generator: Generator = Field(default_factory=Generator)

    @model_validator(mode="after")
    def _consistent(self) -> WorldSpec:
        if self.reward.kind != self.axes.reward:
            raise ValueError(
                f"reward.kind {self.reward.kind!r} differs from axes.reward {self.axes.reward!r}"
            )
        return self


def _owner(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model that holds the key at ``loc`` (dict keys such as action names are stepped over)."""
    model: type[BaseModel] | None = WorldSpec
    value_model: type[BaseModel] | None = None
    for part in loc[:-1]:
        if model is None:
            if value_model is None:
                return None
            model, value_model = value_model, None
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        ann = field.annotation
        args = getattr(ann, "__args__", ())
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
        elif args and isinstance(args[-1], type) and issubclass(args[-1], BaseModel):
            model, value_model = None, args[-1]  # a dict of models: the next part is a key
        else:
            return None
    return model if model is not None else value_model


def format_errors(exc: ValidationError, source: str) -> str:
    """One line naming each wrong key and what is valid there."""
    parts = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        key = ".".join(str(p) for p in loc) or "(top level)"
        if err["type"] == "extra_forbidden":
            owner = _owner(loc)
            valid = ", ".join(sorted(owner.model_fields)) if owner else "see docs/worlds.md"
            parts.append(f"unknown key {key!r}; valid keys here: {valid}")
        else:
            msg = str(err["msg"]).removeprefix("Value error, ")
            parts.append(f"{key}: {msg}")
    return f"{source}: " + "; ".join(parts)


def parse_spec(data: Any, source: str) -> WorldSpec:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a world file is a mapping of sections (name:, axes:, transition:, ...)")
    try:
        return WorldSpec.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_errors(exc, source)) from None


def load_spec(path: Path) -> WorldSpec:
    """The world file at ``path``; a missing, malformed or invalid one is a one-line ConfigError."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the world file ({exc.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}: not valid YAML{at}: {getattr(exc, 'problem', exc)}") from None
    return parse_spec(data, str(path))
