"""``world``: layered worlds as a tool env. The world's actions are the tools; its observation
policy and skin are chosen by the env's options, so one world yields several envs.

A task names a world and one of its stored levels (``data``: ``world``, ``split``, ``index``). The
reward of each step is the world's reward divided by the level's maximum, so an episode's return is
its **normalized reward** (achieved / max) whatever the world; ``metrics`` hold the raw reward, the
normalized one, ``success`` (the maximum reached) and the steps taken.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar, Literal

from pydantic import Field

from horizonrl.envs.base import Env, EnvOptions
from horizonrl.errors import ConfigError, DataError
from horizonrl.toolcalls import format_tool_call
from horizonrl.types import Action, Message, StepResult, Task, ToolSpec
from horizonrl.worlds.dsl import ActionSpec
from horizonrl.worlds.package import LevelRecord, WorldPackage, open_world, world_names
from horizonrl.worlds.runner import WorldCodeError, WorldRunner, make_runner
from horizonrl.worlds.worldlib import fill


class WorldOptions(EnvOptions):
    world: str = Field(
        "all", description="A shipped world's name, a world directory, a comma-separated list, or all."
    )
    observation: Literal["full", "radius", "line_of_sight", "mask"] | None = Field(
        None, description="Observation policy for every world (default: each world's own)."
    )
    skin: str | None = Field(
        None, description="Skin for every world, e.g. inverse (default: each world's own)."
    )
    sandbox: Literal["auto", "always", "never"] = Field(
        "auto",
        description="Where world code runs: auto (shipped worlds in process, others in a bubblewrap "
        "sandbox), always, or never (refused for generated worlds).",
    )


def tool_specs(actions: dict[str, ActionSpec]) -> list[ToolSpec]:
    """The world's actions as OpenAI function tools."""
    specs = []
    for name, spec in actions.items():
        props = {key: p.schema() for key, p in spec.params.items()}
        params = {"type": "object", "properties": props, "required": list(props)}
        specs.append(ToolSpec(name=name, description=spec.description, parameters=params))
    return specs


def check_arguments(name: str, spec: ActionSpec, args: dict[str, Any]) -> str:
    """Why ``args`` do not fit the action (empty when they do)."""
    unknown = sorted(set(args) - set(spec.params))
    if unknown:
        return f"{name} takes no argument {unknown[0]!r}; its arguments: {', '.join(spec.params) or 'none'}"
    for key, p in spec.params.items():
        if key not in args:
            return f"{name} needs argument {key!r} ({p.description or p.type})"
        value = args[key]
        if p.type == "integer":
            if isinstance(value, bool) or not isinstance(value, int):
                if isinstance(value, str) and value.strip().lstrip("-").isdigit():
                    args[key] = value = int(value)
                else:
                    return f"{name}: {key} must be an integer (got {value!r})"
            if (p.minimum is not None and value < p.minimum) or (p.maximum is not None and value > p.maximum):
                return f"{name}: {key} must be between {p.minimum} and {p.maximum} (got {value})"
        elif not isinstance(value, str):
            return f"{name}: {key} must be a string (got {value!r})"
        if p.enum is not None and value not in p.enum:
            return f"{name}: {key} must be one of {', '.join(p.enum)} (got {value!r})"
    return ""


class PlanOracle:
    """The world's planner as a scripted policy: the level's stored plan, one action a turn (the
    plan was computed by the world's ``oracle`` and checked to earn the level's maximum)."""

    def act(self, task: Task, messages: list[Message]) -> str:
        record = level_of(task)
        turn = sum(1 for m in messages if m.role == "assistant")
        action, args = record.plan[min(turn, len(record.plan) - 1)]
        return format_tool_call(action, dict(args))


_LEVELS: dict[tuple[str, str], list[LevelRecord]] = {}


def levels_of(package: WorldPackage, split: str) -> list[LevelRecord]:
    key = (str(package.root.resolve()), split)
    if key not in _LEVELS:
        _LEVELS[key] = package.levels(split)
    return _LEVELS[key]


def level_of(task: Task) -> LevelRecord:
    for key in ("world", "split", "index"):
        if key not in task.data:
            raise DataError(f"world task {task.id!r} needs data.{key} (data: world, split, index)")
    records = levels_of(open_world(task.data["world"]), task.data["split"])
    index = int(task.data["index"])
    if not 0 <= index < len(records):
        raise DataError(f"world task {task.id!r}: level {index} does not exist (0..{len(records) - 1})")
    return records[index]


