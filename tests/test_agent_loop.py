"""The turn loop: trajectory records token by token, failure modes, and isolation of errors.

Most tests drive the loop with the calc env and a ScriptedEngine (conftest) so the "model" writes
exactly the reply under test; one test runs the real in-process engine with a tiny random model.
"""

import asyncio
import math

import pytest

from horizonrl.agent.config import AgentConfig, StageTimeouts
from horizonrl.agent.loop import Agent
from horizonrl.engine.base import SamplingParams
from horizonrl.envs.calc import CalcEnv
from horizonrl.toolcalls import format_tool_call
from horizonrl.types import Task

OPTIONS = CalcEnv.Options()


def calc_task(split: str = "test", i: int = 0) -> Task:
    return CalcEnv.make_tasks(split, i + 1, 0, OPTIONS)[i]


def call(expr: str) -> str:
    return format_tool_call("calculator", {"expression": expr})


def finish(answer) -> str:
    return format_tool_call("finish", {"answer": str(answer)})


def agent_for(tokenizer, engine=None, **cfg) -> Agent:
    return Agent(
        tokenizer, engine, SamplingParams(max_new_tokens=128), AgentConfig(**cfg), context_length=8192
    )


async def test_oracle_episode_solves_and_records_exact_tokens(tokenizer):
    agent = agent_for(tokenizer)
    task = calc_task()
    env = CalcEnv()
    traj = await agent.run(env, task, "t#0", "t", policy=CalcEnv.oracle())
    assert traj.finish == "finished" and traj.reward == 1.0 and traj.success
    assert traj.num_turns == len(task.data["steps"]) + 1
    assert len(traj.response_ids) == len(traj.loss_mask) == len(traj.logprobs)
    assert traj.metrics["retokenize_drift"] == 0
    # the masked-in tokens are exactly the assistant turns (each ending with eos)
    model_text = tokenizer.decode([t for t, m in zip(traj.response_ids, traj.loss_mask, strict=True) if m])
    assistant = [m.content for m in traj.messages if m.role == "assistant"]
    assert model_text == "".join(a + "<|im_end|>" for a in assistant)
    assert "<tool_response>" not in model_text
    assert traj.timings.run_s > 0


async def test_logprobs_only_on_model_tokens(tokenizer, scripted_engine):
    task = calc_task()
    engine = scripted_engine([call("1 + 1"), finish(task.data["answer"])], logprob=-0.25)
    traj = await agent_for(tokenizer, engine).run(CalcEnv(), task, "t#0", "t")
    assert traj.success
    for mask, lp in zip(traj.loss_mask, traj.logprobs, strict=True):
        assert lp == (-0.25 if mask else 0.0)
    # the second prompt is the first prompt plus everything appended since: no re-tokenization
    first, second = engine.prompts
    assert second[: len(first)] == first
    assert traj.prompt_ids + traj.response_ids[: len(second) - len(first)] == second


async def test_wrong_answer_gets_zero_reward(tokenizer, scripted_engine):
    engine = scripted_engine([finish(-1)])
    traj = await agent_for(tokenizer, engine).run(CalcEnv(), calc_task(), "t#0", "t")
    assert traj.finish == "finished" and traj.reward == 0.0 and not traj.success


async def test_same_action_three_times_is_a_loop(tokenizer, scripted_engine):
    engine = scripted_engine([call("2 * 3")])
    traj = await agent_for(tokenizer, engine, loop_window=3).run(CalcEnv(), calc_task(), "t#0", "t")
    assert traj.finish == "loop" and traj.num_turns == 3


async def test_malformed_replies_get_feedback_then_stop(tokenizer, scripted_engine):
    engine = scripted_engine(["The answer is probably 12."])
    traj = await agent_for(tokenizer, engine, max_malformed=3).run(CalcEnv(), calc_task(), "t#0", "t")
    assert traj.finish == "malformed" and traj.num_turns == 3
    feedback = [m.content for m in traj.messages if m.role == "user"][1:]
    assert len(feedback) == 2
    assert all('<tool_call>\n{"name": "calculator"' in f for f in feedback)
    assert traj.metrics["malformed_turns"] == 3


