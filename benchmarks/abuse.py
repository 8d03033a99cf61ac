"""Abuse, tried as a skeptical user and an attacker would, on 127.0.0.1: every probe family in
``benchmarks/abuse_probes`` against the real components (the sandbox server, run directories, ``horizon
serve``, the viewer and stream feedback, secrets in recipes, the CLI), and a table of cases tried,
held and failed per family (target: 0 failed).

    python benchmarks/abuse.py [--family NAME ...] [--verbose] [--json]

A case holds when the component answered as it must: one clear line and exit 2 on the CLI, a 4xx
with the reason from a server, nothing written or deleted outside the run directory, no limit
silently dropped. Failed cases are printed with what came back.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import abuse_probes
from abuse_probes import Case


def families() -> dict[str, object]:
    found = {}
    for info in pkgutil.iter_modules(abuse_probes.__path__):
        module = importlib.import_module(f"abuse_probes.{info.name}")
        if hasattr(module, "probe") and hasattr(module, "FAMILY"):
            found[module.FAMILY] = module
    return found


def run_family(module, workdir: Path) -> tuple[list[Case], float]:
    start = time.perf_counter()
    try:
        cases = module.probe(workdir)
    except Exception as exc:  # a probe that crashes is itself a failed case, never a lost family
        last = traceback.format_exception_only(exc)[-1].strip()
        cases = [Case("the probe itself ran", False, last)]
    return cases, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", action="append", help="only these families (repeatable)")
    parser.add_argument("--verbose", action="store_true", help="print every case, held or not")
    parser.add_argument("--json", action="store_true", help="also print the table as one JSON line")
    args = parser.parse_args()
    available = families()
    chosen = args.family or sorted(available)
    if not chosen:
        print("no probe families found in benchmarks/abuse_probes", file=sys.stderr)
        return 2
    unknown = [name for name in chosen if name not in available]
    if unknown:
        print(f"unknown family {unknown[0]!r}; valid: {', '.join(sorted(available))}", file=sys.stderr)
        return 2
    rows = []
    for name in chosen:
        with tempfile.TemporaryDirectory(prefix="abuse-") as tmp:
            cases, seconds = run_family(available[name], Path(tmp))
        held = sum(case.held for case in cases)
        rows.append(
            {
                "family": name,
                "tried": len(cases),
                "held": held,
                "failed": len(cases) - held,
                "seconds": round(seconds, 1),
            }
        )
        for case in cases:
            if args.verbose or not case.held:
                mark = "held  " if case.held else "FAILED"
                print(f"  {mark} {name}: {case.name} — {case.detail}"[:400])
    width = max(len(row["family"]) for row in rows)
    print(f"{'family':<{width}}  tried  held  failed  seconds")
    for row in rows:
        counts = f"{row['tried']:>5}  {row['held']:>4}  {row['failed']:>6}  {row['seconds']:>7}"
        print(f"{row['family']:<{width}}  {counts}")
    total = {key: sum(row[key] for row in rows) for key in ("tried", "held", "failed")}
    print(f"{'total':<{width}}  {total['tried']:>5}  {total['held']:>4}  {total['failed']:>6}")
    if args.json:
        print(json.dumps({"families": rows, **total}))
    return 1 if total["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