class WorldEnv(Env[WorldOptions]):
    """A layered world: the tools are its actions; the reward is normalized by the level's maximum."""

    name = "world"
    Options = WorldOptions
    split_aliases: ClassVar[dict[str, str]] = {"test": "val"}

    def __init__(self, options: WorldOptions | None = None) -> None:
        super().__init__(options)
        self._runners: dict[str, WorldRunner] = {}
        self.package: WorldPackage | None = None

    @classmethod
    def splits(cls) -> tuple[str, ...]:
        return ("train", "val", "test")

    @classmethod
    def make_tasks(cls, split: str, n: int, seed: int, options: WorldOptions) -> list[Task]:
        """``n`` tasks over the worlds' stored levels of ``split`` (``test`` means ``val``): every
        level once, in a seeded order, then again as needed."""
        split = cls.split_aliases.get(split, split)
        if split not in ("train", "val"):
            raise ConfigError(f"world env: unknown split {split!r}; valid: train, val (or test for val)")
        pool = []
        for name in world_names(options.world):
            package = open_world(name)
            if options.skin is not None:
                package.skin(options.skin)  # a world without that skin is a ConfigError here
            pool += [(name, package.name, r.index) for r in levels_of(package, split)]
        if not pool:
            raise ConfigError(f"world env: no levels for world={options.world!r}")
        rng = random.Random(seed)
        tasks: list[Task] = []
        while len(tasks) < n:
            batch = list(pool)
            rng.shuffle(batch)
            for world, world_name, index in batch[: n - len(tasks)]:
                lap = len(tasks) // len(pool)
                task_id = f"{world_name}/{split}/{index:02d}" + (f"#{lap}" if lap else "")
                data = {"world": world, "split": split, "index": index}
                tasks.append(Task(id=task_id, env=cls.name, split=split, data=data))
        return tasks

    @classmethod
    def oracle(cls, options: WorldOptions | None = None) -> PlanOracle:
        return PlanOracle()

    def _runner(self, package: WorldPackage) -> WorldRunner:
        key = str(package.root.resolve())
        if key not in self._runners:
            self._runners[key] = make_runner(package, self.options.sandbox)
        return self._runners[key]

    async def reset(self, task: Task) -> list[Message]:
        self.record = level_of(task)
        package = self.package = open_world(task.data["world"])
        spec = package.spec
        self.obs = spec.observation.policy(self.options.observation)
        self.skin = package.skin(self.options.skin)
        self.max_steps = spec.termination.max_steps
        self.actions = spec.transition.actions
        self.tools = tool_specs(self.actions)
        self.runner = self._runner(package)
        self.t, self.total = 0, 0.0
        self.metrics = {
            "success": 0.0,
            "normalized_reward": 0.0,
            "raw_reward": 0.0,
            "steps": 0.0,
            "world_errors": 0.0,
        }
        out = await self.runner.call(self._cmd("reset"))
        self.state = out["state"]
        instruction = fill(package.instruction, self.skin.get("names", {}))
        budget = f"You have {self.max_steps} steps. Call one action at a time; read what it did."
        system = f"{instruction}\n\n{budget}"
        return [Message(role="system", content=system), Message(role="user", content=out["text"])]

    def _cmd(self, op: str, **extra: Any) -> dict[str, Any]:
        return {
            "op": op,
            "level": self.record.level,
            "seed": self.record.seed,
            "obs": self.obs,
            "skin": self.skin,
            "max_steps": self.max_steps,
            **extra,
        }

    async def step(self, action: Action) -> StepResult:
        result = StepResult()
        for call in action.tool_calls:
            spec = self.actions.get(call.name)
            args = dict(call.arguments)
            if spec is None:
                why = f"unknown action {call.name!r}; actions: {', '.join(self.actions)}"
            else:
                why = check_arguments(call.name, spec, args)
            if why:
                self.metrics["world_errors"] += 1
                result.observations.append(
                    Message(role="tool", content=f"Error: {why}", tool_call_id=call.id, name=call.name)
                )
                continue
            try:
                out = await self.runner.call(
                    self._cmd("step", state=self.state, t=self.t, action=call.name, args=args)
                )
            except WorldCodeError as exc:  # the world's own code failed: the episode ends with an error
                self.metrics["world_errors"] += 1
                result.info["world_error"] = str(exc)
                result.info["world_timed_out"] = exc.timed_out
                result.observations.append(
                    Message(role="tool", content=f"Error: {exc}", tool_call_id=call.id, name=call.name)
                )
                result.done = True
                break
            self.t += 1
            self.state = out["state"]
            if out["error"]:
                self.metrics["world_errors"] += 1
            result.reward += self._normalized(float(out["reward"]))
            self.total += float(out["reward"])
            result.observations.append(
                Message(role="tool", content=out["text"], tool_call_id=call.id, name=call.name)
            )
            if out["done"]:
                result.done = True
                break
        self._update_metrics()
        return result

    def _normalized(self, reward: float) -> float:
        top = self.record.max_reward
        return reward / top if top > 0 else reward

    def _update_metrics(self) -> None:
        self.metrics["raw_reward"] = self.total
        self.metrics["normalized_reward"] = self._normalized(self.total)
        self.metrics["success"] = float(self.total >= self.record.max_reward - 1e-9)
        self.metrics["steps"] = float(self.t)

    async def close(self) -> None:
        for runner in self._runners.values():
            await runner.aclose()
        self._runners.clear()
