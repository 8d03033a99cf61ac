"""``horizon analyze``: MAST failure modes over a run's trajectories (detectors, optionally the
annotator role), the change between two runs, and agreement with hand labels."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from horizonrl.cli.common import MAX_ROUNDS, check_output_file, check_range, console, say, user_errors
from horizonrl.errors import DataError


def _client(config_path: Path | None, overrides: list[str] | None) -> tuple[Any, Any]:
    """The annotator role's client (and the runtime it needs when the role is the policy)."""
    from horizonrl.config import RunConfig, load_config
    from horizonrl.roles import Roles
    from horizonrl.train.runtime import build_runtime

    config = load_config(config_path, overrides) if config_path is not None else RunConfig()
    runtime = None
    if config.roles.for_role("annotator").backend == "policy":
        with console.status("loading the annotator's model…"):
            runtime = build_runtime(config)
    roles = Roles(config.roles, runtime.engine if runtime else None, runtime.tokenizer if runtime else None)
    return roles.get("annotator"), runtime


def _run(path: Path, client: Any, window: int, label: str) -> dict[str, Any]:
    from horizonrl.analysis.report import analyze
    from horizonrl.analysis.trace import load_traces

    if path.suffix == ".json" and path.is_file():  # an earlier mast.json
        return json.loads(path.read_text(encoding="utf-8"))
    loaded = load_traces(path)
    if not loaded.traces:
        raise DataError(f"{str(path)!r} holds no trajectories ({len(loaded.skipped)} lines skipped)")
    for line in loaded.skipped[:10]:
        say(f"skipped {line}")
    if len(loaded.skipped) > 10:
        say(f"… and {len(loaded.skipped) - 10} more lines skipped")
    if client is None:
        return analyze(loaded)
    with console.status(f"annotating {label}…") as status:
        return analyze(
            loaded,
            client,
            window,
            on_trace=lambda i: status.update(f"annotating {label}… {i}/{len(loaded.traces)}"),
        )


def _table(result: dict[str, Any], other: dict[str, Any] | None) -> Table:
    from horizonrl.analysis.mast import CATEGORIES, MODES

    table = Table(title=f"MAST failure modes · {len(result['traces'])} traces · {result['source']}")
    table.add_column("mode")
    table.add_column("share", justify="right")
    table.add_column("detectors", justify="right")
    if result["judge"]:
        table.add_column("judge", justify="right")
    if other is not None:
        table.add_column("before", justify="right")
        table.add_column("change", justify="right")
    for key, name in [(m.id, m.name) for m in MODES] + list(CATEGORIES.items()):
        share = result["prevalence"]["all"][key]
        row = [f"{key} {name}", f"{share:.0%}", f"{result['prevalence_detectors']['all'][key]:.0%}"]
        if result["judge"]:
            row.append(f"{result['prevalence_judge']['all'][key]:.0%}")
        if other is not None:
            before = other["prevalence"]["all"][key]
            row += [f"{before:.0%}", f"{(share - before) * 100:+.0f} pts"]
        table.add_row(*row)
    return table


@user_errors
def analyze(
    path: Annotated[Path, typer.Argument(help="A run directory, or a trajectory JSONL file.")],
    judge: Annotated[
        bool,
        typer.Option("--judge", help="Also ask the annotator role (roles.annotator) about all 14 modes."),
    ] = False,
    config_path: Annotated[
        Path | None, typer.Option("--config", help="The recipe whose roles block names the annotator.")
    ] = None,
    compare: Annotated[
        Path | None,
        typer.Option("--compare", help="Another run (or its mast.json): the change from it to this one."),
    ] = None,
    agreement: Annotated[
        Path | None,
        typer.Option(
            "--agreement", help="Hand labels (JSONL): κ and accuracy of detectors and judge against them."
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Where to write mast.json (default: beside the input).")
    ] = None,
    window: Annotated[int, typer.Option(help="Steps per annotator window (long traces are split).")] = 12,
    overrides: Annotated[
        list[str] | None, typer.Argument(help="Overrides of --config.", show_default=False)
    ] = None,
) -> None:
    """Which MAST failure modes the trajectories show: deterministic detectors (1.1, 1.3, 1.5, 2.1,
    3.1, 3.2 on every trace; all but 2.2 on chat-chain traces) and, with --judge, the annotator role
    on all 14; prevalence per mode, category, env and role."""
    check_range("--window", window, 1, MAX_ROUNDS)
    from horizonrl.analysis.agreement import agreement as agree
    from horizonrl.analysis.agreement import read_labels
    from horizonrl.analysis.detectors import DETECTORS
    from horizonrl.analysis.mast import MODE_IDS
    from horizonrl.analysis.report import bar_chart, write_result
    from horizonrl.analysis.report import compare as compare_runs

    if not path.exists():
        raise DataError(f"{str(path)!r} does not exist: name a run directory or a trajectory JSONL file")
    if out is None:
        out = path / "mast.json" if path.is_dir() else path.with_suffix(".mast.json")
    check_output_file(out, "--out")
    labels = read_labels(agreement) if agreement is not None else None
    client, runtime = _client(config_path, overrides) if judge else (None, None)
    try:
        result = _run(path, client, window, str(path))
        other = _run(compare, client, window, str(compare)) if compare is not None else None
    finally:
        if runtime is not None:
            runtime.close()
    if other is not None:
        result["compare"] = {"other": str(compare), "change": compare_runs(other, result)}
    if labels is not None:
        by_id = {r["id"]: r for r in result["traces"]}
        if not set(labels) & set(by_id):
            raise DataError(f"no trace of {path} has an id in {agreement}")
        detectors = {i: r["detector"] for i, r in by_id.items()}
        result["agreement"] = {"detectors": agree(labels, detectors, list(DETECTORS))}
        if result["judge"]:
            judged = {i: r["judge"] for i, r in by_id.items()}
            combined = {i: {m: int(m in r["modes"]) for m in MODE_IDS} for i, r in by_id.items()}
            result["agreement"]["judge"] = agree(labels, judged, list(MODE_IDS))
            result["agreement"]["judge_on_detector_modes"] = agree(labels, judged, list(DETECTORS))
            result["agreement"]["combined"] = agree(labels, combined, list(MODE_IDS))
    write_result(result, out)
    png = out.with_suffix(".png")
    bar_chart(result, png, other)
    console.print(_table(result, other))
    if result["judge"]:
        say(
            f"annotator: {result['traces_per_minute']:.1f} traces/min, {result['judge_windows']} windows, "
            f"{result['judge_unparsed_lines']} unparsed reply lines"
        )
    for name, figures in result.get("agreement", {}).items():
        kappa, accuracy = figures["kappa"], figures["accuracy"]
        say(f"agreement ({name}, {figures['items']} labelled traces): κ {kappa:.2f}, accuracy {accuracy:.1%}")
    say(f"wrote {out} and {png}")
