"""Other frameworks' envs through their adapters (docs/envs.md, "Other frameworks' envs"): what an
adapter costs per step against a native env doing the same work, side by side in one process.

Each framework is a *section* (a function registered in ``SECTIONS``) that measures its adapter and
returns its figures; a section whose framework is not installed is skipped with a note. Figures are
printed ``name=value``, prefixed with the section's name, each section's headline ratio
``<section>_step_overhead`` (adapter / native, wall time, minus 1) last.

    python benchmarks/foreign_envs.py [--quick] [--only verifiers]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from horizonrl.envs.base import Env, EnvOptions
from horizonrl.types import Action, Message, StepResult, Task

ROOT = Path(__file__).resolve().parents[1]

#: section name -> (the module its framework imports as, the function measuring it)
SECTIONS: dict[str, tuple[str, Callable[[argparse.Namespace], dict[str, float]]]] = {}


def section(name: str, needs: str) -> Callable:
    def register(fn: Callable[[argparse.Namespace], dict[str, float]]) -> Callable:
        SECTIONS[name] = (needs, fn)
        return fn

    return register


# ---------------------------------------------------------------- what every section measures
def env_only(
    make: Callable[[], Env],
    tasks: list[Task],
    replies: Callable[[Task], list[str]],
    rounds: int,
    evaluate: bool = False,
) -> float:
    """Microseconds per env step of ``make``'s env alone: reset, each task's fixed replies until done
    (``evaluate()`` after, for envs that score at the end), close."""

    async def go() -> float:
        steps, start = 0, time.perf_counter()
        for _ in range(rounds):
            for task in tasks:
                env = make()
                await env.reset(task)
                for reply in replies(task):
                    steps += 1
                    if (await env.step(Action(text=reply))).done:
                        break
                if evaluate:
                    await env.evaluate()
                await env.close()
        return (time.perf_counter() - start) / steps * 1e6

    return asyncio.run(go())


def model_runs(
    recipe: str,
    overrides: list[str],
    tasks: list[Task],
    native: Callable[[], Env],
    adapter: Callable[[], Env],
    repeats: int,
) -> dict[str, float]:
    """The recipe's embedded model, greedy, on ``tasks`` through the agent loop, on the native env and
    through the adapter (the same tokens when the adapter is faithful). The machine is shared and its
    load drifts, so the two run alternately ``repeats`` times (native first, then adapter first, ...)
    after a warm-up; ``step_overhead`` is the median of the pairs' wall-time ratios, minus 1."""
    from horizonrl.agent.loop import Agent
    from horizonrl.config import load_config
    from horizonrl.engine.hf import HFEngine
    from horizonrl.engine.weights import sampler_model
    from horizonrl.models import context_length, load_model
    from horizonrl.rollout.runner import run_rollouts

    cfg = load_config(ROOT / recipe, overrides)
    policy, tokenizer = load_model(cfg.model)
    model = sampler_model(policy, cfg.engine.dtype)
    greedy = cfg.sampling.model_copy(update={"temperature": 0.0})

    def run(make: Callable[[], Env]) -> tuple[float, list[Any]]:
        engine = HFEngine(model, tokenizer, max_batch_size=cfg.engine.max_batch_size, seed=0)
        agent = Agent(tokenizer, engine, cfg.sampling, cfg.agent, context_length(model, cfg.model))
        start = time.perf_counter()
        trajs = asyncio.run(run_rollouts(agent, make, tasks, 1, len(tasks), sampling=greedy))
        return time.perf_counter() - start, trajs

    run(native)  # warm-up: the first batches pay for allocation
    pairs = []
    for repeat in range(repeats):
        order = (native, adapter) if repeat % 2 == 0 else (adapter, native)
        runs = {make: run(make) for make in order}
        pairs.append((runs[native], runs[adapter]))
    ratios = sorted(through_s / native_s for (native_s, _), (through_s, _) in pairs)
    (_, by_native), (_, through) = pairs[0]
    steps = sum(t.num_turns for t in through)
    same = sum(
        a.response_ids == b.response_ids and a.reward == b.reward and a.finish == b.finish
        for a, b in zip(by_native, through, strict=True)
    )
    native_s = min(n for (n, _), _ in pairs)
    return {
        "episodes": float(len(tasks)),
        "model_steps": float(steps),
        "mean_reward": sum(t.reward for t in through) / len(through),
        "same_trajectories": float(same),
        "native_model_s_min": native_s,
        "adapter_model_s_min": min(a for _, (a, _) in pairs),
        "model_step_ms": native_s / max(steps, 1) * 1000,
        "step_overhead": ratios[len(ratios) // 2] - 1,
    }


# ---------------------------------------------------------------- verifiers
class NativeNumberGuess(Env[EnvOptions]):
    """examples/verifiers_envs/numberguess.py written as a native env: the same prompt, parser,
    feedback and reward, with none of verifiers' machinery."""

    name = "native_numberguess"
    text_actions = True

    async def reset(self, task: Task) -> list[Message]:
        self.data, self.guesses, self.won = task.data, 0, False
        return [
            Message(role="system", content=self.data["system_prompt"]),
            Message(role="user", content=self.data["prompt"]),
        ]

    async def step(self, action: Action) -> StepResult:
        secret, most = self.data["secret"], self.data.get("max_guesses", 3)
        low, high = self.data.get("low", 1), self.data.get("high", 6)
        self.guesses += 1
        match = re.search(r"-?\d+", action.text.strip())
        guess = int(match.group()) if match else None
        if guess == secret or self.guesses == most:
            self.won = guess == secret
            return StepResult(reward=float(self.won), done=True)
        if guess is None:
            feedback = f"That is not a number. Reply with one whole number from {low} to {high}."
        else:
            feedback = f"{guess} is wrong: the number is {'higher' if guess < secret else 'lower'}."
        return StepResult(observations=[Message(role="user", content=feedback)])


@section("verifiers", needs="verifiers")
def verifiers(args: argparse.Namespace) -> dict[str, float]:
    """The verifiers number game (configs/verifiers_numberguess.yaml) against its native twin: the
    env alone under fixed replies (per-step microseconds), then the recipe's held-out episodes with
    the embedded model (:func:`model_runs`). ``env_step_share`` is the adapter's env-only step against
    a model step."""
    from horizonrl.config import load_config
    from horizonrl.envs.factory import env_factory, make_tasks

    recipe = "configs/verifiers_numberguess.yaml"
    cfg = load_config(ROOT / recipe, [])
    tasks = make_tasks(cfg.env, "test", 8 if args.quick else 16, 0)
    adapter = env_factory(cfg.env)

    def replies(task: Task) -> list[str]:
        return ["7", "0", str(task.data["secret"])]

    env_only(adapter, tasks, replies, 1, evaluate=True)  # verifiers' servers up, the file imported
    figures = {
        "native_env_step_us": env_only(NativeNumberGuess, tasks, replies, 3, evaluate=True),
        "adapter_env_step_us": env_only(adapter, tasks, replies, 3, evaluate=True),
    }
    figures |= model_runs(recipe, [], tasks, NativeNumberGuess, adapter, 2 if args.quick else 3)
    figures["env_step_share"] = figures["adapter_env_step_us"] / 1000 / figures["model_step_ms"]
    return figures


# ---------------------------------------------------------------- skyrl-gym
class NativeGsm8k(Env[EnvOptions]):
    """skyrl-gym's gsm8k written as a native env: the same prompt and the same scoring function
    (``skyrl_gym.envs.gsm8k.utils.compute_score``), with no skyrl-gym env object, registry or copies."""

    name = "native_gsm8k"
    text_actions = True

    async def reset(self, task: Task) -> list[Message]:
        self.truth = task.data["reward_spec"]["ground_truth"]
        return [Message(role=m["role"], content=m["content"]) for m in task.data["prompt"]]

    async def step(self, action: Action) -> StepResult:
        from skyrl_gym.envs.gsm8k.utils import compute_score

        return StepResult(reward=float(compute_score(action.text, self.truth)), done=True)


@section("skyrl_gym", needs="skyrl_gym")
def skyrl_gym(args: argparse.Namespace) -> dict[str, float]:
    """skyrl-gym's gsm8k (configs/skyrl_gym_gsm8k.yaml) against its native twin: the env alone under
    fixed replies (per-episode microseconds, on the event loop as the recipe runs it and in a worker
    thread, the adapter's default), then the recipe's held-out episodes with the embedded model
    (:func:`model_runs`)."""
    from horizonrl.config import load_config
    from horizonrl.envs.factory import env_factory, make_tasks

    recipe = "configs/skyrl_gym_gsm8k.yaml"
    cfg = load_config(ROOT / recipe, [])
    tasks = make_tasks(cfg.env, "test", 8 if args.quick else 32, 0)
    adapter = env_factory(cfg.env)
    threaded = env_factory(cfg.env.model_copy(update={"options": {**cfg.env.options, "in_thread": True}}))

    def replies(task: Task) -> list[str]:  # one reply per episode: the env is single-turn
        return [f"So:\n#### {task.data['reward_spec']['ground_truth']}"]

    rounds = 20 if args.quick else 100
    env_only(adapter, tasks, replies, 2, evaluate=True)  # skyrl-gym imported, the env classes made
    figures = {
        "native_env_episode_us": env_only(NativeGsm8k, tasks, replies, rounds, evaluate=True),
        "adapter_env_episode_us": env_only(adapter, tasks, replies, rounds, evaluate=True),
        "adapter_in_thread_env_episode_us": env_only(threaded, tasks, replies, rounds, evaluate=True),
    }
    return figures | model_runs(recipe, [], tasks, NativeGsm8k, adapter, 2 if args.quick else 3)


# ---------------------------------------------------------------- textarena and gymnasium
class BareTextArena(Env[EnvOptions]):
    """TextArena's GuessTheNumber-v0 driven straight through its own API (make, reset,
    get_observation, step, close) with none of the adapter's work: no seats, no opponents, no
    invalid-move reading, no random-stream isolation, no error mapping."""

    name = "bare_textarena"
    text_actions = True

    async def reset(self, task: Task) -> list[Message]:
        import textarena as ta

        self.game = ta.make("GuessTheNumber-v0")
        self.game.reset(num_players=1, seed=task.data["seed"])
        self.seen = self.game.get_observation()[1]
        return [Message(role="user", content=self.seen)]

    async def step(self, action: Action) -> StepResult:
        done, _ = self.game.step(action.text)
        if done:
            rewards, _ = self.game.close()
            return StepResult(reward=float(rewards[0]), done=True)
        text = self.game.get_observation()[1]
        new, self.seen = text[len(self.seen) :], text
        return StepResult(observations=[Message(role="user", content=new)])


@section("textarena", needs="textarena")
def textarena(args: argparse.Namespace) -> dict[str, float]:
    """TextArena's GuessTheNumber-v0 (configs/textarena_guessthenumber.yaml) through the adapter
    against the same game driven bare through TextArena's API: the env alone under fixed guesses
    (per-step microseconds), then held-out games with the embedded model (headline: wall time)."""
    from horizonrl.config import load_config
    from horizonrl.envs.factory import env_factory, make_tasks

    cfg = load_config(ROOT / "configs/textarena_guessthenumber.yaml", [])
    adapter = env_factory(cfg.env)
    tasks = make_tasks(cfg.env, "test", 8 if args.quick else 16, 0)
    guesses = ["[10]", "five", "[5]", "[15]", "[3]", "[12]", "[7]", "[18]", "[1]", "[20]", "[2]", "[8]"]
    rounds = 5 if args.quick else 20
    env_only(adapter, tasks, lambda _: guesses, 1)  # imports done, the game's seats found
    figures = {
        "native_env_step_us": env_only(BareTextArena, tasks, lambda _: guesses, rounds),
        "adapter_env_step_us": env_only(adapter, tasks, lambda _: guesses, rounds),
    }
    recipe = "configs/textarena_guessthenumber.yaml"
    return figures | model_runs(recipe, [], tasks, BareTextArena, adapter, 2 if args.quick else 3)


WALK_NAMES = ["left", "stay", "right"]


def walk_env_class() -> type:
    """A gymnasium text env (gymnasium ships none): walk to the target cell of 5."""
    import string

    import gymnasium as gym

    class Walk(gym.Env):
        metadata = {"render_modes": [], "action_names": WALK_NAMES}  # noqa: RUF012
        observation_space = gym.spaces.Text(max_length=200, charset=string.printable)
        action_space = gym.spaces.Discrete(3)

        def reset(self, *, seed=None, options=None):  # type: ignore[no-untyped-def]
            super().reset(seed=seed)
            self.pos, self.target, self.steps = int(self.np_random.integers(5)), 4, 0
            return f"you are at {self.pos}, the target is at {self.target}, cells 0-4.", {}

        def step(self, action):  # type: ignore[no-untyped-def]
            self.steps += 1
            self.pos = min(4, max(0, self.pos + int(action) - 1))
            hit = self.pos == self.target
            return (
                f"you are at {self.pos}, the target is at {self.target}, cells 0-4.",
                float(hit),
                hit,
                self.steps >= 6,
                {},
            )

    return Walk


class NativeWalk(Env[EnvOptions]):
    """The walk written as a native env: the same texts, the same reading of a reply (an index or a
    name; anything else is answered, not stepped), with no gymnasium env, wrappers or spaces."""

    name = "native_walk"
    text_actions = True
    ACTIONS = "exactly one action: 0 (left), 1 (stay), 2 (right) or its name"
    SYSTEM = f"Reply with {ACTIONS}; nothing else."

    async def reset(self, task: Task) -> list[Message]:
        import numpy as np

        rng = np.random.default_rng(task.data["seed"])
        self.pos, self.steps = int(rng.integers(5)), 0
        return [Message(role="system", content=self.SYSTEM), Message(role="user", content=self._obs())]

    def _obs(self) -> str:
        return f"you are at {self.pos}, the target is at 4, cells 0-4."

    async def step(self, action: Action) -> StepResult:
        text = action.text.strip()
        move = WALK_NAMES.index(text.lower()) if text.lower() in WALK_NAMES else None
        if move is None and text.lstrip("-").isdigit() and 0 <= int(text) < 3:
            move = int(text)
        if move is None:
            why = f"{text[:40]!r} is no action index or name"
            body = f"Invalid action: {why}. Reply with {self.ACTIONS}."
            return StepResult(observations=[Message(role="user", content=body)], malformed=why)
        self.steps += 1
        self.pos = min(4, max(0, self.pos + move - 1))
        hit = self.pos == 4
        return StepResult(
            observations=[Message(role="user", content=self._obs())],
            reward=float(hit),
            done=hit or self.steps >= 6,
        )


@section("gymnasium", needs="gymnasium")
def gymnasium(args: argparse.Namespace) -> dict[str, float]:
    """A gymnasium text env (a walk to a target cell, Discrete actions with names) through the
    adapter against the same walk written as a native env: the env alone under fixed replies
    (per-step microseconds), then episodes with the embedded model (headline: wall time)."""
    import gymnasium as gym

    from horizonrl.envs.config import EnvConfig
    from horizonrl.envs.factory import env_factory, make_tasks

    if "BenchWalk-v0" not in gym.registry:
        gym.register("BenchWalk-v0", entry_point=walk_env_class())
    env = EnvConfig(name="gymnasium:BenchWalk-v0")
    adapter = env_factory(env)
    tasks = make_tasks(env, "test", 8 if args.quick else 16, 0)
    replies = ["0", "go", "right", "2", "RIGHT", "2", "2", "2"]
    rounds = 20 if args.quick else 100
    env_only(adapter, tasks, lambda _: replies, 1)
    figures = {
        "native_env_step_us": env_only(NativeWalk, tasks, lambda _: replies, rounds),
        "adapter_env_step_us": env_only(adapter, tasks, lambda _: replies, rounds),
    }
    overrides = ["env.name=gymnasium:BenchWalk-v0", "env.options={}", "agent.max_turns=6"]
    recipe = "configs/textarena_guessthenumber.yaml"
    return figures | model_runs(recipe, overrides, tasks, NativeWalk, adapter, 2 if args.quick else 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer episodes (under a minute or two)")
    parser.add_argument("--only", choices=sorted(SECTIONS), action="append", help="run only this section")
    args = parser.parse_args()
    os.chdir(ROOT)  # recipes name their files relative to the repository
    for name in args.only or sorted(SECTIONS):
        needs, measure = SECTIONS[name]
        if importlib.util.find_spec(needs) is None:
            print(f"{name}_skipped=1  # {needs} is not installed")
            continue
        figures = measure(args)
        headline = figures.pop("step_overhead")
        for key, value in figures.items():
            print(f"{name}_{key}={value:.4g}")
        print(f"{name}_step_overhead={headline:.4f}")


if __name__ == "__main__":
    main()
