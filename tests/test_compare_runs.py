"""`horizon compare RUN_DIR ...`: finished runs (and a recipe's seeds) side by side with 95% intervals
and a verdict on each difference, on run directories fabricated on disk (summary.json and eval
records as a training run writes them), through the real CLI in a subprocess; and the intervals a
training run's eval points carry into metrics.jsonl, curves.png and TensorBoard."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from horizonrl.cli import app
from horizonrl.stats import mean_over_runs, paired_difference, unpaired_difference, wilson
from horizonrl.train.compare_runs import compare_runs, read_run
from horizonrl.train.tracking import Tracker, draw_interval, plot_curves, read_metrics
from horizonrl.types import Message, Trajectory

ROOT = Path(__file__).resolve().parents[1]
TASKS = [f"calc-test-{i:06d}" for i in range(100)]


def record(task: str, solved: bool, sample: int = 0) -> str:
    return Trajectory(
        id=f"{task}#{sample}",
        task_id=task,
        group_id=task,
        env="calc",
        messages=[Message(role="user", content="2 + 2?")],
        prompt_ids=[1, 2],
        reward=1.0 if solved else 0.0,
        finish="finished",
        metrics={"success": 1.0 if solved else 0.0},
    ).to_json()


def fake_run(
    run_dir: Path,
    solved: set[int],
    *,
    step: int = 8,
    finished: bool = True,
    tasks: list[str] = TASKS,
    records: bool = True,
) -> Path:
    """A training run's directory as `horizon train` leaves it: summary.json (evals at 0 and
    ``step``) and the final eval's records, tasks ``solved`` solved."""
    (run_dir / "eval").mkdir(parents=True)
    success = len(solved) / len(tasks)
    summary = {
        "name": run_dir.name,
        "env": "calc",
        "steps": step,
        "finished": finished,
        "start_success": 0.1,
        "final_success": success,
        "eval_tasks": len(tasks),
        "evals": {"0": 0.1, str(step): success},
    }
    (run_dir / "summary.json").write_text(json.dumps(summary))
    if records:
        lines = [record(t, i in solved) for i, t in enumerate(tasks)]
        (run_dir / "eval" / f"step_{step:06d}.jsonl").write_text("\n".join(lines) + "\n")
    return run_dir


def horizon(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "horizonrl.cli", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "250"},
    )


# ------------------------------------------------------------------ runs side by side
def test_runs_on_the_same_tasks_get_a_paired_difference_and_a_verdict(tmp_path: Path) -> None:
    a = fake_run(tmp_path / "a", set(range(30)))
    b = fake_run(tmp_path / "b", set(range(70)))  # +40 points on the same tasks
    c = fake_run(tmp_path / "c", set(range(2, 34)))  # +2 points: noise
    result = horizon("compare", a, b, c, "--json", tmp_path / "cmp.json")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "30.0% [21.9, 39.6]" in out and "70.0% [60.4, 78.1]" in out  # Wilson at n = 100
    assert (
        f"{b} vs {a}: +40.0 points" in out and "paired bootstrap over tasks; 100 shared tasks): better" in out
    )
    assert f"{c} vs {a}: +2.0 points" in out and "within noise" in out
    assert f"{c} vs {b}: -38.0 points" in out and "): worse" in out
    assert "2 of 3 differences beyond noise" in out
    saved = json.loads((tmp_path / "cmp.json").read_text())
    pa = [1.0 if i < 30 else 0.0 for i in range(100)]
    pb = [1.0 if i < 70 else 0.0 for i in range(100)]
    assert saved["pairs"][0]["delta"] == pytest.approx(0.4)
    assert saved["pairs"][0]["low"] == pytest.approx(paired_difference(pa, pb).low)
    assert [arm["runs"][0]["step"] for arm in saved["arms"]] == [8, 8, 8]


def test_runs_on_different_tasks_are_compared_unpaired(tmp_path: Path) -> None:
    a = fake_run(tmp_path / "a", set(range(20)), tasks=TASKS[:50])
    b = fake_run(tmp_path / "b", set(range(40)), tasks=TASKS[50:])
    (pair,) = compare_runs([a, b])["pairs"]
    ya, yb = [1.0] * 20 + [0.0] * 30, [1.0] * 40 + [0.0] * 10
    assert pair["method"].startswith("Welch t") and "different tasks" in pair["note"]
    assert pair["low"] == pytest.approx(unpaired_difference(ya, yb).low) and pair["verdict"] == "better"


