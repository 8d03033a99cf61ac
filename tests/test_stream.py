"""Experience streams: the reward as weighted grounded signals, the outer loop that fits the weights
to feedback (and cannot optimize the task away), task sources that follow a growing file or write
their own tasks, and `horizon stream` as a real process that stops cleanly on SIGTERM and resumes."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import time
from pathlib import Path

import pytest
from builders import SLOW_LATENCY, TINY_COIN, horizon_process, wait_until
from typer.testing import CliRunner

from horizonrl.cli import app
from horizonrl.config import load_config
from horizonrl.errors import ConfigError, DataError
from horizonrl.run_paths import OutsideRunDir
from horizonrl.stream.feedback import Feedback, FeedbackReader, append_feedback, feedback_path
from horizonrl.stream.signals import SIGNALS, shape_rewards, signal_vector
from horizonrl.stream.sources import FileSource, GeneratorSource, SelfQuestioningSource
from horizonrl.stream.weights import pair_agreement, pair_gradient, rating_pairs, update_weights
from horizonrl.types import Message, Task, Timings, Trajectory

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def traj(
    tid: str, *, reward: float, tokens: float, finish: str = "finished", errors: float = 0.0
) -> Trajectory:
    return Trajectory(
        id=tid,
        task_id="t",
        group_id="t",
        env="calc",
        messages=[Message(role="user", content="x")],
        prompt_ids=[1],
        reward=reward,
        num_turns=2,
        finish=finish,
        metrics={"model_tokens": tokens, "tool_errors": errors},
        timings=Timings(run_s=30.0),
    )


# ---------------------------------------------------------------- signals and the weighted reward
def test_signals_are_read_off_the_record_in_their_units():
    t = traj("a", reward=0.75, tokens=250, errors=2)
    names = list(SIGNALS)
    values = dict(zip(names, signal_vector(t, names), strict=True))
    assert values == {
        "success": 1.0,
        "reward": 0.75,
        "finished": 1.0,
        "tool_errors": 2.0,
        "malformed": 0.0,
        "tokens": 0.25,
        "turns": 2.0,
        "time": 0.5,
    }
    assert signal_vector(traj("b", reward=1.0, tokens=10, finish="turn_budget"), ["success"]) == [0.0]


def test_the_shaped_reward_is_the_weighted_sum_and_keeps_the_envs_verdict():
    a, b = traj("a", reward=1.0, tokens=200), traj("b", reward=0.0, tokens=100)
    shaped = shape_rewards([a, b], ["success", "tokens"], [1.0, -2.0])
    assert [t.reward for t in shaped] == pytest.approx([1.0 - 0.4, -0.2])
    assert [t.metrics["env_reward"] for t in shaped] == [1.0, 0.0]
    assert [t.success for t in shaped] == [True, False]  # success stays the env's, whatever w says
    # shaping twice reads the env's reward, not the shaped one
    again = shape_rewards(shaped, ["reward"], [1.0])
    assert [t.reward for t in again] == [1.0, 0.0]


# ---------------------------------------------------------------- the outer loop
def test_the_pair_gradient_is_the_bradley_terry_log_likelihoods():
    pairs = [([1.0, 0.2], [0.0, 0.1]), ([1.0, 0.1], [1.0, 0.3]), ([0.0, 0.0], [1.0, 0.5])]
    w = [0.3, -0.7]

    def loglik(weights):
        total = 0.0
        for p, r in pairs:
            z = sum(x * (a - b) for x, a, b in zip(weights, p, r, strict=True))
            total += -math.log1p(math.exp(-z))
        return total / len(pairs)

    eps = 1e-6
    numeric = [(loglik([w[0] + eps, w[1]]) - loglik([w[0] - eps, w[1]])) / (2 * eps)]
    numeric.append((loglik([w[0], w[1] + eps]) - loglik([w[0], w[1] - eps])) / (2 * eps))
    assert pair_gradient(w, pairs) == pytest.approx(numeric, rel=1e-5)


def test_ratings_become_up_against_down_pairs():
    ratings = [([1.0], "up"), ([0.0], "down"), ([2.0], "up"), ([3.0], "down")]
    assert rating_pairs(ratings) == [([1.0], [0.0]), ([1.0], [3.0]), ([2.0], [0.0]), ([2.0], [3.0])]
    assert rating_pairs([([1.0], "up")]) == []


def _step(w, w0, pairs, **kw):
    args = {"learning_rate": 0.5, "prior": 0.1, "anchor": 0, "anchor_min": 0.5, "max_abs": 2.0} | kw
    return update_weights(w, w0, pairs, **args)


def test_feedback_that_prefers_fewer_tokens_makes_the_token_weight_negative():
    # signals (success, tokens in thousands): among solved episodes the rater likes the short ones
    pairs = [([1.0, 0.1], [1.0, 0.3]), ([1.0, 0.12], [0.0, 0.05]), ([1.0, 0.08], [1.0, 0.25])]
    w0 = [1.0, 0.0]
    w = list(w0)
    agreement = [pair_agreement(w, pairs)]
    for _ in range(30):
        w = _step(w, w0, pairs)
        agreement.append(pair_agreement(w, pairs))
    assert w[1] < -0.3  # moved toward what the feedback prefers
    assert w[0] >= 0.5  # the grounded objective stays
    assert agreement[0] < 1.0 and agreement[-1] == 1.0


def test_feedback_against_the_task_cannot_push_the_anchor_below_its_floor():
    pairs = [([0.0, 0.0], [1.0, 0.0])] * 4  # a rater who prefers failures
    w = [1.0, 0.0]
    for _ in range(200):
        w = _step(w, [1.0, 0.0], pairs, prior=0.0)
    assert w[0] == pytest.approx(0.5)  # the floor, not below
    w = [0.0, 5.0]
    assert _step(w, w, [], learning_rate=0.0) == [0.5, 2.0]  # the projection clamps both


def test_without_pairs_an_update_changes_nothing_but_the_prior_pull():
    assert _step([1.0, -1.0], [1.0, -1.0], []) == [1.0, -1.0]
    moved = _step([1.0, -1.0], [1.0, 0.0], [], prior=0.5, learning_rate=1.0)
    assert moved == pytest.approx([1.0, -0.5])


# ---------------------------------------------------------------- feedback file
def test_feedback_is_read_once_whole_lines_only_and_bad_lines_counted(tmp_path):
    append_feedback(tmp_path, Feedback(trajectory_id="a#0", label="up"))
    reader = FeedbackReader(tmp_path)
    assert [f.trajectory_id for f in reader.read_new()] == ["a#0"]
    assert reader.read_new() == []
    with feedback_path(tmp_path).open("a") as f:
        f.write('{"trajectory_id": "b#1", "label": "sideways"}\n{"trajectory_id": "c#2", "lab')
    assert reader.read_new() == [] and reader.bad_lines == 1
    with feedback_path(tmp_path).open("a") as f:
        f.write('el": "down"}\n')
    new = reader.read_new()
    assert [(f.trajectory_id, f.label) for f in new] == [("c#2", "down")]
    resumed = FeedbackReader(tmp_path, offset=reader.offset)
    assert resumed.read_new() == []


def test_a_feedback_file_linked_out_of_the_run_is_neither_appended_to_nor_read(tmp_path):
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere.jsonl"
    run.mkdir()
    elsewhere.write_text('{"trajectory_id": "planted#0", "label": "up"}\n')
    feedback_path(run).symlink_to(elsewhere)
    with pytest.raises(OutsideRunDir, match=r"feedback\.jsonl' leads outside the run directory"):
        append_feedback(run, Feedback(trajectory_id="a#0", label="up"))
    assert elsewhere.read_text().count("\n") == 1  # nothing appended there
    reader = FeedbackReader(run)
    assert reader.read_new() == [] and reader.offset == 0
    assert reader.refused is not None and "feedback.jsonl" in reader.refused
    feedback_path(run).unlink()  # the link gone, ratings are written and read again
    append_feedback(run, Feedback(trajectory_id="a#0", label="up", client="127.0.0.1", authenticated=True))
    [rating] = reader.read_new()
    assert (rating.client, rating.authenticated, reader.refused) == ("127.0.0.1", True, None)


# ---------------------------------------------------------------- sources
def _task_line(i: int, env: str = "calc") -> str:
    return Task(id=f"q{i}", env=env, data={"i": i}).model_dump_json() + "\n"


def test_the_file_source_follows_a_growing_file(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text(_task_line(0) + _task_line(1))
    waits: list[str] = []
    source = FileSource(path, {"calc"}, poll_s=0.01, max_wait_s=0.0, on_wait=waits.append)
    assert [t.id for t in source.next_batch(3)] == ["q0@0", "q1@1"]  # acts on what is there
    with path.open("a") as f:
        f.write("not json\n" + _task_line(2, env="shell") + _task_line(3) + _task_line(4)[:10])
    assert [t.id for t in source.next_batch(1)] == ["q3@2"]
    assert source.bad_lines == 2 and "line 4" in (source.last_error or "")
    state = source.state()
    with path.open("a") as f:
        f.write(_task_line(4)[10:] + _task_line(5))
    resumed = FileSource(path, {"calc"}, poll_s=0.01, max_wait_s=0.0)
    resumed.load(json.loads(json.dumps(state)))
    assert [t.id for t in resumed.next_batch(5)] == ["q4@3", "q5@4"]  # the half line, once complete


def test_the_file_source_waits_for_the_first_task(tmp_path):
    path = tmp_path / "later.jsonl"
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 3:
            path.write_text(_task_line(7))

    source = FileSource(path, {"calc"}, poll_s=0.5, max_wait_s=0.0, sleep=sleep)
    assert [t.id for t in source.next_batch(2)] == ["q7@0"]
    assert slept == [0.5, 0.5, 0.5]
    (tmp_path / "adir").mkdir()
    with pytest.raises(DataError, match="is a directory"):
        FileSource(tmp_path / "adir", {"calc"}).next_batch(1)


def test_the_generator_source_draws_fresh_tasks_and_resumes_where_it_stopped():
    config = load_config(ROOT / "configs" / "stream.yaml")
    from horizonrl.envs.factory import make_tasks

    source = GeneratorSource(config, make_tasks)
    first, second = source.next_batch(4), source.next_batch(4)
    assert len({t.id for t in first + second}) == 8
    assert {t.data["question"] for t in first} != {t.data["question"] for t in second}
    again = GeneratorSource(config, make_tasks)
    again.load(source.state())
    third = again.next_batch(4)
    fresh = GeneratorSource(config, make_tasks)
    fresh.next_batch(4), fresh.next_batch(4)
    assert [t.model_dump() for t in third] == [t.model_dump() for t in fresh.next_batch(4)]


def test_self_questioning_feeds_the_stream_new_tasks_only():
    overrides = [
        "env.name=flights",
        "env.options={}",
        "explore.explorer=walk",
        "explore.synthesizer=template",
        "explore.breadth_probes=1",
        "explore.depth_sessions=6",
        "explore.embedding_duplicate=null",
        "rollout.split=test",
        "sft.enabled=false",
    ]
    config = load_config(ROOT / "configs" / "stream.yaml", overrides)
    source = SelfQuestioningSource(config, roles=None)  # the scripted explorer and writer need no model
    batch = source.next_batch(3)
    more = source.next_batch(3)
    queries = [t.data["query"] for t in batch + more]
    assert len(batch) == len(more) == 3 and len(set(queries)) == 6
    assert all(t.env == "flights" and t.data["reference_solution"] for t in batch)
    assert source.rounds >= 1


# ---------------------------------------------------------------- config errors
@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("stream.weights={succes: 1.0}", "unknown signal 'succes'; valid: success, reward"),
        ("stream.feedback.synthetic={speed: 1}", "unknown signal 'speed'"),
        ("stream.weights={tokens: -1.0}", "anchor 'success' has no weight"),
        ("stream.source.kind=file", "needs stream.source.path"),
        ("stream.source.kind=kafka", "generator"),
    ],
)
def test_bad_stream_settings_are_one_line_errors(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")) as info:
        load_config(ROOT / "configs" / "stream.yaml", [override])
    assert "\n" not in str(info.value)


def test_a_bad_preference_file_names_its_line(tmp_path):
    prefs = tmp_path / "prefs.jsonl"
    prefs.write_text(
        '{"preferred": {"success": 1}, "rejected": {"success": 0}}\n{"preferred": {"speed": 1}}\n'
    )
    result = runner.invoke(
        app,
        [
            "stream",
            "configs/stream.yaml",
            f"stream.feedback.preference_file={prefs}",
            "model.path=tiny-random",
        ],
    )
    assert result.exit_code == 2
    assert f"{prefs}:2: not a preference pair" in result.output


# ---------------------------------------------------------------- a real stream process
TINY_STREAM = [
    *TINY_COIN,
    "stream.weights={success: 1.0, finished: 0.0}",
    "stream.feedback.synthetic={success: 1.0}",
    "stream.feedback.synthetic_per_step=4",
]


def stream_proc(tmp_path: Path, *extra: str) -> subprocess.Popen:
    return horizon_process(
        "stream", "configs/stream.yaml", *TINY_STREAM, *extra, f"output_dir={tmp_path}", "name=s"
    )


def test_a_stream_runs_until_sigterm_stops_it_cleanly_and_resumes(tmp_path):
    proc = stream_proc(tmp_path)
    run = tmp_path / "s"
    marker = run / "checkpoints" / "step_000003" / "manifest.json"
    wait_until(proc, marker.exists, "the stream never reached its third update")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-3000:]
    assert "stream stopped by SIGTERM" in out
    summary = json.loads((run / "summary.json").read_text())
    stopped_at = summary["steps"]
    assert stopped_at >= 3 and summary["stream"]["stopped_by"] == "SIGTERM"
    assert (run / "policy" / "horizonrl_policy.json").is_file()  # the policy of the last finished update
    ratings = [json.loads(line) for line in (run / "feedback.jsonl").read_text().splitlines()]
    assert len(ratings) >= 4 * 3 and {r["source"] for r in ratings} == {"synthetic"}
    seen_before = {t for f in (run / "trajectories").glob("*.jsonl") for t in _task_ids(f)}

    resumed = stream_proc(tmp_path, "--resume", f"stream.max_steps={stopped_at + 2}")
    out, _ = resumed.communicate(timeout=240)
    assert resumed.returncode == 0, out[-3000:]
    assert "resumed from" in out and "stream stopped by stream.max_steps" in out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == stopped_at + 2
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "stream/tasks" in r]
    assert steps[-2:] == [stopped_at + 1, stopped_at + 2]
    # the source continued where it stopped: new task ids only, positions counting on
    new = set()
    for step in (stopped_at + 1, stopped_at + 2):
        new |= _task_ids(run / "trajectories" / f"step_{step:06d}.jsonl")
    assert new and not (new & seen_before)
    assert rows[-1]["stream/tasks"] == 2 * (stopped_at + 2)
    # every rating was counted once: none read twice across the resume, none stale
    assert rows[-1]["stream/ratings"] == len((run / "feedback.jsonl").read_text().splitlines())
    assert rows[-1]["stream/stale_ratings"] == 0


def test_sigterm_in_the_middle_of_a_rollout_stops_the_stream_at_once(tmp_path):
    # episodes of the latency env wait 3 s per step: the signal lands while episodes are in flight
    proc = stream_proc(tmp_path, *SLOW_LATENCY, "eval.num_tasks=1")
    run = tmp_path / "s"
    started = run / "trajectories" / "step_000001.jsonl"
    wait_until(proc, started.exists, "the stream never started its first update")
    time.sleep(1.0)
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-3000:]
    assert time.monotonic() - signalled < 20, "the stop waited for the rollout to finish"
    assert "stream stopped by SIGTERM after 0 updates" in out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stream"]["stopped_by"] == "SIGTERM" and summary["steps"] == 0
    assert (run / "checkpoints" / "step_000000").is_dir() and (run / "policy").is_dir()
    assert not (run / "checkpoints" / "step_000001").exists()  # the interrupted update is not trained on


def test_thumbs_over_http_reach_the_running_stream(tmp_path):
    import httpx

    from horizonrl.local_server import free_port

    port = free_port()
    proc = stream_proc(tmp_path, f"--port={port}", "stream.feedback.synthetic=null")
    run = tmp_path / "s"
    first = run / "trajectories" / "step_000001.jsonl"
    try:
        wait_until(
            proc,
            lambda: first.exists() and first.read_text().count("\n") >= 8,
            "the stream never finished its first update",
        )
        ids = [json.loads(line)["id"] for line in first.read_text().splitlines()]
        base = f"http://127.0.0.1:{port}/api"
        run_id = httpx.get(f"{base}/runs").json()[0]["id"]
        liked = httpx.post(f"{base}/runs/{run_id}/feedback", json={"trajectory_id": ids[0], "label": "up"})
        disliked = httpx.post(
            f"{base}/runs/{run_id}/feedback", json={"trajectory_id": ids[1], "label": "down"}
        )
        unknown = httpx.post(
            f"{base}/runs/{run_id}/feedback", json={"trajectory_id": "nope#0", "label": "up"}
        )
        assert liked.status_code == disliked.status_code == 200
        assert unknown.status_code == 404 and "nope#0" in unknown.json()["detail"]

        def metrics() -> list[dict]:
            return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]

        # the next update reads both ratings and moves the weights
        wait_until(
            proc,
            lambda: (metrics() or [{}])[-1].get("stream/ratings", 0) >= 2,
            "the ratings never reached the stream",
        )
        rows = metrics()
        assert rows[-1]["stream/stale_ratings"] == 0 and rows[-1]["stream/weight_updates"] >= 1
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-3000:]
    ratings = [json.loads(line) for line in (run / "feedback.jsonl").read_text().splitlines()]
    # each says who sent it: the viewer's feedback API, from this address, without a token
    senders = {(r["source"], r["client"], r["authenticated"]) for r in ratings}
    assert senders == {("viewer", "127.0.0.1", False)}


def test_a_port_in_use_is_refused_before_the_model_loads(tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = runner.invoke(
            app, ["stream", "configs/stream.yaml", f"--port={port}", f"output_dir={tmp_path}"]
        )
    assert result.exit_code == 2 and f"port {port} on 127.0.0.1 is in use" in result.output
    assert not (tmp_path / "stream_calc").exists()


def _task_ids(path: Path) -> set[str]:
    return {json.loads(line)["task_id"] for line in path.read_text().splitlines() if line.strip()}
