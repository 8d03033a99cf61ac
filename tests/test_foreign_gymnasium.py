"""gymnasium's text envs through the adapter (``env.name: gymnasium:<id>``): the same fixed actions
through gymnasium's own API and through the adapter give the same observations, rewards and done
flags (a Discrete env whose actions have names, and a Text one); a reply the action space does not
contain is malformed and not stepped; an env that raises ends its episode ``error`` while the rollout
goes on; an env that is not text in, text out, an unknown id or a missing framework is one line
(exit 2 on the CLI). The envs are written here (gymnasium ships none with text observations)."""

from __future__ import annotations

import asyncio
import importlib
import os
import string
import subprocess
import sys
from pathlib import Path

import pytest

gym = pytest.importorskip(
    "gymnasium", reason="gymnasium is not installed: pip install 'horizonrl[gymnasium]'"
)

from horizonrl.agent.config import AgentConfig  # noqa: E402
from horizonrl.agent.loop import Agent  # noqa: E402
from horizonrl.engine.base import SamplingParams  # noqa: E402
from horizonrl.envs import foreign  # noqa: E402
from horizonrl.envs.config import EnvConfig  # noqa: E402
from horizonrl.envs.factory import env_factory, make_tasks  # noqa: E402
from horizonrl.envs.foreign import gymnasium as adapter  # noqa: E402
from horizonrl.envs.registry import get_env_class, make_env  # noqa: E402
from horizonrl.errors import UnknownEnvError  # noqa: E402
from horizonrl.rollout.runner import run_rollouts  # noqa: E402
from horizonrl.types import Action, Task, read_trajectories  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODULE = "hz_textgym"
TEXT_ENVS = f'''
"""Two tiny text envs, registered with gymnasium when imported."""
import gymnasium as gym
from gymnasium import spaces

CHARSET = {string.printable!r}


class WalkEnv(gym.Env):
    """Walk to the target cell: text observations, Discrete actions named left/stay/right."""

    metadata = {{"render_modes": [], "action_names": ["left", "stay", "right"]}}

    def __init__(self, size=5, max_steps=6):
        self.size, self.max_steps = size, max_steps
        self.observation_space = spaces.Text(max_length=200, charset=CHARSET)
        self.action_space = spaces.Discrete(3)

    def _obs(self):
        return f"you are at {{self.pos}}, the target is at {{self.target}}, cells 0-{{self.size - 1}}."

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = int(self.np_random.integers(self.size))
        self.target = int((options or {{}}).get("target", self.np_random.integers(self.size)))
        self.steps = 0
        return self._obs(), {{"start": self.pos}}

    def step(self, action):
        self.steps += 1
        self.pos = min(self.size - 1, max(0, self.pos + int(action) - 1))
        hit = self.pos == self.target
        return self._obs(), float(hit), hit, self.steps >= self.max_steps, {{"is_success": hit}}


class EchoEnv(gym.Env):
    """Say the word back (a Text action space); the word 'boom' makes step raise."""

    metadata = {{"render_modes": []}}

    def __init__(self):
        self.observation_space = spaces.Text(max_length=100, charset=CHARSET)
        self.action_space = spaces.Text(max_length=12)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.word = ["apple", "river", "stone"][int(self.np_random.integers(3))]
        return f"say {{self.word}}", {{}}

    def step(self, action):
        if action == "boom":
            raise RuntimeError("the echo chamber collapsed")
        return ("yes" if action == self.word else "no"), float(action == self.word), True, False, {{}}


gym.register("TextWalk-v0", entry_point=WalkEnv)
gym.register("TextEcho-v0", entry_point=EchoEnv)
'''


@pytest.fixture(scope="module")
def envs_dir(tmp_path_factory) -> Path:
    """The envs' module on sys.path (and on PYTHONPATH for a CLI subprocess)."""
    folder = tmp_path_factory.mktemp("gymenvs")
    (folder / f"{MODULE}.py").write_text(TEXT_ENVS)
    sys.path.insert(0, str(folder))
    importlib.import_module(MODULE)
    yield folder
    sys.path.remove(str(folder))


def native(env_id: str, seed: int, actions: list) -> tuple[str, list]:
    env = gym.make(env_id)
    first, _ = env.reset(seed=seed)
    steps = []
    for action in actions:
        obs, reward, terminated, truncated, _ = env.step(action)
        steps.append((obs, float(reward), bool(terminated or truncated)))
        if terminated or truncated:
            break
    env.close()
    return first, steps


