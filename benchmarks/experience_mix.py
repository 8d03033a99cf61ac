"""Experience-mixed rollouts on flights from one start: the pool off, on without clip amplification,
and on with it — what ``experience.eta`` and ``experience.clip_high`` do, side by side.

One start (base eval, SFT on the synthesized tasks' replayed references, start eval) is trained once
in ``OUT/start`` (a ``horizon train`` with ``train.steps=0``); each arm is then a ``horizon train
--start-from`` it with the same RL budget, tasks and order:

- ``no_pool``: no experience pool (every sample on-policy);
- ``eta0.5_clip0.2``: the pool on, ``round(0.5 n)`` samples of each task guided by its top-3
  experiences, the guided samples clipped like on-policy ones (0.2, Dr.GRPO's bound): no amplification;
- ``eta0.5_clip0.6``: the same with AgentEvolver's wider upper clip 0.6 for guided samples.

Every arm uses ``train.dual_clip=3`` (so the wider bound only lifts positive-advantage tokens). The
pool is the seed file (``--seed``, default the hand-written flights lessons in
``configs/experience/flights.jsonl``) with extraction off, so the arms differ in η and the clip only:
the embedded 135M extractor writes no parsable experience (docs/results.md), and a pool filled by a
capable extractor is what the mechanism assumes. Prints ``name=value`` lines per arm — held-out
success at the start and the end, success of guided and unguided training samples, policy tokens,
wall time — then a Markdown table; writes ``OUT/summary.json``. Finished runs are read back, not rerun.

    python benchmarks/experience_mix.py [--config configs/evolve_flights.yaml] [--arms no_pool,eta0.5_clip0.6]
        [--tasks runs/self_evolution/tasks.jsonl] [--seed FILE] [--quick] [KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from statistics import mean
from typing import Any

from learning import ROOT
from self_evolution import QUICK, _finished, check_arguments, train

ARMS: dict[str, list[str]] = {
    "no_pool": ["experience.enabled=false"],
    "eta0.5_clip0.2": ["experience.enabled=true", "experience.eta=0.5", "experience.clip_high=0.2"],
    "eta0.5_clip0.6": ["experience.enabled=true", "experience.eta=0.5", "experience.clip_high=0.6"],
}
COMMON = ["train.dual_clip=3.0", "experience.extract_per_step=0"]


def _step_means(run_dir: Path) -> dict[str, float | None]:
    """Means over the RL steps of the training success, and of guided and unguided samples' success."""
    steps = [
        json.loads(line)
        for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
        if line.strip() and "reward_mean" in line
    ]

    def avg(key: str) -> float | None:
        values = [s[key] for s in steps if key in s]
        return round(mean(values), 4) if values else None

    return {
        "train_success": avg("success_rate"),
        "guided_success": avg("experience/guided_success"),
        "unguided_success": avg("experience/unguided_success"),
    }


def one_arm(config: str, arm: str, out: Path, common: list[str], overwrite: bool) -> dict[str, Any]:
    run_dir = out / arm
    summary = None if overwrite else _finished(run_dir)
    if summary is None:
        summary = train(config, arm, out, [*common, *ARMS[arm]], start_from=out / "start")
    return {
        "arm": arm,
        "start_success": summary["start_success"],
        "final_success": summary["final_success"],
        **_step_means(run_dir),
        "policy_tokens": summary["generated_tokens"],
        "wall_s": summary["wall_s"],
        "peak_rss_gib": summary["peak_rss_gib"],
    }


def table(rows: list[dict[str, Any]]) -> str:
    def pct(value: float | None) -> str:
        return "—" if value is None else f"{value:.0%}"

    lines = [
        "| arm | held-out success (start → end) | training success: guided / unguided samples "
        "| policy tokens | wall |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['arm']} | {pct(r['start_success'])} → {pct(r['final_success'])} | "
            f"{pct(r['guided_success'])} / {pct(r['unguided_success'])} | {r['policy_tokens']:,} | "
            f"{r['wall_s']:.0f} s |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/evolve_flights.yaml")
    parser.add_argument("--out", default="runs/experience_mix", help="where the runs and summary.json go")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"which arms, in order (of {', '.join(ARMS)})")
    parser.add_argument(
        "--tasks",
        default="runs/self_evolution/tasks.jsonl",
        help="the synthesized training tasks (written by benchmarks/self_evolution.py)",
    )
    parser.add_argument("--seed", default="configs/experience/flights.jsonl", help="the pool's seed file")
    parser.add_argument(
        "--quick", action="store_true", help="tiny random model, one RL step (machinery only)"
    )
    parser.add_argument("--overwrite", action="store_true", help="rerun the start and the arms")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="recipe overrides for every run")
    args = parser.parse_args()
    arms = check_arguments(parser, args.arms, ARMS, args.overrides)
    tasks, seed = (ROOT / args.tasks).resolve(), (ROOT / args.seed).resolve()
    for path, what in ((tasks, "--tasks"), (seed, "--seed")):
        if not path.is_file():
            parser.error(f"{what} {str(path)!r} is not a file")
    out = (ROOT / args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    common = [
        *(QUICK if args.quick else []),
        *COMMON,
        *args.overrides,
        f"env.tasks_file={tasks}",
        f"experience.seed={seed}",
    ]
    if args.overwrite or _finished(out / "start") is None:
        train(args.config, "start", out, [*common, "train.steps=0"])
    result: dict[str, Any] = {"config": args.config, "overrides": args.overrides, "seed": str(seed)}
    rows: list[dict[str, Any]] = []
    for arm in arms:
        row = one_arm(args.config, arm, out, common, args.overwrite)
        rows.append(row)
        result["arms"] = rows
        (out / "summary.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        for key, value in row.items():
            if key != "arm":
                print(f"{arm}_{key}={value}", flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
