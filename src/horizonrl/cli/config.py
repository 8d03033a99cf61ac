"""``horizon config``: a recipe resolved key by key (``show``), and docs/config.md generated from the
config models and the commands (``docs``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from horizonrl.cli.common import ConfigArg, OverridesArg, user_errors
from horizonrl.errors import ConfigError

app = typer.Typer(
    help="Recipes: show (one resolved, key by key), docs (the configuration reference).",
    no_args_is_help=True,
)

#: Widest value that still lines up the column after it (a longer one pushes its own line only).
_VALUE_COLUMN = 24


@app.command("show")
@user_errors
def show(
    config_path: ConfigArg,
    overrides: OverridesArg = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print a JSON list of {key, value, source, description} objects."),
    ] = False,
    as_yaml: Annotated[
        bool,
        typer.Option(
            "--yaml",
            help="Print the resolved recipe as YAML: what a run's config.yaml holds (secrets as "
            "${env:NAME}).",
        ),
    ] = False,
) -> None:
    """Print a recipe resolved (overrides, presets): each key's value, source and description.

    Sources: override (the command line), file (the recipe), preset (train.algorithm's preset),
    default. One line per key, plain text, values written as an override would write them; a secret
    (sandbox token) given as its value is shown as ***, never the value."""
    from dataclasses import asdict

    from horizonrl.config import dump_config, explain_config, format_value, load_config

    if as_json and as_yaml:
        raise ConfigError("--json and --yaml: choose one")
    if as_yaml:
        typer.echo(dump_config(load_config(config_path, overrides)), nl=False)
        return
    entries = explain_config(config_path, overrides)
    if as_json:
        typer.echo(json.dumps([asdict(e) for e in entries], indent=2, ensure_ascii=False))
        return
    algorithm = next(e.value for e in entries if e.key == "train.algorithm")
    rows = []
    for e in entries:
        source = f"preset:{algorithm}" if e.source == "preset" else e.source
        rows.append((e.key, format_value(e.value), source, e.description))
    key_width = max(len(r[0]) for r in rows)
    value_width = min(max(len(r[1]) for r in rows), _VALUE_COLUMN)
    source_width = max(len(r[2]) for r in rows)
    for key, value, source, description in rows:
        line = f"{key:<{key_width}}  {value:<{value_width}}  {source:<{source_width}}  {description}"
        typer.echo(line.rstrip())


@app.command("docs")
@user_errors
def docs(
    ctx: typer.Context,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Rewrite this page (e.g. docs/config.md): keep its text above the generated marker, "
            "replace the rest. Without --out the generated reference goes to stdout."
        ),
    ] = None,
    check: Annotated[
        bool, typer.Option("--check", help="Write nothing; exit 1 when the page --out names is stale.")
    ] = False,
) -> None:
    """Generate the configuration reference (docs/config.md) from the config models and commands.

    Every section and key (type, bounds, default, description), the algorithm presets, every command."""
    from horizonrl.cli.common import check_output_file, report
    from horizonrl.cli.docs import REGENERATE, render_page, render_reference
    from horizonrl.errors import read_user_text

    horizon = ctx.find_root().command  # the app this command runs in
    if out is None:
        if check:
            raise ConfigError("--check needs --out PAGE, e.g. --out docs/config.md")
        typer.echo(render_reference(horizon), nl=False)
        return
    current = read_user_text(out, "--out", ConfigError) if out.exists() else None
    page = render_page(current, horizon)
    if check:
        if page != current:
            regenerate = REGENERATE if out == Path("docs/config.md") else f"horizon config docs --out {out}"
            report(
                "stale:", "bold red", f"{out} differs from the models and commands; regenerate: {regenerate}"
            )
            raise typer.Exit(1)
        typer.echo(f"{out} is up to date")
        return
    check_output_file(out, "--out")
    if page == current:
        typer.echo(f"{out} is up to date")
        return
    out.write_text(page, encoding="utf-8")
    typer.echo(f"wrote {out}")
