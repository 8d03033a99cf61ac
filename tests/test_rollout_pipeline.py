"""The rollout schedulers: the init -> run -> eval pipeline and the lockstep baseline.

Covered, for both modes where the behaviour is common:

- records: one trajectory per job in job order, groups, finish/reward/turns/timings, and the same
  workload (turns per trajectory id) from fresh ``LatencyEnv.factory`` instances in both modes;
- per-trajectory asynchrony: in the pipeline a slow env delays only its own trajectory (fast ones
  stream out first) and there is no barrier per turn (wall time vs lockstep);
- bounded queues and back-pressure: live envs stay under the admission bound, running episodes under
  ``run_slots``; ``collect=False`` keeps nothing but still streams every record;
- failure isolation: an env that raises, hangs or returns malformed results in reset/step/evaluate,
  or an engine that raises, fails only its own trajectory (``error``/``timeout`` with the message),
  its env is closed, the others finish and the metrics count it;
- the failure policy (``apply_failure_policy``) and config validation of ``rollout.mode`` and
  ``rollout.on_failure``;
- groups streamed through ``on_group`` (once each, complete, and early in the pipeline);
- cancellation (Ctrl-C): CancelledError propagates, every env made is closed, nothing keeps running
  and the records already streamed are complete;
- the real in-process engine with a tiny random model: concurrent episodes are batched.

Most tests use the ScriptedEngine (conftest) with free-text envs (``accepts_text``), so whatever the
"model" writes is an action, and envs with tiny or zero latencies so the file runs in seconds.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any, ClassVar

import pytest

from horizonrl.agent.config import AgentConfig, StageTimeouts
from horizonrl.agent.loop import Agent
from horizonrl.config import load_config
from horizonrl.engine.base import SamplingParams
from horizonrl.envs.base import Env
from horizonrl.envs.latency import LatencyEnv, LatencyOptions
from horizonrl.errors import ConfigError
from horizonrl.rollout.base import RolloutLimits, RolloutStatus, make_jobs
from horizonrl.rollout.failures import FAILURE_POLICIES, apply_failure_policy
from horizonrl.rollout.lockstep import run_lockstep
from horizonrl.rollout.pipeline import run_pipeline
from horizonrl.rollout.runner import run_rollouts
from horizonrl.types import Action, Message, StepResult, Task, Trajectory

MODES = ["pipeline", "lockstep"]
RUNNERS = {"pipeline": run_pipeline, "lockstep": run_lockstep}

# tiny latencies: every stage takes some time (timings > 0) but the whole file stays fast
FAST = LatencyOptions(
    min_turns=1,
    max_turns=4,
    init_mean_s=0.01,
    init_sigma=0.5,
    step_mean_s=0.003,
    step_sigma=1.0,
    eval_mean_s=0.01,
    eval_sigma=0.5,
)


def make_agent(tokenizer: Any, engine: Any, max_turns: int = 8, max_new_tokens: int = 16) -> Agent:
    return Agent(
        tokenizer,
        engine,
        SamplingParams(max_new_tokens=max_new_tokens),
        AgentConfig(max_turns=max_turns),
        context_length=8192,
    )


def probe_tasks(n: int) -> list[Task]:
    return [Task(id=f"t-{i}", env="probe") for i in range(n)]


class Tracked:
    """Mixin for envs: class-level records of the instances made, how many are live (made and not
    yet closed) and the most that were live at once. Use ``fresh()`` for a subclass of one's own."""

    instances: ClassVar[list[Any]] = []
    live: ClassVar[int] = 0
    max_live: ClassVar[int] = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.closes = 0
        cls = type(self)
        cls.instances.append(self)
        cls.live += 1
        cls.max_live = max(cls.max_live, cls.live)

    async def close(self) -> None:
        await super().close()  # type: ignore[misc]
        self.closes += 1
        if self.closes == 1:
            type(self).live -= 1

    @classmethod
    def fresh(cls, **attrs: Any) -> Any:
        """A subclass with its own (empty) counters and the given class attributes."""
        return type(cls.__name__, (cls,), {"instances": [], "live": 0, "max_live": 0, **attrs})

    @classmethod
    def all_closed_once(cls) -> bool:
        return all(env.closes == 1 for env in cls.instances)


