"""``horizon evolve``: self-questioning — a world's profile, and tasks synthesized by exploring it."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Annotated

import typer

from horizonrl.cli.common import (
    CheckpointOpt,
    ConfigArg,
    OverridesArg,
    check_output_file,
    console,
    say,
    user_errors,
)
from horizonrl.errors import ConfigError

app = typer.Typer(
    help="Self-questioning: profile (what a world is about), questions (tasks synthesized by exploring it).",
    no_args_is_help=True,
)


@app.command("profile")
@user_errors
def profile(
    env: Annotated[str, typer.Argument(help="An env name (horizon envs) or module:Class.")],
    out: Annotated[
        Path | None, typer.Option(help="Write the profile here (JSON) instead of printing it.")
    ] = None,
) -> None:
    """Print an env's profile: its own when it ships one, else derived from its tool specs."""
    from horizonrl.evolve.profile import env_profile

    text = env_profile(env).model_dump_json(indent=2)
    if out is None:
        console.print_json(text)
        return
    check_output_file(out, "--out")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n", encoding="utf-8")
    say(f"wrote the profile of {env!r} to {out}")


@app.command("questions")
@user_errors
def questions(
    config_path: ConfigArg,
    overrides: OverridesArg = None,
    n: Annotated[int, typer.Option("--n", help="Keep at most this many tasks.")] = 100,
    out: Annotated[Path | None, typer.Option(help="The task file to write (JSONL).")] = None,
    checkpoint: CheckpointOpt = None,
) -> None:
    """Explore the config's world with the explorer role, synthesize tasks with the synthesizer role,
    validate them by replay, drop duplicates; write the tasks (usable as env.tasks_file=), the
    exploration traces and a report with the counts beside them."""
    from horizonrl.build import build_runtime
    from horizonrl.config import load_config
    from horizonrl.envs.registry import make_env, parse_env_options
    from horizonrl.evolve.explore import explore
    from horizonrl.evolve.profile import env_profile
    from horizonrl.evolve.synthesize import synthesize
    from horizonrl.roles import Roles

    config = load_config(config_path, overrides)
    if n < 1:
        raise ConfigError(f"--n must be at least 1, got {n}")
    out = out if out is not None else config.run_dir / "synthesized_tasks.jsonl"
    check_output_file(out, "--out")
    options = parse_env_options(config.env.name, config.env.options)
    probe = make_env(config.env.name, options)
    if not callable(getattr(probe, "world_state", None)) or not getattr(probe, "state_schema", None):
        raise ConfigError(
            f"env {config.env.name!r} has no world state to check (world_state and state_schema); "
            "self-questioning needs an API world such as flights"
        )
    prof = env_profile(config.env.name, config.env.options)
    embedder = None
    if config.explore.embedding_duplicate is not None:
        from horizonrl.evolve.embed import QueryEmbedder

        embedder = QueryEmbedder()  # one line naming the install command when it is missing
    engine = tokenizer = None
    if "policy" in (config.roles.for_role("explorer").backend, config.roles.for_role("synthesizer").backend):
        with console.status("loading the policy…"):
            runtime = build_runtime(config, checkpoint=checkpoint)
        engine, tokenizer = runtime.engine, runtime.tokenizer
    roles = Roles(config.roles, engine, tokenizer)

    def make() -> object:
        return make_env(config.env.name, options)

    start = time.perf_counter()
    with console.status("exploring…"):
        traces = asyncio.run(explore(roles.get("explorer"), make, prof, config.explore, config.seed))
    explored = time.perf_counter() - start
    with console.status("synthesizing tasks…"):
        tasks, report = asyncio.run(
            synthesize(roles.get("synthesizer"), make, prof, traces, config.explore, config.seed, n, embedder)
        )
    wall = time.perf_counter() - start
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(t.model_dump_json() + "\n" for t in tasks), encoding="utf-8")
    traces_file = out.with_suffix(".traces.jsonl")
    traces_file.write_text("".join(t.model_dump_json() + "\n" for t in traces), encoding="utf-8")
    figures = report.as_dict() | {
        "explore_s": round(explored, 1),
        "wall_s": round(wall, 1),
        "tasks_per_minute": round(len(tasks) / (wall / 60), 2) if wall else 0.0,
    }
    out.with_suffix(".report.json").write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    dropped = ", ".join(f"{k} {v}" for k, v in sorted(report.dropped.items())) or "none"
    say(
        f"{len(tasks)} tasks from {report.candidates} candidates ({report.sessions} sessions, "
        f"{report.accepted_steps}/{report.steps} calls accepted) · dropped: {dropped} · {wall:.0f} s"
    )
    say(f"wrote {out} (tasks), {traces_file} (exploration), {out.with_suffix('.report.json')} (report)")