def test_seeds_of_two_recipes_are_compared_over_seeds_and_unfinished_seeds_left_out(tmp_path: Path) -> None:
    for k, solved in enumerate((30, 34, 26)):
        fake_run(tmp_path / "base" / f"seed_{k}", set(range(solved)))
    for k, solved in enumerate((55, 61, 58)):
        fake_run(tmp_path / "tuned" / f"seed_{k}", set(range(solved)))
    fake_run(tmp_path / "tuned" / "seed_3", set(range(99)), step=3, finished=False)  # being written
    result = horizon("compare", tmp_path / "base", tmp_path / "tuned")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert (
        "3 seeds" in out
        and f"{tmp_path / 'tuned'}/seed_2" in out
        and "seed_3" not in out.split("left out")[0]
    )
    assert f"left out (not finished): {tmp_path / 'tuned'}/seed_3" in out
    expected = unpaired_difference([0.30, 0.34, 0.26], [0.55, 0.61, 0.58])
    assert (
        f"+{100 * expected.delta:.1f} points" in out and "Welch t" in out and "3 vs 3 seeds): better" in out
    )
    mean = mean_over_runs([0.30, 0.34, 0.26])
    assert f"{100 * mean.value:.1f}% [{100 * mean.low:.1f}, {100 * mean.high:.1f}]" in out


def test_one_folder_of_seeds_puts_its_seeds_side_by_side_with_their_mean(tmp_path: Path) -> None:
    for k, solved in enumerate((30, 34, 26)):  # each seed solves other tasks
        fake_run(tmp_path / "learning" / f"seed_{k}", set(random.Random(k).sample(range(100), solved)))
    result = compare_runs([tmp_path / "learning"])
    assert [arm["label"] for arm in result["arms"]] == [f"{tmp_path / 'learning'}/seed_{k}" for k in range(3)]
    assert len(result["pairs"]) == 3 and all(p["verdict"] == "within noise" for p in result["pairs"])
    assert result["mean_over_seeds"]["method"] == "t"
    assert result["mean_over_seeds"]["value"] == pytest.approx(0.30)


def test_a_run_without_its_eval_records_falls_back_to_its_summary(tmp_path: Path) -> None:
    a = fake_run(tmp_path / "a", set(range(30)), records=False)
    b = fake_run(tmp_path / "b", set(range(40)))
    assert read_run(a).estimate == wilson(30, 100) and read_run(a).outcomes is None
    (pair,) = compare_runs([a, b])["pairs"]
    assert pair["verdict"] == "not compared" and "records" in pair["note"]
    rewritten = fake_run(tmp_path / "c", set(range(30)))  # its eval file no longer gives its figure
    (rewritten / "eval" / "step_000008.jsonl").write_text(record(TASKS[0], True) + "\n")
    assert read_run(rewritten).outcomes is None and read_run(rewritten).estimate == wilson(30, 100)


def test_an_eval_directory_is_a_run_too(tmp_path: Path) -> None:
    folder = tmp_path / "calc"
    folder.mkdir()
    lines = [record(t, i < 10, s) for i, t in enumerate(TASKS[:20]) for s in range(4)]
    (folder / "eval.jsonl").write_text("\n".join(lines) + "\n")
    run = read_run(folder)
    assert run.step is None and len(run.outcomes or {}) == 20
    assert run.estimate.method == "bootstrap" and run.estimate.value == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["{tmp}/missing"], "does not exist; give a YAML recipe"),
        (["{tmp}/a", "{tmp}/missing"], "is not a directory"),
        (["{tmp}/empty"], "is not a run directory"),
        (["{tmp}/unfinished"], "none of its seed runs (seed_0) has finished"),
        (["{tmp}/a", "--algorithms", "grpo"], "run directories are only read"),
        (["{tmp}/a", "{tmp}/a/summary.json"], "is not a directory"),
        (["{tmp}/a"] * 13, "at most 12"),
        (["{tmp}/broken"], "not valid JSON"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], expected: str) -> None:
    fake_run(tmp_path / "a", set(range(3)))
    (tmp_path / "empty").mkdir()
    fake_run(tmp_path / "unfinished" / "seed_0", set(), finished=False)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "summary.json").write_text("{not json")
    result = CliRunner().invoke(app, ["compare", *(a.format(tmp=tmp_path) for a in args)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and "Traceback" not in result.output


# ------------------------------------------------------------------ intervals on training curves
def test_eval_intervals_reach_the_metrics_tensorboard_and_curves(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with Tracker(tmp_path) as tracker:
        tracker.log(0, {"eval/success": 0.3, "eval/success_low": 0.219, "eval/success_high": 0.396})
        tracker.log(1, {"reward_mean": 0.5, "success_rate": 0.4})
        tracker.log(2, {"eval/success": 0.5, "eval/success_low": 0.404, "eval/success_high": 0.596})
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [(m["eval/success_low"], m["eval/success_high"]) for m in records if "eval/success" in m] == [
        (0.219, 0.396),
        (0.404, 0.596),
    ]
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [e.value for e in events.Scalars("eval/success_high")] == pytest.approx([0.396, 0.596])

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    assert draw_interval(ax, records, "eval/success") and not draw_interval(ax, records, "reward_mean")
    (band,) = ax.collections[:1]  # the shaded band spans low .. high at every eval point
    ys = band.get_paths()[0].vertices[:, 1]
    assert min(ys) == pytest.approx(0.219) and max(ys) == pytest.approx(0.596)
    plt.close(fig)
    assert plot_curves(tmp_path).stat().st_size > 1000
