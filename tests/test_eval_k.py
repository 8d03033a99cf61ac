"""`horizon eval` with k samples per task: the env answer hook (calc, flights, bfcl), the figures
(pass@k, avg@n, best@k, maj@k) with their intervals overall and per task group, the greedy default
with its Wilson interval, the k samples of a task in flight together through the real engine, and
bad input as one line (exit 2) before any model loads."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest
import toy_envs
from builders import ROOT, TOY_ENVS_CLI
from builders import TINY_COIN as TRAIN_COIN
from typer.testing import CliRunner

from horizonrl.cli import app
from horizonrl.envs.api.bfcl import BfclEnv
from horizonrl.envs.api.flights import FlightsEnv
from horizonrl.envs.base import Env
from horizonrl.envs.calc import CalcEnv
from horizonrl.errors import ConfigError
from horizonrl.rollout.eval_k import TaskSamples, choose_metrics, eval_report, gather, report_lines
from horizonrl.types import Message, Task, ToolCall, Trajectory

runner = CliRunner()
TINY_COIN = [
    "model.path=tiny-random",
    "env.name=coin",
    "env.options={}",
    "sampling.max_new_tokens=8",
    "agent.max_turns=2",
    "agent.max_malformed=2",
]


def _record(task_id: str, *messages: Message, success: bool = True, reward: float = 1.0) -> Trajectory:
    return Trajectory(
        id=f"{task_id}#0",
        task_id=task_id,
        group_id=task_id,
        env="test",
        messages=list(messages),
        prompt_ids=[1],
        reward=reward,
        finish="finished",
        metrics={"success": float(success)},
    )


def _call(name: str, call_id: str = "c", **arguments) -> Message:
    return Message(
        role="assistant", content=name, tool_calls=[ToolCall(id=call_id, name=name, arguments=arguments)]
    )


def _result(text: str, call_id: str = "c") -> Message:
    return Message(role="tool", content=text, tool_call_id=call_id)


# ------------------------------------------------------------------------------- the answer hook
def test_calc_answer_is_the_finished_number_written_exactly():
    user = Message(role="user", content="q")
    steps = [_call("calculator", expression="2*3"), _result("6")]
    assert CalcEnv.answer_of(_record("t", user, *steps, _call("finish", answer="14,497"))) == "14497"
    assert CalcEnv.answer_of(_record("t", user, _call("finish", answer="14497.0"))) == "14497"
    assert CalcEnv.answer_of(_record("t", user, _call("finish", answer="2.5"))) == "5/2"
    assert CalcEnv.answer_of(_record("t", user, _call("finish", answer="about ten"))) is None
    assert CalcEnv.answer_of(_record("t", user, *steps)) is None  # never finished
    assert CalcEnv.has_answers() and FlightsEnv.has_answers() and BfclEnv.has_answers()
    assert not Env.has_answers() and not toy_envs.CoinEnv.has_answers()


def test_flights_answer_is_the_writes_the_world_accepted_whatever_was_looked_up():
    user = Message(role="user", content="book me")
    search = [
        _call("search_flights", "s", origin="A", destination="B", date="2026-01-01"),
        _result("[]", "s"),
    ]
    booked = [_call("book_ticket", "b", offer_id="OF1"), _result('{"order_id": "O-1"}', "b")]
    refused = [_call("cancel_order", "x", order_id="O-9"), _result("Error: no such order", "x")]
    one = FlightsEnv.answer_of(_record("t", user, *search, *booked, *refused))
    other = FlightsEnv.answer_of(_record("t", user, *booked, _call("list_orders", "l"), _result("[]", "l")))
    assert one == other == '[["book_ticket", {"offer_id": "OF1"}]]'
    assert FlightsEnv.answer_of(_record("t", user, *search)) == "[]"  # changed nothing: an answer too


def test_bfcl_answer_is_the_calls_of_each_user_turn():
    first = [Message(role="user", content="list files")]
    calls = [_call("ls", "a"), _result("x.txt", "a"), Message(role="assistant", content="Done.")]
    second = [Message(role="user", content="now cd"), Message(role="user", content="please")]
    answer = BfclEnv.answer_of(_record("t", *first, *calls, *second, _call("cd", "b", folder="x")))
    assert json.loads(answer) == [[["ls", {}]], [["cd", {"folder": "x"}]]]
    no_calls_first = BfclEnv.answer_of(
        _record("t", *first, Message(role="assistant", content="ok"), *second, *calls)
    )
    assert json.loads(no_calls_first) == [[], [["ls", {}]]]  # a turn without calls is not merged away


def test_task_groups_come_from_the_task_data_and_calc_groups_by_steps():
    assert Env.task_group(Task(id="a", env="x", data={"kind": "book_self"})) == "book_self"
    assert Env.task_group(Task(id="a", env="x", data={"category": "easy", "kind": "k"})) == "easy"
    assert Env.task_group(Task(id="a", env="x", data={})) is None
    calc = CalcEnv.make_tasks("test", 3, 0, CalcEnv.Options(min_ops=2, max_ops=3))
    assert {CalcEnv.task_group(t) for t in calc} <= {"2 steps", "3 steps"}


def test_maj_is_offered_only_where_the_env_has_answers():
    assert choose_metrics(None, CalcEnv) == ["pass", "avg", "best", "maj"]
    assert choose_metrics(None, toy_envs.CoinEnv) == ["pass", "avg", "best"]
    assert choose_metrics(["maj", "pass"], CalcEnv) == ["pass", "maj"]
    with pytest.raises(ConfigError, match="env 'coin' cannot say which answers agree"):
        choose_metrics(["maj"], toy_envs.CoinEnv)


# ------------------------------------------------------------------------------- the figures
def test_report_of_n_samples_gives_every_metric_at_every_k_per_group():
    samples = [
        TaskSamples("a", "easy", [True, True, False, False], [1.0, 0.9, 0.0, 0.2], ["7", "7", "1", "2"]),
        TaskSamples("b", "easy", [False, False, False, True], [0.0, 0.0, 0.3, 1.0], ["3", "3", None, "9"]),
        TaskSamples("c", "hard", [False] * 4, [0.0, 0.1, 0.0, 0.0], ["4", "5", "6", "4"]),
    ]
    report = eval_report(samples, [1, 2, 4], ["pass", "avg", "best", "maj"])
    assert report["samples_per_task"] == 4 and report["tasks"] == 3
    assert report["pass@1"]["value"] == pytest.approx((2 / 4 + 1 / 4 + 0) / 3)
    assert report["avg@4"]["value"] == pytest.approx(report["pass@1"]["value"])
    assert report["pass@4"]["value"] == pytest.approx(2 / 3) and report["pass@4"]["method"] == "bootstrap"
    assert report["best@4"]["value"] == pytest.approx((1.0 + 1.0 + 0.1) / 3)
    assert report["maj@4"]["value"] == pytest.approx(1 / 3)  # a votes 7 (right), b votes 3, c votes 4
    assert report["maj@1"]["value"] == pytest.approx(report["pass@1"]["value"])
    for name in ("pass@1", "pass@2", "pass@4", "best@2", "maj@2"):
        e = report[name]
        assert e["low"] <= e["value"] <= e["high"], name
    assert set(report["groups"]) == {"easy", "hard"} and report["groups"]["easy"]["tasks"] == 2
    # every hard task failed: the bootstrap has no width, so the rate gets its Wilson interval
    hard = report["groups"]["hard"]["pass@4"]
    assert hard["value"] == 0.0 and hard["method"] == "wilson" and hard["high"] > 0.5
    assert [t["task_id"] for t in report["per_task"]] == ["a", "b", "c"]
    lines = report_lines(report)
    assert any(
        line.startswith("pass@1 ") and "pass@4" in line and "Chen et al. 2021" in line for line in lines
    )
    assert any("bootstrap interval over tasks" in line for line in lines)
    assert any(line.startswith("group hard (1 tasks): pass@1 0.0%") for line in lines)


def test_one_sample_per_task_is_a_rate_with_its_wilson_interval():
    samples = [TaskSamples(f"t{i}", None, [i < 3], [float(i < 3)]) for i in range(10)]
    report = eval_report(samples, [1], ["pass", "avg", "best", "maj"])
    assert set(k for k in report if "@" in k) == set()
    success = report["success"]
    assert success["method"] == "wilson" and success["value"] == 0.3
    assert success["low"] == pytest.approx(0.1078, abs=1e-3) and success["high"] == pytest.approx(
        0.6032, abs=1e-3
    )


def test_gather_keeps_task_order_and_reads_answers_with_the_hook():
    tasks = CalcEnv.make_tasks("test", 2, 0, CalcEnv.Options())
    right = str(tasks[1].data["answer"])
    records = [
        _record(tasks[1].id, _call("finish", answer=right)),
        _record(tasks[0].id, _call("finish", answer="1"), success=False, reward=0.0),
        _record(tasks[1].id, _call("finish", answer="2"), success=False, reward=0.0),
    ]
    samples = gather(records, tasks, CalcEnv)
    assert [s.task_id for s in samples] == [t.id for t in tasks]
    assert samples[1].answers == [right, "2"] and samples[1].successes == [True, False]
    assert samples[0].group == CalcEnv.task_group(tasks[0])


async def test_a_role_graph_eval_reports_the_same_figures_over_its_final_answers():
    """A role graph's episodes answer in text: MV@n and maj@n are one vote over those answers."""
    from horizonrl.multiagent.episode import EpisodeRecord, EpisodeResult
    from horizonrl.multiagent.run import evaluate_graph

    said = {"q0": ["7", "7", "12"], "q1": ["3", None, "5"]}  # q1: 3 and 5 tie, the first stated wins

    class Runner:
        async def run(self, task, episode_id, seed, k):
            answer, expected = said[task.id][k], str(task.data["answer"])
            record = EpisodeRecord(
                episode_id=episode_id,
                graph="test",
                task_id=task.id,
                order=[],
                adapters={},
                phases=[],
                final_answer=answer,
                expected=expected,
                reward=float(answer == expected),
            )
            return EpisodeResult(record, [])

    tasks = [Task(id=q, env="calc", data={"question": "?", "answer": a}) for q, a in (("q0", 7), ("q1", 5))]
    summary = await evaluate_graph(Runner(), tasks, 3, 8, 0)
    assert summary["success_rate"] == 0.5 and summary["samples_per_task"] == 3
    assert summary["maj@3"]["value"] == summary["success_rate"]
    assert summary["pass@1"]["value"] == pytest.approx((2 / 3 + 1 / 3) / 2)
    assert summary["pass@3"]["value"] == 1.0
    assert summary["per_task"][1]["answers"] == ["3", None, "5"]


