"""``horizon serve``: the policy behind an OpenAI-compatible HTTP API."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from horizonrl.cli.common import CheckpointOpt, ConfigArg, OverridesArg, check_port, say, user_errors
from horizonrl.errors import ConfigError


@user_errors
def serve(
    config_path: ConfigArg,
    overrides: OverridesArg = None,
    checkpoint: CheckpointOpt = None,
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="HORIZON_SERVE_TOKEN",
            help="Bearer token clients must send (the openai client's api_key); none: no check.",
            show_default=False,
        ),
    ] = None,
    model_name: Annotated[
        str | None, typer.Option(help="The model id clients name (default: the recipe's name).")
    ] = None,
    max_request_mib: Annotated[int, typer.Option(help="Largest request body; bigger gets HTTP 413.")] = 16,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
) -> None:
    """Serve the policy with an OpenAI-compatible API (chat and text completions, streaming, tool
    calls, token capture per session); OpenAPI spec at /docs."""
    from horizonrl.config import load_config
    from horizonrl.serve.server import serve as run_server
    from horizonrl.serve.service import ServeLimits
    from horizonrl.train.runtime import build_runtime, checkpoint_loader

    check_port(port)
    if max_request_mib < 1:
        raise ConfigError(f"--max-request-mib must be at least 1, got {max_request_mib}")
    config = load_config(config_path, overrides)
    if checkpoint is not None and not Path(checkpoint).exists():
        raise ConfigError(f"--checkpoint {str(checkpoint)!r} does not exist")
    name = model_name or config.name

    def ready() -> None:
        auth = "token required" if token else "no token (anyone on this interface may call it)"
        say(f"serving {name!r} on http://{host}:{port}/v1 · {auth} · OpenAPI at /docs")

    def load_engine() -> tuple[Any, Any]:
        runtime = build_runtime(config, checkpoint=checkpoint)
        return runtime.engine, runtime.tokenizer

    run_server(
        load_engine,
        model_name=name,
        limits=ServeLimits.for_engine(config.sampling.max_new_tokens, config.engine.max_batch_size),
        load_policy=checkpoint_loader(config.model),
        host=host,
        port=port,
        token=token,
        log_level=log_level,
        max_request_mib=max_request_mib,
        on_ready=ready,
    )
