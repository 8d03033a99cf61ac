"""MALT on the embedded default, MALT's table on our held-out tasks: the single agent (the generator
alone), the untrained generator -> verifier -> refiner, the untrained one with a majority vote over 3
episodes, the one trained offline (tree sampling, role-wise SFT then DPO) with MV@3, and the online
variant (GRPO per role on tree advantages, the same number of trees) with MV@3; accuracy after each
role; tree-sampling throughput.

Runs in one process on ``configs/malt.yaml`` (KEY=VALUE overrides go to every stage); prints
``name=value`` lines and writes ``runs/malt_bench/summary.json``. The multi-adapter batching ratio
comes from ``benchmarks/multi_adapter.py``.

    python benchmarks/malt.py [--questions 48] [--eval-tasks 60] [--rounds 4] [--skip-untrained]
                              [--skip-online] [KEY=VALUE ...]

``--skip-untrained`` leaves out the two untrained evals (greedy and MV@3, ~20 minutes on two cores)
when they were measured already with the same config and tasks.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from horizonrl.config import load_config
from horizonrl.envs.factory import eval_tasks
from horizonrl.multiagent.online import run_malt_online
from horizonrl.multiagent.run import malt_dir, run_graph_eval, run_malt_sample, run_malt_train

ROOT = Path(__file__).resolve().parents[1]


def trained_adapters(config) -> dict[str, Path]:
    """The adapters `horizon malt train` wrote for this run (roles it skipped are absent)."""
    root = malt_dir(config) / "adapters"
    return {p.name: p for p in sorted(root.iterdir()) if p.is_dir()} if root.is_dir() else {}


def held_out(config) -> list:
    """The held-out tasks of ``config.eval`` (as ``horizon eval`` draws them)."""
    ev = config.eval
    return eval_tasks(config.env, ev.split, ev.num_tasks, ev.seed, ev.tasks)


def _adapters(adapters: dict[str, str | Path]) -> list[str]:
    return [f"multiagent.adapters.{role}={path}" for role, path in adapters.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "malt.yaml"))
    parser.add_argument("--questions", type=int, default=48, help="training questions (trees)")
    parser.add_argument("--eval-tasks", type=int, default=60, help="held-out tasks")
    parser.add_argument("--rounds", type=int, default=4, help="online variant: rounds")
    parser.add_argument("--skip-untrained", action="store_true", help="leave out the untrained evals")
    parser.add_argument("--skip-online", action="store_true")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    base = [
        "name=malt_bench",
        f"multiagent.malt.questions={args.questions}",
        f"eval.num_tasks={args.eval_tasks}",
        *args.overrides,
    ]
    out = {"questions": args.questions, "eval_tasks": args.eval_tasks, "overrides": args.overrides}
    wall = time.perf_counter()

    def evaluate(label: str, extra: list[str]) -> dict:
        config = load_config(args.config, [*base, *extra])
        summary = run_graph_eval(config, held_out(config), config.run_dir / f"eval_{label}")
        out[label] = summary
        print(f"{label}_success_rate={summary['success_rate']:.3f}", flush=True)
        for key, value in summary.items():
            if key.startswith("accuracy_after_"):
                print(f"{label}_{key}={value:.3f}", flush=True)
        print(f"{label}_wall_s={summary['wall_s']:.1f}", flush=True)
        return summary

    if not args.skip_untrained:
        greedy = evaluate("untrained", [])
        out["single_agent_success_rate"] = greedy["accuracy_after_generate"]
        print(f"single_agent_success_rate={greedy['accuracy_after_generate']:.3f}", flush=True)
        evaluate("untrained_mv3", ["eval.majority_vote=3"])

    config = load_config(args.config, base)
    report = run_malt_sample(config)
    out["tree"] = report
    for key in ("leaves", "leaf_accuracy", "leaves_per_minute", "questions_all_leaves_tied"):
        print(f"tree_{key}={report[key]}", flush=True)
    print(f"tree_no_answer_leaves={report['no_answer_leaves']}", flush=True)
    for role in ("generator", "verifier", "refiner"):
        print(f"tree_{role}_positives={report[f'{role}_positives']}", flush=True)
        print(f"tree_{role}_pairs={report[f'{role}_pairs']}", flush=True)
    start = time.perf_counter()
    out["offline_train"] = run_malt_train(config)
    print(f"offline_train_s={time.perf_counter() - start:.1f}", flush=True)
    offline = trained_adapters(config)
    evaluate("offline", _adapters(offline))
    evaluate("offline_mv3", [*_adapters(offline), "eval.majority_vote=3"])

    if not args.skip_online:
        start = time.perf_counter()
        online = run_malt_online(config, args.rounds)
        out["online_train"] = online
        print(f"online_train_s={time.perf_counter() - start:.1f}", flush=True)
        for entry in online["rounds"]:
            print(f"online_round{entry['round']}_leaf_accuracy={entry['leaf_accuracy']:.3f}", flush=True)
        evaluate("online_mv3", [*_adapters(online["adapters"]), "eval.majority_vote=3"])

    out["wall_s"] = time.perf_counter() - wall
    print(f"wall_s={out['wall_s']:.1f}")
    path = ROOT / "runs" / "malt_bench" / "summary.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2, default=str) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
