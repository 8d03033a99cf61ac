"""Episodes played with their records streamed to a JSONL file: the one sampler of `horizon train`
(its rollouts and evals) and of `horizon rollout` / `horizon eval`.

Each finished record is written and flushed as it comes (a crash loses nothing already finished),
and ``on_done(solved, done)`` follows it for a progress display. A user's program playing through
the policy server (:func:`~horizonrl.serve.external.served`) is served while the episodes run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from horizonrl.rollout.base import RolloutResult
from horizonrl.rollout.runner import EnvFactory, run_rollouts
from horizonrl.serve.external import served
from horizonrl.types import Task, Trajectory


def sample_episodes(
    player: Any,
    env_factory: EnvFactory,
    tasks: Sequence[Task],
    samples: int,
    concurrency: int,
    *,
    sampling: Any = None,
    mode: Any = "pipeline",
    limits: Any = None,
    out: Path | None = None,
    append: bool = False,
    on_done: Callable[[int, int], None] | None = None,
    on_status: Callable[[str], None] | None = None,
    policy: Any = None,
    notes: dict[str, str] | None = None,
    eta: float = 0.0,
) -> RolloutResult:
    """``samples`` episodes of every task played by ``player`` (``policy``: an env's scripted oracle
    writes the turns instead), each record appended to ``out`` (when given; ``append``: after what
    it holds) as it finishes; ``on_done`` gets the successes and the episodes so far, ``on_status``
    the rollout's live status line. ``mode``, ``limits``, ``notes`` and ``eta`` are
    :func:`~horizonrl.rollout.runner.run_rollouts`'s."""
    sink = None
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        sink = out.open("a" if append else "w", encoding="utf-8")
    solved = done = 0

    def on_trajectory(traj: Trajectory) -> None:
        nonlocal solved, done
        solved += traj.success
        done += 1
        if sink is not None:
            sink.write(traj.to_json() + "\n")
            sink.flush()
        if on_done is not None:
            on_done(solved, done)

    try:
        return asyncio.run(
            served(
                player,
                run_rollouts(
                    player,
                    env_factory,
                    tasks,
                    samples,
                    concurrency,
                    policy=policy,
                    sampling=sampling,
                    on_trajectory=on_trajectory,
                    mode=mode,
                    limits=limits,
                    on_status=(lambda status: on_status(str(status))) if on_status is not None else None,
                    notes=notes,
                    eta=eta,
                ),
            )
        )
    finally:
        if sink is not None:
            sink.close()
