"""ADCA-GRPO in the trainer: steps are runs of model tokens, the judge is asked only about groups
with an outcome signal, each token gets its step's ADCA advantage, the judge's cache goes into every
checkpoint, and a run with attribution trains end to end.

The judge here is a scripted role (a capable model cannot run on this machine): it calls a step BAD
when its action is short. Model, env, rollouts, trainer and checkpoints are real (the tiny random
model, the toy coin env)."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
import torch
import toy_envs  # noqa: F401 - registers the coin env
from builders import TINY_COIN, make_traj, script_role

from horizonrl.algos.advantages import adca, broadcast_steps
from horizonrl.config import load_config
from horizonrl.errors import ConfigError
from horizonrl.evolve.config import AttributionConfig
from horizonrl.roles.base import RoleUsage
from horizonrl.roles.structured import parse_reply
from horizonrl.train.attribution import AttributionStage, token_steps
from horizonrl.train.run import TrainingRun
from horizonrl.train.tracking import read_metrics
from horizonrl.types import Message


class ScriptedJudge:
    name = "scripted-judge"

    def __init__(self) -> None:
        self.calls = 0
        self.usage = RoleUsage()  # words stand in for tokens

    async def chat(self, messages, **sampling):
        self.calls += 1
        text = messages[-1].content
        steps = re.findall(r"Step (\d+)\nAction: (.*)", text)
        reply = json.dumps({n: "GOOD" if len(action) > 3 else "BAD" for n, action in steps})
        self.usage.add(len(text.split()), len(reply.split()))
        return reply

    async def structured(self, messages, schema, **sampling):
        reply = parse_reply(await self.chat(messages, **sampling), schema)
        self.usage.count(reply)  # as a real role counts its structured requests
        return reply


def test_steps_are_runs_of_model_tokens():
    assert token_steps([1, 1, 0, 0, 1, 0, 1, 1]) == [0, 0, -1, -1, 1, -1, 2, 2]
    assert token_steps([0, 0]) == [-1, -1]


def _traj(name, group, reward, actions):
    """A trajectory whose model turns are ``actions`` (one token each, then an observation token)."""
    response = [t for i, _ in enumerate(actions) for t in (10 + i, 99)]
    mask = [m for _ in actions for m in (1, 0)]
    traj = make_traj(name, [1, 2], response, mask=mask, reward=reward, group=group)
    messages = [Message(role="user", content=f"task {group}")]
    for action in actions:
        messages += [Message(role="assistant", content=action), Message(role="tool", content="ok")]
    return traj.model_copy(update={"messages": messages})


def test_the_stage_gives_each_token_its_steps_adca_advantage_and_skips_groups_without_signal():
    trajs = [
        _traj("a0", "a", 1.0, ["search", "ok", "book"]),
        _traj("a1", "a", 0.0, ["hm"]),
        _traj("b0", "b", 1.0, ["search"]),  # group b: equal outcomes, no judge
        _traj("b1", "b", 1.0, ["look", "no"]),
    ]
    judge = ScriptedJudge()
    stage = AttributionStage(AttributionConfig(enabled=True), judge)
    per_token, metrics = asyncio.run(stage.advantages(trajs))
    assert judge.calls == 2 and metrics["attribution/judged"] == 2
    assert stage.judge.stats.unstructured == 0 and metrics["attribution/defaulted"] == 0
    labels = [[True, False, True], [False], [None], [None, None]]
    want = adca(labels, [1.0, 0.0, 1.0, 1.0], ["a", "a", "b", "b"])
    for row, adv, traj in zip(per_token, want, trajs, strict=True):
        steps = torch.tensor(token_steps(traj.loss_mask))
        assert row == pytest.approx(broadcast_steps(adv, steps).tolist())
    assert all(v == 0 for v in per_token[2] + per_token[3])  # no signal: nothing moves
    assert metrics["attribution/good_share"] == pytest.approx(2 / 4)


def test_attribution_needs_a_group_advantage():
    with pytest.raises(ConfigError, match=r"attribution\.enabled replaces the group advantages"):
        load_config("configs/calc.yaml", ["attribution.enabled=true", "train.algorithm=ppo"])


def test_a_run_with_attribution_trains_and_checkpoints_the_judges_cache(tmp_path, monkeypatch):
    judge = ScriptedJudge()
    script_role(monkeypatch, "judge", judge)
    settings = [
        *TINY_COIN,
        "engine.dtype=float32",
        "train.steps=2",
        "train.lr=5e-3",
        "train.save_every=1",
        "attribution.enabled=true",
        "attribution.skip_no_signal=false",
        f"output_dir={tmp_path}",
        "name=adca",
    ]
    summary = TrainingRun(load_config("configs/calc.yaml", settings)).run()
    assert summary["finished"]
    steps = [m for m in read_metrics(tmp_path / "adca" / "metrics.jsonl") if "reward_mean" in m]
    assert [m["attribution/judged"] for m in steps] == [8.0, 8.0]
    assert all(m["attribution/misaligned"] == 0 for m in steps)
    assert judge.calls > 0
    # what the judge cost is counted per step and in the summary
    assert summary["role_usage"]["judge"] == judge.usage.as_dict()
    spent = [m["roles/judge_tokens"] for m in steps]
    assert 0 < spent[0] < spent[1] == judge.usage.prompt_tokens + judge.usage.completion_tokens
    # and how many of its structured replies gave no valid object
    assert judge.usage.structured > 0
    assert steps[-1]["roles/judge_unusable"] == judge.usage.unusable
    cache = json.loads((tmp_path / "adca" / "checkpoints" / "step_000002" / "judge_cache.json").read_text())
    assert cache["stats"]["trajectories"] == 16
    # the labels are kept beside the step's trajectories, one per step of each judged trajectory
    for step in (1, 2):
        rows = [
            json.loads(line) for line in (tmp_path / "adca" / "attribution" / f"step_{step:06d}.jsonl").open()
        ]
        trained = {
            json.loads(line)["id"]
            for line in (tmp_path / "adca" / "trajectories" / f"step_{step:06d}.jsonl").open()
        }
        assert len(rows) == 8 and {r["trajectory_id"] for r in rows} <= trained
        assert all(r["labels"] and set(r["labels"]) <= {"GOOD", "BAD"} for r in rows)
