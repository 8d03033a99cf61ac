"""One self-questioning run over a recipe's world: exploration, then synthesis (with the query
embedder when ``explore.embedding_duplicate`` is set), timed. ``horizon evolve questions`` and
``benchmarks/self_questioning.py`` both run it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from horizonrl.evolve.explore import ExplorationTrace, explore
from horizonrl.evolve.profile import env_profile
from horizonrl.evolve.synthesize import SynthesisReport, synthesize
from horizonrl.evolve.walk import walk
from horizonrl.types import Task


@dataclass
class Questions:
    """What a run explored and kept, with its report and times."""

    traces: list[ExplorationTrace]
    tasks: list[Task]
    report: SynthesisReport
    explore_s: float
    wall_s: float

    def figures(self) -> dict[str, Any]:
        """The report's counts with the times and the tasks synthesized per minute."""
        return self.report.as_dict() | {
            "explore_s": round(self.explore_s, 1),
            "wall_s": round(self.wall_s, 1),
            "tasks_per_minute": round(len(self.tasks) / (self.wall_s / 60), 2) if self.wall_s else 0.0,
        }


def uses_policy(config: Any) -> bool:
    """Whether self-questioning under ``config`` asks the policy itself (an explorer or synthesizer
    that is a role played by the policy), so the model must be loaded."""
    ex = config.explore
    roles = [
        name for name, mode in (("explorer", ex.explorer), ("synthesizer", ex.synthesizer)) if mode == "role"
    ]
    return any(config.roles.for_role(name).backend == "policy" for name in roles)


def self_question(
    config: Any, roles: Any, limit: int | None = None, on_stage: Callable[[str], object] | None = None
) -> Questions:
    """Explore ``config``'s world with ``roles``' explorer, synthesize at most ``limit`` tasks with
    its synthesizer; ``on_stage`` hears "exploring…" and "synthesizing tasks…"."""
    from horizonrl.envs.registry import make_env, parse_env_options

    options = parse_env_options(config.env.name, config.env.options)
    profile = env_profile(config.env.name, config.env.options)
    embedder = None
    if config.explore.embedding_duplicate is not None:
        from horizonrl.evolve.embed import QueryEmbedder

        embedder = QueryEmbedder()  # one line naming the install command when it is missing

    def make() -> Any:
        return make_env(config.env.name, options)

    start = time.perf_counter()
    if on_stage is not None:
        on_stage("exploring…")
    if config.explore.explorer == "walk":
        traces = asyncio.run(walk(make, profile, config.explore, config.seed))
    else:
        traces = asyncio.run(explore(roles.get("explorer"), make, profile, config.explore, config.seed))
    explored = time.perf_counter() - start
    if on_stage is not None:
        on_stage("synthesizing tasks…")
    synthesizer = roles.get("synthesizer") if config.explore.synthesizer == "role" else None
    tasks, report = asyncio.run(
        synthesize(synthesizer, make, profile, traces, config.explore, config.seed, limit, embedder)
    )
    return Questions(traces, tasks, report, explored, time.perf_counter() - start)
