"""The command line: user mistakes give one clear line (exit 2), no traceback; verbs work."""

import json

import yaml
from typer.testing import CliRunner

from horizonrl.cli import app
from horizonrl.envs.calc import CalcEnv
from horizonrl.types import read_trajectories

runner = CliRunner()
CALC = "configs/calc.yaml"
TINY = ["model.path=tiny-random", "sampling.max_new_tokens=16", "agent.max_turns=2"]


def run(*args: str):
    return runner.invoke(app, list(args))


def assert_user_error(result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in result.output, result.output


def test_envs_lists_calc_with_tools():
    result = run("envs")
    assert result.exit_code == 0, result.output
    assert "calc" in result.output and "calculator" in result.output and "finish" in result.output


def test_config_typo_is_named():
    assert_user_error(run("rollout", CALC, "agent.max_turnz=3"), "agent.max_turnz", "max_turns")


def test_unknown_env_is_named():
    assert_user_error(run("rollout", CALC, "env.name=chess"), "unknown env 'chess'", "calc")


def test_wrong_model_path_is_named(tmp_path):
    missing = tmp_path / "no-such-model"
    assert_user_error(run("eval", CALC, f"model.path={missing}"), str(missing), "smollm2-135m")


def test_bad_task_line_is_named(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    good = CalcEnv.make_tasks("test", 1, 0, CalcEnv.Options())[0]
    tasks.write_text(good.model_dump_json() + '\n{"id": 1}\n')
    assert_user_error(run("eval", CALC, f"env.tasks_file={tasks}", *TINY), "tasks.jsonl:2")


def test_missing_config_file():
    assert_user_error(run("rollout", "configs/nope.yaml"), "configs/nope.yaml", "does not exist")


def test_rollout_writes_records_and_prints_summary(tmp_path):
    out = tmp_path / "r.jsonl"
    result = run("rollout", CALC, *TINY, "--n", "3", "--out", str(out), "--show", "1")
    assert result.exit_code == 0, result.output
    trajs = read_trajectories(out)
    assert len(trajs) == 3
    assert "success rate" in result.output and "finish: malformed" in result.output
    solved = sum(t.success for t in trajs)  # the rate with its 95% interval over the 3 tasks
    assert f"{100 * solved / 3:.1f}% [" in result.output and "(wilson, 3 tasks)" in result.output


def test_eval_on_task_file_writes_summary(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(t.model_dump_json() + "\n" for t in CalcEnv.make_tasks("test", 3, 0, CalcEnv.Options()))
    )
    summary = tmp_path / "s.json"
    result = run(
        "eval",
        CALC,
        f"env.tasks_file={tasks}",
        *TINY,
        "eval.num_tasks=3",
        "--out",
        str(tmp_path / "e.jsonl"),
        "--json",
        str(summary),
    )
    assert result.exit_code == 0, result.output
    figures = json.loads(summary.read_text())
    assert figures["num_trajectories"] == 3 and 0.0 <= figures["success_rate"] <= 1.0


def test_help_lists_every_command_group():
    result = run("--help")
    assert result.exit_code == 0, result.output
    for verb in (
        "rollout",
        "eval",
        "train",
        "compare",
        "sft",
        "dpo",
        "envs",
        "sandbox",
        "swe",
        "tasks",
        "config",
    ):
        assert f" {verb} " in result.output, verb


def test_config_show_prints_each_key_with_its_source_and_description():
    result = run("config", "show", CALC, "train.algorithm=ppo", "train.clip_high=0.3")
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line.split(None, 3) for line in result.stdout.splitlines()}
    assert lines["train.algorithm"][1:3] == ["ppo", "override"]
    assert lines["train.clip_high"][1:3] == ["0.3", "override"]
    assert lines["train.advantage"][1:3] == ["gae", "preset:ppo"]
    assert lines["train.lr"][1:3] == ["0.0005", "file"]
    assert lines["train.entropy_coef"][1:3] == ["0.0", "default"]
    assert lines["sft.lr"][3] == "AdamW learning rate."
    assert lines["env.options.step_credit"][1:3] == ["0.5", "file"]
    assert "\x1b[" not in result.stdout  # plain text, for pipes


def test_config_show_json_and_yaml():
    result = run("config", "show", CALC, "--json")
    assert result.exit_code == 0, result.output
    entries = {e["key"]: e for e in json.loads(result.stdout)}
    assert entries["train.algorithm"] == {
        "key": "train.algorithm",
        "value": "reinforce_pp_turn",
        "source": "file",
        "description": entries["train.algorithm"]["description"],
    }
    assert entries["train.clip_high"]["source"] == "preset" and entries["train.clip_high"]["value"] == 0.2
    result = run("config", "show", CALC, "seed=7", "--yaml")
    assert result.exit_code == 0, result.output
    resolved = yaml.safe_load(result.stdout)
    assert resolved["seed"] == 7 and resolved["train"]["clip_high"] == 0.2 and resolved["sft"]["lr"] == 0.001
