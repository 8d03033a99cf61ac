"""Component-centric learning: selection, candidates on disk, agent code in its sandbox, the
optimizer's replies, `horizon learn` end to end with resume, and the bad input each part refuses."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from horizonrl.config import load_config
from horizonrl.errors import ConfigError
from horizonrl.learn.agent_code import DEFAULT_AGENT_CODE, check_agent_code
from horizonrl.learn.candidate import Candidate, CandidateStore, Components, Metrics
from horizonrl.learn.config import LearnEnv
from horizonrl.learn.evaluate import Evaluator
from horizonrl.learn.methods import ALL_METHODS, parse_method
from horizonrl.learn.optimize import episode_digest, parse_code, parse_prompt, propose
from horizonrl.learn.select import pareto_front, select_best, select_pareto
from horizonrl.roles.structured import parse_reply
from horizonrl.types import Message, Trajectory

MAZE = LearnEnv(name="world", options={"world": "maze"})
TINY = ["model.path=tiny-random", "sampling.max_new_tokens=16", "agent.max_turns=3"]


def cand(cid: str, reward: float, cost: float) -> Candidate:
    return Candidate(
        id=cid,
        env="e",
        components=Components(prompt=cid),
        metrics=Metrics(train_reward=reward, cost_tokens=cost),
    )


# ------------------------------------------------------------------ methods and selection


def test_the_eight_autoenv_methods_and_the_model_methods_are_the_grid():
    assert len(ALL_METHODS) == 10 and len(set(ALL_METHODS)) == 10
    text = [m for m in ALL_METHODS if not m.endswith("/model")]
    assert len(text) == 8 and {parse_method(m).selection for m in text} == {"best", "pareto"}
    assert parse_method("pareto/instruction/agent_code").target == "agent_code"


def test_an_unknown_method_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown method 'fast'.*selection best\|pareto"):
        parse_method("fast")
    with pytest.raises(ValueError, match=r"unknown selection 'greedy'; valid: best, pareto"):
        parse_method("greedy/dynamics/prompt")
    with pytest.raises(ValueError, match=r"sft cannot change 'prompt'; it changes model"):
        parse_method("best/sft/prompt")
    with pytest.raises(ConfigError) as err:
        load_config(None, ["learn.methods=[best/dynamics/weights]"])
    assert "learn.methods" in str(err.value) and "prompt, agent_code" in str(err.value)
    assert "\n" not in str(err.value)


def test_pareto_front_against_a_hand_example():
    # (reward up, cost down): a (0.9, 300) and c (0.5, 100) and e (0.2, 50) trade off;
    # b (0.5, 200) is dominated by c, d (0.8, 400) by a; f duplicates c and stays
    points = [(0.9, 300), (0.5, 200), (0.5, 100), (0.8, 400), (0.2, 50), (0.5, 100)]
    assert pareto_front(points) == [0, 2, 4, 5]
    cands = [cand(n, r, c) for n, (r, c) in zip("abcdef", points, strict=True)]
    drawn = {select_pareto(cands, random.Random(s)).id for s in range(60)}
    assert drawn == {"a", "c", "e", "f"}
    assert select_best(cands).id == "a"
    # ties on reward: the cheaper wins, then the older
    assert select_best([cand("x", 0.5, 200), cand("y", 0.5, 100), cand("z", 0.5, 100)]).id == "y"


# ------------------------------------------------------------------ candidates on disk


def traj(reward: float, finish: str = "finished", text: str = "move east") -> Trajectory:
    return Trajectory(
        id=f"t{reward}",
        task_id="task",
        group_id="task",
        env="world",
        messages=[
            Message(role="system", content="You are in a maze."),
            Message(role="user", content="Map: #@.E#"),
            Message(role="assistant", content=text),
            Message(role="tool", content="You moved east."),
        ],
        prompt_ids=[1, 2],
        reward=reward,
        finish=finish,
    )


def test_candidates_round_trip_through_the_run_directory(tmp_path):
    store = CandidateStore(tmp_path / "learn" / "maze")
    root = Candidate(
        id=store.next_id(), env="maze", components=Components(), metrics=Metrics(val_reward=0.25)
    )
    store.add(root, [traj(0.0), traj(1.0)], [traj(0.5)])
    child_parts = Components(prompt="Walk east first.", agent_code=DEFAULT_AGENT_CODE)
    child = Candidate(
        id=store.next_id(),
        env="maze",
        components=child_parts,
        parent=root.id,
        method="best/dynamics/prompt",
        iteration=1,
        metrics=Metrics(train_reward=0.5, val_reward=0.75, finishes={"finished": 1}),
    )
    store.add(child, [traj(0.5)], [traj(0.75)])
    (store.dir / ".c0002.tmp-1").mkdir()  # a candidate being written when the run stopped

    again = CandidateStore(tmp_path / "learn" / "maze")
    assert len(again) == 2 and again.get("c0001") == child and again.get("c0000") == root
    assert again.find(Components(prompt="Walk east first.", agent_code=DEFAULT_AGENT_CODE)).id == "c0001"
    assert again.find(Components(prompt="other")) is None
    assert [t.reward for t in again.trajectories("c0000", "train")] == [0.0, 1.0]
    assert again.trajectories("c0001", "val")[0].messages[2].content == "move east"
    folder = again.folder("c0001")
    assert (folder / "prompt.md").read_text() == "Walk east first."
    assert (folder / "agent.py").read_text() == DEFAULT_AGENT_CODE
    again.remove_partial()
    assert not (store.dir / ".c0002.tmp-1").exists()


# ------------------------------------------------------------------ the optimizer's replies


def test_optimizer_replies_are_parsed_tolerantly():
    assert (
        parse_prompt("Rules: walls block.\n<prompt>\n- Read the map first.\n</prompt>")[0]
        == "- Read the map first."
    )
    assert parse_prompt("<PROMPT>Never walk into walls") == ("Never walk into walls", "")
    assert parse_prompt("I think the agent should move.")[0] is None
    assert "no <prompt>" in parse_prompt("")[1]
    code = "```python\ndef act(turn):\n    return {'action': 'x'}\n```"
    assert parse_code(code)[0].startswith("def act(turn)")
    assert parse_code("```python\ndef act(turn):\n    return (\n```")[1].startswith(
        "invalid code: does not parse"
    )
    assert "defines no top-level act(turn)" in parse_code("```python\ndef step(t):\n    pass\n```")[1]
    assert "no ```python block" in parse_code("def act(turn): pass")[1]
    assert check_agent_code(DEFAULT_AGENT_CODE) is None


class CannedOptimizer:
    """The optimizer role's contract (``chat`` and ``structured``) with fixed replies: these tests
    are about what the learn loop does with a reply, whatever model wrote it."""

    name = "optimizer"

    def __init__(self, reply: str) -> None:
        self.reply = reply
        self.asked: list = []

    async def chat(self, messages, **sampling):
        self.asked.append(messages)
        return self.reply

    async def structured(self, messages, schema, **sampling):
        return parse_reply(await self.chat(messages, **sampling), schema)


def _propose(reply: str, target: str = "prompt", limit: int = 50):
    import asyncio

    client = CannedOptimizer(reply)
    out = asyncio.run(
        propose(
            client,
            "dynamics",
            target,
            Components(),
            [traj(0.0), traj(1.0)],
            k=4,
            step_chars=80,
            count_tokens=lambda s: len(s.split()),
            max_prompt_tokens=limit,
            sampling={},
        )
    )
    return out, client


def test_a_reply_that_does_not_parse_keeps_the_candidate_and_says_why():
    out, client = _propose("The agent should think harder.")
    assert out.components is None and out.reason.startswith("unparsed")
    request = client.asked[0][1]["content"]
    assert "You are in a maze." in request and "step 1 action: move east" in request and "rules" in request


def test_a_prompt_past_the_limit_is_rejected_with_its_length():
    out, _ = _propose("<prompt>" + "word " * 80 + "</prompt>", limit=50)
    assert out.components is None and out.reason == "too long: the prompt is 80 tokens, the limit is 50"
    out, _ = _propose("<prompt>Step around walls.</prompt>")
    assert out.components == Components(prompt="Step around walls.")
    out, _ = _propose("```python\ndef act(turn):\n    return {'action': 'hi'}\n```", target="agent_code")
    assert "'hi'" in out.components.agent_code


def test_a_structured_reply_gives_the_component_and_a_bad_one_says_why():
    out, client = _propose(json.dumps({"analysis": "walls block.", "prompt": "Step around walls."}))
    assert out.components == Components(prompt="Step around walls.") and out.stats["structured"]
    assert '"prompt"' in client.asked[0][1]["content"]  # the request says what to write
    code = "def act(turn):\n    return {'action': 'hi'}\n"
    out, _ = _propose(json.dumps({"analysis": "", "code": code}), target="agent_code")
    assert out.components.agent_code == code
    out, _ = _propose(json.dumps({"analysis": "", "code": "act = 1"}), target="agent_code")
    assert out.components is None and out.reason == "invalid code: defines no top-level act(turn)"
    out, _ = _propose(json.dumps({"analysis": "no prompt key"}))
    assert out.components is None and out.reason.startswith("unparsed: no <prompt>")
    assert "not a NewGuidelines object: prompt: Field required" in out.reason


@pytest.mark.parametrize("target", ["prompt", "agent_code"])
def test_the_optimizer_role_on_an_engine_always_replies_with_a_usable_object(
    tiny_model_and_tokenizer, target
):
    import asyncio

    from horizonrl.engine.hf import HFEngine
    from horizonrl.roles import Roles, RolesConfig

    model, tokenizer = tiny_model_and_tokenizer
    engine = HFEngine(model, tokenizer, max_batch_size=8)
    client = Roles(RolesConfig(), engine, tokenizer).get("optimizer")

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    async def ask(seed: int):
        return await propose(
            client,
            "instruction",
            target,
            Components(),
            [traj(0.0), traj(1.0)],
            k=2,
            step_chars=80,
            count_tokens=count,
            max_prompt_tokens=256,
            sampling={"temperature": 1.0, "max_tokens": 128, "seed": seed},
        )

    async def main():
        try:
            return await asyncio.gather(*(ask(s) for s in range(6)))
        finally:
            await engine.close()

    proposals = asyncio.run(main())
    assert all(p.stats["structured"] for p in proposals), [p.reason for p in proposals]
    assert client.usage.structured == 6 and client.usage.unusable == 0
    if target == "prompt":  # every reply is a new prompt the loop takes
        assert all(p.components is not None and p.components.prompt for p in proposals)
    else:  # well-formed, but a random model's text is no Python module: counted, not raised
        assert all(p.components is None and p.reason.startswith("invalid code") for p in proposals)


def test_the_digest_puts_failures_first_and_cuts_long_steps():
    digest = episode_digest([traj(1.0), traj(0.0, "malformed", "x" * 500)], k=1, step_chars=60)
    assert digest.count("Episode") == 1 and "ended by malformed" in digest and "x" * 60 not in digest


# ------------------------------------------------------------------ agent code in its sandbox


def play_code(code: str, tmp_path: Path, n: int = 2, **learn):
    config = load_config(
        None, [*TINY, f"output_dir={tmp_path}", *(f"learn.{k}={v}" for k, v in learn.items())]
    )
    ev = Evaluator(config, config.learn, config.run_dir)
    try:
        tasks = ev.tasks(MAZE)[1][:n]
        start = time.perf_counter()
        trajs, _, _ = ev.play(Components(agent_code=code), MAZE, tasks, 0.0, "test")
        return trajs, time.perf_counter() - start
    finally:
        ev.close()


def test_agent_code_acts_asks_the_model_and_keeps_memory_across_turns(tmp_path):
    code = """