async def adapted(spec: str, seed: int, replies: list[str]) -> tuple[list, list, list, dict]:
    env = make_env(spec, {})
    messages = await env.reset(Task(id="t", env=spec, data={"seed": seed}))
    steps, malformed = [], []
    for reply in replies:
        result = await env.step(Action(text=reply))
        malformed.append(result.malformed)
        if result.malformed is None:
            steps.append((result.observations[0].content, result.reward, result.done))
        if result.done:
            break
    await env.close()
    return messages, steps, malformed, env.metrics


def test_parity_with_gymnasiums_own_api(envs_dir):
    walk = get_env_class(f"gymnasium:{MODULE}:TextWalk-v0")
    replies = ["2", "go north", " left\n", "RIGHT", "1", "0", "2", "2", "2"]
    actions = [2, 0, 2, 1, 0, 2, 2, 2]  # what each readable reply names
    for task in walk.make_tasks("train", 20, 0, walk.Options()):  # a game that lasts a few steps
        seed = task.data["seed"]
        want_first, want_steps = native("TextWalk-v0", seed, actions)
        if len(want_steps) >= 3:
            break
    messages, steps, malformed, metrics = asyncio.run(
        adapted(f"gymnasium:{MODULE}:TextWalk-v0", seed, replies)
    )
    assert [m.role for m in messages] == ["system", "user"] and messages[1].content == want_first
    assert "0 (left), 1 (stay), 2 (right)" in messages[0].content
    assert steps == want_steps and steps[-1][2] is True
    assert malformed[1] == "gymnasium TextWalk-v0: 'go north' is no action index or name"
    assert [m for i, m in enumerate(malformed) if i != 1] == [None] * (len(malformed) - 1)
    assert metrics["invalid_actions"] == 1.0 and metrics["success"] == float(steps[-1][1] == 1.0)

    for seed in (0, 1, 2):  # a Text action space: contains() says what a reply may be
        want_first, want_steps = native("TextEcho-v0", seed, ["river"])
        messages, steps, malformed, _ = asyncio.run(
            adapted(f"gymnasium:{MODULE}:TextEcho-v0", seed, ["two words", "river"])
        )
        assert messages[1].content == want_first and steps == want_steps
        assert malformed == ["gymnasium TextEcho-v0: not in the Text action space", None]


def test_an_env_file_runs_as_it_is_with_parity(tmp_path):
    """``gymnasium:<file.py>:<id>`` imports the file (the shipped example, written for gymnasium
    alone) and plays it as gymnasium's own API does; a missing file is one line."""
    spec = f"gymnasium:{ROOT}/examples/gymnasium_envs/cellwalk.py:CellWalk-v0"
    walk = get_env_class(spec)
    seed = walk.make_tasks("test", 1, 0, walk.Options())[0].data["seed"]
    want_first, want_steps = native("CellWalk-v0", seed, [2, 2, 0])
    messages, steps, malformed, _ = asyncio.run(adapted(spec, seed, ["right", "2", "left"]))
    assert messages[1].content == want_first and steps == want_steps[: len(steps)] and steps
    assert malformed == [None] * len(malformed)
    with pytest.raises(UnknownEnvError, match=r"does not import \(FileNotFoundError: no such file"):
        get_env_class(f"gymnasium:{tmp_path}/nowhere.py:CellWalk-v0")


def test_constrained_turns_hold_a_discrete_env_to_its_action_names(envs_dir, tokenizer, scripted_engine):
    """With agent.constrain set, a Discrete env's turns are held to its action names (a Text env's
    replies stay free); without it nothing is constrained."""
    walk, echo = (
        make_env(f"gymnasium:{MODULE}:TextWalk-v0", {}),
        make_env(f"gymnasium:{MODULE}:TextEcho-v0", {}),
    )
    assert walk.reply_choices() is None  # before reset: no action space yet
    asyncio.run(walk.reset(Task(id="w", env="w", data={"seed": 0})))
    asyncio.run(echo.reset(Task(id="e", env="e", data={"seed": 0})))
    assert walk.reply_choices() == ("left", "stay", "right") and echo.reply_choices() is None
    constrained = Agent(tokenizer, scripted_engine([]), SamplingParams(), AgentConfig(constrain="tool_calls"))
    held = constrained.constraint(walk)
    assert held is not None and held.choice == ("left", "stay", "right")
    assert constrained.constraint(echo) is None
    free = Agent(tokenizer, scripted_engine([]), SamplingParams(), AgentConfig())
    assert free.constraint(walk) is None


