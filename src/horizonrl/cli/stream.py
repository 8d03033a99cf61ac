"""``horizon stream``: a continual run — tasks arrive, the policy acts and learns, the reward's weights
follow feedback — until SIGTERM or Ctrl-C (which save a checkpoint first)."""

from __future__ import annotations

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
        from horizonrl.view.server import bind

        check_port(port)
        bind("127.0.0.1", port).close()
    with training_progress() as progress:
        summary = StreamRun(
            config, _StreamReporter(progress), resume=resume, overwrite=overwrite, port=port
        ).run()
    s = summary["stream"]
    weights = " ".join(f"{k}={v:+.3f}" for k, v in s["weights"].items())
    say(
        f"stream stopped by {s['stopped_by']} after {summary['steps']} updates and {s['tasks']} tasks; "
        f"weights {weights}; {s['ratings']} ratings used ({s['stale_ratings']} stale)"
    )
    say(f"run directory: {config.run_dir} (checkpoints/, policy/, metrics.jsonl, feedback.jsonl)")
