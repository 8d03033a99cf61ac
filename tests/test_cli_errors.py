"""User mistakes at the command line: each ends in exit status 2 and exactly one line on stderr that
names the culprit, with no traceback, whatever the user's text holds (rich markup brackets,
non-UTF-8 bytes, a directory where a file belongs). Also: flags read as flags in --help, and
`horizon envs` shows only defaults that exist."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from horizonrl.cli import app
from horizonrl.envs.calc import CalcEnv

runner = CliRunner()
CALC = "configs/calc.yaml"
TINY = ["model.path=tiny-random", "sampling.max_new_tokens=8", "agent.max_turns=1"]
MISSING_MODEL = "model.path=/nonexistent/model"  # what a command reaches only if it loads the model


def run(*args: str):
    return runner.invoke(app, list(args))


def error_line(result) -> str:
    """The single stderr line of a user error (exit 2, no traceback)."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


def write_tasks(path: Path) -> Path:
    path.write_text(
        "".join(t.model_dump_json() + "\n" for t in CalcEnv.make_tasks("test", 2, 0, CalcEnv.Options()))
    )
    return path


# ------------------------------------------------------------------ text read as markup
def test_yaml_typo_with_a_bracket_is_one_line_naming_the_file_and_line(tmp_path):
    recipe = tmp_path / "typo.yaml"
    recipe.write_text("model:\n  path: [/models/smollm\n")
    line = error_line(run("rollout", str(recipe)))
    assert str(recipe) in line and "not valid YAML" in line and "line 2" in line


def test_override_with_markup_is_shown_verbatim():
    line = error_line(run("rollout", CALC, "train.lr=x[/red]"))
    assert "train.lr" in line and "'x[/red]'" in line


def test_config_path_with_brackets_is_named_verbatim(tmp_path):
    missing = tmp_path / "[old].yaml"
    line = error_line(run("rollout", str(missing)))
    assert f"'{missing}' does not exist" in line


def test_a_real_process_prints_one_unwrapped_line(tmp_path):
    recipe = tmp_path / "[x].yaml"
    recipe.write_text("model:\n  path: [/models/smollm [bold]\n")
    proc = subprocess.run(
        [sys.executable, "-m", "horizonrl.cli", "rollout", str(recipe)],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "40"},
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(recipe) in lines[0], proc.stderr


# ------------------------------------------------------------------ files that are not UTF-8 text
def test_task_file_that_is_not_utf8_is_named_with_its_line(tmp_path):
    tasks = write_tasks(tmp_path / "tasks.jsonl")
    tasks.write_bytes(tasks.read_bytes() + b'{"id": "caf\xe9"}\n')
    line = error_line(run("eval", CALC, *TINY, f"env.tasks_file={tasks}"))
    assert str(tasks) in line and "line 3 is not UTF-8" in line and "0xe9" in line


def test_config_file_that_is_not_utf8_is_named(tmp_path):
    recipe = tmp_path / "latin1.yaml"
    recipe.write_bytes(b"name: caf\xe9\n")
    line = error_line(run("rollout", str(recipe)))
    assert str(recipe) in line and "not UTF-8" in line


def test_demo_file_that_is_not_utf8_is_named(tmp_path):
    demos = tmp_path / "demos.jsonl"
    demos.write_bytes(b"\xff\xfe{}\n")
    line = error_line(run("sft", CALC, *TINY, f"sft.demos={demos}", f"output_dir={tmp_path}"))
    assert "sft.demos" in line and str(demos) in line and "not UTF-8" in line


# ------------------------------------------------------------------ a directory where a file belongs
def test_config_path_that_is_a_directory(tmp_path):
    line = error_line(run("rollout", str(tmp_path)))
    assert f"'{tmp_path}' is a directory" in line


def test_task_file_that_is_a_directory(tmp_path):
    line = error_line(run("eval", CALC, f"env.tasks_file={tmp_path}"))
    assert "env.tasks_file" in line and f"'{tmp_path}' is a directory" in line


