"""Which runs the viewer shows, which of their files hold trajectories, and an index of those files'
lines that is brought up to date on each request by reading only what was appended.

A run directory has any of ``config.yaml``, ``metrics.jsonl``, ``summary.json``, ``trajectories/``,
``eval/`` or trajectory ``*.jsonl`` files; a folder of runs (``runs/``) has run directories up to two
levels below it. In a run, every ``*.jsonl`` file found below it is a trajectory file when it lies
under ``trajectories/`` or ``eval/``, or when its first complete line is an object with ``messages``
and ``prompt_ids``; ``checkpoints/``, ``tb/``, ``.trash``, hidden entries, ``metrics.jsonl`` and
``feedback.jsonl`` are skipped, as are run directories nested in it, and so is a file that leads
out of the run (a symlink to elsewhere): every file is opened through
:func:`horizonrl.run_paths.open_inside`.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from horizonrl.errors import ConfigError
from horizonrl.run_paths import is_inside
from horizonrl.view.lines import CompleteLines, first_complete_line, read_span
from horizonrl.view.summary import LineSummary, check_record, step_label, summarize_line

MARKER_FILES = ("config.yaml", "metrics.jsonl", "summary.json")
MARKER_DIRS = ("trajectories", "eval")
SKIP_DIRS = frozenset({"checkpoints", "tb", ".trash", "policy", "sft_adapter", "__pycache__"})
SKIP_FILES = frozenset({"metrics.jsonl", "feedback.jsonl"})
#: how deep below a run directory trajectory files are looked for
MAX_FILE_DEPTH = 4
ACCEPTED = (
    "a run directory (with config.yaml, metrics.jsonl, summary.json, trajectories/, eval/ or trajectory "
    "*.jsonl files) or a folder of runs such as runs/"
)


def _visible_dirs(folder: Path) -> list[Path]:
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return []
    return [
        Path(e.path)
        for e in entries
        if not e.name.startswith(".") and e.name not in SKIP_DIRS and e.is_dir(follow_symlinks=False)
    ]


def is_trajectory_file(root: Path, path: Path) -> bool | None:
    """Whether a ``*.jsonl`` file (inside ``root``) holds trajectories: its first complete line is an
    object with ``messages`` and ``prompt_ids`` (None while it has no complete line yet)."""
    line = first_complete_line(root, path)
    if line is None:
        return None
    try:
        data = json.loads(line)
    except ValueError:
        return False
    return isinstance(data, dict) and "messages" in data and "prompt_ids" in data


def _has_trajectory_jsonl(folder: Path) -> bool:
    try:
        names = [e.name for e in os.scandir(folder) if e.is_file() and e.name.endswith(".jsonl")]
    except OSError:
        return False
    return any(n not in SKIP_FILES and is_trajectory_file(folder, folder / n) for n in names)


def has_own_content(folder: Path) -> bool:
    """Whether ``folder`` holds a run's output itself (not only a summary of runs below it)."""
    return (
        (folder / "metrics.jsonl").is_file()
        or any((folder / d).is_dir() for d in MARKER_DIRS)
        or _has_trajectory_jsonl(folder)
    )


def is_run_dir(folder: Path) -> bool:
    return any((folder / f).is_file() for f in MARKER_FILES) or has_own_content(folder)


def _runs_below(folder: Path, depth: int) -> list[Path]:
    found: list[Path] = []
    folder_is_run = is_run_dir(folder)
    for child in _visible_dirs(folder):
        if child.name in MARKER_DIRS and folder_is_run:
            continue  # a run's trajectories/ or eval/, not a run of its own
        if is_run_dir(child):
            nested = _runs_below(child, depth - 1) if depth > 1 else []
            if not nested or has_own_content(child):
                found.append(child)
            found.extend(nested)
        elif depth > 1:
            found.extend(_runs_below(child, depth - 1))
    return found


def find_runs(paths: Sequence[Path]) -> list[tuple[Path, Path]]:
    """``(run directory, the argument it was found under)`` for each run the arguments name.

    An argument that is a run directory with no runs below it is one run; otherwise the run
    directories up to two levels below it are (and it too, when it holds output of its own)."""
    out: list[tuple[Path, Path]] = []
    seen: set[Path] = set()
    for root in paths:
        nested = _runs_below(root, 2)
        found = [root] if is_run_dir(root) and (not nested or has_own_content(root)) else []
        for run in [*found, *nested]:
            if run.resolve() not in seen:
                seen.add(run.resolve())
                out.append((run, root))
    return out


def check_run_paths(paths: Sequence[Path]) -> None:
    """Refuse an argument that does not exist or is not a directory (a one-line user error)."""
    for path in paths:
        if not path.exists():
            raise ConfigError(f"RUN_DIR {str(path)!r} does not exist; give {ACCEPTED}")
        if not path.is_dir():
            raise ConfigError(f"RUN_DIR {str(path)!r} is not a directory; give {ACCEPTED}")


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def run_ids(runs: Sequence[tuple[Path, Path]]) -> list[str]:
    """A unique, URL-safe id per run: its path below the argument it was found under (or its name),
    with ``/`` as ``--`` and other unsafe characters as ``-``; clashes get ``-2``, ``-3``."""
    ids: list[str] = []
    seen: set[str] = set()
    for run, root in runs:
        rel = run.relative_to(root).parts if run != root else (run.resolve().name,)
        base = "--".join(_UNSAFE.sub("-", p).strip("-") or "run" for p in rel) or "run"
        rid, n = base, 1
        while rid in seen:
            n += 1
            rid = f"{base}-{n}"
        seen.add(rid)
        ids.append(rid)
    return ids