async def test_malformed_then_recovered_goes_on(tokenizer, scripted_engine):
    task = calc_task()
    engine = scripted_engine(["no call here", finish(task.data["answer"])])
    traj = await agent_for(tokenizer, engine).run(CalcEnv(), task, "t#0", "t")
    assert traj.success and traj.num_turns == 2 and traj.metrics["malformed_turns"] == 1


async def test_turn_budget(tokenizer, scripted_engine):
    engine = scripted_engine([call("1 + 1"), call("2 + 2"), call("3 + 3"), call("4 + 4")])
    traj = await agent_for(tokenizer, engine, max_turns=3).run(CalcEnv(), calc_task(), "t#0", "t")
    assert traj.finish == "turn_budget" and traj.num_turns == 3


async def test_context_overflow(tokenizer, scripted_engine):
    engine = scripted_engine([call("1 + 1"), call("2 + 2"), call("3 + 3")])
    agent = agent_for(tokenizer, engine)
    task = calc_task()
    prompt_len = len((await agent.run(CalcEnv(), task, "probe", "g", policy=CalcEnv.oracle())).prompt_ids)
    agent = agent_for(
        tokenizer, scripted_engine([call("1 + 1"), call("2 + 2")]), max_total_tokens=prompt_len + 60
    )
    traj = await agent.run(CalcEnv(), task, "t#0", "t")
    assert traj.finish == "context_overflow"
    assert len(traj.prompt_ids) + len(traj.response_ids) <= prompt_len + 60


class BrokenEnv(CalcEnv):
    def __init__(self, where: str) -> None:
        super().__init__()
        self.where = where
        self.closed = False

    async def reset(self, task):
        if self.where == "reset":
            raise RuntimeError("reset exploded")
        return await super().reset(task)

    async def step(self, action):
        if self.where == "step":
            raise RuntimeError("step exploded")
        if self.where == "hang":
            await asyncio.sleep(60)
        if self.where == "nan":
            result = await super().step(action)
            result.reward = math.nan
            return result
        return await super().step(action)

    async def close(self):
        self.closed = True


@pytest.mark.parametrize(
    ("where", "finish", "text"),
    [
        ("reset", "error", "reset exploded"),
        ("step", "error", "step exploded"),
        ("nan", "error", "non-finite reward"),
        ("hang", "timeout", "run_timeout_s"),
    ],
)
async def test_env_failures_are_recorded_not_raised(tokenizer, scripted_engine, where, finish, text):
    task = calc_task()
    env = BrokenEnv(where)
    agent = agent_for(tokenizer, scripted_engine([finish_call(task)]))
    traj = await agent.run(env, task, "t#0", "t", timeouts=StageTimeouts(run_s=0.5))
    assert traj.finish == finish and text in traj.error
    assert env.closed


def finish_call(task):
    return finish(task.data["answer"])


class FailingEngine:
    async def generate(self, prompt_ids, params):
        raise RuntimeError("engine down")

    def update_weights(self, policy):
        pass


async def test_engine_error_is_recorded(tokenizer):
    traj = await agent_for(tokenizer, FailingEngine()).run(CalcEnv(), calc_task(), "t#0", "t")
    assert traj.finish == "error" and "engine down" in traj.error


async def test_real_engine_with_tiny_model_produces_valid_records(tiny_model_and_tokenizer):
    from horizonrl.engine.hf import HFEngine
    from horizonrl.rollout.runner import run_rollouts

    model, tok = tiny_model_and_tokenizer
    engine = HFEngine(model, tok, max_batch_size=8, seed=0)
    agent = Agent(
        tok, engine, SamplingParams(max_new_tokens=24), AgentConfig(max_turns=2), context_length=8192
    )
    tasks = CalcEnv.make_tasks("train", 4, 0, OPTIONS)
    trajs = await run_rollouts(agent, CalcEnv, tasks, samples_per_task=2, concurrency=8)
    assert len(trajs) == 8 and {t.group_id for t in trajs} == {t.id for t in tasks}
    assert engine.stats["batches"] < engine.stats["requests"]  # concurrent episodes were batched
    for traj in trajs:
        assert traj.finish in ("malformed", "turn_budget", "loop", "finished")
        model_lps = [lp for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True) if m]
        assert model_lps and all(lp < 0 for lp in model_lps)