class TrackedLatencyEnv(Tracked, LatencyEnv):
    pass


class ProbeEnv(Tracked, Env):
    """A free-text env of ``turns`` turns whose step latency a test sets per task and turn."""

    name = "probe"
    accepts_text = True
    turns: ClassVar[int] = 2

    def __init__(self) -> None:
        super().__init__()
        self.task: Task | None = None
        self.turn = 0

    def step_delay(self, task_id: str, turn: int) -> float:
        return 0.0

    async def reset(self, task: Task) -> Any:
        self.task = task
        return [
            Message(role="system", content="Write anything."),
            Message(role="user", content=f"Task {task.id}: act {self.turns} times."),
        ]

    async def step(self, action: Action) -> Any:
        assert self.task is not None
        self.turn += 1
        await asyncio.sleep(self.step_delay(self.task.id, self.turn))
        return StepResult(
            observations=[Message(role="user", content=f"Observation {self.turn}.")],
            done=self.turn >= self.turns,
        )

    async def evaluate(self) -> Any:
        return 1.0


# ---------------------------------------------------------------------------------------- records
async def test_both_modes_return_job_ordered_records_of_the_same_workload(tokenizer, scripted_engine):
    tasks = LatencyEnv.make_tasks("train", 5, 0, FAST)
    samples = 2
    limits = RolloutLimits(run_slots=4, init_workers=3, eval_workers=2, queue_size=2)
    expected_ids = [f"{t.id}#{k}" for t in tasks for k in range(samples)]
    turns: dict[str, dict[str, int]] = {}
    for mode in MODES:
        agent = make_agent(tokenizer, scripted_engine(["act"]))
        env_cls = TrackedLatencyEnv.fresh()
        result = await run_rollouts(agent, env_cls.factory(FAST), tasks, samples, mode=mode, limits=limits)
        assert [t.id for t in result] == expected_ids
        assert len(result) == len(result.trajectories) == len(expected_ids)
        for traj in result:
            assert traj.group_id == traj.task_id == traj.id.split("#")[0]
            assert traj.finish == "finished" and traj.error is None
            assert traj.reward == 1.0 and traj.success
            assert FAST.min_turns <= traj.num_turns <= FAST.max_turns
            assert traj.timings.init_s > 0 and traj.timings.run_s > 0 and traj.timings.eval_s > 0
            assert len(traj.response_ids) == len(traj.loss_mask) == len(traj.logprobs)
        assert result.metrics["rollout/failed"] == 0
        assert len(env_cls.instances) == len(expected_ids) and env_cls.all_closed_once()
        turns[mode] = {t.id: t.num_turns for t in result}
    # same fresh factory, same workload: each trajectory id drew the same number of turns
    assert turns["pipeline"] == turns["lockstep"]
    assert len(set(turns["pipeline"].values())) > 1  # the workload is not trivially uniform


async def test_unknown_mode_and_duplicate_ids_are_rejected(tokenizer, scripted_engine):
    agent = make_agent(tokenizer, scripted_engine(["act"]))
    with pytest.raises(ValueError, match=r"unknown rollout mode 'turbo'.*pipeline, lockstep"):
        await run_rollouts(agent, ProbeEnv.fresh(), probe_tasks(1), mode="turbo")  # type: ignore[arg-type]
    task = probe_tasks(1)[0]
    jobs = make_jobs([task], 1) * 2
    for runner in RUNNERS.values():
        with pytest.raises(ValueError, match="duplicate trajectory ids"):
            await runner(agent, ProbeEnv.fresh(), jobs)


class Say:
    """A scripted policy that writes the same text every turn."""

    def __init__(self, text: str) -> None:
        self.text = text

    def act(self, task: Task, messages: list[Message]) -> str:
        return self.text


class ParamsByTaskEngine:
    """Delegates to an engine and records the ``max_new_tokens`` of each call, by task id."""

    def __init__(self, inner: Any, tokenizer: Any) -> None:
        self.inner, self.tokenizer = inner, tokenizer
        self.calls: dict[str, list[int]] = {}

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Any:
        task_id = self.tokenizer.decode(prompt_ids).split("Task ", 1)[1].split(":", 1)[0]
        self.calls.setdefault(task_id, []).append(params.max_new_tokens)
        return await self.inner.generate(prompt_ids, params)

    def update_weights(self, policy: Any) -> None:
        pass