# ------------------------------------------------------------------------------- through the engine
async def test_a_tasks_samples_are_in_flight_together_through_the_real_engine(tiny_model_and_tokenizer):
    """n = 4 samples of 3 tasks with 8 episodes in flight: each task's first-turn requests (one
    prompt) reach the engine together and are batched; at temperature 1 the samples differ."""
    from horizonrl.agent.config import AgentConfig
    from horizonrl.agent.loop import Agent
    from horizonrl.engine.base import SamplingParams
    from horizonrl.engine.hf import HFEngine
    from horizonrl.rollout.runner import run_rollouts

    model, tok = tiny_model_and_tokenizer
    engine = HFEngine(model, tok, max_batch_size=8, seed=0)
    live: Counter[tuple[int, ...]] = Counter()
    most: Counter[tuple[int, ...]] = Counter()
    generate = engine.generate

    async def watched(prompt_ids, params):
        key = tuple(prompt_ids)
        live[key] += 1
        most[key] = max(most[key], live[key])
        try:
            return await generate(prompt_ids, params)
        finally:
            live[key] -= 1

    engine.generate = watched  # type: ignore[method-assign]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8, seed=0)
    agent = Agent(tok, engine, sampling, AgentConfig(max_turns=2, max_malformed=2), context_length=8192)
    tasks = toy_envs.CoinEnv.make_tasks("test", 3, 0, None)
    try:
        result = await run_rollouts(agent, toy_envs.CoinEnv, tasks, samples_per_task=4, concurrency=8)
    finally:
        await engine.close()
    assert len(result) == 12
    # the first two tasks' 4 first turns (one prompt each) were in flight at once; the third task's
    # samples are admitted one by one as slots free
    together = [key for key, count in most.items() if count == 4]
    assert len(together) >= 2, sorted(most.values())
    assert engine.stats["batches"] < engine.stats["requests"]
    for task in tasks:
        texts = {t.messages[2].content for t in result if t.task_id == task.id}
        assert len(texts) > 1  # sampled, each with its own seed


