"""The ``eval:`` section: held-out evaluation."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from horizonrl.config.section import Section


class EvalConfig(Section):
    """Held-out evaluation (`horizon eval`)."""

    split: str = Field("test", description="Held-out task split.")
    num_tasks: int = Field(100, ge=1, description="Number of held-out tasks.")
    seed: int = Field(0, description="Seed of the held-out task generator (fixed, so evals compare).")
    temperature: float = Field(0.0, ge=0.0, description="Sampling temperature for eval; 0 is greedy.")
    concurrency: int = Field(32, ge=1, description="Episodes in flight at once.")
    tasks: Literal["run", "env"] = Field(
        "run",
        description="Where held-out tasks come from: 'run' — where the run's tasks come from "
        "(env.tasks_file, else the env's generator); 'env' — the env's own split even when env.tasks_file "
        "is set (a held-out set the env ships, while training reads e.g. synthesized tasks).",
    )
    majority_vote: int = Field(
        1,
        ge=1,
        description="Role graphs (multiagent.graph): episodes per task whose final answers vote (MV@k; "
        "sampled at multiagent.malt.temperature when k > 1).",
    )
