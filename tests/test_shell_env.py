"""The sandboxed ``shell`` env: tasks, checks and the oracle, through the rollout pipeline with real
bubblewrap sandboxes (created in the init stage, scored in the eval stage, always closed)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from horizonrl.agent.config import AgentConfig
from horizonrl.agent.loop import Agent
from horizonrl.engine.base import SamplingParams
from horizonrl.envs.registry import get_env_class
from horizonrl.envs.shell import FAMILIES, ShellEnv, ShellOptions
from horizonrl.rollout.base import RolloutLimits, make_jobs
from horizonrl.rollout.pipeline import run_pipeline
from horizonrl.sandbox import SandboxConfig
from horizonrl.sandbox.bwrap import BwrapOptions
from horizonrl.toolcalls import format_tool_call

if shutil.which("bwrap") is None:
    pytest.skip("bubblewrap (bwrap) is not installed; `make setup` installs it", allow_module_level=True)


@pytest.fixture
def options(tmp_path: Path) -> ShellOptions:
    bwrap = BwrapOptions(state_dir=str(tmp_path / "state"), cache_dir=str(tmp_path / "cache"))
    return ShellOptions(sandbox=SandboxConfig(bwrap=bwrap))


def test_tasks_are_deterministic_cover_every_family_and_differ_by_split(options: ShellOptions) -> None:
    train = ShellEnv.make_tasks("train", 10, 0, options)
    assert train == ShellEnv.make_tasks("train", 10, 0, options)
    test = ShellEnv.make_tasks("test", 10, 0, options)
    assert {json.dumps(t.data, sort_keys=True) for t in train}.isdisjoint(
        {json.dumps(t.data, sort_keys=True) for t in test}
    )
    assert len({t.data["solution"].split()[0] for t in train[: len(FAMILIES)]}) >= 4
    assert get_env_class("shell") is ShellEnv


async def test_no_task_is_solved_before_the_agent_acts(options: ShellOptions) -> None:
    for task in ShellEnv.make_tasks("test", len(FAMILIES), 1, options):
        env = ShellEnv(options)
        try:
            await env.reset(task)
            assert await env.evaluate() == 0.0, task.data["prompt"]
        finally:
            await env.close()


def _agent(tokenizer, engine) -> Agent:
    return Agent(tokenizer, engine, SamplingParams(max_new_tokens=64), AgentConfig(max_turns=4))


async def test_the_oracle_solves_every_task_in_real_sandboxes(
    options: ShellOptions, scripted_engine, tokenizer
) -> None:
    tasks = ShellEnv.make_tasks("train", 10, 0, options)
    result = await run_pipeline(
        _agent(tokenizer, scripted_engine(["unused"])),
        lambda: ShellEnv(options),
        make_jobs(tasks, 2, policy=ShellEnv.oracle()),
        RolloutLimits.uniform(8),
    )
    assert len(result) == 20
    for traj in result:
        assert traj.finish == "finished" and traj.reward == 1.0, (traj.task_id, traj.error)
    state = Path(options.sandbox.bwrap.state_dir)
    assert not list(state.iterdir())  # every sandbox was closed


async def test_a_wrong_answer_gets_no_reward(options: ShellOptions, scripted_engine, tokenizer) -> None:
    task = next(t for t in ShellEnv.make_tasks("train", 5, 0, options) if "answer.txt" in t.data["prompt"])
    engine = scripted_engine(
        [
            format_tool_call("execute_bash", {"command": "echo 12345 > answer.txt; cat answer.txt"}),
            format_tool_call("finish", {}),
        ]
    )
    result = await run_pipeline(
        _agent(tokenizer, engine), lambda: ShellEnv(options), make_jobs([task], 1), RolloutLimits.uniform(1)
    )
    traj = result[0]
    assert traj.finish == "finished" and traj.reward == 0.0
    observation = next(m.content for m in traj.messages if m.role == "tool")
    assert observation.startswith("[exit code 0]\n12345")


@pytest.fixture
def sandbox_server(tmp_path: Path):
    """A real `horizon sandbox serve` process on loopback; yields (url, token)."""
    from horizonrl.sandbox.server import serve_in_subprocess

    with serve_in_subprocess(str(tmp_path)) as server:
        yield server


async def test_the_same_env_on_a_sandbox_server_by_config_alone(
    sandbox_server: tuple[str, str], scripted_engine, tokenizer
) -> None:
    import httpx

    url, token = sandbox_server
    options = ShellOptions.model_validate({"sandbox": {"backend": "remote", "url": url, "token": token}})
    tasks = ShellEnv.make_tasks("test", 5, 0, options)
    result = await run_pipeline(
        _agent(tokenizer, scripted_engine(["unused"])),
        lambda: ShellEnv(options),
        make_jobs(tasks, 1, policy=ShellEnv.oracle()),
        RolloutLimits.uniform(4),
    )
    assert [t.reward for t in result] == [1.0] * 5, [t.error for t in result]
    health = httpx.get(f"{url}/health", timeout=5).json()
    assert health["backend"] == "bwrap" and health["sandboxes"] == 0  # all closed on the server