import json

def act(turn):
    n = turn["memory"].get("n", 0)
    if not turn["replies"]:
        return {"ask": turn["messages"][:1] + [{"role": "user", "content": "Which way?"}]}
    call = {"name": "move", "arguments": {"direction": "east"}}
    text = "turn %d, asked %d\\n<tool_call>\\n%s\\n</tool_call>" % (n, len(turn["replies"]), json.dumps(call))
    return {"action": text, "memory": {"n": n + 1}}
"""
    trajs, _ = play_code(code, tmp_path)
    assert len(trajs) == 2
    for t in trajs:
        said = [m.content for m in t.messages if m.role == "assistant"]
        assert said[0].startswith("turn 0, asked 1") and said[1].startswith("turn 1, asked 1")
        assert t.messages[3].role == "tool"  # the env executed the move the code wrote
        assert t.finish != "error", t.error


def test_agent_code_that_raises_or_loops_is_contained_and_scored_zero(tmp_path):
    trajs, _ = play_code("def act(turn):\n    raise RuntimeError('boom')\n", tmp_path)
    assert all(t.finish == "error" and t.reward == 0.0 for t in trajs)
    assert "RuntimeError: boom" in trajs[0].error

    trajs, seconds = play_code("def act(turn):\n    while True:\n        pass\n", tmp_path, code_timeout_s=1)
    assert all(t.finish == "error" and t.reward == 0.0 for t in trajs)
    assert "timed out after 1 s" in trajs[0].error and seconds < 30

    escape = (
        "import os\ndef act(turn):\n    return {'action': str(os.listdir('/root') + os.listdir('/work'))}\n"
    )
    trajs, _ = play_code(escape, tmp_path, n=1)
    assert trajs[0].finish == "error" and "FileNotFoundError" in trajs[0].error  # the host is not there


# ------------------------------------------------------------------ horizon learn end to end


def learn_recipe(tmp_path: Path, **learn) -> Path:
    recipe = {
        "name": "learn",
        "output_dir": str(tmp_path / "runs"),
        "model": {"path": "smollm2-135m"},
        "agent": {"max_turns": 3, "max_total_tokens": 2048, "max_malformed": 1},
        "sampling": {"max_new_tokens": 32},
        "learn": {
            "envs": [
                {"name": "world", "options": {"world": "maze"}},
                {"name": "calc", "overrides": ["agent.max_turns=2"]},
            ],
            "methods": ["best/dynamics/prompt", "pareto/instruction/agent_code"],
            "iterations": 1,
            "train_tasks": 2,
            "val_tasks": 2,
            "optimizer_max_tokens": 48,
            **learn,
        },
    }
    path = tmp_path / "learn.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def horizon(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "horizonrl.cli", *args], capture_output=True, text=True, timeout=900
    )


def test_horizon_learn_writes_every_candidate_and_the_summary_and_resumes(tmp_path):
    recipe = learn_recipe(tmp_path)
    first = horizon("learn", str(recipe))
    assert first.returncode == 0, first.stderr + first.stdout
    run = tmp_path / "runs" / "learn"
    summary = json.loads((run / "learn.json").read_text())
    for key in ("methods", "per_env", "baseline", "best_single", "adaptive", "upper_bound", "allocation"):
        assert key in summary, key
    assert summary["envs_done"] == ["maze", "calc"]
    for env in ("maze", "calc"):
        row = summary["per_env"][env]
        assert set(row["scores"]) == {"best/dynamics/prompt", "pareto/instruction/agent_code"}
        assert row["upper_bound"]["score"] == max(row["scores"].values())
        assert row["adaptive"]["score"] <= row["upper_bound"]["score"]
        entry = summary["methods"]["best/dynamics/prompt"]["per_env"][env]
        low, high = entry["val_success_interval"]  # the rate with its 95% interval over tasks
        assert low <= entry["val_success"] <= high and high > low
        assert (run / "learn" / env / "candidates" / "c0000" / "candidate.json").is_file()
        for method in ("best-dynamics-prompt", "pareto-instruction-agent_code"):
            lines = (run / "learn" / env / method / "iterations.jsonl").read_text().splitlines()
            assert len(lines) == 1
    assert "upper bound" in first.stdout and "adaptive" in first.stdout
    out = first.stdout
    last_maze = max(
        out.rfind("maze · best/dynamics/prompt"), out.rfind("maze · pareto/instruction/agent_code")
    )
    assert 0 < last_maze < out.find("calc: measuring the baseline")  # one env after the other

    again = horizon("learn", str(recipe))
    assert again.returncode == 2 and "--resume" in again.stderr

    # a crash in the middle of calc's iteration: its line and learn.json are gone
    lineage = run / "learn" / "calc" / "pareto-instruction-agent_code" / "iterations.jsonl"
    lineage.write_text("")
    (run / "learn.json").unlink()
    resumed = horizon("learn", str(recipe), "--resume")
    assert resumed.returncode == 0, resumed.stderr + resumed.stdout
    assert "measuring the baseline" not in resumed.stdout  # both baselines came back from disk
    assert "calc · pareto/instruction/agent_code · iteration 1" in resumed.stdout
    assert "maze ·" not in resumed.stdout.replace("maze │", "")  # maze had nothing left to do
    assert json.loads((run / "learn.json").read_text())["envs_done"] == ["maze", "calc"]

    changed = horizon("learn", str(recipe), "--resume", "learn.iterations=3", "learn.train_tasks=1")
    assert changed.returncode == 2 and "'learn' section differs" in changed.stderr


def test_learn_killed_mid_run_resumes_where_it_stopped(tmp_path):
    # one env (resuming into the next env is the test above's)
    recipe = learn_recipe(tmp_path, iterations=2, envs=[{"name": "world", "options": {"world": "maze"}}])
    cmd = [sys.executable, "-m", "horizonrl.cli", "learn", str(recipe)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "maze · pareto/instruction/agent_code · iteration 1" in line:
            break
    proc.kill()  # SIGKILL: no handler runs
    proc.wait(timeout=60)
    assert any("iteration 1" in line for line in seen), "".join(seen)
    resumed = horizon("learn", str(recipe), "--resume")
    assert resumed.returncode == 0, resumed.stderr + resumed.stdout
    assert "maze: measuring the baseline" not in resumed.stdout
    assert "maze · best/dynamics/prompt · iteration 1" not in resumed.stdout  # done before the kill
    assert "maze · best/dynamics/prompt · iteration 2" in resumed.stdout
    run = tmp_path / "runs" / "learn"
    for method in ("best-dynamics-prompt", "pareto-instruction-agent_code"):
        lines = (run / "learn" / "maze" / method / "iterations.jsonl").read_text().splitlines()
        assert [json.loads(x)["iteration"] for x in lines] == [1, 2]
    summary = json.loads((run / "learn.json").read_text())
    assert summary["final"] and summary["envs_done"] == ["maze"]


def test_learn_refuses_bad_envs_before_touching_anything(tmp_path):
    recipe = learn_recipe(tmp_path)
    out = horizon("learn", str(recipe), "learn.envs=[{name: world, options: {world: nowhere}}]")
    assert out.returncode == 2 and "nowhere" in out.stderr
    out = horizon("learn", str(recipe), "learn.envs=[{name: calc, overrides: [agent.max_turn=3]}]")
    assert out.returncode == 2 and "agent.max_turn" in out.stderr and "max_turns" in out.stderr
    assert not (tmp_path / "runs" / "learn" / "learn").exists()


def test_a_model_optimizer_makes_a_self_contained_weights_candidate(tmp_path):
    recipe = learn_recipe(
        tmp_path,
        envs=[{"name": "calc", "overrides": ["agent.max_turns=4"]}],
        methods=["best/sft/model"],
        bandit=False,
        model={"sft_num_demos": 2},
    )
    out = horizon("learn", str(recipe), "model.path=tiny-random", "sampling.max_new_tokens=8")
    assert out.returncode == 0, out.stderr + out.stdout
    run = tmp_path / "runs" / "learn"
    child = json.loads((run / "learn" / "calc" / "candidates" / "c0001" / "candidate.json").read_text())
    assert child["method"] == "best/sft/model" and child["parent"] == "c0000"
    model_dir = run / child["components"]["model"]
    assert model_dir == run / "learn" / "calc" / "candidates" / "c0001" / "model"
    assert (model_dir / "config.json").is_file() and (model_dir / "model.safetensors").is_file()
    assert not (
        run / "learn" / "calc" / "best-sft-model" / "iter_001" / "model"
    ).exists()  # moved, not copied
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)  # full weights: loads anywhere, no adapter
    assert not hasattr(model, "peft_config")


def test_each_model_optimization_draws_its_own_seeds(tmp_path):
    from horizonrl.learn.model_opt import inner_config

    config = load_config(None, [*TINY, f"output_dir={tmp_path}"])
    env = LearnEnv(name="calc")
    one, two = (
        inner_config(config, config.learn, env, "sft", "tiny-random", tmp_path / f"w{s}", None, s)
        for s in (11, 12)
    )
    for cfg in (one, two):
        assert cfg.sft.enabled and cfg.train.steps == 0 and cfg.eval.num_tasks == 1
    assert (one.seed, one.sft.seed, one.rollout.seed) != (two.seed, two.sft.seed, two.rollout.seed)
    grpo = inner_config(config, config.learn, env, "grpo", "tiny-random", tmp_path / "g", None, 11)
    assert not grpo.sft.enabled and grpo.train.steps == config.learn.model.grpo_steps
