"""`horizon compare RUN_DIR RUN_DIR ...`: finished runs side by side, each with its held-out success
and 95% interval, and which differences between them are larger than noise.

An argument is a run directory (a training run's ``summary.json``, or `horizon eval`'s
``eval.jsonl``) or a folder of one recipe's seeds (run directories ``seed_0``, ``seed_1``, ...; only
the finished ones count). A run's figure is its last held-out eval, read from its eval records
(``eval/step_N.jsonl``), so every task's outcome is known; a run whose records are gone falls back
to ``summary.json`` (no pairing then), and so does one whose records do not give the summary's
figure (an eval file rewritten since).

Differences, ``b - a`` for every pair of arguments in the order given:

- two runs evaluated on the same held-out tasks: a paired bootstrap over the tasks;
- two runs on different tasks: Welch's t over the tasks' outcomes (unpaired);
- two folders of seeds (two or more each): Welch's t over the seeds' figures: seeds of one recipe
  against seeds of another;

and a difference is beyond noise when its 95% interval leaves out 0. One folder alone puts its
seeds side by side, with their mean and its t interval over seeds.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any

from horizonrl.errors import DataError
from horizonrl.stats import (
    Difference,
    Estimate,
    mean_over_runs,
    paired_difference,
    unpaired_difference,
    wilson,
)
from horizonrl.train.eval_records import SINGLE_EVAL_FILE, read_outcomes, step_eval_file, success_estimate

SUMMARY = "summary.json"
#: most arguments (runs or seed folders) side by side: every pair is compared
MAX_ARMS = 12
_SEED_DIR = re.compile(r"^seed_(\d+)$")


@dataclass(frozen=True)
class RunResult:
    """A run's last held-out eval: its success with a 95% interval and, where its records are on
    disk, each task's outcomes."""

    label: str
    run_dir: Path
    step: int | None
    finished: bool
    estimate: Estimate
    outcomes: dict[str, list[float]] | None
    source: str

    def per_task(self) -> dict[str, float]:
        return {task: sum(xs) / len(xs) for task, xs in (self.outcomes or {}).items()}


@dataclass(frozen=True)
class Arm:
    """One argument: a run, or a recipe's seeds (``seeds`` lists the finished seed runs)."""

    label: str
    runs: list[RunResult]
    seeds: bool = False
    left_out: list[str] = field(default_factory=list)

    @property
    def estimate(self) -> Estimate:
        """A run's own estimate; over two or more seeds, the mean and its t interval over seeds."""
        if len(self.runs) == 1:
            return self.runs[0].estimate
        return mean_over_runs([r.estimate.value for r in self.runs])


@dataclass(frozen=True)
class Pair:
    a: str
    b: str
    difference: Difference | None
    note: str

    def as_dict(self) -> dict[str, Any]:
        d = self.difference
        figures = {} if d is None else {"delta": d.delta, "low": d.low, "high": d.high, "method": d.method}
        verdict = d.verdict() if d is not None else "not compared"
        return {"a": self.a, "b": self.b, **figures, "verdict": verdict, "note": self.note}