# ------------------------------------------------------------------------------- the command
def _eval(tmp_path, *args: str):
    summary = tmp_path / "summary.json"
    result = runner.invoke(app, ["eval", *args, f"output_dir={tmp_path}", "--json", str(summary)])
    return result, (json.loads(summary.read_text()) if summary.is_file() else None)


def test_greedy_eval_prints_as_before_with_its_wilson_interval(tmp_path):
    result, summary = _eval(tmp_path, "configs/calc.yaml", "--policy", "oracle", "eval.num_tasks=10")
    assert result.exit_code == 0, result.output
    assert "success rate 100.0% [72.2, 100.0] (95% Wilson interval over 10 tasks)" in result.output
    assert summary["success_rate"] == 1.0 and summary["samples_per_task"] == 1
    assert summary["success"]["method"] == "wilson" and summary["success"]["low"] == pytest.approx(
        0.7225, abs=1e-3
    )
    assert not any("@" in key for key in summary)


def test_sampled_eval_of_a_tiny_model_reports_pass_best_and_avg_with_intervals(tmp_path):
    args = [
        *TINY_COIN,
        "eval.num_tasks=6",
        "eval.samples_per_task=4",
        "eval.temperature=1.0",
        "eval.concurrency=8",
    ]
    result, summary = _eval(tmp_path, "configs/calc.yaml", *args)
    assert result.exit_code == 0, result.output
    assert summary["samples_per_task"] == 4 and summary["temperature"] == 1.0 and summary["tasks"] == 6
    assert summary["num_trajectories"] == 24 and all(len(t["successes"]) == 4 for t in summary["per_task"])
    for name in ("pass@1", "pass@2", "pass@4", "avg@4", "best@1", "best@2", "best@4"):
        assert summary[name]["low"] <= summary[name]["value"] <= summary[name]["high"], name
    assert summary["pass@1"]["value"] <= summary["pass@2"]["value"] <= summary["pass@4"]["value"]
    assert summary["best@1"]["value"] <= summary["best@4"]["value"]
    assert not any(key.startswith("maj@") for key in summary)  # the coin env has no answers
    assert "bootstrap interval over tasks" in summary["interval"]
    output = " ".join(result.output.split())
    assert "held-out eval · 6 test tasks · seed 0 · 4 samples each at temperature 1" in output
    assert "(unbiased estimator, Chen et al. 2021)" in output and "success rate (avg@4)" in output


