"""`horizon train` never removes anything outside its run directory: a run name is one plain
directory name, the run directory resolves inside output_dir, and --overwrite checks the whole
recipe (config, model, env) before it moves the old run aside to output_dir/.trash (never deleting
it in place); the trash keeps the most recent runs and pruning touches nothing else."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from horizonrl.cli import app
from horizonrl.train.trash import KEEP, move_to_trash

runner = CliRunner()
CALC = "configs/calc.yaml"
TINY = [
    "model.path=tiny-random",
    "sampling.max_new_tokens=8",
    "agent.max_turns=2",
    "eval.num_tasks=2",
    "sft.enabled=false",
    "train.steps=1",
    "train.tasks_per_step=1",
    "train.group_size=2",
]


def train(output_dir: Path, *extra: str):
    return runner.invoke(app, ["train", CALC, *TINY, f"output_dir={output_dir}", *extra])


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished tiny run (copied by each test that changes it)."""
    root = tmp_path_factory.mktemp("finished") / "runs"
    result = train(root, "name=run")
    assert result.exit_code == 0, result.output
    return root / "run"


@pytest.fixture
def runs(tmp_path, finished_run) -> Path:
    """``tmp_path/runs`` holding the finished run ``run``, next to a file outside output_dir."""
    (tmp_path / "keep.txt").write_text("outside output_dir")
    shutil.copytree(finished_run, tmp_path / "runs" / "run", symlinks=True)
    return tmp_path / "runs"


def assert_refused_and_untouched(result, tmp_path: Path, before: dict[str, bytes], *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    message = result.output.replace("\n", "")
    for fragment in fragments:
        assert fragment in message, message
    assert snapshot(tmp_path) == before


def test_name_dotdot_with_overwrite_removes_nothing_above_output_dir(tmp_path, runs):
    before = snapshot(tmp_path)
    result = train(runs, "name=..", "--overwrite")
    assert_refused_and_untouched(result, tmp_path, before, "name:", "(got '..')", "plain directory name")


def test_name_dot_with_overwrite_removes_no_run(tmp_path, runs):
    before = snapshot(tmp_path)
    result = train(runs, "name=.", "--overwrite")
    assert_refused_and_untouched(result, tmp_path, before, "name:", "(got '.')")


def test_empty_name_with_overwrite_removes_no_run(tmp_path, runs):
    before = snapshot(tmp_path)
    result = train(runs, "name=", "--overwrite")
    assert_refused_and_untouched(result, tmp_path, before, "name:", "(got '')")


def test_absolute_name_is_refused(tmp_path, runs):
    target = tmp_path / "elsewhere"
    before = snapshot(tmp_path)
    result = train(runs, f"name={target}", "--overwrite")
    assert_refused_and_untouched(result, tmp_path, before, "name:", f"(got '{target}')")
    assert not target.exists()


@pytest.mark.parametrize("name", ["a/b", "run/..", "a\\b"])
def test_name_with_a_separator_is_refused(tmp_path, runs, name):
    before = snapshot(tmp_path)
    result = train(runs, f"name={name}", "--overwrite")
    assert_refused_and_untouched(result, tmp_path, before, "name:", "no '/' or '\\'")


def test_a_name_starting_with_a_dot_is_refused_so_the_trash_is_never_a_run(tmp_path, runs):
    before = snapshot(tmp_path)
    result = train(runs, "name=.trash", "--overwrite")
    assert_refused_and_untouched(result, tmp_path, before, "(got '.trash')", "not starting with '.'")


def test_a_run_dir_symlinked_outside_output_dir_is_refused(tmp_path, runs):
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "data.txt").write_text("not a run")
    (runs / "linked").symlink_to(outside)
    before = snapshot(tmp_path)
    result = train(runs, "name=linked", "--overwrite")
    assert_refused_and_untouched(result, tmp_path, before, "outside output_dir", str(outside))
    assert (runs / "linked").is_symlink() and not (runs / ".trash").exists()


def test_overwrite_with_a_bad_model_path_leaves_the_old_run_intact(tmp_path, runs):
    missing = tmp_path / "no-such-model"
    before = snapshot(tmp_path)
    result = train(runs, "name=run", "--overwrite", f"model.path={missing}")
    assert_refused_and_untouched(result, tmp_path, before, str(missing))
    assert not (runs / ".trash").exists()


def test_overwrite_moves_the_old_run_to_the_trash_and_starts_afresh(tmp_path, runs):
    (runs / "run" / "stale.txt").write_text("from the old run")
    old = snapshot(runs / "run")
    result = train(runs, "name=run", "--overwrite")
    assert result.exit_code == 0, result.output
    assert "moved the old run to" in result.output
    (trashed,) = (runs / ".trash").iterdir()
    assert trashed.name.startswith("run-")
    assert snapshot(trashed) == old  # the old run, whole
    assert not (runs / "run" / "stale.txt").exists() and (runs / "run" / "summary.json").is_file()
    assert (tmp_path / "keep.txt").read_text() == "outside output_dir"


def test_the_trash_keeps_the_newest_runs_and_pruning_touches_nothing_else(tmp_path):
    runs = tmp_path / "runs"
    (runs / "other").mkdir(parents=True)
    (runs / "other" / "f.txt").write_text("a run that is not replaced")
    moved = []
    for i in range(KEEP + 2):
        run_dir = runs / "run"
        run_dir.mkdir()
        (run_dir / "n.txt").write_text(str(i))
        moved.append(move_to_trash(run_dir, runs))
    kept = sorted((runs / ".trash").iterdir())
    assert kept == sorted(moved[-KEEP:])
    assert [int((p / "n.txt").read_text()) for p in moved[-KEEP:]] == [2, 3, 4]
    assert (runs / "other" / "f.txt").read_text() == "a run that is not replaced"
