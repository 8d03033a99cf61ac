"""``horizon view``: the trajectory viewer, a local web app over run directories."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from horizonrl.cli.common import AllowedHostOpt, allowed_host_options, check_port, say, user_errors

DEFAULT_RUNS = Path("runs")


@user_errors
def view(
    run_dirs: Annotated[
        list[Path] | None,
        typer.Argument(
            metavar="RUN_DIR",
            help="Run directories, or folders of runs such as runs/ (default: runs/).",
            show_default=False,
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8790,
    allowed_host: AllowedHostOpt = None,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="HORIZON_VIEW_TOKEN",
            help="Every request must carry this token: 'Authorization: Bearer TOKEN', or open the "
            "page once with ?token=TOKEN in a browser. Needed with a --host beyond this machine.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Browse runs in a web browser: metric charts, every trajectory (messages, tool calls, diffs,
    tokens with their loss mask and logprobs), before/after evals, thumbs up/down feedback. Runs
    being written update live."""
    from horizonrl.view import ViewerServer, create_app
    from horizonrl.view.access import TOKEN_PARAM, check_exposure, check_token
    from horizonrl.view.index import check_run_paths

    paths = list(run_dirs or [DEFAULT_RUNS])
    check_port(port)
    check_run_paths(paths)
    check_exposure(host, check_token(token))
    hosts = allowed_host_options(allowed_host)
    app = create_app(paths, token=token)
    server = ViewerServer(app, host=host, port=port, extra_hosts=hosts).start()
    say(f"viewing {', '.join(str(p) for p in paths)} on {server.url} · Ctrl-C stops")
    if token:
        say(f"token required: open {server.url}/?{TOKEN_PARAM}=<your token> once in the browser")
    try:
        wait_until_interrupted()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


def wait_until_interrupted() -> None:
    """Block until Ctrl-C (the server runs on its own thread)."""
    while True:
        time.sleep(3600)
