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


# ------------------------------------------------------------------ bounds, bombs, ports, task envs
def horizon(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """The real CLI in a subprocess (a hang fails the test instead of stalling the suite)."""
    return subprocess.run(
        [sys.executable, "-m", "horizonrl.cli", *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )


def process_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-500:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
    return lines[0]


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("eval.num_tasks=1000000000", "eval.num_tasks=1000000000 is over the limit of 100000"),
        ("train.group_size=1000000", "train.group_size=1000000 is over the limit of 1024"),
        ("train.steps=10000000000", "train.steps=10000000000 is over the limit of 1000000"),
        ("rollout.concurrency=100000", "rollout.concurrency=100000 is over the limit of 4096"),
        ("engine.max_batch_size=100000", "engine.max_batch_size=100000 is over the limit of 4096"),
        ("sampling.max_new_tokens=10000000", "sampling.max_new_tokens=10000000 is over the limit of 131072"),
        ("train.group_size=0", "train.group_size=0 is below the minimum of 1"),
        ("seed=100000000000000000000000000000", "seed=100000000000000000000000000000 is over the limit of"),
    ],
)
def test_a_count_out_of_its_bounds_names_the_bound_before_the_model_loads(override, expected):
    line = error_line(run("rollout", CALC, MISSING_MODEL, override))
    assert expected in line  # not the missing model: the recipe is refused first


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["rollout", CALC, MISSING_MODEL, "--n", "0"], "--n=0 is below the minimum of 1"),
        (["rollout", CALC, MISSING_MODEL, "--n", "1000000000"], "--n=1000000000 is over the limit of 100000"),
        (["rollout", CALC, MISSING_MODEL, "--show", "-1"], "--show=-1 is below the minimum of 0"),
        (["tasks", "filter", CALC, MISSING_MODEL, "--k", "0"], "--k=0 is below the minimum of 1"),
        (["tasks", "filter", CALC, MISSING_MODEL, "--k", "100000"], "--k=100000 is over the limit of 1024"),
        (["tasks", "filter", CALC, MISSING_MODEL, "--n", "-3"], "--n=-3 is below the minimum of 1"),
        (["evolve", "questions", CALC, "--n", "0"], "--n=0 is below the minimum of 1"),
        (["malt", "online", CALC, "--rounds", "0"], "--rounds=0 is below the minimum of 1"),
        (["analyze", "runs", "--window", "0"], "--window=0 is below the minimum of 1"),
        (["worlds", "validate", "maze", "--steps", "-5"], "--steps=-5 is below the minimum of 1"),
        (["worlds", "validate", "maze", "--react-steps", "-1"], "--react-steps=-1 is below the minimum of 0"),
        (["swe", "eval", "--gold", "--workers", "100000"], "--workers=100000 is over the limit of 256"),
        (["tasks", "build", ".", "--per-package", "0"], "--per-package=0 is below the minimum of 1"),
        (["tasks", "build", ".", "--workers", "-1"], "--workers=-1 is below the minimum of 0"),
        (["sandbox", "run", "--memory-mib", "0", "--", "true"], "--memory-mib=0 is below the minimum of 16"),
        (["sandbox", "run", "--timeout", "-1", "--", "true"], "--timeout=-1.0 must be above 0"),
        (["sandbox", "run", "--timeout", "nan", "--", "true"], "--timeout=nan is not a number"),
        (["sandbox", "run", "--processes", "1", "--", "true"], "--processes=1 is below the minimum of 4"),
        (["sandbox", "serve", "--token", "t", "--max-sandboxes", "0"], "--max-sandboxes=0 is below"),
    ],
)
def test_a_numeric_option_out_of_range_is_one_line(args, expected):
    assert expected in error_line(run(*args))


def test_swe_eval_with_no_workers_is_refused_instead_of_hanging():
    line = process_error_line(horizon("swe", "eval", "--gold", "--workers", "0"))
    assert "--workers=0 is below the minimum of 1" in line


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("notasource", "source 'notasource' does not exist"),
        ("pypi:--index-url=http://127.0.0.1:9/", "is not pypi:NAME or pypi:NAME==VERSION"),
        ("pypi:", "is not pypi:NAME"),
    ],
)
def test_tasks_build_source_that_is_neither_pypi_nor_a_directory(tmp_path, source, expected):
    out = tmp_path / "dataset"
    line = error_line(run("tasks", "build", source, "--out", str(out)))
    assert expected in line and "pypi:NAME" in line
    assert not out.exists()  # refused before anything was fetched or written


