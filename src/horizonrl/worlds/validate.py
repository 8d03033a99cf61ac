"""Three-stage validation of a world, shipped or generated alike.

1. **execution** — inside a bubblewrap sandbox, the world runs under a random agent and a ReAct-style
   LLM agent (the explorer role) for N steps each without an error in the world's code or a hang
   (every command has a timeout; a hang is counted as one).
2. **levels** — every stored level is what the generator makes from its seed, the planner solves it
   to the stored maximum, the stored plan earns that maximum when replayed, and a binary world's
   maximum is 1 (its goal is reachable).
3. **reliability** — a differential test: the planner scores at least the random agent on every level,
   an ε-planner (the planner with half its actions random) is not beaten on average by the random
   agent, and the random agent does not reach the maximum everywhere (rewards come from skill, not
   chance).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any

from horizonrl.errors import HorizonError
from horizonrl.roles.base import RoleClient
from horizonrl.toolcalls import format_instructions, malformed_feedback, parse_tool_calls
from horizonrl.types import Action, Message, Task
from horizonrl.worlds.env import WorldEnv, WorldOptions
from horizonrl.worlds.package import SPLITS, LevelRecord, WorldPackage, level_seed
from horizonrl.worlds.runner import SandboxRunner, WorldCodeError, WorldRunner, make_runner

RANDOM_EPISODES_PER_LEVEL = 4
"""Random and ε-planner episodes per level in the reliability stage."""


@dataclass
class Stage:
    ok: bool = True
    problems: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    def fail(self, problem: str) -> None:
        self.ok = False
        self.problems.append(problem)


@dataclass
class WorldReport:
    world: str
    execution: Stage = field(default_factory=Stage)
    levels: Stage = field(default_factory=Stage)
    reliability: Stage = field(default_factory=Stage)

    @property
    def valid(self) -> bool:
        return self.execution.ok and self.levels.ok and self.reliability.ok

    def first_problem(self) -> str:
        for name in ("execution", "levels", "reliability"):
            stage: Stage = getattr(self, name)
            if stage.problems:
                return f"{name}: {stage.problems[0]}"
        return ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "world": self.world,
            "valid": self.valid,
            **{k: asdict(getattr(self, k)) for k in ("execution", "levels", "reliability")},
        }


def action_schemas(package: WorldPackage) -> dict[str, Any]:
    return {name: a.model_dump() for name, a in package.spec.transition.actions.items()}


async def episode(
    runner: WorldRunner, package: WorldPackage, record: LevelRecord, agent: dict[str, Any]
) -> dict[str, Any]:
    """One episode of a scripted agent (run inside the world's process: one call)."""
    cmd = {
        "op": "episode",
        "level": record.level,
        "seed": record.seed,
        "max_steps": package.spec.termination.max_steps,
        "actions": action_schemas(package),
        "agent": agent,
    }
    return await runner.call(cmd, timeout=30.0)


def normalized(reward: float, top: float) -> float:
    return reward / top if top > 0 else reward


async def react_episode(package: WorldPackage, index: int, client: RoleClient, steps: int) -> dict[str, Any]:
    """A ReAct-style LLM agent (one thought line, then one tool call a turn) on training level
    ``index`` for up to ``steps`` turns, through the world env in a sandbox; malformed replies and
    refused actions are counted, never raised (a failure of the world's own code is raised)."""
    world = str(package.root)
    env = WorldEnv(WorldOptions(world=world, sandbox="always"))
    task = Task(
        id=f"{package.name}/train/{index:02d}",
        env="world",
        data={"world": world, "split": "train", "index": index},
    )
    try:
        system, first = await env.reset(task)
        prompt = Message(
            role="system",
            content=f"{system.content}\n\n{format_instructions(env.tools)}\n\n"
            "Each turn, write one line starting with 'Thought:' and then exactly one tool call.",
        )
        history: list[Message] = [first]
        malformed = 0
        for _ in range(steps):
            reply = await client.chat([prompt, *history[-5:]])
            history.append(Message(role="assistant", content=reply))
            parsed = parse_tool_calls(reply)
            if not parsed.ok:
                malformed += 1
                feedback = malformed_feedback(parsed.error or "no tool call", env.tools)
                history.append(Message(role="user", content=feedback))
                continue
            result = await env.step(Action(text=reply, tool_calls=parsed.calls[:1]))
            if "world_error" in result.info:
                raise WorldCodeError(result.info["world_error"], bool(result.info.get("world_timed_out")))
            history.append(Message(role="user", content=result.observations[0].content))
            if result.done:
                break
        m = env.metrics
        return {
            "reward": m["raw_reward"],
            "steps": int(m["steps"]),
            "malformed": malformed,
            "action_errors": int(m["world_errors"]),
        }
    finally:
        await env.close()


async def check_execution(
    package: WorldPackage, stage: Stage, steps: int, react: RoleClient | None, react_steps: int
) -> None:
    runner = SandboxRunner(package)
    try:
        records = package.levels("train")[:2] or []
        random_steps = episodes = 0
        rng = random.Random(0)
        while random_steps < steps and records:
            record = records[episodes % len(records)]
            out = await episode(runner, package, record, {"kind": "random", "seed": rng.randrange(1 << 30)})
            random_steps += int(out["steps"])
            episodes += 1
        stage.figures.update(random_steps=random_steps, random_episodes=episodes)
        if react is not None and react_steps > 0 and records:
            out = await react_episode(package, records[0].index, react, react_steps)
            stage.figures.update({f"react_{k}": v for k, v in out.items()})
        else:
            stage.figures["react_steps"] = "not run"
    except WorldCodeError as exc:
        stage.figures["timed_out"] = int(exc.timed_out)
        stage.fail(str(exc))
    except HorizonError as exc:  # e.g. no levels stored
        stage.fail(str(exc))
    finally:
        await runner.aclose()


async def check_levels(
    package: WorldPackage, runner: WorldRunner, stage: Stage
) -> dict[str, list[LevelRecord]]:
    spec = package.spec
    stored: dict[str, list[LevelRecord]] = {}
    for split in SPLITS:
        stored[split] = package.levels(split)
        want = spec.generator.train_levels if split == "train" else spec.generator.val_levels
        if len(stored[split]) != want:
            stage.fail(f"{split}: {len(stored[split])} levels stored, the generator says {want}")
    for split, records in stored.items():
        for rec in records:
            where = f"{split}[{rec.index}]"
            if rec.seed != level_seed(spec.generator.seed, split, rec.index):
                stage.fail(f"{where}: seed {rec.seed} is not the generator's seed for it")
                continue
            level = (
                await runner.call({"op": "generate", "seed": rec.seed, "params": spec.generator.params})
            )["level"]
            if level != rec.level:
                stage.fail(
                    f"{where}: the generator makes another level from seed {rec.seed} (not deterministic?)"
                )
            solved = await runner.call(
                {"op": "solve", "level": rec.level, "max_steps": spec.termination.max_steps}, timeout=60.0
            )
            if abs(float(solved["max_reward"]) - rec.max_reward) > 1e-9:
                stage.fail(f"{where}: max reward {solved['max_reward']} computed, {rec.max_reward} stored")
            if rec.max_reward <= 0:
                stage.fail(f"{where}: max reward {rec.max_reward} (the level cannot be won)")
            if spec.reward.kind == "binary" and rec.max_reward != 1.0:
                stage.fail(
                    f"{where}: binary world with max reward {rec.max_reward} (the goal is unreachable)"
                )
            replay = await episode(
                runner, package, rec, {"kind": "plan", "plan": [list(p) for p in rec.plan]}
            )
            if abs(float(replay["reward"]) - rec.max_reward) > 1e-9:
                stage.fail(f"{where}: the stored plan earns {replay['reward']}, not the max {rec.max_reward}")
    stage.figures["levels"] = {split: len(r) for split, r in stored.items()}
    return stored


async def check_reliability(
    package: WorldPackage, runner: WorldRunner, stage: Stage, levels: list[LevelRecord]
) -> None:
    rng = random.Random(1)
    planner, random_scores, eps_scores = [], [], []
    for rec in levels:
        plan = await episode(runner, package, rec, {"kind": "epsilon", "eps": 0.0})
        rand = [
            normalized(
                float(
                    (await episode(runner, package, rec, {"kind": "random", "seed": rng.randrange(1 << 30)}))[
                        "reward"
                    ]
                ),
                rec.max_reward,
            )
            for _ in range(RANDOM_EPISODES_PER_LEVEL)
        ]
        eps = [
            normalized(
                float(
                    (
                        await episode(
                            runner,
                            package,
                            rec,
                            {"kind": "epsilon", "eps": 0.5, "seed": rng.randrange(1 << 30)},
                        )
                    )["reward"]
                ),
                rec.max_reward,
            )
            for _ in range(RANDOM_EPISODES_PER_LEVEL)
        ]
        p = normalized(float(plan["reward"]), rec.max_reward)
        planner.append(p)
        random_scores += rand
        eps_scores += eps
        if p + 1e-9 < max(rand):
            stage.fail(f"level {rec.index}: the random agent ({max(rand):.2f}) beat the planner ({p:.2f})")
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
    stage.figures.update(planner=mean(planner), random=mean(random_scores), epsilon_planner=mean(eps_scores))
    if mean(planner) < 1.0 - 1e-9:
        stage.fail(f"the planner reaches {mean(planner):.3f} of the max, not 1.0, from the start")
    if mean(eps_scores) + 1e-9 < mean(random_scores):
        stage.fail(
            f"the ε-planner ({mean(eps_scores):.2f}) loses to the random agent ({mean(random_scores):.2f})"
        )
    if random_scores and min(random_scores) >= 1.0 - 1e-9:
        stage.fail("the random agent reaches the max on every level: rewards come from chance, not skill")


async def validate_world(
    package: WorldPackage,
    *,
    steps: int = 60,
    react: RoleClient | None = None,
    react_steps: int = 0,
    sandbox: str = "auto",
) -> WorldReport:
    """Run the three stages; a stage that cannot start (no levels) fails with the reason."""
    report = WorldReport(package.name)
    await check_execution(package, report.execution, steps, react, react_steps)
    runner = make_runner(package, sandbox)
    try:
        levels = await check_levels(package, runner, report.levels)
        await check_reliability(package, runner, report.reliability, levels["train"] + levels["val"])
    except WorldCodeError as exc:
        stage = report.levels if report.levels.ok else report.reliability
        stage.fail(str(exc))
    except Exception as exc:  # a malformed package: report, never crash the batch
        report.levels.fail(f"{type(exc).__name__}: {exc}")
    finally:
        await runner.aclose()
    return report
