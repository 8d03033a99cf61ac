"""skyrl-gym's envs through the adapter (``env.name: skyrl_gym:<env id>``): the same fixed replies
through skyrl-gym's own API and through the adapter give the same observations, rewards and done
flags; the agent loop hands a text-action env every reply unparsed and lets the env's parser say
which were unreadable; a foreign env that raises ends its episode ``error`` while the rollout goes
on; bad input on the CLI is one line (exit 2). Tasks, databases and a retrieval server are made here:
nothing is downloaded."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

skyrl_gym = pytest.importorskip(
    "skyrl_gym", reason="skyrl-gym is not installed: pip install 'horizonrl[skyrl-gym]'"
)

from omegaconf import OmegaConf  # noqa: E402  (skyrl-gym's own dependency)

from horizonrl.agent.config import AgentConfig  # noqa: E402
from horizonrl.agent.loop import Agent  # noqa: E402
from horizonrl.engine.base import SamplingParams  # noqa: E402
from horizonrl.envs import foreign  # noqa: E402
from horizonrl.envs.config import EnvConfig  # noqa: E402
from horizonrl.envs.factory import env_factory, make_tasks  # noqa: E402
from horizonrl.envs.foreign import skyrl_gym as adapter  # noqa: E402
from horizonrl.envs.registry import get_env_class, make_env  # noqa: E402
from horizonrl.errors import DataError, HorizonError, UnknownEnvError  # noqa: E402
from horizonrl.rollout.runner import run_rollouts  # noqa: E402
from horizonrl.types import Action, read_trajectories  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROMPT = [{"role": "system", "content": "Answer."}, {"role": "user", "content": "What is 2 + 3?"}]


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def retrieval_url() -> Iterator[str]:
    """A retrieval server on 127.0.0.1 answering as skyrl-gym's search tool expects."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            query = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["query"]
            doc = {"document": {"contents": f"About {query}: Paris is the capital of France."}, "score": 1.0}
            body = json.dumps({"result": [[doc]]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/retrieve"
    server.shutdown()
    server.server_close()


def sql_db(root: Path) -> Path:
    """spider's layout under ``root``: spider/database/toy/toy.sqlite."""
    db = root / "spider" / "database" / "toy"
    db.mkdir(parents=True)
    con = sqlite3.connect(db / "toy.sqlite")
    con.execute("create table t (name text, x int)")
    con.executemany("insert into t values (?, ?)", [("a", 1), ("b", 2)])
    con.commit()
    con.close()
    return root


def lcb_tests() -> str:
    return json.dumps([{"input": "2 3\n", "output": "5\n", "testtype": "stdin"}])


#: env id -> (row less prompt, env_config or a marker, fixed replies)
CASES = {
    "gsm8k": ({"reward_spec": {"ground_truth": "5"}}, {}, ["2 + 3 = 5\n#### 5"]),
    "gsm8k_multi_turn": (
        {"reward_spec": {"ground_truth": "5"}, "extra_info": {"max_turns": 4}},
        {},
        ["#### 4", "let me think", '<tool_call>{"name": "x"}</tool_call>', "#### 5"],
    ),
    "aime": ({"reward_model": {"ground_truth": "42"}}, {}, ["The product is 6 * 7. Answer: 41"]),
    "lcb": (
        {"reward_spec": {"ground_truth": lcb_tests()}},
        {},
        ["```python\na, b = map(int, input().split())\nprint(a + b)\n```"],
    ),
    "text2sql": (
        {"db_id": "toy", "data": "spider", "reward_spec": {"ground_truth": "SELECT name FROM t WHERE x = 1"}},
        "sql",
        [
            "<think>look</think><sql>SELECT name FROM t</sql>",
            "no tags at all",
            "<sql>SELECT nme FROM t</sql>",
            "<think>ok</think><solution>SELECT name FROM t WHERE x = 1</solution>",
        ],
    ),
    "search": (
        {"reward_spec": {"ground_truth": {"target": ["Paris"]}}},
        "search",
        ["<search>capital of France</search>", "I know it", "<answer>Paris</answer>"],
    ),
}


def env_config(marker: object, tmp_path: Path, url: str) -> dict:
    if marker == "sql":
        return {"db_path": str(sql_db(tmp_path / "sql"))}
    if marker == "search":
        return {"search_url": url, "topk": 1, "timeout": 10, "log_requests": False}
    return dict(marker)  # type: ignore[call-overload]


def native(env_id: str, row: dict, config: dict, replies: list[str]) -> tuple[list, list]:
    """skyrl-gym's own API, as skyrl-train's generator drives it."""
    extras = {k: v for k, v in copy.deepcopy(row).items() if k not in ("prompt", "env_class")}
    env = skyrl_gym.make(env_id, env_config=OmegaConf.create(config), extras=extras)
    chat, _ = env.init(copy.deepcopy(row["prompt"]))
    steps = []
    for reply in replies:
        out = env.step(reply)
        steps.append((out["observations"], out["reward"], out["done"]))
        if out["done"]:
            break
    env.close()
    return chat, steps


async def adapted(spec: str, tasks_file: Path, config: dict, replies: list[str]) -> tuple[list, list, list]:
    """The same through the adapter; also the parser's verdict on each reply."""
    cls = get_env_class(spec)
    options = cls.Options.model_validate({"env_config": config})
    task = cls.read_tasks(tasks_file, options)[0]
    env = make_env(spec, options)
    chat = [m.to_dict() for m in await env.reset(task)]
    steps, malformed = [], []
    for reply in replies:
        result = await env.step(Action(text=reply))
        steps.append(([m.to_dict() for m in result.observations], result.reward, result.done))
        malformed.append(result.malformed)
        if result.done:
            break
    await env.evaluate()
    await env.close()
    return chat, steps, malformed


@pytest.mark.parametrize("env_id", list(CASES))
def test_parity_with_skyrl_gym_own_api(env_id, tmp_path, retrieval_url):
    fields, marker, replies = CASES[env_id]
    row = {"prompt": PROMPT, "env_class": env_id, **fields}
    config = env_config(marker, tmp_path, retrieval_url)
    tasks_file = write_rows(tmp_path / "rows.jsonl", [row])
    want_chat, want_steps = native(env_id, row, config, replies)
    chat, steps, malformed = asyncio.run(adapted(f"skyrl_gym:{env_id}", tasks_file, config, replies))
    assert chat == want_chat
    assert steps == want_steps and steps[-1][2] is True, (steps, want_steps)
    if env_id in ("gsm8k_multi_turn", "text2sql", "search"):  # a reply no parser reads is malformed
        assert any(malformed) and not all(malformed), malformed
        assert malformed[1] is not None and malformed[1].startswith(f"skyrl-gym {env_id}:")
    else:
        assert malformed == [None]


def test_agent_passes_each_reply_unparsed_and_the_env_parser_judges_it(tmp_path, tokenizer, scripted_engine):
    rows = write_rows(tmp_path / "rows.jsonl", [{"prompt": PROMPT, "reward_spec": {"ground_truth": "5"}}])
    call = '<tool_call>\n{"name": "finish", "arguments": {"answer": "5"}}\n</tool_call>'
    env = EnvConfig(name="skyrl_gym:gsm8k_multi_turn", tasks_file=rows, options={"max_turns": 4})
    task = make_tasks(env, "train", 1, 0)[0]

    def run(replies: list[str], **config: int):
        agent = Agent(
            tokenizer, scripted_engine(replies), SamplingParams(max_new_tokens=40), AgentConfig(**config)
        )
        return asyncio.run(agent.run(env_factory(env)(), task, "t0", "g"))

    traj = run([call, "thinking", "#### 5"])
    assert traj.finish == "finished" and traj.num_turns == 3
    assistant = [m for m in traj.messages if m.role == "assistant"]
    assert [m.content for m in assistant] == [call, "thinking", "#### 5"]  # as written, not parsed
    assert all(m.tool_calls is None for m in assistant)
    assert traj.turn_rewards == [0.0, 0.0, 1.0] and traj.reward == 1.0 and traj.success
    assert traj.metrics["malformed_turns"] == 2.0 and "format_deviations" not in traj.metrics
    assert traj.env == "skyrl_gym:gsm8k_multi_turn" and traj.metrics["steps"] == 3.0

    bad = run(["no answer", "still none", "#### 5"], max_malformed=2)
    assert bad.finish == "malformed" and bad.num_turns == 2 and bad.metrics["malformed_turns"] == 2.0

    looped = run(["#### 4"], loop_window=3)  # a wrong but well-formed answer, three times
    assert looped.finish == "loop" and looped.num_turns == 3
    assert looped.turn_rewards == pytest.approx([0.05, 0.05]) and not looped.success


RAISING = """
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput


class Flaky(BaseTextEnv):
    def __init__(self, env_config=None, extras={}):
        super().__init__()
        self.fail = extras.get("fail")

    def init(self, prompt):
        if self.fail == "init":
            raise KeyError("no such world")
        return prompt, {}

    def step(self, action):
        if self.fail == "step":
            raise ValueError("the checker crashed on " + action)
        return BaseTextEnvStepOutput(observations=[], reward=1.0, done=True, metadata={"score": 1})
"""


def test_foreign_env_that_raises_ends_error_and_the_rollout_goes_on(
    tmp_path, tokenizer, scripted_engine, monkeypatch
):
    (tmp_path / "flaky_env.py").write_text(RAISING)
    monkeypatch.syspath_prepend(str(tmp_path))
    rows = write_rows(
        tmp_path / "rows.jsonl",
        [{"prompt": PROMPT, "fail": fail} for fail in ("step", None, "init", None)],
    )
    env = EnvConfig(name="skyrl_gym:flaky_env:Flaky", tasks_file=rows)
    tasks = sorted(make_tasks(env, "train", 4, 0), key=lambda t: t.id)
    agent = Agent(tokenizer, scripted_engine(["x = 5"]), SamplingParams(max_new_tokens=8), AgentConfig())
    result = asyncio.run(run_rollouts(agent, env_factory(env), tasks, concurrency=2))
    finish = {t.task_id: t for t in result}
    step_failed, init_failed = finish["rows-1"], finish["rows-3"]
    assert step_failed.finish == "error" and init_failed.finish == "error"
    assert step_failed.error.splitlines()[-1].endswith(
        "skyrl-gym env 'flaky_env:Flaky' raised in step: ValueError: the checker crashed on x = 5"
    )
    assert "raise ValueError" in step_failed.error  # the foreign traceback is kept above it
    assert init_failed.error.splitlines()[-1].endswith("raised in init: KeyError: 'no such world'")
    for ok in (finish["rows-2"], finish["rows-4"]):
        assert ok.finish == "finished" and ok.reward == 1.0 and ok.metrics["score"] == 1.0


def test_rows_from_parquet_are_the_same_tasks(tmp_path):
    pytest.importorskip("pyarrow", reason="reading Parquet needs pyarrow")
    import pandas as pd

    rows = [
        json.loads(line) for line in (ROOT / "configs/data/skyrl_gym_gsm8k.jsonl").read_text().splitlines()
    ]
    pd.DataFrame(rows[:5]).to_parquet(tmp_path / "gsm8k.parquet")
    write_rows(tmp_path / "gsm8k.jsonl", rows[:5])
    cls = get_env_class("skyrl_gym:gsm8k")
    from_parquet = cls.read_tasks(tmp_path / "gsm8k.parquet", cls.Options())
    from_jsonl = cls.read_tasks(tmp_path / "gsm8k.jsonl", cls.Options())
    assert [t.data for t in from_parquet] == [t.data for t in from_jsonl] == rows[:5]
    assert [t.id for t in from_parquet] == [f"gsm8k-{i}" for i in range(1, 6)]
    assert {t.split for t in from_parquet} == {"train"} and {t.env for t in from_parquet} == {
        "skyrl_gym:gsm8k"
    }


def test_bad_rows_and_missing_data_are_one_line(tmp_path):
    cls = get_env_class("skyrl_gym:text2sql")
    options = cls.Options()
    with pytest.raises(DataError, match=r"rows.jsonl:2: no 'prompt' list of chat messages"):
        cls.read_tasks(write_rows(tmp_path / "rows.jsonl", [{"prompt": PROMPT}, {"question": "q"}]), options)
    row = {"prompt": PROMPT, "env_class": "gsm8k", "reward_spec": {"ground_truth": "1"}}
    with pytest.raises(
        DataError, match=r"is for skyrl-gym env 'gsm8k', but the config's env is 'skyrl_gym:text2sql'"
    ):
        cls.read_tasks(write_rows(tmp_path / "rows.jsonl", [row]), options)
    (tmp_path / "rows.jsonl").write_text("{not json\n")
    with pytest.raises(DataError, match=r"rows.jsonl:1: not JSON"):
        cls.read_tasks(tmp_path / "rows.jsonl", options)
    with pytest.raises(HorizonError, match=r"reads its tasks from the env's dataset: give its rows"):
        cls.make_tasks("train", 1, 0, options)


def test_unknown_ids_and_a_missing_framework_name_the_fix(monkeypatch):
    with pytest.raises(UnknownEnvError, match=r"unknown skyrl-gym env 'sql'; valid: .*skyrl_gym:text2sql"):
        get_env_class("skyrl_gym:sql")
    with pytest.raises(UnknownEnvError, match=r"'path' is not a skyrl_gym.Env subclass"):
        get_env_class("skyrl_gym:os:path")
    foreign.foreign_env_class.cache_clear()
    monkeypatch.setattr(adapter, "IMPORT", "skyrl_gym_is_not_here")
    try:
        with pytest.raises(UnknownEnvError, match=r"pip install 'horizonrl\[skyrl-gym\]'"):
            get_env_class("skyrl_gym:gsm8k")
        assert "skyrl_gym" not in foreign.installed_frameworks()
    finally:
        foreign.foreign_env_class.cache_clear()


def horizon(*args: str, cwd: Path = ROOT, extra_path: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if extra_path is not None:
        env["PYTHONPATH"] = f"{extra_path}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return subprocess.run(
        [sys.executable, "-m", "horizonrl.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert "Traceback" not in output
    for fragment in fragments:
        assert fragment in " ".join(output.split()), output


def test_cli_lists_the_envs_and_says_what_is_wrong(tmp_path):
    from typer.testing import CliRunner

    from horizonrl.cli import app

    listed = CliRunner().invoke(app, ["envs"])
    assert listed.exit_code == 0, listed.output
    assert "skyrl_gym:gsm8k" in listed.output and "skyrl_gym:text2sql" in listed.output
    recipe = "configs/skyrl_gym_gsm8k.yaml"
    unknown = CliRunner().invoke(app, ["rollout", recipe, "env.name=skyrl_gym:gsm8kk"])
    assert unknown.exit_code == 2 and "Traceback" not in unknown.output, unknown.output
    assert "unknown skyrl-gym env 'gsm8kk'" in unknown.output and "skyrl_gym:gsm8k," in unknown.output
    row = {"prompt": PROMPT, "db_id": "toy", "data": "spider", "reward_spec": {"ground_truth": "SELECT 1"}}
    rows = write_rows(tmp_path / "sql.jsonl", [row])
    assert_one_line_error(  # in a real process: the command stops before any model is loaded
        horizon("rollout", recipe, "env.name=skyrl_gym:text2sql", f"env.tasks_file={rows}", "env.options={}"),
        "sql.jsonl:1: env 'skyrl_gym:text2sql' cannot start on this row",
        "set env.options.env_config.db_path",
        "skyrl-gym downloads nothing",
    )


def test_rollout_cli_writes_schema_v1_records(tmp_path):
    from skyrl_gym.envs.gsm8k.utils import extract_solution
    from typer.testing import CliRunner

    from horizonrl.cli import app

    out = tmp_path / "r.jsonl"
    overrides = ["model.path=tiny-random", "sampling.max_new_tokens=12", f"output_dir={tmp_path}"]
    args = ["rollout", "configs/skyrl_gym_gsm8k.yaml", *overrides, "--n", "3", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    trajs = read_trajectories(out)
    assert len(trajs) == 3 and {t.env for t in trajs} == {"skyrl_gym:gsm8k"}
    assert {t.finish for t in trajs} == {"finished"}  # gsm8k's one step is done, whatever was written
    for t in trajs:
        assert t.num_turns == 1 and t.turn_rewards == [t.reward] and t.reward in (0.0, 1.0)
        unreadable = extract_solution(t.messages[-1].content, method="strict") is None  # gsm8k's own parser
        assert t.metrics["malformed_turns"] == float(unreadable)
        assert len(t.loss_mask) == len(t.response_ids) == len(t.logprobs)
