"""Level generation: draw each split's levels from the world's generator and solve each with its
planner, storing the level, its maximum reward and the planner's plan."""

from __future__ import annotations

from horizonrl.worlds.package import SPLITS, LevelRecord, WorldPackage, level_seed
from horizonrl.worlds.runner import WorldRunner


async def make_level(package: WorldPackage, runner: WorldRunner, split: str, index: int) -> LevelRecord:
    gen = package.spec.generator
    seed = level_seed(gen.seed, split, index)
    level = (await runner.call({"op": "generate", "seed": seed, "params": gen.params}))["level"]
    solved = await runner.call(
        {"op": "solve", "level": level, "max_steps": package.spec.termination.max_steps}, timeout=60.0
    )
    return LevelRecord(
        index=index, seed=seed, level=level, max_reward=float(solved["max_reward"]), plan=solved["plan"]
    )


async def make_levels(package: WorldPackage, runner: WorldRunner) -> dict[str, list[LevelRecord]]:
    """Every split's levels (``generator.train_levels`` and ``generator.val_levels`` of them)."""
    counts = {"train": package.spec.generator.train_levels, "val": package.spec.generator.val_levels}
    return {
        split: [await make_level(package, runner, split, i) for i in range(counts[split])] for split in SPLITS
    }
