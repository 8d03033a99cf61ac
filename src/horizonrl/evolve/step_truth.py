"""What each step of a trajectory really was, where an env knows: the truth a step judge is measured
against (:func:`judge_agreement`).

A trajectory's steps are replayed through a fresh env on the same task — every assistant message's
tool calls, in order, as the agent loop sent them — and each step is GOOD or BAD by the env's own
account:

- **calc**: GOOD when the env pays for it with process credit on (``step_credit`` > 0, credit without
  a complete attempt): a calculator result that extends the reference's chain of intermediate results
  in order, or a right final answer. A step with no readable call, an error, a result off the
  reference chain, or a wrong answer is BAD.
- **flights**: BAD when the step broke one of the world's rules or otherwise erred (an ``Error:``
  came back), had no readable call, made a change the task's reference solution never makes (a
  booking, cancellation or new passenger the task does not need), or finished a task that failed;
  otherwise GOOD.

A replay whose observations differ from the recorded ones (a task that is not the one played, an env
that changed) gives no truth for that trajectory, and is counted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from horizonrl.analysis.agreement import cohen_kappa
from horizonrl.envs.base import Env
from horizonrl.envs.registry import make_env, parse_env_options
from horizonrl.toolcalls import parse_tool_calls
from horizonrl.types import Action, Message, StepResult, Task, ToolCall, Trajectory

#: calls that change the flights world (the rest only read it)
FLIGHTS_WRITES = frozenset({"book_ticket", "cancel_order", "add_passenger"})


@dataclass
class ReplayedStep:
    """One assistant message replayed: the calls read from it and the env's answer (None when no
    call could be read: the agent loop answered with format feedback, not the env)."""

    calls: list[ToolCall]
    result: StepResult | None

    @property
    def erred(self) -> bool:
        return self.result is not None and any(
            o.content.startswith("Error:") for o in self.result.observations
        )


def _recorded_observations(messages: Sequence[Message]) -> list[list[str]]:
    """Per assistant message, the tool messages that followed it."""
    out: list[list[str]] = []
    for message in messages:
        if message.role == "assistant":
            out.append([])
        elif message.role == "tool" and out:
            out[-1].append(message.content)
    return out


async def replay(env: Env, task: Task, trajectory: Trajectory) -> list[ReplayedStep] | None:
    """Replay ``trajectory``'s assistant messages through ``env`` (fresh) on ``task``; None when an
    observation differs from the recorded one."""
    await env.reset(task)
    recorded = _recorded_observations(trajectory.messages)
    steps: list[ReplayedStep] = []
    done = False
    try:
        actions = [m for m in trajectory.messages if m.role == "assistant"]
        for i, (message, seen) in enumerate(zip(actions, recorded, strict=True)):
            parsed = parse_tool_calls(message.content)
            if done or not parsed.ok:
                steps.append(ReplayedStep(parsed.calls if parsed.ok else [], None))
                continue
            result = await env.step(Action(text=message.content, tool_calls=parsed.calls))
            # the loop records no observation for the last action (a finish, or a loop or budget stop)
            unrecorded = i == len(actions) - 1 and not seen
            if [o.content for o in result.observations] != seen and not unrecorded:
                return None
            steps.append(ReplayedStep(parsed.calls, result))
            done = result.done
    finally:
        await env.close()
    return steps


def calc_truth(steps: Sequence[ReplayedStep], trajectory: Trajectory, task: Task) -> list[bool]:
    return [s.result is not None and not s.erred and s.result.reward > 0 for s in steps]


def flights_truth(steps: Sequence[ReplayedStep], trajectory: Trajectory, task: Task) -> list[bool]:
    needed = {c["name"] for c in task.data.get("reference_solution") or []}
    truth = []
    for s in steps:
        needless_change = any(c.name in FLIGHTS_WRITES and c.name not in needed for c in s.calls)
        if s.result is None or s.erred or needless_change:
            truth.append(False)
        elif s.result.done:
            truth.append(trajectory.success)
        else:
            truth.append(True)
    return truth


#: env name -> (env options the replay needs, truth of the replayed steps)
TRUTH: dict[str, tuple[dict[str, Any], Callable[[Sequence[ReplayedStep], Trajectory, Task], list[bool]]]] = {
    "calc": ({"step_credit": 1.0, "credit_needs_attempt": False}, calc_truth),
    "flights": ({}, flights_truth),
}


def step_truth(
    env_name: str, env_options: Mapping[str, Any], task: Task, trajectory: Trajectory
) -> list[bool] | None:
    """GOOD (True) / BAD per step of ``trajectory`` by ``env_name``'s account (see the module), or
    None when its replay does not reproduce the record. An env without a truth is a ValueError
    naming the ones that have it."""
    if env_name not in TRUTH:
        raise ValueError(f"env {env_name!r} has no step truth; envs with one: {', '.join(TRUTH)}")
    forced, truth_of = TRUTH[env_name]
    options = parse_env_options(env_name, {**env_options, **forced})
    steps = asyncio.run(replay(make_env(env_name, options), task, trajectory))
    return None if steps is None else truth_of(steps, trajectory, task)


@dataclass
class Agreement:
    """A step judge's labels against the truth, GOOD = True; BAD is the class κ is reported for."""

    truth: list[bool] = field(default_factory=list)
    judged: list[bool] = field(default_factory=list)
    outcome: list[bool] = field(default_factory=list)  # the trajectory's success, per step

    def add(self, truth: Sequence[bool], judged: Sequence[bool], success: bool) -> None:
        if len(truth) != len(judged):
            raise ValueError(f"{len(truth)} true labels against {len(judged)} judged ones")
        self.truth += truth
        self.judged += judged
        self.outcome += [success] * len(truth)

    def figures(self) -> dict[str, Any]:
        """Accuracy, Cohen's κ and the confusion counts of the judge; the same for two baselines
        that need no judge (every step GOOD; every step labelled with its trajectory's outcome);
        and the judge's accuracy on the steps of successful and of failed trajectories."""

        def scores(pred: Sequence[bool], truth: Sequence[bool] = self.truth) -> dict[str, float]:
            n = len(truth)
            hits = sum(p == t for p, t in zip(pred, truth, strict=True))
            return {
                "accuracy": hits / n if n else 0.0,
                "kappa": cohen_kappa([int(not t) for t in truth], [int(not p) for p in pred]),
            }

        def part(success: bool) -> dict[str, float]:
            idx = [i for i, o in enumerate(self.outcome) if o == success]
            truth = [self.truth[i] for i in idx]
            return {"steps": len(idx), **scores([self.judged[i] for i in idx], truth)}

        pairs = list(zip(self.truth, self.judged, strict=True))
        return {
            "steps": len(self.truth),
            "true_bad_share": self.truth.count(False) / len(self.truth) if self.truth else 0.0,
            "judge": {
                **scores(self.judged),
                "confusion": {
                    "good_as_good": pairs.count((True, True)),
                    "good_as_bad": pairs.count((True, False)),
                    "bad_as_good": pairs.count((False, True)),
                    "bad_as_bad": pairs.count((False, False)),
                },
                "on_successes": part(True),
                "on_failures": part(False),
            },
            "baseline_all_good": scores([True] * len(self.truth)),
            "baseline_outcome": scores(self.outcome),
        }
