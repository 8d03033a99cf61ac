"""``horizon swe`` (evaluate predictions on SWE instances) and ``horizon tasks`` (build SWE instances
from real packages; keep the tasks a policy solves sometimes)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.text import Text

from horizonrl.cli.common import (
    MAX_SAMPLES,
    MAX_TASKS,
    CheckpointOpt,
    ConfigArg,
    OverridesArg,
    check_output_file,
    check_range,
    console,
    episode_progress,
    report,
    say,
    user_errors,
)
from horizonrl.cli.run import run_episodes
from horizonrl.errors import ConfigError, HorizonError

#: Most sandboxes at once (``--workers``): each holds one, under the sandbox backend's own cap of 512.
MAX_SANDBOX_WORKERS = 256
#: ``pypi:NAME`` or ``pypi:NAME==VERSION`` (a project name as PyPI spells one; never a pip option).
_PYPI_SOURCE = re.compile(
    r"pypi:[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?(?:==[A-Za-z0-9][A-Za-z0-9.+!_-]*)?"
)

swe_app = typer.Typer(help="SWE tasks: eval (predictions, each in a clean sandbox).", no_args_is_help=True)
tasks_app = typer.Typer(
    help="Tasks: build (SWE instances from real packages), filter (by a policy's success rate).",
    no_args_is_help=True,
)


@swe_app.command("eval")
@user_errors
def swe_eval(
    predictions: Annotated[
        Path | None, typer.Argument(help="SWE-bench predictions JSONL (instance_id, model_patch).")
    ] = None,
    dataset: Annotated[Path | None, typer.Option(help="SWE dataset directory (default: shipped).")] = None,
    gold: Annotated[bool, typer.Option("--gold", help="Evaluate the dataset's own fixes.")] = False,
    empty: Annotated[bool, typer.Option("--empty", help="Evaluate empty patches.")] = False,
    split: Annotated[str, typer.Option(help="With --gold/--empty: train, test or all.")] = "all",
    workers: Annotated[int, typer.Option(help="Instances evaluated at once.")] = 2,
    out: Annotated[
        Path, typer.Option(help="Per-instance report (JSONL); the summary goes next to it.")
    ] = Path("runs/swe_eval/report.jsonl"),
) -> None:
    """Apply each prediction to a clean copy of its instance and run FAIL_TO_PASS and PASS_TO_PASS.

    Exit status: 0 when instances were evaluated; 1 when every one ended in error; 2 for bad input
    (an empty or missing predictions file, no valid line in it, an empty split, no test venv)."""
    check_range("--workers", workers, 1, MAX_SANDBOX_WORKERS)
    from horizonrl.envs.swe.harness import (
        Prediction,
        check_setup,
        error_lines,
        evaluate_predictions,
        exit_status,
        gold_predictions,
        read_predictions,
        summarize,
        write_report,
    )
    from horizonrl.envs.swe.instances import Dataset

    data = Dataset(dataset) if dataset else Dataset.shipped()
    bad: list[Any] = []
    if gold or empty:
        preds = gold_predictions(data, split)
        if empty:
            preds = [
                Prediction(instance_id=p.instance_id, model_name_or_path="empty", model_patch="")
                for p in preds
            ]
    elif predictions is not None:
        preds, bad = read_predictions(predictions)
    else:
        raise HorizonError("give a predictions file, or --gold / --empty")
    if not preds and not bad:
        raise HorizonError(f"nothing to evaluate: split {split!r} of {data.root} has no instances")
    check_setup(data, preds)
    check_output_file(out, "--out")
    with episode_progress() as progress:
        bar = progress.add_task("swe eval", total=len(bad) + len(preds), success="0/0", status="")
        progress.update(bar, advance=len(bad), success=f"0/{len(bad)}", status="error" if bad else "")
        resolved = 0

        def on_report(report: Any) -> None:
            nonlocal resolved
            resolved += report.status == "resolved"
            done = progress.tasks[bar].completed + 1
            progress.update(bar, advance=1, success=f"{resolved}/{int(done)}", status=report.status)

        reports = bad + asyncio.run(evaluate_predictions(data, preds, workers, on_report))
    summary = summarize(reports)
    write_report(out, reports, summary)
    for line in error_lines(reports):
        report("error", "yellow", line)
    console.print_json(json.dumps(summary))
    say(f"report: {out} · summary: {out.with_suffix('.summary.json')}")
    code = exit_status(len(preds), reports)
    if code:
        why = "no valid prediction in the file" if code == 2 else "every instance ended in error"
        report("error:", "bold red", f"{why} (exit {code})")
        raise typer.Exit(code)


@tasks_app.command("build")
@user_errors
def tasks_build(
    sources: Annotated[list[str], typer.Argument(help="pypi:NAME[==VERSION] or package directories.")],
    out: Annotated[Path, typer.Option(help="Dataset directory to write or resume.")] = Path(
        "runs/swe_dataset"
    ),
    per_package: Annotated[int, typer.Option(help="Validated instances wanted per package.")] = 60,
    max_candidates: Annotated[int, typer.Option(help="Candidates tried per package at most.")] = 240,
    seed: Annotated[int, typer.Option(help="Seed of the candidate sample.")] = 0,
    workers: Annotated[int, typer.Option(help="Parallel sandboxes (default: cores).")] = 0,
) -> None:
    """Inject bugs into real packages and keep those with failing and passing tests (SWE-smith style).

    Exit status: 0 when a package was built; 1 when every package failed; 2 for bad input (a source
    that is neither pypi:NAME[==VERSION] nor a directory, an option out of range)."""
    check_sources(sources)
    check_range("--per-package", per_package, 1, MAX_TASKS)
    check_range("--max-candidates", max_candidates, 1, MAX_TASKS)
    check_range("--workers", workers, 0, MAX_SANDBOX_WORKERS)
    check_range("--seed", seed, -(2**62), 2**62)
    check_output_dir(out)
    from horizonrl.envs.swe.bugs.factory import BuildConfig, build_dataset

    config = BuildConfig(
        sources=sources,
        out=out,
        per_package=per_package,
        max_candidates=max_candidates,
        seed=seed,
        **({"workers": workers} if workers else {}),
    )
    with episode_progress() as progress:
        bar = progress.add_task("tasks build", total=None, success="0/0", status="")
        kept = 0

        def on_outcome(package: str, outcome: Any) -> None:
            nonlocal kept
            kept += outcome.accepted
            done = progress.tasks[bar].completed + 1
            progress.update(
                bar, advance=1, success=f"{kept}/{int(done)}", status=escape(f"{package} {outcome.reason}")
            )

        reports = asyncio.run(build_dataset(config, on_outcome))
    from rich.table import Table

    table = Table(title=escape(f"SWE instances in {out}"))
    for column in ("package", "version", "validated", "tried", "yield", "baseline tests", "note"):
        table.add_column(column)
    for r in reports:
        rate = f"{r.accepted / r.tried:.0%}" if r.tried else "-"
        note = r.error or ", ".join(f"{k}: {v}" for k, v in r.rejected.items())
        cells = (r.name, r.version, str(r.accepted), str(r.tried), rate, str(r.baseline_tests), note)
        table.add_row(*map(Text, cells))
    console.print(table)
    if reports and all(r.error for r in reports):
        report("error:", "bold red", f"no package could be built ({len(reports)} tried; see the note column)")
        raise typer.Exit(1)


def check_sources(sources: list[str]) -> None:
    """Refuse, before anything is fetched, a source that is neither ``pypi:NAME[==VERSION]`` nor a
    package directory."""
    for source in sources:
        if source.startswith("pypi:"):
            if not _PYPI_SOURCE.fullmatch(source):
                raise ConfigError(
                    f"source {source!r} is not pypi:NAME or pypi:NAME==VERSION (a PyPI project name, "
                    "e.g. pypi:toolz==1.0.0)"
                )
        elif not Path(source).is_dir():
            what = "is a file" if Path(source).exists() else "does not exist"
            raise ConfigError(
                f"source {source!r} {what}; give pypi:NAME[==VERSION] (e.g. pypi:toolz) or a "
                "package directory"
            )


def check_output_dir(out: Path) -> None:
    """``--out`` must be a directory to write (or one to create)."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {str(out)!r} is a file; give a dataset directory")


