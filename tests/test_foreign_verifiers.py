"""verifiers' envs through the adapter (``env.name: verifiers:<taskset>``): the same fixed replies
through verifiers' own episode runner (its ``null`` harness's chat program, a scripted model server)
and through the adapter give the same observations, rewards and done flags; the agent loop plays the
env's seat (text replies, tool calls on the env's own tool server); a verifiers env that raises ends
its episode ``error`` while the rollout goes on; a taskset that would download its data, bad rows and
bad ids are one line (exit 2 on the CLI). The envs and their data are made here or in
examples/verifiers_envs: nothing is downloaded."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

vf = pytest.importorskip(
    "verifiers.v1", reason="verifiers is not installed: pip install 'horizonrl[verifiers]' (docs/envs.md)"
)

from aiohttp import web  # noqa: E402  (verifiers' own dependency)

from horizonrl.agent.config import AgentConfig  # noqa: E402
from horizonrl.agent.loop import Agent  # noqa: E402
from horizonrl.engine.base import SamplingParams  # noqa: E402
from horizonrl.envs import foreign  # noqa: E402
from horizonrl.envs.config import EnvConfig  # noqa: E402
from horizonrl.envs.factory import env_factory, make_tasks  # noqa: E402
from horizonrl.envs.foreign import verifiers as adapter  # noqa: E402
from horizonrl.envs.registry import get_env_class  # noqa: E402
from horizonrl.errors import ConfigError, DataError, UnknownEnvError  # noqa: E402
from horizonrl.rollout.runner import run_rollouts  # noqa: E402
from horizonrl.types import Action, Task, read_trajectories  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ECHO = "verifiers:examples/verifiers_envs/wordecho.py"
GUESS = "verifiers:examples/verifiers_envs/numberguess.py"


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---------------------------------------------------------------- verifiers' own runner
@contextlib.asynccontextmanager
async def scripted_model(replies: list[str]) -> AsyncIterator[str]:
    """An OpenAI-compatible server on 127.0.0.1 whose n-th reply in a conversation is
    ``replies[n]`` (streamed as verifiers' chat program asks)."""

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        text = replies[sum(m["role"] == "assistant" for m in body["messages"])]
        head = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": body["model"]}
        if not body.get("stream"):
            message = {"role": "assistant", "content": text}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            return web.json_response({**head, "object": "chat.completion", "choices": [choice]})
        chunks = [
            {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": text}}]},
            {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            {**head, "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}},
        ]
        events = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return web.Response(body=events.encode(), content_type="text/event-stream")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1"
    finally:
        await runner.cleanup()


@pytest.fixture
def local_chat_program(monkeypatch):
    """verifiers' null harness runs its chat program with this interpreter instead of through uv
    (which would download the program's dependencies): nothing else of verifiers changes."""
    from verifiers.v1.runtimes.base import Runtime

    async def prepare(self, script, env=None, *, activate=True):
        name = f"vf-chat-{uuid.uuid4().hex}.py"
        await self.write(name, script.encode() if isinstance(script, str) else script)
        return [sys.executable, str(self.workdir / name)]

    monkeypatch.setattr(Runtime, "prepare_uv_script", prepare)


def verifiers_own_episode(spec: str, seat: str, task: Task, replies: list[str]) -> tuple[list, list, float]:
    """The episode as verifiers runs it by itself: (the initial messages, [(observations, done)] per
    reply, the trace's reward)."""
    vf_id = get_env_class(spec).taskset_id

    async def run() -> vf.Episode:
        async with scripted_model(replies) as url:
            seat_config = {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}}
            config = vf.resolve_env_config({"taskset": {"id": vf_id}, seat: seat_config})
            env = vf.load_environment(config)
            task_type = type(env.taskset).task_type()
            vf_task = task_type(task_type.data_type().model_validate(task.data), env.taskset.config.task)
            client = vf.EvalClientConfig(base_url=url, api_key_var="HORIZONRL_TEST_NO_KEY")
            async with env.serving():
                return await env.run_episode(vf_task, vf.ModelContext(model="scripted", client=client))

    episode = asyncio.run(run())
    assert episode.ok, episode.errors
    messages = [(m.role, vf.types.content_text(m.content)) for m in episode.traces[0].messages]
    turns = [i for i, (role, _) in enumerate(messages) if role == "assistant"]
    steps = [(messages[i + 1 : j], False) for i, j in zip(turns, [*turns[1:], len(messages)], strict=True)]
    steps[-1] = (steps[-1][0], True)
    return messages[: turns[0]], steps, episode.traces[0].reward


def adapter_episode(spec: str, task: Task, replies: list[str]) -> tuple[list, list, float, dict]:
    cls = get_env_class(spec)

    async def run() -> tuple[list, list, float, dict]:
        env = cls(cls.Options())
        try:
            initial = [(m.role, m.content) for m in await env.reset(task)]
            steps = []
            for reply in replies:
                result = await env.step(Action(text=reply))
                steps.append(([(m.role, m.content) for m in result.observations], result.done))
                if result.done:
                    break
            return initial, steps, await env.evaluate(), env.metrics
        finally:
            await env.close()

    return asyncio.run(run())


@pytest.mark.parametrize(
    ("spec", "seat", "row", "replies", "reward"),
    [
        (ECHO, "agent", {"prompt": "Say the word: apple", "answer": "apple"}, ["Apple."], 1.0),
        (ECHO, "agent", {"prompt": "Say the word: river", "answer": "river"}, ["lake"], 0.0),
        (GUESS, "player", {"prompt": "Guess 1 to 6.", "secret": 5}, ["1", "I say 6", "5"], 1.0),
    ],
    ids=["echo-right", "echo-wrong", "guess-three-turns"],
)
def test_parity_with_verifiers_own_episode_runner(
    spec, seat, row, replies, reward, tmp_path, local_chat_program
):
    task = get_env_class(spec).read_tasks(
        write_rows(tmp_path / "rows.jsonl", [row]), get_env_class(spec).Options()
    )[0]
    own_initial, own_steps, own_reward = verifiers_own_episode(spec, seat, task, replies)
    initial, steps, got_reward, metrics = adapter_episode(spec, task, replies)
    assert initial == own_initial and initial[-1] == ("user", row["prompt"])
    assert steps == own_steps and [done for _, done in steps] == [False] * (len(replies) - 1) + [True]
    assert got_reward == own_reward == reward
    assert metrics["vf_turns"] == len(replies)
    if spec == GUESS:
        assert steps[0][0] == [("user", "1 is wrong: the number is higher.")]
        assert metrics["vf_reward_won"] == 1.0 and metrics["vf_guesses"] == 3.0


# ---------------------------------------------------------------- the agent loop plays the seat
def test_agent_loop_plays_the_seat_and_a_short_budget_is_scored_as_a_limit(tokenizer, scripted_engine):
    env = EnvConfig(name=GUESS, tasks_file=ROOT / "configs/data/verifiers_numberguess.jsonl")
    task = next(t for t in make_tasks(env, "test", 16, 0) if t.data["secret"] == 2)

    def run(replies: list[str], **config: int):
        agent = Agent(
            tokenizer, scripted_engine(replies), SamplingParams(max_new_tokens=12), AgentConfig(**config)
        )
        return asyncio.run(agent.run(env_factory(env)(), task, "t0", "g"))

    won = run(["4", "1", "2"])
    assert won.finish == "finished" and won.num_turns == 3 and won.reward == 1.0
    assert [m.content for m in won.messages if m.role == "user"][1:] == [
        "4 is wrong: the number is lower.",
        "1 is wrong: the number is higher.",
    ]
    assert all(m.tool_calls is None for m in won.messages if m.role == "assistant")  # text, unparsed
    assert won.metrics["vf_reward_won"] == 1.0 and won.metrics["vf_stop:user_closed"] == 1.0
    assert "malformed_turns" not in won.metrics or won.metrics["malformed_turns"] == 0.0
    assert len(won.loss_mask) == len(won.response_ids) == len(won.logprobs)

    cut = run(["4", "1", "2"], max_turns=2)  # the loop's budget ends the game: verifiers scores it
    assert cut.finish == "turn_budget" and cut.num_turns == 2 and cut.reward == 0.0
    assert cut.metrics[f"vf_stop:{adapter.STOP_REASON}"] == 1.0 and cut.metrics["vf_turns"] == 2.0


TOOL_PACKAGE = {
    "__init__.py": """
import verifiers.v1 as vf

from vf_add_tool.tool import AddToolset


class AddData(vf.TaskData):
    total: int


class AddTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class AddTask(vf.Task[AddData, vf.State, AddTaskConfig]):
    @classmethod
    def toolsets(cls, config):
        return [AddToolset(config.tools)]

    @vf.reward
    async def correct(self, trace: vf.Trace) -> float:
        return float(str(self.data.total) in trace.last_reply)


class AddTasksetConfig(vf.TasksetConfig):
    task: AddTaskConfig = AddTaskConfig()


class AddTaskset(vf.Taskset[AddTask, AddTasksetConfig]):
    def load(self):
        yield AddTask(AddData(prompt="What is 17 + 25? Use the add tool.", total=42), self.config.task)


__all__ = ["AddTaskset"]
""",
    "tool.py": '''
import verifiers.v1 as vf


class AddToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = None

    @vf.tool
    def add(self, a: int, b: int) -> str:
        """Add two whole numbers."""
        return str(a + b)


if __name__ == "__main__":
    AddToolset.run()
''',
}


def test_tool_calls_run_on_the_envs_own_tool_server(tmp_path, monkeypatch, tokenizer, scripted_engine):
    package = tmp_path / "vf_add_tool"
    package.mkdir()
    for name, text in TOOL_PACKAGE.items():
        (package / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    monkeypatch.setenv("PYTHONPATH", path)  # the env's tool server runs as `python -m vf_add_tool.tool`
    env = EnvConfig(name="verifiers:vf_add_tool")
    assert not get_env_class(env.name).text_actions  # an env with tools: the model's calls are parsed
    task = make_tasks(env, "train", 1, 0)[0]
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 17, "b": 25}}\n</tool_call>'
    agent = Agent(
        tokenizer, scripted_engine([call, "It is 42."]), SamplingParams(max_new_tokens=40), AgentConfig()
    )
    traj = asyncio.run(agent.run(env_factory(env)(), task, "t0", "g"))
    assert traj.finish == "finished" and traj.num_turns == 2 and traj.reward == 1.0, traj.error
    tool = next(m for m in traj.messages if m.role == "tool")
    assert tool.content == "42" and tool.name == "add"
    first = next(m for m in traj.messages if m.role == "assistant")
    assert first.content == call and first.tool_calls[0].arguments == {"a": 17, "b": 25}


# ---------------------------------------------------------------- failures and bad input
BROKEN = """
import urllib.request

import verifiers.v1 as vf


class BrokenData(vf.TaskData):
    mode: str = "ok"


class BrokenTask(vf.Task[BrokenData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def points(self, trace: vf.Trace) -> float:
        if self.data.mode == "reward":
            raise ValueError("the scorer crashed")
        return 1.0


class BrokenTaskset(vf.Taskset[BrokenTask, vf.TasksetConfig]):
    def load(self):
        urllib.request.urlopen("https://huggingface.co/datasets/someone/broken/data.jsonl", timeout=5)
        yield BrokenTask(BrokenData(prompt="hi"), self.config.task)


class BrokenEnvConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig()


class BrokenEnv(vf.Env[BrokenEnvConfig]):
    async def run(self, task, agents):
        if task.data.mode == "start":
            raise RuntimeError("the board did not load")
        async with agents.agent.interaction(task) as interaction:
            await interaction.turn()
            if task.data.mode == "run":
                raise KeyError("no such board")
            await interaction.turn("once more")


__all__ = ["BrokenEnv", "BrokenTaskset"]
"""


@pytest.fixture
def broken_env(tmp_path, monkeypatch) -> str:
    (tmp_path / "vf_broken_env.py").write_text(BROKEN)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "verifiers:vf_broken_env"


def test_foreign_env_that_raises_ends_error_and_the_rollout_goes_on(
    broken_env, tmp_path, tokenizer, scripted_engine
):
    modes = ("run", "ok", "reward", "start", "ok")
    rows = write_rows(tmp_path / "rows.jsonl", [{"prompt": "hi", "mode": m} for m in modes])
    env = EnvConfig(name=broken_env, tasks_file=rows)
    tasks = make_tasks(env, "train", 5, 0)
    agent = Agent(tokenizer, scripted_engine(["hello"]), SamplingParams(max_new_tokens=8), AgentConfig())
    result = {t.task_id: t for t in asyncio.run(run_rollouts(agent, env_factory(env), tasks, concurrency=2))}
    in_step, scorer, in_reset = result["rows-1"], result["rows-3"], result["rows-4"]
    assert in_step.finish == scorer.finish == in_reset.finish == "error"
    assert in_step.error.splitlines()[-1].endswith(
        f"verifiers env '{broken_env}' failed: EnvError: BrokenEnv.run(): KeyError: 'no such board'"
    )
    assert scorer.error.splitlines()[-1].endswith(
        "TaskError: task BrokenTask scoring: ValueError: the scorer crashed"
    )
    assert in_reset.error.splitlines()[-1].endswith(
        "ended before the policy's first turn: EnvError: BrokenEnv.run(): "
        "RuntimeError: the board did not load"
    )
    for ok in (result["rows-2"], result["rows-5"]):
        assert ok.finish == "finished" and ok.num_turns == 2 and ok.reward == 1.0


def test_a_download_bad_rows_and_bad_options_are_one_line(broken_env, tmp_path):
    cls = get_env_class(broken_env)
    options = cls.Options()
    with pytest.raises(DataError) as download:
        cls.make_tasks("train", 1, 0, options)
    message = str(download.value)
    assert "loads its data from the network (it asked for huggingface.co)" in message
    assert (
        "env.tasks_file=ROWS.jsonl" in message
        and "fields of BrokenData: id, name, prompt, system_prompt, mode" in message
    )
    with pytest.raises(
        DataError, match=r"rows.jsonl:2: mode: Input should be a valid string; one JSON object"
    ):
        cls.read_tasks(
            write_rows(tmp_path / "rows.jsonl", [{"prompt": "a"}, {"prompt": "b", "mode": 3}]), options
        )
    (tmp_path / "rows.jsonl").write_text("{not json\n")
    with pytest.raises(DataError, match=r"rows.jsonl:1: not JSON"):
        cls.read_tasks(tmp_path / "rows.jsonl", options)
    with pytest.raises(ConfigError, match=r"env.options.seat='judge': the env's seats are agent"):
        cls.config(cls.Options(seat="judge"))
    with pytest.raises(ConfigError, match=r"env.options.config: taskset.*no_such_field"):
        cls.config(cls.Options(taskset={"no_such_field": 1}))


def test_rows_from_parquet_are_the_same_tasks(tmp_path):
    pytest.importorskip("pyarrow", reason="reading Parquet needs pyarrow")
    import pandas as pd

    source = ROOT / "configs/data/verifiers_numberguess.jsonl"
    rows = [json.loads(line) for line in source.read_text().splitlines()[:5]]
    pd.DataFrame(rows).to_parquet(tmp_path / "guess.parquet")
    cls = get_env_class(GUESS)
    from_parquet = cls.read_tasks(tmp_path / "guess.parquet", cls.Options())
    from_jsonl = cls.read_tasks(write_rows(tmp_path / "guess.jsonl", rows), cls.Options())
    assert [t.data for t in from_parquet] == [t.data for t in from_jsonl]
    assert [t.id for t in from_jsonl] == [r["id"] for r in rows] and {t.split for t in from_jsonl} == {
        "train"
    }
    assert from_jsonl[0].data["secret"] == rows[0]["secret"] and "split" not in from_jsonl[0].data


def test_unknown_ids_and_a_missing_framework_name_the_fix(monkeypatch):
    with pytest.raises(
        UnknownEnvError, match=r"unknown verifiers env 'no_such_taskset'.*built-in taskset \(harbor"
    ):
        get_env_class("verifiers:no_such_taskset")
    with pytest.raises(UnknownEnvError, match=r"unknown verifiers env 'zzz' in 'zzz\+"):
        get_env_class("verifiers:zzz+examples/verifiers_envs/wordecho.py")
    assert "textarena" in adapter.env_ids()
    foreign.foreign_env_class.cache_clear()
    monkeypatch.setattr(adapter, "IMPORT", "verifiers_is_not_here")
    try:
        with pytest.raises(UnknownEnvError, match=r"pip install 'horizonrl\[verifiers\]'"):
            get_env_class(ECHO)
        assert "verifiers" not in foreign.installed_frameworks()
    finally:
        foreign.foreign_env_class.cache_clear()


# ---------------------------------------------------------------- the command line
def horizon(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "horizonrl.cli", *args],
        cwd=ROOT,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_cli_rollout_writes_schema_v1_records_and_a_download_is_one_line(tmp_path):
    out = tmp_path / "r.jsonl"
    recipe = "configs/verifiers_numberguess.yaml"
    proc = horizon(
        "rollout", recipe, "model.path=tiny-random", f"output_dir={tmp_path}", "--n", "2", "--out", str(out)
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    trajs = read_trajectories(out)
    assert len(trajs) == 2 and {t.env for t in trajs} == {GUESS}
    for t in trajs:
        assert t.finish in ("finished", "turn_budget", "loop") and 1 <= t.num_turns <= 3, t.error
        assert t.reward in (0.0, 1.0) and t.metrics["vf_reward_won"] == t.reward
        assert len(t.loss_mask) == len(t.response_ids) == len(t.logprobs)
    (tmp_path / "vf_download.py").write_text(BROKEN)  # a taskset whose load() downloads its rows
    bad = horizon(
        "rollout", recipe, f"env.name=verifiers:{tmp_path / 'vf_download.py'}", "env.tasks_file=null"
    )
    output = bad.stdout + bad.stderr
    assert bad.returncode == 2 and "Traceback" not in output, output
    assert "loads its data from the network (it asked for huggingface.co)" in " ".join(output.split())
