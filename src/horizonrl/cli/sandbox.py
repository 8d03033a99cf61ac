"""``horizon sandbox``: run a command in a sandbox, or serve sandboxes over HTTP."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer

from horizonrl.cli.common import (
    MAX_WORKERS,
    AllowedHostOpt,
    allowed_host_options,
    check_port_free,
    check_range,
    console,
    err_console,
    user_errors,
    validated,
)
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
    from horizonrl.sandbox.base import ExecRequest
    from horizonrl.sandbox.bwrap import BwrapBackend

    line = command[0] if len(command) == 1 else shlex.join(command)
    # every option checked against the models' bounds before a sandbox starts: one line naming it
    validated(ExecRequest, {"cmd": "COMMAND", "timeout": "--timeout"}, cmd=line, timeout=timeout)
    limits = validated(
        SandboxLimits,
        {"memory_mib": "--memory-mib", "processes": "--processes"},
        memory_mib=memory_mib,
        processes=processes,
    )
    if template is not None and not template.is_dir():
        raise ConfigError(f"--template {str(template)!r} is not a directory")
    spec = SandboxSpec(template=str(template) if template else None, limits=limits)

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
    allowed_host: AllowedHostOpt = None,
    max_cpu_s: Annotated[
        int, typer.Option(help="Most cpu_s a sandbox may ask for; more gets HTTP 422.")
    ] = 1200,
    max_memory_mib: Annotated[int, typer.Option(help="Most memory_mib a sandbox may ask for.")] = 2048,
    max_processes: Annotated[int, typer.Option(help="Most processes a sandbox may ask for.")] = 512,
    max_file_size_mib: Annotated[int, typer.Option(help="Most file_size_mib a sandbox may ask for.")] = 512,
    max_tmp_mib: Annotated[int, typer.Option(help="Most tmp_mib a sandbox may ask for.")] = 512,
    max_output_bytes: Annotated[
        int, typer.Option(help="Most output_bytes a sandbox may ask for; exec output is cut there.")
    ] = 1024 * 1024,
    workspace_mib: Annotated[
        int, typer.Option(help="Disk quota of what one sandbox writes to its workspace.")
    ] = 512,
    total_workspace_mib: Annotated[
        int, typer.Option(help="Disk quota of all this server's workspaces together.")
    ] = 8 * 1024,
) -> None:
    """Serve bubblewrap sandboxes over HTTP (FastAPI; OpenAPI spec at /docs and /openapi.json)."""
    from horizonrl.sandbox.base import SandboxLimits
    from horizonrl.sandbox.server import serve
    from horizonrl.sandbox.server.limits import CEILING_OPTIONS, ServerLimits

    ceilings = validated(
        SandboxLimits,
        CEILING_OPTIONS,
        cpu_s=max_cpu_s,
        memory_mib=max_memory_mib,
        processes=max_processes,
        file_size_mib=max_file_size_mib,
        tmp_mib=max_tmp_mib,
        output_bytes=max_output_bytes,
    )
    check_range("--workspace-mib", workspace_mib, 1)
    check_range("--total-workspace-mib", total_workspace_mib, 1)
    limits = ServerLimits(
        ceilings=ceilings, workspace_mib=workspace_mib, total_workspace_mib=total_workspace_mib
    )

    check_range("--max-sandboxes", max_sandboxes, 1, MAX_WORKERS)
    check_range("--idle-ttl", idle_ttl, 1)
    check_range("--max-request-mib", max_request_mib, 1)
    if not token:
        raise ConfigError("sandbox serve needs a token: --token TOKEN or the HORIZON_SANDBOX_TOKEN variable")
    if templates is not None and not templates.is_dir():
        raise ConfigError(f"--templates {str(templates)!r} is not a directory")
    check_port_free(host, port)  # a port in use is one line now, not uvicorn's text
    serve(
        host,
        port,
        token,
        max_sandboxes=max_sandboxes,
        idle_ttl_s=idle_ttl,
        templates_dir=str(templates) if templates else None,
        log_level=log_level,
        max_request_bytes=max_request_mib * 1024 * 1024,
        extra_hosts=allowed_host_options(allowed_host),
        limits=limits,
    )
