"""Agreement of verdicts with hand labels: Cohen's κ and accuracy per mode and over all decisions.

A labels file holds one JSON object per line: ``{"id": <trace id>, "modes": {"1.1": 0, ..., "3.3":
1}}`` with a 0/1 for every mode (``"note"`` optional). Unknown mode ids are an error naming them and
the valid ids.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from horizonrl.analysis.mast import MODE_IDS
from horizonrl.errors import DataError, iter_user_lines


def cohen_kappa(a: Sequence[int], b: Sequence[int]) -> float:
    """Cohen's κ of two binary raters over the same items: (p_o - p_e) / (1 - p_e); 1.0 when both
    raters give every item one and the same label (p_e = 1), 0.0 for no items."""
    if len(a) != len(b):
        raise ValueError(f"raters labelled different numbers of items ({len(a)} and {len(b)})")
    n = len(a)
    if n == 0:
        return 0.0
    p_o = sum(x == y for x, y in zip(a, b, strict=True)) / n
    pa, pb = sum(a) / n, sum(b) / n
    p_e = pa * pb + (1 - pa) * (1 - pb)
    if p_e >= 1.0:
        return 1.0 if p_o == 1.0 else 0.0
    return (p_o - p_e) / (1 - p_e)


def read_labels(path: str | Path) -> dict[str, dict[str, int]]:
    labels: dict[str, dict[str, int]] = {}
    for lineno, line in iter_user_lines(path, "labels file"):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            item, modes = str(record["id"]), record["modes"]
        except (ValueError, KeyError, TypeError):
            raise DataError(
                f'{path}:{lineno}: expected {{"id": ..., "modes": {{"1.1": 0|1, ...}}}}'
            ) from None
        unknown = sorted(set(modes) - set(MODE_IDS))
        if unknown:
            raise DataError(
                f"{path}:{lineno}: unknown mode id(s) {', '.join(unknown)}; valid ids: {', '.join(MODE_IDS)}"
            )
        missing = [m for m in MODE_IDS if m not in modes]
        if missing:
            raise DataError(f"{path}:{lineno}: no label for mode(s) {', '.join(missing)} (label all 14)")
        labels[item] = {m: int(bool(modes[m])) for m in MODE_IDS}
    return labels


def agreement(
    labels: Mapping[str, Mapping[str, int]], predicted: Mapping[str, Mapping[str, int]], modes: Sequence[str]
) -> dict[str, object]:
    """κ and accuracy of ``predicted`` against ``labels`` on the items both have, per mode in
    ``modes`` and pooled over them (a mode never predicted counts as 0)."""
    items = [i for i in labels if i in predicted]
    out: dict[str, object] = {"items": len(items), "per_mode": {}}
    pooled_a: list[int] = []
    pooled_b: list[int] = []
    per_mode: dict[str, dict[str, float]] = {}
    for mode in modes:
        a = [labels[i][mode] for i in items]
        b = [int(predicted[i].get(mode, 0)) for i in items]
        pooled_a += a
        pooled_b += b
        per_mode[mode] = {
            "kappa": cohen_kappa(a, b),
            "accuracy": sum(x == y for x, y in zip(a, b, strict=True)) / len(items) if items else 0.0,
            "labelled_present": sum(a),
            "predicted_present": sum(b),
        }
    out["per_mode"] = per_mode
    out["kappa"] = cohen_kappa(pooled_a, pooled_b)
    out["accuracy"] = (
        sum(x == y for x, y in zip(pooled_a, pooled_b, strict=True)) / len(pooled_a) if pooled_a else 0.0
    )
    return out