@pytest.mark.parametrize("mode", MODES)
async def test_each_job_carries_its_policy_and_sampling(tokenizer, scripted_engine, mode):
    """A job's scripted policy writes its turns (the engine never sees it); a job's sampling
    parameters are the engine's for its turns; the scheduler's ``sampling=`` fills in only the jobs
    that carry none, and the agent's own parameters apply when neither does."""
    engine = ParamsByTaskEngine(scripted_engine(["model text"]), tokenizer)
    agent = make_agent(tokenizer, engine, max_new_tokens=16)
    t = probe_tasks(4)
    jobs = [
        *make_jobs(t[:1], 1, policy=Say("scripted text")),
        *make_jobs(t[1:2], 1, sampling=SamplingParams(max_new_tokens=5)),
        *make_jobs(t[2:3], 1),
    ]
    result = await RUNNERS[mode](agent, ProbeEnv.fresh(), jobs, RolloutLimits.uniform(3))
    assert [tr.messages[2].content for tr in result] == ["scripted text", "model text", "model text"]
    assert engine.calls == {"t-1": [5, 5], "t-2": [16, 16]}
    assert all(lp == 0.0 for lp in result[0].logprobs) and any(result[1].logprobs)
    # the scheduler's keywords are defaults for the jobs that carry none
    engine.calls.clear()
    jobs = [*make_jobs(t[1:2], 1, sampling=SamplingParams(max_new_tokens=5)), *make_jobs(t[3:], 1)]
    await RUNNERS[mode](agent, ProbeEnv.fresh(), jobs, sampling=SamplingParams(max_new_tokens=7))
    assert engine.calls == {"t-1": [5, 5], "t-3": [7, 7]}
    # run_rollouts builds its jobs with its policy= and sampling= keywords
    engine.calls.clear()
    out = await run_rollouts(
        agent, ProbeEnv.fresh(), t[:2], mode=mode, sampling=SamplingParams(max_new_tokens=9)
    )
    assert engine.calls == {"t-0": [9, 9], "t-1": [9, 9]}
    out = await run_rollouts(agent, ProbeEnv.fresh(), t[:2], mode=mode, policy=Say("oracle"))
    assert engine.calls == {"t-0": [9, 9], "t-1": [9, 9]} and {tr.messages[2].content for tr in out} == {
        "oracle"
    }


# ------------------------------------------------------------------------ per-trajectory async
class OneSlowEnv(ProbeEnv):
    """Task t-0's steps take SLOW_STEP_S each; every other task's steps are instant."""

    turns = 3

    def step_delay(self, task_id: str, turn: int) -> float:
        return SLOW_STEP_S if task_id == "t-0" else 0.0


SLOW_STEP_S = 0.3


@pytest.mark.parametrize("mode", MODES)
async def test_a_slow_env_delays_only_its_own_trajectory_in_the_pipeline(tokenizer, scripted_engine, mode):
    """Pipeline: the fast trajectories stream out long before the slow one. Lockstep (the contrast):
    every turn waits for the slow env, so nothing is delivered before it is done."""
    tasks = probe_tasks(6)
    slow_total = OneSlowEnv.turns * SLOW_STEP_S
    delivered: list[tuple[str, float]] = []
    start = time.perf_counter()
    result = await run_rollouts(
        make_agent(tokenizer, scripted_engine(["act"])),
        OneSlowEnv.fresh(),
        tasks,
        mode=mode,
        limits=RolloutLimits.uniform(len(tasks)),  # one run slot per job: a single lockstep wave
        on_trajectory=lambda t: delivered.append((t.id, time.perf_counter() - start)),
    )
    assert all(t.finish == "finished" for t in result)
    assert sorted(i for i, _ in delivered) == sorted(t.id for t in result)
    fast = [at for tid, at in delivered if tid != "t-0#0"]
    slow_at = dict(delivered)["t-0#0"]
    assert slow_at >= slow_total * 0.9
    if mode == "pipeline":
        assert delivered[-1][0] == "t-0#0"  # first in job order, yet delivered last
        assert max(fast) < slow_at - slow_total / 2
    else:
        assert min(fast) >= slow_total * 0.9


