"""The shipped SWE dataset's figures (issue 6): build yield, gold and empty patches through the
evaluation harness, and the oracle agent through the real env and rollout pipeline.

Prints ``build_yield`` (validated / tried, from the build report), ``gold_resolved_rate`` and
``empty_resolved_rate`` (``horizon swe eval --gold/--empty``), ``oracle_reward_mean`` (the oracle
applies each fix with str_replace_editor and calls finish; reward from the env's eval stage) and
``median_eval_s`` (one instance's evaluation: sandbox, patch, whole test suite).

    python benchmarks/swe.py [--quick]     # --quick: one instance per package
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from statistics import median

from horizonrl.agent.config import AgentConfig
from horizonrl.agent.loop import Agent
from horizonrl.engine.base import SamplingParams
from horizonrl.envs.swe.env import SWEEnv, SWEOptions
from horizonrl.envs.swe.harness import Prediction, evaluate_predictions, summarize
from horizonrl.envs.swe.instances import Dataset
from horizonrl.model_config import TINY_ALIAS
from horizonrl.models import load_tokenizer
from horizonrl.rollout.base import RolloutLimits, make_jobs
from horizonrl.rollout.pipeline import run_pipeline
from horizonrl.types import Task


def chosen(data: Dataset, quick: bool) -> list[str]:
    ids = sorted(data.instances)
    if not quick:
        return ids
    first: dict[str, str] = {}
    for i in ids:
        first.setdefault(data.instances[i].repo, i)
    return list(first.values())


async def main(quick: bool, workers: int) -> None:
    data = Dataset.shipped()
    ids = chosen(data, quick)
    reports = json.loads((data.root / "build" / "report.json").read_text())
    tried = sum(r["tried"] for r in reports)
    validated = sum(r["accepted"] for r in reports)

    start = time.perf_counter()
    gold = await evaluate_predictions(
        data, [Prediction(instance_id=i, model_patch=data.get(i).patch) for i in ids], workers
    )
    empty = await evaluate_predictions(
        data, [Prediction(instance_id=i, model_patch="") for i in ids], workers
    )
    evals_s = time.perf_counter() - start

    options = SWEOptions()
    tasks = [Task(id=i, env="swe", split="all", data={"instance_id": i, "dataset": None}) for i in ids]
    agent = Agent(
        load_tokenizer(TINY_ALIAS),
        None,
        SamplingParams(max_new_tokens=64),
        AgentConfig(max_turns=8, max_total_tokens=32000),
        context_length=65536,
    )
    start = time.perf_counter()
    result = await run_pipeline(
        agent,
        lambda: SWEEnv(options),
        make_jobs(tasks, 1),
        RolloutLimits.uniform(workers),
        policy=SWEEnv.oracle(),
    )
    oracle_s = time.perf_counter() - start
    failed = [t.task_id for t in result if t.reward != 1.0]

    print(f"instances={len(ids)} of {len(data.instances)} packages={len({data.get(i).repo for i in ids})}")
    print(f"build_tried={tried} build_validated={validated}")
    print(f"build_yield={validated / tried:.3f}")
    print(f"gold={json.dumps(summarize(gold))}")
    print(f"empty={json.dumps(summarize(empty))}")
    print(f"gold_resolved_rate={summarize(gold)['resolved_rate']:.3f}")
    print(f"empty_resolved_rate={summarize(empty)['resolved_rate']:.3f}")
    print(f"oracle_reward_mean={sum(t.reward for t in result) / len(result):.3f} (not solved: {failed[:5]})")
    print(f"median_eval_s={median(r.seconds for r in gold + empty):.2f}")
    print(f"harness_wall_s={evals_s:.0f} oracle_wall_s={oracle_s:.0f} workers={workers}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one instance per package")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    asyncio.run(main(args.quick, args.workers))
