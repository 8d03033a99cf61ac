"""The truth a step judge is measured against: trajectories replayed through their env, each step
GOOD or BAD by the env's own account (calc's process credit, the flights world's rules)."""

from __future__ import annotations

import asyncio

import pytest

from horizonrl.envs.api.flights import FlightsEnv, heldout_tasks
from horizonrl.envs.calc import CalcEnv, CalcOptions
from horizonrl.evolve.attribution import trajectory_steps
from horizonrl.evolve.step_truth import Agreement, step_truth
from horizonrl.toolcalls import format_tool_call, parse_tool_calls
from horizonrl.types import Action, Message, Task, Trajectory


def play(env, task: Task, actions: list[str]) -> Trajectory:
    """A trajectory of ``actions`` played for real in ``env`` (observations as the loop records them:
    none after the action that ends the episode)."""

    async def run() -> tuple[list[Message], bool, float]:
        messages = await env.reset(task)
        reward = 0.0
        for text in actions:
            messages.append(Message(role="assistant", content=text))
            parsed = parse_tool_calls(text)
            if not parsed.ok:
                messages.append(Message(role="user", content="Your reply had no tool call."))
                continue
            result = await env.step(Action(text=text, tool_calls=parsed.calls))
            reward += result.reward
            if result.done:
                break
            messages.extend(result.observations)
        final = await env.evaluate()
        return messages, env.metrics.get("success", 0.0) > 0, reward if final is None else final

    messages, success, reward = asyncio.run(run())
    return Trajectory(
        id="t",
        task_id=task.id,
        group_id=task.id,
        env=env.name,
        messages=messages,
        prompt_ids=[1],
        reward=reward,
        finish="finished",
        metrics={"success": float(success)},
    )


def calc(expression: str) -> str:
    return format_tool_call("calculator", {"expression": expression})


def finish(**arguments) -> str:
    return format_tool_call("finish", arguments)


@pytest.fixture
def calc_task() -> Task:
    return CalcEnv.make_tasks("test", 1, 0, CalcOptions(min_ops=2, max_ops=2))[0]


def test_calc_steps_on_the_reference_chain_are_good(calc_task):
    first, second = calc_task.data["steps"]
    traj = play(
        CalcEnv(), calc_task, [calc(first), calc(second), finish(answer=str(calc_task.data["answer"]))]
    )
    assert traj.success
    assert step_truth("calc", {}, calc_task, traj) == [True, True, True]


def test_calc_a_wrong_step_breaks_the_chain_and_a_wrong_answer_is_bad(calc_task):
    first, second = calc_task.data["steps"]
    traj = play(
        CalcEnv(), calc_task, [calc(first), calc("1 + 1"), calc(second), "no call here", finish(answer="3")]
    )
    # the right second step after a wrong one is off the chain; a turn without a call is bad
    assert step_truth("calc", {"step_credit": 0.0}, calc_task, traj) == [True, False, False, False, False]
    assert len(trajectory_steps(traj)) == 5


def test_calc_a_replay_that_does_not_reproduce_the_record_gives_no_truth(calc_task):
    first, second = calc_task.data["steps"]
    traj = play(CalcEnv(), calc_task, [calc(first), calc(second), finish(answer="1")])
    tampered = traj.model_copy(deep=True)
    next(m for m in tampered.messages if m.role == "tool").content = "12345"
    assert step_truth("calc", {}, calc_task, tampered) is None


def test_flights_rule_breaks_needless_changes_and_a_failed_finish_are_bad():
    task = next(
        t
        for t in heldout_tasks()
        if [c["name"] for c in t.data["reference_solution"]] == ["search_flights", "book_ticket"]
    )
    search = task.data["reference_solution"][0]
    traj = play(
        FlightsEnv(),
        task,
        [
            format_tool_call("add_passenger", {"name": "Paris", "age": 30}),  # a change nobody asked for
            format_tool_call("search_flights", search["arguments"]),
            format_tool_call("book_ticket", {"offer_id": "NOPE"}),  # breaks a rule: unknown offer
            format_tool_call("list_orders", {}),
            finish(summary="done"),
        ],
    )
    assert not traj.success
    assert step_truth("flights", {}, task, traj) == [False, True, False, True, False]


def test_flights_the_reference_solution_is_good_throughout():
    task = heldout_tasks()[0]
    actions = [format_tool_call(c["name"], c.get("arguments") or {}) for c in task.data["reference_solution"]]
    traj = play(FlightsEnv(), task, [*actions, finish(summary="done")])
    assert traj.success
    assert step_truth("flights", {}, task, traj) == [True] * (len(actions) + 1)


def test_an_env_without_a_truth_is_named():
    with pytest.raises(ValueError, match="env 'shell' has no step truth; envs with one: calc, flights"):
        step_truth("shell", {}, Task(id="x", env="shell", data={}), None)


def test_agreement_figures_on_a_hand_example():
    a = Agreement()
    a.add([True, True, False, False], [True, False, False, True], success=False)
    a.add([True, True], [True, True], success=True)
    f = a.figures()
    assert f["steps"] == 6 and f["true_bad_share"] == pytest.approx(2 / 6)
    assert f["judge"]["accuracy"] == pytest.approx(4 / 6)
    # BAD as the positive class: truth [0,0,1,1,0,0], judged [0,1,1,0,0,0]: p_o 4/6, p_e 1/9 + 4/9
    assert f["judge"]["kappa"] == pytest.approx((4 / 6 - 5 / 9) / (1 - 5 / 9))
    assert f["judge"]["confusion"] == {"good_as_good": 3, "good_as_bad": 1, "bad_as_good": 1, "bad_as_bad": 1}
    assert f["judge"]["on_successes"] == {"steps": 2, "accuracy": 1.0, "kappa": 1.0}
    assert f["judge"]["on_failures"]["accuracy"] == pytest.approx(0.5)
    assert f["baseline_all_good"] == {
        "accuracy": pytest.approx(4 / 6),
        "kappa": pytest.approx(0.0, abs=1e-12),
    }
    # labelling every step with its trajectory's outcome: [F,F,F,F,T,T] against the truth
    assert f["baseline_outcome"]["accuracy"] == pytest.approx(4 / 6)
    with pytest.raises(ValueError, match="2 true labels against 1 judged"):
        a.add([True, True], [True], success=True)
