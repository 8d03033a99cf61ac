"""`horizon eval SUITE.yaml`: one policy evaluated on every entry of a suite, one table.

Each entry runs through the single-recipe `horizon eval` (handed in as ``evaluate``), with its
records in ``output_dir/SUITE/ENTRY/eval.jsonl`` and its figures in ``.../summary.json``; the suite
then writes ``suite.md`` and ``suite.json`` beside them: every entry's held-out success with its
95% interval (Wilson over tasks for one sample per task, a bootstrap over tasks for more).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from horizonrl.cli.common import check_output_file, console, say
from horizonrl.config.suite import Entry, Suite, read_suite
from horizonrl.errors import ConfigError, HorizonError
from horizonrl.io import write_text_atomic
from horizonrl.stats import wilson
from horizonrl.train.eval_records import SINGLE_EVAL_FILE, read_outcomes, success_estimate

SUMMARY_FILE = "summary.json"
#: the sampled eval's figures a summary may carry (pass@k, avg@k, best@k, maj@k), kept in suite.json
_K_METRIC = re.compile(r"^(pass|avg|best|maj)@\d+$")


def _check(
    suite: Suite, checkpoint: Path | None, out: Path | None, json_out: Path | None, policy: str
) -> None:
    """What the single eval would refuse only once an earlier entry had loaded its model."""
    if out is not None:
        raise ConfigError(
            "--out names one records file; a suite writes each entry's to "
            f"{suite.out_dir}/ENTRY/{SINGLE_EVAL_FILE}: drop --out"
        )
    if policy not in ("model", "oracle"):
        raise ConfigError(f"--policy {policy!r}: expected 'model' or 'oracle'")
    if checkpoint is not None and not checkpoint.exists():
        raise ConfigError(
            f"--checkpoint {str(checkpoint)!r} does not exist; give a run, policy or checkpoint directory"
        )
    if policy == "oracle" and checkpoint is not None:
        raise ConfigError("--policy oracle plays the env's scripted oracle; drop --checkpoint")
    from horizonrl.cli.evaluate import check_sampled
    from horizonrl.envs.factory import eval_tasks, oracle_policy

    for entry in suite.entries:
        config, ev = entry.config, entry.config.eval
        if config.multiagent.graph is not None and (checkpoint is not None or policy == "oracle"):
            raise ConfigError(
                f"suite entry {entry.name!r} is a role graph (multiagent.graph), which plays with "
                "multiagent.adapters; drop --policy oracle / --checkpoint, or the entry"
            )
        try:  # what the entry's own eval checks first, for every entry before the first loads a model
            check_sampled(config)
            if policy == "oracle":
                oracle_policy(config.env)
            eval_tasks(config.env, ev.split, ev.num_tasks, ev.seed, ev.tasks)
        except HorizonError as exc:
            raise HorizonError(f"suite entry {entry.name!r}: {exc}") from None
    for name in ("suite.md", "suite.json"):
        check_output_file(suite.out_dir / name, "the suite's output")
    if json_out is not None:
        check_output_file(json_out, "--json")


def _headline(summary: dict[str, Any]) -> dict[str, Any] | None:
    """The eval's own success estimate, where its summary holds one: ``success`` for one sample per
    task, the mean success over the samples (``avg@n``) for more."""
    n = summary.get("samples_per_task")
    figure = summary.get("success") if n == 1 else summary.get(f"avg@{n}")
    return figure if isinstance(figure, dict) and {"value", "low", "high"} <= figure.keys() else None


def entry_row(entry: Entry, summary: dict[str, Any]) -> dict[str, Any]:
    """One entry's row: its held-out success with a 95% interval (the eval's own figure; else from
    its records; else the summary's rate with a Wilson interval, e.g. a role graph's MV@k), and for a
    sampled eval its pass@k, avg@k, best@k and maj@k, overall and per task group."""
    config = entry.config
    records = config.run_dir / SINGLE_EVAL_FILE
    own = config.multiagent.graph is None and records.is_file()
    outcomes = read_outcomes(records) if own else {}
    tasks = summary.get("tasks") or len(outcomes) or config.eval.num_tasks
    samples = summary.get("samples_per_task") or max((len(v) for v in outcomes.values()), default=1)
    success = _headline(summary)
    if success is None:
        estimate = (
            success_estimate(outcomes) if outcomes else wilson(float(summary["success_rate"]) * tasks, tasks)
        )
        success = estimate.as_dict()
    return {
        "entry": entry.name,
        "recipe": str(entry.recipe),
        "env": config.env.name,
        "tasks": tasks,
        "samples_per_task": samples,
        "success": success,
        **{key: value for key, value in summary.items() if _K_METRIC.match(key)},
        "groups": summary.get("groups") or {},
        "wall_s": summary.get("wall_s"),
        "records": str(records) if own else None,
    }


def _pct(estimate: dict[str, Any]) -> str:
    return f"{100 * estimate['value']:.1f}% [{100 * estimate['low']:.1f}, {100 * estimate['high']:.1f}]"


def _sampled(row: dict[str, Any]) -> str:
    """A sampled eval's pass@k and maj@k at its largest k (best@k is a reward: in suite.json)."""
    n = row["samples_per_task"]
    shown = [f"{name} {_pct(row[name])}" for name in (f"pass@{n}", f"maj@{n}") if n > 1 and name in row]
    return " · ".join(shown) or "–"


