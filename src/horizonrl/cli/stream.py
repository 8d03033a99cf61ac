"""``horizon stream``: a continual run — tasks arrive, the policy acts and learns, the reward's weights
follow feedback — until SIGTERM or Ctrl-C (which save a checkpoint first)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer

from horizonrl.cli.common import ConfigArg, OverridesArg, check_port, say, training_progress, user_errors


class _StreamReporter:
    """One line per update above a bar for what the stream is doing now."""

    def __init__(self, progress: Any) -> None:
        self.progress = progress
        self.current = progress.add_task("", total=None, info="")

    def stage(self, name: str, total: int | None = None) -> None:
        self.progress.reset(self.current, total=total, description=name, info="")

    def status(self, text: str) -> None:
        self.progress.update(self.current, info=text)

    def advance(self, **fields: Any) -> None:
        if "step" not in fields:
            self.progress.update(self.current, advance=1)

    def message(self, text: str) -> None:
        self.progress.console.print(text, highlight=False, markup=False, soft_wrap=True)


@contextlib.contextmanager
def _viewer(port: int, run_dir: Path) -> Iterator[str]:
    """The viewer and its feedback API on ``run_dir``, served on ``port`` meanwhile (requiring the
    token in HORIZON_VIEW_TOKEN when it is set); gives its URL."""
    from horizonrl.view import ViewerServer, create_app
    from horizonrl.view.access import TOKEN_ENV

    with ViewerServer(create_app([run_dir], token=os.environ.get(TOKEN_ENV) or None), port=port) as server:
        assert server.url is not None
        yield server.url


@user_errors
def stream(
    config_path: ConfigArg,
    overrides: OverridesArg = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the stream in output_dir/name from its checkpoint.")
    ] = False,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Move an old run to output_dir/.trash and start afresh.")
    ] = False,
    port: Annotated[
        int | None,
        typer.Option(help="Serve the viewer and its feedback API (thumbs up/down) on this port meanwhile."),
    ] = None,
) -> None:
    """Stream: tasks from stream.source, the reward as stream.weights over grounded signals, updates as
    experience accrues, the weights moved by feedback. Runs until SIGTERM or Ctrl-C (or the
    stream.max_steps / stream.max_minutes limits), saving a checkpoint and policy/ when it stops."""
    from horizonrl.config import load_config
    from horizonrl.stream.run import StreamRun

    config = load_config(config_path, overrides)
    if port is not None:  # a port in use is said now, not after the model has loaded
        from horizonrl.asgi import listening_socket
        from horizonrl.view.access import TOKEN_ENV, check_token

        check_token(os.environ.get(TOKEN_ENV) or None)
        check_port(port)
        listening_socket("127.0.0.1", port).close()
    with training_progress() as progress:
        viewer = partial(_viewer, port) if port is not None else None
        summary = StreamRun(
            config, _StreamReporter(progress), resume=resume, overwrite=overwrite, viewer=viewer
        ).run()
    s = summary["stream"]
    weights = " ".join(f"{k}={v:+.3f}" for k, v in s["weights"].items())
    say(
        f"stream stopped by {s['stopped_by']} after {summary['steps']} updates and {s['tasks']} tasks; "
        f"weights {weights}; {s['ratings']} ratings used ({s['stale_ratings']} stale)"
    )
    say(f"run directory: {config.run_dir} (checkpoints/, policy/, metrics.jsonl, feedback.jsonl)")