def _walk_jsonl(
    root: Path, folder: Path, rel: str, depth: int, skip: frozenset[Path]
) -> Iterator[tuple[str, Path]]:
    """``(relative path, path)`` of the ``*.jsonl`` files below ``folder``; symlinked folders are not
    entered and a symlinked file counts only when it leads to a file inside ``root``."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return
    for entry in entries:
        if entry.name.startswith("."):
            continue
        path = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            if entry.name not in SKIP_DIRS and depth > 0 and path not in skip:
                yield from _walk_jsonl(root, path, f"{rel}{entry.name}/", depth - 1, skip)
        elif (
            entry.name.endswith(".jsonl")
            and entry.name not in SKIP_FILES
            and entry.is_file()
            and (not entry.is_symlink() or is_inside(root, path))
        ):
            yield f"{rel}{entry.name}", path


def _file_order(rel: str) -> tuple[int, object, str]:
    """Training steps first (by step), then eval files, then the rest, each by name."""
    step = step_label(rel)
    if isinstance(step, int):
        return (0, step, rel)
    return (1 if step is not None else 2, 0, rel)


@dataclass
class FileIndex:
    """One trajectory file's line summaries, kept up to date by :meth:`refresh`; ``root``: the run
    directory it lies in."""

    rel: str
    path: Path
    root: Path
    lines: CompleteLines = field(init=False)
    summaries: list[LineSummary] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.lines = CompleteLines(self.path, self.root)

    def refresh(self) -> bool:
        """Index the lines appended since the last call; True when anything changed."""
        new = self.lines.update()
        if new.reset:
            self.summaries = []
        step = step_label(self.rel)
        for raw, offset in zip(new.lines, new.offsets, strict=True):
            if not raw.strip():
                continue
            summary = LineSummary(self.rel, len(self.summaries), offset, len(raw), step)
            self.summaries.append(summarize_line(raw, summary))
        return new.reset or bool(new.lines)


@dataclass
class RunIndex:
    """The trajectory files of one run directory and their line summaries.

    :meth:`refresh` finds new files and reads what was appended to known ones; it is safe to call
    from several request threads at once."""

    run_dir: Path
    #: run directories nested in this one, whose files are theirs, not this run's
    nested: frozenset[Path] = frozenset()
    files: dict[str, FileIndex] = field(default_factory=dict)
    _rejected: dict[str, int] = field(default_factory=dict)
    #: changes whenever a summary does (lines added, files gone, a line found not to parse)
    version: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _ids: dict[str, tuple[str, int]] | None = None

    def _is_trajectory_file(self, rel: str, path: Path) -> bool:
        if any(part in MARKER_DIRS for part in rel.split("/")[:-1]):
            return True
        try:
            size = path.stat().st_size
        except OSError:
            return False
        if self._rejected.get(rel) == size:
            return False
        verdict = is_trajectory_file(self.run_dir, path)
        if verdict is False:
            self._rejected[rel] = size
        return bool(verdict)

    def refresh(self) -> None:
        with self._lock:
            present = dict(_walk_jsonl(self.run_dir, self.run_dir, "", MAX_FILE_DEPTH, self.nested))
            known = list(self.files)
            for rel in known:
                if rel not in present:
                    del self.files[rel]
            for rel, path in present.items():
                if rel not in self.files and self._is_trajectory_file(rel, path):
                    self.files[rel] = FileIndex(rel, path, self.run_dir)
            changed = list(self.files) != known
            self.files = dict(sorted(self.files.items(), key=lambda item: _file_order(item[0])))
            for index in self.files.values():
                changed = index.refresh() or changed
            if changed:
                self._ids = None
                self.version += 1

    def read(self, summary: LineSummary) -> tuple[bytes, dict[str, Any] | None, str | None]:
        """One line's bytes, its record (None when not JSON) and its error (None for a valid
        trajectory), checked against the full schema; the summary keeps the error for the table."""
        index = self.files.get(summary.file)
        path = index.path if index is not None else self.run_dir / summary.file
        try:
            raw = read_span(self.run_dir, path, summary.offset, summary.length)
        except OSError as exc:  # removed or replaced since the last look (by a link out: refused)
            return b"", None, f"{summary.file} cannot be read now: {exc.strerror or exc}"
        record, error = check_record(raw)
        if not summary.checked:
            summary.checked = True
            if error is not None and summary.parse_error is None:
                summary.parse_error = error
                self.version += 1
        return raw, record, error

    def summaries(self) -> list[LineSummary]:
        """Every line of every file, in file order (call :meth:`refresh` first)."""
        return [s for index in self.files.values() for s in index.summaries]

    def find_id(self, trajectory_id: str) -> tuple[str, int] | None:
        """``(file, index)`` of the line with this trajectory id (the last one, if repeated)."""
        with self._lock:
            if self._ids is None:
                self._ids = {
                    s.id: (s.file, s.index) for index in self.files.values() for s in index.summaries if s.id
                }
            return self._ids.get(trajectory_id)
