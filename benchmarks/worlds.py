"""The world benchmark: normalized reward (achieved / the level's max) on the shipped worlds'
validation levels, per world and averaged, for a random agent, the planners, the embedded model,
the embedded model after SFT on the planners' plans and after GRPO on the training levels; the
inverse-skin drop (same rules, inverted names); and the generation funnel with the embedded model
as the coder.

    python benchmarks/worlds.py [--quick] [--themes N] [KEY=VALUE ...]

Runs ``horizon train configs/worlds.yaml`` (its evals: the base model, the SFT start and the final
policy), ``horizon eval`` of the final policy and of the base model with every world's inverse skin,
and ``horizon worlds new`` on N themes. Writes ``OUT/summary.json`` and prints ``name=value`` lines.
``--quick`` uses a tiny random model and a few steps (a check of the machinery, no learning).
``KEY=VALUE`` overrides go to the training run and the evals.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from horizonrl.types import read_trajectories
from horizonrl.worlds.env import WorldEnv, WorldOptions
from horizonrl.worlds.package import open_world, shipped_names
from horizonrl.worlds.report import world_breakdown
from horizonrl.worlds.runner import InProcessRunner
from horizonrl.worlds.validate import episode, normalized

ROOT = Path(__file__).resolve().parents[1]
HORIZON = [sys.executable, "-m", "horizonrl.cli"]
THEMES = [
    "a lighthouse keeper refuelling lamps before dusk",
    "a beekeeper moving hives between flower fields",
    "a submarine mapping an underwater cave",
    "a librarian shelving returned books by number",
    "a farmer rotating crops across seasons",
    "a courier crossing a city with one-way streets",
]
QUICK = [
    "model.path=tiny-random",
    "sampling.max_new_tokens=16",
    "agent.max_turns=4",
    "eval.num_tasks=13",
    "sft.num_demos=8",
    "train.steps=1",
    "train.tasks_per_step=2",
    "train.group_size=2",
]


def _run(cmd: list[str], log: Path) -> float:
    start = time.perf_counter()
    with log.open("a") as sink:
        sink.write(f"$ {' '.join(cmd)}\n")
        sink.flush()
        proc = subprocess.run(
            cmd, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "160"}
        )
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[2:5])} failed (exit {proc.returncode}); see {log}")
    return time.perf_counter() - start


async def scripted_scores(episodes_per_level: int) -> dict[str, dict[str, float]]:
    """The random agent's and the planner's normalized reward per world on the validation levels."""
    rng = random.Random(0)
    out = {}
    for name in shipped_names():
        package = open_world(name)
        runner = InProcessRunner(package)
        rand, plan = [], []
        for rec in package.levels("val"):
            plan.append(
                normalized(
                    float((await episode(runner, package, rec, {"kind": "epsilon", "eps": 0.0}))["reward"]),
                    rec.max_reward,
                )
            )
            for _ in range(episodes_per_level):
                agent = {"kind": "random", "seed": rng.randrange(1 << 30)}
                rand.append(
                    normalized(float((await episode(runner, package, rec, agent))["reward"]), rec.max_reward)
                )
        out[name] = {"random": statistics.fmean(rand), "planner": statistics.fmean(plan)}
    return out


def breakdown(path: Path, world: str = "all") -> dict[str, Any]:
    trajectories = read_trajectories(path)
    tasks = WorldEnv.make_tasks("val", 5 * len(shipped_names()), 0, WorldOptions(world=world))
    return world_breakdown(trajectories, tasks)


def per_world(b: dict[str, Any]) -> dict[str, float]:
    return {name: w["normalized_reward"] for name, w in b["per_world"].items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--themes", type=int, default=5, help="Themes for the generation funnel (0 skips it)."
    )
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "worlds_bench")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    log = out / "bench.log"
    overrides = (QUICK if args.quick else []) + list(args.overrides)
    name = out.name
    summary: dict[str, Any] = {"overrides": overrides}

    summary["scripted"] = scripted = asyncio.run(scripted_scores(2 if args.quick else 8))

    run_dir = out.parent / name
    wall = _run(
        [*HORIZON, "train", "configs/worlds.yaml", f"name={name}", f"output_dir={out.parent}", *overrides],
        log,
    )
    train = json.loads((run_dir / "summary.json").read_text())
    finals = sorted((run_dir / "eval").glob("step_*.jsonl"))
    evals = {
        "base": breakdown(run_dir / "eval" / "base.jsonl"),
        "sft": breakdown(run_dir / "eval" / "start.jsonl"),
        "grpo": breakdown(finals[-1]),
    }
    summary.update(train_wall_s=round(wall, 1), train_peak_rss_gib=train.get("peak_rss_gib"), evals=evals)

    inverse_worlds = ",".join(n for n in shipped_names() if "inverse" in open_world(n).spec.skin.variants)
    inv: dict[str, Any] = {}
    for label, checkpoint in (("base", []), ("grpo", ["--checkpoint", str(run_dir)])):
        path = out / f"inverse_{label}.jsonl"
        _run(
            [
                *HORIZON,
                "eval",
                "configs/worlds.yaml",
                *checkpoint,
                "--out",
                str(path),
                f"name={name}_inverse",
                f"output_dir={out.parent}",
                f"env.options.world={inverse_worlds}",
                "env.options.skin=inverse",
                f"eval.num_tasks={5 * len(inverse_worlds.split(','))}",
                *overrides,
            ],
            log,
        )
        inverse = breakdown(path, inverse_worlds)
        aligned = {w: s for w, s in per_world(evals[label]).items() if w in inverse["per_world"]}
        a, i = statistics.fmean(aligned.values()), inverse["mean"]
        inv[label] = {
            "aligned": a,
            "inverse": i,
            "drop_pct": (100 * (a - i) / a) if a > 0 else None,
            "per_world_inverse": per_world(inverse),
        }
    summary["inverse_skin"] = inv

    if args.themes:
        gen_out = out / "generated"
        _run(
            [*HORIZON, "worlds", "new", *THEMES[: args.themes], "--out", str(gen_out), "--repairs", "2"], log
        )
        summary["funnel"] = json.loads((gen_out / "funnel.json").read_text())

    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    for world in shipped_names():
        cols = [f"random:{scripted[world]['random']:.2f}", f"planner:{scripted[world]['planner']:.2f}"]
        cols += [f"{k}:{per_world(evals[k]).get(world, 0.0):.2f}" for k in ("base", "sft", "grpo")]
        print(f"world_{world}={' '.join(cols)}")
    print(f"mean_random={statistics.fmean(s['random'] for s in scripted.values()):.3f}")
    print(f"mean_planner={statistics.fmean(s['planner'] for s in scripted.values()):.3f}")
    for k in ("base", "sft", "grpo"):
        print(f"mean_{k}={evals[k]['mean']:.3f}")
    for axis, score in evals["grpo"]["by_axis"].items():
        print(f"grpo_{axis}={score:.3f}")
    for label, v in inv.items():
        drop = "n/a (aligned score 0)" if v["drop_pct"] is None else f"{v['drop_pct']:.0f}%"
        print(f"inverse_skin_{label}=aligned:{v['aligned']:.3f} inverse:{v['inverse']:.3f} drop:{drop}")
    if "funnel" in summary:
        print("funnel=" + " ".join(f"{k}:{v}" for k, v in summary["funnel"].items()))
    print(f"train_wall_s={summary['train_wall_s']}")
    print(f"train_peak_rss_gib={summary['train_peak_rss_gib']}")


if __name__ == "__main__":
    main()