class StaggeredEnv(ProbeEnv):
    """Every episode has TURNS turns; the episode of task t-i is slow (STAGGER_S) on turn i+1 only,
    so at every turn exactly one env is slow."""

    turns = 5

    def step_delay(self, task_id: str, turn: int) -> float:
        return STAGGER_S if int(task_id.split("-")[1]) + 1 == turn else 0.0


STAGGER_S = 0.3


async def test_pipeline_has_no_per_turn_barrier(tokenizer, scripted_engine):
    """Each episode is slow for one step only (STAGGER_S in total). The pipeline runs them side by
    side (wall ~ STAGGER_S); lockstep waits for the slowest env at every turn (wall ~ turns x STAGGER_S)."""
    tasks = probe_tasks(StaggeredEnv.turns)
    walls = {}
    for mode in MODES:
        start = time.perf_counter()
        result = await run_rollouts(
            make_agent(tokenizer, scripted_engine(["act"])),
            StaggeredEnv.fresh(),
            tasks,
            mode=mode,
            limits=RolloutLimits.uniform(len(tasks)),
        )
        walls[mode] = time.perf_counter() - start
        assert all(t.finish == "finished" and t.num_turns == StaggeredEnv.turns for t in result)
    assert walls["lockstep"] >= StaggeredEnv.turns * STAGGER_S * 0.9
    assert walls["lockstep"] > 2 * walls["pipeline"], walls


# ------------------------------------------------------------------- bounded queues, back-pressure
BACKPRESSURE = LatencyOptions(
    min_turns=1,
    max_turns=3,
    init_mean_s=0.005,
    init_sigma=0.0,
    step_mean_s=0.002,
    step_sigma=0.0,
    eval_mean_s=0.02,  # eval is the bottleneck (2 workers), so the queues before it fill up
    eval_sigma=0.0,
)


@pytest.mark.parametrize("mode", MODES)
async def test_live_envs_and_running_episodes_stay_bounded(tokenizer, scripted_engine, mode):
    limits = RolloutLimits(run_slots=4, init_workers=4, eval_workers=2, queue_size=2)
    # pipeline: each init worker holds one env (initializing or waiting to enter the run queue), the
    # run queue and the eval queue hold queue_size each, each run slot one (running, or finished and
    # waiting to enter the eval queue) and each eval worker one. Lockstep: one wave of run_slots.
    bound = {
        "pipeline": limits.run_slots + limits.init_workers + 2 * limits.queue_size + limits.eval_workers,
        "lockstep": limits.run_slots,
    }[mode]
    env_cls = TrackedLatencyEnv.fresh()
    tasks = LatencyEnv.make_tasks("train", 60, 0, BACKPRESSURE)
    peaks = {"running": 0, "admitted": 0, "evaluating": 0}

    def on_status(s: RolloutStatus) -> None:
        peaks["running"] = max(peaks["running"], s.running)
        peaks["admitted"] = max(peaks["admitted"], s.initializing + s.ready + s.running)
        peaks["evaluating"] = max(peaks["evaluating"], s.evaluating)

    result = await run_rollouts(
        make_agent(tokenizer, scripted_engine(["act"])),
        env_cls.factory(BACKPRESSURE),
        tasks,
        mode=mode,
        limits=limits,
        on_status=on_status,
    )
    assert len(result) == 60 and all(t.finish == "finished" for t in result)
    assert len(env_cls.instances) == 60 and env_cls.all_closed_once() and env_cls.live == 0
    assert limits.run_slots <= env_cls.max_live <= bound
    assert peaks["running"] == limits.run_slots  # the run slots were used, never exceeded
    if mode == "pipeline":
        # admission: at most run_slots + queue_size envs initializing, ready or running
        assert peaks["admitted"] <= limits.run_slots + limits.queue_size
        assert peaks["evaluating"] <= limits.eval_workers
        # back-pressure was exercised: more envs were held than the run stage alone holds
        assert env_cls.max_live > limits.run_slots + limits.queue_size
    assert result.metrics["rollout/running_max"] == limits.run_slots


