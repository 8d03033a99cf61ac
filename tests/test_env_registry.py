"""The env registry: envs by registered name or by import path (``module:Class``), and the one-line
error for every way a ``module:Class`` spec can be wrong."""

from __future__ import annotations

from pathlib import Path

import pytest
import toy_envs
from typer.testing import CliRunner

from horizonrl.cli import app
from horizonrl.envs.calc import CalcEnv, CalcOptions
from horizonrl.envs.registry import get_env_class, list_envs, make_env, parse_env_options
from horizonrl.errors import ConfigError, HorizonError, UnknownEnvError
from horizonrl.types import read_trajectories

SPEC = "toy_envs:ParityEnv"
ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def test_a_module_class_spec_resolves_without_registration():
    assert get_env_class(SPEC) is toy_envs.ParityEnv
    assert "parity" not in list_envs() and SPEC not in list_envs()
    assert get_env_class("calc") is get_env_class("horizonrl.envs.calc:CalcEnv") is CalcEnv


def test_options_and_make_env_take_a_spec():
    options = parse_env_options(SPEC, {"prefix": "p"})
    assert isinstance(options, toy_envs.ParityOptions) and options.prefix == "p"
    env = make_env(SPEC, {"prefix": "q"})
    assert isinstance(env, toy_envs.ParityEnv) and env.options.prefix == "q" and env.tools == []
    assert make_env(SPEC).options == toy_envs.ParityOptions()
    with pytest.raises(
        ConfigError, match=r"env.options.prefx: .*env 'toy_envs:ParityEnv' accepts options: prefix"
    ):
        parse_env_options(SPEC, {"prefx": "p"})


def test_make_env_refuses_another_envs_options_model():
    with pytest.raises(TypeError, match="env 'calc' takes CalcOptions options, got ParityOptions"):
        make_env("calc", toy_envs.ParityOptions())
    assert make_env("calc", CalcOptions(max_ops=5)).options.max_ops == 5


