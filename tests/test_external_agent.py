"""Training agent programs we did not write (``agent.kind: external``): each episode runs a real
program that talks to the policy server with the official ``openai`` client; the sessions become
trajectories, a training step moves the weights, and the next step samples from the new ones. A
program that crashes or hangs costs its own sample only."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from horizonrl.agent.config import AgentConfig
from horizonrl.agent.loop import Agent
from horizonrl.config import load_config
from horizonrl.engine.base import SamplingParams
from horizonrl.envs.calc import CalcEnv, CalcOptions
from horizonrl.errors import ConfigError
from horizonrl.rollout.base import RolloutLimits
from horizonrl.rollout.runner import run_rollouts
from horizonrl.serve.external import ExternalAgent, served
from horizonrl.serve.service import PolicyService
from horizonrl.train.run import TrainingRun

ROOT = Path(__file__).resolve().parents[1]
SCORED = f"{sys.executable} {ROOT / 'tests' / 'agents' / 'scored_agent.py'} {{task_file}}"
EXAMPLE = "{python} " + str(ROOT / "examples" / "external_agent" / "agent.py") + " --task {task_file}"


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_training_through_an_external_agent_moves_the_weights_and_the_server_serves_them(tmp_path):
    config = load_config(
        ROOT / "configs" / "calc.yaml",
        [
            "model.path=tiny-random",
            "model.dtype=float32",
            "agent.kind=external",
            f"agent.command={SCORED}",
            "sft.enabled=false",
            "train.steps=2",
            "train.tasks_per_step=2",
            "train.group_size=3",
            "train.concurrency=6",
            "eval.num_tasks=2",
            "sampling.max_new_tokens=8",
            f"output_dir={tmp_path}",
            "name=ext",
        ],
    )
    summary = TrainingRun(config).run()
    run = tmp_path / "ext"
    steps = [m for m in _lines(run / "metrics.jsonl") if m["step"] > 0]
    assert steps[0]["update_skipped"] == 0.0 and steps[0]["trained_trajectories"] > 0
    assert steps[0]["weights_sync_s"] > 0
    first, second = (_lines(run / "trajectories" / f"step_00000{k}.jsonl") for k in (1, 2))
    assert len(first) == len(second) == 6
    for traj in first + second:
        assert traj["finish"] == "finished" and traj["num_turns"] == 2
        assert sum(traj["loss_mask"]) >= 2 and len(traj["logprobs"]) == len(traj["response_ids"])
        assert traj["metrics"]["drift_resets"] == 0
    assert {t["metrics"]["policy_version_max"] for t in first} == {0.0}
    assert {t["metrics"]["policy_version_min"] for t in second} == {1.0}  # sampled after the update
    rewards = sorted(t["reward"] for t in first)
    assert rewards[0] != rewards[-1]  # the posted rewards reached the trajectories
    assert summary["finished"] and (run / "policy").is_dir()
    assert not list((run / "external").glob("*.json"))  # task files are removed after each episode


def _calc_tasks(n: int):
    return CalcEnv.make_tasks("test", n, 0, CalcOptions(min_ops=2, max_ops=2))


async def _rollout(service, command, tasks, samples, tmp_path, timeout_s=60.0, max_new_tokens=8):
    sampling = SamplingParams(max_new_tokens=max_new_tokens)
    agent = ExternalAgent(service, command, sampling, tmp_path / "ext", timeout_s=timeout_s)
    limits = RolloutLimits.uniform(4)
    return await served(
        agent,
        run_rollouts(
            agent, lambda: CalcEnv(CalcOptions(min_ops=2, max_ops=2)), tasks, samples, 4, limits=limits
        ),
    )


async def test_a_crashing_or_hanging_program_costs_only_its_own_sample(
    tiny_model_and_tokenizer, tmp_path, monkeypatch
):
    from horizonrl.engine.hf import HFEngine

    model, tokenizer = tiny_model_and_tokenizer
    service = PolicyService(HFEngine(model, tokenizer), tokenizer, "calc")
    monkeypatch.setenv("HORIZON_TEST_BEHAVIOUR", "crash")
    crashed = await _rollout(service, SCORED, _calc_tasks(1), 3, tmp_path)
    assert [t.finish for t in crashed] == ["error", "finished", "finished"]
    assert "exited with status 3" in crashed[0].error and "boom: the agent crashed" in crashed[0].error
    monkeypatch.setenv("HORIZON_TEST_BEHAVIOUR", "hang")
    start = asyncio.get_running_loop().time()
    # the others must finish inside the timeout on a loaded machine too: at 5 s, three programs
    # starting Python (openai, httpx) beside the suite's other worker on 2 AVX2 cores all timed out
    hung = await _rollout(service, SCORED, _calc_tasks(1), 3, tmp_path, timeout_s=20.0)
    assert [t.finish for t in hung] == ["finished", "timeout", "finished"]
    assert "agent.command_timeout_s=20.0" in hung[1].error
    assert asyncio.get_running_loop().time() - start < 120  # the hung program does not hold the rollout
    assert len(service.sessions) == 0  # every session was collected


async def test_the_example_agent_solves_calc_through_the_server(tokenizer, tmp_path):
    """The shipped example program, end to end, with a model that writes the oracle's turns (a tiny
    random model never writes a tool call; the program, server and env are real)."""
    from test_serve_sessions import ServeScriptedEngine, _oracle_texts

    tasks = _calc_tasks(1)
    service = PolicyService(ServeScriptedEngine(tokenizer, _oracle_texts(tasks[0])), tokenizer, "calc")
    (traj,) = await _rollout(service, EXAMPLE, tasks, 1, tmp_path, max_new_tokens=64)
    assert traj.finish == "finished" and traj.success and traj.reward == 1.0
    assert traj.num_turns == 3
    assert [m.role for m in traj.messages][2:] == ["assistant", "tool", "assistant", "tool", "assistant"]
    loop = Agent(
        tokenizer,
        ServeScriptedEngine(tokenizer, _oracle_texts(tasks[0])),
        SamplingParams(max_new_tokens=8),
        AgentConfig(),
        8192,
    )
    expected = await loop.run(
        CalcEnv(CalcOptions(min_ops=2, max_ops=2)),
        tasks[0],
        "x",
        "g",
        sampling=SamplingParams(max_new_tokens=64),
    )
    assert traj.prompt_ids == expected.prompt_ids and traj.response_ids == expected.response_ids


def test_bad_external_config_is_one_line():
    with pytest.raises(ConfigError, match=r"needs agent\.command"):
        load_config(ROOT / "configs" / "calc.yaml", ["agent.kind=external"])
    with pytest.raises(ConfigError, match="bad placeholder"):
        load_config(ROOT / "configs" / "calc.yaml", ["agent.kind=external", "agent.command=run {task}"])