@pytest.mark.parametrize("mode", MODES)
async def test_collect_false_streams_every_record_and_keeps_none(tokenizer, scripted_engine, mode):
    tasks = LatencyEnv.make_tasks("train", 6, 0, FAST)
    streamed: list[Trajectory] = []
    result = await run_rollouts(
        make_agent(tokenizer, scripted_engine(["act"])),
        TrackedLatencyEnv.fresh().factory(FAST),
        tasks,
        samples_per_task=2,
        mode=mode,
        limits=RolloutLimits.uniform(4),
        on_trajectory=streamed.append,
        collect=False,
    )
    assert len(result) == 0 and list(result) == []
    assert sorted(t.id for t in streamed) == sorted(f"{t.id}#{k}" for t in tasks for k in range(2))
    assert all(t.finish == "finished" and t.reward == 1.0 for t in streamed)
    assert result.metrics["rollout/failed"] == 0 and "rollout/wall_s" in result.metrics


# ------------------------------------------------------------------------------ failure isolation
FAILING_TASK = "t-1"
HANG_S = 0.3  # the timeout of the stage that hangs; the other stages get a generous one
FAULTS: dict[str, tuple[str, str, str]] = {
    # fault: (stage, finish, text in the error)
    "reset_raises": ("init", "error", "reset exploded"),
    "reset_hangs": ("init", "timeout", "init_timeout_s"),
    "reset_returns_str": ("init", "error", "reset() must return a non-empty list of Message, got str"),
    "reset_returns_empty_list": ("init", "error", "got list (empty)"),
    "step_raises": ("run", "error", "step exploded"),
    "step_hangs": ("run", "timeout", "run_timeout_s"),
    "step_returns_none": ("run", "error", "step() must return a StepResult, got NoneType"),
    "step_returns_nan_reward": ("run", "error", "step() returned a non-finite reward (nan)"),
    "evaluate_raises": ("eval", "error", "evaluate exploded"),
    "evaluate_hangs": ("eval", "timeout", "eval_timeout_s"),
    "evaluate_returns_nan": ("eval", "error", "non-finite or non-numeric reward"),
    "engine_raises": ("run", "error", "engine down"),
}


class FaultyEnv(ProbeEnv):
    """Misbehaves as ``fault`` says on task FAILING_TASK only."""

    fault: ClassVar[str] = ""

    def _faulty(self, what: str) -> bool:
        return self.task is not None and self.task.id == FAILING_TASK and self.fault == what

    async def reset(self, task: Task) -> Any:
        messages = await super().reset(task)
        if self._faulty("reset_raises"):
            raise RuntimeError("reset exploded")
        if self._faulty("reset_hangs"):
            await asyncio.sleep(60)
        if self._faulty("reset_returns_str"):
            return "You are an agent."
        if self._faulty("reset_returns_empty_list"):
            return []
        return messages

    async def step(self, action: Action) -> Any:
        result = await super().step(action)
        if self._faulty("step_raises"):
            raise RuntimeError("step exploded")
        if self._faulty("step_hangs"):
            await asyncio.sleep(60)
        if self._faulty("step_returns_none"):
            return None
        if self._faulty("step_returns_nan_reward"):
            return StepResult(observations=result.observations, reward=math.nan)
        return result

    async def evaluate(self) -> Any:
        if self._faulty("evaluate_raises"):
            raise RuntimeError("evaluate exploded")
        if self._faulty("evaluate_hangs"):
            await asyncio.sleep(60)
        if self._faulty("evaluate_returns_nan"):
            return math.nan
        return await super().evaluate()