@pytest.fixture
def broken_module(tmp_path, monkeypatch):
    (tmp_path / "horizon_broken_env_mod.py").write_text('raise RuntimeError("boom\\nsecond line")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    return "horizon_broken_env_mod"


@pytest.mark.parametrize(
    ("spec", "what"),
    [
        ("horizon_no_such_mod:Foo", "module 'horizon_no_such_mod' does not import (ModuleNotFoundError: "),
        ("BROKEN:Foo", "module 'horizon_broken_env_mod' does not import (RuntimeError: boom second line)"),
        ("toy_envs:Missing", "module 'toy_envs' has no attribute 'Missing'"),
        ("toy_envs:ParityEnv.nope", "module 'toy_envs' has no attribute 'ParityEnv.nope'"),
        ("toy_envs:NotAnEnv", "'NotAnEnv' is class NotAnEnv, not an Env subclass"),
        ("toy_envs:__doc__", "'__doc__' is a str, not an Env subclass"),
        ("toy_envs:AbstractEnv", "'AbstractEnv' is abstract (does not implement step)"),
        ("toy_envs:", "expected exactly one module:Class"),
        (":ParityEnv", "expected exactly one module:Class"),
        ("toy_envs:ParityEnv:x", "expected exactly one module:Class"),
    ],
)
def test_each_bad_spec_gives_one_line_naming_the_spec_and_what_is_valid(spec, what, broken_module):
    spec = spec.replace("BROKEN", broken_module)
    with pytest.raises(UnknownEnvError) as info:
        get_env_class(spec)
    message = str(info.value)
    assert isinstance(info.value, HorizonError) and "\n" not in message
    assert message.startswith(f"env {spec!r}: {what}"), message
    assert "; give a registered name (bfcl, calc, " in message  # (and whatever else this session registered)
    assert message.endswith(" or module:Class of an Env subclass")


def test_an_unknown_plain_name_mentions_module_class():
    with pytest.raises(UnknownEnvError, match=r"unknown env 'calcc'\. Did you mean 'calc'\?.*module:Class"):
        get_env_class("calcc")


# ---------------------------------------------------------------- end to end through the CLI

TINY = ["model.path=tiny-random", f"env.name={SPEC}", "env.options={prefix: px}", "sampling.max_new_tokens=8"]


def test_a_module_class_env_rolls_out_from_the_cli(tmp_path):
    out = tmp_path / "r.jsonl"
    result = runner.invoke(
        app, ["rollout", "configs/calc.yaml", *TINY, "agent.max_turns=2", "--n", "2", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    trajs = read_trajectories(out)
    assert [t.task_id for t in trajs] == ["px-train-0-0", "px-train-0-1"]
    assert {t.env for t in trajs} == {"parity"} and all(t.num_turns == 2 for t in trajs)


def test_a_module_class_env_trains_from_the_cli(tmp_path):
    args = [
        "train",
        "configs/calc.yaml",
        *TINY,
        "agent.max_turns=2",
        "eval.num_tasks=2",
        "sft.enabled=false",
        "train.steps=1",
        "train.tasks_per_step=2",
        "train.group_size=2",
        "train.eval_every=0",
        f"output_dir={tmp_path}",
        "name=parity",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    trajs = read_trajectories(tmp_path / "parity" / "trajectories" / "step_000001.jsonl")
    assert len(trajs) == 4 and all(t.task_id.startswith("px-train-") for t in trajs)


def test_a_bad_spec_on_the_cli_is_one_line(tmp_path):
    result = runner.invoke(
        app, ["rollout", "configs/calc.yaml", "model.path=tiny-random", "env.name=toy_envs:Nope"]
    )
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "env 'toy_envs:Nope': module 'toy_envs' has no attribute 'Nope'" in result.output


def test_a_task_file_for_a_module_class_env_may_name_the_class_or_the_spec(tmp_path):
    """Tasks the env generated carry its class ``name``; a file of them serves a config that names
    the env by ``module:Class``, and a task of another env is still refused."""
    from horizonrl.config import RunConfig
    from horizonrl.envs.factory import make_tasks
    from horizonrl.errors import DataError
    from horizonrl.types import Task

    path = tmp_path / "tasks.jsonl"
    tasks = [
        Task(id="a", env="parity", split="train", data={"i": 0}),
        Task(id="b", env="toy_envs:ParityEnv", split="train", data={"i": 1}),
    ]
    path.write_text("".join(t.model_dump_json() + "\n" for t in tasks))
    config = RunConfig.model_validate({"env": {"name": "toy_envs:ParityEnv", "tasks_file": str(path)}})
    assert sorted(t.id for t in make_tasks(config.env, "train", 2, seed=0)) == ["a", "b"]

    path.write_text(Task(id="c", env="calc", split="train", data={}).model_dump_json() + "\n")
    with pytest.raises(DataError, match="is for env 'calc'"):
        make_tasks(config.env, "train", 1, seed=0)


def test_every_built_in_env_is_declared_by_one_entry_point_under_its_own_name():
    """One discovery mechanism: each env class in the package is found through its entry point
    (none by a module list), and the entry point's name is the class's ``name``."""
    import ast
    import tomllib

    import horizonrl

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][
        "horizonrl.envs"
    ]
    package = Path(horizonrl.__file__).parent
    named = {}  # concrete envs in the source: a class with a string `name` attribute deriving from *Env
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            bases = [ast.unparse(b) for b in node.bases] if isinstance(node, ast.ClassDef) else []
            if not any(b.split("[")[0].endswith("Env") for b in bases):
                continue
            for stmt in node.body:
                target = getattr(stmt, "target", None) or (getattr(stmt, "targets", None) or [None])[0]
                value = getattr(stmt, "value", None)
                if getattr(target, "id", None) == "name" and isinstance(value, ast.Constant) and value.value:
                    named[value.value] = node.name
    assert named and set(named) == set(declared), (named, declared)
    envs = list_envs()
    for name, spec in declared.items():
        assert spec.endswith(f":{named[name]}") and envs[name].name == name
