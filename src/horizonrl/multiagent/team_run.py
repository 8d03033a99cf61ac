"""`horizon eval` of a chat chain (``multiagent.chain``): the team on the eval split, one engine serving
every role's adapter, each episode in its own env workspace.

Writes ``chain_eval/`` in the run directory: ``episodes.jsonl`` (each episode's turn order and chain
state: what ``horizon analyze`` reads), ``trajectories.jsonl`` (every role's trajectories) and
``summary.json``: pass@1 with its interval (pass@k, avg@n for ``eval.samples_per_task`` > 1), tokens
generated and tokens per solved problem, and per phase how often it ended by consensus and its mean
turns; per role its steps and tokens.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from horizonrl.envs.base import Env
from horizonrl.io import write_jsonl_atomic, write_text_atomic
from horizonrl.multiagent.chain import load_chain
from horizonrl.multiagent.run import open_engine
from horizonrl.multiagent.team import ChainEpisodeRecord, configured_team
from horizonrl.multiagent.team_oracle import TeamOracle
from horizonrl.rollout.eval_k import METRICS, TaskSamples, eval_report
from horizonrl.types import Task, Trajectory, write_trajectories

Status = Callable[[str], None]


def chain_summary(
    records: Sequence[ChainEpisodeRecord], trajectories: Sequence[Trajectory]
) -> dict[str, Any]:
    """The team's figures over its episodes (see the module doc)."""
    n = len(records)
    solved = sum(r.success for r in records)
    tokens = sum(r.generated_tokens for r in records)
    phases: dict[str, list[Any]] = defaultdict(list)
    for r in records:
        for run in r.chain.phases:
            phases[run.name].append(run)
    roles: dict[str, dict[str, float]] = defaultdict(lambda: {"steps": 0.0, "tokens": 0.0})
    for t in trajectories:
        roles[str(t.role)]["steps"] += t.num_turns
        roles[str(t.role)]["tokens"] += t.metrics.get("model_tokens", 0.0)
    return {
        "episodes": n,
        "solved_episodes": solved,
        "generated_tokens": tokens,
        "tokens_per_episode": tokens / n if n else 0.0,
        "tokens_per_solved": tokens / solved if solved else None,
        "errors": sum(r.error is not None for r in records),
        "final_check_passed": sum(
            any(c.phase == "final" and c.passed for c in r.chain.checks) for r in records
        ),
        "phases": {
            name: {
                "runs": len(runs),
                "consensus": sum(p.ended == "consensus" for p in runs) / len(runs),
                "turn_cap": sum(p.ended == "turn_cap" for p in runs) / len(runs),
                "mean_steps": sum(p.last_step - p.first_step + 1 for p in runs if p.first_step >= 0)
                / len(runs),
            }
            for name, runs in phases.items()
        },
        "roles": dict(roles),
    }


def run_chain_eval(
    config: Any,
    tasks: Sequence[Task],
    out_dir: Path,
    status: Status | None = None,
    on_done: Callable[[ChainEpisodeRecord], None] | None = None,
    oracle: bool = False,
) -> dict[str, Any]:
    """Run the chain ``eval.samples_per_task`` times on each task (``oracle``: the canonical-solution
    script plays every role, no model loads); write the records and the summary into ``out_dir`` and
    return the summary."""
    from horizonrl.models import load_tokenizer

    ma, ev = config.multiagent, config.eval
    chain = load_chain(ma.chain).with_adapters({role: role for role in ma.adapters})
    n = ev.samples_per_task
    sampling = config.sampling.model_copy(update={"temperature": ev.temperature, "seed": config.seed})
    engine: Any = None
    if oracle:
        tokenizer = load_tokenizer(config.model.path)
    else:
        engine, loaded = open_engine(config, dict(ma.adapters), status)
        tokenizer = loaded.tokenizer
    runner = configured_team(
        config, chain, tokenizer, sampling, engine, TeamOracle(chain) if oracle else None
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    results: list[list[tuple[ChainEpisodeRecord, list[Trajectory]]]] = [[] for _ in tasks]
    gate = asyncio.Semaphore(ev.concurrency)

    async def one(i: int, k: int) -> None:
        async with gate:
            result = await runner.run(tasks[i], f"{tasks[i].id}/pass{k}", config.seed, k)
        results[i].append(result)
        if on_done is not None:
            on_done(result[0])

    async def main() -> None:
        try:
            await asyncio.gather(*(one(i, k) for i in range(len(tasks)) for k in range(n)))
        finally:
            if engine is not None:
                await engine.close()

    start = time.perf_counter()
    asyncio.run(main())
    wall = time.perf_counter() - start
    records = [rec for per_task in results for rec, _ in per_task]
    trajectories = [t for per_task in results for _, trajs in per_task for t in trajs]
    samples = [
        TaskSamples(
            task.id,
            Env.task_group(task),
            [rec.success for rec, _ in per_task],
            [rec.reward for rec, _ in per_task],
        )
        for task, per_task in zip(tasks, results, strict=True)
    ]
    metrics = [m for m in ev.metrics or METRICS if m != "maj"]
    summary = {
        "chain": chain.name,
        "env": config.env.name,
        "split": ev.split,
        "policy": "oracle" if oracle else "model",
        "adapters": {k: str(v) for k, v in ma.adapters.items()},
        "temperature": ev.temperature,
        **eval_report(samples, ev.ks(), metrics, seed=ev.seed),
        **chain_summary(records, trajectories),
        "wall_s": wall,
    }
    write_jsonl_atomic(out_dir / "episodes.jsonl", records)
    write_trajectories(out_dir / "trajectories.jsonl", trajectories)
    write_text_atomic(out_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary
