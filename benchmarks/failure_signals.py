"""Failures as signals, measured across seeds: does penalising a MAST failure mode in the reward lower
its prevalence without lowering success?

Per seed, the recipe's start (base eval, SFT warm start, start eval) runs once (``seed_K/start``, a
``horizon train`` with ``train.steps=0``); then two RL arms start from it (``--start-from``), the same
weights, tasks and budget, and differ only in ``train.failure_penalties``:

- ``seed_K/plain``: the recipe as it is;
- ``seed_K/penalized``: the reward minus the penalty of each mode the detectors find.

The held-out evals of both final policies are scored by the same detectors that shape the reward:
per seed, success and the share of held-out trajectories showing each mode a detector finds (the
penalised ones, and the others, so that a mode the penalty pushes the policy into shows too), for the
start and each arm; then the paired differences (penalized minus plain) per seed, their mean and their
worst.
A finished run is read back, not repeated, so an interrupted benchmark continues with the same command.
Writes ``OUT/summary.json``.

    python benchmarks/failure_signals.py [--seeds 3] [--penalties 3.1=0.2] [--quick] [KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from learning import HORIZON, QUICK, ROOT, _run, check_overrides, machine, seed_order, seed_overrides

from horizonrl.analysis.detectors import DETECTORS
from horizonrl.analysis.mast import MODES
from horizonrl.analysis.signals import found_modes
from horizonrl.train.rundir import finished_summary
from horizonrl.types import read_trajectories

ARMS = ("plain", "penalized")


def parse_penalties(text: str) -> dict[str, float]:
    """``"3.1=0.2,1.3=0.1"`` -> ``{"3.1": 0.2, "1.3": 0.1}``; a ValueError names what is wrong. Only
    modes with a detector: the benchmark scores the held-out evals with the detectors."""
    valid = [m.id for m in MODES]
    penalties: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        mode, sep, weight = part.partition("=")
        if not sep:
            raise ValueError(f"{part!r} is not MODE=PENALTY (e.g. 3.1=0.2)")
        if mode not in valid:
            raise ValueError(f"unknown mode {mode!r}; valid: {', '.join(valid)}")
        if mode not in DETECTORS:
            raise ValueError(
                f"mode {mode} has no detector, and the evals are scored by the detectors; "
                f"modes with one: {', '.join(sorted(DETECTORS))}"
            )
        try:
            penalties[mode] = float(weight)
        except ValueError:
            raise ValueError(f"penalty for {mode} must be a number, got {weight!r}") from None
        if penalties[mode] <= 0:
            raise ValueError(f"penalty for {mode} must be > 0, got {weight!r}")
    if not penalties:
        raise ValueError("no penalties given (e.g. 3.1=0.2)")
    return penalties


def score(path: Path, modes: list[str]) -> dict[str, Any]:
    """Success and the share of trajectories in ``path`` where the detectors find each of ``modes``,
    over all of them and over the failed ones (a mode such as 3.1 can only occur in a failure, so its
    share of all trajectories falls whenever success rises; its share of failures does not)."""
    trajs = read_trajectories(path)
    if not trajs:
        raise SystemExit(f"{path} holds no trajectories")
    found = [found_modes(t, modes) for t in trajs]
    failed = [f for f, t in zip(found, trajs, strict=True) if not t.success]
    return {
        "n": len(trajs),
        "success": sum(t.success for t in trajs) / len(trajs),
        "prevalence": {m: sum(m in f for f in found) / len(trajs) for m in modes},
        "share_of_failures": {m: sum(m in f for f in failed) / len(failed) if failed else 0.0 for m in modes},
    }


def _final_eval(run_dir: Path, summary: dict[str, Any]) -> Path:
    return run_dir / "eval" / f"step_{max(int(k) for k in summary['evals']):06d}.jsonl"


def one_seed(
    config: str, seed: int, out: Path, extra: list[str], penalties: dict[str, float]
) -> dict[str, Any]:
    """The start and both arms of one seed (each run only if not finished yet); their scores."""
    root = out / f"seed_{seed}"
    common = [*extra, *seed_overrides(seed), f"output_dir={root}"]
    start_dir = root / "start"
    root.mkdir(parents=True, exist_ok=True)
    if finished_summary(start_dir) is None:
        _run(
            [*HORIZON, "train", config, *common, "name=start", "train.steps=0", "--overwrite"],
            root / "start.log",
        )
    arms_extra = {"plain": [], "penalized": [f"train.failure_penalties={json.dumps(penalties)}"]}
    modes = sorted(DETECTORS)
    figures: dict[str, Any] = {"seed": seed, "start": score(start_dir / "eval" / "start.jsonl", modes)}
    for arm in ARMS:
        run_dir = root / arm
        summary = finished_summary(run_dir)
        if summary is None:
            cmd = [*HORIZON, "train", config, *common, f"name={arm}", *arms_extra[arm]]
            _run([*cmd, "--start-from", str(start_dir), "--overwrite"], root / f"{arm}.log")
            summary = finished_summary(run_dir)
            if summary is None:
                raise SystemExit(f"{run_dir} did not finish (see {root / f'{arm}.log'})")
        figures[arm] = {**score(_final_eval(run_dir, summary), modes), "wall_s": summary["wall_s"]}
    figures["success_diff_pts"] = round(
        100 * (figures["penalized"]["success"] - figures["plain"]["success"]), 1
    )
    figures["prevalence_diff_pts"] = {
        m: round(100 * (figures["penalized"]["prevalence"][m] - figures["plain"]["prevalence"][m]), 1)
        for m in modes
    }
    figures["failure_share_diff_pts"] = {
        m: round(
            100 * (figures["penalized"]["share_of_failures"][m] - figures["plain"]["share_of_failures"][m]), 1
        )
        for m in sorted(penalties)
    }
    return figures


def aggregate(seeds: list[dict[str, Any]], modes: list[str]) -> dict[str, Any]:
    """Mean and worst of the paired differences: worst success is the lowest, worst prevalence the
    highest (for a penalised mode, the seed where the penalty lowered it least)."""
    success = [s["success_diff_pts"] for s in seeds]
    result: dict[str, Any] = {
        "success_diff_pts_mean": round(statistics.mean(success), 1),
        "success_diff_pts_worst": min(success),
    }
    for m in modes:
        diffs = [s["prevalence_diff_pts"][m] for s in seeds]
        result[f"prevalence_{m}_diff_pts_mean"] = round(statistics.mean(diffs), 1)
        result[f"prevalence_{m}_diff_pts_worst"] = max(diffs)
    for m in seeds[0]["failure_share_diff_pts"]:
        diffs = [s["failure_share_diff_pts"][m] for s in seeds]
        result[f"share_of_failures_{m}_diff_pts_mean"] = round(statistics.mean(diffs), 1)
        result[f"share_of_failures_{m}_diff_pts_worst"] = max(diffs)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="how many seeds (0, 1, ...)")
    parser.add_argument("--seed-order", default=None, help="the seeds to run, in this order (e.g. 1,2,0)")
    parser.add_argument("--config", default="configs/calc.yaml")
    parser.add_argument("--penalties", default="3.1=0.2", help="MODE=PENALTY[,MODE=PENALTY...]")
    parser.add_argument("--out", default="runs/failure_signals", help="where the runs and summary.json go")
    parser.add_argument("--quick", action="store_true", help="tiny random model, two steps (machinery only)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="recipe overrides for every run")
    args = parser.parse_args()
    check_overrides(parser, args.overrides, "train.lr=2.5e-4")
    try:
        penalties = parse_penalties(args.penalties)
    except ValueError as exc:
        parser.error(f"--penalties: {exc}")
    order = seed_order(parser, args.seeds, args.seed_order)
    out = (ROOT / args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    extra = [*(QUICK if args.quick else []), *args.overrides]
    modes = sorted(DETECTORS)
    result: dict[str, Any] = {
        "config": args.config,
        "overrides": args.overrides,
        "penalties": penalties,
        "machine": machine(),
        "quick": args.quick,
        "seeds": [],
    }
    print(f"machine={result['machine']}", flush=True)
    print(f"penalties={json.dumps(penalties)}", flush=True)
    for seed in order:
        figures = one_seed(args.config, seed, out, extra, penalties)
        result["seeds"].append(figures)
        result.update(aggregate(result["seeds"], modes))
        (out / "summary.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        for stage in ("start", *ARMS):
            row = figures[stage]
            rates = " ".join(f"{m}:{row['prevalence'][m]:.2f}" for m in modes)
            of_failed = " ".join(f"{m}:{row['share_of_failures'][m]:.2f}" for m in sorted(penalties))
            print(
                f"seed{seed}_{stage}=success:{row['success']:.2f} {rates} n:{row['n']} "
                f"of_failures:{of_failed}",
                flush=True,
            )
        diffs = " ".join(f"{m}:{figures['prevalence_diff_pts'][m]:+.1f}" for m in modes)
        of_failed = " ".join(f"{m}:{v:+.1f}" for m, v in figures["failure_share_diff_pts"].items())
        print(
            f"seed{seed}_diff_pts=success:{figures['success_diff_pts']:+.1f} {diffs} of_failures:{of_failed}",
            flush=True,
        )
    for key, value in aggregate(result["seeds"], modes).items():
        print(f"{key}={value}")


if __name__ == "__main__":
    main()
