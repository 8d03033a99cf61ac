"""The step judge: a structured reply gives one label per step; a reply that is not the structure is
read in any shape (unlabelled steps GOOD, counted); verdicts are cached by content and the cache
round-trips through a checkpoint's state; with a real engine role every reply is the structure."""

from __future__ import annotations

import asyncio

import pytest

from horizonrl.engine.hf import HFEngine
from horizonrl.evolve.attribution import StepJudge, labels_model, parse_labels, trajectory_steps
from horizonrl.roles import Roles, RolesConfig
from horizonrl.roles.structured import parse_reply
from horizonrl.types import Message, Trajectory


@pytest.mark.parametrize(
    ("reply", "labels", "defaulted"),
    [
        ("Step 1: GOOD\nStep 2: BAD\nStep 3: GOOD", [True, False, True], 0),
        ("1. bad\n2) good\n3 - **BAD**", [False, True, False], 0),
        ('{"1": "BAD", "3": "BAD"}', [False, True, False], 1),
        ('Labels: ["GOOD", "BAD", "BAD"]', [True, False, False], 0),
        ("good bad bad", [True, False, False], 0),
        ("", [True, True, True], 3),
        ("The agent did fine overall, I think.", [True, True, True], 3),
        ("Step 1: BAD\nStep 2: BAD\nStep 3: BAD\nStep 4: BAD\nStep 9: GOOD", [False, False, False], 0),
        ("Step 2: BAD", [True, False, True], 2),
        ("good bad", [True, True, True], 3),  # two bare words for three steps: not trusted
        ('{"1": "BAD", "2": "GOOD", "3": "B', [False, True, True], 1),  # cut off by max_tokens
    ],
)
def test_replies_in_any_shape_give_one_label_per_step(reply, labels, defaulted):
    assert parse_labels(reply, 3) == (labels, defaulted)


def _trajectory(success: bool) -> Trajectory:
    return Trajectory(
        id="t",
        task_id="task",
        group_id="g",
        env="calc",
        messages=[
            Message(role="system", content="s"),
            Message(role="user", content="What is 2+3*4?"),
            Message(role="assistant", content="calculator(2+3)"),
            Message(role="tool", content="5"),
            Message(role="assistant", content="calculator(3*4)"),
            Message(role="tool", content="12"),
            Message(role="assistant", content="finish(14)"),
        ],
        prompt_ids=[1],
        reward=float(success),
        finish="finished",
    )


class CountingJudge:
    """A scripted judge role: the same reply to every request (proves the plumbing only)."""

    def __init__(self, reply: str):
        self.reply, self.calls, self.prompts = reply, 0, []

    async def chat(self, messages, **sampling):
        self.calls += 1
        self.prompts.append(messages)
        return self.reply

    async def structured(self, messages, schema, **sampling):
        return parse_reply(await self.chat(messages, **sampling), schema)


def test_the_reply_model_has_exactly_one_label_per_step():
    model = labels_model(3)
    assert list(model.model_json_schema(by_alias=True)["properties"]) == ["1", "2", "3"]
    assert parse_reply('{"1": "GOOD", "2": "BAD", "3": "GOOD"}', model).ok
    for wrong in ('{"1": "GOOD", "2": "BAD"}', '{"1": "GOOD", "2": "BAD", "3": "GOOD", "4": "BAD"}'):
        assert not parse_reply(wrong, model).ok
    assert not parse_reply('{"1": "GOOD", "2": "OK", "3": "GOOD"}', model).ok


def test_steps_are_actions_with_what_came_back():
    steps = trajectory_steps(_trajectory(True))
    assert [(s.action, s.observation) for s in steps] == [
        ("calculator(2+3)", "5"),
        ("calculator(3*4)", "12"),
        ("finish(14)", ""),
    ]


def test_a_structured_reply_is_read_without_the_fallback():
    judge = StepJudge(CountingJudge('{"1": "BAD", "2": "GOOD", "3": "BAD"}'))
    assert asyncio.run(judge.label("q", _trajectory(False))) == [False, True, False]
    assert judge.stats.unstructured == 0 and judge.stats.defaulted == 0
    assert '{"1": "GOOD" or "BAD", "2": "GOOD" or "BAD", "3": "GOOD" or "BAD"}' in (
        judge.role.prompts[0][-1].content
    )


def test_verdicts_are_cached_by_content_and_the_cache_round_trips():
    role = CountingJudge("Step 1: BAD\nStep 2: GOOD\nStep 3: GOOD")
    judge = StepJudge(role)
    first = asyncio.run(judge.label("What is 2+3*4?", _trajectory(True)))
    again = asyncio.run(judge.label("What is 2+3*4?", _trajectory(True)))
    assert first == again == [False, True, True]
    assert role.calls == 1 and judge.stats.cached == 1
    assert "Outcome: SUCCESS" in role.prompts[0][-1].content
    asyncio.run(judge.label("What is 2+3*4?", _trajectory(False)))  # another outcome: asked again
    assert role.calls == 2 and "Outcome: FAILURE" in role.prompts[1][-1].content

    restored = StepJudge(CountingJudge("nonsense"))
    restored.load_state_dict(judge.state_dict())
    assert asyncio.run(restored.label("What is 2+3*4?", _trajectory(True))) == [False, True, True]
    assert restored.role.calls == 0


def test_an_unparseable_reply_defaults_to_good_and_is_counted():
    judge = StepJudge(CountingJudge("I cannot judge this."))
    assert asyncio.run(judge.label("q", _trajectory(False))) == [True, True, True]
    assert judge.stats.defaulted == 3 and judge.stats.unstructured == 1


async def test_a_real_engine_judge_labels_every_step(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    engine = HFEngine(model, tokenizer)
    roles = Roles(RolesConfig(), engine, tokenizer)
    judge = StepJudge(roles.get("judge"), max_tokens=48)
    trajectories = [_trajectory(True), _trajectory(False)]
    for k in range(2):  # another request each: a fresh reply, not the cache
        trajectories.append(trajectories[k].model_copy(update={"messages": trajectories[k].messages[:-2]}))
    labels = await asyncio.gather(*(judge.label(f"q{i}", t) for i, t in enumerate(trajectories)))
    assert [len(x) for x in labels] == [3, 3, 2, 2]
    assert judge.stats.unstructured == 0 and judge.stats.defaulted == 0
    usage = roles.usage()["judge"]
    assert usage["structured"] == 4 and usage["unusable"] == 0
    await engine.close()
