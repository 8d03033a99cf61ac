"""Constrained turns in the agent and the trainer: ``agent.constrain`` holds the policy's turns to
well-formed calls of the env's tools, the record marks them, and the trainer's logprobs of those turns
are under the same masks as the sampler's (sampler/trainer KL ~ 0), so an RL step stays exact."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from horizonrl.agent.config import AgentConfig
from horizonrl.agent.loop import Agent
from horizonrl.config import TrainConfig
from horizonrl.engine.base import SamplingParams
from horizonrl.engine.hf import HFEngine
from horizonrl.engine.replay import ConstraintReplay
from horizonrl.envs.calc import CalcEnv
from horizonrl.errors import DataError
from horizonrl.optim import make_optimizer
from horizonrl.toolcalls import parse_tool_calls
from horizonrl.train.logprobs import old_outputs
from horizonrl.train.update import train_step
from horizonrl.types import Trajectory


@pytest.fixture(scope="module")
def rollouts(tiny_model_and_tokenizer):
    """Eight constrained calc episodes of the tiny random model (two groups of four), sampled at T=1."""
    model, tokenizer = tiny_model_and_tokenizer
    engine = HFEngine(copy.deepcopy(model).eval(), tokenizer, seed=0)
    agent = Agent(
        tokenizer,
        engine,
        SamplingParams(temperature=1.0, max_new_tokens=60, seed=11),
        AgentConfig(constrain="tool_calls", max_turns=3),
        context_length=8192,
    )
    tasks = CalcEnv.make_tasks("train", 2, 0, CalcEnv.Options())

    async def run():
        return await asyncio.gather(
            *(agent.run(CalcEnv(), t, f"{t.id}#{k}", t.id) for t in tasks for k in range(4))
        )

    return asyncio.run(run())


def test_constrained_turns_are_well_formed_calls_and_the_record_marks_them(rollouts, tokenizer):
    complete = 0
    for traj in rollouts:
        assert traj.constrained
        replies = [m for m in traj.messages if m.role == "assistant"]
        assert len(traj.constrained) == len(replies) == traj.num_turns
        cut = 0
        for message in replies:
            parsed = parse_tool_calls(message.content)
            if parsed.ok:  # a complete turn is exactly one canonical call of one of the env's tools
                assert not parsed.tolerated and len(parsed.calls) == 1, message.content
                assert parsed.calls[0].name in {t.name for t in CalcEnv().tools}
                complete += 1
            else:  # the random model's endless string argument, cut off by max_new_tokens
                assert message.content.startswith('<tool_call>\n{"name": "'), message.content
                cut += 1
        assert traj.metrics.get("constraint_unmet", 0) == cut
        # the spans are exactly the model's tokens, and the record round-trips through JSON
        covered = sorted(i for s in traj.constrained for i in range(s.start, s.end))
        assert covered == [i for i, m in enumerate(traj.loss_mask) if m]
        again = Trajectory.model_validate_json(traj.to_json())
        assert again.constrained == traj.constrained and again.constraints == traj.constraints
        assert traj.metrics["constrained_turns"] == traj.num_turns
    # complete calls exercised too: how many the random model completes at T=1 depends on the CPU's
    # float kernels (3 of the 8 episodes' turns on an AVX2-only AMD EPYC, 4 or more on Intel Xeons)
    assert complete >= 2


def test_the_trainer_computes_the_samplers_masked_logprobs(rollouts, tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    replay = ConstraintReplay(tokenizer, model)
    old = old_outputs(model, rollouts, 0, 4096, 1.0, replay=replay)["old_logprobs"]
    gaps, unmasked_gaps = [], []
    free = [t.model_copy(update={"constrained": None, "constraints": None}) for t in rollouts]
    plain = old_outputs(model, free, 0, 4096, 1.0)["old_logprobs"]
    for traj, mine, theirs in zip(rollouts, old, plain, strict=True):
        for lp, sampled, unmasked, m in zip(mine, traj.logprobs, theirs, traj.loss_mask, strict=True):
            if m:
                gaps.append(abs(lp - sampled))
                unmasked_gaps.append(abs(unmasked - sampled))
    assert max(gaps) < 1e-4  # the same distribution
    assert sum(unmasked_gaps) / len(unmasked_gaps) > 0.1  # without the masks it would not be


def test_a_grpo_step_with_constrained_turns_trains_and_a_trainer_without_replay_refuses(
    rollouts, tiny_model_and_tokenizer
):
    model, tokenizer = tiny_model_and_tokenizer
    policy = copy.deepcopy(model).requires_grad_(True)
    optimizer, scheduler = make_optimizer(policy, 1e-3, 0.0, 0)
    trajs = [t.model_copy(update={"reward": float(i % 2)}) for i, t in enumerate(rollouts)]
    before = [p.detach().clone() for p in policy.parameters()]
    cfg = TrainConfig(autocast="none", group_size=4)
    metrics = train_step(
        policy, optimizer, scheduler, trajs, cfg, pad_id=0, replay=ConstraintReplay(tokenizer, policy)
    )
    assert metrics["update_skipped"] == 0.0 and metrics["trained_trajectories"] == len(trajs)
    assert abs(metrics["sampler_kl"]) < 1e-5
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters(), strict=True))
    with pytest.raises(DataError, match="sampled under a constraint"):
        train_step(policy, optimizer, scheduler, trajs, cfg, pad_id=0)
