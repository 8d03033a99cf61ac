"""Metric tracking: durable metrics.jsonl, resume truncation, TensorBoard events and the curves PNG."""

from __future__ import annotations

import json
import math

import pytest

from horizonrl.errors import DataError
from horizonrl.train.tracking import Tracker, plot_curves, read_metrics

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _tb_scalars(run_dir) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_log_writes_sorted_json_lines_and_tensorboard(tmp_path):
    with Tracker(tmp_path) as tracker:
        tracker.log(1, {"reward_mean": 0.5, "loss": 2.0, "eval/success": None})
        tracker.log(2, {"reward_mean": 0.75, "eval/success": 1})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert lines[0] == json.dumps({"eval/success": None, "loss": 2.0, "reward_mean": 0.5, "step": 1})
    assert read_metrics(tmp_path / "metrics.jsonl") == [
        {"step": 1, "reward_mean": 0.5, "loss": 2.0, "eval/success": None},
        {"step": 2, "reward_mean": 0.75, "eval/success": 1},
    ]
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    scalars = _tb_scalars(tmp_path)
    assert scalars["reward_mean"] == [(1, 0.5), (2, 0.75)]
    assert scalars["eval/success"] == [(2, 1.0)]  # None is not written to TensorBoard


def test_non_finite_values_become_null(tmp_path):
    with Tracker(tmp_path, tensorboard=False) as tracker:
        tracker.log(0, {"loss": math.nan, "kl": math.inf, "reward_mean": 1.0})
    text = (tmp_path / "metrics.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"step": 0, "loss": None, "kl": None, "reward_mean": 1.0}
    assert not (tmp_path / "tb").exists()


def test_log_rejects_bad_values(tmp_path):
    with Tracker(tmp_path, tensorboard=False) as tracker:
        with pytest.raises(TypeError, match="'note'"):
            tracker.log(0, {"note": "hello"})
        with pytest.raises(ValueError, match="step"):
            tracker.log(0, {"step": 3})


def test_resume_drops_later_steps_and_fresh_start_truncates(tmp_path):
    with Tracker(tmp_path) as tracker:
        for step in range(1, 6):
            tracker.log(step, {"reward_mean": float(step)})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"reward_mean": 6.0, "st')  # a crash mid-append
    with Tracker(tmp_path, resume_step=3) as tracker:
        tracker.log(4, {"reward_mean": 40.0})
    assert [(r["step"], r["reward_mean"]) for r in read_metrics(tmp_path / "metrics.jsonl")] == [
        (1, 1.0),
        (2, 2.0),
        (3, 3.0),
        (4, 40.0),
    ]
    assert not list(tmp_path.glob(".metrics.jsonl.tmp-*"))
    assert _tb_scalars(tmp_path)["reward_mean"] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]

    with Tracker(tmp_path, tensorboard=False) as tracker:
        tracker.log(1, {"reward_mean": -1.0})
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": 1, "reward_mean": -1.0}]


def test_resume_without_existing_log(tmp_path):
    with Tracker(tmp_path / "new", resume_step=7, tensorboard=False) as tracker:
        tracker.log(8, {"loss": 1.0})
    assert read_metrics(tmp_path / "new" / "metrics.jsonl") == [{"step": 8, "loss": 1.0}]


def test_read_metrics_tolerates_truncated_last_line_only(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 1.0}\n\n{"step": 2, "loss": 0.5}\n{"step": 3, "lo')
    assert [r["step"] for r in read_metrics(path)] == [1, 2]
    path.write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "lo\n{"step": 3, "loss": 0.5}\n')
    with pytest.raises(DataError, match=r"metrics\.jsonl:2: corrupt"):
        read_metrics(path)
    path.write_text('{"loss": 1.0}\n')
    with pytest.raises(DataError, match=r":1: .*'step'"):
        read_metrics(path)
    with pytest.raises(DataError, match="does not exist"):
        read_metrics(tmp_path / "missing.jsonl")


def test_plot_curves_with_and_without_eval_data(tmp_path):
    with Tracker(tmp_path, tensorboard=False) as tracker:
        tracker.log(1, {"reward_mean": 0.1, "success_rate": 0.0})
        tracker.log(2, {"reward_mean": math.nan, "success_rate": 0.5})
    out = plot_curves(tmp_path)
    assert out == tmp_path / "curves.png"
    first = out.read_bytes()
    assert first.startswith(PNG_MAGIC) and len(first) > 1000

    with Tracker(tmp_path, resume_step=2, tensorboard=False) as tracker:
        tracker.log(3, {"reward_mean": 0.4, "success_rate": 0.5, "eval/success": 0.25})
        tracker.log(4, {"reward_mean": 0.6})
        tracker.log(5, {"eval/success": 0.5})
    custom = plot_curves(tmp_path, out=tmp_path / "plots" / "c.png")
    assert custom == tmp_path / "plots" / "c.png"
    assert custom.read_bytes().startswith(PNG_MAGIC)
    assert not list(tmp_path.glob("**/.*.tmp-*"))


def test_plot_curves_empty_log(tmp_path):
    Tracker(tmp_path, tensorboard=False).close()
    assert plot_curves(tmp_path).read_bytes().startswith(PNG_MAGIC)


def test_a_resumed_writer_sorts_after_the_files_before_it_whatever_their_counter(tmp_path, monkeypatch):
    """TensorBoard replays event files in name order; writers made in one second differ only by a
    per-process counter, where "10" sorts before "9". The resumed file must still come last."""
    from tensorboard.summary.writer import event_file_writer

    # the process's writer counter where a full test session may find it: the next two are 9 and 10
    monkeypatch.setattr(event_file_writer, "_global_uid", event_file_writer.AtomicCounter(9))
    with Tracker(tmp_path) as tracker:
        for step in range(1, 4):
            tracker.log(step, {"reward_mean": float(step)})
    with Tracker(tmp_path, resume_step=1) as tracker:
        tracker.log(2, {"reward_mean": 20.0})
    files = sorted(p.name for p in (tmp_path / "tb").glob("events.out.tfevents.*"))
    assert [name.rsplit(".", 1)[1] for name in files] == ["9", "10"]  # the second, by time
    assert _tb_scalars(tmp_path)["reward_mean"] == [(1, 1.0), (2, 20.0)]
