"""``horizon evolve``: self-questioning — a world's profile, and tasks synthesized by exploring it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from horizonrl.cli.common import (
    MAX_TASKS,
    CheckpointOpt,
    ConfigArg,
    OverridesArg,
    check_output_file,
    check_range,
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
    check_range("--n", n, 1, MAX_TASKS)
    from horizonrl.config import load_config
    from horizonrl.envs.registry import make_env, parse_env_options
    from horizonrl.evolve.questions import self_question, uses_policy
    from horizonrl.io import write_jsonl_atomic
    from horizonrl.roles import Roles
    from horizonrl.train.runtime import build_runtime

    config = load_config(config_path, overrides)
    out = out if out is not None else config.run_dir / "synthesized_tasks.jsonl"
    check_output_file(out, "--out")
    probe = make_env(config.env.name, parse_env_options(config.env.name, config.env.options))
    if not callable(getattr(probe, "world_state", None)) or not getattr(probe, "state_schema", None):
        raise ConfigError(
            f"env {config.env.name!r} has no world state to check (world_state and state_schema); "
            "self-questioning needs an API world such as flights"
        )
    engine = tokenizer = None
    if uses_policy(config):
        with console.status("loading the policy…"):
            runtime = build_runtime(config, checkpoint=checkpoint)
        engine, tokenizer = runtime.engine, runtime.tokenizer
    roles = Roles(config.roles, engine, tokenizer)
    with console.status("exploring…") as status:
        run = self_question(config, roles, n, on_stage=status.update)
    report = run.report
    write_jsonl_atomic(out, run.tasks)
    traces_file = out.with_suffix(".traces.jsonl")
    write_jsonl_atomic(traces_file, run.traces)
    out.with_suffix(".report.json").write_text(json.dumps(run.figures(), indent=2) + "\n", encoding="utf-8")
    dropped = ", ".join(f"{k} {v}" for k, v in sorted(report.dropped.items())) or "none"
    say(
        f"{len(run.tasks)} tasks from {report.candidates} candidates ({report.sessions} sessions, "
        f"{report.accepted_steps}/{report.steps} calls accepted) · dropped: {dropped} · {run.wall_s:.0f} s"
    )
    say(f"wrote {out} (tasks), {traces_file} (exploration), {out.with_suffix('.report.json')} (report)")


@app.command("train")
@user_errors
def train(
    config_path: ConfigArg,
    overrides: OverridesArg = None,
    n: Annotated[int, typer.Option("--n", help="Keep at most this many synthesized tasks.")] = 400,
    resynthesize: Annotated[
        bool,
        typer.Option("--resynthesize", help="Synthesize env.tasks_file afresh even when it exists."),
    ] = False,
    overwrite: Annotated[
        bool,
        typer.Option("--overwrite", help="Start the training run afresh (as horizon train --overwrite)."),
    ] = False,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the training run (as horizon train).")
    ] = False,
) -> None:
    """Self-questioning, then training on what it wrote: explore the world, synthesize and validate
    tasks into env.tasks_file (kept when it exists), then SFT on their replayed reference solutions and
    RL on the tasks, evaluating on the env's own held-out split (eval.tasks: env)."""
    check_range("--n", n, 1, MAX_TASKS)
    from horizonrl.cli.run import run_training
    from horizonrl.config import load_config
    from horizonrl.train.run_lock import hold_run_dir

    config = load_config(config_path, overrides)
    tasks_file = config.env.tasks_file
    if tasks_file is None:
        raise ConfigError(
            "horizon evolve train writes the synthesized tasks to env.tasks_file: set it in the config "
            "(e.g. env.tasks_file=runs/evolve_flights_tasks.jsonl)"
        )
    with hold_run_dir(config.run_dir):  # one writer from the start: refused before anything loads
        if resynthesize or not tasks_file.exists():
            questions(config_path, overrides, n=n, out=tasks_file, checkpoint=None)
        else:
            say(f"using the tasks already synthesized in {tasks_file} (--resynthesize to write them afresh)")
        run_training(load_config(config_path, overrides), resume, overwrite)  # the task file is read now