def test_sampled_oracle_eval_on_flights_votes_and_reports_each_kind(tmp_path):
    args = [
        "--policy",
        "oracle",
        "eval.num_tasks=20",
        "eval.samples_per_task=2",
        "eval.temperature=1",
        "eval.k=[2]",
        "eval.concurrency=1",  # below the samples: said in a note, and it still runs
    ]
    result, summary = _eval(tmp_path, "configs/flights.yaml", *args)
    assert result.exit_code == 0, result.output
    assert {k for k in summary if "@" in k} == {"pass@2", "avg@2", "best@2", "maj@2"}
    assert summary["maj@2"]["value"] == 1.0 and summary["maj@2"]["method"] == "wilson"  # all right: no width
    assert len(summary["groups"]) > 1 and all("maj@2" in g for g in summary["groups"].values())
    answers = summary["per_task"][0]["answers"]
    assert answers[0] == answers[1] and "book_ticket" in answers[0]
    assert "group book_self" in result.output
    assert "note: eval.concurrency 1 < eval.samples_per_task 2" in " ".join(result.output.split())


@pytest.mark.parametrize(
    "overrides,fragments",
    [
        (["eval.samples_per_task=0"], ["eval.samples_per_task=0", "minimum of 1"]),
        (
            ["eval.samples_per_task=2000", "eval.temperature=1"],
            ["eval.samples_per_task=2000", "limit of 1024"],
        ),
        (["eval.samples_per_task=4"], ["eval.temperature is 0", "eval.temperature=1.0"]),
        (["eval.k=[2]"], ["k=2", "eval.samples_per_task is 1", "1..1"]),
        (["eval.samples_per_task=4", "eval.temperature=1", "eval.metrics=[]"], ["eval.metrics is empty"]),
    ],
)
def test_bad_sample_settings_are_one_line(overrides, fragments):
    result = runner.invoke(app, ["eval", "configs/calc.yaml", *overrides])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    for fragment in fragments:
        assert fragment in result.output, result.output