def _summary(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / SUMMARY
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise DataError(f"{path}: not valid JSON ({exc}); is the run's summary damaged?") from None
    if not isinstance(data, dict):
        raise DataError(f"{path}: not a run summary (a JSON object)")
    return data


def read_run(run_dir: Path, label: str | None = None) -> RunResult:
    """The last held-out eval of the run in ``run_dir``; a DataError when it holds none."""
    run_dir = Path(run_dir)
    label = label or str(run_dir)
    summary = _summary(run_dir)
    if summary is None:
        records = run_dir / SINGLE_EVAL_FILE
        if not records.is_file():
            raise DataError(
                f"{str(run_dir)!r} is not a run directory: it holds neither summary.json (a training "
                f"run) nor {SINGLE_EVAL_FILE} (`horizon eval`), nor seed_N run directories"
            )
        outcomes = read_outcomes(records)
        if not outcomes:
            raise DataError(f"{records}: holds no eval records")
        return RunResult(label, run_dir, None, True, success_estimate(outcomes), outcomes, str(records))
    evals = {int(k): v for k, v in (summary.get("evals") or {}).items() if v is not None}
    if not evals:
        raise DataError(f"{str(run_dir)!r}: its summary.json holds no held-out eval yet")
    step = max(evals)
    finished = bool(summary.get("finished"))
    value, n = float(evals[step]), int(summary.get("eval_tasks") or 0)
    sft = summary.get("sft") if isinstance(summary.get("sft"), bool) else None
    path = step_eval_file(run_dir, step, sft)
    outcomes = read_outcomes(path) if path is not None else {}
    if outcomes and abs(success_estimate(outcomes).value - value) < 1e-6:  # the records of that figure
        return RunResult(label, run_dir, step, finished, success_estimate(outcomes), outcomes, str(path))
    bounds = (summary.get("eval_intervals") or {}).get(str(step))
    if bounds:
        estimate = Estimate(value, float(bounds[0]), float(bounds[1]), n, "summary")
    elif n > 0:
        estimate = wilson(value * n, n)
    else:
        estimate = Estimate(value, value, value, 0, "exact")
    return RunResult(label, run_dir, step, finished, estimate, None, str(run_dir / SUMMARY))


def seed_dirs(folder: Path) -> list[Path]:
    """The ``seed_N`` run directories in ``folder``, by N."""
    found = [(int(m.group(1)), p) for p in folder.iterdir() if p.is_dir() and (m := _SEED_DIR.match(p.name))]
    return [p for _, p in sorted(found)]


def read_arm(path: Path) -> Arm:
    """A run directory, or a folder of a recipe's ``seed_N`` runs (its finished ones)."""
    path = Path(path)
    if not path.is_dir():
        raise DataError(f"{str(path)!r} is not a directory; give run directories or folders of seed_N runs")
    seeds = [] if (path / SUMMARY).is_file() or (path / SINGLE_EVAL_FILE).is_file() else seed_dirs(path)
    if not seeds:
        return Arm(str(path), [read_run(path)])
    runs, left_out = [], []
    for seed in seeds:
        summary = _summary(seed)
        if summary is None or not summary.get("finished"):
            left_out.append(seed.name)
            continue
        runs.append(read_run(seed, f"{path}/{seed.name}"))
    if not runs:
        raise DataError(f"{str(path)!r}: none of its seed runs ({', '.join(left_out)}) has finished yet")
    return Arm(str(path), runs, seeds=True, left_out=left_out)


def difference(a: Arm, b: Arm) -> tuple[Difference | None, str]:
    """``b - a`` and what it rests on (see the module doc); None with the reason when the two
    cannot be compared."""
    if len(a.runs) == 1 and len(b.runs) == 1 and not (a.seeds or b.seeds):
        ra, rb = a.runs[0], b.runs[0]
        if ra.outcomes is None or rb.outcomes is None:
            return None, "no per-task records on one side (its eval files are gone)"
        pa, pb = ra.per_task(), rb.per_task()
        if pa.keys() == pb.keys():
            tasks = sorted(pa)
            return paired_difference(
                [pa[t] for t in tasks], [pb[t] for t in tasks]
            ), f"{len(tasks)} shared tasks"
        return unpaired_difference(
            list(pa.values()), list(pb.values())
        ), "different tasks: unpaired over tasks"
    if len(a.runs) >= 2 and len(b.runs) >= 2:
        values = ([r.estimate.value for r in a.runs], [r.estimate.value for r in b.runs])
        return unpaired_difference(*values), f"{len(a.runs)} vs {len(b.runs)} seeds"
    return None, "needs two or more finished seeds on each side (or two single runs)"


def compare_runs(paths: list[Path]) -> dict[str, Any]:
    """Read every argument, compare every pair; the result as a JSON-ready dict (``arms``, ``pairs``
    and, for one folder of seeds, ``mean_over_seeds``)."""
    if not paths:
        raise DataError("give run directories (or folders of seed_N runs) to compare")
    if len(paths) > MAX_ARMS:
        raise DataError(
            f"{len(paths)} runs given; at most {MAX_ARMS} go side by side (every pair is compared)"
        )
    arms = [read_arm(p) for p in paths]
    left_out = [f"{arm.label}/{name}" for arm in arms for name in arm.left_out]
    overall = None
    if len(arms) == 1 and arms[0].seeds:
        group = arms[0]
        overall = group.estimate.as_dict() if len(group.runs) >= 2 else None
        arms = [Arm(r.label, [r]) for r in group.runs]
    pairs = []
    for a, b in combinations(arms, 2):
        diff, note = difference(a, b)
        pairs.append(Pair(a.label, b.label, diff, note))
    return {
        "arms": [_arm_dict(arm) for arm in arms],
        "pairs": [p.as_dict() for p in pairs],
        "mean_over_seeds": overall,
        "left_out": left_out,  # seed runs not finished yet
    }


def _arm_dict(arm: Arm) -> dict[str, Any]:
    return {
        "label": arm.label,
        "success": arm.estimate.as_dict(),
        "runs": [
            {
                "label": r.label,
                "step": r.step,
                "finished": r.finished,
                "tasks": len(r.outcomes) if r.outcomes is not None else r.estimate.n,
                "success": r.estimate.as_dict(),
                "source": r.source,
            }
            for r in arm.runs
        ],
        "seeds": arm.seeds,
        "left_out": arm.left_out,
    }