@tasks_app.command("filter")
@user_errors
def tasks_filter(
    config_path: ConfigArg,
    overrides: OverridesArg = None,
    k: Annotated[int, typer.Option("--k", help="Rollouts per task.")] = 4,
    min_rate: Annotated[float, typer.Option(help="Keep tasks solved at least this often.")] = 0.01,
    max_rate: Annotated[float, typer.Option(help="... and at most this often.")] = 0.99,
    n: Annotated[int | None, typer.Option("--n", help="Tasks to try (default: rollout.num_tasks).")] = None,
    out: Annotated[Path | None, typer.Option(help="Kept tasks (JSONL, for env.tasks_file).")] = None,
    checkpoint: CheckpointOpt = None,
) -> None:
    """Sample K rollouts per task with the config's policy; keep tasks whose success rate is in range."""
    check_range("--k", k, 1, MAX_SAMPLES)
    if n is not None:
        check_range("--n", n, 1, MAX_TASKS)
    if not 0.0 <= min_rate <= max_rate <= 1.0:
        raise HorizonError(f"need 0 <= --min-rate <= --max-rate <= 1 (got {min_rate}, {max_rate})")
    from horizonrl.config import load_config
    from horizonrl.envs.factory import make_tasks
    from horizonrl.io import write_jsonl_atomic
    from horizonrl.rollout.pass_rate import filter_by_pass_rate

    config = load_config(config_path, overrides)
    out = out or config.run_dir / "filtered_tasks.jsonl"
    check_output_file(out, "--out")
    tasks = make_tasks(config.env, config.rollout.split, n or config.rollout.num_tasks, config.rollout.seed)
    trajectories, _, _ = run_episodes(
        config, tasks, k, config.rollout.concurrency, None, checkpoint, None, f"filter {config.env.name}"
    )
    kept, rates = filter_by_pass_rate(tasks, trajectories, min_rate, max_rate)
    write_jsonl_atomic(out, kept)
    say(
        f"kept {len(kept)} of {len(tasks)} tasks with a success rate in [{min_rate}, {max_rate}] "
        f"over {k} rollouts each → {out} (use env.tasks_file={out})"
    )
    (out.with_suffix(".rates.json")).write_text(json.dumps(rates, indent=2))
