"""AgentEvolver's ablation on our flights world: base, +questioning, +questioning+navigating,
+questioning+attributing and all three, with the same budget each.

Self-questioning writes one task file (``horizon evolve questions``) that every trained arm uses; then
each arm is one ``horizon train`` of the recipe (SFT on the replayed reference solutions, then RL on
the synthesized tasks, evaluated on the env's 50 hand-written held-out tasks) with the same steps,
tasks and samples per step:

- ``questioning``: the recipe as it is;
- ``questioning+navigating``: the experience pool on (``experience.enabled``, the extractor role;
  guided samples get the wider upper clip, ``train.dual_clip=3``);
- ``questioning+attributing``: ADCA step advantages on (``attribution.enabled``, the judge role);
- ``all``: both.

``base`` is the untrained model on the same held-out tasks (every run's base eval; no tokens spent
on training). Prints ``name=value`` lines per arm — held-out success after SFT and at the end, the
policy's generated tokens, each role's tokens, wall time — then a Markdown table, and writes
``OUT/summary.json`` after each arm. An arm whose run has finished is read back, not rerun (so the
ablation continues where it stopped; ``--overwrite`` reruns them).

    python benchmarks/self_evolution.py [--config configs/evolve_flights.yaml] [--arms all,questioning]
        [--quick] [KEY=VALUE ...]

``KEY=VALUE`` overrides go to every arm (the roles, e.g. ``roles.judge.backend=openai …``, or the
budget). ``--quick`` runs a tiny random model for one RL step (a check of the machinery).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from learning import HORIZON, ROOT, _run, check_overrides  # one way to run a horizon command with its log

ARMS: dict[str, list[str]] = {
    "questioning": [],
    "questioning+navigating": ["experience.enabled=true", "train.dual_clip=3.0"],
    "questioning+attributing": ["attribution.enabled=true"],
    "all": ["experience.enabled=true", "train.dual_clip=3.0", "attribution.enabled=true"],
}
QUICK = [
    "model.path=tiny-random",
    "sampling.max_new_tokens=16",
    "agent.max_turns=3",
    "eval.num_tasks=4",
    "sft.num_demos=4",
    "train.steps=1",
    "train.tasks_per_step=2",
    "train.group_size=2",
    "explore.depth_sessions=200",
    "experience.max_tokens=32",
    "attribution.max_tokens=32",
]


def _finished(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / "summary.json"
    if not path.exists():
        return None
    summary = json.loads(path.read_text(encoding="utf-8"))
    return summary if summary.get("finished") else None


def train(config: str, name: str, out: Path, overrides: list[str], start_from: Path | None = None) -> dict:
    """``horizon train`` of ``config`` as ``out/name`` (logged to ``out/name.log``), optionally
    ``--start-from`` a run; its finished summary."""
    cmd = [*HORIZON, "train", config, *overrides, f"output_dir={out}", f"name={name}", "--overwrite"]
    if start_from is not None:
        cmd += ["--start-from", str(start_from)]
    _run(cmd, out / f"{name}.log")
    summary = _finished(out / name)
    if summary is None:
        raise SystemExit(f"{name}: the run ended without a finished summary.json in {out / name}")
    return summary


def check_arguments(
    parser: argparse.ArgumentParser, arms_text: str, valid: dict, overrides: list[str]
) -> list[str]:
    """The arms named in ``arms_text`` (a parser error naming the valid ones otherwise); overrides
    that are not KEY=VALUE are a parser error too."""
    arms = [a.strip() for a in arms_text.split(",") if a.strip()]
    unknown = [a for a in arms if a not in valid]
    if unknown or not arms:
        parser.error(f"unknown arm {unknown[0] if unknown else '(none)'!r}; valid arms: {', '.join(valid)}")
    check_overrides(parser, overrides, "train.steps=3")
    return arms


def one_arm(config: str, arm: str, out: Path, common: list[str], overwrite: bool) -> dict[str, Any]:
    """Train ``arm`` (or read its finished run back) and return its figures."""
    summary = None if overwrite else _finished(out / arm)
    reran = summary is None
    if summary is None:
        summary = train(config, arm, out, [*common, *ARMS[arm]])
    roles = summary.get("role_usage") or {}
    return {
        "arm": arm,
        "base_success": summary["base_success"],
        "start_success": summary["start_success"],
        "final_success": summary["final_success"],
        "policy_tokens": summary["generated_tokens"],
        "role_tokens": {
            n: u.get("prompt_tokens", 0) + u.get("completion_tokens", 0) for n, u in roles.items()
        },
        "wall_s": summary["wall_s"],
        "peak_rss_gib": summary["peak_rss_gib"],
        "read_back": not reran,
    }


def table(rows: list[dict[str, Any]], base: float | None) -> str:
    lines = [
        "| arm | held-out success (after SFT → end) | policy tokens | role tokens | wall |",
        "|---|---|---|---|---|",
        f"| base | {base:.0%} | 0 | 0 | — |" if base is not None else "| base | — | 0 | 0 | — |",
    ]
    for r in rows:
        roles = ", ".join(f"{n} {t:,}" for n, t in r["role_tokens"].items()) or "0"
        lines.append(
            f"| +{r['arm']} | {r['start_success']:.0%} → {r['final_success']:.0%} | "
            f"{r['policy_tokens']:,} | {roles} | {r['wall_s']:.0f} s |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/evolve_flights.yaml")
    parser.add_argument("--out", default="runs/self_evolution", help="where the runs and summary.json go")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"which arms, in order (of {', '.join(ARMS)})")
    parser.add_argument("--n", type=int, default=400, help="synthesized tasks to keep")
    parser.add_argument(
        "--quick", action="store_true", help="tiny random model, one RL step (machinery only)"
    )
    parser.add_argument("--overwrite", action="store_true", help="rerun arms that have finished")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="recipe overrides for every arm")
    args = parser.parse_args()
    arms = check_arguments(parser, args.arms, ARMS, args.overrides)
    out = (ROOT / args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    tasks = out / "tasks.jsonl"
    common = [*(QUICK if args.quick else []), *args.overrides, f"env.tasks_file={tasks}"]
    result: dict[str, Any] = {"config": args.config, "overrides": args.overrides, "quick": args.quick}
    if not tasks.exists() or args.overwrite:
        seconds = _run(
            [*HORIZON, "evolve", "questions", args.config, *common, "--n", str(args.n), "--out", str(tasks)],
            out / "questions.log",
        )
        result["questions_s"] = round(seconds, 1)
    result["tasks"] = sum(1 for line in tasks.read_text(encoding="utf-8").splitlines() if line.strip())
    print(f"tasks={result['tasks']}", flush=True)
    rows: list[dict[str, Any]] = []
    for arm in arms:
        row = one_arm(args.config, arm, out, common, args.overwrite)
        rows.append(row)
        result["arms"] = rows
        result["base_success"] = rows[0]["base_success"]
        (out / "summary.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        for key in (
            "start_success",
            "final_success",
            "policy_tokens",
            "role_tokens",
            "wall_s",
            "peak_rss_gib",
        ):
            value = row[key]
            print(f"{arm}_{key}={json.dumps(value) if isinstance(value, dict) else value}", flush=True)
    print(f"base_success={result['base_success']}")
    print(table(rows, result["base_success"]))


if __name__ == "__main__":
    main()
