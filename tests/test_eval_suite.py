"""`horizon eval SUITE.yaml`: one policy on every recipe a suite lists, one table (markdown and
JSON) of each entry's held-out success with its 95% interval; and every mistake in a suite file is
one line and exit 2 before any model loads. Through the real CLI in a subprocess; the end-to-end
suite plays the envs' scripted oracles on the tiny random model (nothing to download)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from horizonrl.cli import app
from horizonrl.config.suite import is_suite, read_suite
from horizonrl.errors import ConfigError
from horizonrl.stats import wilson

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def horizon(*args: str | Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "horizonrl.cli", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200", "OMP_NUM_THREADS": "1"},
    )


def write_suite(folder: Path, body: str, name: str = "suite.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(f"output_dir: {folder / 'runs'}\n{body}")
    return path


def test_a_suite_evaluates_every_entry_and_writes_one_table(tmp_path: Path) -> None:
    """Three entries (two recipes, one of them twice), two samples per task at T = 1: the oracle."""
    suite = write_suite(
        tmp_path,
        "name: smoke\n"
        "overrides: [model.path=tiny-random, eval.num_tasks=4, eval.concurrency=4]\n"
        "suite:\n"
        "  - recipe: configs/calc.yaml\n"
        "  - recipe: configs/flights.yaml\n"
        "    overrides: [eval.num_tasks=3]\n"
        "  - recipe: configs/calc.yaml\n"
        "    name: calc3\n"
        "    overrides: ['env.options={min_ops: 3, max_ops: 3}']\n",
    )
    sampled = ["eval.samples_per_task=2", "eval.temperature=1.0"]  # the command line's: every entry
    result = horizon("eval", suite, *sampled, "--policy", "oracle", "--json", tmp_path / "all.json")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    out_dir = tmp_path / "runs" / "smoke"
    table = json.loads((out_dir / "suite.json").read_text())
    assert table == json.loads((tmp_path / "all.json").read_text())
    assert table["suite"] == "smoke" and table["policy"] == "oracle"
    rows = {r["entry"]: r for r in table["entries"]}
    assert list(rows) == ["calc", "flights", "calc3"]
    assert [rows[e]["tasks"] for e in rows] == [4, 3, 4] and rows["flights"]["env"] == "flights"
    for name, row in rows.items():  # the oracle solves every task: 100% with its Wilson interval
        expected = wilson(row["tasks"], row["tasks"])
        assert row["samples_per_task"] == 2 and row["pass@2"]["value"] == row["maj@2"]["value"] == 1.0
        assert row["success"]["value"] == 1.0 and row["success"]["method"] == "wilson"
        assert row["success"]["low"] == pytest.approx(expected.low), name
        assert Path(row["records"]) == out_dir / name / "eval.jsonl" and Path(row["records"]).is_file()
    three_steps = [json.loads(line) for line in (out_dir / "calc3" / "eval.jsonl").read_text().splitlines()]
    assert len(three_steps) == 8 and all(r["num_turns"] == 4 for r in three_steps)  # 3 steps, finish
    md = (out_dir / "suite.md").read_text()
    assert (
        "| calc3 | calc | 4 | 2 | 100.0% [51.0, 100.0] | wilson | pass@2 100.0% [51.0, 100.0] · maj@2" in md
    )
    assert "| flights | flights | 3 | 2 | 100.0% [43.9, 100.0] | wilson |" in md
    assert "eval suite smoke" in result.stdout and "100.0% [43.9, 100.0]" in result.stdout
    assert "calc3: pass@2 100.0% [51.0, 100.0]" in result.stdout


def test_a_suite_naming_a_missing_recipe_is_one_line_before_any_model_loads(tmp_path: Path) -> None:
    suite = write_suite(tmp_path, "suite:\n  - recipe: configs/calc.yaml\n  - recipe: configs/nope.yaml\n")
    # a model path that does not exist: had a model been loaded first, the error would name it
    result = horizon("eval", suite, "model.path=/nonexistent/model", "--checkpoint", "runs", timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, lines
    assert "suite entry 2 (nope): recipe 'configs/nope.yaml' not found" in lines[0]
    assert "loading model" not in result.stdout and not (tmp_path / "runs").exists()


def error_line(args: list[str]) -> str:
    """The single stderr line of a user error of ``horizon ARGS`` (exit 2, no traceback)."""
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("suite: []\n", "suite: List should have at least 1 item"),
        ("suite:\n  - recipe: configs/calc.yaml\n    overide: [x=1]\n", "unknown key 'suite.0.overide'"),
        ("suite:\n  - configs/calc.yaml\n", "a suite lists entries like '- recipe: configs/calc.yaml'"),
        (
            "suite:\n  - recipe: configs/calc.yaml\n  - recipe: configs/calc.yaml\n",
            "suite entry 2 (calc): entry 1 has the same name",
        ),
        (
            "suite:\n  - recipe: configs/calc.yaml\n    overrides: [eval.num_tasks=0]\n",
            "suite entry 1 (calc): ",
        ),
        ("suite:\n  - recipe: configs/calc.yaml\n    name: ../up\n", "must be one plain directory name"),
        ("suite:\n  - recipe: inner.yaml\n", "is a suite itself"),
        (
            "suite:\n  - recipe: configs/calc.yaml\n  - recipe: configs/worlds.yaml\n"
            "    overrides: [eval.samples_per_task=2, eval.temperature=1.0, 'eval.metrics=[maj]']\n",
            "suite entry 'worlds': eval.metrics asks maj@k, but env 'world' cannot say which answers agree",
        ),
    ],
)
def test_a_bad_suite_is_one_line_and_exit_2_before_any_model_loads(
    tmp_path: Path, body: str, expected: str
) -> None:
    write_suite(tmp_path, "suite:\n  - recipe: configs/calc.yaml\n", name="inner.yaml")
    suite = write_suite(tmp_path, body)
    assert expected in error_line(["eval", suite, "model.path=/nonexistent/model"])
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--out", "x.jsonl"], "drop --out"),
        (["--checkpoint", "/nonexistent/ckpt"], "--checkpoint '/nonexistent/ckpt' does not exist"),
        (["--policy", "oracle", "--checkpoint", "configs"], "drop --checkpoint"),
        (["--policy", "human"], "expected 'model' or 'oracle'"),
    ],
)
def test_bad_options_of_a_suite_are_one_line(tmp_path: Path, args: list[str], expected: str) -> None:
    suite = write_suite(tmp_path, "suite:\n  - recipe: configs/calc.yaml\n  - recipe: configs/flights.yaml\n")
    assert expected in error_line(["eval", suite, "model.path=/nonexistent/model", *args])
    assert not (tmp_path / "runs").exists()


def test_a_suite_is_told_from_a_recipe_and_its_entries_resolved(tmp_path: Path) -> None:
    assert not is_suite(ROOT / "configs" / "calc.yaml") and not is_suite(tmp_path / "missing.yaml")
    suite_path = write_suite(
        tmp_path / "suites",
        "name: demo\noverrides: [eval.num_tasks=7]\nsuite:\n"
        "  - recipe: configs/calc.yaml\n    overrides: [eval.num_tasks=9]\n"
        "  - recipe: configs/flights.yaml\n",
    )
    assert is_suite(suite_path)
    suite = read_suite(suite_path, ["eval.seed=3"])
    assert suite.name == "demo" and suite.out_dir == tmp_path / "suites" / "runs" / "demo"
    calc, flights = suite.entries
    assert calc.config.eval.num_tasks == 9 and flights.config.eval.num_tasks == 7  # the entry's own wins
    assert calc.config.eval.seed == flights.config.eval.seed == 3  # the command line's apply to all
    assert calc.config.run_dir == suite.out_dir / "calc"
    with pytest.raises(ConfigError, match="suite entry 1"):
        read_suite(suite_path, ["eval.num_tasks=-1"])


def test_the_shipped_suites_load() -> None:
    shipped = sorted((ROOT / "configs" / "suites").glob("*.yaml"))
    assert shipped
    for path in shipped:
        assert is_suite(path) and read_suite(path).entries, path