class FailOnTaskEngine:
    """Delegates to an engine, but raises for the episode whose prompt names ``task_id``."""

    def __init__(self, inner: Any, tokenizer: Any, task_id: str) -> None:
        self.inner, self.tokenizer, self.marker = inner, tokenizer, f"Task {task_id}:"

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Any:
        if self.marker in self.tokenizer.decode(prompt_ids):
            raise RuntimeError("engine down")
        return await self.inner.generate(prompt_ids, params)

    def update_weights(self, policy: Any) -> None:
        pass


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("mode", MODES)
async def test_one_failing_trajectory_is_isolated(tokenizer, scripted_engine, mode, fault):
    stage, finish, text = FAULTS[fault]
    env_cls = FaultyEnv.fresh(fault=fault)
    engine = scripted_engine(["act"])
    if fault == "engine_raises":
        engine = FailOnTaskEngine(engine, tokenizer, FAILING_TASK)
    timeouts = StageTimeouts(
        init_s=HANG_S if stage == "init" else 10.0,
        run_s=HANG_S if stage == "run" else 10.0,
        eval_s=HANG_S if stage == "eval" else 10.0,
    )
    tasks = probe_tasks(4)
    start = time.perf_counter()
    result = await run_rollouts(
        make_agent(tokenizer, engine),
        env_cls,
        tasks,
        mode=mode,
        limits=RolloutLimits(run_slots=2, init_workers=2, eval_workers=2, queue_size=2, timeouts=timeouts),
    )
    assert time.perf_counter() - start < 5  # a hang costs its stage timeout, not the hang
    assert [t.id for t in result] == [f"{t.id}#0" for t in tasks]
    bad = f"{FAILING_TASK}#0"
    for traj in result:
        if traj.id == bad:
            assert traj.finish == finish, traj.error
            assert traj.error is not None and text in traj.error
            assert f"the {stage} stage" in traj.error
            if finish == "error":
                assert "Traceback" in traj.error
            assert traj.reward == 0.0 and not traj.success
        else:
            assert traj.finish == "finished" and traj.reward == 1.0 and traj.error is None
            assert traj.num_turns == env_cls.turns
    # every env was closed once, the failing one included
    assert len(env_cls.instances) == len(tasks) and env_cls.all_closed_once()
    assert [e.closes for e in env_cls.instances if e.task.id == FAILING_TASK] == [1]
    m = result.metrics
    assert m["rollout/failed"] == 1
    for s in ("init", "run", "eval", "close"):
        assert m[f"rollout/failed_{s}"] == (1 if s == stage else 0), s


# ---------------------------------------------------------------------------------- failure policy
def traj(tid: str, group: str, finish: str = "finished", reward: float = 1.0) -> Trajectory:
    return Trajectory(
        id=tid,
        task_id=group,
        group_id=group,
        env="test",
        messages=[Message(role="user", content="x")],
        prompt_ids=[1, 2],
        response_ids=[3],
        loss_mask=[1],
        logprobs=[-0.1],
        reward=reward,
        finish=finish,  # type: ignore[arg-type]
    )


BATCH = [
    traj("a#0", "a"),
    traj("a#1", "a", "error", 0.0),
    traj("b#0", "b", reward=0.0),
    traj("b#1", "b", "turn_budget", 0.0),
    traj("c#0", "c", "timeout", 0.0),
    traj("c#1", "c", "timeout", 0.0),
    traj("d#0", "d", "loop", 0.0),
]


@pytest.mark.parametrize(
    ("policy", "kept", "dropped_trajs", "dropped_groups"),
    [
        ("drop_trajectory", ["a#0", "b#0", "b#1", "d#0"], 3, 1),
        ("drop_group", ["b#0", "b#1", "d#0"], 4, 2),
        ("zero_reward", [t.id for t in BATCH], 0, 0),
    ],
)
def test_failure_policy(policy, kept, dropped_trajs, dropped_groups):
    out, metrics = apply_failure_policy(BATCH, policy)
    assert [t.id for t in out] == kept
    assert metrics == {
        "failures/error": 1.0,
        "failures/timeout": 2.0,
        "failures/dropped_trajectories": float(dropped_trajs),
        "failures/dropped_groups": float(dropped_groups),
    }
    # model-caused endings (turn_budget, loop) are never failures
    assert {"b#1", "d#0"} <= {t.id for t in out}


def test_zero_reward_policy_zeroes_failures_and_keeps_the_rest():
    batch = [traj("a#0", "a", reward=0.5), traj("a#1", "a", "error", 0.7), traj("a#2", "a", "timeout", 0.9)]
    out, _ = apply_failure_policy(batch, "zero_reward")
    assert [t.reward for t in out] == [0.5, 0.0, 0.0]
    assert [t.finish for t in out] == ["finished", "error", "timeout"]
    assert [t.reward for t in batch] == [0.5, 0.7, 0.9]  # the input records are not modified


def test_unknown_failure_policy_names_the_valid_ones():
    with pytest.raises(
        ValueError, match=r"unknown failure policy 'bogus'.*drop_trajectory, drop_group, zero_reward"
    ):
        apply_failure_policy(BATCH, "bogus")  # type: ignore[arg-type]
    assert set(FAILURE_POLICIES) == {"drop_trajectory", "drop_group", "zero_reward"}


