"""MLflow and W&B beside ``metrics.jsonl``: checked before the model loads, opened once the run
directory is claimed, fed every logged step, and closed with the run's artifacts.

:func:`check_tracking` refuses, before anything loads, what cannot work: a chosen backend that is not
installed (naming the extra), an MLflow URI that does not answer, W&B online without a login.
:meth:`ExternalTracking.open` starts (or, on ``--resume``, continues) one run per chosen backend;
the run's :class:`~horizonrl.train.tracking.Tracker` hands it each step, after the step is in
``metrics.jsonl``. A backend that fails (at its start, mid-run or at the end) is warned about once
and dropped: training goes on and ``metrics.jsonl`` keeps every step. Which runs a run directory's
steps went to is kept in ``tracking.json``, which a resume continues.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from horizonrl.config import RunConfig
from horizonrl.config.dump import stored_data
from horizonrl.io import write_text_atomic
from horizonrl.train.checkpoint import POLICY_DIR
from horizonrl.train.tracking_extras import import_backend

STATE_FILE = "tracking.json"
#: the artifacts a finished run's backends get, when they exist (the policy/ directory too, by option)
RUN_FILES = ("summary.json", "config.yaml", "metrics.jsonl", "curves.png")


class Backend(Protocol):
    """One external tracking run."""

    name: str

    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def finish(self, status: str, files: list[Path], policy: Path | None, summary: Mapping[str, Any]) -> None:
        """End the run (``status``: FINISHED, KILLED or FAILED); a finished run logs ``files`` and
        ``policy`` (None: not logged) as artifacts and ``summary`` as its summary."""

    def state(self) -> dict[str, Any]:
        """What ``tracking.json`` keeps to continue this run on resume (its id, where it is)."""


def check_tracking(config: RunConfig) -> None:
    """Refuse, before any model loads, a chosen backend that cannot work (one line, exit 2)."""
    if "mlflow" in config.tracking:
        from horizonrl.train.mlflow_backend import check_mlflow

        import_backend("mlflow")
        check_mlflow(config.mlflow)
    if "wandb" in config.tracking:
        from horizonrl.train.wandb_backend import check_wandb

        import_backend("wandb")
        check_wandb(config.wandb)


def read_state(run_dir: Path) -> dict[str, Any]:
    """``tracking.json`` of a run directory (empty when there is none or it is unreadable)."""
    try:
        state = json.loads((run_dir / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


class ExternalTracking:
    """The external backends of a run, each fed every step until it fails (then warned about once).
    ``message`` shows the user a line (where each run is, a backend that failed)."""

    def __init__(self, run_dir: Path, message: Callable[[str], None]) -> None:
        self.run_dir = Path(run_dir)
        self.message = message
        self.backends: list[Backend] = []
        #: backend name -> why it stopped (the first failure)
        self.failed: dict[str, str] = {}
        #: the external backends the recipe chooses (set by :meth:`open`)
        self.chosen: list[str] = []

    def open(self, config: RunConfig, resume: bool) -> None:
        """Start the backends ``config.tracking`` chooses (continuing, on ``resume``, the runs that
        ``tracking.json`` names)."""
        previous = read_state(self.run_dir) if resume else {}
        params = stored_data(config)  # every secret as its reference, never its value
        self.chosen = [name for name in ("mlflow", "wandb") if name in config.tracking]
        for name in self.chosen:
            try:
                if name == "mlflow":
                    from horizonrl.train.mlflow_backend import MlflowBackend as opener
                else:
                    from horizonrl.train.wandb_backend import WandbBackend as opener
                block = getattr(config, name)
                self.backends.append(
                    opener.open(block, config.name, self.run_dir, params, previous.get(name), self.message)
                )
            except Exception as exc:  # a tracking backend never stops training
                self._fail(name, "at its start", exc)
        if self.backends:
            state = read_state(self.run_dir)
            state.update({b.name: b.state() for b in self.backends})
            write_text_atomic(self.run_dir / STATE_FILE, json.dumps(state, indent=2, sort_keys=True))

    def _fail(self, name: str, when: str, exc: BaseException) -> None:
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
        self.failed[name] = f"{when}: {reason}"
        self.backends = [b for b in self.backends if b.name != name]
        self.message(
            f"warning: {name} tracking failed {when} ({reason}); the run goes on without it and "
            "metrics.jsonl keeps every step"
        )

    def log(self, step: int, record: Mapping[str, Any]) -> None:
        """Hand a logged step's finite values to every backend still running."""
        metrics = {
            key: float(value)
            for key, value in record.items()
            if key != "step" and isinstance(value, int | float) and math.isfinite(value)
        }
        for backend in list(self.backends):
            try:
                backend.log(step, metrics)
            except Exception as exc:  # a tracking backend never stops training
                self._fail(backend.name, f"at step {step}", exc)

    def finish(self, status: str, summary: Mapping[str, Any] | None = None) -> None:
        """End every backend's run (``status``: FINISHED, KILLED or FAILED); a finished one gets the
        run's files and its policy as artifacts. A second call finds nothing left to end."""
        files = [self.run_dir / name for name in RUN_FILES if (self.run_dir / name).is_file()]
        policy = self.run_dir / POLICY_DIR if status == "FINISHED" else None
        for backend in list(self.backends):
            try:
                backend.finish(status, files, policy, summary or {})
            except Exception as exc:  # a tracking backend never stops training
                self._fail(backend.name, "at the end", exc)
        self.backends = []

    def summary(self) -> dict[str, Any]:
        """``summary.json``'s ``tracking`` block (each backend's run and, if it failed, why); empty
        when the run has no MLflow or W&B."""
        state = {name: info for name, info in read_state(self.run_dir).items() if isinstance(info, dict)}
        runs = {name: {**state.get(name, {}), "error": self.failed.get(name)} for name in self.chosen}
        return {"tracking": runs} if runs else {}  # error None: every step got there
