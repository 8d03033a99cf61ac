"""`horizon compare`: RL algorithms run side by side from one start (a recipe), or finished runs and
seeds put side by side with their intervals and a verdict on each difference (run directories)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from horizonrl.cli.common import check_output_file, console, say, training_progress, user_errors
from horizonrl.cli.run import _RichReporter
from horizonrl.errors import ConfigError

DEFAULT_ALGORITHMS = "grpo,dr_grpo,rloo,ppo"


@user_errors
def compare(
    config_path: Annotated[
        Path,
        typer.Argument(
            help="A YAML recipe (its RL algorithms side by side), or a run directory: then every "
            "further argument is one too (finished runs side by side; a folder of seed_N runs is one "
            "recipe's seeds).",
        ),
    ],
    overrides: Annotated[
        list[str] | None,
        typer.Argument(
            help="With a recipe: overrides as key.sub=value. With run directories: more run directories.",
            show_default=False,
        ),
    ] = None,
    algorithms: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated train.algorithm presets to run side by side "
            f"(default {DEFAULT_ALGORITHMS})."
        ),
    ] = None,
    fresh: Annotated[
        bool, typer.Option("--fresh", help="Rerun finished runs too (default: reuse them).")
    ] = False,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Run directories: write the comparison here (JSON).")
    ] = None,
) -> None:
    """RL algorithms side by side from one start (a recipe), or finished runs and seeds with intervals.

    Given a recipe: run its RL algorithms from one starting policy on the same budget; table and plot.
    Given run directories (or folders of seed_N runs): put their held-out success side by side with
    95% intervals and say which differences are larger than noise."""
    if not config_path.exists():
        raise ConfigError(
            f"{str(config_path)!r} does not exist; give a YAML recipe (its algorithms side by side) or run "
            "directories (finished runs side by side)"
        )
    if config_path.is_dir():
        if algorithms is not None or fresh:
            raise ConfigError(
                "--algorithms and --fresh run a recipe's algorithms; run directories are only read"
            )
        _compare_runs([config_path, *map(Path, overrides or [])], json_out)
        return
    if json_out is not None:
        raise ConfigError("--json is for run directories; the algorithm comparison writes comparison.json")
    _compare_algorithms(config_path, overrides or [], algorithms or DEFAULT_ALGORITHMS, fresh)


def _compare_algorithms(config_path: Path, overrides: list[str], algorithms: str, fresh: bool) -> None:
    from horizonrl.train.compare import compare as run_compare
    from horizonrl.train.compare import parse_algorithms

    names = parse_algorithms(algorithms)
    progress = training_progress()

    def reporter(label: str, cfg: Any) -> _RichReporter:
        console.print(Text.assemble((label, "bold"), f": {cfg.run_dir}"), soft_wrap=True)
        return _RichReporter(progress, cfg.train.steps)

    with progress:
        rows = run_compare(config_path, overrides, names, reporter, fresh=fresh)
    table = Table(title="algorithms side by side (held-out success)")
    for column in ("algorithm", "start", "final", "gain", "wall (s)"):
        table.add_column(column)
    for r in rows:
        gain = "–" if r["gain"] is None else f"{100 * r['gain']:+.0f} points"
        final = "–" if r["final_success"] is None else f"{r['final_success']:.0%}"
        start = "–" if r["start_success"] is None else f"{r['start_success']:.0%}"
        table.add_row(r["algorithm"], start, final, gain, f"{r['wall_s']:.0f}")
    console.print(table)
    root = Path(rows[0]["run_dir"]).parent
    say(f"comparison: {root}/comparison.md, comparison.json, comparison.png")


def _pct(e: dict[str, Any]) -> str:
    return f"{100 * e['value']:.1f}% [{100 * e['low']:.1f}, {100 * e['high']:.1f}]"


def _compare_runs(paths: list[Path], json_out: Path | None) -> None:
    from horizonrl.train.compare_runs import compare_runs

    if json_out is not None:
        check_output_file(json_out, "--json")
    result = compare_runs(paths)
    table = Table(title="runs side by side · held-out success, 95% intervals")
    for column in ("run", "eval", "tasks", "success [95%]", "interval"):
        numeric = column in ("tasks", "success [95%]")
        table.add_column(column, justify="right" if numeric else "left", no_wrap=numeric, overflow="fold")
    for arm in result["arms"]:
        runs = arm["runs"]
        if arm["seeds"]:
            method = "t over seeds" if arm["success"]["method"] == "t" else arm["success"]["method"]
            table.add_row(escape(arm["label"]), f"{len(runs)} seeds", "", _pct(arm["success"]), method)
        for r in runs:
            label = ("  " if arm["seeds"] else "") + r["label"]
            step = (
                "eval.jsonl"
                if r["step"] is None
                else f"step {r['step']}" + ("" if r["finished"] else " (unfinished)")
            )
            table.add_row(escape(label), step, str(r["tasks"]), _pct(r["success"]), r["success"]["method"])
    if result["mean_over_seeds"] is not None:
        table.add_row("mean over seeds", "", "", _pct(result["mean_over_seeds"]), "t over seeds")
    console.print(table)
    for p in result["pairs"]:
        if p["verdict"] == "not compared":
            say(f"{p['b']} vs {p['a']}: not compared: {p['note']}")
            continue
        say(
            f"{p['b']} vs {p['a']}: {100 * p['delta']:+.1f} points "
            f"[{100 * p['low']:+.1f}, {100 * p['high']:+.1f}] ({p['method']}; {p['note']}): {p['verdict']}"
        )
    beyond = [p for p in result["pairs"] if p["verdict"] in ("better", "worse")]
    if result["pairs"]:
        say(
            f"{len(beyond)} of {len(result['pairs'])} differences beyond noise (the 95% interval of "
            "the difference leaves out 0)"
        )
    if result["left_out"]:
        say(f"left out (not finished): {', '.join(result['left_out'])}")
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        say(f"comparison: {json_out}")
