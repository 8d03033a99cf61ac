"""``horizon sandbox``: run a command in a sandbox, or serve sandboxes over HTTP."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer

from horizonrl.cli.common import check_port, console, err_console, user_errors
from horizonrl.errors import ConfigError

app = typer.Typer(
    help="Sandboxes: run (one command in a fresh sandbox), serve (sandboxes over HTTP).", no_args_is_help=True
)


@app.command("run")
@user_errors
def sandbox_run(
    command: Annotated[
        list[str], typer.Argument(help="The command (after --); one argument is a shell line.")
    ],
    template: Annotated[Path | None, typer.Option(help="Directory that seeds the workspace.")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds before the command is killed.")] = 60.0,
    memory_mib: Annotated[int, typer.Option(help="Memory limit of the sandbox.")] = 1024,
    processes: Annotated[int, typer.Option(help="Process limit of the sandbox.")] = 256,
    diff: Annotated[bool, typer.Option("--diff", help="Print the workspace diff afterwards.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the ExecResult as JSON.")] = False,
) -> None:
    """Run one command in a fresh bubblewrap sandbox and print its result (exit status: the command's).

    Example: horizon sandbox run --template . -- 'cat /etc/shadow; ls /root; python3 -m pytest -q'
    """
    import shlex

    from horizonrl.sandbox import SandboxLimits, SandboxSpec
    from horizonrl.sandbox.bwrap import BwrapBackend

    line = command[0] if len(command) == 1 else shlex.join(command)
    spec = SandboxSpec(
        template=str(template) if template else None,
        limits=SandboxLimits(memory_mib=memory_mib, processes=processes),
    )

    async def go() -> tuple[Any, str]:
        backend = BwrapBackend()
        try:
            async with await backend.create(spec) as box:
                result = await box.exec(line, timeout=timeout)
                return result, (await box.diff() if diff else "")
        finally:
            await backend.aclose()

    result, patch = asyncio.run(go())
    if as_json:
        console.print_json(result.model_dump_json())
    else:
        typer.echo(result.stdout, nl=False)
        typer.echo(result.stderr, nl=False, err=True)
        flags = [name for name in ("truncated", "timed_out") if getattr(result, name)]
        err_console.print(
            f"[dim]exit {result.exit_code} · {result.duration * 1000:.0f} ms"
            + "".join(f" · {f}" for f in flags)
            + "[/]",
            highlight=False,
        )
    if patch:
        typer.echo(patch, nl=False)
    raise typer.Exit(result.exit_code if 0 <= result.exit_code < 256 else 1)


@app.command("serve")
@user_errors
def sandbox_serve(
    token: Annotated[
        str | None,
        typer.Option(
            envvar="HORIZON_SANDBOX_TOKEN", help="Bearer token clients must send.", show_default=False
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8080,
    templates: Annotated[Path | None, typer.Option(help="Directory of named workspace templates.")] = None,
    max_sandboxes: Annotated[int, typer.Option(help="Live sandboxes at once; more get HTTP 429.")] = 256,
    idle_ttl: Annotated[float, typer.Option(help="Seconds before an idle sandbox is reaped.")] = 900.0,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    max_request_mib: Annotated[int, typer.Option(help="Largest request body; bigger gets HTTP 413.")] = 16,
) -> None:
    """Serve bubblewrap sandboxes over HTTP (FastAPI; OpenAPI spec at /docs and /openapi.json)."""
    from horizonrl.sandbox.server import serve

    check_port(port)
    if not token:
        raise ConfigError("sandbox serve needs a token: --token TOKEN or the HORIZON_SANDBOX_TOKEN variable")
    if templates is not None and not templates.is_dir():
        raise ConfigError(f"--templates {str(templates)!r} is not a directory")
    serve(
        host,
        port,
        token,
        max_sandboxes=max_sandboxes,
        idle_ttl_s=idle_ttl,
        templates_dir=str(templates) if templates else None,
        log_level=log_level,
        max_request_bytes=max_request_mib * 1024 * 1024,
    )
