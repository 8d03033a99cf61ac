"""The runs a viewer serves: found again under its paths on each listing (a new run shows up), each
with its trajectory index and metrics, kept between requests so that only appended bytes are read."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from horizonrl.view.index import RunIndex, find_runs, run_ids
from horizonrl.view.runinfo import (
    Metrics,
    ParsedFile,
    finite,
    model_path,
    parse_yaml,
    run_status,
    text_at,
)
from horizonrl.view.summary import LineSummary

T = TypeVar("T")


@dataclass
class RunState:
    """One run directory: its id in URLs, its trajectory index and its metrics."""

    id: str
    path: Path
    index: RunIndex
    metrics: Metrics
    config_file: ParsedFile = field(init=False)
    summary_file: ParsedFile = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _derived: dict[str, tuple[int, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.config_file = ParsedFile(self.path, self.path / "config.yaml", parse_yaml)
        self.summary_file = ParsedFile(self.path, self.path / "summary.json")

    def config(self) -> dict[str, Any]:
        value = self.config_file.get()
        return value if isinstance(value, dict) else {}

    def summary(self) -> dict[str, Any] | None:
        value = self.summary_file.get()
        return value if isinstance(value, dict) else None

    def model(self) -> str | None:
        """The model named by config.yaml (``model.path``) or summary.json (``model``)."""
        return model_path(self.config(), self.summary())

    def refresh(self) -> None:
        """Read what was written since the last request (trajectory lines, metrics lines)."""
        self.index.refresh()
        with self._lock:
            self.metrics.refresh()

    def derived(self, key: str, compute: Callable[[], T]) -> T:
        """``compute()``, computed again only when the index changed since (facets, file counts)."""
        version = self.index.version
        cached = self._derived.get(key)
        if cached is None or cached[0] != version:
            cached = (version, compute())
            self._derived[key] = cached
        return cached[1]

    def summaries(self) -> list[LineSummary]:
        """Every indexed line's summary, in file order."""
        return self.derived("summaries", self.index.summaries)

    def info(self) -> dict[str, Any]:
        """The run's row in the runs table (call :meth:`refresh` first)."""
        config, summary = self.config(), self.summary()
        summaries = self.summaries()
        changes = [f.lines.mtime for f in self.index.files.values()] + [self.metrics.lines.mtime]
        last_change = max((t for t in changes if t is not None), default=None)
        has_output = bool(summaries) or self.metrics.rows > 0
        success, success_from = self._success(summary, summaries)
        envs = Counter(s.env for s in summaries if s.env)
        updated = max((t for t in (last_change, self.summary_file.mtime) if t is not None), default=None)
        return {
            "id": self.id,
            "path": str(self.path),
            "name": text_at(config, "name") or text_at(summary, "name") or self.path.name,
            "env": text_at(config, "env", "name")
            or text_at(summary, "env")
            or (envs.most_common(1)[0][0] if envs else None),
            "model": model_path(config, summary),
            "status": run_status(has_output, summary, last_change),
            "steps": self._steps(summary),
            "success": success,
            "success_from": success_from,
            "trajectories": len(summaries),
            "parse_errors": sum(s.parse_error is not None for s in summaries),
            "files": len(self.index.files),
            "metrics_rows": self.metrics.rows,
            "updated": updated,
        }

    def _steps(self, summary: dict[str, Any] | None) -> int | None:
        steps = finite((summary or {}).get("steps"))
        if steps is None:
            steps = self.metrics.last_step()
        if steps is None:
            numbered = [f.rel for f in self.index.files.values() if f.rel.startswith("trajectories/")]
            steps = len(numbered) or None
        return int(steps) if steps is not None else None

    def _success(self, summary: dict[str, Any] | None, summaries: Sequence[Any]) -> tuple[float | None, str]:
        """The run's latest success rate and where it comes from: the final eval, the last eval in
        metrics, the last training step, or the trajectories on disk."""
        final = finite((summary or {}).get("final_success"))
        if final is not None:
            return final, "final eval"
        for key, label in (("eval/success", "last eval"), ("success_rate", "last step")):
            value = self.metrics.last(key)
            if value is not None:
                return value, label
        rate = finite((summary or {}).get("success_rate"))
        if rate is not None:
            return rate, "summary"
        judged = [s.success for s in summaries if s.success is not None]
        if judged:
            return sum(judged) / len(judged), "trajectories"
        return None, ""


class Catalog:
    """The runs found under the viewer's paths, by id."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.paths = [Path(p) for p in paths]
        self._runs: dict[Path, RunState] = {}
        self._by_id: dict[str, RunState] = {}
        self._lock = threading.Lock()

    def discover(self) -> list[RunState]:
        """Look for runs again (one may have appeared); known runs keep their index."""
        found = find_runs(self.paths)
        with self._lock:
            runs: dict[Path, RunState] = {}
            for (path, _), rid in zip(found, run_ids(found), strict=True):
                key = path.resolve()
                state = self._runs.get(key)
                if state is None or state.id != rid:
                    state = RunState(rid, path, RunIndex(path), Metrics(path / "metrics.jsonl", path))
                runs[key] = state
            for key, state in runs.items():  # a run's nested runs own their files
                state.index.nested = frozenset(
                    other.path for k, other in runs.items() if k != key and key in k.parents
                )
            self._runs = runs
            self._by_id = {state.id: state for state in runs.values()}
            return list(runs.values())

    def get(self, run_id: str) -> RunState | None:
        """The run with this id (looking again when it is not known yet)."""
        with self._lock:
            state = self._by_id.get(run_id)
        if state is None:
            self.discover()
            with self._lock:
                state = self._by_id.get(run_id)
        return state