@pytest.mark.parametrize(
    "overrides,fragments",
    [
        (["env.name=coin", "env.options={}", "eval.metrics=[pass,maj]"], ["maj@k", "env 'coin'", "drop maj"]),
        (["eval.k=[1,16]"], ["k=16", "eval.samples_per_task is 8", "1..8"]),
    ],
)
def test_k_beyond_the_samples_or_maj_without_answers_stops_before_the_model_loads(
    tmp_path, overrides, fragments
):
    """A real `horizon` process with a model path that does not exist: the error it prints is the
    eval's, so it came before any model was looked for."""
    missing = tmp_path / "no-model"
    args = [
        "eval",
        "configs/calc.yaml",
        f"model.path={missing}",
        "eval.samples_per_task=8",
        "eval.temperature=1",
    ]
    proc = subprocess.run(
        [sys.executable, "-c", TOY_ENVS_CLI, *args, *overrides, f"output_dir={tmp_path}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert "Traceback" not in output and len(output.strip().splitlines()) == 1, output
    assert str(missing) not in output
    for fragment in fragments:
        assert fragment in output, output


def test_training_evals_sample_each_task_n_times_too(tmp_path):
    from horizonrl.types import read_trajectories

    args = ["train", "configs/calc.yaml", *TRAIN_COIN, "train.steps=1", f"output_dir={tmp_path}", "name=run"]
    sampled = ["eval.samples_per_task=3", "eval.temperature=1.0"]
    result = runner.invoke(app, [*args, *sampled])
    assert result.exit_code == 0, result.output
    records = read_trajectories(tmp_path / "run" / "eval" / "base.jsonl")
    assert sorted(Counter(t.task_id for t in records).values()) == [3, 3]  # 2 tasks x 3 samples
    assert "held-out success (base, 2 tasks × 3)" in " ".join(result.output.split())


def test_the_answer_hooks_vote_like_the_role_graphs():
    """maj@k and a role graph's MV@k are one vote (horizonrl.stats.majority_vote)."""
    from horizonrl.multiagent import answers
    from horizonrl.stats import majority_vote

    assert answers.majority_vote is majority_vote
