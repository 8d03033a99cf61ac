"""``horizon learn``: component-centric learning over prompts, agent code and model weights."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from horizonrl.cli.common import ConfigArg, OverridesArg, console, say, user_errors


@user_errors
def learn(
    config_path: ConfigArg,
    overrides: OverridesArg = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the learn run in the run directory.")
    ] = False,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Move an old run to output_dir/.trash and start afresh.")
    ] = False,
) -> None:
    """Run the config's learning methods (selection x optimization x target) on its envs for
    learn.iterations iterations each; print each method's validation reward per env, the baseline,
    the best single method, the adaptive per-env choice and the upper bound; write learn.json."""
    from horizonrl.config import load_config
    from horizonrl.learn.run import LearnRun
    from horizonrl.train.run_lock import hold_run_dir

    config = load_config(config_path, overrides)
    with hold_run_dir(config.run_dir):  # one writer: refused before anything loads
        summary = LearnRun(config, say=say, resume=resume, overwrite=overwrite).run()
    console.print(results_table(summary))
    say(f"learn.json and every candidate are in {config.run_dir}")


def results_table(summary: dict[str, Any]) -> Table:
    """Env x method validation rewards, with the baseline, adaptive choice and upper bound."""
    envs = summary["envs_done"]
    table = Table(title=f"validation reward after {summary['iterations']} iterations")
    table.add_column("method")
    for env in envs:
        table.add_column(env, justify="right")
    table.add_column("mean", justify="right")

    def row(name: str, block: dict[str, Any], style: str = "") -> None:
        cells = [f"{block['per_env'].get(e, float('nan')):.3f}" for e in envs]
        table.add_row(name, *cells, f"{block['mean']:.3f}", style=style)

    row("baseline", summary["baseline"], "dim")
    for name, block in summary["methods"].items():
        row(name, {"per_env": {e: block["per_env"][e]["score"] for e in envs}, "mean": block["mean"]})
    best = summary["best_single"]
    if best.get("method"):
        row(f"best single ({best['method']})", best, "bold")
    row("adaptive (per-env pick)", summary["adaptive"], "bold")
    row("upper bound", summary["upper_bound"], "bold")
    alloc = summary.get("allocation")
    if alloc:
        row(f"even split ({alloc['budget_per_env']} iterations)", alloc["even"])
        row(f"bandit ({alloc['budget_per_env']} iterations)", alloc["bandit"])
    return table
