"""What the viewer says about a run as a whole: its name, env and model (from ``config.yaml`` and
``summary.json``), whether it is being written, and its metric series (``metrics.jsonl``).

Files are read as they are: a missing or unreadable file is an absent field, a bad metrics line is
counted, never raised, and the line a trainer is still writing is left for the next look. A file
that leads out of the run directory (a symlink, ``..``) is read as missing
(:func:`horizonrl.run_paths.open_inside`).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from horizonrl.run_paths import open_inside
from horizonrl.view.lines import CompleteLines

#: a run whose metrics or trajectory files changed this recently (and has no finished summary) is
#: "running"
RUNNING_WINDOW_S = 60.0


def parse_json(text: str) -> Any:
    return json.loads(text)


def parse_yaml(text: str) -> Any:
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


class ParsedFile:
    """A small file's parsed content, parsed again only when its size or mtime changed; None when
    it is missing, leads out of ``root`` (its run directory) or does not parse (it may be mid-write).
    ``mtime``: the file's modification time at the last look (None when it could not be read)."""

    def __init__(self, root: Path, path: Path, parse: Callable[[str], Any] = parse_json) -> None:
        self.root, self.path, self.parse = root, path, parse
        self._stamp: tuple[int, int] | None = None
        self._value: Any = None
        self.mtime: float | None = None

    def get(self) -> Any:
        try:
            with open_inside(self.root, self.path) as f:
                st = os.fstat(f.fileno())
                stamp = (st.st_mtime_ns, st.st_size)
                if stamp != self._stamp:
                    self._stamp, self._value = stamp, None
                    self._value = self.parse(f.read().decode("utf-8"))
        except OSError:
            self._stamp, self._value, self.mtime = None, None, None
            return None
        except (ValueError, yaml.YAMLError):  # not UTF-8, not JSON/YAML: absent until it changes
            self._value = None
        self.mtime = st.st_mtime
        return self._value


def read_json(root: Path, path: Path) -> Any:
    """The JSON in ``path`` (inside ``root``), or None when it is missing or does not parse."""
    return ParsedFile(root, path).get()


def get_path(mapping: Any, *keys: str) -> Any:
    """``mapping[k1][k2]...``, or None where a level is missing or not a mapping."""
    for key in keys:
        if not isinstance(mapping, dict):
            return None
        mapping = mapping.get(key)
    return mapping


def text_at(mapping: Any, *keys: str) -> str | None:
    """The non-empty string at ``mapping[k1][k2]...`` (None when absent or of another type)."""
    value = get_path(mapping, *keys)
    return value if isinstance(value, str) and value else None


def model_path(config: Any, summary: Any) -> str | None:
    """The model the run samples from: ``model.path`` in config.yaml, else ``model`` in summary.json."""
    return text_at(config, "model", "path") or text_at(summary, "model")


def finite(value: Any) -> float | None:
    """``value`` as a float when it is a finite number (JSON has no NaN or infinity)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def run_status(has_output: bool, summary: Any, last_change: float | None, now: float | None = None) -> str:
    """``"finished"`` when summary.json says ``finished: true``; else ``"running"`` when metrics or
    trajectories changed in the last minute; else ``"finished"`` for a summary without that key (an
    evaluation's), ``"stopped"`` for a run that wrote something, ``"empty"`` for one that wrote nothing."""
    if get_path(summary, "finished") is True:
        return "finished"
    now = time.time() if now is None else now
    if last_change is not None and now - last_change < RUNNING_WINDOW_S:
        return "running"
    if isinstance(summary, dict) and "finished" not in summary:
        return "finished"
    return "stopped" if has_output or summary is not None else "empty"


@dataclass
class Metrics:
    """The series of ``metrics.jsonl``, read incrementally: ``series[key]`` is a list of
    ``[step, value]`` (value None where it was not a finite number); ``root``: its run directory."""

    path: Path
    root: Path
    lines: CompleteLines = field(init=False)
    series: dict[str, list[list[float | None]]] = field(default_factory=dict)
    rows: int = 0
    bad_lines: int = 0

    def __post_init__(self) -> None:
        self.lines = CompleteLines(self.path, self.root)

    def refresh(self) -> None:
        new = self.lines.update()
        if new.reset:
            self.series, self.rows, self.bad_lines = {}, 0, 0
        for raw in new.lines:
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except ValueError:
                row = None
            if not isinstance(row, dict):
                self.bad_lines += 1
                continue
            step = finite(row.get("step"))
            step = self.rows if step is None else int(step) if step.is_integer() else step
            self.rows += 1
            for key, value in row.items():
                if key != "step" and (isinstance(value, int | float) and not isinstance(value, bool)):
                    self.series.setdefault(key, []).append([step, finite(value)])

    def last(self, key: str) -> float | None:
        """The last finite value of a series (None when it has none)."""
        for _, value in reversed(self.series.get(key, [])):
            if value is not None:
                return value
        return None

    def last_step(self) -> float | None:
        steps = [points[-1][0] for points in self.series.values() if points]
        return max((s for s in steps if s is not None), default=None)
