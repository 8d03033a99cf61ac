"""``horizon swe eval``: SWE-bench predictions in, a per-instance report and a summary out.

Predictions are SWE-bench's format, one JSON object per line: ``instance_id``,
``model_name_or_path``, ``model_patch``. Each is evaluated in its own sandboxes
(:meth:`SWERuntime.evaluate`), ``workers`` at a time. A bad line or a prediction for an unknown
instance becomes an ``error`` entry in the report with the reason; the evaluation goes on.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from statistics import median

from pydantic import BaseModel, ConfigDict, ValidationError

from horizonrl.envs.swe.evaluate import EvalReport, SWERuntime
from horizonrl.envs.swe.instances import Dataset
from horizonrl.errors import DataError


class Prediction(BaseModel):
    model_config = ConfigDict(extra="allow")

    instance_id: str
    model_name_or_path: str = ""
    model_patch: str | None = None


def read_predictions(path: Path) -> tuple[list[Prediction], list[EvalReport]]:
    """The predictions of a JSONL file, and an error report for each line that is not one."""
    if not path.exists():
        raise DataError(f"no predictions file {path}")
    predictions, bad = [], []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            predictions.append(Prediction.model_validate_json(line))
        except ValidationError as exc:
            reason = exc.errors()[0].get("msg", str(exc))
            bad.append(
                EvalReport(instance_id=f"<line {number}>", status="error", error=f"{path}:{number}: {reason}")
            )
    return predictions, bad


def gold_predictions(dataset: Dataset, split: str = "all") -> list[Prediction]:
    """The dataset's own fixes as predictions (every one must resolve its instance)."""
    return [
        Prediction(instance_id=i.instance_id, model_name_or_path="gold", model_patch=i.patch)
        for i in dataset.split(split)
    ]


async def evaluate_predictions(
    dataset: Dataset,
    predictions: list[Prediction],
    workers: int = 2,
    on_report: Callable[[EvalReport], None] | None = None,
    runtime: SWERuntime | None = None,
) -> list[EvalReport]:
    """Evaluate each prediction (``workers`` in parallel); reports in the predictions' order."""
    runtime = runtime or SWERuntime(dataset)
    limit = asyncio.Semaphore(workers)

    async def one(prediction: Prediction) -> EvalReport:
        async with limit:
            if prediction.instance_id not in dataset.instances:
                report = EvalReport(
                    instance_id=prediction.instance_id,
                    status="error",
                    error=f"unknown instance {prediction.instance_id!r} (not in {dataset.root})",
                )
            else:
                instance = dataset.instances[prediction.instance_id]
                report = await runtime.evaluate(instance, prediction.model_patch or "")
            if on_report is not None:
                on_report(report)
            return report

    try:
        return await asyncio.gather(*(one(p) for p in predictions))
    finally:
        await runtime.aclose()


def summarize(reports: list[EvalReport]) -> dict[str, object]:
    counts = Counter(r.status for r in reports)
    times = [r.seconds for r in reports if r.seconds]
    total = len(reports)
    return {
        "instances": total,
        **{
            status: counts.get(status, 0)
            for status in ("resolved", "partial", "unresolved", "apply_failed", "error")
        },
        "resolved_rate": counts.get("resolved", 0) / total if total else 0.0,
        "median_eval_s": round(median(times), 3) if times else 0.0,
    }


def write_report(path: Path, reports: list[EvalReport], summary: dict[str, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for report in reports:
            handle.write(report.model_dump_json(exclude={"log"}) + "\n")
    path.with_suffix(".summary.json").write_text(json.dumps(summary, indent=2) + "\n")
