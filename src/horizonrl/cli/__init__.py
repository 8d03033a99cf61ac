"""The ``horizon`` command line: the app, and which module holds each command.

- :mod:`horizonrl.cli.run`: rollout, eval, train, sft, dpo (the commands that run a policy)
- :mod:`horizonrl.cli.suite`: eval of a suite file (several recipes, one table)
- :mod:`horizonrl.cli.compare`: compare (RL algorithms from one start; finished runs and seeds side by side)
- :mod:`horizonrl.cli.envs`: envs
- :mod:`horizonrl.cli.sandbox`: sandbox run, sandbox serve
- :mod:`horizonrl.cli.swe`: swe eval, tasks build, tasks filter
- :mod:`horizonrl.cli.serve`: serve (the policy behind an OpenAI-compatible API)
- :mod:`horizonrl.cli.roles`: roles (which backend serves each LLM role; ask one)
- :mod:`horizonrl.cli.config`: config show, config docs
- :mod:`horizonrl.cli.evolve`: evolve profile, evolve questions, evolve train (self-questioning)
- :mod:`horizonrl.cli.malt`: malt sample, malt train, malt online (multi-agent training)
- :mod:`horizonrl.cli.worlds`: worlds list, show, validate, levels, new (layered worlds)
- :mod:`horizonrl.cli.analyze`: analyze (MAST failure modes)
- :mod:`horizonrl.cli.learn`: learn (component-centric learning: prompts, agent code, weights)
- :mod:`horizonrl.cli.view`: view (the trajectory viewer in a web browser)
- :mod:`horizonrl.cli.stream`: stream (continual learning from a stream of tasks, feedback-weighted reward)
- :mod:`horizonrl.cli.common`: what they share (one-line user errors, output checks, progress bars)

User mistakes (a config typo, a wrong model path, an unknown env, a bad task line) print one clear
line and exit with status 2; no traceback wall.
"""

from __future__ import annotations

import typer

from horizonrl.cli import (
    analyze,
    compare,
    config,
    envs,
    evolve,
    learn,
    malt,
    roles,
    run,
    sandbox,
    serve,
    stream,
    swe,
    team,
    view,
    worlds,
)
from horizonrl.cli.common import check_output_file, check_port, report, say, user_errors

__all__ = ["app", "check_output_file", "check_port", "main", "report", "say", "user_errors"]

app = typer.Typer(
    name="horizon",
    help="HorizonRL: train multi-turn, tool-using LLM agents with reinforcement learning.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

app.command()(run.rollout)
app.command("eval")(run.eval_)
app.command()(run.train)
app.command()(compare.compare)
app.command()(run.sft)
app.command()(run.dpo)
app.command()(envs.envs)
app.command()(serve.serve)
app.command()(roles.roles)
app.command()(analyze.analyze)
app.command()(learn.learn)
app.command()(view.view)
app.command()(stream.stream)
app.add_typer(sandbox.app, name="sandbox")
app.add_typer(swe.swe_app, name="swe")
app.add_typer(swe.tasks_app, name="tasks")
app.add_typer(config.app, name="config")
app.add_typer(evolve.app, name="evolve")
app.add_typer(malt.app, name="malt")
app.add_typer(team.app, name="team")
app.add_typer(worlds.app, name="worlds")


def main() -> None:  # pragma: no cover - console-script shim
    app()
