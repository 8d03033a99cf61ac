"""A world package: a directory holding a world's DSL, its code, its levels and its instruction.

::

    maze/
      world.yaml          the DSL (:mod:`horizonrl.worlds.dsl`)
      world.py            the BaseEnv layer: a worldlib.World subclass bound to ``WORLD``, with its
                          level generator and planner (standard library and worldlib only)
      instruction.md      the agent's instruction, a template whose {term} fields the skin names
      levels/train.jsonl  training levels, one JSON object a line (index, seed, level, max_reward, plan)
      levels/val.jsonl    validation levels
      generated.json      only in worlds the generation pipeline wrote: its code runs only sandboxed

Shipped worlds live in ``horizonrl/worlds/shipped/``; any other directory is named by its path.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from horizonrl.errors import ConfigError, DataError
from horizonrl.worlds.dsl import WorldSpec, load_spec

SPLITS = ("train", "val")
REQUIRED_FILES = ("world.yaml", "world.py", "instruction.md")


class LevelRecord(BaseModel):
    """One line of a levels file."""

    model_config = ConfigDict(extra="forbid")

    index: int
    seed: int
    level: dict[str, Any]
    max_reward: float
    plan: list[tuple[str, dict[str, Any]]]


def shipped_root() -> Path:
    return Path(str(resources.files("horizonrl.worlds").joinpath("shipped")))


def shipped_names() -> list[str]:
    root = shipped_root()
    return sorted(p.name for p in root.iterdir() if (p / "world.yaml").is_file())


def level_seed(base: int, split: str, index: int) -> int:
    """The seed of level ``index`` of ``split``: distinct per split, stable across runs."""
    return base * 1000 + (500 if split == "val" else 0) + index


@dataclass
class WorldPackage:
    root: Path

    @cached_property
    def spec(self) -> WorldSpec:
        return load_spec(self.root / "world.yaml")

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def shipped(self) -> bool:
        return self.root.resolve().parent == shipped_root().resolve()

    @property
    def generated(self) -> bool:
        """Written by the generation pipeline: its code never runs in this process."""
        return (self.root / "generated.json").exists()

    @cached_property
    def instruction(self) -> str:
        return (self.root / "instruction.md").read_text(encoding="utf-8").strip()

    def skin(self, name: str | None = None) -> dict[str, Any]:
        name = name or self.spec.skin.default
        variants = self.spec.skin.variants
        if name not in variants:
            raise ConfigError(f"world {self.name!r} has no skin {name!r}; its skins: {', '.join(variants)}")
        return variants[name].model_dump()

    def levels_path(self, split: str) -> Path:
        return self.root / "levels" / f"{split}.jsonl"

    def levels(self, split: str) -> list[LevelRecord]:
        """The stored levels of ``split`` (train or val); a malformed line is a DataError naming it."""
        if split not in SPLITS:
            raise ConfigError(f"unknown level split {split!r}; valid: {', '.join(SPLITS)}")
        path = self.levels_path(split)
        if not path.is_file():
            raise DataError(f"{path}: missing; write the levels with `horizon worlds levels {self.root}`")
        out = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                out.append(LevelRecord.model_validate_json(line))
            except ValidationError as exc:
                err = exc.errors()[0]
                key = ".".join(str(p) for p in err["loc"]) or "(line)"
                raise DataError(
                    f"{path}:{n}: not a level record ({key}: {err['msg']}); a line holds index, seed, "
                    "level, max_reward and plan"
                ) from None
        return out

    def write_levels(self, split: str, records: list[LevelRecord]) -> None:
        path = self.levels_path(split)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(r.model_dump_json() + "\n" for r in records), encoding="utf-8")
        tmp.replace(path)

    def code_files(self) -> list[Path]:
        """The world's Python files (copied into its sandbox)."""
        return sorted(self.root.glob("*.py"))

    def summary(self) -> dict[str, Any]:
        s = self.spec
        return {
            "name": s.name,
            "skill": s.axes.skill,
            "reward": s.axes.reward,
            "observation": s.axes.observation,
            "observation_policy": s.observation.default,
            "skins": list(s.skin.variants),
            "actions": list(s.transition.actions),
            "max_steps": s.termination.max_steps,
        }


def open_world(name_or_path: str | Path) -> WorldPackage:
    """The world a user names: a shipped world's name or a world directory's path. Anything else is a
    one-line ConfigError naming what was found and what is valid."""
    text = str(name_or_path)
    shipped = shipped_names()
    if text in shipped:
        return WorldPackage(shipped_root() / text)
    path = Path(text).expanduser()
    if not path.exists():
        close = difflib.get_close_matches(text, shipped, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            f"unknown world {text!r}.{hint} Shipped worlds: {', '.join(shipped)}; or give a world directory"
        )
    if not path.is_dir():
        raise ConfigError(
            f"world {text!r} is a file; a world is a directory holding {', '.join(REQUIRED_FILES)}"
        )
    missing = [f for f in REQUIRED_FILES if not (path / f).is_file()]
    if missing:
        raise ConfigError(
            f"{path} is not a world directory: it has no {', '.join(missing)} (a world directory holds "
            f"{', '.join(REQUIRED_FILES)} and levels/)"
        )
    package = WorldPackage(path)
    package.spec  # noqa: B018  (parse now: a bad DSL is reported when the world is opened)
    return package


def world_names(spec: str) -> list[str]:
    """The worlds a config's ``world`` names: one name or path, a comma-separated list, or ``all``."""
    if spec.strip() == "all":
        return shipped_names()
    return [part.strip() for part in spec.split(",") if part.strip()]