def test_agent_passes_each_reply_unparsed_and_the_action_space_judges_it(
    envs_dir, tokenizer, scripted_engine
):
    env = EnvConfig(name=f"gymnasium:{MODULE}:TextWalk-v0", options={"reset_options": {"target": 4}})
    task = Task(id="w", env=env.name, data={"seed": 0})
    call = '<tool_call>\n{"name": "move", "arguments": {"d": 2}}\n</tool_call>'

    def run(replies: list[str], **config: int):
        agent = Agent(
            tokenizer, scripted_engine(replies), SamplingParams(max_new_tokens=40), AgentConfig(**config)
        )
        return asyncio.run(agent.run(env_factory(env)(), task, "t0", "g"))

    traj = run([call] + ["right"] * 5 + ["stay"])
    assistant = [m for m in traj.messages if m.role == "assistant"]
    assert assistant[0].content == call and all(m.tool_calls is None for m in assistant)
    assert traj.metrics["malformed_turns"] == 1.0 and traj.finish == "finished" and traj.reward == 1.0
    assert traj.success and traj.turn_rewards[0] == 0.0

    bad = run(["up", "down", "right"], max_malformed=2)
    assert bad.finish == "malformed" and bad.num_turns == 2


def test_env_that_raises_ends_error_and_the_rollout_goes_on(envs_dir, tokenizer, scripted_engine):
    env = EnvConfig(name=f"gymnasium:{MODULE}:TextEcho-v0")
    tasks = make_tasks(env, "train", 3, 0)
    agent = Agent(
        tokenizer,
        scripted_engine(["boom", "apple", "river"]),
        SamplingParams(max_new_tokens=8),
        AgentConfig(),
    )
    out = asyncio.run(run_rollouts(agent, env_factory(env), tasks, concurrency=1))
    assert sorted(t.finish for t in out) == ["error", "finished", "finished"], [t.error for t in out]
    failed = next(t for t in out if t.finish == "error")
    assert failed.error.splitlines()[-1].endswith(
        "gymnasium env 'TextEcho-v0' raised in step: RuntimeError: the echo chamber collapsed"
    )


def test_envs_that_are_not_text_unknown_ids_and_a_missing_framework_are_one_line(envs_dir, monkeypatch):
    with pytest.raises(UnknownEnvError, match=r"'CartPole-v1' observes Box\(.*not text: only envs whose"):
        get_env_class("gymnasium:CartPole-v1")
    with pytest.raises(
        UnknownEnvError, match=r"unknown gymnasium env 'Walk-v0'; valid: .*gymnasium:TextWalk-v0"
    ):
        get_env_class("gymnasium:Walk-v0")
    with pytest.raises(UnknownEnvError, match=r"module 'no_such_mod' does not import"):
        get_env_class("gymnasium:no_such_mod:X-v0")
    assert "TextWalk-v0" in adapter.env_ids() and "CartPole-v1" not in adapter.env_ids()
    foreign.foreign_env_class.cache_clear()
    monkeypatch.setattr(adapter, "IMPORT", "gymnasium_is_not_here")
    try:
        with pytest.raises(UnknownEnvError, match=r"pip install 'horizonrl\[gymnasium\]'"):
            get_env_class("gymnasium:TextWalk-v0")
    finally:
        foreign.foreign_env_class.cache_clear()


def test_cli_says_what_is_wrong_and_writes_schema_v1_records(envs_dir, tmp_path):
    from typer.testing import CliRunner

    from horizonrl.cli import app

    recipe = "configs/textarena_guessthenumber.yaml"  # a short recipe; the env is overridden
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "horizonrl.cli",
            "rollout",
            recipe,
            "env.name=gymnasium:CartPole-v1",
            "env.options={}",
        ],
        cwd=ROOT,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in output, output
    assert "gymnasium env 'CartPole-v1' observes Box(" in output and len(output.strip().splitlines()) == 1

    out = tmp_path / "r.jsonl"
    env = [f"env.name=gymnasium:{MODULE}:TextWalk-v0", "env.options={}", "agent.max_turns=4"]
    overrides = ["model.path=tiny-random", "sampling.max_new_tokens=6", f"output_dir={tmp_path}"]
    result = CliRunner().invoke(app, ["rollout", recipe, *env, *overrides, "--n", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    trajs = read_trajectories(out)
    assert len(trajs) == 2 and {t.env for t in trajs} == {f"gymnasium:{MODULE}:TextWalk-v0"}
    for t in trajs:
        assert t.finish in ("finished", "turn_budget", "malformed", "loop"), t.error
        assert len(t.loss_mask) == len(t.response_ids) == len(t.logprobs)
        assert t.metrics["malformed_turns"] == t.metrics.get("invalid_actions", 0.0)