COLUMNS = ("entry", "env", "tasks", "samples", "success [95%]", "interval", "pass@n · maj@n", "wall (s)")


def _cells(row: dict[str, Any]) -> list[str]:
    wall = "–" if row["wall_s"] is None else f"{row['wall_s']:.0f}"
    return [
        row["entry"],
        row["env"],
        str(row["tasks"]),
        str(row["samples_per_task"]),
        _pct(row["success"]),
        str(row["success"].get("method", "")),
        _sampled(row),
        wall,
    ]


def markdown(suite: Suite, rows: list[dict[str, Any]], checkpoint: Path | None) -> str:
    policy = str(checkpoint) if checkpoint is not None else "the recipes' models"
    lines = [
        f"# eval suite {suite.name} · {policy}",
        "",
        "Held-out success with its 95% interval (wilson: Wilson over tasks, one sample per task; "
        "bootstrap: percentile bootstrap over tasks of the mean success over the samples).",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _table(suite: Suite, rows: list[dict[str, Any]]) -> Table:
    """The terminal's table: :data:`COLUMNS` but the sampled figures (printed below it)."""
    table = Table(title=escape(f"eval suite {suite.name} · held-out success, 95% intervals"))
    shown = [i for i, column in enumerate(COLUMNS) if column != "pass@n · maj@n"]
    for i in shown:
        numeric = COLUMNS[i] in ("tasks", "samples", "success [95%]", "wall (s)")
        table.add_column(COLUMNS[i], justify="right" if numeric else "left", no_wrap=i == 4)
    for r in rows:
        cells = _cells(r)
        table.add_row(*(escape(cells[i]) for i in shown))
    return table


def eval_suite(
    path: Path,
    overrides: list[str] | None,
    checkpoint: Path | None,
    out: Path | None,
    json_out: Path | None,
    policy: str,
    evaluate: Callable[..., None],
) -> None:
    """Read and check the whole suite (every recipe loads; one line and exit 2 otherwise, before any
    model loads), evaluate each entry with ``evaluate`` (the single `horizon eval`), write and print
    the table."""
    suite = read_suite(path, overrides)
    _check(suite, checkpoint, out, json_out, policy)
    rows = []
    for i, entry in enumerate(suite.entries, 1):
        say(f"suite {suite.name} · entry {i}/{len(suite.entries)}: {entry.name} ({entry.recipe})")
        summary_path = entry.config.run_dir / SUMMARY_FILE
        evaluate(entry.recipe, entry.overrides, checkpoint=checkpoint, json_out=summary_path, policy=policy)
        rows.append(entry_row(entry, json.loads(summary_path.read_text(encoding="utf-8"))))
    result = {
        "suite": suite.name,
        "file": str(suite.path),
        "checkpoint": str(checkpoint) if checkpoint is not None else None,
        "policy": policy,
        "entries": rows,
    }
    text = json.dumps(result, indent=2) + "\n"
    write_text_atomic(suite.out_dir / "suite.json", text)
    write_text_atomic(suite.out_dir / "suite.md", markdown(suite, rows, checkpoint))
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(json_out, text)
    console.print(_table(suite, rows))
    for r in rows:
        if _sampled(r) != "–":
            say(f"{r['entry']}: {_sampled(r)}")
    say(
        f"suite table: {suite.out_dir / 'suite.md'} and suite.json; each entry's records under "
        f"{suite.out_dir}/"
    )
