"""`horizon analyze`'s work: detectors (and optionally the annotator role) over every trace of a run,
``mast.json``, prevalence per mode, category, env and role, the change between two runs, a bar chart.

A mode is **present** on a trace when a detector or the judge found it; ``mast.json`` keeps each
source's verdict beside the combined one, so their prevalences can be read apart.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from horizonrl.analysis.annotator import annotate
from horizonrl.analysis.detectors import Verdict, detect
from horizonrl.analysis.mast import CATEGORIES, MODE_IDS, MODES, TAXONOMY_VERSION, category_of
from horizonrl.analysis.trace import Loaded, Trace


def trace_record(
    trace: Trace, detected: dict[str, Verdict], judged: dict[str, Verdict] | None
) -> dict[str, Any]:
    modes: dict[str, dict[str, Any]] = {}
    for mode in MODE_IDS:
        found = [v for v in (detected.get(mode), (judged or {}).get(mode)) if v is not None and v.present]
        if found:
            modes[mode] = {
                "steps": sorted({s for v in found for s in v.steps}),
                "roles": sorted({v.role for v in found if v.role}),
                "reasons": [f"{v.source}: {v.reason}" for v in found if v.reason],
                "sources": [v.source for v in found],
            }
    return {
        "id": trace.id,
        "env": trace.env,
        "roles": trace.roles,
        "finish": trace.finish,
        "success": trace.success,
        "steps": len(trace.steps),
        "trajectory_ids": trace.trajectory_ids,
        "modes": modes,
        "detector": {m: v.present for m, v in detected.items()},
        "judge": {m: v.present for m, v in judged.items()} if judged is not None else None,
    }


def prevalence(records: list[dict[str, Any]], source: str | None = None) -> dict[str, Any]:
    """Share of traces with each mode (and each category: any of its modes), overall, per env and per
    role (a role counts a mode when a verdict names it, or when it is the trace's only role)."""

    def present(record: dict[str, Any], mode: str) -> bool:
        if source is None:
            return mode in record["modes"]
        verdicts = record.get(source) or {}
        return bool(verdicts.get(mode))

    def shares(rows: list[dict[str, Any]], role: str | None = None) -> dict[str, float]:
        n = len(rows)
        out: dict[str, float] = {"traces": float(n)}
        for mode in MODE_IDS:
            hits = [r for r in rows if present(r, mode)]
            if role is not None:
                hits = [
                    r
                    for r in hits
                    if role in r["modes"].get(mode, {}).get("roles", []) or r["roles"] == [role]
                ]
            out[mode] = len(hits) / n if n else 0.0
        for cat in CATEGORIES:
            cat_modes = [m for m in MODE_IDS if category_of(m) == cat]
            out[cat] = sum(any(present(r, m) for m in cat_modes) for r in rows) / n if n else 0.0
        return out

    envs = sorted({r["env"] for r in records})
    roles = sorted({role for r in records for role in r["roles"]})
    return {
        "all": shares(records),
        "per_env": {env: shares([r for r in records if r["env"] == env]) for env in envs},
        "per_role": {role: shares([r for r in records if role in r["roles"]], role) for role in roles},
    }


def analyze(
    loaded: Loaded,
    client: Any = None,
    window_steps: int = 12,
    overlap: int = 2,
    on_trace: Callable[[int], None] | None = None,
    concurrency: int = 16,
) -> dict[str, Any]:
    """Detectors on every trace, then the annotator role (``client``) when given; the ``mast.json``
    content."""
    records: list[dict[str, Any]] = []
    unparsed = windows = 0
    judge_s = 0.0

    async def judge_all() -> list[Any]:
        gate = asyncio.Semaphore(concurrency)  # traces in flight: the engine batches their windows
        done = 0

        async def one(trace: Trace) -> Any:
            nonlocal done
            async with gate:
                annotation = await annotate(trace, client, window_steps, overlap)
            done += 1
            if on_trace is not None:
                on_trace(done)
            return annotation

        return list(await asyncio.gather(*(one(t) for t in loaded.traces)))

    annotations: list[Any] = [None] * len(loaded.traces)
    if client is not None and loaded.traces:
        start = time.perf_counter()
        annotations = asyncio.run(judge_all())
        judge_s = time.perf_counter() - start
    for trace, annotation in zip(loaded.traces, annotations, strict=True):
        judged = annotation.verdicts if annotation is not None else None
        records.append(trace_record(trace, detect(trace), judged))
        if annotation is not None:
            unparsed += annotation.unparsed
            windows += annotation.windows
    result: dict[str, Any] = {
        "version": TAXONOMY_VERSION,
        "source": str(loaded.source),
        "judge": client is not None,
        "traces": records,
        "skipped_lines": loaded.skipped,
        "prevalence": prevalence(records),
        "prevalence_detectors": prevalence(records, "detector"),
    }
    if client is not None:
        result["prevalence_judge"] = prevalence(records, "judge")
        result["judge_windows"] = windows
        result["judge_unparsed_lines"] = unparsed
        result["judge_s"] = judge_s
        result["traces_per_minute"] = len(records) / judge_s * 60 if judge_s else 0.0
    return result


def compare(before: dict[str, Any], after: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per mode and category: prevalence before, after, and the change (after - before)."""
    a, b = before["prevalence"]["all"], after["prevalence"]["all"]
    return {k: {"before": a[k], "after": b[k], "change": b[k] - a[k]} for k in [*MODE_IDS, *CATEGORIES]}


def bar_chart(result: dict[str, Any], out: Path, other: dict[str, Any] | None = None) -> None:
    """Prevalence per mode (and the other run's beside it) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [f"{m.id} {m.name}" for m in MODES]
    fig, ax = plt.subplots(figsize=(9, 5))
    ys = range(len(MODES))
    mine = [result["prevalence"]["all"][m] for m in MODE_IDS]
    if other is None:
        ax.barh(list(ys), mine, color="#4c72b0")
    else:
        theirs = [other["prevalence"]["all"][m] for m in MODE_IDS]
        ax.barh([y - 0.2 for y in ys], theirs, height=0.4, label=Path(other["source"]).name, color="#bbbbbb")
        ax.barh([y + 0.2 for y in ys], mine, height=0.4, label=Path(result["source"]).name, color="#4c72b0")
        ax.legend(loc="lower right")
    ax.set_yticks(list(ys), names)
    ax.invert_yaxis()
    ax.set_xlabel("share of traces")
    ax.set_xlim(0, 1)
    ax.set_title(f"MAST failure modes · {len(result['traces'])} traces")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def write_result(result: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
