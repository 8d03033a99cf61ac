"""The ``eval:`` section: held-out evaluation."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from horizonrl.config.section import Section
from horizonrl.rollout.eval_k import default_ks


class EvalConfig(Section):
    """Held-out evaluation (`horizon eval`)."""

    split: str = Field("test", description="Held-out task split.")
    num_tasks: int = Field(100, ge=1, le=100_000, description="Number of held-out tasks.")
    seed: int = Field(
        0, ge=-(2**62), le=2**62, description="Seed of the held-out task generator (fixed, so evals compare)."
    )
    temperature: float = Field(0.0, ge=0.0, description="Sampling temperature for eval; 0 is greedy.")
    samples_per_task: int = Field(
        1,
        ge=1,
        le=1_024,
        description="Samples of each held-out task (n). 1: one episode per task (greedy at temperature 0), "
        "its success rate with a Wilson interval. n > 1 (needs eval.temperature > 0): pass@k, avg@n, best@k "
        "and maj@k with bootstrap intervals over tasks; a task's n episodes run together.",
    )
    k: list[int] | None = Field(
        None,
        description="The k of pass@k, best@k and maj@k, each 1..samples_per_task (default: the powers of 2 "
        "below n, and n).",
    )
    metrics: list[Literal["pass", "avg", "best", "maj"]] | None = Field(
        None,
        description="What a sampled eval (samples_per_task > 1) reports: pass (pass@k, unbiased), avg "
        "(avg@n, mean success over the samples), best (best@k, the expected best reward of k), maj (maj@k, "
        "majority vote of k; only for an env that says which answers agree). Default: all the env supports.",
    )
    concurrency: int = Field(32, ge=1, le=4_096, description="Episodes in flight at once.")
    tasks: Literal["run", "env"] = Field(
        "run",
        description="Where held-out tasks come from: 'run' — where the run's tasks come from "
        "(env.tasks_file, else the env's generator); 'env' — the env's own split even when env.tasks_file "
        "is set (a held-out set the env ships, while training reads e.g. synthesized tasks).",
    )
    majority_vote: int = Field(
        1,
        ge=1,
        le=1_024,
        description="Role graphs (multiagent.graph): episodes per task whose final answers vote (MV@k; "
        "sampled at multiagent.malt.temperature when k > 1).",
    )

    @model_validator(mode="after")
    def _check_samples(self) -> EvalConfig:
        n = self.samples_per_task
        if n > 1 and self.temperature == 0:
            raise ValueError(
                f"eval.samples_per_task={n} draws {n} samples of each task, but eval.temperature is 0 "
                "(greedy: every sample alike); set eval.temperature > 0, e.g. eval.temperature=1.0"
            )
        for k in self.k or []:
            if not 1 <= k <= n:
                raise ValueError(
                    f"k={k} in eval.k needs {k} samples per task but eval.samples_per_task is {n}; each k "
                    f"must be in 1..{n} (or raise eval.samples_per_task)"
                )
        if (self.k is not None or self.metrics is not None) and n == 1:
            raise ValueError(
                "eval.k and eval.metrics choose what a sampled eval reports; with eval.samples_per_task=1 "
                "there is one sample per task: set eval.samples_per_task > 1 (and eval.temperature > 0)"
            )
        if self.k is not None and not self.k:
            raise ValueError("eval.k is empty: give some k in 1..eval.samples_per_task, or leave it unset")
        if self.metrics is not None and not self.metrics:
            raise ValueError("eval.metrics is empty: give some of pass, avg, best, maj, or leave it unset")
        return self

    def ks(self) -> list[int]:
        """The k reported: ``k`` as given (sorted, once each), else the powers of 2 below n, and n."""
        if self.k is not None:
            return sorted(set(self.k))
        return default_ks(self.samples_per_task)
