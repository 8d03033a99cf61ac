"""Writes the hand-labelled set of ChatDev-style traces beside this file: ``traces.jsonl`` (one
:class:`horizonrl.analysis.trace.TraceRecord` per line, each validated before it is written) and
``labels.jsonl`` (every MAST mode of every trace, 0 or 1, with a one-line note), then prints how many
traces have each mode.

    python data/mast/chatdev/build_traces.py

Every trace is declared by hand in the ``tiny_*`` (a 135M instruct model playing the chain) and
``capable_*`` (a capable model) files: what each role said, the tool calls it made and what they
returned, the chain's own runs of the examples, whether the hidden tests passed, and the labels.
``chatdev_dsl`` fills in what follows from the chain's rules alone (phase spans, refusals, the final
code); ``he_prompts`` holds the HumanEval prompts. See README.md for how the set was made and labelled.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import capable_a  # noqa: E402
import capable_b  # noqa: E402
import capable_c  # noqa: E402
import capable_d  # noqa: E402
import capable_e  # noqa: E402
import capable_f  # noqa: E402
import capable_g  # noqa: E402
import tiny_a  # noqa: E402
import tiny_b  # noqa: E402
import tiny_c  # noqa: E402
import tiny_d  # noqa: E402

from horizonrl.analysis.mast import MODE_IDS, TAXONOMY_VERSION, mode  # noqa: E402
from horizonrl.analysis.trace import TraceRecord  # noqa: E402

TINY = [tiny_a, tiny_b, tiny_c, tiny_d]
CAPABLE = [capable_a, capable_b, capable_c, capable_d, capable_e, capable_f, capable_g]


def build() -> tuple[list[dict], list[dict], dict[str, str]]:
    """Every trace and its labels, in id order, and each trace's kind (tiny or capable)."""
    traces, labels, kinds = [], [], {}
    for kind, modules in (("tiny", TINY), ("capable", CAPABLE)):
        for module in modules:
            for declare in module.TRACES:
                trace, label = declare()
                TraceRecord.model_validate(trace)
                traces.append(trace)
                labels.append(label)
                kinds[trace["id"]] = kind
    ids = [t["id"] for t in traces]
    expected = [f"chatdev-{i:03d}" for i in range(1, len(ids) + 1)]
    if ids != expected:
        raise SystemExit(f"trace ids must run chatdev-001 ... in order; got {ids}")
    return traces, labels, kinds


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")


def main() -> None:
    traces, labels, kinds = build()
    write_jsonl(HERE / "traces.jsonl", traces)
    write_jsonl(HERE / "labels.jsonl", labels)
    tiny = [lab for lab in labels if kinds[lab["id"]] == "tiny"]
    capable = [lab for lab in labels if kinds[lab["id"]] == "capable"]
    clean = [lab for lab in labels if not any(lab["modes"].values())]
    solved = sum(t["success"] for t in traces)
    print(
        f"{len(traces)} traces ({len(tiny)} tiny-model, {len(capable)} capable-model; {solved} solved, "
        f"{len(clean)} with no mode) -> {HERE / 'traces.jsonl'}, {HERE / 'labels.jsonl'} ({TAXONOMY_VERSION})"
    )
    counts = {group: Counter() for group in ("all", "tiny", "capable")}
    for lab in labels:
        for mode_id, present in lab["modes"].items():
            counts["all"][mode_id] += present
            counts[kinds[lab["id"]]][mode_id] += present
    print(f"{'mode':<42} {'traces':>6} {'tiny':>5} {'capable':>7}")
    for mode_id in MODE_IDS:
        name = f"{mode_id} {mode(mode_id).name}"
        row = [counts[group][mode_id] for group in ("all", "tiny", "capable")]
        print(f"{name:<42} {row[0]:>6} {row[1]:>5} {row[2]:>7}")


if __name__ == "__main__":
    main()
