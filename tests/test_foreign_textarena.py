"""TextArena's games through the adapter (``env.name: textarena:<game id>``): the same fixed moves
through TextArena's own API and through the adapter give the same observations, rewards and done
flags, for a one-player and two two-player games, with the policy on either seat; the game's own
rules say which replies are invalid (malformed); the built-in opponent plays only moves the game
accepts; a game or an opponent that raises ends its episode ``error`` while the rollout goes on; bad
input on the CLI is one line (exit 2). Nothing is downloaded."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

ta = pytest.importorskip("textarena", reason="textarena is not installed: pip install 'horizonrl[textarena]'")

from horizonrl.agent.config import AgentConfig  # noqa: E402
from horizonrl.agent.loop import Agent  # noqa: E402
from horizonrl.engine.base import SamplingParams  # noqa: E402
from horizonrl.envs import foreign  # noqa: E402
from horizonrl.envs.config import EnvConfig  # noqa: E402
from horizonrl.envs.factory import env_factory, make_tasks  # noqa: E402
from horizonrl.envs.foreign import textarena as adapter  # noqa: E402
from horizonrl.envs.registry import get_env_class, make_env  # noqa: E402
from horizonrl.errors import ConfigError, HorizonError, UnknownEnvError  # noqa: E402
from horizonrl.rollout.runner import run_rollouts  # noqa: E402
from horizonrl.types import Action, Task, read_trajectories  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECIPE = "configs/textarena_guessthenumber.yaml"


def scripted_opponent(monkeypatch: pytest.MonkeyPatch, moves: list[str]) -> str:
    """A module ``ta_scripted:move`` that plays ``moves`` in order (the other seats' fixed moves)."""
    module = types.ModuleType("ta_scripted")
    queue = list(moves)
    module.move = lambda observation: queue.pop(0)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ta_scripted", module)
    return "ta_scripted:move"


def native(game: str, seats: int, seed: int, player: int, mine: list[str], theirs: list[str]):
    """TextArena's own loop: what the policy's seat sees before each of its moves, and after each
    move its reward (at the end, from close()) and whether the game was over before its next turn."""
    env = ta.make(game)
    env.reset(num_players=seats, seed=seed)
    mine, theirs = list(mine), list(theirs)
    seen, steps, done = [], [], False
    while not done:
        seat, observation = env.get_observation()
        if seat == player:
            seen.append(observation)
            done, _ = env.step(mine.pop(0))
            steps.append([0.0, done])
        else:
            done, _ = env.step(theirs.pop(0))
            if steps:
                steps[-1][1] = done
        if done:
            rewards, _ = env.close()
            steps[-1][0] = float(rewards[player])
    return seen, [tuple(s) for s in steps]


async def adapted(game: str, seed: int, player: int, mine: list[str], opponent: str):
    env = make_env(f"textarena:{game}", {"opponent": opponent})
    task = Task(id="t", env=f"textarena:{game}", data={"seed": seed, "player": player})
    text = (await env.reset(task))[0].content
    seen, steps, malformed = [text], [], []
    for move in mine:
        result = await env.step(Action(text=move))
        steps.append((result.reward, result.done))
        malformed.append(result.malformed)
        if result.done:
            break
        assert [m.role for m in result.observations] == ["user"]
        text += result.observations[0].content  # the step adds what the seat's observation gained
        seen.append(text)
    await env.close()
    return seen, steps, malformed, env.metrics


#: game -> (seats, seed, policy seat, policy moves, the other seat's moves, index of an invalid move)
CASES = {
    "guess": ("GuessTheNumber-v0", 1, 7, 0, None, [], 1),  # moves made from the game's number
    "tictactoe-first": ("TicTacToe-v0", 2, 3, 0, ["[4]", "[4]", "[0]", "[8]"], ["[1]", "[2]"], 1),
    "tictactoe-second": ("TicTacToe-v0", 2, 3, 1, ["[4]", "[2]", "[6]"], ["[0]", "[8]", "[1]"], None),
    "nim": ("Nim-v0", 2, 0, 1, ["[1 4]", "[0 9]", "[2 5]"], ["[0 2]", "[0 1]"], 1),
}


def target_number(seed: int) -> int:
    game = ta.make("GuessTheNumber-v0")
    game.reset(num_players=1, seed=seed)
    return int(game.state.game_state["game_number"])


@pytest.mark.parametrize("case", list(CASES))
def test_parity_with_textarenas_own_api(case, monkeypatch):
    game, seats, seed, player, mine, theirs, invalid = CASES[case]
    if mine is None:  # two wrong guesses around an unreadable one, then the number
        target = target_number(seed)
        wrong = [n for n in (10, 5, 15) if n != target][:2]
        mine = [f"[{wrong[0]}]", "ten", f"I guess [{wrong[1]}]", f"[{target}]"]
    want_seen, want_steps = native(game, seats, seed, player, mine, theirs)
    opponent = scripted_opponent(monkeypatch, theirs)
    seen, steps, malformed, metrics = asyncio.run(adapted(game, seed, player, mine, opponent))
    assert seen == want_seen
    assert steps == want_steps and steps[-1][1] is True, (steps, want_steps)
    assert [i for i, m in enumerate(malformed) if m] == ([] if invalid is None else [invalid])
    if invalid is not None:  # the game's own reason, and the game's own answer to it
        assert malformed[invalid].startswith(f"textarena {game}: ")
        assert "attempted an invalid move" in seen[invalid + 1][len(seen[invalid]) :]
    assert metrics["invalid_moves"] == float(invalid is not None)
    assert metrics["success"] == float(steps[-1][0] >= 1.0)


def test_random_opponent_plays_only_moves_the_game_accepts_and_is_seeded():
    cls = get_env_class("textarena:TicTacToe-v0")
    tasks = cls.make_tasks("train", 4, 0, cls.Options())
    assert [t.data["player"] for t in tasks] == [0, 1, 0, 1]  # the policy plays both seats
    assert {t.data["seed"] for t in tasks}.isdisjoint(
        t.data["seed"] for t in cls.make_tasks("test", 4, 0, cls.Options())
    )

    async def play(task: Task) -> list[str]:
        env = make_env("textarena:TicTacToe-v0", {})
        texts = [(await env.reset(task))[0].content]
        for cell in range(9):  # the policy tries every cell in order: some are taken
            result = await env.step(Action(text=f"[{cell}]"))
            if result.done:
                break
            texts.append(result.observations[0].content)
        assert "Player 1 attempted an invalid move" not in "".join(texts) or task.data["player"] == 1
        return texts

    for task in tasks:
        first = asyncio.run(play(task))
        assert asyncio.run(play(task)) == first  # the same seed, the same game
        other = 1 - task.data["player"]
        assert f"Player {other} attempted an invalid move" not in "".join(first)


def test_agent_passes_each_reply_unparsed_and_the_game_judges_it(tokenizer, scripted_engine):
    env = EnvConfig(name="textarena:GuessTheNumber-v0")
    task = make_tasks(env, "train", 1, 0)[0]
    target = target_number(task.data["seed"])
    call = '<tool_call>\n{"name": "guess", "arguments": {"n": 3}}\n</tool_call>'

    def run(replies: list[str], **config: int):
        agent = Agent(
            tokenizer, scripted_engine(replies), SamplingParams(max_new_tokens=40), AgentConfig(**config)
        )
        return asyncio.run(agent.run(env_factory(env)(), task, "t0", "g"))

    wrong = 1 if target != 1 else 2
    traj = run([call, f"My guess: [{wrong}]", f"[{target}]"])
    assert traj.finish == "finished" and traj.num_turns == 3
    assistant = [m.content for m in traj.messages if m.role == "assistant"]
    assert assistant[0] == call and all(m.tool_calls is None for m in traj.messages if m.role == "assistant")
    assert traj.turn_rewards == [0.0, 0.0, 1.0] and traj.reward == 1.0 and traj.success
    assert traj.metrics["malformed_turns"] == 1.0 and traj.metrics["invalid_moves"] == 1.0
    assert traj.env == "textarena:GuessTheNumber-v0"

    bad = run(["no idea", "still none", f"[{target}]"])  # the game allows one invalid move in a row
    assert bad.finish == "finished" and bad.num_turns == 2 and bad.reward == 0.0 and not bad.success
    assert bad.metrics["invalid_move"] == 1.0  # TextArena's own verdict: lost by an invalid move


RAISING = """
import textarena as ta


class Boom(ta.Env):
    def reset(self, num_players, seed=None):
        self.state = ta.SinglePlayerState(num_players=num_players, seed=seed, max_turns=3)
        self.state.reset(game_state={}, player_prompt_function=lambda player_id, game_state: "Say [go].")

    def step(self, action):
        if "boom" in action:
            raise ValueError("the board caught fire at " + action)
        self.state.set_outcome(reward=1, reason="went")
        return self.state.step()
"""


def test_game_or_opponent_that_raises_ends_error_and_the_rollout_goes_on(
    tmp_path, tokenizer, scripted_engine, monkeypatch
):
    (tmp_path / "boom_game.py").write_text(RAISING)
    monkeypatch.syspath_prepend(str(tmp_path))
    if "Boom-v0" not in ta.envs.registration.ENV_REGISTRY:
        ta.register("Boom-v0", entry_point="boom_game:Boom")
    env = EnvConfig(name="textarena:Boom-v0")
    tasks = make_tasks(env, "train", 3, 0)
    agent = Agent(
        tokenizer,
        scripted_engine(["[boom]", "[go]", "[go]"]),
        SamplingParams(max_new_tokens=8),
        AgentConfig(),
    )
    out = asyncio.run(run_rollouts(agent, env_factory(env), tasks, concurrency=1))
    by_finish = sorted(t.finish for t in out)
    assert by_finish == ["error", "finished", "finished"], [t.error for t in out]
    failed = next(t for t in out if t.finish == "error")
    assert failed.error.splitlines()[-1].endswith(
        "textarena game 'Boom-v0' raised in step: ValueError: the board caught fire at [boom]"
    )
    assert "raise ValueError" in failed.error  # the foreign traceback is kept above it

    def crash(observation: str) -> str:
        raise KeyError("no strategy")

    module = types.ModuleType("ta_crash")
    module.move = crash  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ta_crash", module)
    ttt = EnvConfig(name="textarena:TicTacToe-v0", options={"opponent": "ta_crash:move", "player": 0})
    agent = Agent(tokenizer, scripted_engine(["[4]"]), SamplingParams(max_new_tokens=8), AgentConfig())
    out = asyncio.run(run_rollouts(agent, env_factory(ttt), make_tasks(ttt, "train", 2, 0), concurrency=2))
    assert [t.finish for t in out] == ["error", "error"]
    assert (
        out[0]
        .error.splitlines()[-1]
        .endswith("the opponent 'ta_crash:move' (seat 1) raised: KeyError: 'no strategy'")
    )


def test_bad_names_options_and_missing_data_are_one_line(monkeypatch):
    with pytest.raises(
        UnknownEnvError, match=r"unknown textarena game 'TicTacTo-v0' \(did you mean textarena:TicTacToe-v0"
    ):
        get_env_class("textarena:TicTacTo-v0")
    cls = get_env_class("textarena:TicTacToe-v0")
    with pytest.raises(ConfigError, match=r"env.options.player: 2 is no seat .* \(valid: 0-1\)"):
        cls.make_tasks("train", 1, 0, cls.Options(player=2))
    with pytest.raises(ConfigError, match=r"env.options.opponent: cannot load 'nope:move'"):
        cls.make_tasks("train", 1, 0, cls.Options(opponent="nope:move"))
    with pytest.raises(ConfigError, match=r"num_players: .* cannot be played by 3 players"):
        cls.make_tasks("train", 1, 0, cls.Options(num_players=3))
    try:
        import nltk

        nltk.data.find("corpora/words")
    except LookupError:  # not on this machine: the game says what to supply instead of downloading it
        wordle = get_env_class("textarena:Wordle-v0")
        with pytest.raises(HorizonError, match=r"needs NLTK's 'words' data, and nothing is downloaded"):
            wordle.make_tasks("train", 1, 0, wordle.Options())
    foreign.foreign_env_class.cache_clear()
    monkeypatch.setattr(adapter, "IMPORT", "textarena_is_not_here")
    try:
        with pytest.raises(UnknownEnvError, match=r"pip install 'horizonrl\[textarena\]'"):
            get_env_class("textarena:TicTacToe-v0")
        assert "textarena" not in foreign.installed_frameworks()
    finally:
        foreign.foreign_env_class.cache_clear()


def horizon(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "horizonrl.cli", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_cli_lists_games_says_what_is_wrong_and_writes_schema_v1_records(tmp_path):
    from typer.testing import CliRunner

    from horizonrl.cli import app

    listed = CliRunner().invoke(app, ["envs"])
    assert listed.exit_code == 0, listed.output
    assert "textarena:TicTacToe-v0" in listed.output and "textarena:GuessTheNumber-v0" in listed.output
    unknown = horizon("rollout", RECIPE, "env.name=textarena:Guess-v0")  # a real process: exit 2, one line
    output = unknown.stdout + unknown.stderr
    assert unknown.returncode == 2 and "Traceback" not in output, output
    assert (
        "unknown textarena game 'Guess-v0' (did you mean textarena:GuessWho-v0, textarena:GuessTheNumber"
        in output
    )
    assert "textarena:TicTacToe-v0" in output and "horizon envs" in output

    out = tmp_path / "r.jsonl"
    overrides = ["model.path=tiny-random", "sampling.max_new_tokens=8", f"output_dir={tmp_path}"]
    args = ["rollout", RECIPE, "env.name=textarena:TicTacToe-v0", *overrides, "--n", "2", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    trajs = read_trajectories(out)
    assert len(trajs) == 2 and {t.env for t in trajs} == {"textarena:TicTacToe-v0"}
    for t in trajs:
        assert t.finish in ("finished", "turn_budget", "malformed", "loop"), t.error
        assert t.reward in (-1.0, 0.0, 1.0) and len(t.loss_mask) == len(t.response_ids) == len(t.logprobs)
        assert t.metrics["malformed_turns"] == t.metrics["invalid_moves"]
