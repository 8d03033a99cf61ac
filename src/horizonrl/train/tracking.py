"""Metrics of a training run: ``metrics.jsonl``, TensorBoard events and a PNG of the learning curves.

A run directory holds ``metrics.jsonl`` (one JSON object per logged step, keys sorted, always with
``"step"``) and TensorBoard event files under ``tb/``. Every line is flushed and fsynced as it is
logged, so a crash loses no logged step; at worst it leaves a truncated last line, which readers
skip. Resuming at step N drops everything logged after N from both the JSON log and TensorBoard,
so a resumed run never shows two values for one step.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from horizonrl.errors import DataError
from horizonrl.io import atomic_path, write_text_atomic

METRICS_FILE = "metrics.jsonl"
TB_DIR = "tb"
CURVES_FILE = "curves.png"


def _parse_lines(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """Parse ``path`` into ``(raw line, record)`` pairs, skipping blank lines and a truncated last line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"Metrics file {str(path)!r} does not exist.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"Cannot read metrics file {str(path)!r}: {exc}") from exc
    lines = text.splitlines()
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    records: list[tuple[str, dict[str, Any]]] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if i == last:  # a crash while appending can leave a partial last line
                break
            raise DataError(f"{path}:{i + 1}: corrupt metrics line (invalid JSON: {exc.msg}).") from exc
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise DataError(f"{path}:{i + 1}: a metrics line must be a JSON object with an integer 'step'.")
        records.append((line, record))
    return records


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Read a ``metrics.jsonl`` file into a list of records (``None`` stands for a non-finite value).

    A truncated final line (left by a crash) is skipped; a corrupt line elsewhere raises
    :class:`DataError` naming the file and line number.
    """
    return [record for _, record in _parse_lines(Path(path))]


def _json_value(key: str, value: Any) -> Any:
    """Convert a metric value for JSON: numbers stay numbers, non-finite floats become ``None``."""
    if value is None or isinstance(value, bool):
        return value
    if not isinstance(value, numbers.Real) and hasattr(value, "item"):  # 0-d tensors / arrays
        value = value.item()
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)
        return value if math.isfinite(value) else None
    raise TypeError(f"metric {key!r} must be a number or None, got {type(value).__name__}")


def _wait_past_event_files(tb_dir: Path) -> None:
    """Wait (under a second) until the clock is past the newest event file's second. TensorBoard
    replays a log directory's files in name order, and a name is ``events.out.tfevents.<second>.
    <host>.<pid>.<counter>``: a resumed run's file made in the same second as the one before it may
    sort first (counter 10 before 9), and its purge of the later steps would then be undone."""
    seconds = []
    for path in tb_dir.glob("events.out.tfevents.*"):
        field = path.name.split(".")[3]
        if field.isdigit():
            seconds.append(int(field))
    newest = max(seconds, default=0)
    while int(time.time()) <= newest:
        time.sleep(0.02)


class Tracker:
    """Log per-step metrics of a run to ``run_dir/metrics.jsonl`` and TensorBoard (``run_dir/tb``).

    With ``resume_step`` the existing log is cut back to steps ``<= resume_step`` (atomically) and
    TensorBoard events after it are purged; without it an existing log is started afresh.
    """

    def __init__(
        self,
        run_dir: Path,
        resume_step: int | None = None,
        tensorboard: bool = True,
        sinks: Sequence[Any] = (),
    ) -> None:
        """``sinks``: more places each step goes after it is in the log (MLflow, W&B: objects with
        ``log(step, record)`` that never raise, :mod:`horizonrl.train.tracking_backends`)."""
        self.run_dir = Path(run_dir)
        self._sinks = list(sinks)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        if resume_step is not None and self.path.exists():
            self._truncate_after(resume_step)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        else:
            self._file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._writer: Any = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge = None if resume_step is None else resume_step + 1
            _wait_past_event_files(self.run_dir / TB_DIR)
            self._writer = SummaryWriter(log_dir=str(self.run_dir / TB_DIR), purge_step=purge)

    def _truncate_after(self, step: int) -> None:
        """Atomically rewrite the log keeping only records with ``step <= step``."""
        kept = [line for line, record in _parse_lines(self.path) if record["step"] <= step]
        write_text_atomic(self.path, "".join(line + "\n" for line in kept))

    def log(self, step: int, metrics: Mapping[str, float | int | None]) -> None:
        """Append ``{"step": step, **metrics}`` durably and write finite values as TensorBoard scalars."""
        if self._file.closed:
            raise RuntimeError("Tracker is closed")
        if "step" in metrics:
            raise ValueError("'step' is reserved: pass it as the step argument, not as a metric")
        record: dict[str, Any] = {"step": int(step)}
        record.update({key: _json_value(key, value) for key, value in metrics.items()})
        self._file.write(json.dumps(record, sort_keys=True, allow_nan=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        if self._writer is not None:
            for key, value in record.items():
                if key != "step" and value is not None:
                    self._writer.add_scalar(key, float(value), global_step=int(step))
            self._writer.flush()
        for sink in self._sinks:
            sink.log(int(step), record)

    def close(self) -> None:
        """Close the log file and the TensorBoard writer (idempotent)."""
        if not self._file.closed:
            self._file.close()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> Tracker:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _series(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """The steps and finite values of ``key`` (records without it, or with null, are skipped)."""
    steps, values = [], []
    for record in records:
        value = record.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            steps.append(record["step"])
            values.append(float(value))
    return steps, values


def draw_interval(
    ax: Any, records: list[dict[str, Any]], key: str, color: Any = None, label: str | None = "95% interval"
) -> bool:
    """Draw the 95% intervals ``<key>_low`` .. ``<key>_high`` of a series on ``ax`` as error bars
    joined by a shaded band; False when no record carries one."""
    lows = dict(zip(*_series(records, f"{key}_low"), strict=True))
    highs = dict(zip(*_series(records, f"{key}_high"), strict=True))
    steps, values = _series(records, key)
    points = [(s, v) for s, v in zip(steps, values, strict=True) if s in lows and s in highs]
    if not points:
        return False
    xs, ys = [s for s, _ in points], [v for _, v in points]
    lo, hi = [lows[s] for s in xs], [highs[s] for s in xs]
    below = [max(0.0, y - low) for y, low in zip(ys, lo, strict=True)]
    above = [max(0.0, h - y) for y, h in zip(ys, hi, strict=True)]
    ax.fill_between(xs, lo, hi, color=color, alpha=0.15, linewidth=0, label=label)
    ax.errorbar(xs, ys, yerr=[below, above], fmt="none", ecolor=color, elinewidth=1, capsize=3)
    return True


def plot_curves(run_dir: Path, out: Path | None = None) -> Path:
    """Plot training reward / success rate and held-out success of a run (with its 95% intervals
    as error bars and a band where the metrics carry ``eval/success_low``/``_high``); return the
    PNG's path.

    Reads ``run_dir/metrics.jsonl`` and writes ``out`` (default ``run_dir/curves.png``) atomically,
    so a viewer never sees a half-written image. Panels without data say "no data yet".
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    run_dir = Path(run_dir)
    out = Path(out) if out is not None else run_dir / CURVES_FILE
    records = read_metrics(run_dir / METRICS_FILE)

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    try:
        panels = (
            (
                left,
                "training reward",
                "reward / success rate",
                [("reward_mean", "reward (mean)", "-"), ("success_rate", "success rate", "--")],
            ),
            (right, "held-out success", "success rate", [("eval/success", "held-out success", "o-")]),
        )
        for ax, title, ylabel, lines in panels:
            drawn = False
            for key, label, style in lines:
                steps, values = _series(records, key)
                if steps:
                    (line,) = ax.plot(steps, values, style, label=label)
                    draw_interval(ax, records, key, line.get_color())
                    drawn = True
            if drawn:
                ax.legend(loc="best")
            else:
                ax.text(0.5, 0.5, "no data yet", transform=ax.transAxes, ha="center", va="center", c="gray")
            ax.set_title(title)
            ax.set_xlabel("step")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.3)
        fig.tight_layout()
        out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(out) as tmp:
            fig.savefig(tmp, format="png", dpi=120)
    finally:
        plt.close(fig)
    return out