def test_preference_file_that_is_a_directory(tmp_path):
    line = error_line(run("dpo", CALC, f"dpo.pairs={tmp_path}"))
    assert "dpo.pairs" in line and "is a directory" in line


@pytest.mark.parametrize("command", ["rollout", "eval"])
def test_out_that_is_a_directory_is_refused_before_the_model_loads(tmp_path, command):
    line = error_line(run(command, CALC, MISSING_MODEL, "--out", str(tmp_path)))
    assert "--out" in line and f"'{tmp_path}' is a directory" in line  # not the model path


def test_json_summary_under_a_file_is_refused_before_the_model_loads(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    line = error_line(run("eval", CALC, MISSING_MODEL, "--json", str(blocker / "s.json")))
    assert "--json" in line and f"'{blocker}' is a file, not a directory" in line


# ------------------------------------------------------------------ recipes and options
def test_empty_yaml_is_an_error(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("# only a comment\n")
    line = error_line(run("rollout", str(empty)))
    assert str(empty) in line and "is empty" in line


@pytest.mark.parametrize("port", ["0", "65536", "100000"])
def test_port_out_of_range(port):
    line = error_line(run("sandbox", "serve", "--token", "t", "--port", port))
    assert f"--port {port}" in line and "1-65535" in line


def test_a_value_after_a_flag_says_flags_take_none(tmp_path):
    line = error_line(run("train", CALC, f"output_dir={tmp_path}", "--resume", "true"))
    assert "'true'" in line and "take no value" in line


def test_flags_read_as_flags_in_help():
    result = run("train", "--help")
    assert result.exit_code == 0
    flags = [line for line in result.output.splitlines() if "--resume" in line or "--overwrite" in line]
    assert flags and not any("<bool>" in line for line in flags)
    assert "<path>" in result.output  # options that take a value still show its type


def test_envs_shows_only_defaults_that_exist():
    result = run("envs")
    assert result.exit_code == 0, result.output
    assert "PydanticUndefined" not in result.output
    assert "sandbox = {backend: 'bwrap'" in result.output


# ------------------------------------------------------------------ horizon config
def test_config_show_with_a_typo_is_one_line():
    line = error_line(run("config", "show", CALC, "train.clip_hihg=0.3"))
    assert "train.clip_hihg" in line and "train.clip_high" in line


def test_config_show_of_a_missing_recipe_is_one_line(tmp_path):
    line = error_line(run("config", "show", str(tmp_path / "[nope].yaml")))
    assert f"'{tmp_path / '[nope].yaml'}' does not exist" in line


def test_config_show_takes_one_output_format():
    line = error_line(run("config", "show", CALC, "--json", "--yaml"))
    assert "--json" in line and "--yaml" in line


def test_config_docs_check_needs_a_page():
    line = error_line(run("config", "docs", "--check"))
    assert "--check needs --out" in line


@pytest.mark.parametrize("port", ["0", "70000"])
def test_serve_port_out_of_range(port):
    line = error_line(run("serve", CALC, *TINY, "--port", port))
    assert f"--port {port}" in line and "1-65535" in line


def test_serve_checkpoint_that_does_not_exist_is_one_line(tmp_path):
    line = error_line(run("serve", CALC, *TINY, "--checkpoint", str(tmp_path / "nope")))
    assert "does not exist" in line and "nope" in line


def test_serve_checkpoint_of_another_kind_is_one_line(tmp_path):
    (tmp_path / "junk").mkdir()
    line = error_line(run("serve", CALC, *TINY, "--checkpoint", str(tmp_path / "junk")))
    assert "junk" in line


def test_roles_message_needs_a_role():
    line = error_line(run("roles", CALC, "--message", "hi"))
    assert "--role and --message go together" in line
    line = error_line(run("roles", CALC, "--role", "jduge", "--message", "hi"))
    assert "not a role" in line and "judge" in line
