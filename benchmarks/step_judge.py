"""How right is the step judge? Its GOOD/BAD labels against the truth the env knows per step.

Reads finished trajectories (a run's held-out evals, say), replays each through a fresh env on the
same task to get every step's truth (:mod:`horizonrl.evolve.step_truth`: calc's process credit, the
flights world's rules), asks the judge role of ``--config`` (``roles.judge``; the config's model by
default, or any endpoint the roles block names) to label the steps exactly as a training run with
``attribution.enabled`` does, and prints ``name=value`` lines: steps judged, the share of BAD steps,
the judge's accuracy and Cohen's κ (BAD as the positive class) with its confusion counts and its
accuracy on successful and failed trajectories, the same figures for two judge-free baselines
(every step GOOD; every step labelled with its trajectory's outcome), the judge's replies that were
not the structured object (read by the free-text parser instead; ``roles.judge.structured`` says
whether the engine enforced it), the steps left unlabelled, and the judge's time and tokens. Writes
everything to ``--out`` as JSON.

    python benchmarks/step_judge.py --config configs/calc.yaml runs/learning/seed_0/eval/start.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from horizonrl.config import load_config
from horizonrl.envs.factory import eval_tasks
from horizonrl.evolve.attribution import StepJudge, first_request, trajectory_steps
from horizonrl.evolve.step_truth import TRUTH, Agreement, step_truth
from horizonrl.roles import Roles
from horizonrl.train.runtime import build_runtime
from horizonrl.types import Trajectory, read_trajectories


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "trajectories", nargs="+", type=Path, help="trajectory JSONL files of the config's env"
    )
    parser.add_argument("--config", type=Path, required=True, help="the recipe: env, eval tasks, roles.judge")
    parser.add_argument(
        "--out", type=Path, default=None, help="where the JSON goes (default: beside the first file)"
    )
    parser.add_argument("--limit", type=int, default=None, help="judge at most this many trajectories")
    parser.add_argument("overrides", nargs="*", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()

    config = load_config(args.config, args.overrides)
    env = config.env.name
    if env not in TRUTH:
        print(f"env {env!r} has no step truth; envs with one: {', '.join(TRUTH)}", file=sys.stderr)
        return 2
    tasks = {
        t.id: t
        for t in eval_tasks(
            config.env, config.eval.split, config.eval.num_tasks, config.eval.seed, config.eval.tasks
        )
    }
    pairs: list[tuple[Trajectory, list[bool]]] = []
    unreplayed = unknown_task = no_steps = 0
    for path in args.trajectories:
        for trajectory in read_trajectories(path):
            task = tasks.get(trajectory.task_id)
            if task is None:
                unknown_task += 1
                continue
            truth = step_truth(env, config.env.options, task, trajectory)
            if truth is None:
                unreplayed += 1
            elif not truth:
                no_steps += 1
            else:
                pairs.append((trajectory, truth))
    pairs = pairs[: args.limit] if args.limit else pairs
    if not pairs:
        print(
            f"no trajectory of {env}'s eval tasks could be replayed from {args.trajectories}", file=sys.stderr
        )
        return 2
    for trajectory, truth in pairs:
        assert len(trajectory_steps(trajectory)) == len(truth)

    runtime = build_runtime(config) if config.roles.for_role("judge").backend == "policy" else None
    roles = Roles(config.roles, runtime.engine if runtime else None, runtime.tokenizer if runtime else None)
    judge = StepJudge(roles.get("judge"), max_tokens=config.attribution.max_tokens)

    async def label_all() -> list[list[bool]]:
        return list(await asyncio.gather(*(judge.label(first_request(t), t) for t, _ in pairs)))

    t0 = time.perf_counter()
    try:
        labels = asyncio.run(label_all())
    finally:
        if runtime is not None:
            runtime.close()
    judge_s = time.perf_counter() - t0

    agreement = Agreement()
    for (trajectory, truth), judged in zip(pairs, labels, strict=True):
        agreement.add(truth, judged, trajectory.success)
    figures = agreement.figures()
    result = {
        "env": env,
        "config": str(args.config),
        "judge_role": roles.describe()["judge"].replace("the run's policy", str(config.model.path)),
        "files": [str(p) for p in args.trajectories],
        "trajectories": len(pairs),
        "skipped": {"not_replayed": unreplayed, "unknown_task": unknown_task, "no_steps": no_steps},
        **figures,
        "judge_structured": config.roles.for_role("judge").structured,
        "replies_unstructured": judge.stats.unstructured,
        "labels_defaulted": judge.stats.defaulted,
        "judge_s": round(judge_s, 1),
        "judge_usage": roles.usage().get("judge"),
    }
    out = args.out or args.trajectories[0].with_suffix(".step_judge.json")
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")

    j = figures["judge"]
    lines = {
        "env": env,
        "judge_role": result["judge_role"],
        "trajectories": len(pairs),
        "steps": figures["steps"],
        "true_bad_share": f"{figures['true_bad_share']:.3f}",
        "judge_accuracy": f"{j['accuracy']:.3f}",
        "judge_kappa": f"{j['kappa']:.3f}",
        "judge_confusion": json.dumps(j["confusion"]),
        "judge_accuracy_on_successes": f"{j['on_successes']['accuracy']:.3f}",
        "judge_accuracy_on_failures": f"{j['on_failures']['accuracy']:.3f}",
        "baseline_all_good": "accuracy {accuracy:.3f} kappa {kappa:.3f}".format(
            **figures["baseline_all_good"]
        ),
        "baseline_outcome": "accuracy {accuracy:.3f} kappa {kappa:.3f}".format(**figures["baseline_outcome"]),
        "judge_structured": result["judge_structured"],
        "replies_unstructured": f"{judge.stats.unstructured}/{judge.stats.trajectories - judge.stats.cached}",
        "labels_defaulted": f"{judge.stats.defaulted}/{figures['steps']}",
        "skipped": json.dumps(result["skipped"]),
        "judge_s": result["judge_s"],
        "judge_usage": json.dumps(result["judge_usage"]),
    }
    for key, value in lines.items():
        print(f"{key}={value}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
