"""Learning that holds across seeds, and a policy that reloads as what was measured.

Runs the demo recipe (``configs/calc.yaml``) once per seed, each in its own ``horizon train``
process: the seed changes the SFT data order (``seed``), the demonstration tasks (``sft.seed``), the
RL task draws (``rollout.seed``) and RL sampling; the held-out tasks (``eval.seed``) stay fixed.
Then, in a fresh ``horizon eval`` process, it evaluates the run's final policy loaded from disk
(``--checkpoint runs/learning/seed_K``) on the same held-out tasks and compares it with the run's own
final eval, task by task.

Writes ``runs/learning/summary.json`` (each seed's start, final and reloaded success, gain, wall time,
peak memory, per-stage and per-step seconds) after every seed, and prints ``name=value`` lines:
one block per seed, then ``gain_pts_min``, ``gain_pts_mean`` and last ``reload_gap_pts_max``.

    python benchmarks/learning.py [--seeds 3] [--quick] [KEY=VALUE ...]

``KEY=VALUE`` overrides go to every ``horizon train`` and ``horizon eval`` (a recipe variant, e.g.
``sampling.temperature=0.7``) and are recorded in the summary.

``--quick`` runs a tiny random model for two RL steps (a check of the machinery, no learning).

``--evolve`` runs a self-questioning recipe instead (``horizon evolve train``, e.g.
``--config configs/evolve_flights.yaml``): each seed explores and synthesizes its own task file
(``OUT/seed_K.tasks.jsonl``) before it trains, and the gain that counts is over the base model
(``gain_over_base_pts``: nothing was trained before the run), beside the RL gain over the SFT start.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from machine import machine_description

from horizonrl.types import Trajectory, read_trajectories

ROOT = Path(__file__).resolve().parents[1]
HORIZON = [sys.executable, "-m", "horizonrl.cli"]
QUICK = [
    "model.path=tiny-random",
    "sampling.max_new_tokens=16",
    "agent.max_turns=4",
    "eval.num_tasks=8",
    "sft.num_demos=8",
    "train.steps=2",
    "train.tasks_per_step=2",
    "train.group_size=2",
]


def seed_overrides(seed: int) -> list[str]:
    """What a seed changes; seed 0 is the recipe as shipped (seed 0, sft.seed 1000, rollout.seed 0)."""
    return [f"seed={seed}", f"sft.seed={1000 + seed}", f"rollout.seed={seed}"]


def _run(cmd: list[str], log: Path) -> float:
    start = time.perf_counter()
    with log.open("w", encoding="utf-8") as sink:
        proc = subprocess.run(
            cmd, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "120"}
        )
    if proc.returncode != 0:
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-5:]
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n" + "\n".join(tail))
    return time.perf_counter() - start


def _records(path: Path) -> dict[str, Trajectory]:
    return {t.task_id: t for t in read_trajectories(path)}


def _success(records: dict[str, Trajectory]) -> float:
    return sum(t.success for t in records.values()) / len(records)


def one_seed(
    config: str, seed: int, out: Path, extra: list[str], evolve: bool = False, reload: bool = True
) -> dict[str, Any]:
    """Train one seed, reload its final policy in a fresh process, evaluate it; return its figures.
    ``evolve``: the run synthesizes its own tasks first (``horizon evolve train``); ``reload=False``
    skips the reloaded eval (its figures are then None)."""
    name = f"seed_{seed}"
    run_dir = out / name
    common = [*extra, *seed_overrides(seed), f"output_dir={out}", f"name={name}"]
    if evolve:
        common.append(f"env.tasks_file={out / f'{name}.tasks.jsonl'}")
    command = ["evolve", "train", "--resynthesize"] if evolve else ["train"]
    train_s = _run([*HORIZON, *command, config, *common, "--overwrite"], out / f"{name}.train.log")
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    reload_out = run_dir / "eval" / "reloaded.jsonl"
    last = max(int(k) for k in summary["evals"])
    in_run = _records(run_dir / "eval" / f"step_{last:06d}.jsonl")
    reload_s, reloaded = 0.0, {}
    if reload:
        reload_s = _run(
            [*HORIZON, "eval", config, *common, "--checkpoint", str(run_dir), "--out", str(reload_out)],
            out / f"{name}.reload.log",
        )
        reloaded = _records(reload_out)
    same = sum(in_run[t].response_ids == reloaded[t].response_ids for t in in_run if t in reloaded)
    metrics = [
        json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()
    ]
    steps = [m for m in metrics if m.get("step", 0) > 0]
    start, final = summary["start_success"], summary["final_success"]
    reloaded_success = _success(reloaded) if reloaded else None
    return {
        "seed": seed,
        "base_success": summary["base_success"],
        "start_success": start,
        "final_success": final,
        "gain_pts": round(100 * (final - start), 1),
        "gain_over_base_pts": round(100 * (final - summary["base_success"]), 1),
        "reloaded_success": reloaded_success,
        "reload_gap_pts": round(100 * abs(reloaded_success - final), 1)
        if reloaded_success is not None
        else None,
        "identical_completions": f"{same}/{len(in_run)}" if reloaded else None,
        "wall_s": summary["wall_s"],
        "train_process_s": round(train_s, 1),
        "reload_eval_s": round(reload_s, 1),
        "peak_rss_gib": summary["peak_rss_gib"],
        "wall_s_by_stage": summary["wall_s_by_stage"],
        "rl_rollout_s": [round(m.get("rollout_s", 0.0), 1) for m in steps],
        "rl_update_s": [round(m.get("update_s", 0.0), 1) for m in steps],
        "final_eval_s": round(steps[-1].get("eval_s", 0.0), 1) if steps else None,
        "train_success": [round(m.get("success_rate", 0.0), 3) for m in steps],
        "policy": str(run_dir / "policy"),
    }


def check_overrides(parser: argparse.ArgumentParser, overrides: list[str], example: str) -> None:
    """A parser error naming the first override that is not KEY=VALUE (``example`` shows one)."""
    bad = [o for o in overrides if "=" not in o or o.startswith("=")]
    if bad:
        parser.error(f"overrides must look like KEY=VALUE (e.g. {example}), got {bad[0]!r}")


def seed_order(parser: argparse.ArgumentParser, seeds: int, text: str | None) -> list[int]:
    """The seeds to run: ``--seed-order`` (``"2,0,1"``) when given, else ``0 .. seeds-1``; a parser
    error for ``seeds < 1`` or an order that is not distinct seeds >= 0."""
    if seeds < 1:
        parser.error(f"--seeds must be >= 1, got {seeds}")
    try:
        order = [int(s) for s in text.split(",")] if text else list(range(seeds))
    except ValueError:
        parser.error(f"--seed-order must be comma-separated seeds like 2,0,1, got {text!r}")
    if any(s < 0 for s in order) or len(set(order)) != len(order):
        parser.error(f"--seed-order must list distinct seeds >= 0, got {text!r}")
    return order


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="how many seeds (0, 1, ...)")
    parser.add_argument(
        "--seed-order",
        default=None,
        help="the seeds to run, in this order (e.g. 2,0,1: the weakest first when trying a variant)",
    )
    parser.add_argument("--config", default="configs/calc.yaml")
    parser.add_argument("--out", default="runs/learning", help="where the runs and summary.json go")
    parser.add_argument("--quick", action="store_true", help="tiny random model, two steps (machinery only)")
    parser.add_argument(
        "--evolve", action="store_true", help="a self-questioning recipe: horizon evolve train per seed"
    )
    parser.add_argument(
        "--no-reload", action="store_true", help="skip evaluating each final policy reloaded from disk"
    )
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="recipe overrides for every run")
    args = parser.parse_args()
    check_overrides(parser, args.overrides, "sampling.temperature=0.7")
    order = seed_order(parser, args.seeds, args.seed_order)
    out = (ROOT / args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    extra = [*(QUICK if args.quick else []), *args.overrides]
    result: dict[str, Any] = {
        "config": args.config,
        "overrides": args.overrides,
        "machine": machine_description(),
        "quick": args.quick,
        "seeds": [],
    }
    print(f"machine={result['machine']}", flush=True)
    if args.overrides:
        print(f"overrides={' '.join(args.overrides)}", flush=True)
    for seed in order:
        figures = one_seed(args.config, seed, out, extra, args.evolve, reload=not args.no_reload)
        result["seeds"].append(figures)
        gains = [s["gain_pts"] for s in result["seeds"]]
        over_base = [s["gain_over_base_pts"] for s in result["seeds"]]
        result.update(
            gain_pts_min=min(gains),
            gain_pts_mean=round(statistics.mean(gains), 1),
            gain_over_base_pts_min=min(over_base),
            gain_over_base_pts_mean=round(statistics.mean(over_base), 1),
            reload_gap_pts_max=max(
                (s["reload_gap_pts"] for s in result["seeds"] if s["reload_gap_pts"] is not None),
                default=None,
            ),
        )
        (out / "summary.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        for key in (
            "base_success",
            "start_success",
            "final_success",
            "gain_pts",
            "gain_over_base_pts",
            "reloaded_success",
            "identical_completions",
            "wall_s",
            "peak_rss_gib",
            "wall_s_by_stage",
            "rl_rollout_s",
            "rl_update_s",
            "final_eval_s",
            "train_success",
        ):
            value = figures[key]
            print(
                f"seed{seed}_{key}={json.dumps(value) if isinstance(value, (dict, list)) else value}",
                flush=True,
            )
    print(f"gain_pts_min={result['gain_pts_min']}")
    print(f"gain_pts_mean={result['gain_pts_mean']}")
    print(f"gain_over_base_pts_min={result['gain_over_base_pts_min']}")
    print(f"gain_over_base_pts_mean={result['gain_over_base_pts_mean']}")
    print(f"reload_gap_pts_max={result['reload_gap_pts_max']}")


if __name__ == "__main__":
    main()