@pytest.mark.parametrize(
    ("override", "key", "choices"),
    [
        (
            "rollout.on_failure=bogus",
            r"rollout\.on_failure",
            ["drop_trajectory", "drop_group", "zero_reward"],
        ),
        ("rollout.mode=bogus", r"rollout\.mode", ["pipeline", "lockstep"]),
    ],
)
def test_config_rejects_unknown_mode_and_failure_policy(override, key, choices):
    with pytest.raises(ConfigError, match=key) as info:
        load_config(None, [override])
    message = str(info.value)
    assert "'bogus'" in message
    assert all(repr(c) in message for c in choices), message
    # and the valid values load
    cfg = load_config(None, [override.replace("bogus", choices[-1])])
    assert choices[-1] in (cfg.rollout.on_failure, cfg.rollout.mode)


# ----------------------------------------------------------------------------------------- groups
@pytest.mark.parametrize("mode", MODES)
async def test_on_group_gets_each_complete_group_once(tokenizer, scripted_engine, mode):
    tasks = LatencyEnv.make_tasks("train", 4, 0, FAST)
    samples = 3
    events: list[tuple[str, Any]] = []
    result = await run_rollouts(
        make_agent(tokenizer, scripted_engine(["act"])),
        LatencyEnv.factory(FAST),
        tasks,
        samples_per_task=samples,
        mode=mode,
        limits=RolloutLimits.uniform(4),
        on_trajectory=lambda t: events.append(("traj", t)),
        on_group=lambda g: events.append(("group", g)),
    )
    groups = [g for kind, g in events if kind == "group"]
    assert sorted(g[0].group_id for g in groups) == sorted(t.id for t in tasks)  # once per group
    by_id = {t.id: t for t in result}
    for group in groups:
        gid = group[0].group_id
        assert [t.id for t in group] == [f"{gid}#{k}" for k in range(samples)]  # complete, job order
        assert all(t.group_id == gid and t == by_id[t.id] for t in group)
    # a group is handed on only after all its trajectories were
    seen: set[str] = set()
    for kind, item in events:
        if kind == "traj":
            seen.add(item.id)
        else:
            assert {t.id for t in item} <= seen


class SlowLastTaskEnv(ProbeEnv):
    """Task t-3's steps are slow; the other tasks' are instant."""

    turns = 3

    def step_delay(self, task_id: str, turn: int) -> float:
        return SLOW_STEP_S if task_id == "t-3" else 0.0


async def test_pipeline_streams_groups_before_the_last_trajectory_finishes(tokenizer, scripted_engine):
    events: list[tuple[str, str, float]] = []
    start = time.perf_counter()
    await run_pipeline(
        make_agent(tokenizer, scripted_engine(["act"])),
        SlowLastTaskEnv.fresh(),
        make_jobs(probe_tasks(4), 2),
        RolloutLimits.uniform(8),
        on_trajectory=lambda t: events.append(("traj", t.id, time.perf_counter() - start)),
        on_group=lambda g: events.append(("group", g[0].group_id, time.perf_counter() - start)),
    )
    groups = [(gid, at) for kind, gid, at in events if kind == "group"]
    last_traj_at = max(at for kind, _, at in events if kind == "traj")
    assert len(groups) == 4 and groups[-1][0] == "t-3"
    slow_total = SlowLastTaskEnv.turns * SLOW_STEP_S
    assert last_traj_at >= slow_total * 0.9
    # the first group reached the consumer while the slow group was still being sampled
    assert groups[0][1] < last_traj_at - slow_total / 2


# ----------------------------------------------------------------------------------- cancellation
CANCEL = LatencyOptions(
    min_turns=1,
    max_turns=3,
    init_mean_s=0.01,
    init_sigma=0.5,
    step_mean_s=0.005,
    step_sigma=0.5,
    eval_mean_s=0.01,
    eval_sigma=0.5,
)


async def cancel_after(coro: Any, started: asyncio.Event) -> None:
    """Run ``coro`` as a task, cancel it once ``started`` is set, and check it raises CancelledError."""
    task = asyncio.create_task(coro)
    await asyncio.wait_for(started.wait(), timeout=10)
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def other_tasks() -> set[asyncio.Task[Any]]:
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()}


