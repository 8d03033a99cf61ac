"""`horizon train` / `horizon sft` end to end with the tiny random model on the calc env: the run
directory (metrics, TensorBoard, trajectories, evals, checkpoints, summary, curves), --resume, Ctrl-C,
and bad input (corrupt or mismatched checkpoints, a bad task line) that stops with one clear line and
damages nothing already written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from builders import SLOW_LATENCY, horizon_process, wait_until
from typer.testing import CliRunner

from horizonrl.cli import app
from horizonrl.config import load_config
from horizonrl.envs.calc import CalcEnv
from horizonrl.train import step_loop as step_module
from horizonrl.train.checkpoint import list_checkpoints
from horizonrl.train.tracking import read_metrics
from horizonrl.types import read_trajectories

CALC = "configs/calc.yaml"
TINY = [
    "model.path=tiny-random",
    "sampling.max_new_tokens=12",
    "agent.max_turns=5",
    "eval.num_tasks=3",
    "sft.num_demos=4",
    "sft.batch_size=2",
    "train.tasks_per_step=2",
    "train.group_size=2",
    "train.eval_every=2",
    "train.save_every=1",
    "train.keep_checkpoints=2",
]
runner = CliRunner()


def train(tmp_path: Path, *extra: str, resume: bool = False):
    args = ["train", CALC, *TINY, f"output_dir={tmp_path}", "name=run", *extra]
    return runner.invoke(app, args + (["--resume"] if resume else []))


def snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def test_train_writes_a_complete_run_directory(tmp_path):
    result = train(tmp_path, "train.steps=3")
    assert result.exit_code == 0, result.output
    run_dir = tmp_path / "run"
    assert "held-out success" in result.output and "gain over RL start" in result.output
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in ("base_success", "start_success", "final_success", "wall_s", "peak_rss_gib"):
        assert summary[key] is not None, key
    assert summary["finished"] and summary["steps"] == 3 and summary["sft"] is True
    assert set(summary["evals"]) == {"0", "2", "3"}  # start, every 2 steps, and the last step
    assert 0 < summary["peak_rss_gib"] < 24
    by_stage = summary["peak_rss_gib_by_stage"]
    assert list(by_stage) == ["load", "base_eval", "sft", "start_eval"]
    assert list(by_stage.values()) == sorted(by_stage.values())  # a running peak never falls
    assert by_stage["start_eval"] <= summary["peak_rss_gib"]
    seconds = summary["wall_s_by_stage"]
    assert list(seconds) == ["load", "base_eval", "sft", "start_eval", "rl_rollout", "rl_update", "rl_eval"]
    assert seconds["load"] > 0 and seconds["sft"] > 0, seconds
    # the tiny model's evals (3 tasks) and RL parts can round to 0.0 s
    assert min(seconds.values()) >= 0 and sum(seconds.values()) < summary["wall_s"]
    metrics = read_metrics(run_dir / "metrics.jsonl")
    steps = [m["step"] for m in metrics if "reward_mean" in m]
    assert steps == [1, 2, 3]
    assert all("loss" in m and "rollout_s" in m for m in metrics if "reward_mean" in m)
    assert [m["step"] for m in metrics if "eval_s" in m] == [2, 3]  # the steps with an eval
    evals = [m for m in metrics if "eval/success" in m]
    assert [m["step"] for m in evals] == [0, 2, 3]
    for m in evals:  # each eval point with its 95% interval (Wilson over the 3 held-out tasks)
        assert 0 <= m["eval/success_low"] <= m["eval/success"] <= m["eval/success_high"] <= 1
        assert m["eval/success_high"] - m["eval/success_low"] > 0.4
    assert sorted(summary["eval_intervals"], key=int) == ["0", "2", "3"]
    for m in (m for m in metrics if "reward_mean" in m):  # the pipeline's and engine's figures per step
        assert m["rollout/running_max"] == 4 and m["rollout/failed"] == 0
        assert m["failures/dropped_trajectories"] == 0 and 1 <= m["engine/mean_batch_size"] <= 4
    for step in (1, 2, 3):  # group_size x tasks_per_step trajectories, valid records
        trajs = read_trajectories(run_dir / "trajectories" / f"step_{step:06d}.jsonl")
        assert len(trajs) == 4 and len({t.group_id for t in trajs}) == 2
    assert len(read_trajectories(run_dir / "eval" / "base.jsonl")) == 3
    assert (run_dir / "eval" / "start.jsonl").is_file() and (run_dir / "sft_adapter").is_dir()
    assert [c.name for c in list_checkpoints(run_dir)][-2:] == ["step_000002", "step_000003"]
    assert len(list_checkpoints(run_dir)) == 2  # keep_checkpoints
    assert any((run_dir / "tb").iterdir())
    assert (run_dir / "curves.png").stat().st_size > 1000
    assert load_config(run_dir / "config.yaml").train.steps == 3


def test_the_demonstration_term_trains_on_the_sft_demos_in_every_step_and_after_a_resume(
    tmp_path, monkeypatch
):
    real_update = step_module.train_step
    given: list[int] = []

    def stopped_at_step_2(*args, **kwargs):
        given.append(len(kwargs["demos"]))
        if len(given) == 2:
            raise KeyboardInterrupt
        return real_update(*args, **kwargs)

    recipe = ("train.steps=2", "train.save_every=0", "train.demo_coef=0.5", "train.demo_batch=3")
    monkeypatch.setattr(step_module, "train_step", stopped_at_step_2)
    assert train(tmp_path, *recipe).exit_code == 130
    monkeypatch.setattr(step_module, "train_step", real_update)
    resumed = train(tmp_path, *recipe, resume=True)
    assert resumed.exit_code == 0, resumed.output
    assert given == [4, 4]  # sft.num_demos oracle episodes, all of them successful
    steps = [m for m in read_metrics(tmp_path / "run" / "metrics.jsonl") if "reward_mean" in m]
    assert [m["step"] for m in steps] == [1, 2]
    for m in steps:  # the term ran in each step, after the resume too (the oracle demos again)
        assert m["demo_nll"] > 0 and m["demo_loss"] == pytest.approx(0.5 * m["demo_nll"], rel=1e-6)
    refused = train(
        tmp_path, "train.demo_coef=0.5", "runtime.backend=ray", "runtime.trainer_ranks=1", "name=ranks"
    )
    assert refused.exit_code == 2 and "runtime.trainer_ranks" in refused.output
    assert not (tmp_path / "ranks").exists()


def test_resume_continues_from_the_latest_checkpoint(tmp_path):
    assert train(tmp_path, "train.steps=2").exit_code == 0
    run_dir = tmp_path / "run"
    base_eval = (run_dir / "eval" / "base.jsonl").read_bytes()
    # the same recipe with more steps is refused without --resume, then continues with it
    again = train(tmp_path, "train.steps=2")
    assert again.exit_code == 2 and "--resume" in again.output
    result = train(tmp_path, "train.steps=2", resume=True)
    assert result.exit_code == 0, result.output
    assert "resumed from" in result.output
    assert (run_dir / "eval" / "base.jsonl").read_bytes() == base_eval  # no stage repeated
    steps = [m["step"] for m in read_metrics(run_dir / "metrics.jsonl") if "reward_mean" in m]
    assert steps == [1, 2]  # nothing left to do: no duplicate step lines


def test_overwrite_starts_afresh_and_cannot_be_combined_with_resume(tmp_path):
    assert train(tmp_path, "train.steps=1", "sft.enabled=false").exit_code == 0
    run_dir = tmp_path / "run"
    (run_dir / "stale.txt").write_text("from an earlier run")
    result = train(tmp_path, "train.steps=1", "sft.enabled=false", "--overwrite")
    assert result.exit_code == 0, result.output
    assert not (run_dir / "stale.txt").exists() and (run_dir / "summary.json").is_file()
    both = train(tmp_path, "train.steps=1", "sft.enabled=false", "--overwrite", resume=True)
    assert both.exit_code == 2 and "--resume" in both.output and "--overwrite" in both.output
    assert (run_dir / "summary.json").is_file()  # refused before touching anything


def test_ctrl_c_leaves_a_resumable_run(tmp_path, monkeypatch):
    real_update = step_module.train_step
    calls = {"n": 0}

    def interrupted_update(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real_update(*args, **kwargs)

    monkeypatch.setattr(step_module, "train_step", interrupted_update)
    result = train(tmp_path, "train.steps=4", "train.save_every=0")
    assert result.exit_code == 130
    run_dir = tmp_path / "run"
    assert list_checkpoints(run_dir)[-1].name == "step_000002"  # the last finished step was saved
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["finished"] is False and summary["steps"] == 2
    monkeypatch.setattr(step_module, "train_step", real_update)
    resumed = train(tmp_path, "train.steps=4", "train.save_every=0", resume=True)
    assert resumed.exit_code == 0, resumed.output
    steps = [m["step"] for m in read_metrics(run_dir / "metrics.jsonl") if "reward_mean" in m]
    assert steps == [1, 2, 3, 4]
    assert json.loads((run_dir / "summary.json").read_text())["finished"] is True


def test_corrupt_checkpoint_on_resume_is_named_and_nothing_is_damaged(tmp_path):
    assert train(tmp_path, "train.steps=1").exit_code == 0
    run_dir = tmp_path / "run"
    latest = list_checkpoints(run_dir)[-1]
    weights = next(p for p in latest.rglob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:100])  # a truncated file
    before = snapshot(run_dir)
    result = train(tmp_path, "train.steps=2", resume=True)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    message = result.output.replace("\n", "")  # rich wraps long lines
    assert latest.name in message and weights.name in message and "corrupt" in message
    assert snapshot(run_dir) == before


def test_resume_with_a_different_recipe_is_refused(tmp_path):
    assert train(tmp_path, "train.steps=1").exit_code == 0
    before = snapshot(tmp_path / "run")
    result = train(tmp_path, "train.steps=1", "train.group_size=3", resume=True)
    assert result.exit_code == 2 and "'train'" in result.output and "Traceback" not in result.output
    assert snapshot(tmp_path / "run") == before


def test_resume_without_checkpoints_is_a_clear_error(tmp_path):
    result = train(tmp_path, "train.steps=1", resume=True)
    assert result.exit_code == 2 and "no finished checkpoint" in result.output


def test_bad_task_line_stops_training_before_anything_runs(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    good = CalcEnv.make_tasks("train", 1, 0, CalcEnv.Options())[0]
    tasks.write_text(good.model_dump_json() + "\n{not json\n")
    result = train(tmp_path, "train.steps=1", f"env.tasks_file={tasks}")
    assert result.exit_code == 2 and "tasks.jsonl:2" in result.output, result.output
    assert not list_checkpoints(tmp_path / "run")


@pytest.mark.parametrize("demos", ["oracle", "file"])
def test_sft_saves_an_adapter_that_eval_loads(tmp_path, demos):
    extra = ["sft.num_demos=4", "sft.batch_size=2", f"output_dir={tmp_path}", "name=s"]
    if demos == "file":
        rollout = runner.invoke(app, ["rollout", CALC, *TINY, "--n", "2", "--out", str(tmp_path / "d.jsonl")])
        assert rollout.exit_code == 0, rollout.output
        extra += [f"sft.demos={tmp_path / 'd.jsonl'}", "sft.only_successful=false"]
    result = runner.invoke(app, ["sft", CALC, *TINY, *extra])
    assert result.exit_code == 0, result.output
    out = tmp_path / "s" / "sft"
    assert (out / "adapter_config.json").is_file()
    evaluate = ["eval", CALC, *TINY, "--checkpoint", str(out), "--out", str(tmp_path / "e.jsonl")]
    ev = runner.invoke(app, evaluate)
    assert ev.exit_code == 0, ev.output


def test_sft_on_a_demo_file_with_a_bad_line_names_it(tmp_path):
    bad = tmp_path / "demos.jsonl"
    bad.write_text('{"id": "x"}\n')
    result = runner.invoke(app, ["sft", CALC, *TINY, f"sft.demos={bad}", f"output_dir={tmp_path}"])
    assert result.exit_code == 2 and "demos.jsonl:1" in result.output, result.output


class _BrokenScoringCalc(CalcEnv):
    """The calc env whose reward computation always raises (a broken test harness, say)."""

    name = "calc_broken_eval"

    async def evaluate(self):
        raise RuntimeError("the reward harness crashed")


@pytest.mark.parametrize("policy", ["drop_trajectory", "drop_group", "zero_reward"])
def test_a_step_whose_trajectories_all_fail_goes_on_under_each_failure_policy(tmp_path, policy):
    """Every trajectory of every step fails in the eval stage: the run does not stop; each record
    says why (finish error, the stage and the message); the dropping policies make no update and
    the metrics count the failures; zero_reward trains on them with reward 0."""
    result = train(
        tmp_path,
        f"env.name={__name__}:_BrokenScoringCalc",  # by module:Class, so no registration leaks out
        "sft.enabled=false",
        "train.steps=2",
        f"rollout.on_failure={policy}",
    )
    assert result.exit_code == 0, result.output
    run_dir = tmp_path / "run"
    trajs = read_trajectories(run_dir / "trajectories" / "step_000001.jsonl")
    assert len(trajs) == 4
    assert all(
        t.finish == "error" and "the eval stage failed" in t.error and "harness crashed" in t.error
        for t in trajs
    )
    steps = [m for m in read_metrics(run_dir / "metrics.jsonl") if "reward_mean" in m]
    assert [m["step"] for m in steps] == [1, 2]
    for m in steps:
        assert m["rollout/failed"] == 4 and m["rollout/failed_eval"] == 4 and m["failures/error"] == 4
        if policy == "zero_reward":
            assert m["failures/dropped_trajectories"] == 0
        else:
            assert m["failures/dropped_trajectories"] == 4 and m["update_skipped"] == 1.0
    if policy == "drop_group":
        assert all(m["failures/dropped_groups"] == 2 for m in steps)


def test_sigterm_in_the_middle_of_a_rollout_stops_training_at_once(tmp_path):
    """A real signal to a real `horizon train` process while episodes are in flight (the latency
    env waits 3 s per step): the run stops within seconds, keeping its last checkpoint, instead of
    the rollout absorbing the interrupt and the run going on."""
    import signal
    import time

    settings = [
        "model.path=tiny-random",
        *SLOW_LATENCY,
        "sampling.max_new_tokens=8",
        "eval.num_tasks=1",
        "sft.enabled=false",
        "train.steps=3",
        "train.tasks_per_step=2",
        "train.group_size=2",
        "train.eval_every=0",
        f"output_dir={tmp_path}",
        "name=run",
    ]
    proc = horizon_process("train", CALC, *settings)
    started = tmp_path / "run" / "trajectories" / "step_000001.jsonl"
    wait_until(proc, started.exists, "training never started its first step")
    time.sleep(1.0)
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert time.monotonic() - signalled < 20, "the stop waited for the rollout to finish"
    assert proc.returncode == 130, out[-3000:]
    assert "interrupted" in out
    assert [c.name for c in list_checkpoints(tmp_path / "run")] == ["step_000000"]
