"""What other tools wrote about a trajectory, found by its id in the run directory: step attribution
labels (``attribution/step_NNNNNN.jsonl``), MAST failure modes (``mast.json``) and the user's last
thumbs up/down (``feedback.jsonl``).

Each reader tolerates a missing file, a bad line and a file being written (complete lines only);
an annotation that cannot be read, or whose file leads out of the run directory, is simply absent.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from horizonrl.run_paths import open_inside
from horizonrl.stream.feedback import feedback_path
from horizonrl.view.runinfo import ParsedFile

ATTRIBUTION_DIR = "attribution"
MAST_FILE = "mast.json"


def _complete_json_lines(run_dir: Path, path: Path) -> Iterator[dict[str, Any]]:
    try:
        with open_inside(run_dir, path) as f:
            data = f.read()
    except OSError:
        return
    for raw in data[: data.rfind(b"\n") + 1].splitlines():
        try:
            row = json.loads(raw)
        except ValueError:
            continue
        if isinstance(row, dict):
            yield row


def _attribution_files(run_dir: Path, step: int | str | None) -> list[Path]:
    folder = run_dir / ATTRIBUTION_DIR
    if not folder.is_dir():
        return []
    own = folder / f"step_{step:06d}.jsonl" if isinstance(step, int) else None
    rest = sorted(p for p in folder.glob("*.jsonl") if p != own)
    return [own, *rest] if own is not None and own.is_file() else rest


def attribution_for(run_dir: Path, step: int | str | None, trajectory_id: str) -> dict[str, Any] | None:
    """``{"labels": [...], "file": ...}``: one label (``"GOOD"``/``"BAD"``) per assistant turn, from
    the attribution file of the trajectory's step (else any attribution file that names it)."""
    for path in _attribution_files(run_dir, step):
        for row in _complete_json_lines(run_dir, path):
            labels = row.get("labels")
            if row.get("trajectory_id") == trajectory_id and isinstance(labels, list):
                return {"labels": [str(label).upper() for label in labels], "file": path.name}
    return None


class MastCache:
    """``mast.json`` entries by trajectory id, re-read when the file changes."""

    def __init__(self) -> None:
        self._by_run: dict[Path, tuple[ParsedFile, Any, dict[str, dict[str, Any]]]] = {}

    def entry(self, run_dir: Path, trajectory_id: str) -> dict[str, Any] | None:
        """The entry of ``mast.json`` whose ``trajectory_ids`` holds this id."""
        cached = self._by_run.get(run_dir)
        file, parsed, index = cached or (ParsedFile(run_dir, run_dir / MAST_FILE), None, {})
        data = file.get()
        if data is not parsed:  # parsed again since the last look
            parsed, index = data, _mast_index(data)
        self._by_run[run_dir] = (file, parsed, index)
        return index.get(trajectory_id)


def _mast_index(data: Any) -> dict[str, dict[str, Any]]:
    traces = data.get("traces") if isinstance(data, dict) else None
    out: dict[str, dict[str, Any]] = {}
    for trace in traces if isinstance(traces, list) else []:
        if isinstance(trace, dict):
            for tid in trace.get("trajectory_ids") or []:
                out.setdefault(str(tid), trace)
    return out


def mode_names(entry: dict[str, Any] | None) -> dict[str, dict[str, str]]:
    """The MAST taxonomy's name and definition of each mode a ``mast.json`` entry names."""
    from horizonrl.analysis.mast import MODES

    known = {mode.id: mode for mode in MODES}
    codes = (entry or {}).get("modes") or {}
    return {
        code: {"name": known[code].name, "definition": known[code].definition}
        for code in codes
        if code in known
    }


def feedback_for(run_dir: Path, trajectory_id: str) -> str | None:
    """The last label (``"up"``/``"down"``) given to this trajectory in ``feedback.jsonl``."""
    label = None
    for row in _complete_json_lines(run_dir, feedback_path(run_dir)):
        if row.get("trajectory_id") == trajectory_id and row.get("label") in ("up", "down"):
            label = row["label"]
    return label