@pytest.mark.parametrize("mode", MODES)
async def test_cancel_closes_every_env_and_keeps_the_streamed_records(tokenizer, scripted_engine, mode):
    env_cls = TrackedLatencyEnv.fresh()
    tasks = LatencyEnv.make_tasks("train", 40, 0, CANCEL)
    delivered: list[Trajectory] = []
    enough = asyncio.Event()

    def on_trajectory(t: Trajectory) -> None:
        delivered.append(t)
        if len(delivered) >= 3:
            enough.set()

    before = other_tasks()
    await cancel_after(
        run_rollouts(
            make_agent(tokenizer, scripted_engine(["act"])),
            env_cls.factory(CANCEL),
            tasks,
            mode=mode,
            limits=RolloutLimits.uniform(4),
            on_trajectory=on_trajectory,
        ),
        enough,
    )
    assert other_tasks() <= before  # no worker of the rollout is left running
    n = len(delivered)
    assert 3 <= n < len(tasks)
    # every env ever made is closed (once); in the pipeline episodes were in flight at the cancel
    # (lockstep closes a wave together, so the cancel may fall between two waves)
    assert len(env_cls.instances) > n if mode == "pipeline" else len(env_cls.instances) >= n
    assert env_cls.live == 0 and env_cls.all_closed_once()
    # the streamed records are complete
    all_ids = [f"{t.id}#0" for t in tasks]
    assert len({t.id for t in delivered}) == n and {t.id for t in delivered} <= set(all_ids)
    for t in delivered:
        assert t.finish == "finished" and t.reward == 1.0 and t.error is None
        assert CANCEL.min_turns <= t.num_turns <= CANCEL.max_turns
        assert t.timings.eval_s > 0 and sum(t.loss_mask) > 0
    await asyncio.sleep(0.1)
    assert len(delivered) == n  # nothing is delivered after the cancel


class SlowCloseEnv(ProbeEnv):
    """An env whose close takes a while (a sandbox being torn down)."""

    closing: ClassVar[asyncio.Event]

    async def close(self) -> None:
        type(self).closing.set()
        await asyncio.sleep(0.2)
        await super().close()


@pytest.mark.parametrize("mode", MODES)
async def test_cancel_during_an_env_close_still_closes_it(tokenizer, scripted_engine, mode):
    env_cls = SlowCloseEnv.fresh(closing=asyncio.Event())
    await cancel_after(
        run_rollouts(
            make_agent(tokenizer, scripted_engine(["act"])),
            env_cls,
            probe_tasks(8),
            mode=mode,
            limits=RolloutLimits.uniform(2),
        ),
        env_cls.closing,
    )
    await asyncio.sleep(0.3)
    assert env_cls.instances and env_cls.all_closed_once(), [e.closes for e in env_cls.instances]


# ------------------------------------------------------------------------------------ real engine
async def test_pipeline_with_the_real_engine_batches_requests(tiny_model_and_tokenizer):
    from horizonrl.engine.hf import HFEngine

    model, tok = tiny_model_and_tokenizer
    engine = HFEngine(model, tok, max_batch_size=8, seed=0)
    options = LatencyOptions(min_turns=2, max_turns=3, init_mean_s=0.0, step_mean_s=0.0, eval_mean_s=0.0)
    agent = Agent(
        tok, engine, SamplingParams(max_new_tokens=8), AgentConfig(max_turns=3), context_length=8192
    )
    tasks = LatencyEnv.make_tasks("train", 4, 0, options)
    try:
        result = await run_pipeline(
            agent, LatencyEnv.factory(options), make_jobs(tasks, 2), RolloutLimits.uniform(8)
        )
    finally:
        await engine.close()
    assert len(result) == 8
    stats = engine.stats
    assert stats["requests"] == sum(t.num_turns for t in result)
    assert stats["batches"] < stats["requests"]  # concurrent episodes' requests were batched
    for traj in result:
        assert traj.finish == "finished" and traj.reward == 1.0, traj.error
        assert options.min_turns <= traj.num_turns <= options.max_turns
        model_lps = [lp for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True) if m]
        assert model_lps and all(lp < 0 for lp in model_lps)