def _alias_bomb(levels: int) -> str:
    lines = ["a0: &a0 [lol,lol,lol,lol,lol,lol,lol,lol,lol]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines)


def test_a_yaml_alias_bomb_is_one_short_line(tmp_path):
    recipe = tmp_path / "bomb.yaml"
    recipe.write_text(_alias_bomb(9).replace("a8: &a8", "name: &a8") + "\n")  # 9**9 values once expanded
    assert recipe.stat().st_size < 500  # a few hundred bytes
    line = error_line(run("rollout", str(recipe), MISSING_MODEL))
    assert str(recipe) in line and "aliases" in line and "100000" in line and len(line) < 400


def test_a_yaml_alias_bomb_in_an_override_is_one_short_line():
    value = (
        "[&a [1,1,1,1,1,1,1,1,1,1], &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a], &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]"
    )
    value += ", &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c], [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]]"
    line = error_line(run("rollout", CALC, MISSING_MODEL, f"name={value}"))
    assert "override 'name'" in line and "aliases" in line and len(line) < 400


def test_an_alias_that_contains_itself_is_refused(tmp_path):
    recipe = tmp_path / "loop.yaml"
    recipe.write_text("env:\n  options: &o {again: *o}\n")
    line = error_line(run("rollout", str(recipe), MISSING_MODEL))
    assert "refers to a block that contains it" in line


def test_aliases_a_recipe_really_uses_still_load(tmp_path):
    recipe = tmp_path / "reuse.yaml"
    recipe.write_text("eval: &e {num_tasks: 3, concurrency: 2}\nrollout: *e\n")
    result = run("config", "show", str(recipe), "--json")
    assert result.exit_code == 0, result.output
    assert '"key": "rollout.num_tasks",\n    "value": 3' in result.output


def test_a_huge_bad_value_is_echoed_cut():
    line = error_line(run("rollout", CALC, "name=" + "x/" * 5000))
    assert "name" in line and "10002 characters" in line and len(line) < 400


def test_every_error_line_is_cut_to_a_sane_length(tmp_path):
    deep = tmp_path.joinpath(*["d" * 200] * 20) / "recipe.yaml"  # a 4000-character path
    line = error_line(run("rollout", str(deep)))
    assert len(line) <= 1010 and "cut:" in line


def test_many_problems_are_counted_not_listed():
    line = error_line(run("rollout", CALC, *[f"train.x{i}=1" for i in range(50)]))
    assert "50 problems, the first 5:" in line and "'train.x4'" in line and line.endswith("and 45 more")
    assert line.count("Valid keys here") == 1  # listed once per section


@pytest.mark.parametrize("setting", ["config", "task file"])
def test_a_device_named_as_a_file_is_refused_not_read_forever(setting):
    args = ["/dev/zero"] if setting == "config" else [CALC, MISSING_MODEL, "env.tasks_file=/dev/zero"]
    proc = horizon("eval", *args)
    assert "'/dev/zero' is a device, not a file" in process_error_line(proc)


def test_a_task_line_naming_an_unregistered_env_imports_nothing(tmp_path):
    (tmp_path / "planted.py").write_text(
        "import pathlib\npathlib.Path(__file__).with_name('IMPORTED').write_text('yes')\nclass X: pass\n"
    )
    tasks = write_tasks(tmp_path / "tasks.jsonl")
    lines = tasks.read_text().splitlines()
    lines[1] = lines[1].replace('"env":"calc"', '"env":"planted:X"')
    assert "planted:X" in lines[1]
    tasks.write_text("\n".join(lines) + "\n")
    proc = horizon(
        "eval",
        str(Path(CALC).resolve()),
        MISSING_MODEL,
        f"env.tasks_file={tasks}",
        env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"},
    )
    line = process_error_line(proc)
    assert "'planted:X'" in line and "not a registered env" in line and str(tasks) in line
    assert not (tmp_path / "IMPORTED").exists()


@pytest.fixture
def taken_port():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize("command", [["sandbox", "serve", "--token", "t"], ["serve", CALC, MISSING_MODEL]])
def test_a_port_in_use_is_one_line_before_anything_loads(taken_port, command):
    line = error_line(run(*command, "--port", str(taken_port)))
    assert f"127.0.0.1:{taken_port}" in line and "in use" in line and "--port" in line
