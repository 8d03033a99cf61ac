"""The same eval tasks before and after training, from a run's eval files.

"Before" is ``eval/base.jsonl`` (the model as loaded), else ``eval/start.jsonl`` (after the warm
start), else the earliest eval file; "after" is the latest ``eval/step_*.jsonl``. A task is compared
when both files hold it (its first line in each, when sampled more than once).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from horizonrl.view.summary import LineSummary

_STEP_FILE = re.compile(r"^eval/step_(\d+)\.jsonl$")


def _mtime(path: Path) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def before_after(eval_files: Mapping[str, Path]) -> tuple[str, str] | None:
    """``(before, after)`` among a run's eval files (relative path -> path), or None when there is
    no training-step eval or nothing earlier to hold it against."""
    top = {rel: path for rel, path in eval_files.items() if rel.startswith("eval/") and rel.count("/") == 1}
    steps = {rel: _STEP_FILE.match(rel) for rel in top}
    numbered = {rel: int(m.group(1)) for rel, m in steps.items() if m}
    if not numbered:
        return None
    after = max(numbered, key=lambda rel: (numbered[rel], _mtime(top[rel])))
    if "eval/base.jsonl" in top:
        before = "eval/base.jsonl"
    elif "eval/start.jsonl" in top:
        before = "eval/start.jsonl"
    else:
        before = min(top, key=lambda rel: (_mtime(top[rel]), rel))
    return (before, after) if before != after else None


def first_per_task(summaries: Iterable[LineSummary]) -> dict[str, LineSummary]:
    out: dict[str, LineSummary] = {}
    for s in summaries:
        if s.task_id is not None and s.parse_error is None:
            out.setdefault(s.task_id, s)
    return out


def _change(before: bool, after: bool) -> str:
    return "fixed" if after and not before else "broke" if before and not after else "same"


def task_pairs(before: Iterable[LineSummary], after: Iterable[LineSummary]) -> list[dict[str, Any]]:
    """One row per task present in both: reward and success before and after, and where each is."""
    first, last = first_per_task(before), first_per_task(after)
    rows = []
    for task_id in sorted(first.keys() & last.keys()):
        b, a = first[task_id], last[task_id]
        rows.append(
            {
                "task_id": task_id,
                "before": {"reward": b.reward, "success": b.success, "file": b.file, "index": b.index},
                "after": {"reward": a.reward, "success": a.success, "file": a.file, "index": a.index},
                "change": _change(bool(b.success), bool(a.success)),
            }
        )
    return rows


def pair_totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Success before and after over the compared tasks, and how many each way changed."""
    n = len(rows)
    return {
        "tasks": n,
        "before_success": sum(bool(r["before"]["success"]) for r in rows) / n if n else None,
        "after_success": sum(bool(r["after"]["success"]) for r in rows) / n if n else None,
        "fixed": sum(r["change"] == "fixed" for r in rows),
        "broke": sum(r["change"] == "broke" for r in rows),
    }
